package daemon

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// TestStageSubSlots: chunks that fit a sub-slot split a slot into sub-slots of the
// smallest size that holds them (sixteen of 256 KiB for pages, four of 1 MiB for
// larger ones), a whole slot comes back once all of its sub-slots are free, and
// nothing is handed out twice, beyond the area or outside its slot.
func TestStageSubSlots(t *testing.T) {
	for _, tc := range []struct {
		n     int64
		class int
		per   int
		size  int64
	}{
		{64 << 10, 1, 16, 256 << 10},
		{256 << 10, 1, 16, 256 << 10},
		{256<<10 + 1, 2, 4, 1 << 20},
		{1 << 20, 2, 4, 1 << 20},
	} {
		st := newStager(&Owner{}, 2)
		st.mem = make([]byte, 2*stageChunk)
		type taken struct {
			slot, class int
		}
		var subs []taken
		seen := map[int]bool{}
		for range 2 * tc.per {
			slot, class, buf, ok := st.takeSlotLocked(tc.n)
			if !ok || class != tc.class || int64(len(buf)) != tc.size || seen[slot] {
				t.Fatalf("%d bytes, sub-slot %d: ok %v class %d len %d (seen %v)", tc.n, len(subs), ok, class, len(buf), seen[slot])
			}
			if b := st.slotBytes(&stagedChunk{slot: slot, class: class}, tc.size); &b[0] != &buf[0] {
				t.Fatalf("%d bytes: slotBytes of sub-slot %d is not its buffer", tc.n, slot)
			}
			seen[slot] = true
			subs = append(subs, taken{slot, class})
		}
		if _, _, _, ok := st.takeSlotLocked(tc.n); ok {
			t.Fatalf("%d bytes: a sub-slot beyond the area", tc.n)
		}
		if _, _, _, ok := st.takeSlotLocked(stageChunk); ok {
			t.Fatalf("%d bytes: a whole slot while both are split", tc.n)
		}
		for _, s := range subs[:tc.per-1] { // all but one of the first slot's
			st.giveSlotLocked(s.slot, s.class)
		}
		if _, _, _, ok := st.takeSlotLocked(stageChunk); ok {
			t.Fatalf("%d bytes: a whole slot while one of its sub-slots is in use", tc.n)
		}
		st.giveSlotLocked(subs[tc.per-1].slot, tc.class)
		slot, class, buf, ok := st.takeSlotLocked(stageChunk)
		if !ok || class != 0 || len(buf) != stageChunk || slot != subs[0].slot/tc.per {
			t.Fatalf("%d bytes: whole slot after its sub-slots came back: %d %v %v", tc.n, slot, class, ok)
		}
		if n := len(st.subFree[tc.class-1]); n != 0 {
			t.Fatalf("%d bytes: %d sub-slots of a whole slot in use left free", tc.n, n)
		}
		st.giveSlotLocked(slot, 0)
		for _, s := range subs[tc.per:] {
			st.giveSlotLocked(s.slot, s.class)
		}
		if len(st.free) != 2 || len(st.subFree[0])+len(st.subFree[1]) != 0 {
			t.Fatalf("%d bytes: after every give back: %d slots free, %v sub-slots", tc.n, len(st.free), st.subFree)
		}
	}
}

// TestStageSubSlotSizesShareTheArea: pages and 1 MiB values staged at once split
// different slots, each of one size.
func TestStageSubSlotSizesShareTheArea(t *testing.T) {
	st := newStager(&Owner{}, 2)
	st.mem = make([]byte, 2*stageChunk)
	page, pc, _, ok := st.takeSlotLocked(64 << 10)
	if !ok || pc != 1 {
		t.Fatal("a page: no sixteenth sub-slot")
	}
	large, lc, _, ok := st.takeSlotLocked(1 << 20)
	if !ok || lc != 2 {
		t.Fatal("1 MiB: no quarter sub-slot")
	}
	if page/subClasses[0].per == large/subClasses[1].per {
		t.Fatalf("a page and a 1 MiB value share slot %d", page/subClasses[0].per)
	}
	if _, _, _, ok := st.takeSlotLocked(stageChunk); ok {
		t.Fatal("a whole slot while both are split")
	}
	st.giveSlotLocked(page, pc)
	st.giveSlotLocked(large, lc)
	if len(st.free) != 2 {
		t.Fatalf("%d slots free after both came back", len(st.free))
	}
}

