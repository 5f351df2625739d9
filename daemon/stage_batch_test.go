package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// stagedPages starts a node whose SSD holds pages values of about 64 KiB that are no
// longer in its memory, and returns one BatchSsdStageRead item per page (get ids from
// 9000, as a requester n2 would send them) and each page's bytes.
func stagedPages(t *testing.T, pages int) (*node, []*peer.SsdStageReadRequest, map[string][]byte) {
	return stagedValues(t, pages, func(i int) int { return 64<<10 + i*131 })
}

// stagedValues is stagedPages with values of size(i) bytes.
func stagedValues(t *testing.T, pages int, size func(i int) int) (*node, []*peer.SsdStageReadRequest, map[string][]byte) {
	t.Helper()
	n := startNode(t, 4<<20, ssdOptions(t, 64<<20), master.Options{Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true})
	want := map[string][]byte{}
	for i := range pages {
		k := fmt.Sprintf("page-%d", i)
		want[k] = value(i, size(i))
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
	return n, items, want
}

// TestBatchStageReadsAheadOfPulls: a BatchSsdStageRead of more values than it reads at
// once (pages: STAGE_BATCH_IN_FLIGHT; values of up to 1 MiB: stageBatchLarge) reads
// more of them while none has been pulled yet (an item frees its reader once its chunk
// is read, and its place once it is pulled), up to stageBatchHeldSlots slots' worth of
// sub-slots, packed in that many slots: 32 pages, 8 values of 1 MiB; the next ones are
// read as the first are pulled. Then every pull gets its value byte-exact and every item is answered
// served.
func TestBatchStageReadsAheadOfPulls(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		reads, held int
		size        func(i int) int
	}{
		{"pages", int(peer.STAGE_BATCH_IN_FLIGHT), stageBatchHeldSlots * subSlotsPerSlot, func(i int) int { return 64<<10 + i*131 }},
		{"1MiB", stageBatchLarge, stageBatchHeldSlots * 4, func(i int) int { return 1<<20 - i*4096 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			readsAheadOfPulls(t, tc.reads, tc.held, tc.size)
		})
	}
}

