package master

import (
	"container/heap"
	"math"
)

// pagePolicy orders the memory replicas of one node's chained keys (KV pages put with
// their parent, the page before them in a prefix chain) for eviction. A request reuses
// the leading pages of its chain that are cached and stops at the first miss, so a page
// is worth keeping only while its parent is: the policy evicts the lowest priority
// first. A page's own priority is the pool's access clock at its last insert or hit
// plus pageFreqBonus for each doubling of its hits (recency and frequency: on the
// conversation trace most pages are used once, and a page used again is likely to be
// used yet again); its priority is that, capped by its parent's when the parent is a
// page on this node, so a chain is evicted from its deep end (ties go to the deeper
// page). A page whose parent has no route (an orphan) has priority zero, and so has
// every page under it on this node: they are the first victims, deepest first. Evicted
// pages are remembered, with their hit counts, in the pool's ghost (pageghost.go), so
// a page put again soon after its eviction, through any owner, keeps its history.
//
// A page an eviction drew but could not take (a holder keeps it) is passed over: its
// priority is at least the clock of that pass from then on, whatever caps it (passed),
// and the pages under it are still capped by what it would rank without the lift
// (base). Without the lift a held orphan, or a held chain longer than an eviction's
// draw, stayed the lowest however often it was passed, and once victimScanLimit such
// pages were the lowest no eviction found a page it could take.
//
// A page put under a parent (and its put's start, before the allocation evicts
// anything) moves the parent and the pages above it on to now without counting hits
// (refresh): the prefix was just used, and the hits that say so may reach the master
// after the put, since an owner reports the hits it serves from its hot set in batches.
// Without it the new pages would be capped by their parent's stale priority and be the
// next victims. Pages an owner's hot set holds idle are released in this order, not
// the owner's (releaseAsk in hotset.go).
//
// The pages of each parent key are linked (kids), so a change that lowers a page's
// priority or moves its depth (it became an orphan, its parent was put after it, a
// batch published it first) is carried down to the pages under it, and adoption lifts
// them again; a raise (a hit) is not carried down: the pages under it already rank no
// later. Operations are O(log n), those that carry a change O(pages under the page ·
// log n); memory is O(keys). Not safe for concurrent use; evictOrder drives it with
// the shared clock.
type pagePolicy struct {
	entries map[string]*pageEntry
	kids    map[string]*pageEntry // parent key → the first of the live pages put under it
	heap    pageHeap
	weight  int64
	newest  *pageEntry
	ghosts  *pageGhosts
	seq     uint64
	pass    uint64 // numbers the walks of update (a cycle of parents ends them)
	// dirty orders the pages whose version has no SSD copy yet (markDirty), as heap
	// does, for the write-back ahead of eviction (writeback.go); ahead is the weight of
	// the pages taken from it (takeDirty) that are still here and not used since.
	dirty dirtyHeap
	ahead int64
	// scan is victimWhereStill's, kept to reuse its buffer; walk is refresh's.
	scan heapScan
	walk []*pageEntry
}

const (
	// pageFreqBonus is the priority a page gains per doubling of its hits, in clock
	// ticks (inserts and hits in the pool). Measured on the conversation trace (see
	// README): 16Ki ticks is about three minutes of that service's block accesses.
	pageFreqBonus = 1 << 14
	// maxPageFreq caps the hit count (the bonus grows with its logarithm).
	maxPageFreq = 1 << 16
	// pageGhostFactor is the ghost list's length in live pages.
	pageGhostFactor = 4
	// refreshDepth bounds a refresh's walk up a chain, in pages.
	refreshDepth = 256
)