// TestStageSlotsGaugeCountsSlots: fluxkv_stage_slots_in_use counts the staging area's
// 4 MiB slots in use, as its help says: small chunks sharing one split slot count it
// once, and the gauge cannot exceed the area's slots.
func TestStageSlotsGaugeCountsSlots(t *testing.T) {
	m := metrics.New()
	st := newStager(&Owner{opts: Options{Metrics: m}}, 2)
	st.mem = make([]byte, 2*stageChunk)
	inUse := func() float64 {
		t.Helper()
		mfs, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "fluxkv_stage_slots_in_use" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no fluxkv_stage_slots_in_use")
		return 0
	}
	small := &stageSession{st: st, chunks: make([]stagedChunk, 3), freed: make(chan struct{}, 1)}
	large := &stageSession{st: st, chunks: make([]stagedChunk, 1), freed: make(chan struct{}, 1)}
	for i := range small.chunks {
		if small.Take(i, 64<<10) == nil {
			t.Fatalf("small chunk %d: no sub-slot", i)
		}
	}
	if v := inUse(); v != 1 {
		t.Errorf("fluxkv_stage_slots_in_use = %v with 3 small chunks in the sub-slots of one slot, want 1", v)
	}
	if large.Take(0, stageChunk) == nil {
		t.Fatal("large chunk: no slot")
	}
	if v := inUse(); v != 2 {
		t.Errorf("fluxkv_stage_slots_in_use = %v with one slot split and one whole in use, want 2", v)
	}
	st.mu.Lock()
	for i := range small.chunks {
		small.freeSlotLocked(&small.chunks[i])
	}
	large.freeSlotLocked(&large.chunks[0])
	st.mu.Unlock()
	if v := inUse(); v != 0 {
		t.Errorf("fluxkv_stage_slots_in_use = %v after every chunk gave its slot back, want 0", v)
	}
}

// TestStageSubSlotsFullestFirst: a chunk takes a free sub-slot of the fullest split
// slot, so the emptier one drains and comes back whole: slot A holds 15 pages and B one
// (B's other one freed last), a page goes to A, and once B's last page is freed a whole
// slot is free. (Taking the sub-slot freed last would refill B, and no whole slot would
// come back while pages keep coming.)
func TestStageSubSlotsFullestFirst(t *testing.T) {
	st := newStager(&Owner{}, 2)
	st.mem = make([]byte, 2*stageChunk)
	const page = 64 << 10
	var a, b []int
	for range subSlotsPerSlot + 2 {
		slot, _, _, ok := st.takeSlotLocked(page)
		if !ok {
			t.Fatal("no sub-slot for a page in an empty area")
		}
		if len(a) < subSlotsPerSlot {
			a = append(a, slot)
		} else {
			b = append(b, slot)
		}
	}
	st.giveSlotLocked(a[0], 1)
	st.giveSlotLocked(b[0], 1)
	slot, _, _, ok := st.takeSlotLocked(page)
	if !ok || slot/subSlotsPerSlot != a[0]/subSlotsPerSlot {
		t.Fatalf("a page went to sub-slot %d (ok %v): want one of the fullest slot's, %d's", slot, ok, a[0]/subSlotsPerSlot)
	}
	st.giveSlotLocked(b[1], 1)
	if _, class, _, ok := st.takeSlotLocked(stageChunk); !ok || class != 0 {
		t.Fatal("no whole slot once the emptier split slot's pages were freed")
	}
}

// TestStageRefillLeavesSlotsForOthers: one refill of a large value whose requester
// stopped pulling reads ahead until it holds stageSessionHeld slots, not the whole area,
// so another requester's refill still gets slots. (It held all 12: every other refill
// from the owner failed until the watchdog ended the first, about 6 s.)
func TestStageRefillLeavesSlotsForOthers(t *testing.T) {
	st := newStager(&Owner{}, stageSessionSlots)
	begin := func(id int64, n int64) *stageSession {
		_, cancel := context.WithCancelCause(context.Background())
		s, err := st.begin(&peer.SsdStageReadRequest{GetId: id, Key: fmt.Sprint("k", id), Len: n}, cancel)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := begin(1, 64<<20)
	held := 0
	for i := range a.chunks { // the load reads ahead; nobody pulls
		if a.Take(i, stageChunk) == nil {
			break
		}
		if err := a.deliver(i, 0, 0, nil); err != nil {
			t.Fatal(err)
		}
		held++
	}
	if held != stageSessionHeld || held >= stageSessionSlots {
		t.Fatalf("one refill holds %d of %d slots, want %d", held, stageSessionSlots, stageSessionHeld)
	}
	b := begin(2, 16<<20)
	for i := range peer.STAGE_READS_IN_FLIGHT {
		if b.Take(int(i), stageChunk) == nil {
			t.Fatalf("another refill got %d slots beside the stalled one, want %d", i, peer.STAGE_READS_IN_FLIGHT)
		}
	}
}

// TestStageEndsKeptForLatePulls: an ended refill is remembered stageEndedKept, across
// other refills ending, so a pull of it that comes late (the pulls before it on its
// pipeline waited for their chunks) is answered at once; then it is forgotten. It was
// forgotten after 2 s, and the late pull waited 2 s for a session that would not come.
func TestStageEndsKeptForLatePulls(t *testing.T) {
	e := endedStages{errs: make(map[int64]error)}
	t0 := time.Now()
	e.add(1, errStageCompleted, t0)
	e.add(2, errStageCompleted, t0.Add(stageSessionWait+stageChunkWait/2))
	if e.errs[1] == nil {
		t.Fatalf("a refill ended %v before another one was forgotten", stageSessionWait+stageChunkWait/2)
	}
	e.add(3, errStageCompleted, t0.Add(stageEndedKept+time.Second))
	if e.errs[1] != nil || e.errs[2] == nil || len(e.order) != 2 {
		t.Fatalf("after %v: ends %v (%d kept), want 2 and 3", stageEndedKept+time.Second, e.errs, len(e.order))
	}
}
