package daemon

import (
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// The owner's get path, one file per step:
//   get.go       the entry: the hot set first (no master trip), else plan, then install
//   get_plan.go  GetStart and the re-plan loop; revokes
//   get_local.go  a memory replica in this segment: the master reused it, nothing moves
//   get_remote.go a memory replica on another owner: pull it over the data plane
//   get_ssd.go   an SSD replica on this owner: refill into the target, confirm
// The hot set (hotset.go) and the rest of the owner's bookkeeping (ownerstate.go) are
// plain types under Owner.mu.

// get hands the session a holder: from the hot set when a holder of the key's current
// version lives here or was released within the grace period (no master trip), else
// through master GetStart (and a pull or SSD refill when that is the source).
func (o *Owner) get(c *session, key string) (*external.GetResponse, error) {
	if err := wire.ValidateKey(key); err != nil {
		return nil, err
	}
	st := o.lock()
	resp, seq, err := st.cachedGet(c, key, time.Now())
	o.unlock()
	if err != nil || resp != nil {
		if resp != nil && o.cachedGets != nil {
			o.cachedGets.Inc()
		}
		return resp, err
	}

	h, t, err := o.planGet(key)
	if wire.CodeOf(err) == common.ErrorCode_KEY_NOT_FOUND {
		st := o.lock()
		st.getNotFound(key)
		o.unlock()
	}
	if err != nil {
		return nil, err
	}
	st = o.lock()
	defer o.unlock()
	return st.finishGet(c, t, h, seq)
}
