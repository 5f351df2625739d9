package daemon

import (
	"fmt"
	"sync"
	"time"

	"github.com/fluxkv/fluxkv/internal/workers"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/ssd"
)

// A get batch's values on another owner's SSD are refilled with one BatchSsdStageRead
// per source (peer.thrift): that owner registers every item's session at once, so each
// pull the requester sends finds its session and waits for its chunk, and reads the
// items in list order, STAGE_BATCH_IN_FLIGHT at a time when each fits a sub-slot of the
// staging area (stage_slots.go: KV pages), else stageBatchLarge at a time. Each item
// holds one slot or sub-slot from its read until its pull (items are one chunk each).
// An item of pages gives its place among the reads back once its chunk is read, not
// once it is pulled: the next items are read while the requester pulls the first ones
// (a batch whose reads waited for the pulls read in waves, each wave's pulls idle while
// the next wave was read). A batch of pages then holds at most stageBatchHeldSlots
// slots' worth of sub-slots, read or being read and not yet pulled; a batch of larger
// values 4 of the 12 slots, so batches from several requesters stage at once. The
// requester pulls in order; an item that finds no room while later ones hold it (many
// batches of large values at once) waits until its pull gives up (stageChunkWait), and
// that value is re-planned alone.

// stageBatchLarge is how many items of more than a sub-slot one batch reads at once.
const stageBatchLarge = 4

// stageBatchHeldSlots is how many slots' worth of sub-slots one batch of pages holds at
// most: its reads in flight and the read chunks waiting for their pulls.
const stageBatchHeldSlots = 2

// batchStageRead serves BatchSsdStageRead: one answer per item (nil: served and
// verified), or err for the whole call. Once an item failed because its read chunk
// waited unpulled for stageUnpulled, the requester has stopped pulling: the items not
// read yet fail at once instead of waiting as long each.
func (o *Owner) batchStageRead(req *peer.BatchSsdStageReadRequest) ([]error, error) {
	if n := len(req.Items); n > int(peer.STAGE_BATCH_ITEMS) {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "batch stage read of %d items, at most %d", n, peer.STAGE_BATCH_ITEMS)
	}
	errs := make([]error, len(req.Items))
	runs := make([]*stageRun, len(req.Items))
	var wait time.Duration
	for i, it := range req.Items {
		switch {
		case it == nil:
			errs[i] = errCode(common.ErrorCode_INVALID_ARGUMENT, "batch stage read: item %d is empty", i)
		case it.Len > stageChunk:
			errs[i] = errCode(common.ErrorCode_INVALID_ARGUMENT, "batch stage read of %d bytes: an item is at most one %d-byte chunk", it.Len, stageChunk)
		default:
			wait = max(wait, time.Duration(it.DeadlineMs)*time.Millisecond)
			if runs[i], errs[i] = o.beginStage(it); errs[i] != nil && it.GetId != 0 && o.stager != nil {
				// Its pull, pipelined behind the others, is answered at once.
				st := o.stager
				st.mu.Lock()
				if st.sessions[it.GetId] == nil {
					st.ended.add(it.GetId, errs[i], time.Now())
					st.broadcastLocked()
				}
				st.mu.Unlock()
			}
		}
	}
	var by time.Time // the requester's deadline bounds the whole call
	if wait > 0 {
		by = time.Now().Add(wait)
	}
	var (
		mu   sync.Mutex
		gone error // set once an item's chunk waited unpulled
	)
	reads, held := int(peer.STAGE_BATCH_IN_FLIGHT), stageBatchHeldSlots*subSlotsPerSlot
	for _, r := range runs {
		if r != nil && ssd.AlignedLen(r.req.Len) > stageSubSlot {
			reads, held = stageBatchLarge, stageBatchLarge
		}
	}
	readers := make(chan struct{}, reads)
	workers.ForEach(len(runs), held, func(i int) {
		r := runs[i]
		if r == nil {
			return
		}
		r.readers = readers
		mu.Lock()
		abandoned := gone
		mu.Unlock()
		if abandoned != nil {
			o.stager.end(r.s, abandoned)
			r.cancel(nil)
			errs[i] = stageAnswer(r.base, r.req, o.opts.NodeID, abandoned)
			return
		}
		if errs[i] = r.run(by); r.unpulled {
			mu.Lock()
			if gone == nil {
				gone = fmt.Errorf("%w: the chunk of %q waited %v for its pull: the requester stopped pulling this batch", errStageEnded, r.req.Key, stageUnpulled)
			}
			mu.Unlock()
		}
	})
	return errs, nil
}
