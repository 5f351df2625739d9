package daemon

import (
	"slices"

	"github.com/fluxkv/fluxkv/ssd"
)

// The staging area's slots. A chunk of a value is staged in a slot of stageChunk
// bytes; a small one (a KV page of a get batch: up to stageSubSlot bytes once aligned
// for O_DIRECT) in a sub-slot, a sixteenth of a slot, so that a batch of small values
// stages sixteen times as many at once in the same memory. A slot is split into
// sub-slots when a small chunk finds none free, and comes back whole once all of its
// sub-slots are free again.

const (
	subSlotsPerSlot = 16
	stageSubSlot    = stageChunk / subSlotsPerSlot
)

// takeSlotLocked takes room for a chunk of n bytes: its slot (a sub-slot index when sub)
// and buffer; ok false when none is free. fluxkv_stage_slots_in_use counts the whole
// slots taken out of free (split ones included), not the chunks in them.
func (st *stager) takeSlotLocked(n int64) (slot int, sub bool, buf []byte, ok bool) {
	if ssd.AlignedLen(n) <= stageSubSlot {
		if len(st.subFree) == 0 {
			if len(st.free) == 0 {
				return 0, false, nil, false
			}
			whole := st.free[len(st.free)-1]
			st.free = st.free[:len(st.free)-1]
			st.metrics.Slots(1) // a split slot counts once, whatever its sub-slots hold
			for k := subSlotsPerSlot - 1; k >= 0; k-- {
				st.subFree = append(st.subFree, whole*subSlotsPerSlot+k)
			}
		}
		slot = st.subFree[len(st.subFree)-1]
		st.subFree = st.subFree[:len(st.subFree)-1]
		st.subUsed[slot/subSlotsPerSlot]++
		off := slot * stageSubSlot
		return slot, true, st.mem[off : off+stageSubSlot : off+stageSubSlot], true
	}
	if len(st.free) == 0 {
		return 0, false, nil, false
	}
	slot = st.free[len(st.free)-1]
	st.free = st.free[:len(st.free)-1]
	st.metrics.Slots(1)
	off := slot * stageChunk
	return slot, false, st.mem[off : off+stageChunk : off+stageChunk], true
}

// giveSlotLocked gives back what takeSlotLocked took.
func (st *stager) giveSlotLocked(slot int, sub bool) {
	if !sub {
		st.free = append(st.free, slot)
		st.metrics.Slots(-1)
		return
	}
	st.subFree = append(st.subFree, slot)
	whole := slot / subSlotsPerSlot
	if st.subUsed[whole]--; st.subUsed[whole] == 0 {
		st.subFree = slices.DeleteFunc(st.subFree, func(s int) bool { return s/subSlotsPerSlot == whole })
		st.free = append(st.free, whole)
		st.metrics.Slots(-1)
	}
}

// slotBytes is the staged chunk c's first n bytes.
func (st *stager) slotBytes(c *stagedChunk, n int64) []byte {
	off := c.slot * stageChunk
	if c.sub {
		off = c.slot * stageSubSlot
	}
	return st.mem[off : off+int(n)]
}
