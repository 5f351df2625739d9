package master

// SSD write-back (Options.SSDAdmit = SSDAdmitEvict; docs/ssd.md "What reaches SSD"): a
// KV page reaches SSD as it nears the end of its node's eviction order, not at its put,
// so that flash holds what DRAM evicts rather than a second copy of what DRAM holds
// (pages refilled from SSD are in both tiers either way: measured on the conversation
// trace, the gain in distinct pages is small; docs/benchmarks.md). A page is published
// dirty (pagedirty.go) and enters the eviction order at once; each node keeps the pages
// it would evict next, WriteBackAhead of its segment, written back or being written
// (writeAheadLocked, after every publish and eviction), by the persists of the put path
// (the SSD pool's choice of owner, batched calls). A page being written back keeps its
// range (the persist holds a reference): it is out of the eviction order until the
// write-back ends (pagePolicy.stepAway), and skipped by take-back; a dirty page
// eviction reaches first has its write-back started then and steps out too: when puts
// outrun the SSD, allocations wait for write-backs to end (the
// server retries NO_SPACE up to AllocWait), as puts wait for their persists with
// SSDAdmitPut. (Letting eviction take the dirty pages instead lost a sixth of the pages
// of a 3-owner trace replay, whose write-backs pull the bytes to other owners' rings.)
// A dirty page leaves memory only where it must (no owner can persist it, a duplicate,
// a take-back with no clean page borrowed, its owner's death), and another memory copy
// takes its write-back over or it counts as unwritten (unwrittenLocked; the member stat
// ssd_unwritten). A failed write-back is tried maxWriteBackTries times in all, then the
// page is memory-only (unwritten too). Plain keys, and every key
// with SSDAdmitPut, are persisted at their put as before.

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

// refreshLocked marks n's memory replica of page key (route r), just read back from
// SSD, for a refresh: when eviction reaches it, its write-back rewrites the version's
// SSD record at the head of a ring (the SSD pool's choice, as for any write-back; on
// the owner holding the old record, the rewrite replaces it) instead of the page going
// at once (refreshNowLocked). A ring is first in, first out by the time of writing:
// without the refresh, a page read back from SSD and evicted from memory again keeps
// its old record, the next the ring overwrites however often it is read, so the tiers
// together keep the pages written last rather than those used last. The refresh is
// written at the eviction, not ahead of it as dirty pages are: a page used again
// before its eviction would have its rewrite wasted and aging in memory (measured:
// written ahead, the refreshes cost more ring than they kept; docs/ssd.md).
func (s *State) refreshLocked(r *route, n *node) {
	if s.writeBackLocked(r) && r.hasSSD() {
		r.replicas[n].refresh = true
	}
}

// refreshNowLocked starts the refresh of n's replica of page key (route r), which
// eviction reached (refreshLocked). It reports whether eviction must skip the page
// (its write-back started): without room for another write-back, an owner to write
// it, or with a persist of the version in flight, the page goes at once, its version
// on SSD where it is.
func (s *State) refreshNowLocked(key string, r *route, n *node) (skip bool) {
	r.replicas[n].refresh = false
	if !r.hasSSD() || s.persists[r.putID] != nil || !s.writeBackRoomLocked() {
		return false
	}
	return s.beginWriteBackLocked(key, r, n, true)
}

// writeAheadLocked starts the write-back of n's dirty pages, the next victims first,
// until those written back or being written ahead of its evictions weigh WriteBackAhead
// of its segment, or no owner can persist one now (the page stays dirty, for the next
// call). The persists go out with the call that made them (takeWriteBacksLocked).
func (s *State) writeAheadLocked(n *node) {
	pages := n.policy.pages
	if len(pages.dirty) == 0 || n.tombed {
		return
	}
	want := int64(float64(n.alloc.Capacity()) * s.opts.WriteBackAhead)
	for pages.ahead < want && s.writeBackRoomLocked() {
		key, ok := pages.takeDirty()
		if !ok || !s.startWriteBackLocked(key, n) {
			return
		}
	}
}

