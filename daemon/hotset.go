package daemon

import (
	"container/list"
	"slices"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
)

// holding is one master holder, shared by every external holder of the same key
// version on this owner. The holding of a key's current version is in the hot set: a
// get finds it there and needs no master trip when it is the key's replica here
// (ownerState.cachedGet).
type holding struct {
	key      string
	putID    int64
	offset   int64
	len      int64
	source   common.Source
	masterID int64         // the master's holder id: acked (BatchDeleteAck) once nobody holds it
	refs     int           // external holders referring to it
	idle     time.Time     // when refs dropped to 0 while in the hot set (zero: in use or not in it)
	elem     *list.Element // its place in hotSet.idle while idle
	// replica: the holding views the key's memory replica itself (local reuse or a
	// promoted refill), so keeping it in the hot set after release costs no extra memory. A
	// temporary refill target is released at once instead: its space serves the next
	// refill rather than pushing a replica out.
	replica bool
	// remote: the bytes were pulled from another owner's replica.
	remote bool
	// noticesSeq: for a replica, the last eviction notice the master had numbered for
	// this owner when it answered (notices up to it are older than the replica).
	noticesSeq int64
	// write is its entry in segmentWrites while externals reference it (refs > 0).
	write *segmentWrite
	// pins counts the prefix-lookup pins of it, every session's: its bytes count
	// against the pin budget once while any is in force (pins.go).
	pins int
}

// hotSet is the owner's hot set: for each key, the holding of its current version
// that this owner has, held by externals or idle within its grace period. (Older notes
// and the wire call it "cached info": InvalidateCachedInfo drops keys from it.) It is a
// plain deterministic type inside ownerState; time is passed in, and it never calls
// the master: methods that let a holding go return the master holder ids the caller
// must ack.
//
// Its idle holdings are replicas of this segment the owner serves without a master
// trip, each kept alive by its master holder (a pin: the master never frees a held
// range, and its eviction passes over held replicas). They are bounded by the budget
// (bytes; the least recently released go first), the grace period, an invalidation of
// their key, and the master's ReleaseHotSet when it needs the space. Gets answer from
// it only under the lease (registration.go).
//
// The invalidation sequence guards the window of a master trip. A get that missed
// reads invalSeq() before calling GetStart and hands the result to install with that
// value; if an invalidation of its key that covers the result's version (a put or
// delete through this owner, the master's InvalidateCachedInfo, a miss at the master)
// or a reset (a re-registration) happened in between, install does not keep the result:
// it may be a version the invalidation already declared dead. The get still hands its
// holder out (the bytes are a consistent version that was current during the call), it
// just does not keep it for later gets. An invalidation of older versions only does not
// stop it (a put's background invalidation may arrive after a get of that put's own
// version was planned). The hot set remembers the keys and versions of its last
// invalNotes invalidations; a trip that saw more of them keeps nothing.
type hotSet struct {
	grace     time.Duration // ≤ 0: released holdings are never kept idle
	budget    int64         // most bytes of idle holdings (≤ 0: none are kept)
	byKey     map[string]*holding
	idle      list.List // hot-set holdings with refs == 0, least recently released first
	idleBytes int64
	pinned    int64 // bytes of prefix-lookup pins (pins.go), inside budget too
	// pinBudget, when > 0, bounds the pins instead of budget: an owner whose hot set
	// is off still pins what a prefix lookup found (pins.go).
	pinBudget int64
	seq       uint64 // bumped by every invalidation and reset
	// notes[s%invalNotes] is what invalidation s invalidated: a key's versions up to
	// one, or all (a reset).
	notes [invalNotes]invalNote
}

// invalNotes is how many recent invalidations the hot set remembers for install.
const invalNotes = 1024

type invalNote struct {
	key  string
	upTo int64 // the key's versions ≤ upTo were declared dead
	all  bool
}

