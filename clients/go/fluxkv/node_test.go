package fluxkv

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fluxkv/fluxkv/internal/proctest"
)

// bin is the fluxkv binary the tests run: $FLUXKV_BIN (`make test` points it at
// bin/fluxkv-race), or ./cmd/fluxkv built once, with -race when this test binary has it.
var bin string

func TestMain(m *testing.M) {
	if spec := os.Getenv(echoServeEnv); spec != "" {
		serveEcho(spec) // the answering process of BenchmarkHotGet4KiB's floor
		return
	}
	var err error
	if bin, err = proctest.Binary(raceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	proctest.RemoveBuilt()
	os.Exit(code)
}

// node is a `fluxkv up` process started by a test, one incarnation at a time on one
// directory; the test's cleanup stops it with SIGTERM and requires a clean exit.
type node struct {
	t     testing.TB
	dir   string
	dram  string
	extra []string       // more flags of `fluxkv up`
	p     *proctest.Proc // the running incarnation
}

func (n *node) socket() string { return filepath.Join(n.dir, "fluxkv.sock") }

// startNode runs `fluxkv up --dram dram [extra flags]` in a fresh directory and waits
// for its socket.
func startNode(t testing.TB, dram string, extra ...string) *node {
	t.Helper()
	n := &node{t: t, dir: t.TempDir(), dram: dram, extra: extra}
	n.start()
	t.Cleanup(n.stop)
	return n
}

func (n *node) start() {
	n.t.Helper()
	p, err := proctest.Start(proctest.Options{
		Name: "fluxkv up",
		Args: append([]string{bin, "up", "--dir", n.dir, "--dram", n.dram}, n.extra...),
		Env:  []string{proctest.RaceEnv},
	})
	if err != nil {
		n.t.Fatal(err)
	}
	n.p = p
	err = p.WaitFor(proctest.StartBudget, "socket "+n.socket()+" to accept", func() bool { return proctest.Accepts("unix", n.socket()) })
	if err != nil {
		p.Kill()
		n.t.Fatal(err)
	}
}

// restart kills the node with SIGKILL (a crash) and starts a new incarnation on the
// same directory. A race report in the killed incarnation's log fails the test.
func (n *node) restart() {
	n.t.Helper()
	n.p.Kill()
	if msg := n.p.RaceFailure(); msg != "" {
		n.t.Error(msg)
	}
	n.start()
}

// stop sends SIGTERM and requires a clean exit within StopBudget; a race the race
// detector found in the node fails the test.
func (n *node) stop() {
	if n.p == nil {
		return
	}
	if err := n.p.Stop(proctest.StopBudget); err != nil {
		n.t.Error(err)
	}
}

// connect attaches a client to the node; the test's cleanup closes it.
func (n *node) connect(t testing.TB) *Client {
	t.Helper()
	c, err := Connect(Options{Socket: n.socket(), Name: t.Name()})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, proctest.Tail(n.p.Log(), 4000))
	}
	t.Cleanup(func() { c.Close() })
	return c
}
