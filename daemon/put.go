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
	o.mu.Lock()
	epoch := o.regEpoch
	o.mu.Unlock()
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
	o.mu.Lock()
	if c.closed {
		o.mu.Unlock()
		o.abandonPut(p)
		return 0, 0, errCode(common.ErrorCode_UNAVAILABLE, "session closed")
	}
	if o.regEpoch != epoch {
		// The owner registered again (a new master) while PutStart was out: the range
		// was not among the pins it reported, so the new master may hand it to someone
		// else. Never let the client write into it.
		o.mu.Unlock()
		o.abandonPut(p) // revoked, in case the new master answered it
		return 0, 0, errCode(common.ErrorCode_UNAVAILABLE, "the master changed during PutStart; retry the put")
	}
	if p.local {
		o.replicas.open(p.offset, p.len) // before the client writes a byte of it
	}
	c.puts[p.putID] = p
	o.mu.Unlock()
	return p.putID, p.offset, nil
}

// putEnd publishes the put; the owner's cached info of the key is dropped only after
// the master published the new version, so no get can cache the old one afterwards.
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
	o.mu.Lock()
	p := c.puts[putID]
	switch {
	case p != nil && p.key == key && p.ending != nil:
		o.mu.Unlock()
		<-p.ending
		return p.outcome
	case p == nil || p.key != key:
		outcome, ok := c.ended.lookup(putID, key)
		o.mu.Unlock()
		if ok {
			return outcome
		}
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (never started, aborted, or ended longer ago than the last %d puts)", putID, putEndMemory)
	}
	if err := o.checkPutCopiesLocked(c, p, copies); err != nil {
		o.mu.Unlock()
		return err
	}
	p.ending = make(chan struct{}) // no PutWrite starts from now on
	if len(copies) > 0 {
		c.copying++ // keeps the area mapped while PutWrites finish and ours runs
		o.waitCopiesLocked(p)
		area := c.area
		o.mu.Unlock()
		o.copyIn(area, p, copies)
		o.mu.Lock()
		c.copying--
		o.copied.Broadcast()
	}
	o.waitCopiesLocked(p)
	o.mu.Unlock()

	err := o.publish(p)

	o.mu.Lock()
	delete(c.puts, putID)
	c.ended.add(putID, key, err)
	p.outcome = err
	close(p.ending)
	o.mu.Unlock()
	return err
}

// publish runs PutDone for p. On success the key's older versions are dead here: the
// cached info and SSD entries of versions before putID go.
func (o *Owner) publish(p *pendingPut) error {
	if p.pinned {
		o.acks.add(p.putID)
		return errCode(common.ErrorCode_UNAVAILABLE, "the master restarted during this put; the value was not stored")
	}
	// A put placed on another owner is pulled by it during PutDone: allow for the
	// transfer (its owner gives up after TransferTimeout) on top of the usual bound.
	wait := o.opts.MasterTimeout + o.opts.TransferTimeout
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	o.mu.Lock()
	mark := o.replicas.mark()
	o.mu.Unlock()
	resp, err := o.master.cl().PutDone(ctx, &mp.PutDoneRequest{Node: o.master.ref, Key: p.key, PutId: p.putID}, callopt.WithRPCTimeout(wait))
	if err != nil {
		o.abandonPut(p) // best effort: the master may not have seen PutDone
		// It may have published: the older version this owner records may be dead.
		o.mu.Lock()
		o.replicas.drop(p.key, p.putID-1)
		o.mu.Unlock()
	}
	if err := o.master.check(respCode(resp, err)); err != nil {
		return err
	}
	o.mu.Lock()
	o.invalidateLocked(p.key, p.putID-1)
	if p.local {
		o.replicas.learn(replicaRecord{key: p.key, putID: p.putID, offset: p.offset, len: p.len}, mark, 0)
	}
	o.mu.Unlock()
	return nil
}

func (o *Owner) putAbort(c *session, key string, putID int64) error {
	o.mu.Lock()
	p := c.puts[putID]
	if p == nil || p.key != key || p.ending != nil {
		o.mu.Unlock()
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (never started, ended or aborted)", putID)
	}
	delete(c.puts, putID)
	o.waitCopiesLocked(p) // a PutWrite still copying must not land in a freed range
	o.mu.Unlock()
	o.abandonPut(p)
	return nil
}

// abandonPut frees an in-flight put's target at the master (or acks its pin).
func (o *Owner) abandonPut(p *pendingPut) {
	if p.pinned {
		o.acks.add(p.putID)
		return
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().PutRevoke(ctx, &mp.PutRevokeRequest{Node: o.master.ref, Key: p.key, PutId: p.putID})
	if err := o.master.check(respCode(resp, err)); err != nil {
		o.log.Warn().Err(err).Str("key", p.key).Int64("put_id", p.putID).Msg("put revoke failed; the master's TTL will reclaim it")
	}
}
