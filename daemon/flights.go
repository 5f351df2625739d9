package daemon

// One flight per key (groupcache's singleflight, inside ownerState): concurrent gets of
// one key on this owner that miss the hot set share one master plan, and so one pull or
// SSD refill. The first get to miss leads the flight; the others follow: they wait for
// it to land and then take their own holder of the leader's holding, installed in the
// hot set under the same hold of Owner.mu that ends the flight. A follower shares what
// the leader got only if it joined before the leader's master call was sent (sent):
// the answer then describes the key at a moment inside the follower's get. One that
// joined later takes only a replica holding (the hot set's own rule: cachedGet), and
// shares no miss. A follower that still misses (the leader failed, its session ended,
// an invalidation kept the holding out of the hot set, it joined late) plans again,
// except after the leader's first plan found the key absent, the follower joined
// before that call and no invalidation of the key has reached this owner since the
// leader missed: that KEY_NOT_FOUND it shares.

// flight is one get of a key in progress: done closes when it lands, err is its outcome.
type flight struct {
	done      chan struct{}
	err       error
	seq       uint64 // the hot set's invalidation sequence when the leader missed
	shareMiss bool   // err is the answer to the leader's first plan
	followers int    // gets waiting for it
	// sent: the leader's master call was sent; followers joining later share only a
	// replica holding. h: the leader's holding, installed in the hot set when it landed.
	sent bool
	h    *holding
}

// joinFlight returns the flight of key in progress, or starts one that the caller leads
// (lead) and must end with endFlight; seq is the caller's invalidation sequence.
func (st *ownerState) joinFlight(key string, seq uint64) (f *flight, lead bool) {
	if f = st.flights[key]; f != nil {
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
		delete(st.flights, key)
	}
	f.err = err
	close(f.done)
}
