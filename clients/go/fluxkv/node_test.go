package fluxkv

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bin is the fluxkv binary the tests run: $FLUXKV_BIN (`make test` points it at
// bin/fluxkv-race), or ./cmd/fluxkv built once, with -race when this test binary has it.
var bin string

// Timing budgets of the node tests. `make test` runs them against bin/fluxkv-race
// (several times slower) on two busy cores, so each is a generous deadline on a
// condition, never an expected speed.
const (
	startBudget = 60 * time.Second // a node to open its socket
	// stopBudget is how long SIGTERM may take: the owner's own shutdown timeout is 4 s,
	// the systemd units allow 20 s.
	stopBudget = 20 * time.Second
)

// raceReport marks a race detector report in a node's stderr.
const raceReport = "WARNING: DATA RACE"

// raceExitCode is the exit status a -race node uses when it found a race (GORACE
// exitcode, set by start).
const raceExitCode = 66

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fluxkv-client-")
	if err != nil {
		panic(err)
	}
	bin = os.Getenv("FLUXKV_BIN")
	if bin == "" {
		bin = filepath.Join(dir, "fluxkv")
		args := []string{"build", "-o", bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "../../../cmd/fluxkv")...).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build fluxkv: %v\n%s", err, out)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// node is a `fluxkv up` process started by a test; the test's cleanup stops it with
// SIGTERM and requires a clean exit.
type node struct {
	t      testing.TB
	dir    string
	dram   string
	cmd    *exec.Cmd
	stderr *lockedBuffer
	done   chan error
}

func (n *node) socket() string { return filepath.Join(n.dir, "fluxkv.sock") }

// startNode runs `fluxkv up --dram dram` in a fresh directory and waits for its socket.
func startNode(t testing.TB, dram string) *node {
	t.Helper()
	n := &node{t: t, dir: t.TempDir(), dram: dram}
	n.start()
	t.Cleanup(n.stop)
	return n
}

func (n *node) start() {
	n.t.Helper()
	n.stderr = &lockedBuffer{}
	n.done = make(chan error, 1)
	n.cmd = exec.Command(bin, "up", "--dir", n.dir, "--dram", n.dram)
	// A -race node stops at its first race with a status of its own (a plain binary
	// ignores GORACE).
	n.cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1 exitcode="+strconv.Itoa(raceExitCode))
	n.cmd.Stderr = n.stderr
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	cmd, done := n.cmd, n.done
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(startBudget)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", n.socket()); err == nil {
			c.Close()
			return
		}
		select {
		case err := <-done:
			n.done = nil
			if msg := n.raced(err); msg != "" {
				n.t.Fatal(msg)
			}
			n.t.Fatalf("fluxkv up exited early (%v):\n%s", err, n.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	n.t.Fatalf("socket %s did not appear:\n%s", n.socket(), n.stderr)
}

// restart kills the node with SIGKILL (a crash) and starts a new incarnation on the
// same directory. A race report in the killed incarnation's stderr fails the test.
func (n *node) restart() {
	n.t.Helper()
	n.cmd.Process.Kill()
	<-n.done
	if msg := n.raced(nil); msg != "" {
		n.t.Error(msg)
	}
	n.start()
}

// stop sends SIGTERM and requires a clean exit within stopBudget; a race the race
// detector found in the node fails the test.
func (n *node) stop() {
	if n.done == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-n.done:
		if msg := n.raced(err); msg != "" {
			n.t.Error(msg)
		} else if err != nil {
			n.t.Errorf("fluxkv exited with %v after SIGTERM:\n%s", err, n.stderr)
		}
	case <-time.After(stopBudget):
		n.cmd.Process.Kill()
		<-n.done
		if msg := n.raced(nil); msg != "" {
			n.t.Error(msg)
		}
		n.t.Errorf("fluxkv did not exit within %v of SIGTERM:\n%s", stopBudget, n.stderr)
	}
	n.done = nil
}

// raced says why the exited node shows a race, or "" when it does not: a race report
// in its stderr, or waitErr carrying the race detector's exit status.
func (n *node) raced(waitErr error) string {
	log := n.stderr.all()
	if i := strings.Index(log, raceReport); i >= 0 {
		// The report and what follows it (halt_on_error makes it the end of the log).
		if j := strings.LastIndex(log[:i], "\n"); j >= 0 {
			i = j + 1
		}
		rep := log[i:]
		if len(rep) > 16000 {
			rep = "..." + rep[len(rep)-16000:]
		}
		return fmt.Sprintf("the race detector reported a race in fluxkv up (%v):\n%s", waitErr, rep)
	}
	var ee *exec.ExitError
	if errors.As(waitErr, &ee) && ee.ExitCode() == raceExitCode {
		return fmt.Sprintf("fluxkv up exited with status %d, the race detector's:\n%s", raceExitCode, n.stderr)
	}
	return ""
}

// connect attaches a client to the node; the test's cleanup closes it.
func (n *node) connect(t testing.TB) *Client {
	t.Helper()
	c, err := Connect(Options{Socket: n.socket(), Name: t.Name()})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, n.stderr)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// all is everything written so far.
func (w *lockedBuffer) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// String is the end of what was written, for a failure message.
func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.b.String()
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return s
}
