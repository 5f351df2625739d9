package daemon

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// TestPullPutAcrossRegister: a PullPut (pooled placement) still writing its target when
// the owner registers with a new master is reported as a pin, so the new master does
// not hand the range out; its end fails the call (its master is gone) and acks the pin.
// A PullPut arriving while a registration is out is refused before it writes a byte.
func TestPullPutAcrossRegister(t *testing.T) {
	t.Parallel()
	n := startNode(t, 4<<20, nil, master.Options{InsecureCluster: true})
	o := n.o
	// A source that accepts and never answers: the pull waits until its deadline.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	req := &peer.PullPutRequest{Key: "k", PutId: 77, Generation: o.generation, TargetOffset: 1 << 20, Len: 4096,
		SourceNodeId: "n9", SourceGeneration: 1, SourceDataAddr: ln.Addr().String()}

	o.lock().reg.registering = true
	o.unlock()
	if err := o.pullPut(context.Background(), req); err == nil || !strings.Contains(err.Error(), "registering") {
		t.Fatalf("PullPut during a registration: %v", err)
	}
	o.lock().reg.registering = false
	o.unlock()

	pullErr := make(chan error, 1)
	go func() { pullErr <- o.pullPut(context.Background(), req) }()
	waitUntil(t, func() bool { defer o.unlock(); return o.lock().writes.count(writePull) == 1 })

	m2 := restartMaster(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	if got := nodeHolders(t, m2); got != 1 {
		t.Fatalf("the new master holds %d ranges of n1, want the pull's pin", got)
	}
	if err := <-pullErr; err == nil {
		t.Fatal("a PullPut that outlived its master's term answered OK")
	}
	o.acks.sync()
	if got := nodeHolders(t, m2); got != 0 {
		t.Fatalf("the pin was not acked: the new master holds %d ranges of n1", got)
	}
	st := o.lock()
	defer o.unlock()
	if n := st.writes.count(writePull); n != 0 {
		t.Fatalf("%d pulls still tracked", n)
	}
}

// waitUntil polls cond for up to 10s (proctest.WaitUntil).
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	proctest.WaitUntil(t, cond)
}
