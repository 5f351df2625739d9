package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// nodeHolders is the number of holders the master records for owner n1 (pins
// included).
func nodeHolders(t *testing.T, m *master.Server) int64 {
	t.Helper()
	return memberHolders(t, m, "n1")
}

// memberHolders is the number of holders the master records for owner id.
func memberHolders(t *testing.T, m *master.Server, id string) int64 {
	t.Helper()
	var holders int64 = -1
	m.Inspect(func(st *master.State) {
		for _, ms := range st.Members() {
			if ms.NodeId == id {
				holders = ms.Holders
			}
		}
	})
	if holders < 0 {
		t.Fatalf("the master does not know %s", id)
	}
	return holders
}

// TestGetPinAcrossRegister: an SSD refill whose target was written while the owner
// registered with a restarted master. The registration reports the target as a pin (the
// new master holds it), the get fails UNAVAILABLE instead of handing out bytes the new
// master never published, and the pin is acked: the new master holds nothing of n1
// once the acks are flushed. The owner serves on.
func TestGetPinAcrossRegister(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 64<<20)
	n := startNode(t, 4<<20, so, master.Options{InsecureCluster: true})
	var keys []string
	for i := range 12 {
		k := fmt.Sprintf("gp-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	// gp-0 is out of memory by now: its get refills from SSD into a target here.

	addr := n.m.Addr().String()
	var (
		fired     atomic.Int32
		pinnedID  atomic.Int64
		pinsAtNew atomic.Int64
		m2        atomic.Pointer[master.Server]
	)
	hookErr := make(chan error, 1)
	n.o.mu.Lock()
	n.o.mu.afterWrite = func(getID int64) {
		if fired.Add(1) != 1 {
			return
		}
		hookErr <- func() error {
			n.m.Stop()
			m, err := master.NewServer(master.Options{InsecureCluster: true})
			if err != nil {
				return err
			}
			if err := m.Start(addr); err != nil {
				return err
			}
			m2.Store(m)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := n.o.master.register(ctx); err != nil {
				return err
			}
			if n.o.getPinned(getID) {
				pinnedID.Store(getID)
			}
			pinsAtNew.Store(nodeHolders(t, m))
			return nil
		}()
	}
	n.o.mu.Unlock()
	t.Cleanup(func() {
		if m := m2.Load(); m != nil {
			m.Stop()
		}
	})

	h, err := n.c.Get(keys[0])
	if err == nil {
		h.Release()
		t.Fatalf("a get whose target was written across a registration handed out a %s holder", h.Source())
	}
	if fired.Load() != 1 {
		t.Fatalf("no SSD refill target was written (%v)", err)
	}
	if herr := <-hookErr; herr != nil {
		t.Fatal(herr)
	}
	if !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Fatalf("get across a registration: %v, want UNAVAILABLE", err)
	}
	if pinnedID.Load() == 0 {
		t.Fatal("register did not report the refill's target as a pin")
	}
	if got := pinsAtNew.Load(); got != 1 {
		t.Fatalf("the new master held %d ranges of n1 after the registration, want the get's pin", got)
	}
	n.o.mu.Lock()
	left := n.o.mu.st.writes.count(writeGet)
	n.o.mu.afterWrite = nil
	n.o.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d get targets still tracked", left)
	}
	n.o.acks.sync()
	if got := nodeHolders(t, m2.Load()); got != 0 {
		t.Fatalf("the new master still holds %d ranges of n1 after the acks", got)
	}
	// The owner serves on: whatever the new master knows reads byte-exact.
	for i, k := range keys {
		h, err := n.c.Get(k)
		if errors.Is(err, fluxkv.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get %s after the registration: %v", k, err)
		}
		if !bytes.Equal(h.Bytes(), value(i, 1<<20)) {
			t.Fatalf("get %s after the registration: wrong bytes", k)
		}
		h.Release()
	}
}

