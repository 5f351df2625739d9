package daemon

import (
	"slices"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
)

// holding is one master holder, shared by every external holder of the same key
// version on this owner. A holding of the key's current version is the owner's
// "cached info": a get finds it in the holderCache and needs no master trip.
type holding struct {
	key      string
	putID    int64
	offset   int64
	len      int64
	source   common.Source
	masterID int64     // the master's holder id: acked (BatchDeleteAck) once nobody holds it
	refs     int       // external holders referring to it
	idle     time.Time // when refs dropped to 0 while cached (zero: in use or not cached)
	// replica: the holding views the key's memory replica itself (local reuse or a
	// promoted refill), so keeping it cached after release costs no extra memory. A
	// temporary refill target is released at once instead: its space serves the next
	// refill rather than pushing a replica out.
	replica bool
	// remote: the bytes were pulled from another owner's replica.
	remote bool
}

// holderCache is the owner's cached info: for each key, the holding of its current
// version that this owner has, held by externals or idle within its grace period. It
// is a plain deterministic type, not safe for concurrent use (Owner.mu protects it);
// time is passed in, and it never calls the master: methods that let a holding go
// return the master holder ids the caller must ack.
//
// The invalidation sequence guards the window of a master trip. A get that missed
// reads seq() before calling GetStart and hands the result to install with that
// value; if any invalidation (a put or delete through this owner, the master's
// InvalidateCachedInfo, a re-registration) happened in between, install does not
// cache the result: it may be a version the invalidation already declared dead. The
// get still hands its holder out (the bytes are a consistent version that was current
// during the call), it just does not keep it for later gets.
type holderCache struct {
	grace time.Duration // ≤ 0: released holdings are never kept idle
	byKey map[string]*holding
	idle  map[*holding]struct{} // cached holdings with refs == 0, in their grace period
	seq   uint64                // bumped by every invalidation
}

func newHolderCache(grace time.Duration) *holderCache {
	return &holderCache{grace: grace, byKey: make(map[string]*holding), idle: make(map[*holding]struct{})}
}

// lookup returns the cached holding of key, or nil.
func (c *holderCache) lookup(key string) *holding { return c.byKey[key] }

// invalSeq is the invalidation sequence to pass to install after a master trip.
func (c *holderCache) invalSeq() uint64 { return c.seq }

// ref adds an external holder to h, reviving it if it was idle.
func (c *holderCache) ref(h *holding) {
	if h.refs == 0 {
		delete(c.idle, h)
		h.idle = time.Time{}
	}
	h.refs++
}

// unref drops an external holder of h at now. When it was the last one, a cached
// replica holding stays idle for the grace period (ack 0); anything else is let go
// and its master id returned for acking.
func (c *holderCache) unref(h *holding, now time.Time) (ack int64) {
	if h.refs <= 0 {
		panic("BUG: holding released more often than held")
	}
	h.refs--
	if h.refs > 0 {
		return 0
	}
	if c.byKey[h.key] == h && c.grace > 0 && h.replica {
		h.idle = now
		c.idle[h] = struct{}{}
		return 0
	}
	return c.forget(h)
}

// forget removes an unreferenced holding from the cache and returns its master id.
func (c *holderCache) forget(h *holding) int64 {
	if c.byKey[h.key] == h {
		delete(c.byKey, h.key)
	}
	delete(c.idle, h)
	h.idle = time.Time{}
	return h.masterID
}

// install offers h, fresh from the master, for caching; seq is what invalSeq said
// before the master call. It returns the holding the get must reference (a cached one
// of the same version wins, and h's master id is then returned for acking) and any
// master id let go. The caller refs the returned holding.
func (c *holderCache) install(h *holding, seq uint64) (use *holding, acks []int64) {
	cur := c.byKey[h.key]
	switch {
	case cur != nil && cur.putID == h.putID:
		return cur, []int64{h.masterID} // a concurrent get cached the same version: share it
	case seq == c.seq && (cur == nil || cur.putID < h.putID):
		if cur != nil {
			delete(c.byKey, h.key)
			if cur.refs == 0 {
				acks = append(acks, c.forget(cur))
			}
		}
		c.byKey[h.key] = h
	}
	return h, acks
}

// invalidate drops the cached info of key if its version is ≤ upTo (math.MaxInt64:
// any version). Live holders keep their bytes; an idle holding is let go (ack ≠ 0).
func (c *holderCache) invalidate(key string, upTo int64) (ack int64) {
	c.seq++
	h := c.byKey[key]
	if h == nil || h.putID > upTo {
		return 0
	}
	delete(c.byKey, key)
	if h.refs == 0 {
		return c.forget(h)
	}
	return 0
}

// sweep lets go of idle holdings whose grace ended by now (all of them with force),
// returning their master ids in ascending order.
func (c *holderCache) sweep(now time.Time, force bool) []int64 {
	var acks []int64
	for h := range c.idle {
		if force || !now.Before(h.idle.Add(c.grace)) {
			acks = append(acks, c.forget(h))
		}
	}
	slices.Sort(acks)
	return acks
}

// reset forgets every cached info without acking: a new master registration knows
// none of these holders (held ones are reported to it as pins and acked when released).
func (c *holderCache) reset() {
	c.seq++
	for h := range c.idle {
		h.idle = time.Time{}
	}
	clear(c.byKey)
	clear(c.idle)
}

// len is the number of cached keys; idleLen the number of idle holdings.
func (c *holderCache) len() int     { return len(c.byKey) }
func (c *holderCache) idleLen() int { return len(c.idle) }
