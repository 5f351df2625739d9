package daemon

// One flight per key (groupcache's singleflight, inside ownerState): concurrent gets of
// one key on this owner that miss the hot set share one master plan, and so one pull or
// SSD refill. The first get to miss leads the flight; the others follow: they wait for
// it to land and then take their own holder of the leader's holding, installed in the
// hot set under the same hold of Owner.mu that ends the flight. Only gets that joined
// before the leader's master call was sent (sent) follow it: the answer then describes
// the key at a moment inside each follower's get. A get that comes later (an answer
// of that call may predate an overwrite elsewhere that returned before this get began)
// queues instead for the flight behind it (next), which starts once that one landed:
// its first get leads it, looking at the hot set again first (a replica holding may be
// there by then: the hot set's own rule, cachedGet), and the gets after it follow it
// until its call is sent. Many gets of one cold key arriving while its first plan is
// out so make two plans, not one each. A follower that still misses (the leader
// failed, its session ended, an invalidation kept the holding out of the hot set)
// plans again, except after the leader's first plan found the key absent and no
// invalidation of the key has reached this owner since the leader missed: that
// KEY_NOT_FOUND it shares. A NO_SPACE (the master found no room for the value) it
// shares once it waited roomWaitShared on the flight, and so does a queued flight's
// leader about the flight it queued behind: planning again would wait another
// AllocWait under the same pressure. A leader whose session ended before its holding
// could reach it, or holds its holder cap, leaves that holding to its followers
// (keepForFollowers): the flight holds it until each of them has looked.

import (
	"errors"
	"time"
)

// flight is one get of a key in progress: done closes when it lands, err is its outcome.
type flight struct {
	done      chan struct{}
	err       error
	seq       uint64 // the hot set's invalidation sequence when the leader missed (a miss's own: after it)
	shareMiss bool   // err is the answer to the leader's first plan
	followers int    // gets waiting for it
	// sent: the leader's master call was sent; gets coming later queue behind (next).
	// h: the leader's holding, installed in the hot set when it landed.
	sent bool
	h    *holding
	// kept: followers still to look at h, which the flight holds a reference to for
	// them (keepForFollowers); the last one drops it (followerLooked).
	kept int
	// next: the flight queued behind this one by a get that joined after this one's
	// call was sent. after, of a queued flight: the flight its leader waits for.
	next, after *flight
}

// joinFlight returns the flight of key in progress whose call was not sent yet, or
// starts one that the caller leads (lead) and must end with endFlight: at once, or,
// when f.after is set, once that flight landed (a flight queued behind one whose call
// was sent). seq is the caller's invalidation sequence.
func (st *ownerState) joinFlight(key string, seq uint64) (f *flight, lead bool) {
	if f = st.flights[key]; f != nil {
		for f.sent {
			if f.next == nil {
				f.next = &flight{done: make(chan struct{}), seq: seq, after: f}
				return f.next, true
			}
			f = f.next
		}
		f.followers++
		return f, false
	}
	if st.flights == nil {
		st.flights = make(map[string]*flight)
	}
	f = &flight{done: make(chan struct{}), seq: seq}
	st.flights[key] = f
	return f, true
}

// endFlight lands the flight f of key with its outcome, waking its followers.
func (st *ownerState) endFlight(key string, f *flight, err error) {
	if f == nil {
		return
	}
	if st.flights[key] == f {
		if f.next != nil {
			st.flights[key] = f.next // queued behind f: joinable until its call is sent
		} else {
			delete(st.flights, key)
		}
	}
	if errors.As(err, new(holderCapError)) {
		// The leader's session is at its cap, its own state: the followers take the
		// holding it left them (keepForFollowers), or else plan on their own.
		err = nil
	}
	f.err = err
	close(f.done)
}

// keepForFollowers lands the holding h (target t) of a flight whose leader cannot take
// it (its session closed, or holds its holder cap) while f has followers: they joined
// before the leader's call was sent, so they may take their holders of h (follow)
// rather than plan again. h goes into the hot set as finishGet would put it, with one
// reference of the flight's until every follower has looked. The leader's own answer
// is own. (A leader whose session ended before its flight's call was sent brings in
// nothing: leadLanded ends that flight with errSessionClosed(), and its followers plan.)
func (st *ownerState) keepForFollowers(f *flight, t *getTarget, h *holding, seq uint64, own error) error {
	if st.endGet(t) {
		st.ack(h.masterID)
		return errGetMasterChanged()
	}
	h, acks := st.hot.install(h, seq)
	st.ack(acks...)
	st.refHolding(h)
	f.h, f.kept = h, f.followers
	return own
}

// followerLooked: a follower of f has taken its holder of f.h or decided not to; the
// last one drops the reference keepForFollowers took.
func (st *ownerState) followerLooked(f *flight, now time.Time) {
	if f.kept == 0 {
		return
	}
	if f.kept--; f.kept == 0 {
		st.unrefHolding(f.h, now)
	}
}
