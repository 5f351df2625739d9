package daemon

import (
	"context"
	"fmt"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
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
	o.replicas.open(req.TargetOffset, req.Len) // the master placed a new value there
	o.mu.Unlock()
	dst := o.seg.Bytes()[req.TargetOffset : req.TargetOffset+req.Len]
	f := transfer.Fence{SourceNode: req.SourceNodeId, SourceGeneration: req.SourceGeneration, TransferID: req.PutId}
	pctx, cancel := context.WithTimeout(ctx, o.opts.TransferTimeout)
	defer cancel()
	if err := o.puller.Pull(pctx, req.SourceDataAddr, f, req.SourceOffset, dst); err != nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "%s", fmt.Sprintf("pull of put %d from node %q (%s): %v", req.PutId, req.SourceNodeId, req.SourceDataAddr, err))
	}
	return nil
}
