package master

// replica is one owner's copy of a key version: a memory range, an SSD entry, or both.
// The map key of route.replicas is the owner incarnation (*node), which doubles as the
// tomb tag: a restarted owner is another *node and never matches an old replica.
type replica struct {
	memory *Allocation
	ssd    bool
	ssdLen int64
	ssdSeq int64 // the owner's number of the SSD record (0: not told)
	// dirty: the memory replica waits for the SSD write-back (writeback.go);
	// writeBacks counts its failed write-backs. refresh: it was read back from SSD, and
	// its write-back rewrites the version's SSD record at a ring's head although the
	// version is on SSD (refreshLocked).
	dirty      bool
	refresh    bool
	writeBacks int8
}

// route is the current version of one key.
type route struct {
	putID      int64
	len        int64
	replicas   map[*node]*replica
	promotions int    // durable promotions of this version
	page       bool   // a KV page of a chain (chain.go), else a plain key
	parent     string // the page before this one in its chain; "" for a first page
}

func (r *route) memoryReplica(n *node) *Allocation {
	if rep := r.replicas[n]; rep != nil {
		return rep.memory
	}
	return nil
}

// setMemoryLocked makes a the memory replica of key on n (taking over the caller's
// reference). An evictable replica enters n's eviction policy at once; one waiting for
// its SSD persist enters it when the persist returns (PersistDone).
func (s *State) setMemoryLocked(key string, r *route, n *node, a *Allocation, evictable bool) {
	rep := replicaOn(key, r, n)
	if rep.memory != nil {
		panic("BUG: memory replica set twice")
	}
	rep.memory = a
	s.copyChangedLocked(key, r, n, +1)
	if evictable {
		s.enterPolicyLocked(key, r, n, a.Size())
	}
}

// copyChangedLocked keeps n's own records of its memory replicas as its replica of key
// (route r) comes (delta +1, just after it is set) or goes (delta -1, just before it is
// released): the duplicate counts (countCopyLocked) and the keys it borrowed transfer
// area room for (node.borrowed).
func (s *State) copyChangedLocked(key string, r *route, n *node, delta int) {
	s.countCopyLocked(r, n, delta)
	switch {
	case !r.replicas[n].memory.inArea():
	case delta > 0:
		n.borrowed.push(key)
	default:
		n.borrowed.remove(key)
	}
}

// clearMemoryLocked drops the memory replica of key on n (eviction, node loss).
func (s *State) clearMemoryLocked(key string, r *route, n *node) {
	rep := r.replicas[n]
	if rep == nil || rep.memory == nil {
		return
	}
	dirty := rep.dirty
	rep.dirty = false
	s.copyChangedLocked(key, r, n, -1)
	rep.memory.Release()
	rep.memory = nil
	n.policy.Remove(key)
	n.release.forget(key)
	s.pruneLocked(key, r, n)
	if dirty {
		s.unwrittenLocked(key, r, n)
	}
}

// clearSSDLocked drops the SSD replica of key on n (ring eviction, read failure).
func (s *State) clearSSDLocked(key string, r *route, n *node) {
	rep := r.replicas[n]
	if rep == nil || !rep.ssd {
		return
	}
	setSSD(n, rep, false)
	rep.ssdLen, rep.ssdSeq = 0, 0
	s.pruneLocked(key, r, n)
}

// replicaOn returns n's entry in route r of key, made (and recorded among n's keys) if
// it has none.
func replicaOn(key string, r *route, n *node) *replica {
	rep := r.replicas[n]
	if rep == nil {
		rep = &replica{}
		r.replicas[n] = rep
		n.keys[key] = struct{}{}
	}
	return rep
}

// dropReplica removes n's entry in route r of key.
func dropReplica(key string, r *route, n *node) {
	delete(r.replicas, n)
	delete(n.keys, key)
}

// setSSD marks whether rep, n's replica of a route, is on n's SSD, and keeps n's count.
func setSSD(n *node, rep *replica, on bool) {
	switch {
	case on && !rep.ssd:
		n.ssdReplicas++
	case !on && rep.ssd:
		n.ssdReplicas--
	}
	rep.ssd = on
}

// pruneLocked removes an entry with neither medium, and a route with no entries.
func (s *State) pruneLocked(key string, r *route, n *node) {
	if rep := r.replicas[n]; rep != nil && rep.memory == nil && !rep.ssd {
		dropReplica(key, r, n)
	}
	if len(r.replicas) == 0 && s.routes[key] == r {
		s.unsetRouteLocked(key)
		s.tombstoneLocked(key, r.putID)
	}
}

// dropRouteLocked removes a whole route (delete, overwrite) and releases its replicas.
// Holders of the old version keep their bytes: they hold their own references.
func (s *State) dropRouteLocked(key string, r *route) {
	for n, rep := range r.replicas {
		if rep.memory != nil {
			s.copyChangedLocked(key, r, n, -1)
			rep.memory.Release()
			n.policy.Remove(key)
			n.release.forget(key)
		}
		setSSD(n, rep, false)
		dropReplica(key, r, n)
	}
	if s.routes[key] == r {
		s.unsetRouteLocked(key)
		s.tombstoneLocked(key, r.putID)
	}
}

// readableLocked reports whether a route has any replica that a get could use.
func (r *route) readable() bool {
	for n, rep := range r.replicas {
		if !n.tombed && (rep.memory != nil || rep.ssd) {
			return true
		}
	}
	return false
}
