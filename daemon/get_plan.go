package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/ssd"
)

// maxSSDFailures: the third consecutive SSD failure of one get is an error, not a miss.
// maxPullFailures bounds the pulls one get tries (each from another node).
const (
	maxSSDFailures  = 3
	maxPullFailures = 3
)

// planGet runs GetStart until it yields a holder: a local memory replica (done at
// once), a pull from another owner's memory replica, or a successful local SSD
// refill. SSD failures (IO errors, corrupt records) revoke the get with
// drop_ssd_source and re-plan; a failed pull revokes and re-plans without that node.
// A re-plan that finds no replica is a miss; the third consecutive SSD failure, or the
// third failed pull, is UNAVAILABLE.
//
// Each answer teaches the replica index (replicas.go): a local hit, and a target that
// became the key's replica here (promoted), are recorded; a target is opened (records
// overlapping it forgotten) when its plan is accepted, with its registration as a write
// (ownerState.acceptPlan), before anything is written into it.
//
// The plan's getTarget (getpins.go) comes back with the holder: the caller ends it
// when the holder reaches its session (or not). A failed attempt ends it here, once
// nothing writes its target; one whose target was pinned meanwhile (the owner
// registered with a new master) fails the get UNAVAILABLE instead of re-planning.
//
// s is the first plan (startGets); the re-plans go one key at a time (GetStart). pre,
// when set, is the first plan's pull, already made with the rest of its batch
// (pullBatch): its outcome known.
func (o *Owner) planGet(key string, s startedGet, pre *prePulled) (*holding, *getTarget, error) {
	var exclude []string
	notNow := "" // the source that last answered a refill UNAVAILABLE (errRemoteSSDNotNow)
	for failures := 0; ; s, pre = o.getStart(key, exclude), nil {
		if s.err != nil {
			return nil, nil, s.err
		}
		plan, t, mark := s.plan, s.t, s.mark
		if plan.Done {
			// (A BatchGet's pulls run between its plans and this: the owner may have
			// registered again meanwhile.)
			h := localHit(key, plan)
			o.learnFresh(t, h, mark, 0)
			return h, t, nil
		}
		own := t.own // (the target's records went when its plan was accepted)
		done := func(h *holding) (*holding, *getTarget, error) {
			o.learnFresh(t, h, mark, own)
			return h, t, nil
		}
		switch {
		case plan.Source == common.Source_MEMORY && plan.SourceNodeId != o.opts.NodeID:
			var h *holding
			var err error
			if pre != nil {
				h, err = o.finishPulled(key, plan, pre)
			} else {
				h, err = o.pullRemote(key, plan)
			}
			if err == nil {
				return done(h)
			}
			if err := o.endGet(t); err != nil {
				return nil, nil, err
			}
			if exclude, err = o.excludeSource(key, plan, exclude, err); err != nil {
				return nil, nil, err
			}
		case plan.Source == common.Source_SSD && plan.SourceNodeId != o.opts.NodeID:
			var h *holding
			var err error
			if pre != nil {
				h, err = o.finishPulled(key, plan, pre)
			} else {
				h, err = o.refillRemote(key, plan, t, mark, own)
			}
			if err == nil {
				return done(h)
			}
			if err := o.endGet(t); err != nil {
				return nil, nil, err
			}
			if errors.Is(err, errRemoteSSDNotNow) && notNow == plan.SourceNodeId {
				// Twice in a row: the source itself may be out (stopping, its tier
				// closed), not only the record: another replica, if any, goes next.
				exclude = append(exclude, plan.SourceNodeId)
			}
			if errors.Is(err, errRemoteSSD) || errors.Is(err, errRemoteSSDNotNow) {
				if errors.Is(err, errRemoteSSDNotNow) {
					notNow = plan.SourceNodeId
				}
				failures++
				o.log.Warn().Err(err).Str("key", key).Int("failures", failures).Msg("remote SSD refill failed; re-planning")
				if failures >= maxSSDFailures {
					return nil, nil, errCode(common.ErrorCode_UNAVAILABLE, "SSD read failed %d times: %v", failures, err)
				}
				continue
			}
			if exclude, err = o.excludeSource(key, plan, exclude, err); err != nil {
				return nil, nil, err
			}
		case plan.Source == common.Source_SSD && plan.SourceNodeId == o.opts.NodeID:
			h, err := o.refill(key, plan, t, mark, own)
			if err == nil {
				return done(h)
			}
			if err := o.endGet(t); err != nil {
				return nil, nil, err
			}
			if errors.Is(err, errStoreClosed) {
				return nil, nil, err // the owner is stopping: a re-plan would read here again
			}
			failures++
			o.log.Warn().Err(err).Str("key", key).Int("failures", failures).Msg("SSD refill failed; re-planning")
			if failures >= maxSSDFailures {
				return nil, nil, errCode(common.ErrorCode_UNAVAILABLE, "SSD read failed %d times: %v", failures, err)
			}
		default:
			o.revokePlan(key, plan, false, errors.New("unknown plan"))
			if err := o.endGet(t); err != nil {
				return nil, nil, err
			}
			return nil, nil, errCode(common.ErrorCode_INTERNAL, "the master planned a get from node %q (%s) this owner cannot serve", plan.SourceNodeId, plan.Source)
		}
	}
}

