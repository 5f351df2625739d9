package fluxkv

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"golang.org/x/sys/unix"
)

// openFds counts this process's open file descriptors.
func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestCloseDuringCallClosesConn: a call in flight while Close runs gives its RPC
// connection back afterwards; it must be closed, not pooled in the closed attachment
// (where nobody ever closed it: an fd leak per such Close).
func TestCloseDuringCallClosesConn(t *testing.T) {
	n := startNode(t, "64MiB")
	c, err := Connect(Options{Socket: n.socket(), Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	a := c.current()
	inCall, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.hooks.onSend = func(method string, _ thrift.FastCodec) {
		if method == "Exists" {
			once.Do(func() { close(inCall) })
			<-gate
		}
	}
	done := make(chan error, 1)
	go func() { _, err := c.Exists("k"); done <- err }()
	<-inCall
	c.Close()
	close(gate)
	t.Logf("Exists after Close: %v", <-done)
	if k := len(a.idle); k != 0 {
		rc := <-a.idle
		_, ferr := unix.FcntlInt(uintptr(rc.fd), unix.F_GETFD, 0)
		t.Fatalf("after Close, %d RPC connection(s) sit in the closed attachment's pool, fd %d still open (F_GETFD err=%v): leaked", k, rc.fd, ferr)
	}
}

// memfdMaps counts this process's mappings of fluxkv segments (memfd:fluxkv-...).
func memfdMaps(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	k := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "memfd:fluxkv") {
			k++
		}
	}
	return k
}

// TestReattachUnmapsDeadSegment: after the owner restarts, the client re-attaches and
// unmaps the old incarnation's segment once no holder views it (it kept it until Close:
// the dead owner's whole segment stayed allocated, once more per restart).
func TestReattachUnmapsDeadSegment(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	before := memfdMaps(t)
	for i := 0; i < 2; i++ {
		n.restart()
		if _, err := c.Exists("k"); err != nil {
			t.Fatalf("exists after restart %d: %v", i, err)
		}
	}
	after := memfdMaps(t)
	c.mu.Lock()
	old := len(c.old)
	c.mu.Unlock()
	if after > before {
		t.Fatalf("segment mappings: %d before two owner restarts, %d after (%d retired attachments kept), with no holder alive", before, after, old)
	}
}

// TestFailedReleaseResent: a Release that fails in transport (here: its pooled
// connection is broken) keeps its ids queued and the release timer sends them again on
// its own (before, they waited for the client's next call: an idle client left the
// owner holding them, and their segment space).
func TestFailedReleaseResent(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	c.opts.ReleaseDelay = 5 * time.Millisecond
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	// Break the one pooled connection: the next call on it fails before any byte leaves.
	a := c.current()
	rc := <-a.idle
	unix.Shutdown(rc.fd, unix.SHUT_WR)
	a.idle <- rc
	h.Release()
	time.Sleep(500 * time.Millisecond) // 100 × ReleaseDelay
	c.mu.Lock()
	queued, armed := len(c.releases), c.timerSet
	c.mu.Unlock()
	if queued != 0 {
		t.Fatalf("500ms after Release, %d id(s) still queued (timer armed: %v): a failed Release is never retried on its own", queued, armed)
	}
}

// TestOldHolderKeepsMappingUntilRelease: a holder of the old incarnation keeps its
// mapping valid across the re-attach; its Release (the last user) unmaps it.
func TestOldHolderKeepsMappingUntilRelease(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	before := memfdMaps(t)
	n.restart()
	if _, err := c.Exists("k"); err != nil {
		t.Fatal(err)
	}
	if got := string(h.Bytes()); got != "value" {
		t.Fatalf("old holder reads %q after the re-attach", got)
	}
	if got := memfdMaps(t); got <= before {
		t.Fatalf("%d segment mappings with an old holder alive, want more than %d", got, before)
	}
	h.Release()
	if got := memfdMaps(t); got != before {
		t.Fatalf("%d segment mappings after the old holder's release, want %d", got, before)
	}
}
