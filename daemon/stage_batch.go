package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// A get batch's values on another owner's SSD are refilled with one BatchSsdStageRead
// per source (peer.thrift): that owner registers every item's session at once, so each
// pull the requester sends finds its session and waits for its chunk, and reads the
// items in list order, STAGE_BATCH_IN_FLIGHT at a time when each fits a sixteenth
// sub-slot of the staging area (stage_slots.go: KV pages), else stageBatchLarge at a
// time. Each item holds one slot or sub-slot from its read until its pull (items are
// one chunk each). An item frees its reader once its chunk is read, and its place
// among the held items once it is pulled: the next items are read while the requester
// pulls the first ones (a batch whose reads waited for the pulls read in waves, each
// wave's pulls idle while the next wave was read). A batch of values that fit sub-slots then holds
// at most stageBatchHeldSlots slots' worth of them (32 pages of up to 256 KiB, or 8
// values of up to 1 MiB), read or being read and not yet pulled; a batch of larger
// values 4 of the 12 slots, so batches from several requesters stage at once. The
// requester pulls in order; an item that finds no room while later ones hold it (many
// batches of large values at once) waits until its pull gives up (stageChunkWait), and
// that value is re-planned alone.
//
// The readers only read: an item read waits for its pull without a goroutine of its
// own. One goroutine (the caller's) ends the items in list order, each once it was
// pulled or failed; an item whose read failed its reader ends at once (its pull hears
// so, its place comes back). Every item shares the call's one deadline, the refill
// deadline of all their bytes (pulled one after another), at most the requester's
// deadline_ms (its own call ends then): batchStageLimit. A requester gone or stuck has
// every item answered once a read item waited stageUnpulled for its pull while no pull
// of the batch came as long (watchAll), or at the deadline, the items it left unpulled
// and the ones not read yet.

// stageBatchLarge is how many items of more than a sixteenth sub-slot one batch reads
// at once, and how many of more than a quarter one it holds.
const stageBatchLarge = 4

// stageBatchHeldSlots is how many slots' worth of sub-slots one batch of values that
// fit them holds at most: its reads in flight and the read chunks waiting for their
// pulls.
const stageBatchHeldSlots = 2

// stageBatch is one BatchSsdStageRead being served.
type stageBatch struct {
	o    *Owner
	runs []*stageRun     // nil: refused at its begin
	read []chan struct{} // closed once the item's read ended (or it was not read)
	// errs[i] is item i's answer once its read ended in error (its session ended
	// then: its pull hears so at once, and its place comes back), else the read's nil
	// until end sets the answer.
	errs []error
	// places bounds the items read or being read and not yet pulled: an item takes a
	// place before its read, and its session gives it back (stageSession.place).
	places chan struct{}
}

