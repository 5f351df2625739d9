package master

import (
	"cmp"
	"slices"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
)

// The transfer area (docs/architecture.md §10 "Placement (one pool)"): the last bytes of an owner's
// segment, where its clients write the values of puts placed on other owners, which
// pull them from there. It holds values only while they are in flight, so its idle
// room is lent to the memory pool instead of standing empty: when the pool has no free
// range and no duplicate left to evict, an allocation borrows a range of the area
// (borrowLocked) before a sole copy is evicted. A transfer that finds no room takes it
// back, evicting the borrowed replicas there (allocXferLocked) — duplicates first,
// then the least recently used — so the area costs the pool only the bytes of the
// transfers in flight, not its whole size.

// borrowLocked takes length bytes of n's idle transfer area for the pool, or nil.
func (s *State) borrowLocked(n *node, length int64) *Allocation {
	a := s.allocXferLocked(n, length, false)
	if a != nil {
		lend(a)
	}
	return a
}

// lend marks a transfer-area allocation as the pool's.
func lend(a *Allocation) {
	a.lent = true
	a.node.lent++
}

// allocXferLocked takes length bytes of n's transfer area for a transfer; with
// takeBack it evicts the replicas the pool borrowed the area for while no range fits.
// nil when the area is too small, or what keeps the room is held or in flight (or
// borrowed, without takeBack).
func (s *State) allocXferLocked(n *node, length int64, takeBack bool) *Allocation {
	if n.xfer == nil || roundUp(length, AllocGranule) > n.xfer.Capacity() {
		return nil
	}
	var victims []takeBackVictim // ranked once: each rescan cost O(borrowed), O(borrowed²) a take-back
	for checked := false; ; checked = true {
		if r, ok := n.xfer.Alloc(length); ok {
			return newXferAllocation(n, r, length)
		}
		if !takeBack || n.lent == 0 {
			return nil
		}
		if !checked {
			if !s.takeBackFitsLocked(n, length) {
				return nil // evicting every borrowed replica it may take would make no room
			}
			victims = s.takeBackVictimsLocked(n)
		}
		var key string
		for key == "" && len(victims) > 0 {
			if v := victims[0].key; s.takeBackMayLocked(n, v) {
				key = v
			}
			victims = victims[1:]
		}
		if key == "" {
			return nil
		}
		if !n.policy.Evict(key) {
			panic("BUG: a take-back's victim is not in the eviction order")
		}
		s.evictMemoryLocked(n, key, n.dups > 0 && s.duplicateLocked(key, n))
	}
}

// takeBackMayLocked reports whether a take-back may evict key's replica on n: it is
// borrowed, in the eviction order (an SSD persist may still read one that is not), and
// neither held nor being written back.
func (s *State) takeBackMayLocked(n *node, key string) bool {
	if !n.borrowed.has(key) {
		return false
	}
	_, in := n.policy.Rank(key)
	r := s.routes[key]
	return in && !s.heldReplicaLocked(r, n) && !s.writingBackLocked(r, n)
}

// takeBackFitsLocked reports whether evicting every borrowed replica of n's transfer
// area that a take-back may evict (takeBackMayLocked) leaves a free range of length
// bytes: when transfers in flight split the area, they would go for nothing.
func (s *State) takeBackFitsLocked(n *node, length int64) bool {
	var freed []Range
	n.borrowed.each(func(k string) bool {
		if !s.takeBackMayLocked(n, k) {
			return true
		}
		a := s.routes[k].replicas[n].memory
		rg := Range{Offset: a.r.Offset - a.base, Size: a.r.Size}
		n.xfer.Free(rg)
		freed = append(freed, rg)
		return true
	})
	fits := n.xfer.Fits(length)
	for _, rg := range freed {
		if !n.xfer.Reserve(rg) {
			panic("BUG: a borrowed range freed for a take-back check cannot be reserved again")
		}
	}
	return fits
}

// allocSourceLocked takes length bytes of n's segment for the source range of a put
// placed on another owner: idle transfer area room, else room of the landing area (never
// lent, so free whenever no get or transfer holds it), else, with takeBack, transfer area
// room taken back from the pool. Without the landing fallback an owner whose area the
// pool has borrowed in full could place no put elsewhere without evicting a value for its
// source: with its reads landing in the landing area, its area stays lent, and puts
// through it stopped reaching an owner that receives none of its own
// (staleNodeLocked).
func (s *State) allocSourceLocked(n *node, length int64, takeBack bool) *Allocation {
	if a := s.allocXferLocked(n, length, false); a != nil {
		return a
	}
	if a := n.allocLanding(length); a != nil {
		return a
	}
	if takeBack {
		return s.allocXferLocked(n, length, true)
	}
	return nil
}

// allocLanding takes length bytes of n's landing area, or nil.
func (n *node) allocLanding(length int64) *Allocation {
	if n.landing == nil {
		return nil
	}
	rg, ok := n.landing.Alloc(length)
	if !ok {
		return nil
	}
	return newAreaAllocation(n, n.landing, n.landingBase, rg, length)
}

