package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// pullRemote serves a get planned from another owner's memory replica: this owner
// pulls the bytes over the data plane straight into the target the master allocated
// in its segment (only this owner writes its segment: DESIGN §10), then GetDone turns
// the target into a holder (and maybe the key's memory replica here). A failed pull
// revokes the get with the reason; the caller re-plans without that node.
func (o *Owner) pullRemote(key string, plan *mp.GetStartResponse) (*holding, error) {
	if err := o.checkTarget(key, plan); err != nil {
		return nil, err
	}
	return o.pullInto(key, plan, plan.SourceOffset)
}

// errRemoteSSD marks a refill whose SSD read on the source owner failed: the get is
// revoked with drop_ssd_source and re-planned, as a local SSD failure is.
var errRemoteSSD = errors.New("SSD read on the source owner failed")

// refillRemote serves a get planned from another owner's SSD: that owner stages the
// value in its segment (SsdStageRead answers once it is read and verified), then this
// owner pulls it from the staging range into its target, like a remote memory get.
// Staging whole values, not pipelined 4 MiB chunks, is this build's simplification.
func (o *Owner) refillRemote(key string, plan *mp.GetStartResponse) (*holding, error) {
	if err := o.checkTarget(key, plan); err != nil {
		return nil, err
	}
	c, callOpts, err := o.peers.Get(plan.SourcePeerAddr)
	var resp *peer.SsdStageReadResponse
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), o.opts.TransferTimeout)
		resp, err = c.SsdStageRead(ctx, &peer.SsdStageReadRequest{Key: key, PutId: plan.PutId, GetId: plan.GetId,
			StageOffset: plan.StageOffset, StageLen: plan.StageLen, TargetNodeId: o.opts.NodeID, TargetDataAddr: o.dataAddr,
			TargetOffset: plan.TargetOffset, Len: plan.Len, Generation: plan.SourceGeneration}, callOpts...)
		cancel()
	}
	if err != nil {
		err = fmt.Errorf("%w: stage read on node %q (%s): %v", transfer.ErrUnreachable, plan.SourceNodeId, plan.SourcePeerAddr, err)
		o.revokeGet(key, plan.GetId, false, err.Error())
		return nil, err
	}
	if resp.Code != common.ErrorCode_OK {
		err = fmt.Errorf("%w: %s", errRemoteSSD, resp.Message)
		o.revokeGet(key, plan.GetId, true, err.Error())
		return nil, err
	}
	return o.pullInto(key, plan, plan.StageOffset)
}

// checkTarget refuses (and revokes) a plan whose target is not inside the segment.
func (o *Owner) checkTarget(key string, plan *mp.GetStartResponse) error {
	if plan.TargetOffset < 0 || plan.Len <= 0 || plan.TargetOffset > o.seg.Size()-plan.Len {
		err := errCode(common.ErrorCode_INTERNAL, "pull target [%d,+%d) outside the segment", plan.TargetOffset, plan.Len)
		o.revokeGet(key, plan.GetId, false, err.Error())
		return err
	}
	return nil
}

// pullInto pulls the planned value from srcOffset of the source owner's segment into
// the target, then completes the get with GetDone; a failed pull revokes it.
func (o *Owner) pullInto(key string, plan *mp.GetStartResponse, srcOffset int64) (*holding, error) {
	dst := o.seg.Bytes()[plan.TargetOffset : plan.TargetOffset+plan.Len]
	f := transfer.Fence{SourceNode: plan.SourceNodeId, SourceGeneration: plan.SourceGeneration, TransferID: plan.GetId}
	ctx, cancel := context.WithTimeout(context.Background(), o.opts.TransferTimeout)
	err := o.puller.Pull(ctx, plan.SourceDataAddr, f, srcOffset, dst)
	cancel()
	if err != nil {
		err = fmt.Errorf("pull from node %q (%s): %w", plan.SourceNodeId, plan.SourceDataAddr, err)
		o.revokeGet(key, plan.GetId, false, err.Error())
		return nil, err
	}
	mctx, mcancel := o.master.ctx()
	defer mcancel()
	done, derr := o.master.c.GetDone(mctx, &mp.GetDoneRequest{Node: o.master.ref, Key: key, GetId: plan.GetId})
	if derr != nil {
		// The reply may be lost after the master recorded the holder, whose id is the
		// get id: release it (an ack of a holder that does not exist does no harm; an
		// unfinished get expires with the master's in-flight TTL).
		o.acks.add(plan.GetId)
	}
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
