package daemon

import (
	"errors"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/ssd"
)

// stageRead serves another owner's refill from this owner's SSD (DESIGN §10, "SSD
// pool"): it reads key@put_id into the staging range the master allocated in this
// segment, verified like every SSD read, and answers once the whole value is staged;
// the requester then pulls it over the data plane (fence: this incarnation and the get
// id) into its own target. A failed or corrupt read answers an error code: the
// requester revokes with drop_ssd_source.
func (o *Owner) stageRead(req *peer.SsdStageReadRequest) error {
	switch {
	case o.store == nil:
		return errCode(common.ErrorCode_UNAVAILABLE, "node %q has no SSD tier", o.opts.NodeID)
	case req.Generation != o.generation:
		return errCode(common.ErrorCode_STALE_GENERATION, "stage read for generation %d reached generation %d of node %q", req.Generation, o.generation, o.opts.NodeID)
	case req.Len <= 0 || req.StageOffset < 0 || req.StageLen < ssd.AlignedLen(req.Len) || req.StageOffset > o.seg.Size()-req.StageLen:
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "stage [%d,+%d) cannot hold %d bytes inside the %d-byte segment", req.StageOffset, req.StageLen, req.Len, o.seg.Size())
	}
	dst := o.seg.Bytes()[req.StageOffset : req.StageOffset+req.StageLen]
	err := o.store.LoadInto(req.Key, req.PutId, dst, req.Len)
	if errors.Is(err, ssd.ErrCorrupt) {
		o.opts.Metrics.SSDCorrupt()
		o.log.Error().Err(err).Str("key", req.Key).Int64("put_id", req.PutId).Msg("corrupt SSD record dropped")
	}
	if err != nil {
		return errCode(common.ErrorCode_KEY_NOT_FOUND, "SSD read of %q put %d on node %q: %v", req.Key, req.PutId, o.opts.NodeID, err)
	}
	return nil
}