// TestAcceptPlanOpensItsTarget: the replica records a get's target overlaps (a replica
// the master evicted, its notice not here yet) go in the same hold of the lock that
// registers the target as a write. A registration in between would report the record
// beside the write's pin, and a new master would adopt it onto the bytes the get
// overwrites. A plan of another registration opens nothing.
func TestAcceptPlanOpensItsTarget(t *testing.T) {
	st := newOwnerState(stateOptions{nodeID: "n1", generation: 1, segSize: 1 << 20, grace: time.Second, hotBudget: 1 << 20})
	for i, k := range []string{"x", "y"} {
		if !st.replicas.learn(replicaRecord{key: k, putID: 5, offset: int64(i) * 64 << 10, len: 64 << 10}, st.replicas.seq, 0) {
			t.Fatalf("record %s not learned", k)
		}
	}
	if _, err := st.acceptPlan(&mp.GetStartResponse{GetId: 8, TargetOffset: 4096, Len: 8192}, st.reg.epoch+1); err == nil {
		t.Fatal("a plan of another registration accepted")
	}
	if st.replicas.byKey["x"] == nil {
		t.Fatal("a refused plan opened its target")
	}
	tg, err := st.acceptPlan(&mp.GetStartResponse{GetId: 9, TargetOffset: 4096, Len: 8192}, st.reg.epoch)
	if err != nil || tg.write == nil {
		t.Fatalf("plan refused (%v) or its target not registered", err)
	}
	if st.replicas.byKey["x"] != nil || st.replicas.byKey["y"] == nil {
		t.Fatalf("after the plan's acceptance: x recorded %v (want no), y %v (want yes)", st.replicas.byKey["x"] != nil, st.replicas.byKey["y"] != nil)
	}
	if tg.own != st.replicas.seq {
		t.Fatalf("the target's own note %d, want the open's, %d", tg.own, st.replicas.seq)
	}
}

// TestPinEndsWhenItsVersionDies: a prefix lookup's pin of a page ends when a delete or
// an overwrite of the key reaches the owner, not only at its time: it held the dead
// version's bytes and its share of the hot-set budget for up to pin_ms.
func TestPinEndsWhenItsVersionDies(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"delete", "overwrite"} {
		t.Run(end, func(t *testing.T) {
			n := startNode(t, 8<<20, nil, master.Options{})
			if err := n.c.Put("k", value(1, 4096)); err != nil {
				t.Fatal(err)
			}
			if got, err := n.c.BatchExistsPrefix([]string{"k"}, 5*time.Second); err != nil || got != 1 {
				t.Fatalf("pinned lookup: %d, %v", got, err)
			}
			pins := func() (int, int64) {
				st := n.o.lock()
				defer n.o.unlock()
				return len(st.pins), st.hot.pinned
			}
			if k, b := pins(); k != 1 || b == 0 {
				t.Fatalf("%d pins of %d bytes after the lookup, want 1", k, b)
			}
			c2, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: t.Name() + "-2"})
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			if end == "delete" {
				if _, err := c2.Delete("k"); err != nil {
					t.Fatal(err)
				}
			} else if err := c2.Put("k", value(2, 4096)); err != nil {
				t.Fatal(err)
			}
			if k, b := pins(); k != 0 || b != 0 {
				t.Errorf("%d pins of %d bytes after the %s, want none", k, b, end)
			}
		})
	}
}

