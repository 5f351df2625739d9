package master

// SSD write-back (Options.SSDAdmit = SSDAdmitEvict; docs/ssd.md "What reaches SSD"): a
// KV page reaches SSD as it nears the end of its node's eviction order, not at its put,
// so that flash holds what DRAM evicts rather than a second copy of what DRAM holds: the
// two tiers together keep about a DRAM's worth more distinct pages. A page is published
// dirty (pagedirty.go) and enters the eviction order at once; each node keeps the pages
// it would evict next, WriteBackAhead of its segment, written back or being written
// (writeAheadLocked, after every publish and eviction), by the persists of the put path
// (the SSD pool's choice of owner, batched calls). A page being written back keeps its
// range (the persist holds a reference) and is skipped, not passed, by eviction; a dirty
// page eviction reaches first has its write-back started then and is skipped too, so a
// page never leaves memory dirty: when puts outrun the SSD, allocations wait for
// write-backs to end (the server retries NO_SPACE up to AllocWait), as puts wait for
// their persists with SSDAdmitPut. (Letting eviction take the dirty pages instead lost
// a sixth of the pages of a 3-owner trace replay, whose write-backs pull the bytes to
// other owners' rings.) A page no owner has SSD room for, or whose write-back failed,
// stays memory-only. Plain keys, and every key with SSDAdmitPut, are persisted at their
// put as before.

// writeBackLocked reports whether a page published now waits for the write-back
// rather than a persist at its put.
func (s *State) writeBackLocked(r *route) bool {
	return s.opts.SSDAdmit == SSDAdmitEvict && r.page
}

// unwrittenPageLocked makes n's new memory replica of key (route r: published, or
// reported to a new master) dirty when r is a page that waits for the write-back, no
// replica of it is on SSD and an owner has SSD room for it.
func (s *State) unwrittenPageLocked(key string, r *route, n *node) {
	if s.writeBackLocked(r) && !r.hasSSD() && s.persistNodeLocked(n, r.len) != nil {
		s.markDirtyLocked(key, r, n)
		s.writeAheadLocked(n)
	}
}

// writeAheadLocked starts the write-back of n's dirty pages, the next victims first,
// until those written back or being written ahead of its evictions weigh WriteBackAhead
// of its segment, or no owner can persist one. The persists go out with the call that
// made them (takeWriteBacksLocked).
func (s *State) writeAheadLocked(n *node) {
	pages := n.policy.pages
	if len(pages.dirty) == 0 || n.tombed {
		return
	}
	want := int64(float64(n.alloc.Capacity()) * s.opts.WriteBackAhead)
	for pages.ahead < want {
		key, _, ok := pages.takeDirty()
		if !ok {
			return
		}
		s.startWriteBackLocked(key, n)
	}
}

// writeBackNowLocked starts the write-back of n's dirty replica of key out of turn:
// eviction reached it before writeAheadLocked did (a page put under an old parent ranks
// with it, below the pages already ahead), and skips it until it is written.
func (s *State) writeBackNowLocked(key string, n *node) {
	if n.policy.pages.takeDirtyKey(key) {
		s.startWriteBackLocked(key, n)
	}
}

// startWriteBackLocked persists n's replica of page key, just taken from the dirty
// pages: unless another replica of the version is on SSD or being written. A page that
// no owner has SSD room for stays memory-only.
func (s *State) startWriteBackLocked(key string, n *node) {
	r := s.routes[key]
	if r == nil || r.memoryReplica(n) == nil {
		panic("BUG: a dirty page without a memory replica on its node")
	}
	r.replicas[n].dirty = false
	if r.hasSSD() || s.persists[r.putID] != nil {
		return // written back already (another replica's), or being written
	}
	t := s.persistTaskLocked(key, r.putID, n, r.memoryReplica(n))
	if t == nil {
		n.policy.pages.unahead(key)
		return
	}
	s.persists[r.putID].writeBack = true
	s.writeBacks = append(s.writeBacks, t)
}

// writeBackDoneLocked ends the write-back of pp: a failed one leaves the page memory-only
// (it is not tried again: a failing SSD would be asked forever).
func (s *State) writeBackDoneLocked(putID int64, pp *pendingPersist, ok bool) {
	if r := s.routes[pp.key]; !ok && r != nil && r.putID == putID {
		pp.node.policy.pages.unahead(pp.key)
	}
	pp.alloc.Release()
}

// writingBackLocked reports whether n's memory replica of route r is being written back:
// eviction skips it (its range is not freed before the persist ends).
func (s *State) writingBackLocked(r *route, n *node) bool {
	if len(s.persists) == 0 {
		return false
	}
	pp := s.persists[r.putID]
	return pp != nil && pp.writeBack && pp.node == n && pp.alloc == r.memoryReplica(n)
}

// redirtyLocked makes the memory replicas of page key dirty again when its version lost
// its last SSD copy (the ring overwrote it) while memory still holds it.
func (s *State) redirtyLocked(key string, r *route) {
	if !s.writeBackLocked(r) || r.hasSSD() || s.persists[r.putID] != nil {
		return
	}
	for n, rep := range r.replicas {
		if rep.memory != nil && !n.tombed {
			s.markDirtyLocked(key, r, n)
			s.writeAheadLocked(n)
			return // one copy reaching SSD is enough
		}
	}
}

// unwrittenLocked follows the eviction of n's dirty replica of page key (route r) out
// of turn (a take-back of transfer area room): another memory replica takes over its
// write-back, and without one the version leaves memory without reaching SSD (counted
// as a dropped persist).
func (s *State) unwrittenLocked(key string, r *route, n *node) {
	for m, rep := range r.replicas {
		if rep.memory != nil && !m.tombed {
			s.markDirtyLocked(key, r, m)
			return
		}
	}
	c := s.persistCount(n.id)
	c.asked++
	c.dropped++
}

// markDirtyLocked makes n's memory replica of page key (route r) dirty.
func (s *State) markDirtyLocked(key string, r *route, n *node) {
	if n.policy.pages.markDirty(key) {
		r.replicas[n].dirty = true
	}
}

// takeWriteBacksLocked takes the write-back persists started since the last call, for
// the server to submit once it has released the lock.
func (s *State) takeWriteBacksLocked() []*PersistTask {
	t := s.writeBacks
	s.writeBacks = nil
	return t
}

// hasSSD reports whether some replica of r is on SSD.
func (r *route) hasSSD() bool {
	for _, rep := range r.replicas {
		if rep.ssd {
			return true
		}
	}
	return false
}
