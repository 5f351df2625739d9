package daemon

import (
	"sort"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// A get that brings a value into this segment (a pull from another owner, a refill
// from SSD) writes into a target range the master allocated at GetStart. A master that
// this owner registers with afterwards (a restart, an HA failover) knows only the
// ranges reported as pins in RegisterRequest.Pinned: a target it was not told of may go
// to a new put while the old get still writes into it.
//
// getTargets (Owner.gets, under Owner.mu; its zero value is ready) records every such
// target from the plan's acceptance until the get is handed to its session or failed,
// and register reports each one as a pin whose id is the get id (getPinsLocked). A get
// whose target was pinned fails UNAVAILABLE once nothing writes the target any more
// (its GetDone, GetRevoke or holder went to a master that is gone, and the new master
// never published those bytes), and the pin is acked so the new master frees the range.
//
// Every plan, a local hit included, records the registration epoch it was accepted
// under (getStart refuses a plan answered across a registration): a plan of an earlier
// registration never reaches a client.
type getTargets struct {
	m map[int64]*getTarget // by get id: the targets this owner is writing
	// afterWrite (tests only), when set, runs once a target has been written, before the
	// get completes; read under Owner.mu, called without it.
	afterWrite func(getID int64)
}

// getTarget is one accepted get plan.
type getTarget struct {
	id, offset, len int64
	epoch           uint64 // Owner.regEpoch when GetStart was sent
	tracked         bool   // its target is in getTargets.m (this owner writes it)
	pinned          bool   // reported to a new master as a pin with id == get id
	ended           bool
}

// errGetMasterChanged fails a get whose plan came from a master this owner has since
// registered away from.
func errGetMasterChanged() error {
	return errCode(common.ErrorCode_UNAVAILABLE, "the master changed during this get; retry")
}

// acceptPlanLocked records the plan GetStart answered for a call sent at registration
// epoch. A plan answered across a registration is refused: its target was not among the
// pins the registration reported.
func (o *Owner) acceptPlanLocked(plan *mp.GetStartResponse, epoch uint64) (*getTarget, error) {
	if o.regEpoch != epoch {
		return nil, errGetMasterChanged()
	}
	t := &getTarget{id: plan.GetId, offset: plan.TargetOffset, len: plan.Len, epoch: epoch}
	// Only a target this owner writes needs a pin; a plan whose target lies outside the
	// segment is refused (and revoked) before anything is written.
	if !plan.Done && plan.GetId != 0 && plan.Len > 0 && plan.TargetOffset >= 0 && plan.TargetOffset <= o.seg.Size()-plan.Len {
		if o.gets.m == nil {
			o.gets.m = make(map[int64]*getTarget)
		}
		if o.gets.m[t.id] == nil {
			t.tracked = true
			o.gets.m[t.id] = t
		}
	}
	return t, nil
}

// dropPlan disposes of a plan getStart refused (best effort, without Owner.mu): it may
// have come from the new master, which then keeps its target or holder. Acks and
// revokes of ids a master does not know do no harm (ids never repeat across masters).
func (o *Owner) dropPlan(key string, plan *mp.GetStartResponse) {
	if plan.HolderId != 0 {
		o.acks.add(plan.HolderId)
	}
	if !plan.Done && plan.GetId != 0 {
		o.revokeGet(key, plan.GetId, false, "the master changed during GetStart")
	}
}

// getPinsLocked returns the targets being written as pins (PinId = get id) and marks
// them pinned: register calls it under Owner.mu, with the put and holder pins.
func (o *Owner) getPinsLocked() []*mp.PinnedRange {
	pins := make([]*mp.PinnedRange, 0, len(o.gets.m))
	for _, t := range o.gets.m {
		t.pinned = true
		pins = append(pins, &mp.PinnedRange{PinId: t.id, Offset: t.offset, Len: t.len})
	}
	sort.Slice(pins, func(i, j int) bool { return pins[i].PinId < pins[j].PinId })
	return pins
}

// endGetLocked ends t once nothing writes its target any more (a nil t is a no-op);
// it reports whether the get must fail because the owner registered again since its
// plan. A pinned target's pin is acked: the new master holds it as a holder whose id is
// the get id. Ending twice is harmless.
func (o *Owner) endGetLocked(t *getTarget) (stale bool) {
	if t == nil {
		return false
	}
	stale = t.staleLocked(o)
	if t.ended {
		return stale
	}
	t.ended = true
	if t.tracked {
		delete(o.gets.m, t.id)
		t.tracked = false
		if t.pinned {
			o.acks.add(t.id)
		}
	}
	return stale
}

// endGet is endGetLocked taking Owner.mu; a stale get's error is errGetMasterChanged.
func (o *Owner) endGet(t *getTarget) error {
	o.mu.Lock()
	stale := o.endGetLocked(t)
	o.mu.Unlock()
	if stale {
		return errGetMasterChanged()
	}
	return nil
}

// getPinned reports whether the target of the get getID was reported as a pin to a
// new master: its GetDone or GetRevoke would go to a master that never knew it.
func (o *Owner) getPinned(getID int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.gets.m[getID]
	return t != nil && t.pinned
}

// targetWritten runs the test hook, if any, once the get's target has been written.
func (o *Owner) targetWritten(getID int64) {
	o.mu.Lock()
	f := o.gets.afterWrite
	o.mu.Unlock()
	if f != nil {
		f(getID)
	}
}

// staleLocked reports whether t's plan predates the owner's last registration.
func (t *getTarget) staleLocked(o *Owner) bool { return t.pinned || o.regEpoch != t.epoch }