// writeBackNowLocked starts the write-back of n's dirty replica of key out of turn:
// eviction reached it before writeAheadLocked did (a page put under an old parent ranks
// with it, below the pages already ahead; or puts outran the SSD). It reports whether
// eviction must skip the page: false when no owner can persist it (the page is evicted
// dirty, counted as unwritten, rather than held in memory for ever).
func (s *State) writeBackNowLocked(key string, n *node) (skip bool) {
	if !s.writeBackRoomLocked() {
		return true // it waits for the write-backs in flight, dirty
	}
	return !n.policy.pages.takeDirtyKey(key) || s.startWriteBackLocked(key, n)
}

// writeBackRoomLocked reports whether another write-back may start: those in flight stay
// within half the persist queue (Options.PersistQueue), so that they never fill it. A
// write-back that found the queue full would fail, and its page be taken to the next
// one at once: a node whose write-ahead spans more pages than the queue holds (an eighth
// of a 32 GiB pool is 65,536 KV pages of 64 KiB) would make most of them memory-only.
func (s *State) writeBackRoomLocked() bool {
	return s.writingBack < max(s.opts.PersistQueue/2, 1)
}

// startWriteBackLocked persists n's replica of page key, just taken from the dirty
// pages, unless another replica of the version is on SSD or being written. When no
// owner has SSD room for it, the page is dirty again and it returns false.
func (s *State) startWriteBackLocked(key string, n *node) bool {
	r := s.routes[key]
	if r == nil || r.memoryReplica(n) == nil {
		panic("BUG: a dirty page without a memory replica on its node")
	}
	r.replicas[n].dirty = false
	if r.hasSSD() || s.persists[r.putID] != nil {
		return true // written back already (another replica's), or being written
	}
	if !s.beginWriteBackLocked(key, r, n, false) {
		s.markDirtyLocked(key, r, n)
		return false
	}
	return true
}

// beginWriteBackLocked persists n's memory replica of page key (route r) as a
// write-back (a refresh: rewriting a version on SSD); false when no owner can persist
// it. The page is out of the eviction order until the write-back ends.
func (s *State) beginWriteBackLocked(key string, r *route, n *node, refresh bool) bool {
	t := s.persistTaskLocked(key, r.putID, n, r.memoryReplica(n))
	if t == nil {
		return false
	}
	pp := s.persists[r.putID]
	pp.writeBack, pp.refresh = true, refresh
	s.writeBacks = append(s.writeBacks, t)
	s.writingBack++
	n.policy.pages.stepAway(key)
	return true
}

// unpersistLocked follows a failed persist pp of route r's version putID: the record
// on its SSD owner is not counted on. That owner may have dropped it (a refresh's
// rewrite replaces the old record once reserved; a commit that failed, in transport
// too, is forgotten: the reply of a commit that landed may have been lost, and the
// commit then counted a record the owner no longer has). It may as well still hold it
// (the persist never reached it, its ring was blocked before the reservation, the
// persist call's own answer was lost): it must forget it, as after a failed read
// (GetRevoke), and counts as its holder until it acked that, so that a delete waits
// for it and no write-back goes there before.
func (s *State) unpersistLocked(putID int64, pp *pendingPersist, r *route) {
	if pp.committed {
		// Its commit was published: the record was written from the source's bytes while
		// the source was registered, and it lives on even with its memory copy gone (a
		// review: a write-back's source tombed before the call returned dropped the
		// page's last copy).
		return
	}
	if rep := r.replicas[pp.ssdNode]; rep != nil && rep.ssd && !pp.ssdNode.tombed {
		s.clearSSDLocked(pp.key, r, pp.ssdNode)
		pp.ssdNode.evicted.push(pp.key, putID, true)
	}
}

// maxWriteBackTries bounds the write-backs of one memory replica: a page whose
// write-backs failed that often stays memory-only (an SSD that fails every write is not
// asked for ever, and the page is not held in memory for ever).
const maxWriteBackTries = 2

