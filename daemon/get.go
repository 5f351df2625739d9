package daemon

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fluxkv/fluxkv/internal/workers"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// The owner's get path, one file per step:
//   get.go        the entry: the hot set first (no master trip), else one flight per key
//                 (flights.go) planned in one master call per batch (get_plan.go)
//   get_batch_pull.go  a batch's values in other owners' memory: one pipelined pull per
//                 source before the gets complete
//   get_plan.go   GetStart and the re-plan loop; revokes
//   get_local.go  a memory replica in this segment: the master reused it, nothing moves
//   get_remote.go a memory replica on another owner: pull it over the data plane
//   get_ssd.go    an SSD replica on this owner: refill into the target, confirm
// The hot set (hotset.go) and the rest of the owner's bookkeeping (ownerstate.go) are
// plain types under Owner.mu.

// getResult is one key's answer to a get.
type getResult struct {
	resp *external.GetResponse
	err  error
	// cached: a cached holding answered it (the hot set, or its flight's): no master
	// trip of its own.
	cached bool
}

// get hands the session a holder of key (getMany of one key).
func (o *Owner) get(c *session, key string) (*external.GetResponse, error) {
	r := o.getMany(c, []string{key})
	o.countGets(r)
	return r[0].resp, r[0].err
}

// getMany hands the session a holder of each key, answered in key order: from the hot
// set when it has the key's current version as a replica here, held or released within
// the grace period (no master trip; cachedGet), else through a flight of the key
// (flights.go): the keys this call leads are planned with one master call
// (BatchGetStart; GetStart for one key) and brought in concurrently (lead); a key
// another get is already bringing in waits for that flight (or, when that flight's call
// was sent already, queues for the one behind it) and then takes its holder from the
// hot set (follow: the leader's holding, or a replica). One key's failure never fails
// the others.
func (o *Owner) getMany(c *session, keys []string) []getResult {
	out := make([]getResult, len(keys))
	var leads []getLeg
	var follows []getLeg
	st, now := o.lock(), time.Now()
	for i, k := range keys {
		if err := wire.ValidateKey(k); err != nil {
			out[i].err = err
			continue
		}
		resp, seq, err := st.cachedGet(c, k, now, nil)
		if err != nil || resp != nil {
			out[i] = getResult{resp: resp, err: err, cached: resp != nil}
			continue
		}
		f, lead := st.joinFlight(k, seq)
		leg := getLeg{i: i, key: k, seq: seq, f: f, joined: now}
		if lead {
			leads = append(leads, leg)
		} else {
			follows = append(follows, leg)
		}
	}
	o.unlock()
	o.lead(c, leads, out)
	// A follower whose flight left nothing in the hot set joins (or leads) a new flight
	// of its key once; after a second such miss it plans alone.
	for round := 0; len(follows) > 0; round++ {
		var again, alone []getLeg
		for _, leg := range follows {
			r, seq, ok := o.follow(c, leg)
			switch {
			case ok:
				out[leg.i] = r
			case round > 0:
				leg.f, leg.seq = nil, seq
				alone = append(alone, leg)
			default:
				leg.seq = seq
				again = append(again, leg)
			}
		}
		o.lead(c, alone, out)
		leads, follows = nil, nil
		st, now := o.lock(), time.Now()
		for _, leg := range again {
			f, lead := st.joinFlight(leg.key, leg.seq)
			leg.f, leg.joined = f, now
			if lead {
				leads = append(leads, leg)
			} else {
				follows = append(follows, leg)
			}
		}
		o.unlock()
		o.lead(c, leads, out)
	}
	return out
}

// countGets records what a client's Get or BatchGet answered for each key: a hit by
// source and locality (and whether a cached holding answered it), or a miss (a prefix
// lookup's pins, also getMany, are not gets).
func (o *Owner) countGets(rs []getResult) {
	for _, r := range rs {
		switch {
		case r.err == nil && r.resp != nil:
			o.opts.Metrics.GetHit(r.resp.Source == common.Source_SSD, r.resp.Remote, r.resp.Len)
			if r.cached && o.cachedGets != nil {
				o.cachedGets.Inc()
			}
		case errors.Is(r.err, wire.ErrKeyNotFound):
			o.opts.Metrics.GetMiss()
		}
	}
}

// getLeg is one key of a getMany that missed the hot set: out[i] answers it, seq is the
// hot set's invalidation sequence before its master trip, f its flight (nil: none),
// joined when it joined f.
type getLeg struct {
	i      int
	key    string
	seq    uint64
	f      *flight
	joined time.Time
}

