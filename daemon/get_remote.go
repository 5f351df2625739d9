package daemon

import (
	"context"
	"fmt"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// pullRemote serves a get planned from another owner's memory replica: this owner
// pulls the bytes over the data plane straight into the target the master allocated
// in its segment (only this owner writes its segment: DESIGN §10), then GetDone turns
// the target into a holder (and maybe the key's memory replica here). A failed pull
// revokes the get with the reason; the caller re-plans without that node.
func (o *Owner) pullRemote(key string, plan *mp.GetStartResponse) (*holding, error) {
	if plan.TargetOffset < 0 || plan.Len <= 0 || plan.TargetOffset > o.seg.Size()-plan.Len {
		err := errCode(common.ErrorCode_INTERNAL, "pull target [%d,+%d) outside the segment", plan.TargetOffset, plan.Len)
		o.revokeGet(key, plan.GetId, false, err.Error())
		return nil, err
	}
	dst := o.seg.Bytes()[plan.TargetOffset : plan.TargetOffset+plan.Len]
	f := transfer.Fence{SourceNode: plan.SourceNodeId, SourceGeneration: plan.SourceGeneration, TransferID: plan.GetId}
	ctx, cancel := context.WithTimeout(context.Background(), o.opts.TransferTimeout)
	err := o.puller.Pull(ctx, plan.SourceDataAddr, f, plan.SourceOffset, dst)
	cancel()
	if err != nil {
		err = fmt.Errorf("pull from node %q (%s): %w", plan.SourceNodeId, plan.SourceDataAddr, err)
		o.revokeGet(key, plan.GetId, false, err.Error())
		return nil, err
	}
	mctx, mcancel := o.master.ctx()
	defer mcancel()
	done, derr := o.master.c.GetDone(mctx, &mp.GetDoneRequest{Node: o.master.ref, Key: key, GetId: plan.GetId})
	if err := o.master.check(respCode(done, derr)); err != nil {
		return nil, err
	}
	return &holding{key: key, putID: plan.PutId, len: plan.Len, source: plan.Source, offset: plan.TargetOffset,
		masterID: done.HolderId, replica: done.Promoted, remote: true}, nil
}

// segmentSource serves other owners' pulls from this owner's segment: the fence must
// name this incarnation, and the range must lie in the segment. The master retains the
// range for the transfer (until its GetDone or GetRevoke), so it holds the value.
type segmentSource struct{ o *Owner }

func (s segmentSource) Open(f transfer.Fence, offset, length int64) ([]byte, func(), error) {
	o := s.o
	if f.SourceNode != o.opts.NodeID || f.SourceGeneration != o.generation {
		return nil, nil, fmt.Errorf("%w: pull for node %q generation %d reached node %q generation %d",
			transfer.ErrFenced, f.SourceNode, f.SourceGeneration, o.opts.NodeID, o.generation)
	}
	seg := o.seg.Bytes()
	if offset < 0 || length <= 0 || offset > int64(len(seg))-length {
		return nil, nil, fmt.Errorf("%w: range [%d,+%d) outside the %d-byte segment", transfer.ErrFenced, offset, length, len(seg))
	}
	return seg[offset : offset+length], func() {}, nil
}
