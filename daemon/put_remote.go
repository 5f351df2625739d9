package daemon

import (
	"context"
	"fmt"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// pullPut serves the master's PullPut: a put placed on this owner by another one
// (pooled placement, docs/architecture.md §10). This owner pulls the value from the requester's
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
	if !o.useSegment() {
		return errCode(common.ErrorCode_UNAVAILABLE, "owner %q is shutting down", o.opts.NodeID)
	}
	defer o.doneSegment()
	st := o.lock()
	t, err := st.beginPull(req)
	o.unlock()
	if err != nil {
		return err
	}
	dst := o.seg.Bytes()[req.TargetOffset : req.TargetOffset+req.Len]
	f := transfer.Fence{SourceNode: req.SourceNodeId, SourceGeneration: req.SourceGeneration, TransferID: req.PutId}
	pctx, cancel := context.WithTimeout(ctx, o.opts.TransferTimeout)
	defer cancel()
	err = o.puller.Pull(pctx, req.SourceDataAddr, f, req.SourceOffset, dst)
	st = o.lock()
	if perr := st.endPull(t); perr != nil {
		err = perr
	}
	o.unlock()
	if err != nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "%s", fmt.Sprintf("pull of put %d from node %q (%s): %v", req.PutId, req.SourceNodeId, req.SourceDataAddr, err))
	}
	return nil
}

// beginPull registers the target of the master's PullPut in segmentWrites (kind
// writePull) before a byte is pulled into it, and opens its range in the replica
// index (the master placed a new value there). It is refused while a registration is
// out — the master the call came from may be deposed by it, whose pins are already
// collected: writing now could hit a range the new master hands out (the master places
// the put again) — and when the call's master is older than the registered one (a whole
// registration may have run since the handler admitted it).
func (st *ownerState) beginPull(req *peer.PullPutRequest) (*segmentWrite, error) {
	if st.reg.registering {
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "owner %q is registering with a master; place the put again", st.nodeID)
	}
	if err := st.admit(req.MasterEpoch); err != nil {
		return nil, err
	}
	st.replicas.open(req.TargetOffset, req.Len)
	return st.writes.add(writePull, req.PutId, req.TargetOffset, req.Len), nil
}

// endPull ends a PullPut target once nothing writes it. When the owner registered
// with another master meanwhile, that master holds the range as a pin until this ack:
// the range was written, the calling master is gone, and the pull fails.
func (st *ownerState) endPull(t *segmentWrite) error {
	st.writes.remove(t)
	if t.pinned {
		st.ack(t.id)
		return fmt.Errorf("the owner registered with another master during the pull")
	}
	return nil
}