// roomWaitShared: a get that waited this long on a flight of its key (following it, or
// queued behind it) that found no room for the value (NO_SPACE: the master's wait for
// room, AllocWait, ran out) takes that answer instead of planning again, which would
// wait another AllocWait under the same pressure. One that waited less plans on its
// own: the flight's NO_SPACE may have come at once, for room only that flight's batch
// held (a key outgrowing the segment beside the batch's other ranges).
const roomWaitShared = time.Second

// sharesNoSpace says whether a leg whose flight (or the flight it queued behind) landed
// with err takes that NO_SPACE as its own answer (roomWaitShared).
func (leg getLeg) sharesNoSpace(err error, now time.Time) bool {
	return wire.CodeOf(err) == common.ErrorCode_NO_SPACE && now.Sub(leg.joined) >= roomWaitShared
}

// getParallel bounds the keys of one batch brought in at once (pulls from other owners
// are also bounded per peer by the data plane).
const getParallel = 16

// planMaxAge is the oldest plan a batch's worker still carries out: a later one is
// revoked and planned again (GetStart). The master frees the target of a get that has
// not completed within its in-flight TTL (60 s by default), so a transfer must start
// early enough to end inside it: planMaxAge + TransferTimeout, and planMaxAge + a
// remote SSD refill's deadline (at most 45 s), must stay below the master's
// InflightTTL. A master with a shorter TTL lowers them all (bounds.go). It is above the
// master's AllocWait (5 s by default), the longest a BatchGetStart waits for room for
// its keys: at 5 s, every plan of a batch that had waited the whole AllocWait was
// revoked and planned again, one GetStart each, doubling the batch's wait.
const planMaxAge = 10 * time.Second

// lead plans legs with one master call per wire.MaxBatch keys, brings the values in
// concurrently (getParallel at once), hands each holder to c and lands each leg's
// flight. A leg whose plan failed lands at once, before any transfer of the batch runs.
// Legs whose flights are queued behind another flight of their key are led beside the
// others, as those flights land (leadQueued): each set found ready together has its own
// master call and getParallel transfers.
func (o *Owner) lead(c *session, legs []getLeg, out []getResult) {
	var queued []getLeg
	legs = slices.DeleteFunc(slices.Clone(legs), func(leg getLeg) bool {
		if leg.f != nil && leg.f.after != nil {
			queued = append(queued, leg)
			return true
		}
		return false
	})
	if len(queued) == 0 {
		o.leadNow(c, legs, out)
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.leadQueued(c, queued, out)
	}()
	o.leadNow(c, legs, out)
	<-done
}

// leadQueued leads flights queued behind another flight of their key (flights.go), while
// the caller leads the others: as the flights they wait for land, a leg the hot set
// answers then lands its flight with that answer (its followers look at the hot set
// again), and the legs found ready together are planned with one master call (leadNow),
// each set beside the others (a set's transfers hold back no other key's flight). A
// flight waited for never waits itself (it was sent), so neither does this for long.
func (o *Owner) leadQueued(c *session, legs []getLeg, out []getResult) {
	landed := make(chan int, len(legs))
	for j, leg := range legs {
		awaited := leg.f.after.done // read before leadLanded clears after
		go func() {
			<-awaited
			landed <- j
		}()
	}
	var sets sync.WaitGroup
	defer sets.Wait()
	for left := len(legs); left > 0; {
		ready := []getLeg{legs[<-landed]}
		for more := true; more; {
			select {
			case j := <-landed:
				ready = append(ready, legs[j])
			default:
				more = false
			}
		}
		left -= len(ready)
		sets.Go(func() { o.leadLanded(c, ready, out) })
	}
}

// leadLanded is leadQueued for legs whose awaited flights have landed.
func (o *Owner) leadLanded(c *session, legs []getLeg, out []getResult) {
	var run []getLeg
	st, now := o.lock(), time.Now()
	for _, leg := range legs {
		awaited := leg.f.after
		leg.f.after = nil
		resp, seq, err := st.cachedGet(c, leg.key, now, nil)
		if err == nil && resp == nil && leg.sharesNoSpace(awaited.err, now) {
			err = awaited.err
		}
		if err != nil || resp != nil {
			out[leg.i] = getResult{resp: resp, err: err, cached: resp != nil}
			st.endFlight(leg.key, leg.f, err)
			continue
		}
		leg.seq, leg.f.seq = seq, seq
		run = append(run, leg)
	}
	o.unlock()
	o.leadNow(c, run, out)
}

