package daemon

import "testing"

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
