package daemon

import (
	"container/heap"
	"maps"
	"slices"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// Pins of a prefix lookup (BatchExists with pin_ms): each page the lookup found is
// brought into this owner's memory and held for a short time by a holder of the
// session that asked, so the load that follows finds it in the hot set and no eviction
// takes it meanwhile (the master never frees a held range). A pin needs no call to end:
// it ends when its time is up (swept with the hot set's grace periods), when its
// session ends, or when the session gets the key (its own holder takes over). Pinned
// bytes count against the hot-set budget (hotSet.reservePin): a page that does not fit
// is not pinned. A pin remembers where the lookup got the page (memory or SSD, here or
// on another owner): the get that takes it over reports that place, since the lookup
// moved the bytes for that load.

// pin is one pinned page: holder is the session's external holder id that keeps it,
// h the holding it refers to.
type pin struct {
	c      *session
	key    string
	holder int64
	h      *holding
	until  time.Time
	index  int // in pinQueue
	// source and remote: what the lookup's get of the page answered.
	source common.Source
	remote bool
}

// pinQueue orders the pins of every session by deadline (container/heap).
type pinQueue []*pin

func (q pinQueue) Len() int           { return len(q) }
func (q pinQueue) Less(i, j int) bool { return q[i].until.Before(q[j].until) }
func (q pinQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *pinQueue) Push(x any) {
	p := x.(*pin)
	p.index = len(*q)
	*q = append(*q, p)
}
func (q *pinQueue) Pop() any {
	old := *q
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	p.index = -1
	return p
}

// pinHolder pins the page of the get that answered got to c until until. It reports
// false (and pins nothing; a pin of another version of the key the session held is
// gone too) when the hot-set budget has no room for it, or the session's pins would pass
// its share of it (pinShare) while, within pinContention, a session within its own share
// found no room because of the others' pins (a session's first page is within its share
// however large: with many sessions a share may be smaller than a page). Such a session
// first makes the others past its share shrink to it (pastShare) where that makes room
// for its page: one client's
// lookups cannot keep every pin and leave the others counting nothing; while nobody
// lacks room, a session may use the whole budget. The caller releases the holder when it reports false. A page several
// sessions pin counts once against the budget (the same bytes), and against each
// session's share. A pin of the same key the session already has is replaced.
func (st *ownerState) pinHolder(c *session, key string, got *external.GetResponse, until, now time.Time) bool {
	id := got.HolderId
	h := c.holders[id]
	if h == nil {
		return false
	}
	old := c.pins[key]
	held := c.pinned
	if old != nil {
		held -= old.h.len
	}
	share := st.pinShare(c)
	within := held+h.len <= share || held == 0 // (one page, however large, is within)
	if !within && now.Before(st.pinContended.Add(pinContention)) {
		return false
	}
	if old != nil && old.h != h {
		st.unpin(old, now) // another version's: its room first
		old = nil
	}
	if h.pins == 0 {
		acks, ok := st.hot.reservePin(h.len)
		st.ack(acks...)
		if !ok && within && st.othersPin(c) {
			// Others' pins left no room within its share: the sessions past it
			// shrink to it now (and pin no more past theirs for pinContention), if
			// that makes room for this page (else nobody sheds for nothing).
			if shed := st.pastShare(c, share); st.hot.pinned-freedBy(shed)+h.len <= st.hot.pinLimit() {
				st.pinContended = now
				for _, p := range shed {
					st.unpin(p, now)
				}
				acks, ok = st.hot.reservePin(h.len)
				st.ack(acks...)
			}
		}
		if !ok {
			return false
		}
	}
	h.pins++ // before the old pin's end: it is of h too, which stays charged
	if old != nil {
		st.unpin(old, now)
	}
	p := &pin{c: c, key: key, holder: id, h: h, until: until, source: got.Source, remote: got.Remote}
	st.addPinned(c, h.len)
	if c.pins == nil {
		c.pins = make(map[string]*pin)
	}
	c.pins[key] = p
	heap.Push(&st.pins, p)
	if st.pinKeys == nil {
		st.pinKeys = make(map[string][]*pin)
	}
	st.pinKeys[key] = append(st.pinKeys[key], p)
	return true
}

// pinContention is how long after a session within its share of the pin budget found
// no room the sessions past their share add and renew no pin (their pins end within it:
// MAX_PIN_MS).
const pinContention = time.Duration(external.MAX_PIN_MS) * time.Millisecond

// pinShare is c's share of the pin budget: the budget over the sessions that pin, c
// counted, and at least two (so a session alone, or one of two, may keep half whoever
// comes: the rule of two sessions at half, which left a third none).
func (st *ownerState) pinShare(c *session) int64 {
	n := st.pinSessions
	if c.pinned == 0 {
		n++
	}
	return st.hot.pinLimit() / int64(max(2, n))
}

// pastShare lists the pins of every session but c past share bytes, those that expire
// soonest first, whose end leaves each of them at share.
func (st *ownerState) pastShare(c *session, share int64) []*pin {
	var out []*pin
	for _, s := range st.sessions {
		if s == c || s.pinned <= share {
			continue
		}
		ps := slices.Collect(maps.Values(s.pins))
		slices.SortFunc(ps, func(a, b *pin) int { return a.until.Compare(b.until) })
		left := s.pinned
		for _, p := range ps {
			if left <= share {
				break
			}
			out = append(out, p)
			left -= p.h.len
		}
	}
	return out
}

// freedBy is what the end of the pins ps gives back to the pin budget: the bytes of
// each page all of whose pins are among them (a page another pin keeps stays charged).
func freedBy(ps []*pin) int64 {
	ended := make(map[*holding]int, len(ps))
	var freed int64
	for _, p := range ps {
		if ended[p.h]++; ended[p.h] == p.h.pins {
			freed += p.h.len
		}
	}
	return freed
}

// addPinned counts n more bytes of c's pins (n < 0: fewer), and the sessions with pins.
func (st *ownerState) addPinned(c *session, n int64) {
	was := c.pinned > 0
	c.pinned += n
	switch is := c.pinned > 0; {
	case is && !was:
		st.pinSessions++
	case was && !is:
		st.pinSessions--
	}
}

// othersPin reports whether a session other than c has pins.
func (st *ownerState) othersPin(c *session) bool {
	if c.pinned > 0 {
		return st.pinSessions > 1
	}
	return st.pinSessions > 0
}

// forgetPinKey takes p out of pinKeys.
func (st *ownerState) forgetPinKey(p *pin) {
	ps := slices.DeleteFunc(st.pinKeys[p.key], func(q *pin) bool { return q == p })
	if len(ps) == 0 {
		delete(st.pinKeys, p.key)
	} else {
		st.pinKeys[p.key] = ps
	}
}

// unpin ends p: its bytes leave the budget and its holder is released.
func (st *ownerState) unpin(p *pin, now time.Time) {
	if p.c.pins[p.key] != p {
		return
	}
	delete(p.c.pins, p.key)
	st.endPin(p)
	st.release(p.c, p.holder, now)
}

// endPin takes p out of the queue and the key index, and its bytes out of its
// session's count and, with the holding's last pin, out of the budget.
func (st *ownerState) endPin(p *pin) {
	st.forgetPinKey(p)
	if p.index >= 0 {
		heap.Remove(&st.pins, p.index)
	}
	st.addPinned(p.c, -p.h.len)
	if p.h.pins--; p.h.pins == 0 {
		st.hot.unpin(p.h.len)
	}
}

// unpinDead ends every session's pin of a version of key ≤ upTo, which a put or delete
// declared dead: it held the dead version's bytes (the master cannot free them) and its
// share of the hot-set budget until its time was up. (Until this invalidation arrives
// the pinning session may still load the version its lookup found: docs/hot-set.md.)
func (st *ownerState) unpinDead(key string, upTo int64) {
	ps := st.pinKeys[key]
	if len(ps) == 0 { // the common case: every put's publish invalidates its key
		return
	}
	now := time.Now()
	for _, p := range slices.Clone(ps) {
		if h := p.c.holders[p.holder]; h == nil || h.putID <= upTo {
			st.unpin(p, now)
		}
	}
}

// takeOverPin ends c's pin of key, if any: the session now holds the key itself
// through resp, the answer of its get of h. When that get moved nothing (here: its
// bytes were in this owner's memory) and the pin viewed the same version, resp reports
// where the pin's lookup got the bytes: they were moved for this load.
func (st *ownerState) takeOverPin(c *session, key string, h *holding, resp *external.GetResponse, here bool, now time.Time) {
	p := c.pins[key]
	if p == nil {
		return
	}
	if ph := c.holders[p.holder]; here && ph != nil && ph.putID == h.putID {
		resp.Source, resp.Remote = p.source, p.remote
	}
	st.unpin(p, now)
}

// pinsHolding reports whether c pins key with a holder of h's version.
func (c *session) pinsHolding(key string, h *holding) bool {
	p := c.pins[key]
	if p == nil {
		return false
	}
	ph := c.holders[p.holder]
	return ph != nil && ph.putID == h.putID
}

// expirePins ends the pins whose time is up at now.
func (st *ownerState) expirePins(now time.Time) {
	for len(st.pins) > 0 && !now.Before(st.pins[0].until) {
		p := st.pins[0]
		if p.c.pins[p.key] == p {
			st.unpin(p, now)
		} else {
			heap.Pop(&st.pins)
		}
	}
}

// dropPins ends c's pins without releasing their holders (endSession releases every
// holder of the session).
func (st *ownerState) dropPins(c *session) {
	for _, p := range c.pins {
		st.endPin(p)
	}
	c.pins = nil
}

// pinned is the number of pins in force (for Stat and tests).
func (st *ownerState) pinned() int { return len(st.pins) }