// noteInval records invalidation n as the next in the sequence.
func (c *hotSet) noteInval(n invalNote) {
	c.seq++
	c.notes[c.seq%invalNotes] = n
}

// invalidatedSince reports whether an invalidation after seq may have declared version
// putID of key dead; putID 0 asks about any invalidation of key (a put or delete of it
// reached this owner). An invalidation of older versions only (a put's background
// InvalidateCachedInfo that arrives after a get of that put's version was planned) leaves
// the version alone.
func (c *hotSet) invalidatedSince(key string, putID int64, seq uint64) bool {
	if c.seq-seq >= invalNotes {
		return true
	}
	for s := seq + 1; s <= c.seq; s++ {
		if n := c.notes[s%invalNotes]; n.all || (n.key == key && n.upTo >= putID) {
			return true
		}
	}
	return false
}

// diedSince reports whether an invalidation after seq declared version putID of key
// dead; known is false when the hot set cannot tell: it forgot the invalidations since,
// or a reset came and no kill of the version is noted.
func (c *hotSet) diedSince(key string, putID int64, seq uint64) (dead, known bool) {
	if c.seq-seq >= invalNotes {
		return false, false
	}
	known = true
	for s := seq + 1; s <= c.seq; s++ {
		n := c.notes[s%invalNotes]
		if n.key == key && n.upTo >= putID && !n.all {
			return true, true
		}
		known = known && !n.all // a reset: only a kill noted besides tells
	}
	return false, known
}

func newHotSet(grace time.Duration, budget, pinBudget int64) *hotSet {
	return &hotSet{grace: grace, budget: budget, pinBudget: pinBudget, byKey: make(map[string]*holding)}
}

// lookup returns the hot-set holding of key, or nil.
func (c *hotSet) lookup(key string) *holding { return c.byKey[key] }

// invalSeq is the invalidation sequence to pass to install after a master trip.
func (c *hotSet) invalSeq() uint64 { return c.seq }

// ref adds an external holder to h, reviving it if it was idle.
func (c *hotSet) ref(h *holding) {
	if h.refs == 0 {
		c.unidle(h)
	}
	h.refs++
}

// unidle takes h off the idle list, if it is on it.
func (c *hotSet) unidle(h *holding) {
	if h.elem != nil {
		c.idle.Remove(h.elem)
		c.idleBytes -= h.len
		h.elem = nil
	}
	h.idle = time.Time{}
}

// unref drops an external holder of h at now. When it was the last one, a cached
// replica holding stays idle (in the hot set) for the grace period, and the oldest
// idle holdings past the budget are let go; anything else is let go at once. It
// returns the master ids let go, for acking.
func (c *hotSet) unref(h *holding, now time.Time) (acks []int64) {
	if h.refs <= 0 {
		panic("BUG: holding released more often than held")
	}
	h.refs--
	if h.refs > 0 {
		return nil
	}
	if c.byKey[h.key] != h || c.grace <= 0 || !h.replica || h.len > c.budget {
		return []int64{c.forget(h)}
	}
	h.idle = now
	h.elem = c.idle.PushBack(h)
	c.idleBytes += h.len
	return append(acks, c.trim()...)
}

// trim lets go of the least recently released idle holdings while idle and pinned
// bytes exceed the budget, returning their master ids.
func (c *hotSet) trim() (acks []int64) {
	for c.idleBytes+c.pinned > c.budget && c.idle.Len() > 0 {
		acks = append(acks, c.forget(c.idle.Front().Value.(*holding)))
	}
	return acks
}

// pinLimit is the most bytes the pins may keep: pinBudget, or else the budget.
func (c *hotSet) pinLimit() int64 {
	if c.pinBudget > 0 {
		return c.pinBudget
	}
	return c.budget
}

