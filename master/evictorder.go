package master

import (
	"cmp"
	"slices"
)

// evictOrder is a node's eviction order: plain keys in a weighted S3-FIFO (Policy),
// KV pages put with a parent in a pagePolicy. A node holding only plain keys evicts
// exactly as the S3-FIFO alone would. When it holds both, each draw goes to the class
// whose next candidate is older on the clock (a tick per insert or hit; a page counts
// its priority, hit bonus included); a class that finds no acceptable victim hands the
// draw to the other. The most recently inserted key is chosen only when it is the last
// key left. The clock is the pool's (State.clock, shared by every node's order), so
// pooled placement can compare the next victims of different nodes (NextPriority), and
// so is the ghost of evicted pages (State.ghosts). Not safe for concurrent use.
type evictOrder struct {
	plain *Policy[string]
	pages *pagePolicy
	clock *int64
}

// newEvictOrder is an empty order ticking clock and remembering evicted pages in ghosts
// (nil: a clock or a ghost of its own).
func newEvictOrder(clock *int64, ghosts *pageGhosts) *evictOrder {
	if clock == nil {
		clock = new(int64)
	}
	return &evictOrder{plain: NewPolicy[string](), pages: newPagePolicy(ghosts), clock: clock}
}

// Detach leaves the pool's shared page ghost (the node is gone).
func (o *evictOrder) Detach() { o.pages.detach() }

// each calls fn with every live key, in no order, until fn returns false.
func (o *evictOrder) each(fn func(string) bool) {
	for k, e := range o.plain.entries {
		if e.queue != inGhost && !fn(k) {
			return
		}
	}
	for k := range o.pages.entries {
		if !fn(k) {
			return
		}
	}
}

// Len is the number of live keys; Weight their bytes.
func (o *evictOrder) Len() int      { return o.plain.Len() + o.pages.Len() }
func (o *evictOrder) Weight() int64 { return o.plain.Weight() + o.pages.Weight() }

func (o *evictOrder) tick() int64 {
	*o.clock++
	o.plain.now = *o.clock
	return *o.clock
}

// Insert adds a plain key (see Policy.Insert).
func (o *evictOrder) Insert(k string, weight int64) {
	o.pages.remove(k)
	o.tick()
	o.plain.Insert(k, weight)
	o.pages.newest = nil
}

// InsertPage adds a KV page whose parent key is parent ("" for a chain's first page);
// orphan says the parent has no route (the page is then the first victim).
func (o *evictOrder) InsertPage(k string, weight int64, parent string, orphan bool) {
	o.plain.Remove(k)
	o.pages.insert(k, weight, parent, parent != "", orphan, o.tick())
	o.plain.newest = nil
}

// Touch records a hit on k.
func (o *evictOrder) Touch(k string) {
	now := o.tick()
	if o.pages.has(k) {
		o.pages.touch(k, now)
		return
	}
	o.plain.Touch(k)
}

// TouchAll records a hit on each of keys, in any order: pages are touched parents
// first (by their depth here), as a get of a prefix meets them. A page's priority is
// capped at its parent's, and a touch does not pass a raise down to the pages under
// it, so a child touched before its parent kept the parent's old priority.
func (o *evictOrder) TouchAll(keys []string) {
	pages := make([]*pageEntry, 0, len(keys))
	for _, k := range keys {
		if e := o.pages.entries[k]; e != nil {
			pages = append(pages, e)
		} else {
			o.Touch(k)
		}
	}
	slices.SortStableFunc(pages, func(a, b *pageEntry) int { return cmp.Compare(a.depth, b.depth) })
	for _, e := range pages {
		o.Touch(e.key)
	}
}

// RefreshChain moves page k and the pages above it on to now (a page is being put
// under k), without counting hits.
func (o *evictOrder) RefreshChain(k string) {
	if o.pages.has(k) {
		o.pages.refreshChain(k, o.tick())
	}
}

// IsPage reports whether k is a live KV page (put with a parent).
func (o *evictOrder) IsPage(k string) bool { return o.pages.has(k) }

