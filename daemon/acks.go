package daemon

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// acker batches holder releases to the master (BatchDeleteAck): ids collect for up to
// AckDelay or 256 of them, then go in one call. The keys of gets served from the hot
// set (touched) ride along, or go on their own after touchDelay, so the master's
// eviction order sees those hits.
type acker struct {
	o       *Owner
	flushMu sync.Mutex // one flush at a time: sync returns only after any flush in flight
	mu      sync.Mutex // protects pending, queued, dropped, touched, flight, syncing
	pending []int64
	// syncing counts the hot-set releases (holdForSync) that queue acks and sync them:
	// master calls carry no acks meanwhile (take), so the released ids go in the sync's
	// own BatchDeleteAck, and its answer says they reached the master.
	syncing int
	// queued counts the ids ever queued, dropped those left unsent (past maxPendingAcks,
	// or queued before a registration that succeeded): the ids queued at or after a
	// mark() are the last queued-mark of pending (or all of it).
	queued, dropped int64
	touched         map[string]struct{}
	// flight, while a flush's BatchDeleteAck with holder ids is in flight, is closed when
	// it returned (its ids acked, or given back to pending).
	flight chan struct{}
	// flightWaiters counts the master calls waiting in takeForCall for that flush (tests
	// wait for one to be there rather than sleep).
	flightWaiters atomic.Int32
	kick          chan struct{}
	done          chan struct{}
	warn          zerolog.Logger // sampled: a master out of reach fails every flush
	wg            sync.WaitGroup
}

// touchDelay is how long hot-set hits may wait for a holder ack to ride with;
// maxTouched caps the keys of one report; maxPendingAcks caps the queue (8 MiB of
// ids), which only grows while the master is out of reach: past it the oldest go
// unsent (that master tombs this owner after its node TTL, freeing every holder, and
// the owner's next registration makes the old ids moot).
const (
	touchDelay     = 100 * time.Millisecond
	maxTouched     = 1024
	maxPendingAcks = 1 << 20
)

func newAcker(o *Owner) *acker {
	a := &acker{o: o, kick: make(chan struct{}, 1), done: make(chan struct{}), touched: make(map[string]struct{}),
		warn: o.log.Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Second})}
	a.wg.Add(1)
	go a.loop()
	return a
}

// add queues a master holder id. Safe to call with Owner.mu held.
func (a *acker) add(id int64) {
	a.mu.Lock()
	a.pending = append(a.pending, id)
	a.queued++
	a.boundLocked()
	a.mu.Unlock()
	a.kickLoop()
}

func (a *acker) kickLoop() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// boundLocked drops the oldest queued ids past maxPendingAcks.
func (a *acker) boundLocked() {
	if over := len(a.pending) - maxPendingAcks; over > 0 {
		a.pending = a.pending[over:]
		a.dropped += int64(over)
		a.warn.Warn().Int("dropped", over).Int64("dropped_total", a.dropped).Msg("holder acks pile up while the master is out of reach; dropping the oldest")
	}
}

// mark is the position of the next id queued: ids queued before it (released before a
// registration begins, which reports the ranges still in use as pins) are none of that
// registration's pins.
func (a *acker) mark() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.queued
}

// dropBefore drops the ids queued before mark that are still pending: a registration
// begun at mark succeeded, and its master holds none of them (it tombed the earlier
// state, or never had it). Ids a call took meanwhile and gave back count as queued
// again: sent once more, they do no harm.
func (a *acker) dropBefore(mark int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	since := a.queued - mark // at the tail
	if old := int64(len(a.pending)) - since; old > 0 {
		a.pending = a.pending[old:]
		a.dropped += old
	}
}

// touch records a get of key served from the hot set. Safe to call with Owner.mu held.
func (a *acker) touch(key string) {
	a.mu.Lock()
	if len(a.touched) >= maxTouched {
		a.mu.Unlock()
		return // the report is full: this hit goes unreported
	}
	_, seen := a.touched[key]
	a.touched[key] = struct{}{}
	first := !seen && len(a.touched) == 1 && len(a.pending) == 0
	a.mu.Unlock()
	if first {
		a.kickLoop()
	}
}

func (a *acker) loop() {
	defer a.wg.Done()
	for {
		select {
		case <-a.done:
			a.flush()
			return
		case <-a.kick:
		}
		a.mu.Lock()
		delay := a.o.opts.AckDelay
		if len(a.pending) == 0 {
			delay = touchDelay // only hits to report: no hurry
		}
		a.mu.Unlock()
		select {
		case <-a.done:
		case <-time.After(delay):
		}
		for !a.flush() {
			// The master is unreachable; if it restarted, re-registration pins only what
			// is still in use, so these ranges are free there anyway. Kept for a retry
			// (not under flushMu: a sync meanwhile makes its own try); the hits go
			// unreported.
			select {
			case <-a.done:
			case <-time.After(100 * time.Millisecond):
				continue
			}
			break
		}
	}
}

// takeTouched removes and returns the recorded hot-set hits.
func (a *acker) takeTouchedLocked() []string {
	if len(a.touched) == 0 {
		return nil
	}
	out := make([]string, 0, len(a.touched))
	for k := range a.touched {
		out = append(out, k)
	}
	clear(a.touched)
	return out
}

