package master

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/peerclient"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

const (
	// invalidateBatch caps the entries of one InvalidateCachedInfo call.
	invalidateBatch = 256
	// invalidateLinger lets entries collect before each call to an owner (unless a
	// full batch is queued): a busy master puts thousands of keys a second, each
	// invalidated at every other owner in the background, and calls back to back cost
	// the master and the owners more CPU than the entries (2026-12-05: 20 ms before each
	// call, against 1 ms before the first only, cut the calls of a 3-owner replay from
	// 5,300 to 1,500 and the master's CPU by about a sixth).
	invalidateLinger = 20 * time.Millisecond
)

// ownerKey names an owner's peer service: the node id and the address it registered.
type ownerKey struct {
	nodeID string
	addr   string
}

// invalQueue is one owner's pending invalidations: the highest version to drop per
// key, keys in arrival order. At most one call to the owner is in flight (sending);
// entries that arrive meanwhile go in its next call.
type invalQueue struct {
	upTo    map[string]int64
	order   []string
	sending bool
	dropped int64 // entries dropped by the cap since the last warning
	// full is signalled when a call's worth is queued: it ends the sender's linger.
	full chan struct{}
}

func newInvalQueue() *invalQueue {
	return &invalQueue{upTo: make(map[string]int64), full: make(chan struct{}, 1)}
}

// push records key ≤ putID; past max distinct keys the oldest are dropped. It returns
// how many were dropped.
func (q *invalQueue) push(key string, putID int64, limit int) int {
	if cur, ok := q.upTo[key]; ok {
		q.upTo[key] = max(cur, putID)
		return 0
	}
	q.upTo[key] = putID
	q.order = append(q.order, key)
	n := 0
	for len(q.order) > limit {
		delete(q.upTo, q.order[0])
		q.order[0] = ""
		q.order = q.order[1:]
		n++
	}
	q.dropped += int64(n)
	return n
}

// take removes up to n entries, oldest first.
func (q *invalQueue) take(n int) []*common.KeyVersion {
	n = min(n, len(q.order))
	out := make([]*common.KeyVersion, n)
	for i, k := range q.order[:n] {
		out[i] = &common.KeyVersion{Key: k, PutId: q.upTo[k]}
		delete(q.upTo, k)
		q.order[i] = ""
	}
	q.order = q.order[n:]
	if len(q.order) == 0 {
		q.order = nil // let the backing array go
	}
	return out
}

// invalidator sends InvalidateCachedInfo broadcasts to owners (docs/architecture.md §10 "Death and
// fencing"): each owner has its own queue and at most one call in flight, bounded by
// InvalidateTimeout, so a dead or partitioned owner delays nobody else. Entries for an
// owner collect while its call runs and for invalidateLinger after it, or until a call's
// worth is queued (one per key, the highest version), and go in its next call. Entries
// for an owner that is tombed or unknown by send time are dropped.
//
// A failed call is logged and not retried, and that owner's next call waits one
// InvalidateTimeout (no retry storm against a dead owner). What an owner misses is
// bounded so: an owner the master cannot reach is tombed within the node TTL once its
// heartbeats stop too, and registering again makes it forget every cached info; an
// owner that stays registered (its heartbeats get through, or its queue overflowed)
// keeps serving a dropped key's old version from its cached info until the externals
// holding it release it (idle cached infos expire after the owner's cache grace).
type invalidator struct {
	log       zerolog.Logger
	peers     *peerclient.Clients
	timeout   time.Duration
	max       int                            // distinct keys queued per owner
	live      func(nodeID, addr string) bool // the owner is registered and not tombed
	epoch     int64                          // the master's, sent with every call
	lingerFor time.Duration                  // invalidateLinger (tests lengthen it)

	ctx    context.Context // cancelled by close: in-flight calls end at once
	cancel context.CancelFunc

	mu     sync.Mutex // protects queues, closed
	queues map[ownerKey]*invalQueue
	closed bool

	wg sync.WaitGroup // one sender goroutine per owner with entries
}

// newInvalidator returns an invalidator whose calls time out after timeout, that
// queues at most limit keys per owner and sends only to owners live says are live.
func newInvalidator(log zerolog.Logger, peers *peerclient.Clients, timeout time.Duration, limit int, epoch int64, live func(nodeID, addr string) bool) *invalidator {
	v := &invalidator{log: log, peers: peers, timeout: timeout, max: limit, epoch: epoch, lingerFor: invalidateLinger, live: live,
		queues: make(map[ownerKey]*invalQueue)}
	v.ctx, v.cancel = context.WithCancel(context.Background())
	return v
}

