package daemon

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// TestBatchStageReadsAheadOfPulls: a BatchSsdStageRead of more pages than
// STAGE_BATCH_IN_FLIGHT reads all of them while none has been pulled yet (an item gives
// its place among the reads back once its chunk is read, not once it is pulled), up to
// stageBatchHeldSlots slots' worth; the next ones are read as the first are pulled.
// Then every pull gets its page byte-exact and every item is answered served.
func TestBatchStageReadsAheadOfPulls(t *testing.T) {
	t.Parallel()
	n := startNode(t, 4<<20, ssdOptions(t, 64<<20), master.Options{Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true})
	held := stageBatchHeldSlots * subSlotsPerSlot
	pages := held + 8 // more than are read ahead: the last ones wait for pulls
	want := map[string][]byte{}
	for i := range pages {
		k := fmt.Sprintf("page-%d", i)
		want[k] = value(i, 64<<10+i*131)
		if err := n.c.Put(k, want[k]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 { // 3x DRAM: the pages are written back to SSD
		if err := n.c.Put(fmt.Sprintf("filler-%d", i), value(100+i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	committed := map[string]int64{}
	for _, e := range n.o.store.Committed() {
		committed[e.Key] = e.PutID
	}
	var items []*peer.SsdStageReadRequest
	for i := range pages {
		k := fmt.Sprintf("page-%d", i)
		putID, ok := committed[k]
		if !ok {
			t.Fatalf("%s is not on the SSD", k)
		}
		items = append(items, &peer.SsdStageReadRequest{Key: k, PutId: putID, GetId: int64(9000 + i), TargetNodeId: "n2",
			Len: int64(len(want[k])), Generation: n.o.generation, DeadlineMs: 30_000})
	}
	if int(peer.STAGE_BATCH_IN_FLIGHT) >= held {
		t.Fatalf("STAGE_BATCH_IN_FLIGHT %d reads at once, the batch holds %d: nothing to read ahead", peer.STAGE_BATCH_IN_FLIGHT, held)
	}
	type answer struct {
		errs []error
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		errs, err := n.o.batchStageRead(&peer.BatchSsdStageReadRequest{Items: items})
		done <- answer{errs, err}
	}()
	ready := func() int {
		st := n.o.stager
		st.mu.Lock()
		defer st.mu.Unlock()
		c := 0
		for _, it := range items {
			if s := st.sessions[it.GetId]; s != nil && s.chunks[0].ready {
				c++
			}
		}
		return c
	}
	waitUntil(t, func() bool { return ready() >= held })
	time.Sleep(50 * time.Millisecond) // a read beyond the held ones would show now
	if got := ready(); got != held {
		t.Fatalf("%d chunks read before any pull, want %d (stageBatchHeldSlots)", got, held)
	}
	for _, it := range items { // in order, as the requester pulls
		buf, release, err := n.o.stager.open(it.GetId, 0, it.Len)
		if err != nil {
			t.Fatalf("pull of %s: %v", it.Key, err)
		}
		if !bytes.Equal(buf[:it.Len], want[it.Key]) {
			t.Errorf("pull of %s: wrong bytes", it.Key)
		}
		release()
	}
	select {
	case a := <-done:
		if a.err != nil {
			t.Fatal(a.err)
		}
		for i, err := range a.errs {
			if err != nil {
				t.Errorf("%s: %v", items[i].Key, err)
			}
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the batch stage read did not answer after every pull")
	}
}
