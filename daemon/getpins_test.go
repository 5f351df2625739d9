package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// nodeHolders is the number of holders the master records for owner n1 (pins
// included).
func nodeHolders(t *testing.T, m *master.Server) int64 {
	t.Helper()
	var holders int64 = -1
	m.Inspect(func(st *master.State) {
		for _, ms := range st.Members() {
			if ms.NodeId == "n1" {
				holders = ms.Holders
			}
		}
	})
	if holders < 0 {
		t.Fatal("the master does not know n1")
	}
	return holders
}

// TestGetPinTable: the get-target table at the unit level. Targets of plans this owner
// writes are tracked (a local hit is not), reported as pins with the get id and marked
// pinned; a pinned target's end fails the get and acks the pin, an unpinned one's does
// neither; a plan answered across a registration is refused; a local hit accepted
// before a registration is stale after it.
func TestGetPinTable(t *testing.T) {
	n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true}, func(o *Options) { o.AckDelay = time.Hour })
	o := n.o
	o.mu.Lock()
	defer o.mu.Unlock()
	epoch := o.regEpoch
	refill := &mp.GetStartResponse{GetId: 1001, TargetOffset: 4096, Len: 1000, Source: common.Source_SSD, SourceNodeId: "n1", HolderId: 1000}
	pull := &mp.GetStartResponse{GetId: 1002, TargetOffset: 8192, Len: 512, Source: common.Source_MEMORY, SourceNodeId: "n2"}
	hit := &mp.GetStartResponse{Done: true, HolderId: 1003, TargetOffset: 0, Len: 512}
	outside := &mp.GetStartResponse{GetId: 1004, TargetOffset: o.seg.Size() - 100, Len: 512, Source: common.Source_MEMORY, SourceNodeId: "n2"}
	var ts []*getTarget
	for _, p := range []*mp.GetStartResponse{refill, pull, hit, outside} {
		tg, err := o.acceptPlanLocked(p, epoch)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tg)
	}
	if len(o.gets.m) != 2 || !ts[0].tracked || !ts[1].tracked || ts[2].tracked || ts[3].tracked {
		t.Fatalf("tracked %d targets (%v %v %v %v), want the refill and the pull", len(o.gets.m), ts[0].tracked, ts[1].tracked, ts[2].tracked, ts[3].tracked)
	}
	// The pull ends before the registration: not stale, nothing acked.
	if o.endGetLocked(ts[1]) {
		t.Fatal("an unpinned get of the current registration is stale")
	}
	// What register does under mu.
	pins := o.getPinsLocked()
	o.regEpoch++
	want := []*mp.PinnedRange{{PinId: 1001, Offset: 4096, Len: 1000}}
	if len(pins) != 1 || *pins[0] != *want[0] {
		t.Fatalf("pins %v, want %v", pins, want)
	}
	if !ts[0].pinned || !o.getPinnedIDLocked(1001) {
		t.Fatal("the reported target is not marked pinned")
	}
	if _, err := o.acceptPlanLocked(pull, epoch); wire.CodeOf(err) != common.ErrorCode_UNAVAILABLE {
		t.Fatalf("a plan answered across a registration: %v, want UNAVAILABLE", err)
	}
	if !o.endGetLocked(ts[0]) || !o.endGetLocked(ts[0]) {
		t.Fatal("a pinned get is not stale")
	}
	if !o.endGetLocked(ts[2]) {
		t.Fatal("a local hit planned before the registration is not stale after it")
	}
	if o.endGetLocked(nil) {
		t.Fatal("a nil target is stale")
	}
	if len(o.gets.m) != 0 {
		t.Fatalf("%d targets left in the table", len(o.gets.m))
	}
	o.acks.mu.Lock()
	acked := slices.Clone(o.acks.pending)
	o.acks.mu.Unlock()
	if !slices.Equal(acked, []int64{1001}) {
		t.Fatalf("acked %v, want the pinned get id 1001 once", acked)
	}
	if pins := o.getPinsLocked(); len(pins) != 0 {
		t.Fatalf("pins after every get ended: %v", pins)
	}
}

// getPinnedIDLocked is getPinned under a held Owner.mu (tests).
func (o *Owner) getPinnedIDLocked(id int64) bool {
	tg := o.gets.m[id]
	return tg != nil && tg.pinned
}

// TestGetPinAcrossRegister: an SSD refill whose target was written while the owner
// registered with a restarted master. The registration reports the target as a pin (the
// new master holds it), the get fails UNAVAILABLE instead of handing out bytes the new
// master never published, and the pin is acked: the new master holds nothing of n1
// once the acks are flushed. The owner serves on.
func TestGetPinAcrossRegister(t *testing.T) {
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
	n.o.gets.afterWrite = func(getID int64) {
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
			n.o.mu.Lock()
			if n.o.getPinnedIDLocked(getID) {
				pinnedID.Store(getID)
			}
			n.o.mu.Unlock()
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
	left := len(n.o.gets.m)
	n.o.gets.afterWrite = nil
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