// add queues invalidations; owners without a call in flight get a sender.
func (v *invalidator) add(invs []Invalidation) {
	if len(invs) == 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return
	}
	for _, iv := range invs {
		k := ownerKey{nodeID: iv.NodeID, addr: iv.PeerAddr}
		q := v.queues[k]
		if q == nil {
			q = newInvalQueue()
			v.queues[k] = q
		}
		q.push(iv.Key, iv.PutID, v.max)
		if len(q.order) == invalidateBatch {
			select {
			case q.full <- struct{}{}:
			default:
			}
		}
		if !q.sending {
			q.sending = true
			v.wg.Add(1)
			go v.sender(k, q)
		}
	}
}

// sender drains one owner's queue, one call at a time, and exits when it is empty.
func (v *invalidator) sender(k ownerKey, q *invalQueue) {
	defer v.wg.Done()
	for {
		v.linger(q)
		v.mu.Lock()
		if v.closed || len(q.order) == 0 {
			q.sending = false
			if len(q.order) == 0 {
				delete(v.queues, k)
			}
			v.mu.Unlock()
			return
		}
		entries := q.take(invalidateBatch)
		dropped := q.dropped
		q.dropped = 0
		v.mu.Unlock()

		if dropped > 0 {
			v.log.Warn().Str("node", k.nodeID).Str("peer", k.addr).Int64("dropped", dropped).
				Msg("invalidate: owner's queue full; oldest entries dropped (its cached infos of those keys stay until their holders release them)")
		}
		if !v.live(k.nodeID, k.addr) {
			v.mu.Lock()
			n := len(q.order)
			q.take(n)
			v.mu.Unlock()
			v.log.Debug().Str("node", k.nodeID).Str("peer", k.addr).Int("entries", len(entries)+n).
				Msg("invalidate: owner tombed or unknown; entries dropped")
			continue // the loop ends the sender (or serves entries that arrived just now)
		}
		if err := v.send(v.ctx, k, entries); err != nil && v.ctx.Err() == nil {
			v.log.Warn().Err(err).Str("node", k.nodeID).Str("peer", k.addr).Int("entries", len(entries)).
				Msg("invalidate cached info failed; entries dropped")
			select { // back off: entries collect meanwhile, capped
			case <-v.ctx.Done():
			case <-time.After(v.timeout):
			}
		}
	}
}

// linger lets entries for q collect for invalidateLinger before its next call, until
// a full call's worth is queued (before or meanwhile) or the invalidator is closing.
func (v *invalidator) linger(q *invalQueue) {
	select {
	case <-q.full: // a signal for entries taken since
	default:
	}
	v.mu.Lock()
	full := len(q.order) >= invalidateBatch
	v.mu.Unlock()
	if full {
		return
	}
	t := time.NewTimer(v.lingerFor)
	defer t.Stop()
	select {
	case <-v.ctx.Done():
	case <-q.full:
	case <-t.C:
	}
}

