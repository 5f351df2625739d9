package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// The shape of a remote SSD refill (peer.thrift SsdStageRead).
const (
	stageChunk = peer.STAGE_CHUNK_BYTES
	// stageSessionSlots bounds one refill's staging: its reads in flight plus the read
	// chunks waiting for their pull.
	stageSessionSlots = peer.STAGE_READS_IN_FLIGHT + peer.STAGE_READY_CHUNKS
	// stageSessionHeld is what one refill holds of the area's stageSessionSlots at most:
	// a requester that stopped pulling (stalled, gone, or its call late) leaves its slots
	// held until the watchdog fails the refill (stageUnpulled after its last pull), and
	// one that held every slot made every other refill from this owner fail meanwhile
	// (each pull refused after stageChunkWait). The rest, a session's reads in flight,
	// stays for others.
	stageSessionHeld = stageSessionSlots - peer.STAGE_READS_IN_FLIGHT
	// stageReadsInFlight is the reads one refill keeps in flight: 2 of the 4 the
	// protocol allows, so the first chunks complete early and their pulls overlap the
	// later reads (all 4 at once finish together: store and forward). Measured on this
	// machine's disk, 16 MiB values: remote/local SSD-hit 0.73-0.75 at c1 and 0.88-0.94
	// at c2 with 2, 0.57-0.66 and 0.78-0.84 with 4.
	stageReadsInFlight = 2

	// stageSessionWait is how long a staged pull waits for its SsdStageRead to arrive
	// (the requester sends the call first, but they race over two connections).
	stageSessionWait = 2 * time.Second
	// stageChunkWait bounds a staged pull's wait for its chunk to be read (the puller
	// hears WAIT meanwhile, so it knows this owner is alive).
	stageChunkWait = 4 * time.Second
	// stageUnpulled fails a refill whose read chunk waited this long for its pull while
	// no pull of it (of its batch: of any item) arrived or ended as long: the requester
	// is gone or stuck, and the slots go back (watchAll). It must exceed stageChunkWait,
	// the longest a live requester's pull waits, so shows no sign of it.
	stageUnpulled = stageChunkWait + 2*time.Second
	// stageBase and stageRate make a refill's deadline proportional to its length.
	stageBase = 5 * time.Second
	stageRate = 32 << 20 // bytes per second, a floor far below any disk's
)

// stageMaxDeadline caps a refill's deadline (bounds.stageDeadline): the requester
// writes the get's target until then, and the master frees a get's target at its
// in-flight TTL (60 s by default), so planMaxAge + stageMaxDeadline stays below it (as
// planMaxAge + TransferTimeout does). A master with a shorter TTL lowers it (bounds.go).
const stageMaxDeadline = 45 * time.Second

// errStageEnded answers the staged pulls of a refill that ended (failed, timed out,
// or the owner is stopping).
var errStageEnded = errors.New("staged refill ended")

// errStageCompleted is why a refill served and verified ended.
var errStageCompleted = fmt.Errorf("%w: the get completed", errStageEnded)

// stager serves other owners' refills from this owner's SSD (docs/architecture.md §10 "SSD pool"):
// each SsdStageRead is a session that reads the value in 4 MiB chunks into slots of a
// fixed staging area of this process's own memory (not the segment: the master never
// allocates or frees it, so no write can land in a range it reused), at most 4 reads
// in flight and 8 of the 12 slots per session (a small chunk in a sub-slot: stage_slots.go), and
// hands each read chunk to the requester's staged pull (transfer.Fence.Staged), which
// gives the slot back.
type stager struct {
	o       *Owner
	metrics *metrics.Stage

	// mu protects mem, free, sessions, changed, closed, and every stageSession's
	// chunks, held, reads, served and err. Nothing blocking runs under it: SSD reads
	// and pulls run outside, and waiters select on changed.
	mu       sync.Mutex
	mem      []byte                 // mapped on first use: slots × stageChunk
	free     []int                  // free slot indexes
	subFree  [len(subClasses)][]int // free sub-slot indexes per class (stage_slots.go)
	subUsed  []int                  // per slot: its sub-slots in use
	sessions map[int64]*stageSession
	ended    endedStages   // sessions ended within stageSessionWait
	changed  chan struct{} // closed and replaced when sessions change (a freed slot wakes each session's freed)
	closed   bool
}

