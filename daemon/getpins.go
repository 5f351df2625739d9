package daemon

import (
	"errors"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// A get that brings a value into this segment (a pull from another owner, a refill
// from SSD) writes into a target range the master allocated at GetStart. The target is
// in segmentWrites (kind writeGet, id = get id) from the plan's acceptance until the
// get is handed to its session or failed, so a registration meanwhile reports it as a
// pin. A get whose target was pinned fails UNAVAILABLE once nothing writes the target
// any more (its GetDone, GetRevoke or holder went to a master that is gone, and the new
// master never published those bytes), and the pin is acked so the new master frees
// the range.
//
// Every plan, a local hit included, records the registration epoch it was accepted
// under (getStart refuses a plan answered across a registration): a plan of an earlier
// registration never reaches a client.

// getTarget is one accepted get plan.
type getTarget struct {
	id, offset, len int64
	epoch           uint64        // registration.epoch when GetStart was sent
	write           *segmentWrite // its target in segmentWrites (nil: this owner writes nothing)
	// own is the replica index's note of the target's opening (replicaIndex.open, in
	// the same hold of the lock as write's registration), for learn.
	own   uint64
	ended bool
}

// pinned reports whether a registration reported t's target as a pin.
func (t *getTarget) pinned() bool { return t.write != nil && t.write.pinned }

// errGetMasterChanged fails a get whose plan came from a master this owner has since
// registered away from.
func errGetMasterChanged() error {
	return errCode(common.ErrorCode_UNAVAILABLE, "the master changed during this get; retry")
}

// acceptPlan records the plan GetStart answered for a call sent at registration epoch.
// A plan answered across a registration is refused: its target was not among the pins
// the registration reported.
func (st *ownerState) acceptPlan(plan *mp.GetStartResponse, epoch uint64) (*getTarget, error) {
	if st.reg.epoch != epoch {
		return nil, errGetMasterChanged()
	}
	t := &getTarget{id: plan.GetId, offset: plan.TargetOffset, len: plan.Len, epoch: epoch}
	// Only a target this owner writes is registered; a plan whose target lies outside
	// the segment is refused (and revoked) before anything is written.
	if !plan.Done && plan.GetId != 0 && plan.Len > 0 && plan.TargetOffset >= 0 && plan.TargetOffset <= st.segSize-plan.Len &&
		st.writes.lookup(writeGet, t.id) == nil {
		t.write = st.writes.add(writeGet, t.id, t.offset, t.len)
		// Records of the range go now, with the write's registration: a registration
		// must never report one of them beside the write (a replica evicted at the
		// master, its notice not here yet), or the new master would adopt it onto
		// bytes this get overwrites.
		t.own = st.replicas.open(t.offset, t.len)
	}
	return t, nil
}

// dropPlan disposes of a plan getStart refused (best effort, without Owner.mu): it may
// have come from the new master, which then keeps its target or holder. Acks and
// revokes of ids a master does not know do no harm (ids never repeat across masters).
func (o *Owner) dropPlan(key string, plan *mp.GetStartResponse) {
	if !plan.Done && plan.GetId != 0 {
		o.revokePlan(key, plan, false, errors.New("the master changed during GetStart")) // its holder too
	} else if plan.HolderId != 0 {
		o.acks.add(plan.HolderId)
	}
}

// endGet ends t once nothing writes its target any more (a nil t is a no-op); it
// reports whether the get must fail because the owner registered again since its plan.
// A pinned target's pin is acked: the new master holds it as a holder whose id is the
// get id. Ending twice is harmless.
func (st *ownerState) endGet(t *getTarget) (stale bool) {
	if t == nil {
		return false
	}
	stale = st.getStale(t)
	if t.ended {
		return stale
	}
	t.ended = true
	if st.writes.remove(t.write) && t.write.pinned {
		st.ack(t.id)
	}
	return stale
}

// getStale reports whether t's plan predates the owner's last registration.
func (st *ownerState) getStale(t *getTarget) bool { return t.pinned() || st.reg.epoch != t.epoch }

// refillConfirmed takes the master's answer to the GetDone of a refill already handed
// out (the holder was recorded at GetStart): a promoted target is the key's memory
// replica from then on, so its holding may stay cached after release; not if the owner
// registered again since the plan, as the new master knows the replicas the
// registration reported, not this answer of the old one. It reports whether h is a
// replica now.
func (st *ownerState) refillConfirmed(h *holding, t *getTarget, done *mp.GetDoneResponse, mark, own uint64) bool {
	if st.reg.epoch != t.epoch {
		return false
	}
	h.replica, h.noticesSeq = done.Promoted, done.NoticesSeq
	st.learnReplica(h, mark, own)
	return h.replica
}

// getPinned reports whether the target of the get getID is being written and was
// reported as a pin to a new master: its GetDone or GetRevoke would go to a master
// that never knew it.
func (st *ownerState) getPinned(getID int64) bool {
	sw := st.writes.lookup(writeGet, getID)
	return sw != nil && sw.pinned
}

// endGet is ownerState.endGet taking Owner.mu; a stale get's error is errGetMasterChanged.
func (o *Owner) endGet(t *getTarget) error {
	st := o.lock()
	stale := st.endGet(t)
	o.unlock()
	if stale {
		return errGetMasterChanged()
	}
	return nil
}

// getPinned is ownerState.getPinned taking Owner.mu.
func (o *Owner) getPinned(getID int64) bool {
	st := o.lock()
	defer o.unlock()
	return st.getPinned(getID)
}

// targetWritten runs the test hook, if any, once the get's target has been written.
func (o *Owner) targetWritten(getID int64) {
	o.mu.Lock()
	f := o.mu.afterWrite
	o.mu.Unlock()
	if f != nil {
		f(getID)
	}
}
