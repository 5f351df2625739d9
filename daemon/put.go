package daemon

import (
	"context"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// putStart asks the master for a target and records the in-flight put in the session.
func (o *Owner) putStart(c *session, key string, length int64, opts *external.PutOptions) (putID, offset int64, err error) {
	if err := wire.ValidateKey(key); err != nil {
		return 0, 0, err
	}
	if err := wire.ValidateLen(length, o.seg.Size()); err != nil {
		return 0, 0, err
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	if err := o.master.settled(ctx); err != nil {
		return 0, 0, err
	}
	epoch := o.regEpoch()
	acks := o.acks.take()
	resp, err := o.master.cl().PutStart(ctx, &mp.PutStartRequest{Node: o.master.ref, Key: key, Len: length,
		RejectIfExists: opts != nil && opts.RejectIfExists, Acks: acks})
	if err != nil {
		o.acks.giveBack(acks)
	}
	if err := o.master.check(respCode(resp, err)); err != nil {
		return 0, 0, err
	}
	// The client writes at the source offset: the target itself, or, for a put the
	// master placed on another owner, a range of this owner's transfer area that the
	// target pulls from at PutDone.
	p := &pendingPut{key: key, putID: resp.PutId, offset: resp.SourceOffset, len: length, local: resp.TargetNodeId == o.opts.NodeID}
	if resp.SourceOffset < 0 || resp.SourceOffset > o.seg.Size()-length {
		o.abandonPut(p)
		return 0, 0, errCode(common.ErrorCode_INTERNAL, "master placed put %d at [%d,+%d), outside the %d-byte segment", resp.PutId, resp.SourceOffset, length, o.seg.Size())
	}
	st := o.lock()
	err = st.acceptPut(c, p, epoch)
	o.unlock()
	if err != nil {
		o.abandonPut(p) // revoked, in case a new master answered it
		return 0, 0, err
	}
	return p.putID, p.offset, nil
}

// acceptPut records the put the master placed for session c, whose PutStart was sent
// at registration epoch: it joins the session and segmentWrites, and a put placed on
// this owner opens its range in the replica index before the client writes a byte of
// it. A put answered across a registration is refused: its range was not among the
// pins the registration reported, so the new master may hand it to someone else. The
// caller abandons a refused put.
func (st *ownerState) acceptPut(c *session, p *pendingPut, epoch uint64) error {
	if c.closed {
		return errSessionClosed()
	}
	if st.reg.epoch != epoch {
		return errCode(common.ErrorCode_UNAVAILABLE, "the master changed during PutStart; retry the put")
	}
	if p.local {
		st.replicas.open(p.offset, p.len)
	}
	c.puts[p.putID] = p
	p.write = st.writes.add(writePut, p.putID, p.offset, p.len)
	return nil
}

// endPut records the outcome of p's PutEnd: it leaves the session (remembered among
// its last ended puts) and segmentWrites, and a repeated PutEnd waiting for it wakes.
// A pin of it is acked.
func (st *ownerState) endPut(c *session, p *pendingPut, outcome error) {
	st.ackPin(p) // pinned while its PutDone was out
	if c.puts[p.putID] == p {
		delete(c.puts, p.putID)
		st.writes.remove(p.write)
	}
	c.ended.add(p.putID, p.key, outcome)
	p.outcome = outcome
	close(p.ending)
}

// putPublished: the master published p (mark was the replica index's before PutDone).
// Older versions of the key are dead here; a put placed on this owner is the key's
// replica.
func (st *ownerState) putPublished(p *pendingPut, mark uint64) {
	st.invalidate(p.key, p.putID-1)
	if p.local {
		st.replicas.learn(replicaRecord{key: p.key, putID: p.putID, offset: p.offset, len: p.len}, mark, 0)
	}
}

// putEnd publishes the put; the key leaves the owner's hot set only after
// the master published the new version, so no get can install the old one afterwards.
// A PutEnd repeated on the same session (its reply was lost) answers the outcome of
// the first: it waits for one still in progress, or finds it among the session's last
// putEndMemory ended puts.
//
// Under client isolation the copies (validated first: a bad one leaves the put pending)
// are copied from the session's put area into the put's range after any PutWrite still
// copying has finished; a repeated PutEnd copies nothing again.
func (o *Owner) putEnd(c *session, key string, putID int64, copies []*external.AreaCopy) error {
	if err := checkCopyCount(len(copies)); err != nil {
		return err
	}
	st := o.lock()
	p := c.puts[putID]
	switch {
	case p != nil && p.key == key && p.ending != nil:
		o.unlock()
		<-p.ending
		return p.outcome
	case p == nil || p.key != key:
		outcome, ok := c.ended.lookup(putID, key)
		o.unlock()
		if ok {
			return outcome
		}
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (never started, aborted, or ended longer ago than the last %d puts)", putID, putEndMemory)
	}
	if err := st.checkPutCopies(c, p, copies); err != nil {
		o.unlock()
		return err
	}
	p.ending = make(chan struct{}) // no PutWrite starts from now on
	if len(copies) > 0 {
		c.copying++ // keeps the area mapped while PutWrites finish and ours runs
		o.waitCopiesLocked(p)
		area := c.area
		o.unlock()
		o.copyIn(area, p, copies)
		o.lock()
		c.copying--
		o.copied.Broadcast()
	}
	o.waitCopiesLocked(p)
	o.unlock()

	err := o.publish(p)

	st = o.lock()
	st.endPut(c, p, err)
	o.unlock()
	return err
}

// publish runs PutDone for p. On success the key's older versions are dead here: the
// hot-set holding and SSD entries of versions before putID go.
func (o *Owner) publish(p *pendingPut) error {
	if o.ackPin(p) {
		return errCode(common.ErrorCode_UNAVAILABLE, "the master restarted during this put; the value was not stored")
	}
	// A put placed on another owner is pulled by it during PutDone: allow for the
	// transfer (its owner gives up after TransferTimeout) on top of the usual bound.
	wait := o.opts.MasterTimeout + o.opts.TransferTimeout
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	mark := o.replicaMark()
	resp, err := o.master.cl().PutDone(ctx, &mp.PutDoneRequest{Node: o.master.ref, Key: p.key, PutId: p.putID}, callopt.WithRPCTimeout(wait))
	if err != nil {
		o.abandonPut(p) // best effort: the master may not have seen PutDone
		// It may have published: the older version this owner records may be dead.
		st := o.lock()
		st.replicas.drop(p.key, p.putID-1)
		o.unlock()
	}
	if err := o.master.check(respCode(resp, err)); err != nil {
		return err
	}
	st := o.lock()
	st.putPublished(p, mark)
	o.unlock()
	return nil
}

func (o *Owner) putAbort(c *session, key string, putID int64) error {
	st := o.lock()
	p := c.puts[putID]
	if p == nil || p.key != key || p.ending != nil {
		o.unlock()
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (never started, ended or aborted)", putID)
	}
	delete(c.puts, putID)
	st.writes.remove(p.write)
	o.waitCopiesLocked(p) // a PutWrite still copying must not land in a freed range
	o.unlock()
	o.abandonPut(p)
	return nil
}

// abandonPut frees an in-flight put's target at the master (or acks its pin).
func (o *Owner) abandonPut(p *pendingPut) {
	if o.ackPin(p) {
		return
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().PutRevoke(ctx, &mp.PutRevokeRequest{Node: o.master.ref, Key: p.key, PutId: p.putID})
	if err := o.master.check(respCode(resp, err)); err != nil {
		o.log.Warn().Err(err).Str("key", p.key).Int64("put_id", p.putID).Msg("put revoke failed; the master's TTL will reclaim it")
	}
}

// ackPin reports whether a registration pinned p's range; the pin is acked the first
// time (the new master holds the range until then).
func (st *ownerState) ackPin(p *pendingPut) bool {
	if !p.pinned() {
		return false
	}
	if !p.pinAcked {
		p.pinAcked = true
		st.ack(p.putID)
	}
	return true
}

// ackPin is ownerState.ackPin taking Owner.mu.
func (o *Owner) ackPin(p *pendingPut) bool {
	st := o.lock()
	defer o.unlock()
	return st.ackPin(p)
}