// batchStageRead serves BatchSsdStageRead: one answer per item (nil: served and
// verified), or err for the whole call.
func (o *Owner) batchStageRead(req *peer.BatchSsdStageReadRequest) ([]error, error) {
	if n := len(req.Items); n > int(peer.STAGE_BATCH_ITEMS) {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "batch stage read of %d items, at most %d", n, peer.STAGE_BATCH_ITEMS)
	}
	stopped, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	ctx, cancel := context.WithTimeout(stopped, o.batchStageLimit(req.Items))
	defer cancel()
	b := &stageBatch{o: o, runs: make([]*stageRun, len(req.Items)), read: make([]chan struct{}, len(req.Items)),
		errs: make([]error, len(req.Items))}
	for i, it := range req.Items {
		switch {
		case it == nil:
			b.errs[i] = errCode(common.ErrorCode_INVALID_ARGUMENT, "batch stage read: item %d is empty", i)
		case it.Len > stageChunk:
			b.errs[i] = errCode(common.ErrorCode_INVALID_ARGUMENT, "batch stage read of %d bytes: an item is at most one %d-byte chunk", it.Len, stageChunk)
		default:
			if b.runs[i], b.errs[i] = o.beginStage(ctx, it); b.errs[i] != nil && it.GetId != 0 && o.stager != nil {
				// Its pull, pipelined behind the others, is answered at once.
				st := o.stager
				st.mu.Lock()
				if st.sessions[it.GetId] == nil {
					st.ended.add(it.GetId, b.errs[i], time.Now())
					st.broadcastLocked()
				}
				st.mu.Unlock()
			}
		}
		b.read[i] = make(chan struct{})
	}
	// The sub-slots the batch's largest item needs set its reads and places.
	per := subSlotsPerSlot
	for _, r := range b.runs {
		if r != nil {
			if c := subClassOf(r.req.Len); c == 0 {
				per = 1
			} else {
				per = min(per, subClasses[c-1].per)
			}
		}
	}
	reads, held := int(peer.STAGE_BATCH_IN_FLIGHT), stageBatchHeldSlots*per
	switch {
	case per == 1:
		reads, held = stageBatchLarge, stageBatchLarge
	case per < subSlotsPerSlot:
		reads = stageBatchLarge
	}
	b.places = make(chan struct{}, held)
	// A requester gone or stuck leaves a read item unpulled and sends no pulls: after
	// stageUnpulled of that, every item is answered (the ones not read yet, and the
	// read ones left unpulled).
	var sessions []*stageSession
	for _, r := range b.runs {
		if r != nil {
			sessions = append(sessions, r.s)
		}
	}
	stopWatch := func() {}
	if len(sessions) > 0 {
		stopWatch = o.stager.watchAll(sessions, stop)
	}
	readers := make(chan struct{})
	go func() {
		defer close(readers)
		b.readAll(reads)
	}()
	for i := range b.runs {
		b.end(i)
	}
	<-readers
	stopWatch()
	return b.errs, nil
}

// batchStageLimit is how long a BatchSsdStageRead of items may take: the refill
// deadline of their bytes together (each item is pulled after the ones before it), at
// most the longest deadline_ms the requester gave (its call ends then).
func (o *Owner) batchStageLimit(items []*peer.SsdStageReadRequest) time.Duration {
	var total int64
	var asked time.Duration
	for _, it := range items {
		if it != nil && it.Len > 0 && it.Len <= stageChunk {
			total += it.Len
			asked = max(asked, time.Duration(it.DeadlineMs)*time.Millisecond)
		}
	}
	limit := o.bounds().stageDeadline(total)
	if asked > 0 && asked < limit {
		limit = asked
	}
	return limit
}

// readAll reads the items with reads readers, handing each item to them once it has a
// place, in list order (the requester pulls in that order: a later item taking the
// place an earlier one waits for would hold it until the earlier one's pull gave up).
// An item whose session failed before its turn is not read.
func (b *stageBatch) readAll(reads int) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range min(reads, len(b.runs)) {
		wg.Go(func() {
			for i := range work {
				r := b.runs[i]
				if err := r.load(r.base); err != nil {
					b.errs[i] = r.end(r.base, err)
				}
				close(b.read[i])
			}
		})
	}
	st := b.o.stager
	for i, r := range b.runs {
		if r == nil {
			close(b.read[i])
			continue
		}
		placed := false
		select {
		case b.places <- struct{}{}:
			placed = true
		case <-r.base.Done():
		}
		if r.base.Err() != nil { // (both may have been ready: an ended batch reads no more)
			if placed {
				<-b.places
			}
			b.errs[i] = r.end(r.base, fmt.Errorf("%w: waiting for a read of %q: %w", errStageEnded, r.req.Key, context.Cause(r.base)))
			close(b.read[i])
			continue
		}
		st.mu.Lock()
		if r.s.err == nil {
			r.s.place = b.places
		} else {
			<-b.places
		}
		st.mu.Unlock()
		work <- i
	}
	close(work)
	wg.Wait()
}

// end waits for item i's read, then (read) for its pull, ends its session and sets its
// answer.
func (b *stageBatch) end(i int) {
	r := b.runs[i]
	if r == nil {
		return
	}
	defer r.cancel(nil)
	<-b.read[i]
	if b.errs[i] != nil {
		return // ended when its read failed
	}
	b.errs[i] = r.end(r.base, b.o.stager.waitServed(r.base, r.s))
}
