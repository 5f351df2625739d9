package daemon_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/protocol/auth"
)

// bin is the fluxkv binary the process tests run: $FLUXKV_BIN (`make test` points it
// at bin/fluxkv-race), or ../cmd/fluxkv built once, with -race when this test binary
// has it.
var bin string

// Timing budgets of the process tests. `make test` runs them against bin/fluxkv-race
// (several times slower) on two busy cores, so each is a generous deadline on a
// condition, never an expected speed.
const (
	startBudget = 60 * time.Second // a process to open its socket or listen
	// stopBudget is how long SIGTERM may take: the owner's own shutdown timeout is 4 s,
	// the systemd units allow 20 s.
	stopBudget = 20 * time.Second
)

// raceReport marks a race detector report in a child's stderr.
const raceReport = "WARNING: DATA RACE"

// raceExitCode is the exit status a -race child uses when it found a race (GORACE
// exitcode, set by start).
const raceExitCode = 66

// raceEnv makes a -race child stop at its first race with raceExitCode (a plain
// binary ignores GORACE).
var raceEnv = "GORACE=halt_on_error=1 exitcode=" + strconv.Itoa(raceExitCode)

func TestMain(m *testing.M) {
	if mode := os.Getenv("FLUXKV_TEST_CHILD"); mode != "" {
		os.Exit(runChild(mode))
	}
	dir, err := os.MkdirTemp("", "fluxkv-it-")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "fluxkv")
	// One cluster secret for every master and owner this test binary starts.
	clusterSecret = filepath.Join(dir, "cluster.secret")
	if err := auth.GenerateSecretFile(clusterSecret); err != nil {
		panic(err)
	}
	// One master key pair: masters sign with the key, owners accept the public half.
	masterKeyFile, masterPubKeyFile = filepath.Join(dir, "master.key"), filepath.Join(dir, "master.pub")
	if err := auth.GenerateMasterKeyFiles(masterKeyFile, masterPubKeyFile); err != nil {
		panic(err)
	}
	if p := os.Getenv("FLUXKV_BIN"); p != "" {
		bin = p
	} else {
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "../cmd/fluxkv")...).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build fluxkv: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// clusterSecret is the --cluster-secret-file of the masters and owners tests start;
// masterKeyFile the masters' --master-key-file, masterPubKeyFile its public half, the
// owners' --master-pubkey-file.
var clusterSecret, masterKeyFile, masterPubKeyFile string

// masterAuth and ownerAuth are the cluster authentication flags of a master and an owner.
func masterAuth() []string {
	return []string{"--cluster-secret-file", clusterSecret, "--master-key-file", masterKeyFile}
}

func ownerAuth() []string {
	return []string{"--cluster-secret-file", clusterSecret, "--master-pubkey-file", masterPubKeyFile}
}

// proc is a fluxkv process started by a test; Cleanup stops it with SIGTERM and checks
// that it exits 0 and leaves no socket behind.
type proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	stderr *syncWriter
	socket string
	addr   string // master address, for master processes
	done   chan error
	exited bool
}

func freePort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func start(t testing.TB, args ...string) *proc {
	t.Helper()
	return startWrapped(t, nil, args...)
}

// startWrapped runs fluxkv under a wrapper command (e.g. `ip netns exec NS`).
func startWrapped(t testing.TB, wrapper []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, stderr: &syncWriter{b: &bytes.Buffer{}}, done: make(chan error, 1)}
	argv := append(append(slices.Clone(wrapper), bin, "--log-level", "debug"), args...)
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(os.Environ(), raceEnv)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.stop() })
	return p
}

// startUp runs `fluxkv up` and waits for its socket.
func startUp(t testing.TB, dram string, extra ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	p := start(t, append([]string{"up", "--dir", dir, "--dram", dram}, extra...)...)
	p.socket = filepath.Join(dir, "fluxkv.sock")
	p.waitSocket()
	return p
}

// startMaster runs `fluxkv master` (with extra flags) on a free port and waits until
// it accepts.
func startMaster(t testing.TB, addr string, extra ...string) *proc {
	t.Helper()
	if addr == "" {
		addr = freePort(t)
	}
	p := start(t, append(append([]string{"master", "--listen", addr, "--node-ttl", "2s"}, masterAuth()...), extra...)...)
	p.addr = addr
	deadline := time.Now().Add(startBudget)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return p
		}
		p.checkAlive()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("master did not listen on %s:\n%s", addr, p.stderr)
	return nil
}

// startOwner runs `fluxkv owner` against a master and waits for its socket.
func startOwner(t testing.TB, dir, masterAddr, dram string, nodeID ...string) *proc {
	t.Helper()
	id := "owner-1"
	if len(nodeID) > 0 {
		id = nodeID[0]
	}
	return startOwnerWith(t, dir, masterAddr, dram, id)
}

// startOwnerWith is startOwner with a node id and extra flags.
func startOwnerWith(t testing.TB, dir, masterAddr, dram, nodeID string, extra ...string) *proc {
	t.Helper()
	p := start(t, append(append([]string{"owner", "--dir", dir, "--dram", dram, "--master", masterAddr, "--node-id", nodeID},
		ownerAuth()...), extra...)...)
	p.socket = filepath.Join(dir, "fluxkv.sock")
	p.waitSocket()
	return p
}

func (p *proc) checkAlive() {
	select {
	case err := <-p.done:
		p.exited = true
		if msg := p.raced(err); msg != "" {
			p.t.Fatal(msg)
		}
		p.t.Fatalf("fluxkv exited early (%v):\n%s", err, p.stderr)
	default:
	}
}