// learnFresh records h in the replica index (ownerState.learnReplica) unless its get t
// is stale: the owner registered again since the plan, whose answer's notices_seq
// numbers the old master's notices, not the new registration's. A stale get fails in
// the caller; the new master knows the replicas the registration reported.
func (o *Owner) learnFresh(t *getTarget, h *holding, mark, own uint64) {
	st := o.lock()
	defer o.unlock()
	if !st.getStale(t) {
		st.learnReplica(h, mark, own)
	}
}

// excludeSource handles a transfer from another owner that failed: the source was
// unreachable or refused the fence, so the next plan excludes it; after
// maxPullFailures such sources the get is UNAVAILABLE. Any other failure (the master
// refused GetDone) is returned as is.
func (o *Owner) excludeSource(key string, plan *mp.GetStartResponse, exclude []string, err error) ([]string, error) {
	if !sourceFailure(err) {
		return exclude, err
	}
	exclude = append(exclude, plan.SourceNodeId)
	o.log.Warn().Err(err).Str("key", key).Strs("excluded", exclude).Msg("transfer failed; re-planning without that node")
	if len(exclude) >= maxPullFailures {
		return exclude, errCode(common.ErrorCode_UNAVAILABLE, "%d transfers from other owners failed, the last: %v", len(exclude), err)
	}
	return exclude, nil
}

// sourceFailure reports whether a transfer from another owner failed for that owner's
// part: unreachable, fenced (another incarnation), or out of its deadline (a transfer
// that ran out of its budget, a refill's stageDeadline, fails with the context's error:
// the source is too slow, as unreachable as one that stalled past the data plane's
// progress timeout).
func sourceFailure(err error) bool {
	return errors.Is(err, transfer.ErrFenced) || errors.Is(err, transfer.ErrUnreachable) || errors.Is(err, context.DeadlineExceeded)
}

// startedGet is one key's answer to GetStart (or its item of BatchGetStart), accepted:
// plan and target, and the replica index's mark from before the call; or err.
type startedGet struct {
	plan  *mp.GetStartResponse
	t     *getTarget
	mark  uint64
	epoch uint64    // the registration's when the call was sent
	at    time.Time // when the call was sent
	err   error
}

