package daemon

import (
	"context"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// maxSSDFailures: the third consecutive SSD failure of one get is an error, not a miss.
const maxSSDFailures = 3

// ssdInfo is what the owner declares about its SSD tier at Register and Heartbeat.
func (o *Owner) ssdInfo() *mp.KvSsdStorageInfo {
	if o.store == nil {
		return &mp.KvSsdStorageInfo{}
	}
	st := o.store.Stats()
	return &mp.KvSsdStorageInfo{Enabled: true, CapacityBytes: st.CapacityBytes, UsedBytes: st.UsedBytes}
}

// persist writes the memory replica of key@putID to the local SSD ring and commits it
// at the master; the commit pin keeps the SSD entry from being overwritten until the
// master answered. The master keeps the memory range alive meanwhile.
func (o *Owner) persist(req *peer.SsdReplicaPersistRequest) error {
	if o.store == nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "this owner has no SSD tier")
	}
	if req.Generation != o.generation {
		return errCode(common.ErrorCode_STALE_GENERATION, "persist for generation %d, this owner is %d", req.Generation, o.generation)
	}
	if err := wire.ValidateKey(req.Key); err != nil {
		return err
	}
	if req.Offset < 0 || req.Len <= 0 || req.Offset+req.Len > o.seg.Size() {
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "range [%d,+%d) outside the segment", req.Offset, req.Len)
	}
	pin, err := o.store.Persist(req.Key, req.PutId, o.seg.Bytes()[req.Offset:req.Offset+req.Len])
	if err != nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "SSD persist: %v", err)
	}
	defer pin.Release()
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.c.SsdReplicaCommit(ctx, &mp.SsdReplicaCommitRequest{Node: o.master.ref, Key: req.Key, PutId: req.PutId, Len: req.Len})
	return o.master.check(respCode(resp, err))
}