// send makes one InvalidateCachedInfo call bounded by the timeout.
func (v *invalidator) send(ctx context.Context, k ownerKey, entries []*common.KeyVersion) error {
	c, callOpts, err := v.peers.GetNode(k.nodeID, k.addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	resp, err := c.InvalidateCachedInfo(ctx, &peer.InvalidateCachedInfoRequest{Entries: entries, MasterEpoch: v.epoch}, callOpts...)
	if err == nil && resp.Code != common.ErrorCode_OK {
		// Refused (an owner that registered with a newer master's epoch): not confirmed.
		err = wire.FromResponse(resp.Code, resp.Message)
	}
	return err
}

// close drops what is queued, cancels calls in flight and waits for the senders.
func (v *invalidator) close() {
	v.mu.Lock()
	v.closed = true
	v.mu.Unlock()
	v.cancel()
	v.wg.Wait()
}

// invalidate delivers the invalidations of a delete, an overwrite or a report: the
// Sync ones (owners that may hold an older version in their replica index) at once, in
// parallel, before the caller answers; the rest in the background (invalidator). A
// Sync owner is tried until it confirms, each call bounded by InvalidateTimeout; it is
// given up on, and tombed, once it is silent (no heartbeat for two intervals: dead or
// cut off) or has not confirmed within NodeTTL. A tombed owner drops its replica index
// when it next registers with this master, so the version can never come back; one
// tombed meanwhile by the node TTL needs nothing more.
//
// The Sync ones may take up to NodeTTL: an HA leader's fence may shut meanwhile, and a
// write it then answered OK may be undone by the next leader (the owners it could not
// reach report the old version there). So after Sync invalidations it returns the
// gate's error when the gate is shut: the caller's write answers it (outcome unknown).
func (s *Server) invalidate(invs []Invalidation) error {
	type target struct {
		k   ownerKey
		gen int64
	}
	var async []Invalidation
	now := make(map[target][]*common.KeyVersion)
	for _, iv := range invs {
		if !iv.Sync {
			async = append(async, iv)
			continue
		}
		t := target{ownerKey{nodeID: iv.NodeID, addr: iv.PeerAddr}, iv.Generation}
		now[t] = append(now[t], &common.KeyVersion{Key: iv.Key, PutId: iv.PutID})
	}
	s.inval.add(async)
	var wg sync.WaitGroup
	for t, entries := range now {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.invalidateOwner(t.k, t.gen, entries)
			// Confirmed, or given up on (tombed): later deletes and overwrites of these
			// keys need not wait for this owner on their account any more.
			s.locked(func(st *State) error {
				for _, e := range entries {
					st.SyncDoneLocked(t.k.nodeID, t.gen, e.Key)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	if len(now) > 0 && s.gate != nil {
		return s.gate()
	}
	return nil
}

// invalidateOwner sends one Sync owner its entries until it confirms or is given up on
// (see invalidate).
func (s *Server) invalidateOwner(k ownerKey, gen int64, entries []*common.KeyVersion) {
	deadline := time.Now().Add(s.opts.NodeTTL)
	for tries := 1; ; tries++ {
		err := s.inval.send(s.inval.ctx, k, entries)
		if err == nil || s.inval.ctx.Err() != nil {
			return
		}
		var live, silent, gaveUp bool
		var lastSeen time.Time
		s.locked(func(st *State) error {
			// While the gate is shut the owner cannot heartbeat: its silence is not its
			// own, and it is forgiven once the gate opens (gateOpenLocked). Judged on
			// the silence a shut gate made, a healthy owner whose one call failed was
			// tombed, and forgot its whole cache when it registered again (a review).
			open := s.gateOpenLocked(time.Now())
			n := st.nodes[k.nodeID]
			live = n != nil && n.generation == gen && n.peerAddr == k.addr
			if live {
				lastSeen = n.lastSeen
				silent = open && time.Since(n.lastSeen) > 2*s.opts.HeartbeatInterval
				if gaveUp = silent || (open && time.Now().After(deadline)); gaveUp {
					st.tombLocked(n)
					// Writes the tomb hides it from (no invalidation for it is computed
					// any more) answer no earlier than its lease, as this one does: it may
					// serve its hot set's holdings until then. They answered at once.
					s.quietAtLeast(lastSeen.Add(2 * s.opts.HeartbeatInterval))
				}
			}
			return nil
		})
		switch {
		case !live:
			// Tombed meanwhile (maybe by another invalidation given up on it, which waits
			// out its lease on its own account, not this one's): it may still answer
			// gets from its hot set until its lease, at most two intervals after its
			// last heartbeat, which came before now, runs out.
			select {
			case <-s.inval.ctx.Done():
			case <-time.After(2 * s.opts.HeartbeatInterval):
			}
			return
		case gaveUp:
			s.opts.Logger.Warn().Err(err).Str("node", k.nodeID).Str("peer", k.addr).Int("entries", len(entries)).Int("tries", tries).Bool("silent", silent).
				Msg("a replica holder did not confirm an invalidation; tombed (it drops its replica index when it registers again)")
			// It may still answer gets from its cached holdings until its lease, two
			// heartbeat intervals after its last heartbeat, runs out: answer after that.
			if d := time.Until(lastSeen.Add(2 * s.opts.HeartbeatInterval)); d > 0 {
				select {
				case <-s.inval.ctx.Done():
				case <-time.After(d):
				}
			}
			return
		}
		select {
		case <-s.inval.ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}