type pageEntry struct {
	key       string
	parent    string
	hasParent bool
	orphan    bool // the parent has no route
	weight    int64
	freq      uint32
	own       int64 // the clock at the last insert or hit, plus the hit bonus
	base      int64 // own capped by the parent's base here; zero for an orphan or under one
	passed    int64 // the clock when an eviction last passed over it held (0: never)
	prio      int64 // base, or passed if later: the heap's order
	depth     int32 // on this node: 1 + the parent's when the parent is a page here
	seq       uint64
	pass      uint64
	index     int  // in the heap; -1 while out of it
	dindex    int  // in the dirty heap; -1 while out of it
	isAhead   bool // taken by takeDirty, not used or dropped since (counted in ahead)
	away      bool // out of the heap while its write-back runs (stepAway)
	// prevKid, nextKid link the live pages of the same parent key.
	prevKid, nextKid *pageEntry
	// up is the live page of key parent (nil while there is none): what parentOf returns,
	// kept by insert and drop so that the walks up a chain look no key up.
	up *pageEntry
}

// newPagePolicy is an empty policy remembering its victims in ghosts (nil: a ghost of
// its own).
func newPagePolicy(ghosts *pageGhosts) *pagePolicy {
	if ghosts == nil {
		ghosts = newPageGhosts()
	}
	return &pagePolicy{entries: make(map[string]*pageEntry), kids: make(map[string]*pageEntry), ghosts: ghosts}
}

// detach leaves the shared ghost (the node is gone): its live pages no longer count
// toward the ghost's length, and what it does from now on stays out of it.
func (p *pagePolicy) detach() {
	p.ghosts.live -= len(p.entries)
	p.ghosts.trim()
	p.ghosts = newPageGhosts()
	p.ghosts.live = len(p.entries)
}

func (p *pagePolicy) Len() int      { return len(p.entries) }
func (p *pagePolicy) Weight() int64 { return p.weight }

// has reports whether k is a live page.
func (p *pagePolicy) has(k string) bool { return p.entries[k] != nil }

// insert adds page k (or refreshes a live one, counting a hit) at clock now; orphan
// says its parent has no route.
func (p *pagePolicy) insert(k string, weight int64, parent string, hasParent, orphan bool, now int64) {
	e := p.entries[k]
	moved := true
	if e == nil {
		p.seq++
		e = &pageEntry{key: k, freq: 1, seq: p.seq, index: -1, dindex: -1}
		if freq, ok := p.ghosts.take(k); ok {
			e.freq = min(freq+1, maxPageFreq)
		}
		p.entries[k] = e
		p.ghosts.live++
		for c := p.kids[k]; c != nil; c = c.nextKid {
			c.up = e // pages put under k while it was not live
		}
	} else {
		p.notAhead(e)
		p.weight -= e.weight
		e.freq = min(e.freq+1, maxPageFreq)
		if moved = e.parent != parent || e.hasParent != hasParent; moved {
			p.unlink(e)
		}
	}
	p.weight += weight
	e.weight, e.orphan = weight, orphan
	e.parent, e.hasParent = parent, hasParent
	if moved {
		p.link(e)
		e.up = nil
		if hasParent {
			e.up = p.entries[parent]
		}
	}
	e.own = p.own(e, now)
	p.newest = e
	p.update(e)
	if par := p.parentOf(e); par != nil {
		p.refresh(par, now)
		p.update(e) // under the refreshed parent (a raise is not carried down)
	}
}

// refreshChain moves live page k and the pages above it on to now (see refresh).
func (p *pagePolicy) refreshChain(k string, now int64) {
	if e := p.entries[k]; e != nil {
		p.refresh(e, now)
	}
}

// refresh moves e and the pages above it on this node on to now, without counting
// hits: a page put under a parent means its prefix was just used, and the hits that
// say so may arrive after the put (an owner reports hot-set hits in batches), which
// would cap the new page, and the pages put after it, by the parent's stale priority.
// The walk goes up at most refreshDepth pages (the pages above were moved on by the
// walks of the pages put before: a chain is put from its root down); top down, each
// page is then ranked again under its refreshed parent. It costs O(refreshDepth · log n).
// (Stopping at a page moved on recently would make a walk O(1), but the staleness left
// above such stops adds up along a long chain; measured on the conversation trace, it
// cost half a point of hit rate.)
func (p *pagePolicy) refresh(e *pageEntry, now int64) {
	p.pass++
	up := p.walk[:0]
	for a := e; a != nil && a.pass != p.pass && len(up) < refreshDepth; a = p.parentOf(a) {
		a.pass = p.pass
		up = append(up, a)
	}
	for i := len(up) - 1; i >= 0; i-- {
		p.moveOn(up[i], now)
	}
	clear(up) // hold no page the walk passed
	p.walk = up[:0]
}