// forwardEvictions reports SSD ring evictions to the master in the storage's batches.
func (o *Owner) forwardEvictions() {
	defer o.wg.Done()
	for batch := range o.store.Evictions() {
		entries := make([]*common.KeyVersion, len(batch))
		for i, e := range batch {
			entries[i] = &common.KeyVersion{Key: e.Key, PutId: e.PutID}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := o.master.c.BatchSsdReplicaEvict(ctx, &mp.BatchSsdReplicaEvictRequest{Node: o.master.ref, Entries: entries})
		cancel()
		if err := o.master.check(respCode(resp, err)); err != nil {
			// A master that lost us forgot these routes anyway; an unreachable one will
			// find a failed read (ErrNotFound) and drop the replica then.
			o.log.Warn().Err(err).Int("entries", len(entries)).Msg("SSD eviction report failed")
		}
	}
}

// refill serves a get planned from SSD on this owner: the shard is read straight into
// the target the master allocated in this segment (direct when aligned, else through a
// scratch buffer). The master recorded the holder at GetStart, so the bytes go out as
// soon as the read completes; GetDone (promotion) follows in the background. A failed
// read revokes the get with drop_ssd_source so the master forgets that replica (and
// the holder).
func (o *Owner) refill(key string, plan *mp.GetStartResponse, h *holding) error {
	ctx, cancel := o.master.ctx()
	defer cancel()
	var err error
	switch {
	case o.store == nil:
		err = errCode(common.ErrorCode_UNAVAILABLE, "this owner has no SSD tier")
	case plan.TargetOffset < 0 || plan.Len <= 0 || plan.TargetOffset+ssd.AlignedLen(plan.Len) > o.seg.Size():
		err = errCode(common.ErrorCode_INTERNAL, "refill target [%d,+%d) outside the segment", plan.TargetOffset, plan.Len)
	default:
		// The target range spans whole 512-byte granules, so the aligned read's padding
		// stays inside it (and never reaches the holder, which has the real length).
		dst := o.seg.Bytes()[plan.TargetOffset : plan.TargetOffset+ssd.AlignedLen(plan.Len)]
		err = o.store.LoadInto(key, plan.PutId, dst, plan.Len)
	}
	if err != nil {
		r, rerr := o.master.c.GetRevoke(ctx, &mp.GetRevokeRequest{Node: o.master.ref, Key: key, GetId: plan.GetId, DropSsdSource: true})
		if rerr := o.master.check(respCode(r, rerr)); rerr != nil {
			o.log.Warn().Err(rerr).Str("key", key).Msg("get revoke failed; the master's TTL will reclaim it")
		}
		return err
	}
	if plan.HolderId == 0 {
		// A master that did not pre-record the holder: confirm before handing out.
		done, derr := o.master.c.GetDone(ctx, &mp.GetDoneRequest{Node: o.master.ref, Key: key, GetId: plan.GetId})
		if err := o.master.check(respCode(done, derr)); err != nil {
			return err
		}
		h.masterID, h.replica = done.HolderId, done.Promoted
		return nil
	}
	h.masterID = plan.HolderId
	o.wg.Add(1)
	go o.confirmRefill(key, plan.GetId, h)
	return nil
}

// confirmRefill sends GetDone for a refill already handed out. A promoted target is
// the key's memory replica from then on, so its holding may stay cached after release.
func (o *Owner) confirmRefill(key string, getID int64, h *holding) {
	defer o.wg.Done()
	ctx, cancel := o.master.ctx()
	defer cancel()
	done, err := o.master.c.GetDone(ctx, &mp.GetDoneRequest{Node: o.master.ref, Key: key, GetId: getID})
	if err := o.master.check(respCode(done, err)); err != nil {
		// The holder stays valid (the master keeps it until acked); only the
		// promotion is lost.
		o.log.Warn().Err(err).Str("key", key).Msg("refill confirmation failed")
		return
	}
	o.mu.Lock()
	h.replica = done.Promoted
	o.mu.Unlock()
}

// planGet runs GetStart until it yields a holder: a local memory replica (done at
// once) or a successful local SSD refill. SSD failures re-plan; a re-plan that finds
// no replica is a miss, and the third consecutive SSD failure is UNAVAILABLE.
func (o *Owner) planGet(key string) (*holding, error) {
	var lastErr error
	for failures := 0; ; {
		ctx, cancel := o.master.ctx()
		acks := o.acks.take()
		plan, err := o.master.c.GetStart(ctx, &mp.GetStartRequest{Node: o.master.ref, Key: key, Acks: acks})
		cancel()
		if err != nil {
			o.acks.giveBack(acks)
		}
		if err := o.master.check(respCode(plan, err)); err != nil {
			return nil, err
		}
		h := &holding{key: key, putID: plan.PutId, len: plan.Len, source: plan.Source}
		switch {
		case plan.Done:
			h.offset, h.masterID, h.replica = plan.TargetOffset, plan.HolderId, true
			return h, nil
		case plan.Source == common.Source_SSD && plan.SourceNodeId == o.opts.NodeID:
			h.offset = plan.TargetOffset
			err := o.refill(key, plan, h)
			if err == nil {
				return h, nil
			}
			failures++
			lastErr = err
			o.log.Warn().Err(err).Str("key", key).Int("failures", failures).Msg("SSD refill failed; re-planning")
			if failures >= maxSSDFailures {
				return nil, errCode(common.ErrorCode_UNAVAILABLE, "SSD read failed %d times: %v", failures, lastErr)
			}
		default:
			ctx, cancel := o.master.ctx()
			r, rerr := o.master.c.GetRevoke(ctx, &mp.GetRevokeRequest{Node: o.master.ref, Key: key, GetId: plan.GetId})
			cancel()
			if rerr := o.master.check(respCode(r, rerr)); rerr != nil {
				o.log.Warn().Err(rerr).Str("key", key).Msg("get revoke failed; the master's TTL will reclaim it")
			}
			return nil, errCode(common.ErrorCode_UNAVAILABLE, "the key's replica is on node %q (%s): owner-to-owner transfer is not available in this build", plan.SourceNodeId, plan.Source)
		}
	}
}
