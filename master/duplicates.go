package master

// A duplicate is a memory replica whose key has a memory replica on another live node
// too (a promoted copy, or the copy it was promoted from). Evictions take duplicates
// before sole copies (allocateEvictingLocked), and each node counts its own (node.dups)
// so that a node without any skips that search, and one whose search found none waits
// dupRescan evictions (or a duplicate a replica report brings) before the next: on a full pool every
// allocation would otherwise draw victimScanLimit candidates from the order to find
// none (measured on the conversation trace replay, one node: 6.4 ms per BatchPutStart
// of ~22 pages; 3 owners, where each reader holds one hot promoted copy, the same).

// duplicateLocked reports whether key has a live memory replica on a node other than n.
func (s *State) duplicateLocked(key string, n *node) bool {
	r := s.routes[key]
	if r == nil {
		return false
	}
	for m, rep := range r.replicas {
		if m != n && !m.tombed && rep.memory != nil {
			return true
		}
	}
	return false
}

// countCopyLocked keeps the nodes' duplicate counts as n's memory replica of route r
// comes (delta +1, just after it is set) or goes (delta -1, just before it is cleared):
// n's replica is a duplicate while another live node holds one, and the other's
// becomes (or stops being) one when it is the only other. The pool's counts of values
// and duplicate bytes (MemoryValues) follow: a first copy is a value, every other one
// duplicate bytes (the copies of a version are of one size). A new duplicate does not end
// a node's rest from searching (dupQuiet): a copy a get makes is the newest key in its
// new owner's order, and the get touched its source, so neither is near the oldest
// candidates a search draws (ending the rest at every promotion had the 3-owner trace
// replay's master search at almost every eviction, and find nothing 92 % of the
// time). A copy learned from a replica report may be old, and does end it (adoptLocked).
func (s *State) countCopyLocked(r *route, n *node, delta int) {
	others := 0
	var other *node
	for m, rep := range r.replicas {
		if m != n && !m.tombed && rep.memory != nil {
			others++
			other = m
		}
	}
	if others == 0 {
		s.memoryValues += int64(delta)
		return
	}
	s.duplicateBytes += int64(delta) * r.replicas[n].memory.Size()
	n.dups += delta
	if others == 1 {
		other.dups += delta
	}
}