// moveOn raises e's own priority to what a use at now gives it, hits unchanged.
func (p *pagePolicy) moveOn(e *pageEntry, now int64) {
	if own := p.own(e, now); own > e.own {
		p.notAhead(e)
		e.own = own
		p.update(e)
	}
}

// touch records a hit on a live page.
func (p *pagePolicy) touch(k string, now int64) {
	if e := p.entries[k]; e != nil {
		p.notAhead(e)
		e.freq = min(e.freq+1, maxPageFreq)
		e.own = p.own(e, now)
		p.update(e)
	}
}

// passOver moves live page k on to now without counting a hit (eviction passed over it
// held), its parent's cap and an orphan's zero notwithstanding.
func (p *pagePolicy) passOver(k string, now int64) {
	if e := p.entries[k]; e != nil {
		p.notAhead(e)
		e.own = max(e.own, p.own(e, now))
		e.passed = now
		p.update(e)
	}
}

// orphan makes page k and the pages under it here the first victims (its parent lost
// its route); adopt undoes that (the parent was put again).
func (p *pagePolicy) orphan(k string) { p.setOrphan(k, true) }
func (p *pagePolicy) adopt(k string)  { p.setOrphan(k, false) }

func (p *pagePolicy) setOrphan(k string, orphan bool) {
	if e := p.entries[k]; e != nil && e.orphan != orphan {
		e.orphan = orphan
		p.update(e)
	}
}

func (p *pagePolicy) own(e *pageEntry, now int64) int64 {
	return now + int64(pageFreqBonus*math.Log2(float64(e.freq)))
}

// rank is e's priority, base and depth from its own priority, its orphan mark, its
// last pass and its parent.
func (p *pagePolicy) rank(e *pageEntry) (prio, base int64, depth int32) {
	base = e.own
	if e.orphan {
		base = 0
	}
	if par := p.parentOf(e); par != nil {
		base, depth = min(base, par.base), par.depth+1
	}
	return max(base, e.passed), base, depth
}

// parentOf is e's parent when it is a live page here.
func (p *pagePolicy) parentOf(e *pageEntry) *pageEntry {
	if !e.hasParent {
		return nil
	}
	return e.up
}

// update ranks e again (entering it in the heap when it is out) and carries a change
// down: to the pages under e whose rank it lowers or moves, and, when e rose from
// zero, whose rank it lifts. A page met twice in one walk (a cycle of parents) stops it.
func (p *pagePolicy) update(e *pageEntry) {
	p.pass++
	var todo []*pageEntry
	for {
		if e.pass != p.pass {
			e.pass = p.pass
			if p.rerank(e) {
				for c := p.kids[e.key]; c != nil; c = c.nextKid {
					todo = append(todo, c)
				}
			}
		}
		if len(todo) == 0 {
			return
		}
		e = todo[len(todo)-1]
		todo = todo[:len(todo)-1]
	}
}

// rerank sets e's priority and depth and its place in the heap; it reports whether the
// pages under e must be ranked again.
func (p *pagePolicy) rerank(e *pageEntry) bool {
	prio, base, depth := p.rank(e)
	fresh := e.index < 0 && !e.away
	carry := fresh || base < e.base || depth != e.depth || (e.base == 0 && base != 0)
	e.prio, e.base, e.depth = prio, base, depth
	switch {
	case e.away:
		// Ranked, out of the heap until stepBack.
	case fresh:
		heap.Push(&p.heap, e)
	default:
		heap.Fix(&p.heap, e.index)
	}
	if e.dindex >= 0 {
		heap.Fix(&p.dirty, e.dindex)
	}
	return carry
}

