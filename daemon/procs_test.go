package daemon_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cloudwego/kitex/pkg/klog"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/protocol/auth"
)

// bin is the fluxkv binary the process tests run: $FLUXKV_BIN (`make test` points it
// at bin/fluxkv-race), or ../cmd/fluxkv built once, with -race when this test binary
// has it.
var bin string

// Timing budgets of the process tests: generous deadlines on a condition, never an
// expected speed (proctest says why).
const (
	startBudget = proctest.StartBudget // a process to open its socket or listen
	stopBudget  = proctest.StopBudget  // SIGTERM to the exit
)

// The race detector in a -race child: its report, its exit status, and the GORACE
// that makes it stop at the first race with that status.
const (
	raceReport   = proctest.RaceReport
	raceExitCode = proctest.RaceExitCode
)

var raceEnv = proctest.RaceEnv

func TestMain(m *testing.M) {
	klog.SetLevel(klog.LevelWarn) // the library leaves Kitex's global logger alone; tests quiet it
	if mode := os.Getenv("FLUXKV_TEST_CHILD"); mode != "" {
		os.Exit(runChild(mode))
	}
	dir, err := os.MkdirTemp("", "fluxkv-it-")
	if err != nil {
		panic(err)
	}
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
	if bin, err = proctest.Binary(raceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	proctest.RemoveBuilt()
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
// that it exits 0 and leaves no socket behind. Tests that run fluxkv under prlimit or
// a cgroup build one from its fields (cmd, stderr, done) and use its methods.
type proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	stderr *proctest.Buffer
	socket string
	addr   string // master address, for master processes
	done   chan error
	exited bool
}

// freePort is a loopback address with a port free right now.
func freePort(t testing.TB) string {
	t.Helper()
	addr, err := proctest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func start(t testing.TB, args ...string) *proc {
	t.Helper()
	return startWrapped(t, nil, args...)
}

// startWrapped runs fluxkv under a wrapper command (e.g. `ip netns exec NS`).
func startWrapped(t testing.TB, wrapper []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, stderr: &proctest.Buffer{}, done: make(chan error, 1)}
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
	p.waitFor("the master to listen on "+addr, func() bool { return proctest.Accepts("tcp", addr) })
	return p
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
		p.t.Fatalf("%s exited early (%v):\n%s", p.name(), err, tail(p.stderr.String()))
	default:
	}
}

// waitSocket waits for p.socket to accept (a crashed predecessor may have left a stale
// socket file).
func (p *proc) waitSocket() {
	p.waitFor("socket "+p.socket+" to accept", func() bool { return proctest.Accepts("unix", p.socket) })
}

// waitFor polls cond for up to startBudget; an early exit or the deadline fails the test.
func (p *proc) waitFor(what string, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(startBudget)
	for !cond() {
		p.checkAlive()
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: gave up waiting %v for %s:\n%s", p.name(), startBudget, what, tail(p.stderr.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and requires a clean exit within stopBudget with the sockets
// removed; a race the race detector found in the process fails the test.
func (p *proc) stop() { p.stopWith(syscall.SIGTERM) }

// stopWith is stop with signal sig.
func (p *proc) stopWith(sig syscall.Signal) {
	if p.exited {
		return
	}
	p.exited = true
	p.cmd.Process.Signal(sig)
	select {
	case err := <-p.done:
		if msg := p.raced(err); msg != "" {
			p.t.Error(msg)
		} else if err != nil {
			p.t.Errorf("%s exited with %v after %v:\n%s", p.name(), err, sig, tail(p.stderr.String()))
		}
	case <-time.After(stopBudget):
		p.cmd.Process.Kill()
		<-p.done
		if msg := p.raced(nil); msg != "" {
			p.t.Error(msg)
		}
		p.t.Errorf("%s did not exit within %v of %v:\n%s", p.name(), stopBudget, sig, tail(p.stderr.String()))
	}
	if p.socket != "" {
		for _, s := range []string{p.socket, p.socket + ".rpc"} {
			if _, err := os.Stat(s); err == nil {
				p.t.Errorf("socket %s left behind after %v", s, sig)
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
	return proctest.RaceFailure(p.name(), p.stderr.String(), waitErr)
}

// name names the process in failure messages: fluxkv and its arguments.
func (p *proc) name() string { return "fluxkv " + strings.Join(p.cmd.Args[1:], " ") }

// tail is the end of a process's log, for a failure message.
func tail(s string) string { return tailN(s, 4000) }

func tailN(s string, n int) string { return proctest.Tail(s, n) }

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
	case "midbatch":
		// A batch whose third value never gets written: under client isolation the first
		// two went through the put area into their targets.
		items := make([]fluxkv.PutItem, 4)
		for i := range items {
			items[i] = fluxkv.PutItem{Key: fmt.Sprintf("midbatch-%d", i), Len: 300000, Fill: func(_ int64, dst []byte) error {
				if i == 2 {
					fmt.Println("ready")
					select {}
				}
				copy(dst, payload(int64(i), len(dst)))
				return nil
			}}
		}
		_, err := c.BatchPut(items, fluxkv.PutOptions{})
		fmt.Println("batch put:", err)
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
