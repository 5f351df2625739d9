package daemon

import (
	"testing"

	"github.com/fluxkv/fluxkv/metrics"
)

// TestStageSubSlots: small chunks split a slot into sub-slots, a whole slot comes back
// once all of its sub-slots are free, and nothing is handed out twice or beyond the area.
func TestStageSubSlots(t *testing.T) {
	st := newStager(&Owner{}, 2)
	st.mem = make([]byte, 2*stageChunk)
	type taken struct {
		slot int
		sub  bool
	}
	var subs []taken
	seen := map[int]bool{}
	for range 2 * subSlotsPerSlot {
		slot, sub, buf, ok := st.takeSlotLocked(64 << 10)
		if !ok || !sub || len(buf) != stageSubSlot || seen[slot] {
			t.Fatalf("sub-slot %d: ok %v sub %v len %d (seen %v)", len(subs), ok, sub, len(buf), seen[slot])
		}
		seen[slot] = true
		subs = append(subs, taken{slot, sub})
	}
	if _, _, _, ok := st.takeSlotLocked(64 << 10); ok {
		t.Fatal("a sub-slot beyond the area")
	}
	if _, _, _, ok := st.takeSlotLocked(stageChunk); ok {
		t.Fatal("a whole slot while both are split")
	}
	for _, s := range subs[:subSlotsPerSlot-1] { // all but one of the first slot's
		st.giveSlotLocked(s.slot, s.sub)
	}
	if _, _, _, ok := st.takeSlotLocked(stageChunk); ok {
		t.Fatal("a whole slot while one of its sub-slots is in use")
	}
	st.giveSlotLocked(subs[subSlotsPerSlot-1].slot, true)
	slot, sub, buf, ok := st.takeSlotLocked(stageChunk)
	if !ok || sub || len(buf) != stageChunk || slot != subs[0].slot/subSlotsPerSlot {
		t.Fatalf("whole slot after its sub-slots came back: %d %v %v", slot, sub, ok)
	}
	if len(st.subFree) != 0 {
		t.Fatalf("%d sub-slots of a whole slot in use left free", len(st.subFree))
	}
	st.giveSlotLocked(slot, false)
	for _, s := range subs[subSlotsPerSlot:] {
		st.giveSlotLocked(s.slot, s.sub)
	}
	if len(st.free) != 2 || len(st.subFree) != 0 {
		t.Fatalf("after every give back: %d slots free, %d sub-slots", len(st.free), len(st.subFree))
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