func (p *pagePolicy) link(e *pageEntry) {
	if !e.hasParent {
		return
	}
	head := p.kids[e.parent]
	e.prevKid, e.nextKid = nil, head
	if head != nil {
		head.prevKid = e
	}
	p.kids[e.parent] = e
}

func (p *pagePolicy) unlink(e *pageEntry) {
	if !e.hasParent {
		return
	}
	if e.prevKid != nil {
		e.prevKid.nextKid = e.nextKid
	} else if e.nextKid != nil {
		p.kids[e.parent] = e.nextKid
	} else {
		delete(p.kids, e.parent)
	}
	if e.nextKid != nil {
		e.nextKid.prevKid = e.prevKid
	}
	e.prevKid, e.nextKid = nil, nil
}

// remove forgets a live page without reporting it as a victim.
func (p *pagePolicy) remove(k string) bool {
	e := p.entries[k]
	if e == nil {
		return false
	}
	if e.index >= 0 {
		heap.Remove(&p.heap, e.index)
	}
	p.drop(e)
	return true
}

// stepAway takes live page k out of the heap while its write-back runs (writeback.go):
// eviction skips a page being written back, and at its place among the next victims
// (the write-back takes those) every eviction drew it and put it back. It is ranked as
// ever meanwhile; stepBack puts it back. Called from an accept of victimWhere, on the
// page just drawn, it stays out.
func (p *pagePolicy) stepAway(k string) {
	e := p.entries[k]
	if e == nil || e.away {
		return
	}
	e.away = true
	if e.index >= 0 {
		heap.Remove(&p.heap, e.index)
	}
}

// stepBack ends stepAway: page k is in the heap again, at its rank.
func (p *pagePolicy) stepBack(k string) {
	if e := p.entries[k]; e != nil && e.away {
		e.away = false
		heap.Push(&p.heap, e)
	}
}

// evict evicts page k out of turn, as victimWhere would (remembered in the ghost); it
// reports whether k was a live page.
func (p *pagePolicy) evict(k string) bool {
	e := p.entries[k]
	if !p.remove(k) {
		return false
	}
	p.ghosts.remember(e.key, e.freq)
	return true
}

// drop forgets e (out of the heap); the pages under it lose its cap and depth.
func (p *pagePolicy) drop(e *pageEntry) {
	p.unlink(e)
	if e.dindex >= 0 {
		heap.Remove(&p.dirty, e.dindex)
	}
	p.notAhead(e)
	delete(p.entries, e.key)
	p.ghosts.live--
	p.ghosts.trim()
	p.weight -= e.weight
	if p.newest == e {
		p.newest = nil
	}
	for c := p.kids[e.key]; c != nil; c = c.nextKid {
		c.up = nil
		p.update(c)
	}
}

// victimWhere draws pages lowest priority first and evicts the first that accept takes
// (remembered in the ghost); the others go back unchanged. The newest page is passed
// over unless protectNewest is false. At most limit pages are drawn.
func (p *pagePolicy) victimWhere(accept func(string) bool, limit int, protectNewest bool) (string, bool) {
	var back []*pageEntry
	var victim *pageEntry
	for range limit {
		if len(p.heap) == 0 {
			break
		}
		e := heap.Pop(&p.heap).(*pageEntry)
		if (protectNewest && e == p.newest) || !accept(e.key) {
			back = append(back, e)
			continue
		}
		victim = e
		break
	}
	for _, e := range back {
		if !e.away {
			heap.Push(&p.heap, e)
		}
	}
	if victim == nil {
		return "", false
	}
	p.drop(victim)
	p.ghosts.remember(victim.key, victim.freq)
	return victim.key, true
}