func (p *proc) waitSocket() {
	deadline := time.Now().Add(startBudget)
	for time.Now().Before(deadline) {
		// A crashed predecessor may have left a stale socket file: wait for one that accepts.
		if c, err := net.Dial("unix", p.socket); err == nil {
			c.Close()
			return
		}
		p.checkAlive()
		time.Sleep(20 * time.Millisecond)
	}
	p.t.Fatalf("socket %s did not appear:\n%s", p.socket, p.stderr)
}

// stop sends SIGTERM and requires a clean exit within stopBudget with the sockets
// removed; a race the race detector found in the process fails the test.
func (p *proc) stop() {
	if p.exited {
		return
	}
	p.exited = true
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if msg := p.raced(err); msg != "" {
			p.t.Error(msg)
		} else if err != nil {
			p.t.Errorf("fluxkv exited with %v after SIGTERM:\n%s", err, tail(p.stderr.String()))
		}
	case <-time.After(stopBudget):
		p.cmd.Process.Kill()
		<-p.done
		if msg := p.raced(nil); msg != "" {
			p.t.Error(msg)
		}
		p.t.Errorf("fluxkv did not exit within %v of SIGTERM:\n%s", stopBudget, tail(p.stderr.String()))
	}
	if p.socket != "" {
		for _, s := range []string{p.socket, p.socket + ".rpc"} {
			if _, err := os.Stat(s); err == nil {
				p.t.Errorf("socket %s left behind after SIGTERM", s)
			}
		}
	}
}

// kill sends SIGKILL (a crash: nothing is cleaned up). A race report in the
// process's stderr still fails the test (the status is SIGKILL's, so only the report
// tells).
func (p *proc) kill() {
	p.exited = true
	p.cmd.Process.Kill()
	<-p.done
	if msg := p.raced(nil); msg != "" {
		p.t.Error(msg)
	}
}

// raced says why the exited process shows a race, or "" when it does not: a race
// report in its stderr, or waitErr carrying the race detector's exit status.
func (p *proc) raced(waitErr error) string {
	log := p.stderr.String()
	if i := strings.Index(log, raceReport); i >= 0 {
		// The report and what follows it (halt_on_error makes it the end of the log).
		if j := strings.LastIndex(log[:i], "\n"); j >= 0 {
			i = j + 1
		}
		return fmt.Sprintf("the race detector reported a race in fluxkv %s (%v):\n%s",
			strings.Join(p.cmd.Args[1:], " "), waitErr, tailN(log[i:], 16000))
	}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) && ee.ExitCode() == raceExitCode {
		return fmt.Sprintf("fluxkv %s exited with status %d, the race detector's:\n%s",
			strings.Join(p.cmd.Args[1:], " "), raceExitCode, tail(log))
	}
	return ""
}

// tail is the end of a process's log, for a failure message.
func tail(s string) string { return tailN(s, 4000) }

func tailN(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// syncWriter lets the process's stderr be read while it is being written.
type syncWriter struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(b)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func connect(t testing.TB, socket string) *fluxkv.Client {
	t.Helper()
	c, err := fluxkv.Connect(fluxkv.Options{Socket: socket, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// usage returns (used bytes, holders, keys) as the master sees them.
func usage(t *testing.T, c *fluxkv.Client) (used, holders, keys int64) {
	t.Helper()
	c.Flush()
	st, err := c.Stat()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		used += m.MemorySegment.UsedBytes
		holders += m.Holders
	}
	return used, holders, st.Keys
}

// waitUsage polls until used bytes and holders reach the wanted values (acks are
// asynchronous and batched), failing after timeout.
func waitUsage(t *testing.T, c *fluxkv.Client, wantUsed, wantHolders int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		used, holders, _ := usage(t, c)
		if used == wantUsed && holders == wantHolders {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: used=%d holders=%d, want used=%d holders=%d", timeout, used, holders, wantUsed, wantHolders)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// leakCheck deletes every key it is given and requires the segment back to empty.
func leakCheck(t *testing.T, c *fluxkv.Client, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, err := c.Delete(k); err != nil {
			t.Fatalf("delete %s: %v", k, err)
		}
	}
	waitUsage(t, c, 0, 0, 3*time.Second)
}

// runChild is a test external run as its own process (re-executed test binary), so a
// test can SIGKILL it while it holds holders or is mid-put.
func runChild(mode string) int {
	c, err := fluxkv.Connect(fluxkv.Options{Socket: os.Getenv("FLUXKV_TEST_SOCKET"), Name: "child"})
	if err != nil {
		fmt.Println("connect:", err)
		return 1
	}
	switch mode {
	case "hold":
		for _, k := range strings.Split(os.Getenv("FLUXKV_TEST_KEYS"), ",") {
			if _, err := c.Get(k); err != nil {
				fmt.Println("get:", err)
				return 1
			}
		}
	case "midput":
		// Start a put and never end it.
		err := c.PutWith("midput", 1<<20, fluxkv.PutOptions{}, func(dst []byte) error {
			fmt.Println("ready")
			select {}
		})
		fmt.Println("put:", err)
		return 1
	}
	fmt.Println("ready")
	select {}
}

// startChild runs runChild(mode) in a new process and waits for it to say ready.
func startChild(t *testing.T, socket, mode string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, "FLUXKV_TEST_CHILD="+mode, "FLUXKV_TEST_SOCKET="+socket)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ready" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child did not get ready: %q %v", line, err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}
