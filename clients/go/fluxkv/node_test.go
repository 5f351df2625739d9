package fluxkv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bin is the fluxkv binary the tests run: $FLUXKV_BIN, or ./cmd/fluxkv built once.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fluxkv-client-")
	if err != nil {
		panic(err)
	}
	bin = os.Getenv("FLUXKV_BIN")
	if bin == "" {
		bin = filepath.Join(dir, "fluxkv")
		out, err := exec.Command("go", "build", "-o", bin, "../../../cmd/fluxkv").CombinedOutput()
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
	n.cmd.Stderr = n.stderr
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	cmd, done := n.cmd, n.done
	go func() { done <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("unix", n.socket()); err == nil {
			c.Close()
			return
		}
		select {
		case err := <-done:
			n.done = nil
			n.t.Fatalf("fluxkv up exited early (%v):\n%s", err, n.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	n.t.Fatalf("socket %s did not appear:\n%s", n.socket(), n.stderr)
}

// restart kills the node with SIGKILL (a crash) and starts a new incarnation on the
// same directory.
func (n *node) restart() {
	n.t.Helper()
	n.cmd.Process.Kill()
	<-n.done
	n.start()
}

func (n *node) stop() {
	if n.done == nil {
		return
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-n.done:
		if err != nil {
			n.t.Errorf("fluxkv exited with %v after SIGTERM:\n%s", err, n.stderr)
		}
	case <-time.After(15 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
		n.t.Errorf("fluxkv did not exit within 15s of SIGTERM:\n%s", n.stderr)
	}
	n.done = nil
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

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.b.String()
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return s
}
