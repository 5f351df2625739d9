package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/daemon"
	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// absentDir is the --dir of the settings cases: a path no machine has (the settings
// refuse a --dir whose nearest existing ancestor is not a directory, so a file at a
// path such as /tmp/x would fail them).
const absentDir = "/fluxkv-settings-test/x"

// runSettings runs a cli app with the real command flags and captures the merged
// settings instead of starting anything.
func runSettings(t *testing.T, command string, yaml string, args ...string) (config.Owner, config.Master, error) {
	t.Helper()
	var (
		oc  config.Owner
		mc  config.Master
		got error
	)
	dir := t.TempDir()
	if yaml != "" {
		p := filepath.Join(dir, command+".yaml")
		if err := os.WriteFile(p, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", p}, args...)
	}
	action := func(role config.Role) cli.ActionFunc {
		return func(c *cli.Context) error {
			f, err := loadConfig(c, role)
			if err != nil {
				got = err
				return nil
			}
			if role != config.RoleOwner {
				if mc, err = masterSettings(c, f); err != nil {
					got = err
					return nil
				}
			}
			if role != config.RoleMaster {
				if oc, err = ownerSettings(c, f); err != nil {
					got = err
					return nil
				}
			}
			if role == config.RoleUp {
				got = upListenClash(c, f, mc, oc)
			}
			return nil
		}
	}
	cmds := map[string]*cli.Command{"master": masterCommand(), "owner": ownerCommand(), "up": upCommand()}
	roles := map[string]config.Role{"master": config.RoleMaster, "owner": config.RoleOwner, "up": config.RoleUp}
	cmd := cmds[command]
	cmd.Action = action(roles[command])
	app := &cli.App{Name: "fluxkv", Flags: logFlags(), Commands: []*cli.Command{cmd}}
	if err := app.Run(append([]string{"fluxkv", command}, args...)); err != nil {
		t.Fatalf("app: %v", err)
	}
	return oc, mc, got
}

func TestSettingsFlagsOverrideFile(t *testing.T) {
	abs := func(p string) string { a, _ := filepath.Abs(p); return a }
	host, _ := os.Hostname()
	const ownerYAML = `
fluxkv_spec:
  dram: 1GiB
  socket_dir: /run/fk-file
  master: 10.0.0.1:7700
  node_id: file-node
  peer_listen: 10.0.0.5:7701
  metrics_addr: 127.0.0.1:9701
  cluster_name: file-cluster
  large_file_paths: [/data/a, /data/b]
  large_limit_size: [4GiB, 8GiB]
`
	const masterYAML = `
master:
  listen: 127.0.0.1:7700
  node_ttl: 9s
  inflight_ttl: 2m
  metrics_addr: 127.0.0.1:9700
`
	tests := []struct {
		name       string
		command    string
		yaml       string
		args       []string
		wantOwner  *config.Owner
		wantMaster *config.Master
		wantErr    string
	}{
		{
			name: "owner: file only", command: "owner", yaml: ownerYAML,
			wantOwner: &config.Owner{DRAM: 1 << 30, SocketDir: "/run/fk-file", Master: "10.0.0.1:7700", NodeID: "file-node",
				PeerListen: "10.0.0.5:7701", MetricsAddr: "127.0.0.1:9701", ClusterName: "file-cluster", InstanceKey: "file-node",
				LargeFilePaths: []string{"/data/a", "/data/b"}, LargeLimitSize: []int64{4 << 30, 8 << 30}},
		},
		{
			name: "owner: flags win", command: "owner", yaml: ownerYAML,
			args: []string{"--dram", "2GiB", "--dir", "rel/dir", "--master", "10.0.0.2:7700", "--node-id", "flag-node",
				"--peer-listen", ":7702", "--metrics-addr", ":9702", "--cluster-name", "flag-cluster", "--instance-key", "ik",
				"--large-limit-size", "1GiB,2GiB"},
			wantOwner: &config.Owner{DRAM: 2 << 30, SocketDir: abs("rel/dir"), Master: "10.0.0.2:7700", NodeID: "flag-node",
				PeerListen: ":7702", MetricsAddr: ":9702", ClusterName: "flag-cluster", InstanceKey: "ik",
				LargeFilePaths: []string{"/data/a", "/data/b"}, LargeLimitSize: []int64{1 << 30, 2 << 30}},
		},
		{
			name: "owner: no file, defaults", command: "owner", args: []string{"--master", "127.0.0.1:1", "--dir", absentDir},
			wantOwner: &config.Owner{DRAM: 1 << 30, SocketDir: absentDir, Master: "127.0.0.1:1", PeerListen: "127.0.0.1:0",
				ClusterName: "fluxkv", InstanceKey: host},
		},
		{
			name: "owner: flags turn the SSD on", command: "owner",
			args: []string{"--master", "127.0.0.1:1", "--dir", absentDir, "--large-file-paths", "/d1", "--large-file-paths", "/d2", "--large-limit-size", "512,1.5KiB"},
			wantOwner: &config.Owner{DRAM: 1 << 30, SocketDir: absentDir, Master: "127.0.0.1:1", PeerListen: "127.0.0.1:0",
				ClusterName: "fluxkv", InstanceKey: host, LargeFilePaths: []string{"/d1", "/d2"}, LargeLimitSize: []int64{512, 1536}},
		},
		{
			name: "owner: relative SSD paths made absolute, as --dir", command: "owner", yaml: "fluxkv_spec:\n  large_file_paths: [rel/file]\n  large_limit_size: [1GiB]\n",
			args: []string{"--master", "127.0.0.1:1", "--dir", absentDir},
			wantOwner: &config.Owner{DRAM: 1 << 30, SocketDir: absentDir, Master: "127.0.0.1:1", PeerListen: "127.0.0.1:0",
				ClusterName: "fluxkv", InstanceKey: host, LargeFilePaths: []string{abs("rel/file")}, LargeLimitSize: []int64{1 << 30}},
		},
		{
			name: "owner: relative SSD path flag made absolute", command: "owner",
			args: []string{"--master", "127.0.0.1:1", "--dir", absentDir, "--ssd-path", "rel/ssd,/abs/ssd", "--ssd-limit", "1GiB,2GiB"},
			wantOwner: &config.Owner{DRAM: 1 << 30, SocketDir: absentDir, Master: "127.0.0.1:1", PeerListen: "127.0.0.1:0",
				ClusterName: "fluxkv", InstanceKey: host, LargeFilePaths: []string{abs("rel/ssd"), "/abs/ssd"}, LargeLimitSize: []int64{1 << 30, 2 << 30}},
		},
		{
			name: "owner: paths flag against the file's limits", command: "owner", yaml: ownerYAML,
			args:    []string{"--large-file-paths", "/only/one"},
			wantErr: "large_limit_size has 2 entries but large_file_paths has 1",
		},
		{name: "owner: bad dram flag", command: "owner", yaml: ownerYAML, args: []string{"--dram", "12XB"}, wantErr: `--dram: size "12XB"`},
		{name: "owner: bad file", command: "owner", yaml: "fluxkv_spec:\n  dram: 12XB\n", wantErr: `fluxkv_spec.dram: invalid size "12XB"`},
		{name: "owner: unknown key", command: "owner", yaml: "fluxkv_spec:\n  drm: 1GiB\n", wantErr: "fluxkv_spec.drm: unknown key"},
		{
			name: "master: file only", command: "master", yaml: masterYAML,
			wantMaster: &config.Master{Placement: "pool", SSDAdmit: "evict", Listen: "127.0.0.1:7700", NodeTTL: 9 * time.Second, InflightTTL: 2 * time.Minute, MetricsAddr: "127.0.0.1:9700"},
		},
		{
			name: "master: flags win", command: "master", yaml: masterYAML,
			args:       []string{"--listen", ":7800", "--node-ttl", "3s", "--heartbeat-interval", "500ms", "--metrics-addr", ":9800"},
			wantMaster: &config.Master{Placement: "pool", SSDAdmit: "evict", Listen: ":7800", NodeTTL: 3 * time.Second, HeartbeatInterval: 500 * time.Millisecond, InflightTTL: 2 * time.Minute, MetricsAddr: ":9800"},
		},
		{
			name: "master: alias flag wins too", command: "master", yaml: masterYAML, args: []string{"--master-listen", ":7900"},
			wantMaster: &config.Master{Placement: "pool", SSDAdmit: "evict", Listen: ":7900", NodeTTL: 9 * time.Second, InflightTTL: 2 * time.Minute, MetricsAddr: "127.0.0.1:9700"},
		},
		{
			name: "master: defaults", command: "master",
			wantMaster: &config.Master{Placement: "pool", SSDAdmit: "evict", Listen: "127.0.0.1:7700", NodeTTL: 5 * time.Second},
		},
		{
			name: "master: placement from the file, the flag wins", command: "master", yaml: "master:\n  placement: local\n",
			wantMaster: &config.Master{Placement: "local", SSDAdmit: "evict", Listen: "127.0.0.1:7700", NodeTTL: 5 * time.Second},
		},
		{
			name: "master: placement flag", command: "master", yaml: "master:\n  placement: local\n", args: []string{"--placement", "pool"},
			wantMaster: &config.Master{Placement: "pool", SSDAdmit: "evict", Listen: "127.0.0.1:7700", NodeTTL: 5 * time.Second},
		},
		{name: "master: bad placement flag", command: "master", args: []string{"--placement", "spread"},
			wantErr: `--placement: invalid placement "spread" (want pool or local)`},
		{name: "master: owner section refused", command: "master", yaml: ownerYAML, wantErr: "fluxkv_spec: not read by `fluxkv master`"},
		{
			name: "up: both sections, flags win", command: "up",
			yaml: "fluxkv_spec:\n  dram: 64MiB\n  socket_dir: /tmp/up\nmaster:\n  node_ttl: 7s\n  listen: 127.0.0.1:7777\n",
			args: []string{"--listen", "127.0.0.1:0"},
			wantOwner: &config.Owner{DRAM: 64 << 20, SocketDir: "/tmp/up", PeerListen: "127.0.0.1:0", ClusterName: "fluxkv",
				InstanceKey: host},
			wantMaster: &config.Master{Placement: "pool", SSDAdmit: "evict", Listen: "127.0.0.1:0", NodeTTL: 7 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			oc, mc, err := runSettings(t, tt.command, tt.yaml, tt.args...)
			if tt.wantErr != "" {
				wantRefusal(t, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantOwner != nil && !reflect.DeepEqual(oc, *tt.wantOwner) {
				t.Errorf("owner settings\n  got  %+v\n  want %+v", oc, *tt.wantOwner)
			}
			if tt.wantMaster != nil && !reflect.DeepEqual(mc, *tt.wantMaster) {
				t.Errorf("master settings\n  got  %+v\n  want %+v", mc, *tt.wantMaster)
			}
		})
	}
}

// log_level and log_format from the file apply unless the global flags were given.
func TestLogSettingsPrecedence(t *testing.T) {
	saved := logger
	t.Cleanup(func() { logger = saved })
	for _, tt := range []struct {
		args      []string
		fileLevel string
		want      zerolog.Level
	}{
		{nil, "", zerolog.InfoLevel},
		{nil, "warn", zerolog.WarnLevel},
		{[]string{"--log-level", "debug"}, "warn", zerolog.DebugLevel},
	} {
		app := &cli.App{Name: "fluxkv", Flags: logFlags(), Before: setupLogging,
			Action: func(c *cli.Context) error { return applyLogSettings(c, tt.fileLevel, "") }}
		if err := app.Run(append([]string{"fluxkv"}, tt.args...)); err != nil {
			t.Fatal(err)
		}
		if got := logger.GetLevel(); got != tt.want {
			t.Errorf("args %v, file level %q: level %v, want %v", tt.args, tt.fileLevel, got, tt.want)
		}
	}
}

// --log-level works after the subcommand as well as before it (the one after wins),
// over FLUXKV_LOG_LEVEL and the file's log_level alike; the real binary takes it there.
func TestLogFlagsAfterSubcommand(t *testing.T) {
	saved := logger
	t.Cleanup(func() { logger = saved })
	for _, tt := range []struct {
		env       string
		args      []string
		fileLevel string
		want      zerolog.Level
	}{
		{"", []string{"cmd"}, "", zerolog.InfoLevel},
		{"", []string{"cmd"}, "warn", zerolog.WarnLevel},
		{"", []string{"cmd", "--log-level", "debug"}, "warn", zerolog.DebugLevel},
		{"", []string{"--log-level", "error", "cmd"}, "warn", zerolog.ErrorLevel},
		{"", []string{"--log-level", "error", "cmd", "--log-level", "debug"}, "", zerolog.DebugLevel},
		{"error", []string{"cmd"}, "warn", zerolog.ErrorLevel},
		{"error", []string{"cmd", "--log-level", "debug"}, "warn", zerolog.DebugLevel},
	} {
		t.Setenv("FLUXKV_LOG_LEVEL", tt.env)
		if tt.env == "" {
			os.Unsetenv("FLUXKV_LOG_LEVEL")
		}
		app := &cli.App{Name: "fluxkv", Flags: logFlags(), Before: setupLogging,
			Commands: withLogFlags([]*cli.Command{{Name: "cmd",
				Action: func(c *cli.Context) error { return applyLogSettings(c, tt.fileLevel, "") }}})}
		if err := app.Run(append([]string{"fluxkv"}, tt.args...)); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got := logger.GetLevel(); got != tt.want {
			t.Errorf("FLUXKV_LOG_LEVEL %q, args %v, file level %q: level %v, want %v", tt.env, tt.args, tt.fileLevel, got, tt.want)
		}
	}
	// The binary: a bad value after the subcommand is the --log-level refusal, not an
	// unknown flag.
	out, err := exec.Command(fluxkvBin(t), "version", "--log-level", "loud").CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code != 2 || !strings.Contains(string(out), `fluxkv: --log-level: invalid log level "loud"`) {
		t.Errorf("fluxkv version --log-level loud: exit status %d, want 2 and the --log-level refusal:\n%s", code, out)
	}
}

// A switch given on the command line overrides the file both ways: --no-promotion=false
// and --insecure-cluster=false turn off what the file turned on.
func TestSettingsSwitchFlagOverridesFile(t *testing.T) {
	for _, tt := range []struct {
		name, command, yaml string
		args                []string
		want                func(config.Owner, config.Master) bool
	}{
		{name: "no promotion off over the file", command: "master", yaml: "master:\n  no_promotion: true\n",
			args: []string{"--no-promotion=false"}, want: func(_ config.Owner, m config.Master) bool { return !m.NoPromotion }},
		{name: "no promotion from the file", command: "master", yaml: "master:\n  no_promotion: true\n",
			want: func(_ config.Owner, m config.Master) bool { return m.NoPromotion }},
		{name: "no promotion from the flag", command: "up", args: []string{"--no-promotion"},
			want: func(_ config.Owner, m config.Master) bool { return m.NoPromotion }},
		{name: "insecure off over the file", command: "master", yaml: "master:\n  insecure_cluster: true\n",
			args: []string{"--insecure-cluster=false"}, want: func(_ config.Owner, m config.Master) bool { return !m.InsecureCluster }},
		{name: "owner insecure off over the file", command: "owner", yaml: "fluxkv_spec:\n  insecure_cluster: true\n",
			args: []string{"--insecure-cluster=false", "--master", "127.0.0.1:1", "--dir", absentDir},
			want: func(o config.Owner, _ config.Master) bool { return !o.InsecureCluster }},
		// The units pass --cluster-secret-file: a file's insecure_cluster refused every
		// start ("contradict each other", naming a flag not given: a review).
		{name: "secret flag over the file's insecure", command: "master", yaml: "master:\n  insecure_cluster: true\n",
			args: []string{"--cluster-secret-file", "/s"},
			want: func(_ config.Owner, m config.Master) bool {
				return !m.InsecureCluster && slices.Equal(m.ClusterSecretFiles, []string{"/s"})
			}},
		{name: "insecure flag over the file's secrets", command: "owner", yaml: "fluxkv_spec:\n  cluster_secret_files: [/s]\n",
			args: []string{"--insecure-cluster", "--master", "127.0.0.1:1", "--dir", absentDir},
			want: func(o config.Owner, _ config.Master) bool { return o.InsecureCluster && len(o.ClusterSecretFiles) == 0 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			oc, mc, err := runSettings(t, tt.command, tt.yaml, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.want(oc, mc) {
				t.Errorf("flags %v over %q: no_promotion %v, master insecure %v, owner insecure %v",
					tt.args, tt.yaml, mc.NoPromotion, mc.InsecureCluster, oc.InsecureCluster)
			}
		})
	}
}

// Values that would silently mean something other than what was written are
// refused at start, exit status 2, with a message naming the flag (and the YAML key
// when the file set it).
func TestSettingsRefusals(t *testing.T) {
	mem, err := memTotal()
	if err != nil {
		t.Fatal(err)
	}
	owner := []string{"--master", "127.0.0.1:1", "--dir", absentDir}
	for _, tt := range []struct {
		name, command, yaml string
		args                []string
		wantErr             string
	}{
		{name: "ssd path without limit", command: "owner", args: append([]string{"--ssd-path", "/d"}, owner...),
			wantErr: "--ssd-path (--large-file-paths) needs --ssd-limit (--large-limit-size; YAML fluxkv_spec.large_limit_size)"},
		{name: "put area without isolation", command: "owner", args: append([]string{"--put-area", "1GiB"}, owner...),
			wantErr: "--put-area is set without --client-isolation"},
		{name: "put area total without isolation", command: "up", yaml: "fluxkv_spec:\n  put_area_total: 4GiB\n",
			wantErr: "fluxkv_spec.put_area_total"},
		{name: "put area above the total", command: "up", args: []string{"--client-isolation", "--put-area", "1GiB", "--put-area-total", "2MiB", "--dram", "16MiB"},
			wantErr: "--put-area 16 MiB is larger than --put-area-total 2 MiB"},
		{name: "alloc wait beyond the owner's master call", command: "master", args: []string{"--alloc-wait", "20s"},
			wantErr: "--alloc-wait 20s is over 10s"},
		{name: "persist workers beyond the bound", command: "master", args: []string{"--persist-workers", "100000"},
			wantErr: "--persist-workers 100000 is over 4096"},
		{name: "master address of port 0", command: "owner", args: []string{"--master", "127.0.0.1:0", "--dir", absentDir},
			wantErr: "port 0 names no listener"},
		{name: "loopback peer listener with masters on etcd off loopback", command: "owner",
			args: []string{"--master", "etcd://10.0.0.1:2379", "--dir", absentDir}, wantErr: "--peer-listen 127.0.0.1:0 is a loopback address"},
		{name: "ssd path flag over a file whose limits are null", command: "up",
			yaml: "fluxkv_spec:\n  large_file_paths: [/a]\n  large_limit_size: null\n", args: []string{"--ssd-path", "/d"},
			wantErr: "--ssd-path (--large-file-paths) needs --ssd-limit"},
		{name: "ssd paths in the file without limits", command: "up", yaml: "fluxkv_spec:\n  large_file_paths: [/a]\n",
			wantErr: "fluxkv_spec.large_file_paths: set without fluxkv_spec.large_limit_size"},
		{name: "dram above memory", command: "owner", args: append([]string{"--dram", strconv.FormatInt(mem+1, 10)}, owner...),
			wantErr: "--dram " + humanSize(mem+1) + " exceeds this machine's memory (" + approxSize(mem) + ", MemTotal)"},
		{name: "dram above memory from the file", command: "up", yaml: "fluxkv_spec:\n  dram: 1PiB\n",
			wantErr: "fluxkv_spec.dram (--dram) 1 PiB exceeds this machine's memory"},
		// Sizes near the int64 limit: rounding them up to the page must not wrap the
		// segment negative and past this check (the owner then failed obscurely).
		{name: "dram at the largest size", command: "up", args: []string{"--dram", "9223372036854775807"},
			wantErr: "--dram 8 EiB (9223372036854775807 B) exceeds this machine's memory"},
		{name: "landing reserve at the largest size", command: "up", args: []string{"--landing-reserve", "9223372036854775807"},
			wantErr: "--dram 1 GiB with the landing reserve of 8 EiB (9223372036854775807 B) exceeds this machine's memory"},
		{name: "dram and landing reserve whose sum wraps", command: "up", args: []string{"--dram", "4611686018427387904", "--landing-reserve", "4611686018427387904"},
			wantErr: "--dram 4 EiB with the landing reserve of 4 EiB exceeds this machine's memory"},
		// DIR/fluxkv.sock.rpc must fit sun_path (107 bytes): found only when the owner
		// listened, after the master had started (exit 1, so systemd restarted it).
		{name: "socket dir too long for the rpc socket", command: "owner", args: []string{"--master", "127.0.0.1:1", "--dir", "/tmp/" + strings.Repeat("x", 87)},
			wantErr: "--dir /tmp/" + strings.Repeat("x", 87) + `: socket path "/tmp/` + strings.Repeat("x", 87) + `/fluxkv.sock.rpc" is 108 bytes, a Unix socket path holds at most 107`},
		{name: "socket dir too long in the file", command: "up", yaml: "fluxkv_spec:\n  socket_dir: /tmp/" + strings.Repeat("y", 100) + "\n",
			wantErr: "fluxkv_spec.socket_dir (--dir) /tmp/" + strings.Repeat("y", 100) + ": socket path"},
		// A socket directory that cannot be one: up told to give --cluster-secret-file,
		// the owner failed with exit 1 (which the units retry for ever).
		{name: "socket dir is a file", command: "up", args: []string{"--dir", "/dev/null"},
			wantErr: "--dir /dev/null: not a directory"},
		{name: "socket dir under a file", command: "owner", yaml: "fluxkv_spec:\n  socket_dir: /dev/null/fk\n", args: []string{"--master", "127.0.0.1:1"},
			wantErr: "fluxkv_spec.socket_dir (--dir) /dev/null/fk: /dev/null is not a directory"},
		// A loopback peer or data listener with a master other hosts reach: the owner
		// refused it only once it had bound its listeners, exit 1 (retried for ever by
		// the units).
		{name: "loopback peer listener, remote master", command: "owner", args: []string{"--master", "10.0.0.1:7700", "--dir", absentDir},
			wantErr: "--peer-listen 127.0.0.1:0 is a loopback address but the master 10.0.0.1:7700 is not on loopback"},
		{name: "loopback data listener, remote master", command: "owner",
			args:    []string{"--master", "10.0.0.1:7700", "--dir", absentDir, "--peer-listen", "0.0.0.0:7701", "--data-listen", "127.0.0.1:7702"},
			wantErr: "--data-listen 127.0.0.1:7702 is a loopback address but the master 10.0.0.1:7700 is not on loopback"},
		{name: "loopback peer listener from the file, remote master", command: "owner",
			yaml:    "fluxkv_spec:\n  master: 10.0.0.1:7700\n  peer_listen: localhost:7701\n",
			wantErr: "fluxkv_spec.peer_listen (--peer-listen) localhost:7701 is a loopback address but the master 10.0.0.1:7700 is not on loopback"},
		{name: "loopback advertised host, remote master", command: "owner",
			args:    []string{"--master", "10.0.0.1:7700", "--dir", absentDir, "--peer-listen", "0.0.0.0:7701", "--advertise-host", "127.0.0.1"},
			wantErr: "--advertise-host 127.0.0.1 is a loopback address but the master 10.0.0.1:7700 is not on loopback"},
		{name: "up: loopback peer listener, wildcard master", command: "up", args: []string{"--listen", "0.0.0.0:7700"},
			wantErr: "--peer-listen 127.0.0.1:0 is a loopback address but the master 0.0.0.0:7700 is not on loopback"},
		// It names the SSD cache root: with SSD on the owner failed after the master
		// had started ("ssd options: cluster name is required", exit 1).
		{name: "empty cluster name", command: "up", args: []string{"--cluster-name", "", "--ssd-path", "/d", "--ssd-limit", "1MiB"},
			wantErr: "--cluster-name: empty: it names the SSD cache root and the etcd prefix"},
		// Not the working directory, which --dir "" silently was (the file refuses it).
		{name: "empty socket dir", command: "owner", args: []string{"--master", "127.0.0.1:1", "--dir", ""},
			wantErr: `--dir: empty (leave it out for the default`},
		{name: "negative cache grace", command: "up", args: []string{"--cache-grace", "-1s"},
			wantErr: "--cache-grace: -1s must be ≥ 0 (0 or off disables the grace"},
		{name: "cache grace without unit", command: "up", args: []string{"--cache-grace", "20"},
			wantErr: `--cache-grace: invalid duration "20"`},
		{name: "hot set above 1", command: "up", args: []string{"--hot-set", "1.5"},
			wantErr: "--hot-set: 1.5 must be ≤ 1: it is a fraction of the memory pool (0 or off disables the hot set"},
		{name: "negative hot set", command: "owner", args: append([]string{"--hot-set=-0.5"}, owner...),
			wantErr: "--hot-set: -0.5 must be ≥ 0 (0 or off disables the hot set"},
		{name: "hot set not a number", command: "up", args: []string{"--hot-set", "50%"},
			wantErr: `--hot-set: invalid fraction "50%"`},
		{name: "hot set above 1 in the file", command: "up", yaml: "fluxkv_spec:\n  hot_set: 2\n",
			wantErr: "fluxkv_spec.hot_set: 2 must be ≤ 1"},
		{name: "uid share 0", command: "up", args: []string{"--uid-share", "0"},
			wantErr: "--uid-share: 0 must be a fraction 0 < x ≤ 1 (off or unset: no per-uid bound"},
		{name: "uid share above 1 in the file", command: "up", yaml: "fluxkv_spec:\n  uid_share: 1.5\n",
			wantErr: "fluxkv_spec.uid_share: 1.5 must be a fraction 0 < x ≤ 1"},
		{name: "uid share not a number", command: "up", args: []string{"--uid-share", "half"},
			wantErr: `--uid-share: invalid share "half"`},
		{name: "negative max connections", command: "owner", args: append([]string{"--max-connections", "-1"}, owner...),
			wantErr: "--max-connections must be ≥ 0, got -1"},
		{name: "max connections above the open-file limit", command: "up", args: []string{"--max-connections", "2000000000"},
			wantErr: "--max-connections 2000000000 per socket (attach and RPC: 4000000000) exceeds the open-file limit (RLIMIT_NOFILE"},
		{name: "zero hello timeout", command: "up", args: []string{"--hello-timeout", "0s"},
			wantErr: "--hello-timeout must be positive, got 0s"},
		{name: "negative idle timeout", command: "owner", args: append([]string{"--idle-timeout=-1s"}, owner...),
			wantErr: "--idle-timeout must be positive, got -1s"},
		{name: "frame memory below two frames", command: "up", args: []string{"--frame-memory", "32MiB"},
			wantErr: "--frame-memory 32MiB: must be at least 64 MiB"},
		{name: "frame memory below two frames in the file", command: "up", yaml: "fluxkv_spec:\n  frame_memory: 1MiB\n",
			wantErr: "fluxkv_spec.frame_memory (--frame-memory) 1 MiB: must be at least 64 MiB"},
		// The flags' minimums hold for the file's values too (the daemon refused this
		// put_area_total only after the master had started, and rounded a put_area up).
		{name: "put area total below 1 MiB in the file", command: "up", yaml: "fluxkv_spec:\n  put_area_total: 100\n",
			wantErr: "fluxkv_spec.put_area_total (--put-area-total) 100 B: must be at least 1 MiB"},
		{name: "put area below a page in the file", command: "owner", yaml: "fluxkv_spec:\n  put_area: 100\n", args: owner,
			wantErr: "fluxkv_spec.put_area (--put-area) 100 B: must be at least 4 KiB"},
		{name: "negative frame timeout in the file", command: "up", yaml: "fluxkv_spec:\n  frame_timeout: -2s\n",
			wantErr: `fluxkv_spec.frame_timeout: invalid duration "-2s": must be positive`},
		{name: "max connections from the file above the limit", command: "up", yaml: "fluxkv_spec:\n  max_connections: 2000000000\n",
			wantErr: "fluxkv_spec.max_connections (--max-connections) 2000000000 per socket"},
		{name: "zero node ttl", command: "master", args: []string{"--node-ttl", "0s"},
			wantErr: "--node-ttl must be positive, got 0s"},
		{name: "negative persist workers", command: "master", args: []string{"--persist-workers", "-1"},
			wantErr: "--persist-workers must be ≥ 0, got -1 (0 = the default)"},
		{name: "negative alloc wait", command: "up", args: []string{"--alloc-wait", "-1s"},
			wantErr: "--alloc-wait must be positive, got -1s"},
		{name: "negative inflight ttl", command: "master", args: []string{"--inflight-ttl=-5s"},
			wantErr: "--inflight-ttl must be positive, got -5s"},
		// A review: a word left after the flags dropped every flag after it, silently.
		{name: "a size's unit apart", command: "up", args: []string{"--dram", "64", "GiB", "--dir", absentDir},
			wantErr: `fluxkv up takes no arguments, got "GiB": flags after it were not read`},
		{name: "a stray word", command: "owner", args: append([]string{"extra"}, owner...),
			wantErr: `fluxkv owner takes no arguments, got "extra"`},
		{name: "a stray word on the master", command: "master", args: []string{"--insecure-cluster", "extra"},
			wantErr: `fluxkv master takes no arguments, got "extra"`},
		{name: "ttl barely above the heartbeat", command: "master", args: []string{"--heartbeat-interval", "1s", "--node-ttl", "1100ms"},
			wantErr: "--node-ttl 1.1s must be at least twice --heartbeat-interval 1s"},
		{name: "an in-flight ttl under a millisecond", command: "master", args: []string{"--inflight-ttl", "900us"},
			wantErr: "--inflight-ttl 900µs is under 1ms: owners are told it in whole milliseconds"},
		{name: "a heartbeat under a millisecond", command: "master", args: []string{"--heartbeat-interval", "500us", "--node-ttl", "2s"},
			wantErr: "--heartbeat-interval 500µs is under 1ms"},
		{name: "alloc wait past a short in-flight ttl's plan age", command: "master", args: []string{"--inflight-ttl", "24s", "--alloc-wait", "5s"},
			wantErr: "--alloc-wait 5s is over 4s, the oldest plan an owner still carries out (at most 10 s, and a sixth of --inflight-ttl 24s)"},
		{name: "heartbeat flag above the default ttl", command: "master", args: []string{"--heartbeat-interval", "6s"},
			wantErr: "--node-ttl 5s must be at least twice --heartbeat-interval 6s"},
		{name: "flag ttl below the file's heartbeat", command: "up", yaml: "master:\n  heartbeat_interval: 3s\n",
			args: []string{"--node-ttl", "2s"}, wantErr: "--node-ttl 2s must be at least twice master.heartbeat_interval (--heartbeat-interval) 3s"},
		{name: "file ttl at the default heartbeat", command: "master", yaml: "master:\n  node_ttl: 1s\n",
			wantErr: "master.node_ttl (--node-ttl) 1s must be at least twice --heartbeat-interval 1s"},
		{name: "port out of range", command: "owner", args: append([]string{"--peer-listen", "127.0.0.1:65536"}, owner...),
			wantErr: `--peer-listen: invalid address "127.0.0.1:65536": port "65536" is not a number from 0 to 65535`},
		{name: "bad metrics address in the file", command: "master", yaml: "master:\n  metrics_addr: \"127.0.0.1:http\"\n",
			wantErr: `master.metrics_addr: invalid address "127.0.0.1:http"`},
		{name: "bad master address flag", command: "owner", args: []string{"--master", "10.0.0.1", "--dir", absentDir},
			wantErr: `--master: invalid address "10.0.0.1": want host:port`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runSettings(t, tt.command, tt.yaml, tt.args...)
			wantRefusal(t, err, tt.wantErr)
		})
	}
}

// Two listeners of one process on the same port of overlapping hosts (the same host,
// or a wildcard) are refused at start: the second bind failed only after the first
// component had started, "address already in use" as if another process held it.
func TestSettingsListenClash(t *testing.T) {
	owner := []string{"--master", "127.0.0.1:1", "--dir", absentDir}
	for _, tt := range []struct {
		name, command, yaml string
		args                []string
		wantErr             string // "": accepted
	}{
		{name: "peer and data", command: "owner", args: append([]string{"--peer-listen", "127.0.0.1:7701", "--data-listen", "127.0.0.1:7701"}, owner...),
			wantErr: `--peer-listen "127.0.0.1:7701" and --data-listen "127.0.0.1:7701" are one port of one host`},
		{name: "wildcard peer and metrics", command: "owner", args: append([]string{"--peer-listen", "0.0.0.0:7701", "--metrics-addr", "127.0.0.1:7701"}, owner...),
			wantErr: `--peer-listen "0.0.0.0:7701" and --metrics-addr "127.0.0.1:7701" are one port of one host`},
		{name: "peer from the file, data flag", command: "owner", yaml: "fluxkv_spec:\n  peer_listen: \":7701\"\n",
			args:    append([]string{"--data-listen", "10.0.0.1:7701"}, owner...),
			wantErr: `fluxkv_spec.peer_listen (--peer-listen) ":7701" and --data-listen "10.0.0.1:7701" are one port of one host`},
		{name: "master and its metrics", command: "master", args: []string{"--listen", "127.0.0.1:7700", "--metrics-addr", "[::]:7700"},
			wantErr: `--listen "127.0.0.1:7700" and --metrics-addr "[::]:7700" are one port of one host`},
		{name: "up: master and peer", command: "up", args: []string{"--listen", "127.0.0.1:7700", "--peer-listen", "127.0.0.1:7700"},
			wantErr: `--listen "127.0.0.1:7700" and --peer-listen "127.0.0.1:7700" are one port of one host`},
		{name: "up: master's metrics from the file and data", command: "up", yaml: "master:\n  metrics_addr: 127.0.0.1:9700\n",
			args:    []string{"--data-listen", "127.0.0.1:9700"},
			wantErr: `--data-listen "127.0.0.1:9700" and master.metrics_addr (--metrics-addr) "127.0.0.1:9700" are one port of one host`},
		{name: "localhost and 127.0.0.1", command: "owner", args: append([]string{"--peer-listen", "localhost:7701", "--data-listen", "127.0.0.1:7701"}, owner...),
			wantErr: `--peer-listen "localhost:7701" and --data-listen "127.0.0.1:7701" are one port of one host`},
		{name: "up: master on localhost, metrics on 127.0.0.1", command: "up", args: []string{"--listen", "localhost:7700", "--metrics-addr", "127.0.0.1:7700"},
			wantErr: `--listen "localhost:7700" and --metrics-addr "127.0.0.1:7700" are one port of one host`},
		{name: "same port, other hosts", command: "owner", args: append([]string{"--peer-listen", "127.0.0.1:7701", "--data-listen", "127.0.0.2:7701"}, owner...)},
		{name: "port 0 twice", command: "up", args: []string{"--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}},
		{name: "up: the owner's metrics replace the master's", command: "up",
			yaml: "fluxkv_spec:\n  metrics_addr: 127.0.0.1:9701\nmaster:\n  metrics_addr: 127.0.0.1:9700\n",
			args: []string{"--peer-listen", "127.0.0.1:9700"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runSettings(t, tt.command, tt.yaml, tt.args...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantRefusal(t, err, tt.wantErr)
		})
	}
}

// The values those refusals border on are accepted with the meaning they say.
func TestSettingsEdges(t *testing.T) {
	off := time.Duration(0)
	grace := 50 * time.Millisecond
	for _, tt := range []struct {
		name, yaml string
		args       []string
		check      func(config.Owner) string
	}{
		{"cache grace off", "", []string{"--cache-grace", "off"}, func(o config.Owner) string {
			if o.CacheGrace == nil || *o.CacheGrace != 0 {
				return fmt.Sprintf("CacheGrace %v, want 0 (off)", o.CacheGrace)
			}
			if g := ownerOptions(o, "127.0.0.1:1", nil, nil).CacheGrace; g >= 0 {
				return fmt.Sprintf("daemon CacheGrace %v, want negative (disabled)", g)
			}
			return ""
		}},
		{"cache grace 0s is off", "", []string{"--cache-grace", "0s"}, func(o config.Owner) string {
			if g := ownerOptions(o, "127.0.0.1:1", nil, nil).CacheGrace; g >= 0 {
				return fmt.Sprintf("daemon CacheGrace %v, want negative (disabled)", g)
			}
			return ""
		}},
		{"cache grace unset is the daemon's default", "", nil, func(o config.Owner) string {
			if g := ownerOptions(o, "127.0.0.1:1", nil, nil).CacheGrace; g != 0 {
				return fmt.Sprintf("daemon CacheGrace %v, want 0 (its default)", g)
			}
			return ""
		}},
		{"cache grace from the file, flag wins", "fluxkv_spec:\n  cache_grace: off\n", []string{"--cache-grace", "50ms"}, func(o config.Owner) string {
			if o.CacheGrace == nil || *o.CacheGrace != grace {
				return fmt.Sprintf("CacheGrace %v, want %v", o.CacheGrace, grace)
			}
			return ""
		}},
		{"cache grace from the file", "fluxkv_spec:\n  cache_grace: off\n", nil, func(o config.Owner) string {
			if o.CacheGrace == nil || *o.CacheGrace != off {
				return fmt.Sprintf("CacheGrace %v, want 0 (off)", o.CacheGrace)
			}
			return ""
		}},
		{"hot set off", "", []string{"--hot-set", "off"}, func(o config.Owner) string {
			if o.HotSet == nil || *o.HotSet != 0 {
				return fmt.Sprintf("HotSet %v, want 0 (off)", o.HotSet)
			}
			if h := ownerOptions(o, "127.0.0.1:1", nil, nil).HotSet; h >= 0 {
				return fmt.Sprintf("daemon HotSet %v, want negative (disabled)", h)
			}
			return ""
		}},
		{"hot set 0 is off", "", []string{"--hot-set", "0"}, func(o config.Owner) string {
			if h := ownerOptions(o, "127.0.0.1:1", nil, nil).HotSet; h >= 0 {
				return fmt.Sprintf("daemon HotSet %v, want negative (disabled)", h)
			}
			return ""
		}},
		{"hot set unset is the daemon's default", "", nil, func(o config.Owner) string {
			if h := ownerOptions(o, "127.0.0.1:1", nil, nil).HotSet; h != 0 {
				return fmt.Sprintf("daemon HotSet %v, want 0 (its default)", h)
			}
			return ""
		}},
		{"hot set from the file, flag wins", "fluxkv_spec:\n  hot_set: off\n", []string{"--hot-set", "0.25"}, func(o config.Owner) string {
			if o.HotSet == nil || *o.HotSet != 0.25 {
				return fmt.Sprintf("HotSet %v, want 0.25", o.HotSet)
			}
			if h := ownerOptions(o, "127.0.0.1:1", nil, nil).HotSet; h != 0.25 {
				return fmt.Sprintf("daemon HotSet %v, want 0.25", h)
			}
			return ""
		}},
		{"hot set from the file", "fluxkv_spec:\n  hot_set: 0.75\n", nil, func(o config.Owner) string {
			if h := ownerOptions(o, "127.0.0.1:1", nil, nil).HotSet; h != 0.75 {
				return fmt.Sprintf("daemon HotSet %v, want 0.75", h)
			}
			return ""
		}},
		{"hot set off in the file, flag wins", "fluxkv_spec:\n  hot_set: 0.75\n", []string{"--hot-set", "off"}, func(o config.Owner) string {
			if h := ownerOptions(o, "127.0.0.1:1", nil, nil).HotSet; h >= 0 {
				return fmt.Sprintf("daemon HotSet %v, want negative (disabled)", h)
			}
			return ""
		}},
		{"uid share unset is the daemon's default", "", nil, func(o config.Owner) string {
			if u := ownerOptions(o, "127.0.0.1:1", nil, nil).UIDShare; u != 0 {
				return fmt.Sprintf("daemon UIDShare %v, want 0 (its default)", u)
			}
			return ""
		}},
		{"uid share from the file, flag wins", "fluxkv_spec:\n  uid_share: 0.75\n", []string{"--uid-share", "off"}, func(o config.Owner) string {
			if u := ownerOptions(o, "127.0.0.1:1", nil, nil).UIDShare; u != 1 {
				return fmt.Sprintf("daemon UIDShare %v, want 1 (off)", u)
			}
			return ""
		}},
		{"uid share from the file", "fluxkv_spec:\n  uid_share: 0.25\n", nil, func(o config.Owner) string {
			if u := ownerOptions(o, "127.0.0.1:1", nil, nil).UIDShare; u != 0.25 {
				return fmt.Sprintf("daemon UIDShare %v, want 0.25", u)
			}
			return ""
		}},
		{"max connections wired", "fluxkv_spec:\n  max_connections: 64\n", nil, func(o config.Owner) string {
			if n := ownerOptions(o, "127.0.0.1:1", nil, nil).MaxConnections; n != 64 {
				return fmt.Sprintf("daemon MaxConnections %d, want 64", n)
			}
			return ""
		}},
		{"frame memory wired, flag wins", "fluxkv_spec:\n  frame_memory: 256MiB\n", []string{"--frame-memory", "128MiB"}, func(o config.Owner) string {
			if n := ownerOptions(o, "127.0.0.1:1", nil, nil).FrameMemory; n != 128<<20 {
				return fmt.Sprintf("daemon FrameMemory %d, want 128 MiB", n)
			}
			return ""
		}},
		{"frame memory from the file", "fluxkv_spec:\n  frame_memory: 256MiB\n", nil, func(o config.Owner) string {
			if n := ownerOptions(o, "127.0.0.1:1", nil, nil).FrameMemory; n != 256<<20 {
				return fmt.Sprintf("daemon FrameMemory %d, want 256 MiB", n)
			}
			return ""
		}},
		{"timeouts wired, flags win", "fluxkv_spec:\n  hello_timeout: 2s\n  frame_timeout: 3s\n  idle_timeout: 4s\n", []string{"--idle-timeout", "1m"}, func(o config.Owner) string {
			d := ownerOptions(o, "127.0.0.1:1", nil, nil)
			if d.HelloTimeout != 2*time.Second || d.FrameTimeout != 3*time.Second || d.IdleTimeout != time.Minute {
				return fmt.Sprintf("daemon hello/frame/idle timeouts %v/%v/%v, want 2s/3s/1m", d.HelloTimeout, d.FrameTimeout, d.IdleTimeout)
			}
			return ""
		}},
		{"isolation and allowed uids wired, flags win", "fluxkv_spec:\n  allowed_uids: [1001, 1002]\n  client_isolation: true\n  put_area: 4MiB\n  put_area_total: 64MiB\n",
			[]string{"--allow-uid", "7", "--put-area", "8MiB"}, func(o config.Owner) string {
				d := ownerOptions(o, "127.0.0.1:1", nil, nil)
				if !d.ClientIsolation || d.PutArea != 8<<20 || d.PutAreaTotal != 64<<20 || !slices.Equal(d.AllowedUIDs, []uint32{7}) {
					return fmt.Sprintf("daemon isolation %v put area %d total %d allowed %v, want true 8MiB 64MiB [7]",
						d.ClientIsolation, d.PutArea, d.PutAreaTotal, d.AllowedUIDs)
				}
				return ""
			}},
		{"prefault by default", "", nil, func(o config.Owner) string {
			if d := ownerOptions(o, "127.0.0.1:1", nil, nil); !d.Prefault {
				return "daemon Prefault false, want true (the default)"
			}
			return ""
		}},
		{"prefault off in the file", "fluxkv_spec:\n  prefault: false\n", nil, func(o config.Owner) string {
			if d := ownerOptions(o, "127.0.0.1:1", nil, nil); d.Prefault {
				return "daemon Prefault true, want false (the file's)"
			}
			return ""
		}},
		{"prefault flag wins over the file", "fluxkv_spec:\n  prefault: false\n", []string{"--prefault"}, func(o config.Owner) string {
			if d := ownerOptions(o, "127.0.0.1:1", nil, nil); !d.Prefault {
				return "daemon Prefault false, want true (the flag's)"
			}
			return ""
		}},
		{"huge pages by default, off in the file, the flag over the file", "", nil, func(o config.Owner) string {
			for _, c := range []struct {
				file string
				args []string
				want bool
			}{{"", nil, true}, {"fluxkv_spec:\n  huge_pages: false\n", nil, false}, {"fluxkv_spec:\n  huge_pages: false\n", []string{"--huge-pages"}, true}} {
				oc, _, err := runSettings(t, "owner", c.file, append([]string{"--dram", "64MiB", "--dir", absentDir}, c.args...)...)
				if err != nil {
					return fmt.Sprintf("file %q flags %v: %v", c.file, c.args, err)
				}
				if got := ownerOptions(oc, "127.0.0.1:1", nil, nil).HugePages; got != c.want {
					return fmt.Sprintf("file %q flags %v: daemon HugePages %v, want %v", c.file, c.args, got, c.want)
				}
			}
			return ""
		}},
		{"allowed uids from the file", "fluxkv_spec:\n  allowed_uids: [1001, 1002]\n", nil, func(o config.Owner) string {
			if d := ownerOptions(o, "127.0.0.1:1", nil, nil); !slices.Equal(d.AllowedUIDs, []uint32{1001, 1002}) || d.ClientIsolation {
				return fmt.Sprintf("daemon allowed %v isolation %v, want [1001 1002] false", d.AllowedUIDs, d.ClientIsolation)
			}
			return ""
		}},
		{"max connections flag wins", "fluxkv_spec:\n  max_connections: 64\n", []string{"--max-connections", "0"}, func(o config.Owner) string {
			if o.MaxConnections != 0 {
				return fmt.Sprintf("MaxConnections %d, want 0 (derived)", o.MaxConnections)
			}
			return ""
		}},
		{"the longest socket dir whose rpc socket fits", "", []string{"--dir", "/tmp/" + strings.Repeat("x", 86)}, func(o config.Owner) string {
			if p := wire.RPCSocketPath(filepath.Join(o.SocketDir, wire.SocketName)); len(p) != 107 {
				return fmt.Sprintf("rpc socket %q is %d bytes, want 107", p, len(p))
			}
			return ""
		}},
		// As --landing-reserve 0 (its default): none.
		{"landing reserve 0 in the file", "fluxkv_spec:\n  landing_reserve: 0\n", nil, func(o config.Owner) string {
			if o.LandingReserve != 0 {
				return fmt.Sprintf("LandingReserve %d, want 0 (none)", o.LandingReserve)
			}
			return ""
		}},
		// "At most the segment": a put area at the int64 limit is the segment, where
		// rounding it up to the page wrapped it negative and the owner refused to start.
		{"put area beyond the segment", "", []string{"--client-isolation", "--put-area", "9223372036854775807"}, func(o config.Owner) string {
			if _, err := daemon.New(ownerOptions(o, "127.0.0.1:1", nil, nil)); err != nil {
				return err.Error()
			}
			return ""
		}},
		{"dram not a page multiple is kept as asked", "", []string{"--dram", "4097"}, func(o config.Owner) string {
			if o.DRAM != 4097 || segmentSize(o.DRAM) != 8192 {
				return fmt.Sprintf("DRAM %d segment %d, want 4097 and 8192", o.DRAM, segmentSize(o.DRAM))
			}
			return ""
		}},
		{"ssd null limits with paths: off on purpose", "fluxkv_spec:\n  large_file_paths: [/a]\n  large_limit_size: null\n", nil, func(o config.Owner) string {
			if o.SSDEnabled() || ownerOptions(o, "127.0.0.1:1", nil, nil).SSD != nil {
				return "SSD on, want off"
			}
			return ""
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			oc, _, err := runSettings(t, "up", tt.yaml, append([]string{"--dir", absentDir}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			if msg := tt.check(oc); msg != "" {
				t.Error(msg)
			}
		})
	}
}

func TestHumanSize(t *testing.T) {
	for _, tt := range []struct {
		n      int64
		human  string
		approx string
	}{
		{0, "0 B", "0 B"},
		{512, "512 B", "512 B"},
		{4096, "4 KiB", "4 KiB"},
		{4097, "4 KiB (4097 B)", "4 KiB"},
		{8192, "8 KiB", "8 KiB"},
		{6 << 10, "6 KiB", "6 KiB"},
		{3 << 29, "1.5 GiB", "1.5 GiB"},
		{5 << 28, "1.25 GiB", "1.25 GiB"},
		{(1 << 30) - 1, "1024 MiB (1073741823 B)", "1024 MiB"},
		{1<<30 + 1<<30/3, "1.33 GiB (1431655765 B)", "1.33 GiB"},
		{1<<30*2 - 1<<30/200, "2 GiB (2142114939 B)", "2 GiB"}, // 1.995000001 rounds up
		{1 << 50, "1 PiB", "1 PiB"},
	} {
		if got := humanSize(tt.n); got != tt.human {
			t.Errorf("humanSize(%d) = %q, want %q", tt.n, got, tt.human)
		}
		if got := approxSize(tt.n); got != tt.approx {
			t.Errorf("approxSize(%d) = %q, want %q", tt.n, got, tt.approx)
		}
	}
}

// Masters on etcd (HA, docs/architecture.md §12): `fluxkv master`'s flags merge over the file's
// master section, the prefix defaults to /fluxkv/<cluster name>/, and settings that
// cannot work together are refused with exit status 2.
func TestSettingsMasterHA(t *testing.T) {
	const haYAML = `
master:
  listen: 0.0.0.0:7700
  etcd_endpoints: [e1:2379, e2:2379]
  advertise_addr: 10.0.0.5:7700
  cluster_name: prod
  leader_ttl: 4s
`
	base := config.Master{Placement: "pool", SSDAdmit: "evict", NodeTTL: 5 * time.Second}
	with := func(f func(m *config.Master)) *config.Master {
		m := base
		f(&m)
		return &m
	}
	for _, tt := range []struct {
		name, yaml string
		args       []string
		want       *config.Master
		wantErr    string
	}{
		{name: "alone by default", want: with(func(m *config.Master) { m.Listen = "127.0.0.1:7700" })},
		{name: "cluster name alone is ignored", args: []string{"--cluster-name", "prod"},
			want: with(func(m *config.Master) { m.Listen = "127.0.0.1:7700" })},
		{name: "file only", yaml: haYAML, want: with(func(m *config.Master) {
			m.Listen, m.EtcdEndpoints, m.AdvertiseAddr, m.ClusterName, m.EtcdPrefix, m.LeaderTTL =
				"0.0.0.0:7700", []string{"e1:2379", "e2:2379"}, "10.0.0.5:7700", "prod", "/fluxkv/prod/", 4*time.Second
		})},
		{name: "flags win", yaml: haYAML,
			args: []string{"--etcd-endpoints", "f1:2379,f2:2379", "--etcd-endpoints", "https://f3:2379", "--advertise-addr", "10.0.0.6:7700",
				"--cluster-name", "flagged", "--leader-ttl", "3s", "--etcd-cacert", "/ca.pem", "--etcd-cert", "/c.pem", "--etcd-key", "/k.pem"},
			want: with(func(m *config.Master) {
				m.Listen, m.EtcdEndpoints, m.AdvertiseAddr, m.ClusterName, m.EtcdPrefix, m.LeaderTTL =
					"0.0.0.0:7700", []string{"f1:2379", "f2:2379", "https://f3:2379"}, "10.0.0.6:7700", "flagged", "/fluxkv/flagged/", 3*time.Second
				m.EtcdCACert, m.EtcdCert, m.EtcdKey = "/ca.pem", "/c.pem", "/k.pem"
			})},
		{name: "flags only, listen not a wildcard: advertise defaults to it", args: []string{"--etcd-endpoints", "e:2379", "--listen", "10.0.0.7:7700"},
			want: with(func(m *config.Master) {
				m.Listen, m.EtcdEndpoints, m.ClusterName, m.EtcdPrefix = "10.0.0.7:7700", []string{"e:2379"}, "fluxkv", "/fluxkv/fluxkv/"
			})},
		{name: "prefix flag over the file's", yaml: haYAML + "  etcd_prefix: /file/\n", args: []string{"--etcd-prefix", "/flag/p/"},
			want: with(func(m *config.Master) {
				m.Listen, m.EtcdEndpoints, m.AdvertiseAddr, m.ClusterName, m.EtcdPrefix, m.LeaderTTL =
					"0.0.0.0:7700", []string{"e1:2379", "e2:2379"}, "10.0.0.5:7700", "prod", "/flag/p/", 4*time.Second
			})},
		{name: "prefix from the file", yaml: haYAML + "  etcd_prefix: /file/\n",
			want: with(func(m *config.Master) {
				m.Listen, m.EtcdEndpoints, m.AdvertiseAddr, m.ClusterName, m.EtcdPrefix, m.LeaderTTL =
					"0.0.0.0:7700", []string{"e1:2379", "e2:2379"}, "10.0.0.5:7700", "prod", "/file/", 4*time.Second
			})},

		// Refusals.
		{name: "wildcard listen without advertise", args: []string{"--etcd-endpoints", "e:2379", "--listen", ":7700"},
			wantErr: `--advertise-addr (master.advertise_addr) is required with etcd endpoints when --listen ":7700" is a wildcard or port 0`},
		{name: "0.0.0.0 listen without advertise", args: []string{"--etcd-endpoints", "e:2379", "--listen", "0.0.0.0:7700"},
			wantErr: `--advertise-addr (master.advertise_addr) is required`},
		{name: ":: listen from the file without advertise", yaml: "master:\n  listen: \"[::]:7700\"\n", args: []string{"--etcd-endpoints", "e:2379"},
			wantErr: `master.listen (--listen) "[::]:7700" is a wildcard or port 0`},
		{name: "port 0 listen without advertise", args: []string{"--etcd-endpoints", "e:2379", "--listen", "10.0.0.1:0"},
			wantErr: `--listen "10.0.0.1:0" is a wildcard or port 0`},
		{name: "advertise a wildcard", args: []string{"--etcd-endpoints", "e:2379", "--advertise-addr", "0.0.0.0:7700"},
			wantErr: `--advertise-addr: invalid address "0.0.0.0:7700": advertise a host other hosts can reach`},
		{name: "advertise without endpoints", args: []string{"--advertise-addr", "10.0.0.1:7700"},
			wantErr: "--advertise-addr needs --etcd-endpoints (master.etcd_endpoints): without etcd the master runs alone"},
		{name: "file prefix without endpoints", yaml: "master: {etcd_prefix: /p/}",
			wantErr: "master.etcd_prefix (--etcd-prefix) needs --etcd-endpoints"},
		{name: "leader ttl without endpoints", args: []string{"--leader-ttl", "3s"}, wantErr: "--leader-ttl needs --etcd-endpoints"},
		{name: "cacert without endpoints", args: []string{"--etcd-cacert", "/ca.pem"}, wantErr: "--etcd-cacert needs --etcd-endpoints"},
		{name: "file key without endpoints", yaml: "master: {etcd_key: /k.pem}", wantErr: "master.etcd_key (--etcd-key) needs --etcd-endpoints"},
		{name: "cert without key", yaml: haYAML, args: []string{"--etcd-cert", "/c.pem"},
			wantErr: "--etcd-cert without --etcd-key (master.etcd_key): give both the client certificate and its key, or neither"},
		{name: "key from the file without cert", yaml: haYAML + "  etcd_key: /k.pem\n",
			wantErr: "master.etcd_key (--etcd-key) without --etcd-cert (master.etcd_cert)"},
		{name: "bad prefix flag", yaml: haYAML, args: []string{"--etcd-prefix", "fluxkv"},
			wantErr: `--etcd-prefix: invalid etcd prefix "fluxkv": must start and end with /`},
		{name: "zero leader ttl", yaml: haYAML, args: []string{"--leader-ttl", "0s"},
			wantErr: "--leader-ttl must be positive, got 0s"},
		{name: "bad endpoint flag", args: []string{"--etcd-endpoints", "e1:2379,e2", "--listen", "10.0.0.1:7700"},
			wantErr: `--etcd-endpoints: invalid etcd endpoint "e2": want host:port`},
		{name: "empty endpoints flag", args: []string{"--etcd-endpoints", ""},
			wantErr: "--etcd-endpoints: no endpoint given"},
		{name: "empty cluster name", args: []string{"--etcd-endpoints", "e:2379", "--listen", "10.0.0.1:7700", "--cluster-name", ""},
			wantErr: "--cluster-name: empty: it names the etcd prefix"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, mc, err := runSettings(t, "master", tt.yaml, tt.args...)
			if tt.wantErr != "" {
				wantRefusal(t, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(mc, *tt.want) {
				t.Errorf("master settings\n  got  %+v\n  want %+v", mc, *tt.want)
			}
			if len(mc.EtcdEndpoints) > 0 {
				h := haOptions(mc)
				if !slices.Equal(h.Etcd.Endpoints, mc.EtcdEndpoints) || h.Etcd.Prefix != mc.EtcdPrefix || h.AdvertiseAddr != mc.AdvertiseAddr ||
					h.LeaderTTL != mc.LeaderTTL || h.Etcd.TLS.CACert != mc.EtcdCACert || h.Etcd.TLS.Cert != mc.EtcdCert || h.Etcd.TLS.Key != mc.EtcdKey {
					t.Errorf("haOptions(%+v) = %+v", mc, h)
				}
				if err := h.Etcd.Validate(); err != nil {
					t.Errorf("haOptions: %v", err)
				}
			}
		})
	}
}

// The HA flags are `fluxkv master`'s (and the etcd TLS flags `fluxkv owner`'s):
// `fluxkv up` is one node with its own master, and refuses the YAML keys too.
func TestSettingsUpHasNoHA(t *testing.T) {
	names := func(cmd *cli.Command) map[string]bool {
		m := map[string]bool{}
		for _, f := range cmd.Flags {
			for _, n := range f.Names() {
				m[n] = true
			}
		}
		return m
	}
	master, owner, up := names(masterCommand()), names(ownerCommand()), names(upCommand())
	for _, f := range haFlags() {
		n := f.Names()[0]
		if !master[n] {
			t.Errorf("fluxkv master lacks --%s", n)
		}
		if up[n] && n != "cluster-name" { // up's --cluster-name is the owner's
			t.Errorf("fluxkv up has --%s", n)
		}
	}
	for _, n := range []string{"etcd-cacert", "etcd-cert", "etcd-key"} {
		if !owner[n] {
			t.Errorf("fluxkv owner lacks --%s", n)
		}
	}
	for _, tt := range []struct{ yaml, wantErr string }{
		{"master:\n  etcd_endpoints: [e:2379]\n",
			"master.etcd_endpoints: not for `fluxkv up` (one node, its own master); run `fluxkv master`"},
		{"master:\n  advertise_addr: 10.0.0.1:7700\n", "master.advertise_addr: not for `fluxkv up`"},
		{"fluxkv_spec:\n  etcd_cert: /c.pem\n", "fluxkv_spec.etcd_cert: not for `fluxkv up`"},
	} {
		_, _, err := runSettings(t, "up", tt.yaml)
		wantRefusal(t, err, tt.wantErr)
	}
}

// An owner's --master etcd://H:P[,H:P...][/PREFIX/] (or fluxkv_spec.master) follows
// the leader on etcd: daemon.Options.MasterEtcd, with the prefix defaulting to
// /fluxkv/<cluster name>/ and TLS from --etcd-cacert/--etcd-cert/--etcd-key.
func TestSettingsOwnerEtcdMaster(t *testing.T) {
	// A listener the remote masters' owners reach (loopback is refused with them).
	base := []string{"--dir", absentDir, "--peer-listen", "0.0.0.0:0"}
	for _, tt := range []struct {
		name, yaml string
		args       []string
		wantEtcd   *ha.Config // nil: a plain master address
		wantAddr   string
		wantErr    string
	}{
		{name: "plain address", args: []string{"--master", "10.0.0.1:7700"}, wantAddr: "10.0.0.1:7700"},
		{name: "default prefix", args: []string{"--master", "etcd://h1:2379,h2:2379"},
			wantEtcd: &ha.Config{Endpoints: []string{"h1:2379", "h2:2379"}, Prefix: "/fluxkv/fluxkv/"}},
		{name: "default prefix from --cluster-name", args: []string{"--master", "etcd://h1:2379", "--cluster-name", "prod"},
			wantEtcd: &ha.Config{Endpoints: []string{"h1:2379"}, Prefix: "/fluxkv/prod/"}},
		{name: "default prefix from the file's cluster name", yaml: "fluxkv_spec:\n  master: etcd://h1:2379\n  cluster_name: filed\n",
			wantEtcd: &ha.Config{Endpoints: []string{"h1:2379"}, Prefix: "/fluxkv/filed/"}},
		{name: "explicit prefix", args: []string{"--master", "etcd://h1:2379,h2:2379/team/a/", "--cluster-name", "prod"},
			wantEtcd: &ha.Config{Endpoints: []string{"h1:2379", "h2:2379"}, Prefix: "/team/a/"}},
		{name: "TLS from flags and file", yaml: "fluxkv_spec:\n  master: etcd://h1:2379\n  etcd_cacert: /file-ca.pem\n  etcd_cert: /file-c.pem\n  etcd_key: /file-k.pem\n",
			args: []string{"--etcd-cert", "/c.pem", "--etcd-key", "/k.pem"},
			wantEtcd: &ha.Config{Endpoints: []string{"h1:2379"}, Prefix: "/fluxkv/fluxkv/",
				TLS: ha.TLS{CACert: "/file-ca.pem", Cert: "/c.pem", Key: "/k.pem"}}},
		{name: "flag master address over the file's etcd", yaml: "fluxkv_spec:\n  master: etcd://h1:2379\n",
			args: []string{"--master", "10.0.0.1:7700"}, wantAddr: "10.0.0.1:7700"},

		{name: "TLS without etcd", args: []string{"--master", "10.0.0.1:7700", "--etcd-cacert", "/ca.pem"},
			wantErr: "--etcd-cacert needs --master etcd://HOST:PORT[,HOST:PORT...] (fluxkv_spec.master)"},
		{name: "file TLS without etcd", yaml: "fluxkv_spec:\n  master: 10.0.0.1:7700\n  etcd_key: /k.pem\n",
			wantErr: "fluxkv_spec.etcd_key (--etcd-key) needs --master etcd://"},
		{name: "cert without key", args: []string{"--master", "etcd://h1:2379", "--etcd-cert", "/c.pem"},
			wantErr: "--etcd-cert without --etcd-key (fluxkv_spec.etcd_key): give both the client certificate and its key, or neither"},
		{name: "bad etcd url flag", args: []string{"--master", "etcd://h1:2379/p"},
			wantErr: `--master: "etcd://h1:2379/p": etcd prefix "/p": must start and end with /`},
		{name: "etcd url without endpoints", args: []string{"--master", "etcd://"},
			wantErr: `--master: "etcd://": no etcd endpoints`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			oc, _, err := runSettings(t, "owner", tt.yaml, append(append([]string{}, base...), tt.args...)...)
			if tt.wantErr != "" {
				wantRefusal(t, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			d := ownerOptions(oc, oc.Master, nil, nil)
			if d.MasterAddr != tt.wantAddr {
				t.Errorf("MasterAddr %q, want %q", d.MasterAddr, tt.wantAddr)
			}
			switch {
			case tt.wantEtcd == nil && d.MasterEtcd != nil:
				t.Errorf("MasterEtcd %+v, want none", *d.MasterEtcd)
			case tt.wantEtcd != nil && (d.MasterEtcd == nil || !reflect.DeepEqual(*d.MasterEtcd, *tt.wantEtcd)):
				t.Errorf("MasterEtcd %+v, want %+v", d.MasterEtcd, *tt.wantEtcd)
			}
		})
	}
	// up's owner registers with the embedded master whatever the file says.
	if d := ownerOptions(config.Owner{ClusterName: "fluxkv"}, "127.0.0.1:5", nil, nil); d.MasterAddr != "127.0.0.1:5" || d.MasterEtcd != nil {
		t.Errorf("plain address: MasterAddr %q MasterEtcd %v", d.MasterAddr, d.MasterEtcd)
	}
}

// `fluxkv status` shows the masters: "masters" is always a JSON array, and the table
// lists them after the members with the leader as yes/no.
func TestStatusMasters(t *testing.T) {
	empty := statusOf(&external.StatResponse{Keys: 3})
	b, err := json.Marshal(empty)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"masters":[]`) || !strings.Contains(string(b), `"members":[]`) {
		t.Errorf("no masters: %s", b)
	}
	var buf bytes.Buffer
	printStatus(&buf, empty)
	if strings.Contains(buf.String(), "MASTER") {
		t.Errorf("table without masters shows a master section:\n%s", buf.String())
	}

	st := statusOf(&external.StatResponse{Keys: 7, MemoryValues: 5, MemoryDuplicateBytes: 3 << 20, Masters: []*common.MasterInfo{
		{Addr: "10.0.0.1:7700", Leader: true, Epoch: 4}, nil, {Addr: "10.0.0.2:7700"},
	}})
	b, err = json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	const want = `"masters":[{"addr":"10.0.0.1:7700","leader":true,"epoch":4},{"addr":"10.0.0.2:7700","leader":false,"epoch":0}],"keys":7,"memory_values":5,"memory_duplicate_bytes":3145728`
	if !strings.Contains(string(b), want) {
		t.Errorf("JSON %s\n  lacks %s", b, want)
	}
	buf.Reset()
	printStatus(&buf, st)
	out := buf.String()
	lines := strings.Split(out, "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "MASTER") })
	if i < 1 || len(lines) < i+4 {
		t.Fatalf("no master section after the members:\n%s", out)
	}
	if f := strings.Fields(lines[i]); !slices.Equal(f, []string{"MASTER", "LEADER", "EPOCH"}) {
		t.Errorf("header %q", lines[i])
	}
	if f := strings.Fields(lines[i+1]); !slices.Equal(f, []string{"10.0.0.1:7700", "yes", "4"}) {
		t.Errorf("leader row %q", lines[i+1])
	}
	if f := strings.Fields(lines[i+2]); !slices.Equal(f, []string{"10.0.0.2:7700", "no", "0"}) {
		t.Errorf("follower row %q", lines[i+2])
	}
	if lines[i+3] != "keys: 7 (in memory: 5, duplicate bytes: 3 MiB)" {
		t.Errorf("after the masters %q, want the key count", lines[i+3])
	}
}

// wantRefusal checks that err is a refusal containing want, with exit status 2.
func wantRefusal(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want one containing %q", err, want)
	}
	if ec, ok := err.(cli.ExitCoder); !ok || ec.ExitCode() != 2 {
		t.Errorf("error %v is not exit status 2", err)
	}
}

// Every setting of the tables is one the config file sets (its YAML key parses into
// the field the row merges), its flag's usage names the key, and a row with options
// sets them; every field of the sections is a row's or the file's alone.
func TestSettingTables(t *testing.T) {
	owner := map[string]string{
		"socket_dir": "/run/x", "dram": "64MiB", "node_id": "n", "cache_grace": "1s", "hot_set": "0.5", "uid_share": "0.25", "max_connections": "3",
		"hello_timeout": "1s", "frame_timeout": "1s", "idle_timeout": "1s", "allowed_uids": "[7]", "transfer_reserve": "1MiB", "landing_reserve": "32MiB",
		"client_isolation": "true", "prefault": "true", "huge_pages": "true", "put_area": "8MiB", "frame_memory": "128MiB", "put_area_total": "64MiB", "peer_listen": "127.0.0.1:1",
		"data_listen": "127.0.0.1:2", "advertise_host": "h", "cluster_name": "c", "instance_key": "i",
		"large_file_paths": "[/a]\n  large_limit_size: [1GiB]", "large_limit_size": "[1GiB]\n  large_file_paths: [/a]", "metrics_addr": "127.0.0.1:3",
		"master": "127.0.0.1:4", "etcd_cacert": "/ca", "etcd_cert": "/c", "etcd_key": "/k",
	}
	master := map[string]string{
		"listen": "127.0.0.1:1", "node_ttl": "9s", "heartbeat_interval": "2s", "inflight_ttl": "1m", "no_promotion": "true", "persist_workers": "8", "alloc_wait": "1s",
		"placement": "local", "ssd_admit": "put", "metrics_addr": "127.0.0.1:2", "etcd_endpoints": "[e:2379]", "advertise_addr": "10.0.0.1:1", "etcd_prefix": "/p/",
		"cluster_name": "c", "etcd_cacert": "/ca", "etcd_cert": "/c", "etcd_key": "/k", "leader_ttl": "3s",
	}
	ownerHas := checkTable(t, ownerTable(), config.RoleOwner, owner)
	ownerHas = append(ownerHas, checkTable(t, ownerMasterTable(), config.RoleOwner, owner)...)
	ownerHas = append(ownerHas, checkTable(t, ownerEtcdTable(), config.RoleOwner, owner)...)
	masterHas := checkTable(t, masterTable(), config.RoleMaster, master)
	masterHas = append(masterHas, checkTable(t, haTable(), config.RoleMaster, master)...)
	// Read from the file by cluster.go, masterkey.go and logging.go, with flags of their own.
	fileOnly := []string{"LogLevel", "LogFormat", "ClusterSecretFiles", "InsecureCluster", "MasterPubKeyFiles", "MasterKeyFile"}
	checkFields[config.Owner](t, ownerHas, fileOnly)
	checkFields[config.Master](t, masterHas, fileOnly)
}

// checkTable checks tbl's rows against the YAML samples (key: value under the
// section) and returns their has functions.
func checkTable[S, O any](t *testing.T, tbl *table[S, O], role config.Role, samples map[string]string) []func(*S) bool {
	t.Helper()
	flags := tbl.flags()
	var has []func(*S) bool
	for _, r := range tbl.rows {
		key := tbl.section + "." + r.key
		has = append(has, r.kind.has)
		if !r.common {
			if u := flags[0].(cli.DocGenerationFlag).GetUsage(); !strings.HasSuffix(u, " ["+key+"]") {
				t.Errorf("--%s: usage %q does not end with [%s]", r.flag.Names()[0], u, key)
			}
			flags = flags[1:]
		}
		v, ok := samples[r.key]
		if !ok {
			t.Errorf("%s: no sample value in the test", key)
			continue
		}
		f, err := config.Parse([]byte(tbl.section+":\n  "+r.key+": "+v+"\n"), role)
		if err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		file := reflect.ValueOf(f).Elem().FieldByName(map[string]string{config.OwnerSection: "Owner", config.MasterSection: "Master"}[tbl.section]).Interface().(*S)
		if !r.kind.has(file) {
			t.Errorf("%s: the file's value does not land in the row's field", key)
		}
		if r.set != nil {
			var o, zero O
			r.set(&o, file)
			if reflect.DeepEqual(o, zero) {
				t.Errorf("%s: sets no option", key)
			}
		}
	}
	return has
}

// checkFields checks that every field of S is some row's (has reports it once set)
// or one of fileOnly.
func checkFields[S any](t *testing.T, has []func(*S) bool, fileOnly []string) {
	t.Helper()
	typ := reflect.TypeFor[S]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		var s S
		v := reflect.ValueOf(&s).Elem().Field(i)
		switch v.Kind() {
		case reflect.String:
			v.SetString("x")
		case reflect.Int, reflect.Int64:
			v.SetInt(1)
		case reflect.Bool:
			v.SetBool(true)
		case reflect.Pointer:
			v.Set(reflect.New(f.Type.Elem()))
		case reflect.Slice:
			v.Set(reflect.MakeSlice(f.Type, 1, 1))
		default:
			t.Fatalf("%s.%s: kind %v", typ.Name(), f.Name, v.Kind())
		}
		n := 0
		for _, h := range has {
			if h(&s) {
				n++
			}
		}
		switch {
		case slices.Contains(fileOnly, f.Name) && n > 0:
			t.Errorf("%s.%s is a row's and listed as the file's alone", typ.Name(), f.Name)
		case !slices.Contains(fileOnly, f.Name) && n != 1:
			t.Errorf("%s.%s is the field of %d rows, want 1", typ.Name(), f.Name, n)
		}
	}
}

// An SSD path that is a file, or lies under one, is refused before anything starts
// (the SSD tier found it only when it opened, after the master had started: exit 1).
func TestSettingsSSDPathNotADirectory(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "afile")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ path, wantErr string }{
		{file, "ssd: large_file_paths[1] " + file + ": not a directory"},
		{filepath.Join(file, "sub", "ssd"), "ssd: large_file_paths[1] " + file + "/sub/ssd: " + file + " is not a directory"},
		{filepath.Join(dir, "new", "ssd"), ""}, // created at start
	} {
		oc, _, err := runSettings(t, "owner", "", "--master", "127.0.0.1:1", "--dir", absentDir,
			"--ssd-path", dir+","+tt.path, "--ssd-limit", "1MiB,1MiB")
		if err != nil {
			t.Fatal(err)
		}
		err = checkSSDSpace(oc)
		if tt.wantErr == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.path, err)
			}
			continue
		}
		wantRefusal(t, err, tt.wantErr)
	}
}

// A segment beyond the memory cgroup's limit (a container's, a unit's MemoryMax=) is
// refused at start: the owner faulting it in would be OOM-killed with no message
// (docs/kubernetes.md sizes the limit by hand: it used to be checked against MemTotal only).
func TestSettingsDRAMAboveCgroupLimit(t *testing.T) {
	write := func(path, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	v2, v1, none := t.TempDir(), t.TempDir(), t.TempDir()
	// v2: the pod's limit, under a container cgroup without one.
	write(filepath.Join(v2, "proc"), "0::/kubepods/pod1/c1\n")
	write(filepath.Join(v2, "kubepods", "memory.max"), "max\n")
	write(filepath.Join(v2, "kubepods", "pod1", "memory.max"), "67108864\n")
	write(filepath.Join(v2, "kubepods", "pod1", "c1", "memory.max"), "max\n")
	// v1: the memory hierarchy's file; its "unlimited" is a page below 2^63.
	write(filepath.Join(v1, "proc"), "4:memory:/system.slice/fluxkv-owner.service\n1:cpu,cpuacct:/\n0::/\n")
	write(filepath.Join(v1, "memory", "memory.limit_in_bytes"), "9223372036854771712\n")
	write(filepath.Join(v1, "memory", "system.slice", "fluxkv-owner.service", "memory.limit_in_bytes"), "33554432\n")
	write(filepath.Join(none, "proc"), "0::/\n")
	write(filepath.Join(none, "memory.max"), "max\n")
	saved := cgroupFiles
	t.Cleanup(func() { cgroupFiles = saved })
	for _, tt := range []struct {
		name, root string
		args       []string
		wantErr    string
	}{
		{"v2 pod limit", v2, []string{"--dram", "128MiB"}, "--dram 128 MiB exceeds this process's memory cgroup limit (64 MiB, /kubepods/pod1/memory.max)"},
		{"v2 with the landing reserve", v2, []string{"--dram", "32MiB", "--landing-reserve", "48MiB"},
			"--dram 32 MiB with the landing reserve of 48 MiB exceeds this process's memory cgroup limit (64 MiB"},
		{"v2 within", v2, []string{"--dram", "32MiB"}, ""},
		{"v1 unit limit", v1, []string{"--dram", "64MiB"}, "--dram 64 MiB exceeds this process's memory cgroup limit (32 MiB, /system.slice/fluxkv-owner.service/memory.limit_in_bytes)"},
		{"v1 within", v1, []string{"--dram", "16MiB"}, ""},
		{"no limit", none, []string{"--dram", "128MiB"}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cgroupFiles.proc, cgroupFiles.root = filepath.Join(tt.root, "proc"), tt.root
			_, _, err := runSettings(t, "up", "", tt.args...)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantRefusal(t, err, tt.wantErr)
		})
	}
}

// `fluxkv up --help` gives up's own default of --transfer-reserve: none (one owner places
// every put on itself), not the owner's min(dram/8, 256MiB).
func TestUpHelpTransferReserveDefault(t *testing.T) {
	for _, tt := range []struct {
		cmd  *cli.Command
		want string
	}{{upCommand(), "0 (none: one owner holds every put)"}, {ownerCommand(), "min(dram/8, 256MiB)"}} {
		for _, f := range tt.cmd.Flags {
			if f.Names()[0] != "transfer-reserve" {
				continue
			}
			if got := f.(*cli.StringFlag).DefaultText; got != tt.want {
				t.Errorf("fluxkv %s: --transfer-reserve default %q, want %q", tt.cmd.Name, got, tt.want)
			}
		}
	}
}

// TestShortInflightTTLLowersTheAllocWait: left out, --alloc-wait stays under the oldest
// plan an owner carries out (a sixth of a short --inflight-ttl), where the default 5s
// would have every plan of a batch that waited for room made again (a review).
func TestShortInflightTTLLowersTheAllocWait(t *testing.T) {
	for _, tt := range []struct {
		ttl  string
		want time.Duration
	}{{"24s", 2 * time.Second}, {"600ms", 50 * time.Millisecond}, {"1m", 0}} {
		_, mc, err := runSettings(t, "master", "", "--insecure-cluster", "--inflight-ttl", tt.ttl)
		if err != nil {
			t.Fatal(err)
		}
		if mc.AllocWait != tt.want {
			t.Errorf("--inflight-ttl %s: alloc wait %v, want %v (0: the master's default 5s)", tt.ttl, mc.AllocWait, tt.want)
		}
	}
}

// TestSocketDirOfAnotherUserRefused: a --dir owned by another user than this process's
// or root is refused with the settings (exit status 2), as `up` refused it already; the
// owner found it only at its start, with exit status 1, which systemd restarts forever
// (a review).
func TestSocketDirOfAnotherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to hand a directory to another user")
	}
	dir := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"owner", "up"} {
		args := []string{"--dir", dir, "--insecure-cluster"}
		if cmd == "owner" {
			args = append(args, "--master", "127.0.0.1:1")
		}
		_, _, err := runSettings(t, cmd, "", args...)
		var ec cli.ExitCoder
		if !errors.As(err, &ec) || ec.ExitCode() != 2 || !strings.Contains(err.Error(), "is owned by uid 65534") {
			t.Errorf("%s --dir %s (uid 65534): %v, want exit status 2 naming the owner", cmd, dir, err)
		}
	}
}