// flush sends the queued acks and hits, a batch a call, until none is left (true) or a
// call fails (false; its acks are back in the queue).
func (a *acker) flush() bool {
	a.flushMu.Lock()
	defer a.flushMu.Unlock()
	for {
		a.mu.Lock()
		n := min(len(a.pending), 256)
		batch := append([]int64(nil), a.pending[:n]...)
		a.pending = a.pending[n:]
		touched := a.takeTouchedLocked()
		var flight chan struct{}
		if n > 0 {
			flight = make(chan struct{})
			a.flight = flight
		}
		a.mu.Unlock()
		if n == 0 && len(touched) == 0 {
			return true
		}
		wait, cancel := a.o.master.waitCtx()
		if n > 0 {
			// A registration in progress reported the ranges still in use as pins, and
			// these ids may be some of them (released since): sent before the new master
			// has the registration, they would be answered STALE_GENERATION and dropped,
			// and the master would hold those pins for good. Wait for it (ids taken
			// before it began are no pins of it: dropping them is harmless).
			_ = a.o.master.settled(wait)
		}
		ref := a.o.master.ref()
		resp, err := a.o.master.cl().BatchDeleteAck(a.o.master.callCtx(wait), &mp.BatchDeleteAckRequest{Node: ref, HolderIds: batch, Touched: touched})
		cancel()
		switch {
		case err != nil:
		case resp.Code == common.ErrorCode_NOT_LEADER:
			// A leader whose gate is shut (its etcd lease lapsed for a moment) applied
			// none of them and may serve on under the same term: keep them for a retry
			// (a new leader does not know them, which does no harm).
			err = errCode(common.ErrorCode_UNAVAILABLE, "holder acks answered NOT_LEADER: %s", resp.Message)
		case resp.Code == common.ErrorCode_STALE_GENERATION && !a.o.masterTook(ref.Generation):
			// Sent under a registration no master took (its Register failed in transport):
			// the master may still have the one before, holding these ids; the owner goes
			// back to it at its next heartbeat (staleAnswer).
			err = errCode(common.ErrorCode_UNAVAILABLE, "holder acks answered STALE_GENERATION under a registration no master took: %s", resp.Message)
		}
		if err != nil {
			a.giveBack(batch) // before the flight ends: a call waiting for it carries them
		}
		if flight != nil {
			a.mu.Lock()
			a.flight = nil
			a.mu.Unlock()
			close(flight)
		}
		switch {
		case err != nil:
			a.warn.Warn().Err(err).Int("holders", n).Msg("holder ack failed; will retry")
			return false
		case resp.Code == common.ErrorCode_STALE_GENERATION:
			a.o.log.Debug().Int("holders", n).Msg("holder acks for a previous master registration dropped")
		case resp.Unknown > 0:
			a.o.log.Warn().Int64("unknown", resp.Unknown).Msg("master did not know some acked holders")
		}
	}
}

func (a *acker) close() {
	select {
	case <-a.done:
	default:
		close(a.done)
	}
	a.wg.Wait()
}

// takeForCall is take for a master call that may allocate (PutStart, GetStart): it first
// waits (at most until ctx ends) for a flush whose acks are in flight, so the master has
// freed their ranges before it plans this call's room. Without the wait a get through a
// full owner could find the previous get's range still held, its ack overtaken, and
// evict a value for room that was about to be free.
func (a *acker) takeForCall(ctx context.Context) []int64 {
	a.mu.Lock()
	f := a.flight
	a.mu.Unlock()
	if f != nil {
		a.flightWaiters.Add(1)
		select {
		case <-f:
		case <-ctx.Done():
		}
		a.flightWaiters.Add(-1)
	}
	return a.take()
}

// take removes and returns the queued acks, at most masterCallAcks of them (the rest
// wait for the next call or flush), for a master call that carries them; none while a
// hot-set release syncs its own (holdForSync).
func (a *acker) take() []int64 {
	a.mu.Lock()
	if a.syncing > 0 {
		a.mu.Unlock()
		return nil
	}
	n := min(len(a.pending), masterCallAcks)
	p := a.pending[:n:n]
	a.pending = a.pending[n:]
	left := len(a.pending) > 0
	if !left {
		a.pending = nil
	}
	a.mu.Unlock()
	if left {
		a.kickLoop()
	}
	return p
}

// giveBack requeues acks whose carrying call never reached the master (at the tail:
// their order does not matter, and a queue that grows while the master is out of
// reach is not copied whole for each failed call).
func (a *acker) giveBack(ids []int64) {
	if len(ids) == 0 {
		return
	}
	a.mu.Lock()
	a.pending = append(a.pending, ids...)
	a.queued += int64(len(ids))
	a.boundLocked()
	a.mu.Unlock()
	a.kickLoop()
}

// holdForSync keeps the queued acks from master calls (take) until the returned func
// runs: a hot-set release queues the acks of what it released and syncs them, and
// answers the master that they reached it. A GetStart or PutStart that took them
// between the two carried them instead; the sync found nothing left and answered at
// once while that call was still on its way, and the master, told the room was given
// back, evicted a sole copy for room still held (a review).
func (a *acker) holdForSync() (release func()) {
	a.mu.Lock()
	a.syncing++
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		a.syncing--
		a.mu.Unlock()
	}
}

// sync sends every queued ack now (Stat calls it so used bytes reflect releases); it
// gives up at the first call that fails (the loop retries), so a Stat while the master
// is out of reach answers instead of waiting for it. It reports whether every ack
// queued went out.
func (a *acker) sync() bool { return a.flush() }
