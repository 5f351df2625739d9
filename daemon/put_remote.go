package daemon

import (
	"context"
	"fmt"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// pullPut serves the master's PullPut: a put placed on this owner by another one
// (pooled placement, DESIGN §10). This owner pulls the value from the requester's
// transfer area straight into the target range the master allocated in this segment
// and answers once the bytes are in or the pull failed; only this process writes its
// segment, and never after answering (the master frees or publishes the range then).
func (o *Owner) pullPut(ctx context.Context, req *peer.PullPutRequest) error {
	if req.Generation != o.generation {
		return errCode(common.ErrorCode_STALE_GENERATION, "PullPut for generation %d reached generation %d of node %q", req.Generation, o.generation, o.opts.NodeID)
	}
	if req.Len <= 0 || req.TargetOffset < 0 || req.TargetOffset > o.seg.Size()-req.Len {
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "PullPut target [%d,+%d) outside the %d-byte segment", req.TargetOffset, req.Len, o.seg.Size())
	}
	o.mu.Lock()
	if o.registering {
		// The master this call came from may be deposed by the registration going on,
		// whose pins are already collected: writing now could hit a range the new master
		// hands out. The master places the put again.
		o.mu.Unlock()
		return errCode(common.ErrorCode_UNAVAILABLE, "owner %q is registering with a master; place the put again", o.opts.NodeID)
	}
	// Again under the lock: a whole registration may have run since the handler
	// admitted the call (it stores the new epoch before it clears registering).
	if err := o.master.admit(req.MasterEpoch); err != nil {
		o.mu.Unlock()
		return err
	}
	o.replicas.open(req.TargetOffset, req.Len) // the master placed a new value there
	t := &pullTarget{putID: req.PutId, offset: req.TargetOffset, len: req.Len}
	if o.pulls == nil {
		o.pulls = make(map[*pullTarget]bool)
	}
	o.pulls[t] = true
	o.mu.Unlock()
	dst := o.seg.Bytes()[req.TargetOffset : req.TargetOffset+req.Len]
	f := transfer.Fence{SourceNode: req.SourceNodeId, SourceGeneration: req.SourceGeneration, TransferID: req.PutId}
	pctx, cancel := context.WithTimeout(ctx, o.opts.TransferTimeout)
	defer cancel()
	err := o.puller.Pull(pctx, req.SourceDataAddr, f, req.SourceOffset, dst)
	o.mu.Lock()
	delete(o.pulls, t)
	if t.pinned {
		// The owner registered with another master meanwhile, which holds the range as a
		// pin until this ack: the range was written, the calling master is gone.
		o.ackLocked(t.putID)
		err = fmt.Errorf("the owner registered with another master during the pull")
	}
	o.mu.Unlock()
	if err != nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "%s", fmt.Sprintf("pull of put %d from node %q (%s): %v", req.PutId, req.SourceNodeId, req.SourceDataAddr, err))
	}
	return nil
}

// pullTarget is a PullPut target range being written; a registration meanwhile reports
// it as a pin (PinId = put id) and marks it pinned.
type pullTarget struct {
	putID, offset, len int64
	pinned             bool
}

// pullPinsLocked pins the PullPut targets being written (o.mu held).
func (o *Owner) pullPinsLocked() []*mp.PinnedRange {
	var pins []*mp.PinnedRange
	for t := range o.pulls {
		t.pinned = true
		pins = append(pins, &mp.PinnedRange{PinId: t.putID, Offset: t.offset, Len: t.len})
	}
	return pins
}