// getStart asks the master for a plan, carrying queued holder acks; exclude names the
// nodes a pull from just failed. The plan is accepted (getpins.go) under the
// registration epoch the call was sent at: one answered across a registration is
// dropped and the get is UNAVAILABLE (its target was not among the pins reported to
// the new master, which may hand it to someone else).
func (o *Owner) getStart(key string, exclude []string) startedGet {
	var plan *mp.GetStartResponse
	ids := o.newHolderIDs(1)
	sent := false // (a call never sent, a registration in progress past its wait, recorded no holder)
	s := o.askMaster(func(ctx context.Context, acks []int64) (err error) {
		sent = true
		plan, err = o.master.cl().GetStart(ctx, &mp.GetStartRequest{Node: o.master.ref(), Key: key, Acks: acks, ExcludeNodes: exclude,
			HolderId: ids[0]})
		return err
	}, func() (common.ErrorCode, string) { return plan.Code, plan.Message })
	if s.err != nil {
		if plan == nil && sent {
			o.ackUnanswered(ids)
		}
		return s
	}
	return o.acceptPlans([]string{key}, []*mp.GetStartResponse{plan}, s)[0]
}

// startGets plans keys: GetStart for one key, else one BatchGetStart per masterParts
// of keys. Each answer is accepted as getStart's; a failed call fails its keys. held is
// the bytes of the segment the client's batch holds already (BatchGetStartRequest.held_bytes;
// a lone key with some goes in a BatchGetStart too); a later call of the batch adds
// what the earlier ones planned (their local hits and targets).
func (o *Owner) startGets(keys []string, held int64) []startedGet {
	if len(keys) == 1 && held == 0 {
		return []startedGet{o.getStart(keys[0], nil)}
	}
	out := make([]startedGet, 0, len(keys))
	var counted map[int64]bool // target offsets in held (a batch of more than one call)
	for part := range masterParts(keys, func(k string) int { return len(k) }) {
		var resp *mp.BatchGetStartResponse
		ids := o.newHolderIDs(len(part))
		sent := false
		s := o.askMaster(func(ctx context.Context, acks []int64) (err error) {
			sent = true
			resp, err = o.master.cl().BatchGetStart(ctx, &mp.BatchGetStartRequest{Node: o.master.ref(), Keys: part, Acks: acks, HolderIds: ids,
				HeldBytes: held})
			return err
		}, func() (common.ErrorCode, string) { return resp.Code, resp.Message })
		if s.err == nil && len(resp.Results) != len(part) {
			s.err = errCode(common.ErrorCode_INTERNAL, "the master answered %d of %d keys of a BatchGetStart", len(resp.Results), len(part))
		}
		if s.err != nil {
			if resp == nil && sent {
				o.ackUnanswered(ids)
			}
			for range part {
				out = append(out, s)
			}
			continue
		}
		started := o.acceptPlans(part, resp.Results, s)
		if len(out)+len(started) == len(keys) {
			out = append(out, started...) // the last call: nothing left to count for
			break
		}
		if counted == nil {
			counted = make(map[int64]bool)
		}
		for _, g := range started {
			if g.err == nil && !counted[g.plan.TargetOffset] {
				counted[g.plan.TargetOffset] = true
				held += ssd.AlignedLen(g.plan.Len)
			}
		}
		out = append(out, started...)
	}
	return out
}

// newHolderIDs returns n holder ids for the local hits of a planning call
// (GetStartRequest.holder_id): negative, never used twice by this owner incarnation.
func (o *Owner) newHolderIDs(n int) []int64 {
	last := o.holderIDs.Add(-int64(n))
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = last + int64(n-1-i)
	}
	return ids
}

// ackUnanswered releases the holders a planning call that got no answer may have made:
// the master may have recorded a local hit's holder (or a local SSD refill's) under its
// id before the reply was lost. A call the owner gave up on (timed out) may as well
// reach the master's state only after that ack (it waited for the lock, or for room):
// the ids are acked again once the master's in-flight TTL has passed. An ack of a holder
// that does not exist does no harm (the master counts it unknown). A call answered,
// whatever its code, made only the holders it names.
func (o *Owner) ackUnanswered(ids []int64) {
	for _, id := range ids {
		o.acks.add(id)
	}
	time.AfterFunc(o.bounds().reack, func() {
		for _, id := range ids {
			o.acks.add(id)
		}
	})
}

