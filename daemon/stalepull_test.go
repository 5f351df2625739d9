package daemon

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/master"
)

// heldPull holds the first Pull until release is closed (held is closed when it
// arrives), then makes it; its outcome goes to first (buffered).
type heldPull struct {
	pullClient
	held, release chan struct{}
	first         chan error
	once          sync.Once
}

func (p *heldPull) Pull(ctx context.Context, addr string, f transfer.Fence, offset int64, dst []byte) error {
	first := false
	p.once.Do(func() { first = true; close(p.held) })
	if !first {
		return p.pullClient.Pull(ctx, addr, f, offset, dst)
	}
	<-p.release
	err := p.pullClient.Pull(ctx, addr, f, offset, dst)
	p.first <- err
	return err
}

// TestStalePullOfATombedSourceNotServed: n2 plans a get of k from n1's memory and its
// pull is held; meanwhile the master tombs n1 (its heartbeats lost past the TTL) and
// n1, alive, registers again: same process and segment, and its new pool gives k's
// range to l. The pull must not copy l's bytes (n1's fence names its registration: the
// pull's names the one before), and the get must not hand out bytes of that range
// (a review: n2 served l's bytes as k's, and the master promoted them to a replica of
// k; the master refuses the GetDone of a tombed source too).
func TestStalePullOfATombedSourceNotServed(t *testing.T) {
	t.Parallel()
	n := startNode(t, 4<<20, nil, master.Options{InsecureCluster: true, Placement: master.PlacementLocal,
		NodeTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond})
	p := &heldPull{held: make(chan struct{}), release: make(chan struct{}), first: make(chan error, 1)}
	_, c2 := n.addOwner(t, "n2", 4<<20, nil, func(o *Options) {
		o.CacheGrace = -1
		o.testPuller = func(c pullClient) pullClient { p.pullClient = c; return p }
	})
	valK, valL := value(1, 64<<10), value(2, 64<<10)
	if err := n.c.Put("k", valK); err != nil {
		t.Fatal(err)
	}
	st := n.o.lock()
	at := st.replicas.lookup("k").offset
	regs := st.reg.registered
	n.o.unlock()
	type result struct {
		h   *fluxkv.MemHolder
		err error
	}
	got := make(chan result, 1)
	go func() {
		h, err := c2.Get("k")
		got <- result{h, err}
	}()
	select {
	case <-p.held:
	case <-time.After(20 * time.Second):
		t.Fatal("n2's get never pulled")
	}
	// n1's heartbeats are lost until the master tombs it; then it registers again.
	l := &flakyLink{Client: n.o.master.cl(), cutHeartbeats: true}
	useMasterClient(n.o, l)
	waitUntil(t, func() bool { return memberGone(n.m, "n1") })
	useMasterClient(n.o, l.Client)
	waitUntil(t, func() bool {
		st := n.o.lock()
		defer n.o.unlock()
		return st.reg.registered > regs && !n.o.master.unsettled()
	})
	if err := n.c.Put("l", valL); err != nil {
		t.Fatal(err)
	}
	st = n.o.lock()
	rec := st.replicas.lookup("l")
	n.o.unlock()
	if rec == nil || rec.offset != at {
		t.Fatalf("l landed at %+v, not on k's old range %d: the test did not reach the fault", rec, at)
	}
	close(p.release)
	if gen := n.o.nodeGen(); gen == n.o.Generation() {
		t.Errorf("n1 registered again under its first registration's generation %d", gen)
	}
	if err := <-p.first; !errors.Is(err, transfer.ErrFenced) {
		t.Errorf("the pull planned before n1's tomb: %v, want refused by n1's fence", err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("n2's get never answered")
	}
	if r.err == nil {
		defer r.h.Release()
		if bytes.Equal(r.h.Bytes(), valL) {
			t.Fatal("n2 served l's bytes as k's: a pull from the tombed incarnation's range was trusted")
		}
		if !bytes.Equal(r.h.Bytes(), valK) {
			t.Fatal("n2 served bytes that are neither k's nor l's")
		}
	}
	t.Logf("n2's get: %v", r.err)
	if h, err := c2.Get("k"); err == nil {
		defer h.Release()
		if !bytes.Equal(h.Bytes(), valK) {
			t.Fatal("a later get of k through n2 served wrong bytes (a promoted replica of them?)")
		}
	}
}

// memberGone reports whether m no longer lists owner id (it tombed it).
func memberGone(m *master.Server, id string) bool {
	gone := true
	m.Inspect(func(st *master.State) {
		for _, ms := range st.Members() {
			if ms.NodeId == id {
				gone = false
			}
		}
	})
	return gone
}