func newStager(o *Owner, slots int) *stager {
	st := &stager{o: o, metrics: o.opts.Metrics.Stage(), sessions: make(map[int64]*stageSession), changed: make(chan struct{}),
		ended: endedStages{errs: make(map[int64]error)}}
	st.free = make([]int, slots)
	st.subUsed = make([]int, slots)
	for i := range st.free {
		st.free[i] = slots - 1 - i
	}
	return st
}

// broadcastLocked wakes everything waiting on st.changed.
func (st *stager) broadcastLocked() {
	close(st.changed)
	st.changed = make(chan struct{})
}

// close ends every session and unmaps the staging area once they are gone.
func (st *stager) close() {
	st.mu.Lock()
	st.closed = true
	for _, s := range st.sessions {
		s.failLocked(fmt.Errorf("%w: the owner is stopping", errStageEnded))
	}
	st.broadcastLocked()
	for len(st.sessions) > 0 {
		ch := st.changed
		st.mu.Unlock()
		<-ch
		st.mu.Lock()
	}
	if st.mem != nil && len(st.free) == cap(st.free) {
		unix.Munmap(st.mem)
		st.mem = nil
	}
	st.mu.Unlock()
}

// stageSession is one refill being staged.
type stageSession struct {
	st     *stager
	getID  int64
	key    string
	n      int64
	chunks []stagedChunk
	held   int   // slots held
	reads  int   // chunks taken and not yet read
	served int   // chunks whose pull ended
	err    error // set once the session failed or ended
	cancel context.CancelCauseFunc
	freed  chan struct{} // ssd.Slots.Freed: signalled when a slot may be free
	// place, when set, is the batch's place this session holds among its items read
	// and not yet pulled (stage_batch.go): given back once, when every chunk was
	// pulled or the session failed or ended.
	place chan struct{}
	// changed is closed and replaced when a chunk of s is read or served or s fails:
	// the waits on s (its pulls, waitServed) wake for s only, not for every session.
	changed chan struct{}
	// pulledAt is when the requester last showed itself: the session began, a pull of
	// it arrived, or one ended (served or refused). See watchAll.
	pulledAt time.Time
}

type stagedChunk struct {
	slot    int // -1: none
	class   int // slot is a sub-slot of this class (stage_slots.go; 0: a whole slot)
	ready   bool
	serving bool
	done    bool
	readyAt time.Time
}

// begin registers a session for req.
func (st *stager) begin(req *peer.SsdStageReadRequest, cancel context.CancelCauseFunc) (*stageSession, error) {
	s := &stageSession{st: st, getID: req.GetId, key: req.Key, n: req.Len, cancel: cancel, freed: make(chan struct{}, 1), changed: make(chan struct{}), pulledAt: time.Now(),
		chunks: make([]stagedChunk, (req.Len+stageChunk-1)/stageChunk)}
	for i := range s.chunks {
		s.chunks[i].slot = -1
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.closed:
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "node %q is stopping", st.o.opts.NodeID)
	case st.sessions[req.GetId] != nil:
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "get %d is already being staged", req.GetId)
	}
	if st.mem == nil {
		mem, err := unix.Mmap(-1, 0, cap(st.free)*stageChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return nil, errCode(common.ErrorCode_UNAVAILABLE, "staging area of %d bytes: %v", cap(st.free)*stageChunk, err)
		}
		st.mem = mem
	}
	st.sessions[req.GetId] = s
	st.broadcastLocked()
	return s, nil
}

// end unregisters s and gives back its slots, except those a pull is sending (their
// release gives them back).
func (st *stager) end(s *stageSession, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err == nil {
		err = errStageCompleted
	}
	s.failLocked(err)
	s.givePlaceLocked()
	for i := range s.chunks {
		if c := &s.chunks[i]; c.slot >= 0 && !c.serving {
			s.freeSlotLocked(c)
		}
	}
	delete(st.sessions, s.getID)
	st.ended.add(s.getID, err, time.Now())
	st.broadcastLocked()
}

// endedStages remembers the refills that ended in the last stageEndedKept, so a pull
// that arrives after its refill ended (a batch's item whose read failed before its
// turn in the requester's pipeline) is answered at once instead of waiting
// stageSessionWait for a session that will not come.
type endedStages struct {
	errs  map[int64]error // get id → why it ended
	order []endedStage    // oldest first
}

type endedStage struct {
	getID int64
	at    time.Time
}