// leadNow is lead for legs whose flights may start at once.
func (o *Owner) leadNow(c *session, legs []getLeg, out []getResult) {
	if len(legs) == 0 {
		return
	}
	keys := make([]string, len(legs))
	var held int64 // what the client's batch holds already (the master counts it as the batch's)
	o.lock()
	for j, leg := range legs {
		keys[j] = leg.key
		if leg.f != nil {
			leg.f.sent = true // gets coming from now on queue behind this flight
		}
	}
	counted := make(map[int64]bool) // a key named twice holds one range
	for _, r := range out {
		if r.resp != nil && !counted[r.resp.Offset] {
			counted[r.resp.Offset] = true
			held += ssd.AlignedLen(r.resp.Len)
		}
	}
	o.unlock()
	planAge := o.bounds().planAge
	starts := o.startGets(keys, held)
	var run []int
	for j, s := range starts {
		if s.err != nil {
			o.land(c, legs[j], nil, nil, s.err, true, out)
		} else {
			run = append(run, j)
		}
	}
	pre := o.pullBatch(keys, starts, run)
	// A local hit and a value pullBatch brought in and completed only become holders:
	// done here, in order, rather than handed one by one to the workers (a wake-up each).
	// The rest (transfers, re-plans) run getParallel at a time.
	var slow []int
	for _, j := range run {
		p := pre[j]
		if starts[j].plan.Done || (p != nil && p.err == nil && p.doneErr == nil) {
			h, t, err := o.planGet(legs[j].key, starts[j], p)
			o.land(c, legs[j], h, t, err, false, out)
		} else {
			slow = append(slow, j)
		}
	}
	workers.ForEach(len(slow), getParallel, func(r int) {
		j := slow[r]
		leg, s, p := legs[j], starts[j], pre[j]
		if p == nil && !s.plan.Done && time.Since(s.at) > planAge {
			// Its target may be freed at the master before a transfer could end.
			o.revokePlan(leg.key, s.plan, false, errors.New("the plan waited too long in its batch"))
			if err := o.endGet(s.t); err != nil {
				o.land(c, leg, nil, nil, err, false, out)
				return
			}
			s = o.getStart(leg.key, nil)
		}
		h, t, err := o.planGet(leg.key, s, p)
		o.land(c, leg, h, t, err, false, out)
	})
}

// land ends one leg: its holder (h, t) goes to c, or err answers it (a KEY_NOT_FOUND
// marks the key absent); the leg's flight lands with the outcome. firstPlan says err
// is the answer to the key's first plan: only such a miss is shared with the flight's
// followers (one after a failed pull's re-plan is this get's own).
func (o *Owner) land(c *session, leg getLeg, h *holding, t *getTarget, err error, firstPlan bool, out []getResult) {
	st := o.lock()
	defer o.unlock()
	var resp *external.GetResponse
	switch {
	case err == nil && c.closed && leg.f != nil && leg.f.followers > 0:
		err = st.keepForFollowers(leg.f, t, h, leg.seq, errSessionClosed())
	case err == nil && leg.f != nil && leg.f.followers > 0 && st.holderRoom(c) != nil:
		err = st.keepForFollowers(leg.f, t, h, leg.seq, st.holderRoom(c)) // the bytes landed: the followers take them
	case err == nil:
		resp, err = st.finishGet(c, t, h, leg.seq, time.Now())
		if err == nil && leg.f != nil {
			if cur := st.hot.lookup(leg.key); cur != nil && cur.putID == resp.PutId {
				leg.f.h = cur
			}
		}
	case wire.CodeOf(err) == common.ErrorCode_KEY_NOT_FOUND:
		clean := leg.f != nil && !st.hot.invalidatedSince(leg.key, 0, leg.f.seq)
		st.getNotFound(leg.key)
		if clean {
			leg.f.seq = st.hot.invalSeq() // the miss's own invalidation is no later put
		}
	}
	if leg.f != nil {
		leg.f.shareMiss = firstPlan
	}
	st.endFlight(leg.key, leg.f, err)
	out[leg.i] = getResult{resp: resp, err: err}
}

// follow waits for the flight another get leads and then answers from the hot set; ok
// is false when the get must be planned on its own (seq: for its install).
func (o *Owner) follow(c *session, leg getLeg) (r getResult, seq uint64, ok bool) {
	<-leg.f.done
	st, now := o.lock(), time.Now()
	defer o.unlock()
	defer st.followerLooked(leg.f, now) // after this follower took its own holder
	if wire.CodeOf(leg.f.err) == common.ErrorCode_KEY_NOT_FOUND && leg.f.shareMiss && !st.hot.invalidatedSince(leg.key, 0, leg.f.seq) {
		// The key was absent during the follower's get (the leader's call was sent after
		// it joined), and no put or delete of it has reached this owner since the miss.
		return getResult{err: leg.f.err}, 0, true
	}
	resp, seq, err := st.cachedGet(c, leg.key, now, leg.f.h)
	if err != nil || resp != nil {
		return getResult{resp: resp, err: err, cached: resp != nil}, 0, true
	}
	if leg.sharesNoSpace(leg.f.err, now) {
		return getResult{err: leg.f.err}, 0, true
	}
	return getResult{}, seq, false
}
