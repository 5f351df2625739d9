package daemon

import (
	"slices"

	"github.com/fluxkv/fluxkv/ssd"
)

// The staging area's slots. A chunk of a value is staged in a slot of stageChunk
// bytes, or in a sub-slot when it fits one once aligned for O_DIRECT: a sixteenth of a
// slot (stageSubSlot, 256 KiB: a KV page of a get batch) or a quarter (1 MiB: a larger
// page), the smallest that fits, so that a batch of small values stages four or sixteen
// times as many at once in the same memory. A slot is split into sub-slots of one size
// when a chunk of that size finds none free, and comes back whole once all of its
// sub-slots are free again.

// subSlotsPerSlot and stageSubSlot are the smallest sub-slots': sixteen per slot.
const (
	subSlotsPerSlot = 16
	stageSubSlot    = stageChunk / subSlotsPerSlot
)

// subClass is one size of sub-slot: a slot split into per of them.
type subClass struct {
	per  int
	size int64
}

// subClasses are the sizes of sub-slot, smallest first; a chunk's class is its index
// plus one (0: a whole slot).
var subClasses = [...]subClass{{subSlotsPerSlot, stageSubSlot}, {4, stageChunk / 4}}

// subClassOf is the class of the smallest room that holds n bytes once aligned (0: a
// whole slot).
func subClassOf(n int64) int {
	for i, c := range subClasses {
		if ssd.AlignedLen(n) <= c.size {
			return i + 1
		}
	}
	return 0
}

// takeSlotLocked takes room for a chunk of n bytes: its slot (a sub-slot index, of its
// class, when class > 0) and buffer; ok false when none is free.
// fluxkv_stage_slots_in_use counts the whole slots taken out of free (split ones
// included), not the chunks in them.
func (st *stager) takeSlotLocked(n int64) (slot, class int, buf []byte, ok bool) {
	class = subClassOf(n)
	if class == 0 {
		if len(st.free) == 0 {
			return 0, 0, nil, false
		}
		slot = st.free[len(st.free)-1]
		st.free = st.free[:len(st.free)-1]
		st.metrics.Slots(1)
		off := slot * stageChunk
		return slot, 0, st.mem[off : off+stageChunk : off+stageChunk], true
	}
	c, free := subClasses[class-1], &st.subFree[class-1]
	if len(*free) == 0 {
		if len(st.free) == 0 {
			return 0, 0, nil, false
		}
		whole := st.free[len(st.free)-1]
		st.free = st.free[:len(st.free)-1]
		st.metrics.Slots(1) // a split slot counts once, whatever its sub-slots hold
		for k := c.per - 1; k >= 0; k-- {
			*free = append(*free, whole*c.per+k)
		}
	}
	// The free sub-slot of the fullest split slot: the emptier ones drain and come back
	// whole (the last one freed would keep refilling the slot it was freed from, and a
	// few busy batches would keep every slot split, a whole-slot refill waiting).
	best := len(*free) - 1
	for i, sub := range *free {
		if st.subUsed[sub/c.per] > st.subUsed[(*free)[best]/c.per] {
			best = i
		}
	}
	slot = (*free)[best]
	(*free)[best] = (*free)[len(*free)-1]
	*free = (*free)[:len(*free)-1]
	st.subUsed[slot/c.per]++
	off := int64(slot) * c.size
	return slot, class, st.mem[off : off+c.size : off+c.size], true
}

// giveSlotLocked gives back what takeSlotLocked took.
func (st *stager) giveSlotLocked(slot, class int) {
	if class == 0 {
		st.free = append(st.free, slot)
		st.metrics.Slots(-1)
		return
	}
	c, free := subClasses[class-1], &st.subFree[class-1]
	*free = append(*free, slot)
	whole := slot / c.per
	if st.subUsed[whole]--; st.subUsed[whole] == 0 {
		*free = slices.DeleteFunc(*free, func(s int) bool { return s/c.per == whole })
		st.free = append(st.free, whole)
		st.metrics.Slots(-1)
	}
}

// slotBytes is the staged chunk c's first n bytes.
func (st *stager) slotBytes(c *stagedChunk, n int64) []byte {
	off := int64(c.slot) * stageChunk
	if c.class > 0 {
		off = int64(c.slot) * subClasses[c.class-1].size
	}
	return st.mem[off : off+n]
}
