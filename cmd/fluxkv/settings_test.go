package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
)

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
  peer_listen: 127.0.0.1:7701
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
				PeerListen: "127.0.0.1:7701", MetricsAddr: "127.0.0.1:9701", ClusterName: "file-cluster", InstanceKey: "file-node",
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
			name: "owner: no file, defaults", command: "owner", args: []string{"--master", "127.0.0.1:1", "--dir", "/tmp/x"},
			wantOwner: &config.Owner{DRAM: 1 << 30, SocketDir: "/tmp/x", Master: "127.0.0.1:1", PeerListen: "127.0.0.1:0",
				ClusterName: "fluxkv", InstanceKey: host},
		},
		{
			name: "owner: flags turn the SSD on", command: "owner",
			args: []string{"--master", "127.0.0.1:1", "--dir", "/tmp/x", "--large-file-paths", "/d1", "--large-file-paths", "/d2", "--large-limit-size", "512,1.5KiB"},
			wantOwner: &config.Owner{DRAM: 1 << 30, SocketDir: "/tmp/x", Master: "127.0.0.1:1", PeerListen: "127.0.0.1:0",
				ClusterName: "fluxkv", InstanceKey: host, LargeFilePaths: []string{"/d1", "/d2"}, LargeLimitSize: []int64{512, 1536}},
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
			wantMaster: &config.Master{Listen: "127.0.0.1:7700", NodeTTL: 9 * time.Second, InflightTTL: 2 * time.Minute, MetricsAddr: "127.0.0.1:9700"},
		},
		{
			name: "master: flags win", command: "master", yaml: masterYAML,
			args:       []string{"--listen", ":7800", "--node-ttl", "3s", "--heartbeat-interval", "500ms", "--metrics-addr", ":9800"},
			wantMaster: &config.Master{Listen: ":7800", NodeTTL: 3 * time.Second, HeartbeatInterval: 500 * time.Millisecond, InflightTTL: 2 * time.Minute, MetricsAddr: ":9800"},
		},
		{
			name: "master: alias flag wins too", command: "master", yaml: masterYAML, args: []string{"--master-listen", ":7900"},
			wantMaster: &config.Master{Listen: ":7900", NodeTTL: 9 * time.Second, InflightTTL: 2 * time.Minute, MetricsAddr: "127.0.0.1:9700"},
		},
		{
			name: "master: defaults", command: "master",
			wantMaster: &config.Master{Listen: "127.0.0.1:7700", NodeTTL: 5 * time.Second},
		},
		{name: "master: owner section refused", command: "master", yaml: ownerYAML, wantErr: "fluxkv_spec: not read by `fluxkv master`"},
		{
			name: "up: both sections, flags win", command: "up",
			yaml: "fluxkv_spec:\n  dram: 64MiB\n  socket_dir: /tmp/up\nmaster:\n  node_ttl: 7s\n  listen: 127.0.0.1:7777\n",
			args: []string{"--listen", "127.0.0.1:0"},
			wantOwner: &config.Owner{DRAM: 64 << 20, SocketDir: "/tmp/up", PeerListen: "127.0.0.1:0", ClusterName: "fluxkv",
				InstanceKey: host},
			wantMaster: &config.Master{Listen: "127.0.0.1:0", NodeTTL: 7 * time.Second},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			oc, mc, err := runSettings(t, tt.command, tt.yaml, tt.args...)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				if ec, ok := err.(cli.ExitCoder); !ok || ec.ExitCode() != 2 {
					t.Errorf("error %v is not exit status 2", err)
				}
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
