package daemon

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// A persist batch larger than the owner's SSD ring is written and committed in groups
// within half the ring (persistpins.go): no item waits for ring space its own batch holds
// pinned until its commit. Before, the items past the ring's end waited BusyWait each and
// failed ("ring space busy"). The items name no published key, so the master publishes
// none of them and the owner forgets the entries: what is checked is every item's write.
func TestPersistBatchLargerThanRing(t *testing.T) {
	so := ssdOptions(t, 1<<20)
	so.ShardsPerDevice = 1
	so.BusyWait = 3 * time.Second
	n := startNode(t, 8<<20, so, master.Options{})
	if ring := n.o.store.RingBytes(); ring > 1<<20 {
		t.Fatalf("ring of %d bytes, want at most 1 MiB", ring)
	}
	const items, size = 24, 60000 // 1.4 MiB of values
	reqs := make([]*peer.SsdReplicaPersistRequest, items)
	for i := range reqs {
		reqs[i] = &peer.SsdReplicaPersistRequest{Key: fmt.Sprintf("unpublished-%d", i), PutId: int64(i + 1),
			Generation: n.o.generation, Offset: int64(i) * 64 << 10, Len: size}
	}
	errs, err := n.o.persistMany(reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("item %d: %v", i, err)
		}
	}
	if used := n.o.store.Stats().UsedBytes; used != 0 {
		t.Errorf("%d bytes of SSD used by entries the master never published", used)
	}
}

// TestPersistGroupCommitsAsJobsEnd: a persist group commits (and releases the commit
// pins of) the records its jobs wrote as they end, not after its last job (here pulls
// from other owners that answer nothing, each bounded by TransferTimeout, in rounds of
// PERSIST_BATCH_IN_FLIGHT). The ring is FIFO: once other persists wrote a ring's worth
// behind a pinned record, every writer waits for it, up to BusyWait, and fails; the pin
// budget bounds the bytes pinned, not for how long.
func TestPersistGroupCommitsAsJobsEnd(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 1<<20)
	so.ShardsPerDevice = 1
	so.BusyWait = 1500 * time.Millisecond
	n := startNode(t, 8<<20, so, master.Options{}, func(o *Options) { o.TransferTimeout = time.Second })

	// Owners that accept data-plane connections and never answer.
	var silent []string
	for range 24 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.Cleanup(func() { c.Close() })
			}
		}()
		silent = append(silent, ln.Addr().String())
	}
	// Call A: one local record (written at once), then 24 pooled values.
	a := []*peer.SsdReplicaPersistRequest{{Key: "a-local", PutId: 1, Generation: n.o.generation, Offset: 0, Len: 60000}}
	for i, addr := range silent {
		a = append(a, &peer.SsdReplicaPersistRequest{Key: fmt.Sprintf("a-pooled-%d", i), PutId: int64(100 + i), Generation: n.o.generation,
			Offset: 0, Len: 512, SourceNodeId: fmt.Sprintf("ghost-%d", i), SourceGeneration: 1, SourceDataAddr: addr})
	}
	aDone := make(chan []error, 1)
	t0 := time.Now()
	go func() {
		errs, err := n.o.persistMany(a)
		t.Logf("call A took %v", time.Since(t0))
		if err != nil {
			t.Error(err)
		}
		aDone <- errs
	}()
	time.Sleep(200 * time.Millisecond) // a-local is written and pinned
	// Calls B: 1.4 MiB of this owner's values, more than the ring, in calls small enough
	// to fit the pin budget beside A's group: together they lap a-local.
	start := time.Now()
	failed, total := 0, 0
	for call := range 6 {
		var b []*peer.SsdReplicaPersistRequest
		for i := range 4 {
			k := call*4 + i
			b = append(b, &peer.SsdReplicaPersistRequest{Key: fmt.Sprintf("b-%d", k), PutId: int64(1000 + k), Generation: n.o.generation,
				Offset: int64(1+k) * 64 << 10, Len: 60000})
		}
		errs, err := n.o.persistMany(b)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("call B%d done after %v", call, time.Since(start))
		for i, err := range errs {
			total++
			if err != nil {
				failed++
				if failed <= 2 {
					t.Logf("call B%d item %d after %v: %v", call, i, time.Since(start), err)
				}
			}
		}
	}
	aErrs := <-aDone
	t.Logf("call A: local %v; call B took %v", aErrs[0], time.Since(start))
	if failed > 0 {
		t.Errorf("%d of %d values failed: the ring stayed blocked by another call's record, pinned while that call's pulls ran", failed, total)
	}
}

// TestPersistReadWindow: a persist that could not start reading its values' source
// ranges within PersistReadWindow of its call (here: the pin budget held meanwhile)
// fails them unread, UNAVAILABLE. The master released the ranges it kept for the
// persist when its call timed out: read later, they may hold other values, which the
// SSD record (its checksum computed over them) would serve under this key. An owner
// left at the default window (20 s) lowers it to fit a master whose persist timeout,
// sent at registration, is shorter than its default.
func TestPersistReadWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		window time.Duration
		mo     master.Options
	}{
		{"option", 200 * time.Millisecond, master.Options{}},
		{"master's timeout", 0, master.Options{PersistTimeout: 300 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) { testPersistReadWindow(t, tc.window, tc.mo) })
	}
}

func testPersistReadWindow(t *testing.T, window time.Duration, mo master.Options) {
	so := ssdOptions(t, 8<<20)
	n := startNode(t, 8<<20, so, mo, func(o *Options) { o.PersistReadWindow = window })
	if err := n.o.persistPins.Acquire(context.Background(), n.o.persistPins.size); err != nil {
		t.Fatal(err)
	}
	reqs := []*peer.SsdReplicaPersistRequest{{Key: "late", PutId: 1, Generation: n.o.generation, Offset: 0, Len: 60000}}
	type result struct {
		errs []error
		err  error
	}
	done := make(chan result, 1)
	go func() {
		errs, err := n.o.persistMany(reqs)
		done <- result{errs, err}
	}()
	time.Sleep(400 * time.Millisecond) // past the window, the call still waits for the budget
	n.o.persistPins.Release(n.o.persistPins.size)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.errs[0] == nil || !strings.Contains(r.errs[0].Error(), "deadline") {
		t.Fatalf("a value read past the window: %v, want an UNAVAILABLE naming the deadline", r.errs[0])
	}
	if used := n.o.store.Stats().UsedBytes; used != 0 {
		t.Errorf("%d bytes on SSD: a record was written from a source read past its window", used)
	}
}
