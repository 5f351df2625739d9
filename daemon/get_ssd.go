package daemon

import (
	"errors"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/ssd"
)

// errStoreClosed answers a local refill the SSD tier refused because it is closing.
var errStoreClosed = errCode(common.ErrorCode_UNAVAILABLE, "the SSD tier is closing: the owner is stopping")

// refill serves a get planned from SSD on this owner: the shard is read straight into
// the target the master allocated in this segment (direct when aligned, else through a
// scratch buffer) and verified (checksums, key, version, length). The master recorded
// the holder at GetStart, so the bytes go out as soon as the read completed and
// verified; GetDone (promotion) follows in the background. A failed or corrupt read
// revokes the get with drop_ssd_source so the master forgets that replica (and the
// holder); the bytes in the target never reach anyone. A read refused because the
// storage is closing (the owner stopping) says nothing about the record: the get is
// revoked without dropping it and answers UNAVAILABLE.
//
// mark and own are the replica index's (see planGet), for a promotion confirmed in the
// background; t is the plan's target, whose epoch tells whether the owner registered
// again before the confirmation came back.
func (o *Owner) refill(key string, plan *mp.GetStartResponse, t *getTarget, mark, own uint64) (*holding, error) {
	h := &holding{key: key, putID: plan.PutId, len: plan.Len, source: plan.Source, offset: plan.TargetOffset}
	var err error
	drop := true // the master forgets this SSD replica
	switch {
	case o.store == nil:
		err = errCode(common.ErrorCode_UNAVAILABLE, "this owner has no SSD tier")
	case plan.TargetOffset < 0 || plan.Len <= 0 || plan.TargetOffset+ssd.AlignedLen(plan.Len) > o.seg.Size():
		err = errCode(common.ErrorCode_INTERNAL, "refill target [%d,+%d) outside the segment", plan.TargetOffset, plan.Len)
		drop = false
	default:
		// The target range spans whole 512-byte granules, so the aligned read's padding
		// stays inside it (and never reaches the holder, which has the real length).
		dst := o.seg.Bytes()[plan.TargetOffset : plan.TargetOffset+ssd.AlignedLen(plan.Len)]
		err = o.store.LoadInto(key, plan.PutId, dst, plan.Len)
		switch {
		case errors.Is(err, ssd.ErrCorrupt):
			o.opts.Metrics.SSDCorrupt()
			o.log.Error().Err(err).Str("key", key).Int64("put_id", plan.PutId).Msg("corrupt SSD record dropped")
		case errors.Is(err, ssd.ErrClosed):
			err, drop = errStoreClosed, false
		}
	}
	if err != nil {
		o.revokePlan(key, plan, drop, "SSD read: "+err.Error())
		return nil, err
	}
	o.targetWritten(plan.GetId)
	if o.getPinned(plan.GetId) {
		// The owner registered with a new master since GetStart: the holder the old one
		// recorded is gone, the new one holds the target as a pin (getpins.go).
		return nil, errGetMasterChanged()
	}
	if plan.HolderId == 0 {
		// A master that did not pre-record the holder: confirm before handing out.
		done, err := o.getDone(key, plan.GetId)
		if err != nil {
			return nil, err
		}
		h.masterID, h.replica, h.noticesSeq = done.HolderId, done.Promoted, done.NoticesSeq
		return h, nil
	}
	h.masterID = plan.HolderId
	o.wg.Add(1)
	go o.confirmRefill(key, plan.GetId, h, t, mark, own)
	return h, nil
}

// confirmRefill sends GetDone for a refill already handed out
// (ownerState.refillConfirmed takes the answer).
func (o *Owner) confirmRefill(key string, getID int64, h *holding, t *getTarget, mark, own uint64) {
	defer o.wg.Done()
	done, err := o.getDone(key, getID)
	if err != nil {
		// The holder stays valid (the master keeps it until acked); only the
		// promotion is lost.
		o.log.Warn().Err(err).Str("key", key).Msg("refill confirmation failed")
		return
	}
	o.lock().refillConfirmed(h, t, done, mark, own)
	o.unlock()
}
