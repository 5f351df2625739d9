package master

// pageGhosts remembers evicted KV pages with their hit counts, so that a page put again
// soon after its eviction keeps its history (a page that was evicted and is asked for
// again was used again: on the conversation trace that re-put, with its hit bonus, is
// what keeps the pages of conversations that go on). One pageGhosts is the pool's
// (State.ghosts), shared by the page policies of every node: the put that brings a page
// back goes through whichever owner served the request, and on 3 owners a ghost of the
// node that evicted the page alone missed two re-puts in three (replayed offline, the
// 3-owner pool served 13.3 % of the quick trace's blocks at 10 % capacity with a ghost
// per node, 15.7 % with one ghost, one node 15.7 %). Its length is pageGhostFactor times
// the live pages of the policies that share it (counted in live), at least minGhost.
// Not safe for concurrent use; the State's lock covers it.
type pageGhosts struct {
	ghost map[string]pageGhost
	queue []ghostRef // oldest first from at
	at    int
	seq   uint64
	live  int // live pages of the policies sharing it
}

type pageGhost struct {
	freq uint32
	seq  uint64
}

type ghostRef struct {
	key string
	seq uint64
}

func newPageGhosts() *pageGhosts {
	return &pageGhosts{ghost: make(map[string]pageGhost)}
}

// Len is the number of remembered pages.
func (g *pageGhosts) Len() int { return len(g.ghost) }

// take forgets k and returns the hit count it was evicted with; ok is false when k is
// not remembered.
func (g *pageGhosts) take(k string) (freq uint32, ok bool) {
	e, ok := g.ghost[k]
	if ok {
		delete(g.ghost, k)
	}
	return e.freq, ok
}

// remember records k, evicted with freq hits, and trims the oldest beyond the length.
func (g *pageGhosts) remember(k string, freq uint32) {
	g.seq++
	g.ghost[k] = pageGhost{freq: freq, seq: g.seq}
	g.queue = append(g.queue, ghostRef{k, g.seq})
	g.trim()
}

// trim forgets the oldest pages beyond the bound (after a remember, or once live pages
// went: a delete, a node detached) and drops the queue's dead refs (amortized O(1)).
func (g *pageGhosts) trim() {
	for len(g.ghost) > g.bound() && g.at < len(g.queue) {
		r := g.queue[g.at]
		g.at++
		if cur, ok := g.ghost[r.key]; ok && cur.seq == r.seq {
			delete(g.ghost, r.key)
		}
	}
	if g.at > len(g.queue)/2 {
		g.queue = append(g.queue[:0:0], g.queue[g.at:]...)
		g.at = 0
	}
	// Pages taken back (put again) leave their refs behind; while the map stays within
	// its bound nothing above pops them, so drop them once they outnumber the live refs.
	if len(g.queue)-g.at > 2*max(len(g.ghost), minGhost) {
		q := g.queue[:0:0]
		for _, r := range g.queue[g.at:] {
			if cur, ok := g.ghost[r.key]; ok && cur.seq == r.seq {
				q = append(q, r)
			}
		}
		g.queue, g.at = q, 0
	}
}

// bound is the ghost's length: pageGhostFactor per live page, at least minGhost.
func (g *pageGhosts) bound() int { return max(pageGhostFactor*g.live, minGhost) }
