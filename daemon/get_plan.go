package daemon

import (
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// maxSSDFailures: the third consecutive SSD failure of one get is an error, not a miss.
const maxSSDFailures = 3

// planGet runs GetStart until it yields a holder: a local memory replica (done at
// once) or a successful local SSD refill. SSD failures (IO errors, corrupt records)
// revoke the get with drop_ssd_source and re-plan; a re-plan that finds no replica is
// a miss, and the third consecutive SSD failure is UNAVAILABLE.
func (o *Owner) planGet(key string) (*holding, error) {
	for failures := 0; ; {
		plan, err := o.getStart(key)
		if err != nil {
			return nil, err
		}
		switch {
		case plan.Done:
			return localHit(key, plan), nil
		case plan.Source == common.Source_SSD && plan.SourceNodeId == o.opts.NodeID:
			h, err := o.refill(key, plan)
			if err == nil {
				return h, nil
			}
			failures++
			o.log.Warn().Err(err).Str("key", key).Int("failures", failures).Msg("SSD refill failed; re-planning")
			if failures >= maxSSDFailures {
				return nil, errCode(common.ErrorCode_UNAVAILABLE, "SSD read failed %d times: %v", failures, err)
			}
		default:
			o.revokeGet(key, plan.GetId, false)
			return nil, errCode(common.ErrorCode_UNAVAILABLE, "the key's replica is on node %q (%s): owner-to-owner transfer is not available in this build", plan.SourceNodeId, plan.Source)
		}
	}
}

// getStart asks the master for a plan, carrying queued holder acks.
func (o *Owner) getStart(key string) (*mp.GetStartResponse, error) {
	ctx, cancel := o.master.ctx()
	defer cancel()
	acks := o.acks.take()
	plan, err := o.master.c.GetStart(ctx, &mp.GetStartRequest{Node: o.master.ref, Key: key, Acks: acks})
	if err != nil {
		o.acks.giveBack(acks)
	}
	if err := o.master.check(respCode(plan, err)); err != nil {
		return nil, err
	}
	return plan, nil
}

// revokeGet tells the master a planned get will not complete (dropSSD: its SSD source
// failed and must be forgotten); a failure is logged, the master's TTL reclaims it.
func (o *Owner) revokeGet(key string, getID int64, dropSSD bool) {
	ctx, cancel := o.master.ctx()
	defer cancel()
	r, err := o.master.c.GetRevoke(ctx, &mp.GetRevokeRequest{Node: o.master.ref, Key: key, GetId: getID, DropSsdSource: dropSSD})
	if err := o.master.check(respCode(r, err)); err != nil {
		o.log.Warn().Err(err).Str("key", key).Msg("get revoke failed; the master's TTL will reclaim it")
	}
}
