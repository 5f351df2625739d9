package daemon

import (
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
	acks := o.acks.take()
	resp, err := o.master.c.PutStart(ctx, &mp.PutStartRequest{Node: o.master.ref, Key: key, Len: length,
		RejectIfExists: opts != nil && opts.RejectIfExists, Acks: acks})
	if err != nil {
		o.acks.giveBack(acks)
	}
	if err := o.master.check(respCode(resp, err)); err != nil {
		return 0, 0, err
	}
	p := &pendingPut{key: key, putID: resp.PutId, offset: resp.SourceOffset, len: length}
	if resp.TargetNodeId != o.opts.NodeID {
		o.abandonPut(p)
		return 0, 0, errCode(common.ErrorCode_UNAVAILABLE, "master placed the put on node %q: owner-to-owner transfer is not available in this build", resp.TargetNodeId)
	}
	o.mu.Lock()
	if c.closed {
		o.mu.Unlock()
		o.abandonPut(p)
		return 0, 0, errCode(common.ErrorCode_UNAVAILABLE, "session closed")
	}
	c.puts[p.putID] = p
	o.mu.Unlock()
	return p.putID, p.offset, nil
}

// putEnd publishes the put; the owner's cached info of the key is dropped only after
// the master published the new version, so no get can cache the old one afterwards.
func (o *Owner) putEnd(c *session, key string, putID int64) error {
	o.mu.Lock()
	p := c.puts[putID]
	if p == nil || p.key != key {
		o.mu.Unlock()
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (never started, ended or aborted)", putID)
	}
	delete(c.puts, putID)
	o.mu.Unlock()
	if p.pinned {
		o.acks.add(p.putID)
		return errCode(common.ErrorCode_UNAVAILABLE, "the master restarted during this put; the value was not stored")
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.c.PutDone(ctx, &mp.PutDoneRequest{Node: o.master.ref, Key: key, PutId: putID})
	if err != nil {
		o.abandonPut(p) // best effort: the master may not have seen PutDone
	}
	if err := o.master.check(respCode(resp, err)); err != nil {
		return err
	}
	o.mu.Lock()
	o.dropCachedLocked(key, 0)
	o.mu.Unlock()
	return nil
}

func (o *Owner) putAbort(c *session, key string, putID int64) error {
	o.mu.Lock()
	p := c.puts[putID]
	if p == nil || p.key != key {
		o.mu.Unlock()
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key", putID)
	}
	delete(c.puts, putID)
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
	resp, err := o.master.c.PutRevoke(ctx, &mp.PutRevokeRequest{Node: o.master.ref, Key: p.key, PutId: p.putID})
	if err := o.master.check(respCode(resp, err)); err != nil {
		o.log.Warn().Err(err).Str("key", p.key).Int64("put_id", p.putID).Msg("put revoke failed; the master's TTL will reclaim it")
	}
}

// get hands the session a holder: from the cached info when a holder of the key's
// current version lives here or was released within the cache grace (no master trip),
// else through master GetStart (and an SSD refill when that is the source).
func (o *Owner) get(c *session, key string) (*external.GetResponse, error) {
	if err := wire.ValidateKey(key); err != nil {
		return nil, err
	}
	o.mu.Lock()
	if h := o.cache[key]; h != nil {
		id := o.newHolderLocked(c, h)
		o.mu.Unlock()
		return holderResponse(id, h), nil
	}
	seq := o.invalSeq
	o.mu.Unlock()

	h, err := o.planGet(key)
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if c.closed {
		o.acks.add(h.masterID)
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "session closed")
	}
	switch cur := o.cache[key]; {
	case cur != nil && cur.putID == h.putID:
		o.acks.add(h.masterID) // a concurrent get cached the same version: share it
		h = cur
	case o.invalSeq == seq && (cur == nil || cur.putID < h.putID):
		o.cache[key] = h
	}
	id := o.newHolderLocked(c, h)
	return holderResponse(id, h), nil
}

func holderResponse(id int64, h *holding) *external.GetResponse {
	return &external.GetResponse{HolderId: id, Offset: h.offset, Len: h.len, Source: h.source, PutId: h.putID}
}

func (o *Owner) delete(key string) (bool, error) {
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.c.Delete(ctx, &mp.DeleteRequest{Node: o.master.ref, Key: key})
	if err := o.master.check(respCode(resp, err)); err != nil {
		return false, err
	}
	o.mu.Lock()
	o.dropCachedLocked(key, 0)
	o.mu.Unlock()
	return resp.Deleted, nil
}

func (o *Owner) exists(key string) (bool, error) {
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.c.Exists(ctx, &mp.ExistsRequest{Node: o.master.ref, Key: key})
	if err := o.master.check(respCode(resp, err)); err != nil {
		return false, err
	}
	return resp.Exists, nil
}

// coded is any response with a (code, message) pair.
type coded interface {
	GetCode() common.ErrorCode
	GetMessage() string
}

// respCode unpacks a master response for masterLink.check; a nil response (transport
// error) yields zero values.
func respCode[R coded](r R, err error) (common.ErrorCode, string, error) {
	if err != nil {
		return 0, "", err
	}
	return r.GetCode(), r.GetMessage(), nil
}