// writeBackDoneLocked ends the write-back of pp. A failed one (an SSD error, the SSD
// owner gone, the persist queue full) leaves the page dirty again for another try,
// maxWriteBackTries in all (then the page is memory-only: counted as unwritten); if pp's
// node lost its replica meanwhile (tombed), another memory replica takes the write-back
// over.
func (s *State) writeBackDoneLocked(putID int64, pp *pendingPersist, ok bool) {
	s.writingBack--
	pp.alloc.Release()
	r := s.routes[pp.key]
	if r == nil || r.putID != putID {
		return
	}
	if !ok {
		s.unpersistLocked(putID, pp, r)
	}
	rep := r.replicas[pp.node]
	if rep != nil && rep.memory == pp.alloc {
		pp.node.policy.pages.stepBack(pp.key) // evictable again (stepAway)
		if pp.node.dups > 0 && s.duplicateLocked(pp.key, pp.node) {
			// Out of the order, it was not drawn by the duplicate searches meanwhile (one
			// that finds none rests): back among the next victims, it is the one to take.
			endDupRest(pp.node)
		}
	}
	if (ok && !pp.lost) || r.hasSSD() {
		if rep != nil && rep.memory == pp.alloc {
			rep.writeBacks = 0 // its tries start again should the ring overwrite the record
		}
		return
	}
	if rep == nil || rep.memory != pp.alloc || pp.node.tombed {
		s.redirtyLocked(pp.key, r)
		return
	}
	pp.node.policy.pages.unahead(pp.key)
	if rep.writeBacks++; rep.writeBacks < maxWriteBackTries {
		s.markDirtyLocked(pp.key, r, pp.node)
	} else {
		s.persistCount(pp.node.id).unwritten++
	}
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
	if !s.writeBackLocked(r) || r.hasSSD() {
		return
	}
	if pp := s.persists[r.putID]; pp != nil {
		// The record a write-back in flight committed is gone already (its end comes
		// after its commit): when it ends, the page is not clean.
		pp.lost = pp.writeBack
		return
	}
	for n, rep := range r.replicas {
		if rep.memory != nil && !n.tombed && rep.writeBacks < maxWriteBackTries {
			s.markDirtyLocked(key, r, n)
			s.writeAheadLocked(n)
			return // one copy reaching SSD is enough
		}
	}
}

// unwrittenLocked follows the loss of n's dirty replica of page key (route r): evicted
// as a duplicate, evicted because no owner could persist it, or its owner tombed.
// Another memory replica takes its write-back over; without one the version leaves
// memory without reaching SSD (counted as unwritten on n), unless a copy whose
// write-backs failed for good stays in memory (counted when they did).
func (s *State) unwrittenLocked(key string, r *route, n *node) {
	if r.hasSSD() || s.persists[r.putID] != nil {
		return
	}
	gaveUp := false
	for m, rep := range r.replicas {
		if rep.memory != nil && !m.tombed && m != n {
			if rep.writeBacks < maxWriteBackTries {
				s.markDirtyLocked(key, r, m)
				return
			}
			gaveUp = true
		}
	}
	if !gaveUp {
		s.persistCount(n.id).unwritten++
	}
}

// cleanLocked ends the dirtiness of route r's memory replicas: a copy of the version
// was published on SSD (a commit, or a replica report). Their write-back tries start
// again, should the ring overwrite that copy.
func (s *State) cleanLocked(key string, r *route) {
	for n, rep := range r.replicas {
		rep.writeBacks = 0
		rep.refresh = false
		if rep.dirty {
			rep.dirty = false
			n.policy.pages.cleanDirty(key)
		}
	}
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

// inMemory reports whether some replica of r is in memory.
func (r *route) inMemory() bool {
	for _, rep := range r.replicas {
		if rep.memory != nil {
			return true
		}
	}
	return false
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
