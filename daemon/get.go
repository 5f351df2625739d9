package daemon

import (
	"math"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// The owner's get path, one file per step:
//   get.go       the entry: cached info first (no master trip), else plan, then cache
//   get_plan.go  GetStart and the re-plan loop; revokes
//   get_local.go  a memory replica in this segment: the master reused it, nothing moves
//   get_remote.go a memory replica on another owner: pull it over the data plane
//   get_ssd.go   an SSD replica on this owner: refill into the target, confirm
// The holder cache itself (holdercache.go) is a plain type under Owner.mu.

// get hands the session a holder: from the cached info when a holder of the key's
// current version lives here or was released within the cache grace (no master trip),
// else through master GetStart (and an SSD refill when that is the source).
func (o *Owner) get(c *session, key string) (*external.GetResponse, error) {
	if err := wire.ValidateKey(key); err != nil {
		return nil, err
	}
	o.mu.Lock()
	if c.closed { // the session ended while this call waited: nobody would release a holder
		o.mu.Unlock()
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "session closed")
	}
	// Cached holdings answer only under the lease (masterlink.go): an owner cut off
	// from the master may hold a version another owner's delete has since killed.
	if h := o.cache.lookup(key); h != nil && o.master.leased() {
		id := o.newHolderLocked(c, h)
		if h.replica {
			o.acks.touch(key)
		}
		o.mu.Unlock()
		if o.cachedGets != nil {
			o.cachedGets.Inc()
		}
		resp := holderResponse(id, h)
		resp.Remote = false // this get moved nothing: the bytes are already here
		return resp, nil
	}
	seq := o.cache.invalSeq()
	o.mu.Unlock()

	h, t, err := o.planGet(key)
	if wire.CodeOf(err) == common.ErrorCode_KEY_NOT_FOUND {
		// The master has no version of the key: a get planned before this miss must not
		// cache one afterwards (its install sees the sequence moved).
		o.mu.Lock()
		o.ackLocked(o.cache.invalidate(key, math.MaxInt64))
		o.mu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	// The plan's target leaves the get pins here (getpins.go): from now on it is the
	// session's holder, which register pins like any other. A plan of an earlier
	// registration (the master changed since GetStart) never reaches the client.
	if o.endGetLocked(t) {
		o.ackLocked(h.masterID)
		return nil, errGetMasterChanged()
	}
	if c.closed {
		o.ackLocked(h.masterID)
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "session closed")
	}
	h, acks := o.cache.install(h, seq)
	o.ackLocked(acks...)
	id := o.newHolderLocked(c, h)
	return holderResponse(id, h), nil
}

func holderResponse(id int64, h *holding) *external.GetResponse {
	return &external.GetResponse{HolderId: id, Offset: h.offset, Len: h.len, Source: h.source, PutId: h.putID, Remote: h.remote}
}