// stageEndedKept is how long an ended refill is remembered: as long as a pipeline's
// pull of it may come late while the pulls before it waited for their chunks (each up
// to stageChunkWait) and nothing pulled (stageUnpulled). Kept stageSessionWait, a pull
// later than that (another refill ending meanwhile pruned it) waited 2 s for nothing,
// and every pull behind it on its pipeline with it.
const stageEndedKept = stageUnpulled

// add records get id's end (err) at now and forgets the ends older than
// stageEndedKept.
func (e *endedStages) add(getID int64, err error, now time.Time) {
	n := 0
	for n < len(e.order) && now.Sub(e.order[n].at) > stageEndedKept {
		delete(e.errs, e.order[n].getID)
		n++
	}
	e.order = append(e.order[n:], endedStage{getID, now})
	e.errs[getID] = err
}

// failLocked records the session's end: waiting and later pulls get err.
func (s *stageSession) failLocked(err error) {
	if s.err == nil {
		s.err = err
		s.cancel(err)
		s.givePlaceLocked()
		s.changedLocked()
	}
}

// givePlaceLocked gives the batch's place of s back, once.
func (s *stageSession) givePlaceLocked() {
	if s.place != nil {
		<-s.place
		s.place = nil
	}
}

// changedLocked wakes everything waiting on s.changed.
func (s *stageSession) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *stageSession) freeSlotLocked(c *stagedChunk) {
	s.st.giveSlotLocked(c.slot, c.class)
	c.slot = -1
	s.held--
	for _, o := range s.st.sessions { // any session may be waiting for a slot
		select {
		case o.freed <- struct{}{}:
		default:
		}
	}
}

// Take implements ssd.Slots: a free slot for chunk i while the session holds fewer
// than stageSessionHeld.
func (s *stageSession) Take(i int, n int64) []byte {
	st := s.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if s.err != nil || s.held >= stageSessionHeld || n > stageChunk {
		return nil
	}
	slot, class, buf, ok := st.takeSlotLocked(n)
	if !ok {
		return nil
	}
	s.chunks[i].slot, s.chunks[i].class = slot, class
	s.held++
	s.reads++
	st.metrics.Reads(s.reads)
	return buf
}

// Freed implements ssd.Slots.
func (s *stageSession) Freed() <-chan struct{} { return s.freed }

// deliver marks chunk i read (provisionally: the CRC is checked after the last one).
func (s *stageSession) deliver(i int, _, _ int64, _ []byte) error {
	st := s.st
	st.mu.Lock()
	defer st.mu.Unlock()
	s.reads--
	s.chunks[i].ready, s.chunks[i].readyAt = true, time.Now()
	s.changedLocked()
	return s.err
}

// sendingLocked reports whether a chunk of s is being sent.
func (s *stageSession) sendingLocked() bool {
	for i := range s.chunks {
		if s.chunks[i].serving {
			return true
		}
	}
	return false
}

// stalled reports whether a read chunk has waited longer than stageUnpulled.
func (s *stageSession) stalledLocked(now time.Time) bool {
	for i := range s.chunks {
		if c := &s.chunks[i]; c.ready && !c.serving && !c.done && now.Sub(c.readyAt) > stageUnpulled {
			return true
		}
	}
	return false
}

