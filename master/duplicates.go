package master

// A duplicate is a memory replica whose key has a memory replica on another live node
// too (a promoted copy, or the copy it was promoted from). Evictions take duplicates
// before sole copies (allocateEvictingLocked), and each node counts its own (node.dups)
// so that a node without any skips that search, and one whose search found none waits
// dupRescan evictions (or a new duplicate) before the next: on a full pool every
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
// becomes (or stops being) one when it is the only other.
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
		return
	}
	n.dups += delta
	if others == 1 {
		other.dups += delta
	}
	if delta > 0 { // a new duplicate: a search may find it now
		n.dupQuiet = 0
		if others == 1 {
			other.dupQuiet = 0
		}
	}
}