// acksRefused reports whether a planning call answered code applied none of the holder
// acks it carried, which go back to the queue: NOT_LEADER (a shut gate, handler.applyAcks)
// or STALE_GENERATION (a master that does not know this registration yet). The call takes
// the acks after waiting for a registration in progress, and may wait longer for a flush
// in flight: acks released after the next registration began, which reported them as
// pins, can ride it to a master that does not know that registration yet; dropped, those
// pins stayed held. Sent again, an ack the master does not know does no harm.
func acksRefused(code common.ErrorCode) bool {
	return code == common.ErrorCode_NOT_LEADER || code == common.ErrorCode_STALE_GENERATION
}

// askMaster makes one planning call (call, carrying the queued holder acks, which go
// back to the queue when the call fails in transport or refused them: acksRefused) once
// no registration is in progress, and returns the call's mark and registration epoch or
// its error; code reads the answer's code.
func (o *Owner) askMaster(call func(ctx context.Context, acks []int64) error, code func() (common.ErrorCode, string)) startedGet {
	wait, cancel := o.master.waitCtx()
	defer cancel()
	if err := o.master.settled(wait); err != nil {
		return startedGet{err: err}
	}
	st := o.lock()
	s := startedGet{mark: st.replicas.mark(), epoch: st.reg.epoch, at: time.Now()}
	o.unlock()
	acks := o.acks.takeForCall(wait)
	ctx := o.master.callCtx(wait)
	err := call(ctx, acks)
	if err != nil {
		o.acks.giveBack(acks)
		return startedGet{err: o.master.check(0, "", err)}
	}
	c, msg := code()
	if acksRefused(c) {
		o.acks.giveBack(acks)
	}
	if err := o.master.check(c, msg, nil); err != nil {
		return startedGet{err: err}
	}
	return s
}

// acceptPlans accepts the master's answers to keys (a call described by s) under one
// hold of Owner.mu; a refused plan is dropped.
func (o *Owner) acceptPlans(keys []string, plans []*mp.GetStartResponse, s startedGet) []startedGet {
	out := make([]startedGet, len(keys))
	for i, plan := range plans {
		out[i] = startedGet{plan: plan, mark: s.mark, at: s.at}
		if plan == nil {
			out[i].err = errCode(common.ErrorCode_INTERNAL, "the master sent no plan for key %q", keys[i])
		} else {
			out[i].err = o.master.check(plan.Code, plan.Message, nil)
		}
	}
	st := o.lock()
	for i := range out {
		if out[i].err == nil {
			out[i].t, out[i].err = st.acceptPlan(plans[i], s.epoch)
		}
	}
	o.unlock()
	for i, r := range out {
		if r.t == nil && r.err != nil && plans[i] != nil && plans[i].Code == common.ErrorCode_OK {
			o.dropPlan(keys[i], plans[i])
		}
	}
	return out
}

// revokePlan tells the master a planned get will not complete, and why (dropSSD: its
// SSD source failed and must be forgotten; a cause that is the source's failure,
// sourceFailure, makes the master prefer other replicas for a while). A failure is logged: the master's in-flight
// TTL reclaims the get, but not the holder it recorded at GetStart for a refill from
// this owner's SSD (the owner may have handed that one out before its GetDone), which
// the owner then releases itself (an ack of a holder the master dropped does no harm).
func (o *Owner) revokePlan(key string, plan *mp.GetStartResponse, dropSSD bool, cause error) {
	if o.getPinned(plan.GetId) {
		// The master that planned it is gone; the new one holds the target as a pin,
		// acked when the get ends (ownerState.endGet).
		return
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	r, err := o.master.cl().GetRevoke(ctx, &mp.GetRevokeRequest{Node: o.master.ref(), Key: key, GetId: plan.GetId, DropSsdSource: dropSSD,
		Reason: cause.Error(), SourceFailed: plan.SourceNodeId != o.opts.NodeID && sourceFailure(cause)})
	if err := o.master.check(respCode(r, err)); err != nil {
		o.log.Warn().Err(err).Str("key", key).Msg("get revoke failed; the master's TTL will reclaim it")
		if plan.HolderId != 0 {
			o.acks.add(plan.HolderId)
		}
	}
}