// reservePin counts n more pinned bytes against the budget, letting idle holdings go
// to make room (their master ids returned); ok is false, and nothing changes, when the
// pins alone would exceed it.
func (c *hotSet) reservePin(n int64) (acks []int64, ok bool) {
	if c.pinned+n > c.pinLimit() {
		return nil, false
	}
	c.pinned += n
	return c.trim(), true
}

// unpin gives back n pinned bytes.
func (c *hotSet) unpin(n int64) { c.pinned -= n }

// forget removes an unreferenced holding from the hot set and returns its master id.
func (c *hotSet) forget(h *holding) int64 {
	if c.byKey[h.key] == h {
		delete(c.byKey, h.key)
	}
	c.unidle(h)
	return h.masterID
}

// release lets go of idle holdings, least recently released first, until at least
// bytes are released (bytes ≤ 0: all of them). It returns their master ids and the
// bytes released.
func (c *hotSet) release(bytes int64) (acks []int64, released int64) {
	for c.idle.Len() > 0 && (bytes <= 0 || released < bytes) {
		h := c.idle.Front().Value.(*holding)
		released += h.len
		acks = append(acks, c.forget(h))
	}
	return acks, released
}

// releaseKeys lets go of the idle holdings of keys (the master's eviction order reached
// them); a holding an external still uses stays. It returns their master ids and bytes.
func (c *hotSet) releaseKeys(keys []string) (acks []int64, released int64) {
	for _, k := range keys {
		if h := c.byKey[k]; h != nil && h.refs == 0 && h.elem != nil {
			released += h.len
			acks = append(acks, c.forget(h))
		}
	}
	return acks, released
}

// install offers h, fresh from the master, for caching; seq is what invalSeq said
// before the master call. It returns the holding the get must reference (one in the hot set
// of the same version wins, and h's master id is then returned for acking) and any
// master id let go. The caller refs the returned holding.
func (c *hotSet) install(h *holding, seq uint64) (use *holding, acks []int64) {
	cur := c.byKey[h.key]
	switch {
	case cur != nil && cur.putID == h.putID && h.replica && !cur.replica:
		// The replica's holding answers later gets (cachedGet); cur stays for its
		// holders and goes at its last release, no longer the hot set's.
		if cur.refs == 0 {
			acks = append(acks, c.forget(cur))
		}
		c.byKey[h.key] = h
		return h, acks
	case cur != nil && cur.putID == h.putID:
		return cur, []int64{h.masterID} // a concurrent get installed the same version: share it
	case !c.invalidatedSince(h.key, h.putID, seq) && (cur == nil || cur.putID < h.putID):
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

// invalidate drops key from the hot set if its version is ≤ upTo (math.MaxInt64:
// any version). Live holders keep their bytes; an idle holding is let go (ack ≠ 0).
func (c *hotSet) invalidate(key string, upTo int64) (ack int64) {
	c.noteInval(invalNote{key: key, upTo: upTo})
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
func (c *hotSet) sweep(now time.Time, force bool) []int64 {
	var acks []int64
	for c.idle.Len() > 0 {
		h := c.idle.Front().Value.(*holding)
		if !force && now.Before(h.idle.Add(c.grace)) {
			break // the rest were released later
		}
		acks = append(acks, c.forget(h))
	}
	slices.Sort(acks)
	return acks
}

// reset empties the hot set without acking: a new master registration knows
// none of these holders (held ones are reported to it as pins and acked when released).
// It returns the master ids of the idle holdings it let go: a registration that fails
// leaves them with the master it had, which must be told (ownerState.endRegister).
func (c *hotSet) reset() (idle []int64) {
	c.noteInval(invalNote{all: true})
	for c.idle.Len() > 0 {
		h := c.idle.Front().Value.(*holding)
		c.unidle(h)
		idle = append(idle, h.masterID)
	}
	clear(c.byKey)
	return idle
}

// len is the number of keys in the hot set; idleLen the number of idle holdings.
func (c *hotSet) len() int     { return len(c.byKey) }
func (c *hotSet) idleLen() int { return c.idle.Len() }