// areaCapacity is the size of n's transfer area (0 without one).
func (n *node) areaCapacity() int64 {
	if n.xfer == nil {
		return 0
	}
	return n.xfer.Capacity()
}

// takeBackVictim is a borrowed replica a take-back may evict, with what ranks it.
type takeBackVictim struct {
	key        string
	dup, clean bool
	rank       int64
}

// takeBackVictimsLocked lists the borrowed replicas a take-back may evict
// (takeBackMayLocked) in the order it evicts them: a duplicate before a sole copy, a
// clean page before a dirty one (SSD write-back: writeback.go), then the one the
// eviction order would evict first (Rank; the oldest borrowed on a tie). The node keeps
// its borrowed keys (node.borrowed), so this costs the area's replicas, not the node's:
// drawing them from the eviction order instead cost the trace replay's master a third
// of its time (a put of a full pool whose transfers are in flight searched the order to
// its end, to find nothing free). The take-back checks each again as it comes to it:
// what it evicted before may have changed it.
func (s *State) takeBackVictimsLocked(n *node) []takeBackVictim {
	var out []takeBackVictim
	n.borrowed.each(func(k string) bool {
		if !s.takeBackMayLocked(n, k) {
			return true
		}
		rank, _ := n.policy.Rank(k)
		d := n.dups > 0 && s.duplicateLocked(k, n)
		out = append(out, takeBackVictim{key: k, dup: d, clean: !s.routes[k].replicas[n].dirty || d, rank: rank})
		return true
	})
	slices.SortStableFunc(out, func(a, b takeBackVictim) int {
		switch {
		case a.dup != b.dup:
			return boolOrder(a.dup)
		case a.clean != b.clean:
			return boolOrder(a.clean)
		}
		return cmp.Compare(a.rank, b.rank)
	})
	return out
}

// boolOrder sorts true first: -1 for a true a (b is then false), else 1.
func boolOrder(a bool) int {
	if a {
		return -1
	}
	return 1
}

// getTargetLocked finds the range a get's bytes land in, in the requester n's segment,
// and whether it may become a memory replica at GetDone. An SSD refill becomes the
// key's only memory copy, so it takes room as a put does, or, when the pool has none
// even by eviction, lands as a get that is not promoted. A copy of a value another
// owner holds in memory (kind MEMORY) would be a duplicate, which must cost no other
// value: it is promoted into free room only while the pool keeps free room of the
// transfer area's size beside it (headroom for gets in flight), else by evicting
// other duplicates. A get that is not promoted lands in the owner's landing area (memory
// beyond its pool kept for gets and transfers in flight, --landing-reserve), else in free room of the pool
// or the transfer area, for itself alone; only when there is none (and, on a first attempt,
// no released range of this owner may be on its way back) is a sole copy evicted (the
// eviction order's victim), and the room it frees serves the next such get, since no
// promotion takes it: the gets in flight cost the pool their bytes once.
func (s *State) getTargetLocked(n *node, r *route, kind common.Source) (target *Allocation, promotable bool) {
	promotable = r.promotions < s.opts.maxPromotions()
	if kind == common.Source_SSD && promotable {
		fits := r.len <= n.alloc.Capacity()
		if fits {
			if target = s.allocateLocked(n, r.len); target != nil {
				return target, true
			}
			if s.spareHeld {
				// The first attempt, which spares held duplicates: the server asks the
				// owners for their idle hot-set holdings and tries again, which may
				// promote the refill.
				return nil, false
			}
		}
		// No room in the pool, even by eviction (held ranges fill it, or the value is
		// larger than the pool): the refill lands where a get that is not promoted
		// does (a review: it waited and failed NO_SPACE with the landing area empty).
		promotable = false
	}
	size := roundUp(r.len, AllocGranule)
	if promotable && n.alloc.FreeBytes()-size >= n.areaCapacity() {
		if rg, ok := n.alloc.Alloc(r.len); ok {
			return newAllocation(n, rg, r.len), true
		}
	}
	if target = n.allocLanding(r.len); target != nil {
		return target, false
	}
	if rg, ok := n.alloc.Alloc(r.len); ok {
		return newAllocation(n, rg, r.len), false
	}
	if target = s.allocXferLocked(n, r.len, false); target != nil {
		return target, false
	}
	if promotable {
		if target = s.allocateEvictingLocked(n, r.len, evictDuplicates); target != nil {
			return target, true
		}
	}
	if s.spareHeld && s.soleHoldingsLocked(n) {
		// A get's range its client released may not be acked yet (the owner batches
		// acks): the first attempt fails, the server asks the owners for their hot sets
		// (which flushes their acks) and retries, rather than evict a value for room
		// that is about to be free.
		return nil, false
	}
	return s.allocateLocked(n, r.len), false
}

// soleHoldingsLocked reports whether a holder of n keeps a range no replica shares
// (a get's target that was not promoted, or a replica's range after its eviction).
func (s *State) soleHoldingsLocked(n *node) bool { return n.soleHeld > 0 }
