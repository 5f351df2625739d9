package daemon

import (
	"net"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
)

// TestStopBoundedByShutdownTimeout (docs/architecture.md §9, the owner stops while its master hangs):
// Stop revokes a client's pending put and flushes holder acks at the master; when the
// master accepts connections but never answers, those calls would each wait the whole
// MasterTimeout (here 60 s). Past ShutdownTimeout they are cut short, every goroutine
// is still joined, and only then is the segment unmapped: Stop returns in a few
// seconds, not minutes.
func TestStopBoundedByShutdownTimeout(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true}, func(o *Options) {
		o.MasterTimeout = 60 * time.Second
		o.ShutdownTimeout = 300 * time.Millisecond
	})
	rawPutStart(t, n.c, "pending", 4096) // left pending: Stop revokes it
	if err := n.c.Put("held", value(1, 4096)); err != nil {
		t.Fatal(err)
	}
	h, err := n.c.Get("held")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()

	// The master hangs: at its address now is a listener that takes every
	// connection and answers nothing.
	addr := n.m.Addr().String()
	n.m.Stop()
	hole, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot take over the master's address %s: %v", addr, err)
	}
	authtest.Silent(t, hole)

	t0 := time.Now()
	stopped := make(chan struct{})
	go func() {
		n.o.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second): // half the master timeout: generous on a busy machine
		t.Fatal("Stop is still waiting on the hung master after 30 s")
	}
	t.Logf("Stop returned %v after it began (shutdown timeout 300ms, master timeout 60s)", time.Since(t0).Round(time.Millisecond))
	if n.o.seg != nil {
		t.Fatal("the segment is still mapped after Stop")
	}
}