// victimWhereStill is victimWhere for an accept that reads only (it changes nothing of
// p, as the search for a duplicate to evict): it walks the heap in its order without
// taking pages out, the next page always the lowest child of a page walked so far
// (scan, a small heap of positions in p.heap), so a search that finds nothing moves no
// page. The order is total (seq breaks ties): it asks accept of the same pages in the
// same order and evicts the same victim as victimWhere.
func (p *pagePolicy) victimWhereStill(accept func(string) bool, limit int, protectNewest bool) (string, bool) {
	if len(p.heap) == 0 || limit <= 0 {
		return "", false
	}
	sc := &p.scan
	sc.h, sc.at = p.heap, append(sc.at[:0], 0)
	defer func() { sc.h = nil }()
	for drawn := 0; drawn < limit && len(sc.at) > 0; drawn++ {
		i := sc.pop()
		if e := p.heap[i]; !(protectNewest && e == p.newest) && accept(e.key) {
			heap.Remove(&p.heap, i)
			p.drop(e)
			p.ghosts.remember(e.key, e.freq)
			return e.key, true
		}
		if c := 2*i + 1; c < len(p.heap) {
			sc.push(c)
		}
		if c := 2*i + 2; c < len(p.heap) {
			sc.push(c)
		}
	}
	return "", false
}

// heapScan is victimWhereStill's frontier: a binary heap of positions in h, the lowest
// page first (its own sifts: container/heap would box every position).
type heapScan struct {
	h  pageHeap
	at []int
}

func (s *heapScan) less(i, j int) bool { return evictedBefore(s.h[s.at[i]], s.h[s.at[j]]) }

func (s *heapScan) push(x int) {
	s.at = append(s.at, x)
	for i := len(s.at) - 1; i > 0; {
		up := (i - 1) / 2
		if !s.less(i, up) {
			break
		}
		s.at[i], s.at[up] = s.at[up], s.at[i]
		i = up
	}
}

func (s *heapScan) pop() int {
	top, last := s.at[0], len(s.at)-1
	s.at[0] = s.at[last]
	s.at = s.at[:last]
	for i := 0; ; {
		l, least := 2*i+1, i
		if l < last && s.less(l, least) {
			least = l
		}
		if r := l + 1; r < last && s.less(r, least) {
			least = r
		}
		if least == i {
			return top
		}
		s.at[i], s.at[least] = s.at[least], s.at[i]
		i = least
	}
}

// minPriority is the priority of the next victim; ok is false without pages.
func (p *pagePolicy) minPriority() (int64, bool) {
	if len(p.heap) == 0 {
		return 0, false
	}
	return p.heap[0].prio, true
}

// pageHeap is a min-heap of pages by priority, deeper first, then older first;
// dirtyHeap the dirty pages (pagedirty.go) in the same order. Each keeps its entries'
// places in a field of their own (the index I picks).
type (
	pageHeap  = orderHeap[heapIndex]
	dirtyHeap = orderHeap[dirtyIndex]
)

type orderHeap[I interface{ at(*pageEntry) *int }] []*pageEntry

type (
	heapIndex  struct{}
	dirtyIndex struct{}
)

func (heapIndex) at(e *pageEntry) *int  { return &e.index }
func (dirtyIndex) at(e *pageEntry) *int { return &e.dindex }

// evictedBefore is the heaps' order: a goes before b.
func evictedBefore(a, b *pageEntry) bool {
	if a.prio != b.prio {
		return a.prio < b.prio
	}
	if a.depth != b.depth {
		return a.depth > b.depth
	}
	return a.seq < b.seq
}

func (h orderHeap[I]) Len() int           { return len(h) }
func (h orderHeap[I]) Less(i, j int) bool { return evictedBefore(h[i], h[j]) }
func (h orderHeap[I]) Swap(i, j int) {
	var ix I
	h[i], h[j] = h[j], h[i]
	*ix.at(h[i]), *ix.at(h[j]) = i, j
}
func (h *orderHeap[I]) Push(x any) {
	var ix I
	e := x.(*pageEntry)
	*ix.at(e) = len(*h)
	*h = append(*h, e)
}
func (h *orderHeap[I]) Pop() any {
	var ix I
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	*ix.at(e) = -1
	return e
}