// open serves a staged pull (transfer.Fence.Staged) of the chunk at offset of the value
// staged for get id: it waits for the session and the chunk, then lends the chunk's
// slot until the pull has sent it. While it waits it calls alive (when set) every
// transfer.WaitInterval, without the lock; an error of alive ends the wait with it.
func (st *stager) open(getID, offset, length int64, alive func() error) ([]byte, func(), error) {
	start := time.Now()
	nextAlive := start.Add(transfer.WaitInterval)
	st.mu.Lock()
	defer st.mu.Unlock()
	arrived := false
	for {
		s := st.sessions[getID]
		if s != nil && !arrived {
			arrived, s.pulledAt = true, time.Now()
		}
		var wait time.Duration
		ch := st.changed // a session to appear, or the stager to close
		if s != nil {
			ch = s.changed
		}
		switch {
		case st.closed:
			return nil, nil, fmt.Errorf("%w: node %q is stopping", errStageEnded, st.o.opts.NodeID)
		case s == nil && st.ended.errs[getID] != nil:
			return nil, nil, fmt.Errorf("%w: the refill of get %d ended: %w", transfer.ErrFenced, getID, st.ended.errs[getID])
		case s == nil:
			wait = stageSessionWait - time.Since(start)
			if wait <= 0 {
				return nil, nil, fmt.Errorf("%w: no refill of get %d is being staged here", transfer.ErrFenced, getID)
			}
		default:
			i := offset / stageChunk
			if offset%stageChunk != 0 || i >= int64(len(s.chunks)) || length != min(stageChunk, s.n-offset) {
				return nil, nil, fmt.Errorf("%w: [%d,+%d) is not a chunk of the %d-byte value staged for get %d", transfer.ErrFenced, offset, length, s.n, getID)
			}
			c := &s.chunks[i]
			switch {
			case c.serving || c.done:
				return nil, nil, fmt.Errorf("%w: chunk %d of get %d was already pulled", transfer.ErrFenced, i, getID)
			case s.err != nil:
				return nil, nil, s.err
			case c.ready:
				c.serving = true
				return st.slotBytes(c, length), func() { st.served(s, c) }, nil
			}
			wait = stageChunkWait - time.Since(start)
			if wait <= 0 {
				// The puller gives up on this chunk: so does the refill (its read stops,
				// its slots go back and its answer comes now, not stageUnpulled later).
				// The puller hears a refusal (ErrFenced): this owner is alive.
				err := fmt.Errorf("%w: %w: chunk %d of get %d not read from SSD within %v", transfer.ErrFenced, errStageEnded, i, getID, stageChunkWait)
				s.pulledAt = time.Now()
				s.failLocked(err)
				return nil, nil, err
			}
		}
		if alive != nil {
			wait = min(wait, time.Until(nextAlive))
		}
		st.mu.Unlock()
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ch:
			case <-t.C:
			}
			t.Stop()
		}
		if alive != nil && !time.Now().Before(nextAlive) {
			nextAlive = time.Now().Add(transfer.WaitInterval)
			if err := alive(); err != nil {
				st.mu.Lock()
				return nil, nil, err
			}
		}
		st.mu.Lock()
	}
}

// served gives back the slot of a chunk whose pull ended.
func (st *stager) served(s *stageSession, c *stagedChunk) {
	st.mu.Lock()
	defer st.mu.Unlock()
	c.serving, c.done = false, true
	s.served++
	s.pulledAt = time.Now()
	s.freeSlotLocked(c)
	if s.served == len(s.chunks) {
		s.givePlaceLocked()
	}
	s.changedLocked()
}

// stageRead serves another owner's refill from this owner's SSD: it reads key@put_id
// chunk by chunk into staging slots while the requester pulls them, and answers once
// every chunk was pulled and the value verified. A failed or corrupt read answers an
// error code: the requester revokes with drop_ssd_source.
func (o *Owner) stageRead(req *peer.SsdStageReadRequest) error {
	r, err := o.beginStage(context.Background(), req)
	if err != nil {
		return err
	}
	return r.run()
}

// stageRun is one refill whose session is registered (pulls of it wait for its chunks)
// and whose read has not run yet.
type stageRun struct {
	o      *Owner
	req    *peer.SsdStageReadRequest
	s      *stageSession
	base   context.Context
	cancel context.CancelCauseFunc
}

// beginStage checks req and registers its session; the refill ends with parent.
func (o *Owner) beginStage(parent context.Context, req *peer.SsdStageReadRequest) (*stageRun, error) {
	switch {
	case o.store == nil || o.stager == nil:
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "node %q has no SSD tier", o.opts.NodeID)
	case req.Len <= 0:
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "stage read of %d bytes", req.Len)
	}
	if err := o.checkNodeGen("stage read", req.Generation); err != nil {
		return nil, err
	}
	if err := wire.ValidateKey(req.Key); err != nil {
		return nil, err
	}
	if c := o.store.Stats().CapacityBytes; req.Len > c {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "stage read of %d bytes from an SSD tier of %d", req.Len, c)
	}
	base, cancel := context.WithCancelCause(parent)
	s, err := o.stager.begin(req, cancel)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	return &stageRun{o: o, req: req, s: s, base: base, cancel: cancel}, nil
}

// run reads the value into staging while the requester pulls it, ends the session and
// answers, within the refill's stageLimit.
func (r *stageRun) run() error {
	defer r.cancel(nil)
	ctx, cancelTimeout := context.WithTimeout(r.base, r.o.stageLimit(r.req))
	defer cancelTimeout()
	stopWatch := r.o.stager.watch(r.s)
	err := r.load(ctx)
	if err == nil {
		err = r.o.stager.waitServed(ctx, r.s)
	}
	stopWatch()
	return r.end(ctx, err)
}

