package main

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/protocol/auth"
)

// These tests run the real binary as a service would: `up`, `master` and `owner`
// with --config files, scraping /metrics over HTTP and stopping with SIGTERM.

// Timing budgets of these tests: generous deadlines on a condition, never an expected
// speed (proctest says why).
const (
	startBudget = proctest.StartBudget // a process to log a line or open its socket
	stopBudget  = proctest.StopBudget  // SIGTERM to the exit
)

// fluxkvBin is $FLUXKV_BIN (`make test` points it at bin/fluxkv-race), or this
// package built once into a temporary directory, with -race when this test binary
// has it.
func fluxkvBin(t *testing.T) string {
	t.Helper()
	bin, err := proctest.Binary(raceEnabled)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	proctest.RemoveBuilt()
	os.Exit(code)
}

// service is a running fluxkv process whose JSON log lines the test reads.
type service struct {
	t *testing.T
	p *proctest.Proc

	mu    sync.Mutex       // protects lines
	lines []map[string]any // the log's JSON lines, in order
}

// startService runs fluxkv with JSON debug logs. When the test ends, a process still
// running is killed, and a race in it fails the test whatever else the test checked.
func startService(t *testing.T, args ...string) *service {
	t.Helper()
	s := &service{t: t}
	p, err := proctest.Start(proctest.Options{
		Name: "fluxkv " + strings.Join(args, " "),
		Args: append([]string{fluxkvBin(t), "--log-format", "json", "--log-level", "debug"}, args...),
		Env:  []string{proctest.RaceEnv},
		OnLogLine: func(line []byte) {
			var m map[string]any
			if json.Unmarshal(line, &m) == nil && m != nil {
				s.mu.Lock()
				s.lines = append(s.lines, m)
				s.mu.Unlock()
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.p = p
	t.Cleanup(func() {
		p.Kill()
		if msg := p.RaceFailure(); msg != "" {
			t.Error(msg)
		}
	})
	return s
}

// log is everything the process has written to stderr and stdout so far.
func (s *service) log() string { return s.p.Log() }

// waitLog returns the first log line with message msg (and its index), waiting for it.
func (s *service) waitLog(msg string) (map[string]any, int) {
	s.t.Helper()
	var line map[string]any
	at := -1
	err := s.p.WaitFor(startBudget, fmt.Sprintf("%q in the log", msg), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, l := range s.lines {
			if l["message"] == msg {
				line, at = l, i
				return true
			}
		}
		return false
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return line, at
}

// metricsAddr is the address the process logged for its /metrics server.
func (s *service) metricsAddr() string {
	s.t.Helper()
	l, _ := s.waitLog("metrics serving on /metrics")
	addr, _ := l["addr"].(string)
	if addr == "" {
		s.t.Fatalf("metrics log line without addr: %v", l)
	}
	return addr
}

// wait waits up to timeout for the process to exit and returns its exit status; a
// race found by a -race child fails the test here, whatever status was expected.
func (s *service) wait(timeout time.Duration) int {
	s.t.Helper()
	select {
	case <-s.p.Done():
	case <-time.After(timeout):
		s.p.Kill()
		s.t.Fatalf("fluxkv did not exit within %v:\n%s", timeout, s.log())
	}
	if msg := s.p.RaceFailure(); msg != "" {
		s.t.Fatal(msg)
	}
	var ee *exec.ExitError
	if err := s.p.Err(); err != nil && !errors.As(err, &ee) {
		s.t.Fatalf("wait: %v", err)
	}
	return s.p.ExitCode()
}

// stop sends SIGTERM and requires exit status 0 within stopBudget with no socket left.
func (s *service) stop(socket string) {
	s.t.Helper()
	t0 := time.Now()
	if err := s.p.Stop(stopBudget); err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("stopped %v after SIGTERM", time.Since(t0).Round(time.Millisecond))
	if socket != "" {
		for _, p := range []string{socket, socket + ".rpc"} {
			if _, err := os.Lstat(p); err == nil {
				s.t.Errorf("%s left behind after SIGTERM", p)
			}
		}
	}
}

func waitSocket(t *testing.T, s *service, socket string) {
	t.Helper()
	if err := s.p.WaitFor(startBudget, "socket "+socket+" to accept", func() bool { return proctest.Accepts("unix", socket) }); err != nil {
		t.Fatal(err)
	}
}

// freePort is a loopback address with a port free right now.
func freePort(t *testing.T) string {
	t.Helper()
	addr, err := proctest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// scrape fetches /metrics and returns every sample as "name{l1=v1,...}" → value,
// labels sorted by name as the exposition format sorts them.
func scrapeMetrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape: %s\n%s", resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			key := name
			if len(ls) > 0 {
				key += "{" + strings.Join(ls, ",") + "}"
			}
			switch {
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Histogram != nil:
				out[key+"_count"] = float64(m.Histogram.GetSampleCount())
			case m.Untyped != nil:
				out[key] = m.Untyped.GetValue()
			}
		}
	}
	return out
}

// waitMetric scrapes until the sample name reaches at least want (a deadline, not an
// expected speed) and returns that scrape.
func waitMetric(t *testing.T, addr, name string, want float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(startBudget)
	for {
		got := scrapeMetrics(t, addr)
		if got[name] >= want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v after %v, want ≥ %v", name, got[name], startBudget, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitCapacity is the first scrape with the capacity gauges: the owner reports them
// from the end of its start, a moment after its socket appears.
func waitCapacity(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	return waitMetric(t, addr, "kvcache_segment_capacity_bytes", 1)
}

// sumOps adds fluxkv_ops_total over every op with the given result.
func sumOps(samples map[string]float64, result string) float64 {
	var n float64
	for k, v := range samples {
		if strings.HasPrefix(k, "fluxkv_ops_total{") && strings.Contains(k, "result="+result+"}") {
			n += v
		}
	}
	return n
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// `up --config`: metrics are served before the socket appears, reflect the YAML's
// DRAM size, count puts and gets by result; SIGTERM stops it cleanly.
func TestUpConfigMetrics(t *testing.T) {
	dir := t.TempDir()
	sockDir := filepath.Join(dir, "run")
	cfg := writeFile(t, dir, "up.yaml", fmt.Sprintf(`
fluxkv_spec:
  dram: 48MiB
  socket_dir: %s
  metrics_addr: 127.0.0.1:0
  node_id: it-node
master:
  listen: 127.0.0.1:0
  node_ttl: 5s
`, sockDir))
	s := startService(t, "up", "--config", cfg)
	socket := filepath.Join(sockDir, "fluxkv.sock")
	waitSocket(t, s, socket)
	addr := s.metricsAddr()
	_, metricsAt := s.waitLog("metrics serving on /metrics")
	_, ownerAt := s.waitLog("owner started")
	if metricsAt > ownerAt {
		t.Errorf("metrics server started after the owner (log lines %d > %d)", metricsAt, ownerAt)
	}
	if reg, _ := s.waitLog("registered with master"); reg["master_link"] != "in-process" {
		t.Errorf("up's owner registered over %v, want its embedded master in-process: %v", reg["master_link"], reg)
	}

	got := waitCapacity(t, addr)
	if v := got["kvcache_segment_capacity_bytes"]; v != 48<<20 {
		t.Errorf("kvcache_segment_capacity_bytes = %v, want %d (fluxkv_spec.dram)", v, 48<<20)
	}
	for _, name := range []string{"kvcache_segment_used_bytes", "kv_ssd_capacity_bytes", "kv_ssd_used_bytes", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := got[name]; !ok {
			t.Errorf("%s missing from /metrics", name)
		}
	}

	c, err := fluxkv.Connect(fluxkv.Options{Socket: socket, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	value := make([]byte, 1<<20)
	for i := 0; i < 3; i++ {
		if err := c.Put(fmt.Sprintf("k%d", i), value); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		h, err := c.Get(fmt.Sprintf("k%d", i))
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	if _, err := c.Get("absent"); !errors.Is(err, fluxkv.ErrKeyNotFound) {
		t.Fatalf("get absent: %v, want ErrKeyNotFound", err)
	}
	c.Flush()

	// Capacity readings are cached for a second: wait for one taken after the puts.
	got = waitMetric(t, addr, "kvcache_segment_used_bytes", 3<<20)
	if n := sumOps(got, "ok"); n < 3 {
		t.Errorf("fluxkv_ops_total{result=ok} = %v after 3 puts, want ≥ 3", n)
	}
	if n := sumOps(got, "hit_memory"); n < 3 {
		t.Errorf("fluxkv_ops_total{result=hit_memory} = %v after 3 gets, want ≥ 3", n)
	}
	if n := sumOps(got, "miss"); n < 1 {
		t.Errorf("fluxkv_ops_total{result=miss} = %v after a miss, want ≥ 1", n)
	}
	if t.Failed() {
		t.Logf("scrape:\n%v", got)
	}
	c.Close()

	s.stop(socket)
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Error("/metrics still served after SIGTERM")
	}
}

// A separate master and owner, each from its example-style config file.
func TestMasterOwnerConfigs(t *testing.T) {
	dir := t.TempDir()
	masterAddr := freePort(t)
	secret := filepath.Join(dir, "cluster.secret")
	if err := auth.GenerateSecretFile(secret); err != nil {
		t.Fatal(err)
	}
	key, pub := filepath.Join(dir, "master.key"), filepath.Join(dir, "master.pub")
	if err := auth.GenerateMasterKeyFiles(key, pub); err != nil {
		t.Fatal(err)
	}
	mcfg := writeFile(t, dir, "master.yaml", fmt.Sprintf("master:\n  listen: %s\n  node_ttl: 3s\n  metrics_addr: 127.0.0.1:0\n  cluster_secret_files: [%s]\n  master_key_file: %s\n",
		masterAddr, secret, key))
	sockDir := filepath.Join(dir, "run")
	ocfg := writeFile(t, dir, "owner.yaml", fmt.Sprintf(`
fluxkv_spec:
  dram: 16MiB
  transfer_reserve: 4MiB
  socket_dir: %s
  master: %s
  node_id: owner-a
  metrics_addr: 127.0.0.1:0
  log_level: info
  cluster_secret_files: [%s]
  master_pubkey_files: [%s]
`, sockDir, masterAddr, secret, pub))

	m := startService(t, "master", "--config", mcfg)
	m.waitLog("master started")
	maddr := m.metricsAddr()
	o := startService(t, "owner", "--config", ocfg)
	socket := filepath.Join(sockDir, "fluxkv.sock")
	waitSocket(t, o, socket)
	oaddr := o.metricsAddr()
	if reg, _ := o.waitLog("registered with master"); reg["master_link"] != "tcp" {
		t.Errorf("a separate owner registered over %v, want tcp: %v", reg["master_link"], reg)
	}

	// The memory pool: the segment less the transfer area.
	if got := waitCapacity(t, oaddr); got["kvcache_segment_capacity_bytes"] != 12<<20 {
		t.Errorf("owner kvcache_segment_capacity_bytes = %v, want %d (dram 16MiB less transfer_reserve 4MiB)", got["kvcache_segment_capacity_bytes"], 12<<20)
	}
	if got := scrapeMetrics(t, maddr); got["go_goroutines"] == 0 {
		t.Errorf("master /metrics lacks go_goroutines")
	}
	// The file's log_level (info) applies to the owner only where --log-level was not
	// given; startService passes --log-level debug, which wins.
	if !strings.Contains(o.log(), `"level":"debug"`) {
		t.Errorf("owner logged no debug line: the --log-level flag should override log_level: info")
	}
	o.stop(socket)
	m.stop("")
}

// Bad configs stop the service at start with exit status 2 and a message that
// names the key; nothing is left behind.
func TestConfigErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	sockDir := filepath.Join(dir, "run")
	for _, tt := range []struct {
		name, command, yaml, want string
	}{
		{"bad size", "up", "fluxkv_spec:\n  dram: 12XB\n  socket_dir: " + sockDir + "\n", `fluxkv_spec.dram: invalid size "12XB"`},
		{"unknown key", "up", "fluxkv_spec:\n  socket_dir: " + sockDir + "\n  dram_size: 1GiB\n", "fluxkv_spec.dram_size: unknown key"},
		{"mismatched lengths", "owner", "fluxkv_spec:\n  master: 127.0.0.1:1\n  large_file_paths: [/a, /b]\n  large_limit_size: [1GiB]\n",
			"fluxkv_spec.large_limit_size has 1 entries but large_file_paths has 2"},
		{"no master", "owner", "fluxkv_spec:\n  socket_dir: " + sockDir + "\n", "the master's address is required"},
		{"master reads no owner section", "master", "fluxkv_spec:\n  dram: 1GiB\n", "fluxkv_spec: not read by `fluxkv master`"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := writeFile(t, dir, strings.ReplaceAll(tt.name, " ", "_")+".yaml", tt.yaml)
			s := startService(t, tt.command, "--config", cfg)
			if code := s.wait(startBudget); code != 2 {
				t.Errorf("exit status %d, want 2:\n%s", code, s.log())
			}
			if !strings.Contains(s.log(), tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, s.log())
			}
			if _, err := os.Stat(filepath.Join(sockDir, "fluxkv.sock")); err == nil {
				t.Errorf("socket created by a failed start")
			}
		})
	}
}

// A refused command goes through main's own error handling, not urfave/cli's exit: its
// message carries the "fluxkv:" prefix, the exit status is the refusal's, and the
// --cpu-profile the app started is written (a complete, gzipped pprof file).
func TestRefusalPrefixAndProfile(t *testing.T) {
	dir := t.TempDir()
	prof := filepath.Join(dir, "cpu.pprof")
	cmd := exec.Command(fluxkvBin(t), "--cpu-profile", prof, "up", "--dir", filepath.Join(dir, "run"), "--dram", "12XB")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Errorf("exit: %v, want status 2\n%s", err, stderr.String())
	}
	if want := `fluxkv: --dram: size "12XB"`; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
	}
	b, err := os.ReadFile(prof)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) { // pprof's profiles are gzipped
		t.Errorf("--cpu-profile %s: %d bytes, not a written profile", prof, len(b))
	}
}

// supportsDirectIO reports whether files in dir can be opened with O_DIRECT (the SSD
// cache's shard files need it; tmpfs does not support it).
func supportsDirectIO(dir string) error {
	p := filepath.Join(dir, ".odirect-probe")
	fd, err := syscall.Open(p, syscall.O_CREAT|syscall.O_RDWR|syscall.O_DIRECT, 0o600)
	if err != nil {
		return err
	}
	syscall.Close(fd)
	return os.Remove(p)
}

// `up --config` with an SSD cache: /metrics shows the YAML's large_limit_size as
// kv_ssd_capacity_bytes, and puts persisted to SSD as kv_ssd_used_bytes.
func TestUpConfigSSDCapacity(t *testing.T) {
	dir := t.TempDir()
	ssdDir := filepath.Join(dir, "ssd0")
	if err := os.MkdirAll(ssdDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := supportsDirectIO(ssdDir); err != nil {
		t.Skipf("%s does not support O_DIRECT, which the SSD cache needs (%v); run where TMPDIR is on a disk", ssdDir, err)
	}
	sockDir := filepath.Join(dir, "run")
	cfg := writeFile(t, dir, "up.yaml", fmt.Sprintf(`
fluxkv_spec:
  dram: 32MiB
  socket_dir: %s
  metrics_addr: 127.0.0.1:0
  large_file_paths: [%s]
  large_limit_size: ["64MiB"]
  cluster_name: it
  instance_key: it-node
`, sockDir, ssdDir))
	s := startService(t, "up", "--config", cfg)
	socket := filepath.Join(sockDir, "fluxkv.sock")
	waitSocket(t, s, socket)
	addr := s.metricsAddr()

	got := waitCapacity(t, addr)
	if v := got["kv_ssd_capacity_bytes"]; v != 64<<20 {
		t.Errorf("kv_ssd_capacity_bytes = %v, want %d (large_limit_size)", v, 64<<20)
	}
	if v := got["kvcache_segment_capacity_bytes"]; v != 32<<20 {
		t.Errorf("kvcache_segment_capacity_bytes = %v, want %d (dram)", v, 32<<20)
	}
	if _, err := os.Stat(filepath.Join(ssdDir, "it_cluster_kv_ssd_storage", "it-node")); err != nil {
		t.Errorf("SSD cache root from cluster_name/instance_key: %v", err)
	}

	c, err := fluxkv.Connect(fluxkv.Options{Socket: socket, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	value := make([]byte, 1<<20)
	for i := 0; i < 3; i++ {
		if err := c.Put(fmt.Sprintf("k%d", i), value); err != nil {
			t.Fatal(err)
		}
	}
	// Persists run after each put returns; the capacity reading is cached for a second.
	waitMetric(t, addr, "kv_ssd_used_bytes", 3<<20)
	c.Close()
	s.stop(socket)
}

// Flag values that would silently mean something else stop the real binary at start:
// exit status 2, a message naming the flag, no socket.
func TestFlagRefusalsExit2(t *testing.T) {
	mem, err := memTotal()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	sockDir := filepath.Join(dir, "run")
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"ssd path without limit", []string{"--ssd-path", filepath.Join(dir, "ssd")}, "--ssd-path (--large-file-paths) needs --ssd-limit"},
		{"ssd limit beyond the file system", []string{"--ssd-path", filepath.Join(dir, "ssd"), "--ssd-limit", "1024PiB"},
			"large_file_paths[0] " + filepath.Join(dir, "ssd") + ": cannot reserve 1EiB (large_limit_size / --ssd-limit, 1152921504606846976 bytes)"},
		{"dram above memory", []string{"--dram", strconv.FormatInt(mem+1, 10)}, "exceeds this machine's memory"},
		{"negative cache grace", []string{"--cache-grace", "-1s"}, "--cache-grace: -1s must be ≥ 0"},
		{"negative max connections", []string{"--max-connections", "-3"}, "--max-connections must be ≥ 0, got -3"},
		// Found only when the tier opened, exit status 1 after the master started: a
		// service manager restarted the owner for good.
		{"ssd path where no file can be made", []string{"--ssd-path", "/proc/fluxkv-ssd", "--ssd-limit", "64MiB"},
			"ssd path /proc/fluxkv-ssd: probe O_DIRECT in /proc"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startService(t, append([]string{"up", "--dir", sockDir}, tt.args...)...)
			if code := s.wait(startBudget); code != 2 {
				t.Errorf("exit status %d, want 2:\n%s", code, s.log())
			}
			if !strings.Contains(s.log(), tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, s.log())
			}
			if _, err := os.Stat(filepath.Join(sockDir, "fluxkv.sock")); err == nil {
				t.Errorf("socket created by a refused start")
			}
		})
	}
}

// An SSD path on a file system that refuses O_DIRECT (ramfs, here; tmpfs before Linux
// 6.6) is refused at start, exit status 2: found when the tier opened, the owner exited 1
// after its master started and a service manager restarted it for good (a review).
func TestSSDPathWithoutDirectIOExit2(t *testing.T) {
	dir := t.TempDir()
	ram := filepath.Join(dir, "ramfs")
	if err := os.Mkdir(ram, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("ramfs", ram, "ramfs", 0, ""); err != nil {
		t.Skipf("cannot mount a ramfs (not root?): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(ram, unix.MNT_DETACH) })
	sockDir := filepath.Join(dir, "run")
	s := startService(t, "up", "--dir", sockDir, "--ssd-path", filepath.Join(ram, "ssd"), "--ssd-limit", "16MiB")
	if code := s.wait(startBudget); code != 2 {
		t.Errorf("exit status %d, want 2:\n%s", code, s.log())
	}
	if want := "does not support O_DIRECT"; !strings.Contains(s.log(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, s.log())
	}
	if _, err := os.Stat(filepath.Join(sockDir, "fluxkv.sock")); err == nil {
		t.Errorf("socket created by a refused start")
	}
}

// An SSD limit the file system has room for but that only opening the SSD tier finds
// too large (here: a shard file beyond RLIMIT_FSIZE) is refused like the rest: exit
// status 2, a message naming the flag, the path and the size, no socket.
func TestSSDLimitRefusedAtOpenExit2(t *testing.T) {
	dir := t.TempDir()
	ssdDir := filepath.Join(dir, "ssd")
	if err := os.MkdirAll(ssdDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := supportsDirectIO(ssdDir); err != nil {
		t.Skipf("no O_DIRECT in %s: %v", ssdDir, err)
	}
	sockDir := filepath.Join(dir, "run")
	// ulimit -f counts 1 KiB blocks: files up to 64 MiB (the 16 MiB segment's memfd fits).
	cmd := exec.Command("sh", "-c", `ulimit -f 65536 && exec "$0" "$@"`, fluxkvBin(t), "up", "--dir", sockDir, "--dram", "16MiB",
		"--ssd-path", ssdDir, "--ssd-limit", "128MiB")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v, want status 2:\n%s", err, out)
	}
	for _, want := range []string{"large_file_paths[0] " + ssdDir + ":", "cannot reserve 128MiB (large_limit_size / --ssd-limit)", "file too large"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(sockDir, "fluxkv.sock")); err == nil {
		t.Errorf("socket created by a refused start")
	}
}

// `--dram 4097` maps an 8192-byte segment: the start log gives both sizes in exact
// bytes and the segment for people as "8 KiB", and `fluxkv status` shows 8 KiB.
func TestDRAMRoundedSizes(t *testing.T) {
	dir := t.TempDir()
	s := startService(t, "up", "--dir", dir, "--dram", "4097", "--metrics-addr", "127.0.0.1:0", "--max-connections", "32")
	socket := filepath.Join(dir, "fluxkv.sock")
	waitSocket(t, s, socket)
	l, _ := s.waitLog("owner started")
	if l["segment_bytes"] != float64(8192) || l["dram_requested_bytes"] != float64(4097) || l["segment"] != "8 KiB" {
		t.Errorf("owner started: segment_bytes=%v dram_requested_bytes=%v segment=%v, want 8192, 4097, \"8 KiB\"",
			l["segment_bytes"], l["dram_requested_bytes"], l["segment"])
	}
	if got := waitCapacity(t, s.metricsAddr()); got["kvcache_segment_capacity_bytes"] != 8192 {
		t.Errorf("kvcache_segment_capacity_bytes = %v, want 8192", got["kvcache_segment_capacity_bytes"])
	}
	out, err := exec.Command(fluxkvBin(t), "status", "--socket", socket).CombinedOutput()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "8 KiB") || strings.Contains(string(out), "4 KiB") {
		t.Errorf("status does not show the 8 KiB segment:\n%s", out)
	}
	var st statusJSON
	out, err = exec.Command(fluxkvBin(t), "status", "--json", "--socket", socket).Output()
	if err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if err := json.Unmarshal(out, &st); err != nil || len(st.Members) != 1 || st.Members[0].MemorySegment.CapacityBytes != 8192 {
		t.Errorf("status --json: %v %+v, want one member with capacity_bytes 8192", err, st)
	}
	s.stop(socket)
}

// Under -race, the process tests run a -race fluxkv too (`make test` passes
// bin/fluxkv-race as FLUXKV_BIN): otherwise the owner's concurrency goes unchecked.
func TestBinaryIsRaceBuild(t *testing.T) {
	if !raceEnabled {
		t.Skip("this test binary is not built with -race")
	}
	info, err := buildinfo.ReadFile(fluxkvBin(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range info.Settings {
		if s.Key == "-race" && s.Value == "true" {
			return
		}
	}
	t.Errorf("%s is not built with -race: point FLUXKV_BIN at bin/fluxkv-race (make test builds it)", fluxkvBin(t))
}

// Cluster secrets at start: master and owner refuse to run without one (or with a
// missing or other-readable file) with exit status 2; an owner whose secret the
// master does not accept fails its start with a message that says so.
func TestClusterSecretStart(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.secret")
	other := filepath.Join(dir, "other.secret")
	for _, p := range []string{good, other} {
		if err := auth.GenerateSecretFile(p); err != nil {
			t.Fatal(err)
		}
	}
	open := writeFile(t, dir, "open.secret", strings.Repeat("k", 40))
	os.Chmod(open, 0o644)
	key, pub := filepath.Join(dir, "master.key"), filepath.Join(dir, "master.pub")
	if err := auth.GenerateMasterKeyFiles(key, pub); err != nil {
		t.Fatal(err)
	}
	openKey := filepath.Join(dir, "open.key")
	if err := auth.GenerateMasterKeyFiles(openKey, filepath.Join(dir, "open.pub")); err != nil {
		t.Fatal(err)
	}
	os.Chmod(openKey, 0o644)
	sockDir := filepath.Join(dir, "run")
	owner := []string{"owner", "--dir", sockDir, "--master", "127.0.0.1:1"}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"master without a secret", []string{"master", "--listen", "127.0.0.1:0"}, "or --insecure-cluster to run without authentication"},
		{"owner without a secret", owner, "fluxkv owner: no cluster secret: give --cluster-secret-file PATH"},
		{"missing file", []string{"master", "--listen", "127.0.0.1:0", "--cluster-secret-file", filepath.Join(dir, "nope")}, "does not exist"},
		{"other-readable file", append(owner, "--cluster-secret-file", open), "is readable by others (mode 0644)"},
		{"master without a master key", []string{"master", "--listen", "127.0.0.1:0", "--cluster-secret-file", good},
			"fluxkv master: no master key: give --master-key-file PATH"},
		{"owner without a master public key", append(owner, "--cluster-secret-file", good),
			"fluxkv owner: no master public key: give --master-pubkey-file PATH"},
		{"other-readable master key", []string{"master", "--listen", "127.0.0.1:0", "--cluster-secret-file", good, "--master-key-file", openKey},
			"master key file " + openKey + " is readable by others (mode 0644)"},
		{"public key as the master key", []string{"master", "--listen", "127.0.0.1:0", "--cluster-secret-file", good, "--master-key-file", pub},
			"is readable by others (mode 0644)"}, // a public key is world-readable: refused before it is parsed
		{"insecure with a master key", []string{"master", "--listen", "127.0.0.1:0", "--insecure-cluster", "--master-key-file", key},
			"--master-key-file and --insecure-cluster contradict each other"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startService(t, tt.args...)
			if code := s.wait(startBudget); code != 2 {
				t.Errorf("exit status %d, want 2:\n%s", code, s.log())
			}
			if !strings.Contains(s.log(), tt.want) {
				t.Errorf("stderr lacks %q:\n%s", tt.want, s.log())
			}
		})
	}

	t.Run("wrong secret", func(t *testing.T) {
		addr := freePort(t)
		m := startService(t, "master", "--listen", addr, "--cluster-secret-file", good, "--master-key-file", key)
		m.waitLog("master started")
		o := startService(t, "owner", "--dir", sockDir, "--master", addr, "--cluster-secret-file", other, "--master-pubkey-file", pub)
		if code := o.wait(startBudget); code == 0 {
			t.Errorf("owner with the wrong secret exited 0")
		}
		if want := "cluster authentication failed: wrong secret"; !strings.Contains(o.log(), want) {
			t.Errorf("owner stderr lacks %q:\n%s", want, o.log())
		}
		if !strings.Contains(m.log(), "cluster authentication failed; connection closed") {
			t.Errorf("master did not log the refusal:\n%s", m.log())
		}
		m.stop("")
	})
}

// `fluxkv put KEY FILE` reads a FILE that is not a regular file (a FIFO, a shell's
// <(command)) to its end, as it reads standard input: its size is no length (it
// used to put the 0 bytes stat gives a pipe: "value length 0: must be at least 1 byte").
func TestPutFromPipe(t *testing.T) {
	dir := t.TempDir()
	s := startService(t, "up", "--dir", dir, "--dram", "16MiB", "--prefault=false")
	socket := filepath.Join(dir, "fluxkv.sock")
	waitSocket(t, s, socket)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	const value = "from a pipe\n"
	wrote := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // until put opens it
		if err == nil {
			_, err = f.WriteString(value)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		wrote <- err
	}()
	if out, err := exec.Command(fluxkvBin(t), "put", "--socket", socket, "piped", fifo).CombinedOutput(); err != nil {
		// Open the FIFO so the writer ends whatever put did.
		if f, ferr := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); ferr == nil {
			f.Close()
		}
		t.Fatalf("put from a FIFO: %v\n%s", err, out)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(fluxkvBin(t), "get", "--socket", socket, "piped").Output()
	if err != nil || string(out) != value {
		t.Errorf("get: %q, %v; want %q", out, err, value)
	}
	// A /proc file is regular with a size of 0: read to its end as a pipe (it was
	// refused: "value length 0").
	if out, err := exec.Command(fluxkvBin(t), "put", "--socket", socket, "proc", "/proc/self/status").CombinedOutput(); err != nil {
		t.Fatalf("put from /proc/self/status: %v\n%s", err, out)
	}
	out, err = exec.Command(fluxkvBin(t), "get", "--socket", socket, "proc").Output()
	if err != nil || !strings.HasPrefix(string(out), "Name:") {
		t.Errorf("get of a /proc file put: %q, %v", out, err)
	}
	s.stop(socket)
}

// A regular file's fill reads it from its start at every run: the client runs fill again
// when it redoes a put whose outcome became unknown, and a second run that read on from
// the first's end failed with a bare EOF after the first had published the value.
func TestFileFillRunsTwice(t *testing.T) {
	p := filepath.Join(t.TempDir(), "v")
	want := []byte("0123456789abcdef")
	if err := os.WriteFile(p, want, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fill := fileFill(f, p)
	for run := range 2 {
		dst := make([]byte, len(want))
		if err := fill(dst); err != nil || string(dst) != string(want) {
			t.Fatalf("run %d: %q, %v", run, dst, err)
		}
	}
	if err := fill(make([]byte, len(want)+1)); !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), p) {
		t.Fatalf("a fill past the file's end: %v; want an unexpected EOF naming the file", err)
	}
}

// TLS files towards etcd that cannot be read are refused at start with exit status 2,
// as a missing cluster secret is: exit 1 made the units restart the process for ever.
func TestEtcdTLSFilesRefusedExit2(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing-ca.pem")
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"master", []string{"master", "--insecure-cluster", "--listen", freePort(t), "--etcd-endpoints", "127.0.0.1:1", "--etcd-cacert", missing}},
		{"owner", []string{"owner", "--insecure-cluster", "--dir", filepath.Join(dir, "run"), "--dram", "16MiB",
			"--master", "etcd://127.0.0.1:1", "--etcd-cacert", missing}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startService(t, tt.args...)
			if code := s.wait(startBudget); code != 2 {
				t.Errorf("exit status %d, want 2:\n%s", code, s.log())
			}
			if want := "etcd CA certificate: open " + missing; !strings.Contains(s.log(), want) {
				t.Errorf("stderr lacks %q:\n%s", want, s.log())
			}
		})
	}
}
