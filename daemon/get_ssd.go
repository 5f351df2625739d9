package daemon

import (
	"errors"
	"fmt"

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
		case errors.Is(err, ssd.ErrMoved): // rewritten again and again meanwhile: still stored
			err, drop = errCode(common.ErrorCode_UNAVAILABLE, "SSD read of %q put %d: %v", key, plan.PutId, err), false
		}
	}
	if err != nil {
		o.revokePlan(key, plan, drop, fmt.Errorf("SSD read: %w", err))
		return nil, err
	}
	if plan.HolderId != 0 {
		return o.handOutRefill(key, plan, h, t, mark, own)
	}
	if err := o.refillWritten(plan); err != nil {
		return nil, err
	}
	// A master that did not pre-record the holder (an earlier release): confirm before
	// handing out.
	done, err := o.getDone(key, plan.GetId)
	if err != nil {
		return nil, o.getDoneFailed(key, plan, err)
	}
	h.masterID, h.replica, h.noticesSeq = done.HolderId, done.Promoted, done.NoticesSeq
	return h, nil
}

// refillWritten runs once a refill's target holds the verified value: it fails the get
// when the owner registered with a new master since GetStart (the holder the old one
// recorded is gone, the new one holds the target as a pin: getpins.go).
func (o *Owner) refillWritten(plan *mp.GetStartResponse) error {
	o.targetWritten(plan.GetId)
	if o.getPinned(plan.GetId) {
		return errGetMasterChanged()
	}
	return nil
}

// handOutRefill hands out h, a refill's holder the master recorded at GetStart
// (plan.HolderId), once its target holds the verified value, and confirms the refill
// with GetDone in the background (confirmRefills: its promotion).
func (o *Owner) handOutRefill(key string, plan *mp.GetStartResponse, h *holding, t *getTarget, mark, own uint64) (*holding, error) {
	if err := o.refillWritten(plan); err != nil {
		return nil, err
	}
	h.masterID = plan.HolderId
	o.confirmRefills([]refillConfirm{{key: key, getID: plan.GetId, h: h, t: t, mark: mark, own: own}})
	return h, nil
}

// refillConfirm is a refill handed out before its GetDone, and what its confirmation
// needs: the holder, the plan's target and the replica index's mark and open.
type refillConfirm struct {
	key       string
	getID     int64
	h         *holding
	t         *getTarget
	mark, own uint64
}

// confirmRefills sends the GetDones of refills already handed out together, in the
// background (ownerState.refillConfirmed takes each answer).
func (o *Owner) confirmRefills(rs []refillConfirm) {
	keys, ids := make([]string, len(rs)), make([]int64, len(rs))
	for i, r := range rs {
		keys[i], ids[i] = r.key, r.getID
	}
	o.wg.Go(func() {
		for i, c := range o.getDoneMany(keys, ids) {
			r := rs[i]
			if c.err != nil {
				// The holder stays valid (the master keeps it until acked); only the
				// promotion is lost.
				o.log.Warn().Err(c.err).Str("key", r.key).Msg("refill confirmation failed")
				continue
			}
			o.lock().refillConfirmed(r.h, r.t, c.resp, r.mark, r.own)
			o.unlock()
		}
	})
}