// Pass records that eviction passed over k because a holder keeps it: a page moves on
// as if used now, without a hit counted (a hit bonus earned by being held would outrank
// the pages that were really used again); a plain key is touched, as before.
func (o *evictOrder) Pass(k string) {
	now := o.tick()
	if o.pages.has(k) {
		o.pages.passOver(k, now)
		return
	}
	o.plain.Touch(k)
}

// Orphan makes page k a first victim (its parent lost its route); Adopt undoes it.
func (o *evictOrder) Orphan(k string) { o.pages.orphan(k) }
func (o *evictOrder) Adopt(k string)  { o.pages.adopt(k) }

// Remove forgets a live key without reporting it as a victim.
func (o *evictOrder) Remove(k string) bool {
	return o.pages.remove(k) || o.plain.Remove(k)
}

// Rank is where k stands in the order, on the clock: a page's priority, a plain key's
// stamp (its hits, which let it survive a lap of its queue, are not counted); lower is
// evicted sooner. ok is false when k is not in the order (a replica waiting for its SSD
// persist is not yet: setMemoryLocked).
func (o *evictOrder) Rank(k string) (rank int64, ok bool) {
	if e := o.pages.entries[k]; e != nil {
		return e.prio, true
	}
	if e := o.plain.entries[k]; e != nil && e.queue != inGhost {
		return e.stamp, true
	}
	return 0, false
}

// Evict evicts the live key k out of turn (a take-back of transfer area room chooses
// its own victims: takeBackVictimsLocked), as if it had been drawn.
func (o *evictOrder) Evict(k string) bool {
	return o.pages.evict(k) || o.plain.Evict(k)
}

// VictimWhere evicts the first key accept takes, drawing at most limit keys from the
// class the next draw belongs to (see evictOrder), then from the other; false when none
// was accepted, and then nothing was evicted.
func (o *evictOrder) VictimWhere(accept func(string) bool, limit int) (string, bool) {
	return o.victimWhere(accept, limit, false)
}

// VictimWhereStill is VictimWhere for an accept that reads only (the search for a
// duplicate): the pages are walked without being drawn and put back
// (pagePolicy.victimWhereStill), the same victim at less cost when none is accepted.
func (o *evictOrder) VictimWhereStill(accept func(string) bool, limit int) (string, bool) {
	return o.victimWhere(accept, limit, true)
}

func (o *evictOrder) victimWhere(accept func(string) bool, limit int, still bool) (string, bool) {
	if o.pages.Len() == 0 {
		return o.plain.VictimWhere(accept, limit)
	}
	protect := o.Len() > 1
	plainAccept := accept
	if newest := o.plain.newest; protect && newest != nil {
		// Policy hands out its newest key once it refused the rest: not while pages are left.
		plainAccept = func(k string) bool { return k != newest.key && accept(k) }
	}
	pagesFirst := o.pagesFirst()
	for range 2 {
		if pagesFirst {
			pages := o.pages.victimWhere
			if still {
				pages = o.pages.victimWhereStill
			}
			if k, ok := pages(accept, limit, protect); ok {
				return k, true
			}
		} else if k, ok := o.plain.VictimWhere(plainAccept, limit); ok {
			return k, true
		}
		pagesFirst = !pagesFirst
	}
	return "", false
}

// pagesFirst reports whether the next draw goes to the pages.
func (o *evictOrder) pagesFirst() bool {
	_, pages, _ := o.next()
	return pages
}

// NextPriority is where the next draw starts, on the clock: the priority of the lowest
// page or the stamp of the plain key examined first, whichever is older; ok is false
// without keys. (The draw may pass that key over: held, or a plain key with hits.)
func (o *evictOrder) NextPriority() (prio int64, ok bool) {
	prio, _, ok = o.next()
	return prio, ok
}

// next is the clock value the next draw starts at and whether it goes to the pages.
func (o *evictOrder) next() (prio int64, pages, ok bool) {
	pp, okp := o.pages.minPriority()
	ps, oks := o.plain.nextStamp()
	switch {
	case okp && (!oks || pp < ps):
		return pp, true, true
	case oks:
		return ps, false, true
	}
	return 0, false, false
}