func readsAheadOfPulls(t *testing.T, reads, held int, size func(i int) int) {
	n, items, want := stagedValues(t, held+4, size) // more than are read ahead: the last ones wait for pulls
	if reads >= held {
		t.Fatalf("%d reads at once, the batch holds %d: nothing to read ahead", reads, held)
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
	st := n.o.stager
	st.mu.Lock()
	inUse := cap(st.free) - len(st.free)
	st.mu.Unlock()
	if inUse != stageBatchHeldSlots { // the held values packed in sub-slots, not a slot each
		t.Fatalf("%d staging slots in use for %d held values, want %d", inUse, held, stageBatchHeldSlots)
	}
	for _, it := range items { // in order, as the requester pulls
		buf, release, err := n.o.stager.open(it.GetId, 0, it.Len, nil)
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

// TestBatchStageReadAbandoned: a requester that pulls nothing of its BatchSsdStageRead
// (gone, or stuck). Every item is answered UNAVAILABLE (nothing is wrong with the
// records: the requester keeps its SSD replicas) at the call's one deadline, the items
// read and left unpulled and the ones never read alike (each of those waited a deadline
// of its own after the first ones': twice as long), and every session and staging slot
// is given back.
func TestBatchStageReadAbandoned(t *testing.T) {
	t.Parallel()
	n, items, _ := stagedPages(t, stageBatchHeldSlots*subSlotsPerSlot+8)
	limit := n.o.batchStageLimit(items)
	start := time.Now()
	done := batchStageReadAsync(t, n, items)
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(limit + 60*time.Second):
		t.Fatal("the abandoned batch stage read did not answer")
	}
	// The deadline is a timer: what follows it is the unwinding of 40 sessions. A
	// deadline per wave of items would answer after two limits.
	if took := time.Since(start); took > limit*3/2 {
		t.Errorf("answered after %v: more than the call's deadline of %v", took, limit)
	}
	checkAbandoned(t, n, items, errs)
}

// TestBatchStageReadFailedItemEndsAtOnce: an item whose read fails (here: a put id the
// SSD does not hold) ends at once: its pull is refused while an earlier item still
// waits for its own pull, not when the items before it are done; then every item is
// answered (the failed read as KEY_NOT_FOUND: the requester drops that SSD replica).
func TestBatchStageReadFailedItemEndsAtOnce(t *testing.T) {
	t.Parallel()
	n, items, want := stagedPages(t, 2)
	items[1].PutId++ // not on the SSD: its read fails
	done := batchStageReadAsync(t, n, items)
	st := n.o.stager
	waitRead(t, st, items[:1])
	refused := make(chan error, 1)
	go func() {
		_, release, err := st.open(items[1].GetId, 0, items[1].Len, nil)
		if err == nil {
			release()
		}
		refused <- err
	}()
	select {
	case err := <-refused:
		if !errors.Is(err, transfer.ErrFenced) {
			t.Errorf("the pull of the item whose read failed: %v, want a refusal", err)
		}
	case <-time.After(stageChunkWait / 2):
		t.Fatal("the pull of the item whose read failed waits while the item before it is unpulled")
	}
	buf, release, err := st.open(items[0].GetId, 0, items[0].Len, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:items[0].Len], want[items[0].Key]) {
		t.Error("the first item: wrong bytes")
	}
	release()
	errs := <-done
	if errs[0] != nil || wire.CodeOf(errs[1]) != common.ErrorCode_KEY_NOT_FOUND {
		t.Errorf("answers %v, want the first served and the second KEY_NOT_FOUND", errs)
	}
}

// TestStageOpenAlive: a staged pull waiting at the stager (here for a session that
// does not come) calls alive every transfer.WaitInterval, without the stager's lock
// (alive writes to the puller's socket), and stops waiting with alive's error, lending
// nothing.
func TestStageOpenAlive(t *testing.T) {
	t.Parallel()
	n := startNode(t, 4<<20, ssdOptions(t, 64<<20), master.Options{Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true})
	st := n.o.stager
	gone := errors.New("the puller is gone")
	calls := 0
	start := time.Now()
	_, _, err := st.open(12345, 0, 4096, func() error {
		if !st.mu.TryLock() {
			t.Error("alive called under the stager's lock")
		} else {
			st.mu.Unlock()
		}
		if calls++; calls == 2 {
			return gone
		}
		return nil
	})
	if !errors.Is(err, gone) || calls != 2 {
		t.Fatalf("open ended with %v after %d calls of alive, want alive's error after 2", err, calls)
	}
	if took := time.Since(start); took < 2*transfer.WaitInterval || took >= stageSessionWait {
		t.Errorf("alive failed the second time after %v: want it every %v, before the session wait of %v", took, transfer.WaitInterval, stageSessionWait)
	}
}

// TestBatchStageLimit: a BatchSsdStageRead's one deadline is the refill deadline of
// all its items' bytes together (they are pulled one after another), capped by the
// requester's deadline_ms; the longest single item's deadline (about 5 s whatever the
// batch) cut a steady requester of a large batch off.
func TestBatchStageLimit(t *testing.T) {
	o := &Owner{}
	items := func(n int, size int64, deadlineMs int64) []*peer.SsdStageReadRequest {
		var its []*peer.SsdStageReadRequest
		for range n {
			its = append(its, &peer.SsdStageReadRequest{Len: size, DeadlineMs: deadlineMs})
		}
		return its
	}
	for _, tc := range []struct {
		name     string
		items    []*peer.SsdStageReadRequest
		stageMax time.Duration // bounds.stageMax: lower under a master with a short in-flight TTL
		want     time.Duration
	}{
		{"32 pages", items(32, 64<<10, 60_000), stageMaxDeadline, stageBase + 62500*time.Microsecond},
		{"256 of 4 MiB", items(256, stageChunk, 60_000), stageMaxDeadline, stageBase + 32*time.Second},
		{"capped by deadline_ms", items(256, stageChunk, 9_000), stageMaxDeadline, 9 * time.Second},
		{"capped by the longest deadline_ms", append(items(255, stageChunk, 7_000), items(1, stageChunk, 9_000)...), stageMaxDeadline, 9 * time.Second},
		{"capped by stageMax", items(256, stageChunk, 0), 20 * time.Second, 20 * time.Second},
		{"invalid items count nothing", append(items(2, stageChunk+1, 60_000), nil), stageMaxDeadline, stageBase},
	} {
		o.inForce.Store(&bounds{stageMax: tc.stageMax})
		if got := o.batchStageLimit(tc.items); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestBatchStageReadUnpulled: a BatchSsdStageRead whose requester stopped pulling
// (its read items waited stageUnpulled unpulled, and no pull came as long: here those
// times are set back)
// answers every item UNAVAILABLE then, not at its deadline, which for a large batch
// is far later; every session and slot goes back.
func TestBatchStageReadUnpulled(t *testing.T) {
	t.Parallel()
	n, items, _ := stagedPages(t, stageBatchHeldSlots*subSlotsPerSlot+8)
	limit := n.o.batchStageLimit(items)
	st := n.o.stager
	start := time.Now()
	done := batchStageReadAsync(t, n, items)
	waitRead(t, st, items[:1])
	setBack(st, stageUnpulled, stageUnpulled)
	var errs []error
	select {
	case errs = <-done:
	case <-time.After(limit + 60*time.Second):
		t.Fatal("the unpulled batch stage read did not answer")
	}
	if took := time.Since(start); took >= limit {
		t.Errorf("answered after %v: at the call's deadline (%v), not once a read item waited unpulled", took, limit)
	}
	checkAbandoned(t, n, items, errs)
}

// TestBatchStageReadSlowPullsNotUnpulled: a requester that keeps pulling keeps its
// batch, however long its read items wait: a pipeline whose earlier pulls wait for
// slow reads leaves items read early unpulled past stageUnpulled. Here the read items'
// ready times are set back past it, and the last pull's to 2 s short of it; the
// requester pulls one item every 300 ms: no pull is refused until the call's deadline.
func TestBatchStageReadSlowPullsNotUnpulled(t *testing.T) {
	t.Parallel()
	n, items, want := stagedPages(t, 16)
	limit := n.o.batchStageLimit(items)
	st := n.o.stager
	start := time.Now()
	done := batchStageReadAsync(t, n, items)
	defer func() { <-done }()
	waitRead(t, st, items)
	// Every chunk unpulled for longer than stageUnpulled, and the last pull 2 s short
	// of it: only the pulls below keep the watchdog away.
	setBack(st, stageUnpulled, stageUnpulled-2*time.Second)
	pulled := 0
	for _, it := range items {
		if time.Since(start) > limit-time.Second {
			break // the call's deadline is near: the pulls after it may be refused
		}
		buf, release, err := st.open(it.GetId, 0, it.Len, nil)
		if err != nil {
			t.Fatalf("%v after the start, %d pulled: pull of %s refused: %v", time.Since(start).Round(time.Millisecond), pulled, it.Key, err)
		}
		if !bytes.Equal(buf[:it.Len], want[it.Key]) {
			t.Errorf("pull of %s: wrong bytes", it.Key)
		}
		release()
		pulled++
		time.Sleep(300 * time.Millisecond)
	}
	if pulled < 8 {
		t.Errorf("only %d pulls before the deadline: the test proves nothing", pulled)
	}
}

// TestBatchStageReadSendingNotUnpulled: a chunk on its way to the requester counts as
// a pull going on (a send may take several progress timeouts on a slow link) while the
// batch's other read items wait unpulled. Here one item is lent to its pull, and every
// time is set back past stageUnpulled: the watchdog's next look leaves the batch alone.
func TestBatchStageReadSendingNotUnpulled(t *testing.T) {
	t.Parallel()
	n, items, _ := stagedPages(t, 16)
	st := n.o.stager
	done := batchStageReadAsync(t, n, items)
	defer func() { <-done }()
	waitRead(t, st, items)
	_, release, err := st.open(items[0].GetId, 0, items[0].Len, nil)
	if err != nil {
		t.Fatal(err)
	}
	setBack(st, stageUnpulled, stageUnpulled)
	time.Sleep(stageUnpulled/4 + 500*time.Millisecond) // past the watchdog's next look
	_, release1, err := st.open(items[1].GetId, 0, items[1].Len, nil)
	release()
	if err != nil {
		t.Fatalf("the next pull, after a chunk was being sent for %v: %v", stageUnpulled/4+500*time.Millisecond, err)
	}
	release1()
}

// batchStageReadAsync runs n's BatchSsdStageRead of items in the background: its
// answers come on the channel.
func batchStageReadAsync(t *testing.T, n *node, items []*peer.SsdStageReadRequest) <-chan []error {
	done := make(chan []error, 1)
	go func() {
		errs, err := n.o.batchStageRead(&peer.BatchSsdStageReadRequest{Items: items})
		if err != nil {
			t.Error(err)
		}
		done <- errs
	}()
	return done
}

// waitRead waits until the chunk of every item is read.
func waitRead(t *testing.T, st *stager, items []*peer.SsdStageReadRequest) {
	t.Helper()
	waitUntil(t, func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		for _, it := range items {
			if s := st.sessions[it.GetId]; s == nil || !s.chunks[0].ready {
				return false
			}
		}
		return true
	})
}

// setBack sets every session's last pull back by pulled, and every read chunk's ready
// time back by ready, as if that long had passed.
func setBack(st *stager, ready, pulled time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, s := range st.sessions {
		s.pulledAt = s.pulledAt.Add(-pulled)
		for i := range s.chunks {
			if s.chunks[i].ready {
				s.chunks[i].readyAt = s.chunks[i].readyAt.Add(-ready)
			}
		}
	}
}

// checkAbandoned checks the answers errs of a BatchSsdStageRead of items whose
// requester pulled nothing: every item UNAVAILABLE (nothing is wrong with the records),
// and every session and staging slot given back.
func checkAbandoned(t *testing.T, n *node, items []*peer.SsdStageReadRequest, errs []error) {
	t.Helper()
	for i, err := range errs {
		if wire.CodeOf(err) != common.ErrorCode_UNAVAILABLE {
			t.Errorf("%s: %v, want UNAVAILABLE", items[i].Key, err)
		}
	}
	if idle, why := stagerIdle(n); !idle {
		t.Errorf("after the batch: %s", why)
	}
}

// stagerIdle reports whether n's stager holds no session and every staging slot is
// free (why says what it holds).
func stagerIdle(n *node) (idle bool, why string) {
	st := n.o.stager
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.sessions) == 0 && len(st.free) == cap(st.free),
		fmt.Sprintf("%d sessions, %d of %d slots free", len(st.sessions), len(st.free), cap(st.free))
}