// stageLimit is how long the refill of req may take: proportional to its length, at
// most the requester's deadline_ms.
func (o *Owner) stageLimit(req *peer.SsdStageReadRequest) time.Duration {
	limit := o.bounds().stageDeadline(req.Len)
	if d := time.Duration(req.DeadlineMs) * time.Millisecond; d > 0 && d < limit {
		limit = d
	}
	return limit
}

// load reads the value into the session's slots.
func (r *stageRun) load(ctx context.Context) error {
	req := r.req
	err := r.o.store.LoadStaged(ctx, req.Key, req.PutId, req.Len, stageChunk, stageReadsInFlight, r.s, r.s.deliver)
	if errors.Is(err, ssd.ErrCorrupt) {
		r.o.opts.Metrics.SSDCorrupt()
		r.o.log.Error().Err(err).Str("key", req.Key).Int64("put_id", req.PutId).Msg("corrupt SSD record dropped")
	}
	return err
}

// end ends the session once its load returned (err: how the refill ended, nil when
// every chunk was pulled) and answers.
func (r *stageRun) end(ctx context.Context, err error) error {
	r.o.stager.end(r.s, err)
	return stageAnswer(ctx, r.req, r.o.opts.NodeID, err)
}

// stageAnswer is the answer to a refill that ended with err (nil: served and verified).
func stageAnswer(ctx context.Context, req *peer.SsdStageReadRequest, node string, err error) error {
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		err = fmt.Errorf("%w (%v)", err, cause)
	}
	// KEY_NOT_FOUND says the read failed (the requester drops this SSD replica); a
	// refill that ended otherwise (unpulled, abandoned, timed out, owner stopping, the
	// record moved by a refresh of its version) says nothing about the record.
	code := common.ErrorCode_KEY_NOT_FOUND
	if errors.Is(err, errStageEnded) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, ssd.ErrClosed) || errors.Is(err, ssd.ErrMoved) {
		code = common.ErrorCode_UNAVAILABLE
	}
	return errCode(code, "SSD refill of %q put %d from node %q: %v", req.Key, req.PutId, node, err)
}

// watch fails s once a read chunk stays unpulled for stageUnpulled while no pull of s
// came as long (watchAll: the requester is gone or stuck): its load stops and its
// slots go back. The returned func stops it and
// waits for it to end.
func (st *stager) watch(s *stageSession) (stop func()) {
	return st.watchAll([]*stageSession{s}, func(err error) { s.failLocked(fmt.Errorf("%w: %w", errStageEnded, err)) })
}

// watchAll calls fail (under st.mu, once) when a read chunk of one of the sessions ss
// still running stays unpulled for stageUnpulled while no pull of any of them arrived
// or ended for as long (pulledAt), and none is being sent: the requester is gone or
// stuck. A healthy requester shows itself at least every stageChunkWait (a pull waits
// no longer for its chunk), however long its pipeline's earlier pulls keep a chunk
// read early waiting. The returned func stops it and waits for it to end.
func (st *stager) watchAll(ss []*stageSession, fail func(error)) (stop func()) {
	done, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		tick := time.NewTicker(stageUnpulled / 4)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			st.mu.Lock()
			now := time.Now()
			var last time.Time
			for _, s := range ss {
				if s.pulledAt.After(last) {
					last = s.pulledAt
				}
				if s.sendingLocked() {
					last = now // a pull going on (a chunk's send may take 4 ProgressTimeouts)
				}
			}
			for _, s := range ss {
				if now.Sub(last) > stageUnpulled && s.err == nil && s.stalledLocked(now) {
					fail(fmt.Errorf("a read chunk waited %v for its pull (is the requester gone?)", stageUnpulled))
					st.mu.Unlock()
					return
				}
			}
			st.mu.Unlock()
		}
	}()
	return func() {
		close(done)
		<-ended
	}
}

// waitServed waits until every chunk of s was pulled, or s failed, or ctx ended.
func (st *stager) waitServed(ctx context.Context, s *stageSession) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	for s.served < len(s.chunks) {
		if s.err != nil {
			return s.err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", errStageEnded, context.Cause(ctx))
		}
		ch := s.changed
		st.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		st.mu.Lock()
	}
	return nil
}