// TestNoPinOfAVersionThatDied: an overwrite of a page that reaches the owner after a
// prefix lookup's get of it and before its pin (while the lookup's other pages land)
// leaves it unpinned: the pin would hold the dead version's bytes and budget until
// pin_ms, and no load would read them. The lookup's count stops there.
func TestNoPinOfAVersionThatDied(t *testing.T) {
	t.Parallel()
	var overwrite atomic.Pointer[func()] // set once the second client is up (the race detector sees no socket)
	n := startNode(t, 8<<20, nil, master.Options{}, func(o *Options) {
		o.testBeforePin = func() {
			if f := overwrite.Load(); f != nil {
				(*f)()
			}
		}
	})
	c2, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: t.Name() + "-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	put := func() {
		if err := c2.Put("k", value(2, 4096)); err != nil {
			t.Error(err)
		}
	}
	overwrite.Store(&put)
	if err := n.c.Put("k", value(1, 4096)); err != nil {
		t.Fatal(err)
	}
	got, err := n.c.BatchExistsPrefix([]string{"k"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st := n.o.lock()
	pins, bytes := len(st.pins), st.hot.pinned
	n.o.unlock()
	if pins != 0 || bytes != 0 || got != 0 {
		t.Errorf("%d pins of %d bytes, lookup count %d after the version died before its pin: want none", pins, bytes, got)
	}
}

// TestLookupCountsAPageTheHotSetDidNotKeep: a page whose holding the hot set did not
// keep, where it cannot tell whether an invalidation killed the version (here a reset:
// it forgot what it knew), is counted unpinned rather than ending the count.
func TestLookupCountsAPageTheHotSetDidNotKeep(t *testing.T) {
	t.Parallel()
	var n *node
	var ready atomic.Bool
	n = startNode(t, 8<<20, nil, master.Options{}, func(o *Options) {
		o.testBeforePin = func() {
			if ready.Load() {
				st := n.o.lock()
				st.hot.reset()
				n.o.unlock()
			}
		}
	})
	if err := n.c.Put("k", value(1, 4096)); err != nil {
		t.Fatal(err)
	}
	ready.Store(true)
	got, err := n.c.BatchExistsPrefix([]string{"k"}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st := n.o.lock()
	pins := len(st.pins)
	n.o.unlock()
	if got != 1 || pins != 0 {
		t.Errorf("lookup count %d with %d pins, want the page counted unpinned (1, 0)", got, pins)
	}
}

// TestPinsShareTheBudget: a page two sessions pin counts once against the pin budget
// (the second needs no room for it). A session may pin past half of the budget; once
// another session within its half finds no room, its pins past half end at once and it
// pins no more than half for a while (its renewal keeps half).
func TestPinsShareTheBudget(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{})
	st := n.o.lock()
	limit := st.hot.pinLimit()
	n.o.unlock()
	const page = 512 << 10
	half, all := int(limit/2/page), int(limit/page) // the pages of half the budget, of all of it
	put := func(prefix string, k int) (keys []string) {
		for i := range k {
			key := fmt.Sprintf("%s%d", prefix, i)
			if err := n.c.Put(key, value(i, page)); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, key)
		}
		return keys
	}
	ps, qs := put("p", half+1), put("q", 1)
	c2, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: t.Name() + "-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	lookup := func(c *fluxkv.Client, keys []string, pinMS time.Duration) int {
		t.Helper()
		got, err := c.BatchExistsPrefix(keys, pinMS)
		if err != nil {
			t.Fatal(err)
		}
		return int(got)
	}
	state := func() (pins int, pinned int64) {
		st := n.o.lock()
		defer n.o.unlock()
		return len(st.pins), st.hot.pinned
	}
	// The first session pins past half; the second pins the same pages, charged
	// nothing more.
	if got := lookup(n.c, ps, 5*time.Second); got != half+1 {
		t.Fatalf("a session counted %d of %d pages, want all", got, len(ps))
	}
	if got := lookup(c2, ps, 2*time.Second); got != half+1 {
		t.Errorf("the second session counted %d of the same pages, want all %d", got, half+1)
	}
	if pins, pinned := state(); pins != 2*(half+1) || pinned != int64(half+1)*page {
		t.Errorf("%d pins of %d bytes, want %d pins of the same %d pages", pins, pinned, 2*(half+1), half+1)
	}
	// The first session takes the whole budget while the second's pins expire; then the
	// second finds no room within its half, and the first's renewal keeps half.
	rest := put("r", all-half-1)
	waitUntil(t, func() bool { pins, _ := state(); return pins == half+1 }) // the second's expired
	if got := lookup(n.c, append(append([]string{}, ps...), rest...), 5*time.Second); got != all {
		t.Fatalf("the first session, the second's pins left, counted %d, want the whole budget's %d pages", got, all)
	}
	if got := lookup(c2, qs, 100*time.Millisecond); got != 1 { // the first's pins past half end
		t.Fatalf("the second session, within its half, counted %d with the budget full, want 1 (the first shrinks to half)", got)
	}
	if pins, _ := state(); pins > half+1 {
		t.Fatalf("%d pins after the second found no room, want the first's half (%d) and the second's", pins, half)
	}
	if got := lookup(n.c, append(append([]string{}, ps...), rest...), 5*time.Second); got != half {
		t.Errorf("the first session's renewal after the second found no room counted %d, want its half (%d)", got, half)
	}
}

func TestIdleTick(t *testing.T) {
	for _, tc := range []struct{ grace, want time.Duration }{
		{-1, pinTick}, {0, pinTick}, {time.Millisecond, time.Millisecond}, {20 * time.Millisecond, 10 * time.Millisecond}, {time.Hour, pinTick},
	} {
		if got := idleTick(tc.grace); got != tc.want {
			t.Errorf("idleTick(%v) = %v, want %v", tc.grace, got, tc.want)
		}
	}
}
