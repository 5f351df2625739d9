package master

import "container/heap"

// The pages of a node whose version has no SSD copy yet are dirty: with SSD write-back
// (Options.SSDAdmit = SSDAdmitEvict, writeback.go) they reach SSD as they near the end of
// the eviction order instead of at their put. pagePolicy keeps them in a second heap in
// its own order, so the write-back takes the next victims among them in O(log n).

// markDirty makes live page k dirty (no longer ahead); it reports whether k is a live page.
func (p *pagePolicy) markDirty(k string) bool {
	e := p.entries[k]
	if e == nil {
		return false
	}
	p.notAhead(e)
	if e.dindex < 0 {
		heap.Push(&p.dirty, e)
	}
	return true
}

// takeDirty takes the dirty page that is evicted first: it is no longer dirty, and
// counts ahead (p.ahead) until it is used, dropped or unahead. ok is false when no page
// is dirty.
func (p *pagePolicy) takeDirty() (k string, ok bool) {
	if len(p.dirty) == 0 {
		return "", false
	}
	k = p.dirty[0].key
	return k, p.takeDirtyKey(k)
}

// takeDirtyKey is takeDirty of dirty page k; false when k is not dirty.
func (p *pagePolicy) takeDirtyKey(k string) bool {
	e := p.entries[k]
	if e == nil || e.dindex < 0 {
		return false
	}
	heap.Remove(&p.dirty, e.dindex)
	e.isAhead = true
	p.ahead += e.weight
	return true
}

// cleanDirty makes page k not dirty (a copy of it reached SSD another way).
func (p *pagePolicy) cleanDirty(k string) {
	if e := p.entries[k]; e != nil && e.dindex >= 0 {
		heap.Remove(&p.dirty, e.dindex)
	}
}

// unahead stops counting page k ahead (its write-back failed).
func (p *pagePolicy) unahead(k string) {
	if e := p.entries[k]; e != nil {
		p.notAhead(e)
	}
}

// notAhead stops counting e ahead: it was used (it is no longer among the next victims),
// dropped, or its write-back failed.
func (p *pagePolicy) notAhead(e *pageEntry) {
	if e.isAhead {
		e.isAhead = false
		p.ahead -= e.weight
	}
}
