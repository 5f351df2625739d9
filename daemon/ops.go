package daemon

import (
	"math"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// delete removes key at the master; this owner then drops the key from its hot set, replica index and SSD
// entries of the removed version (other owners learn it from the master).
func (o *Owner) delete(key string) (bool, error) {
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	// Whatever the outcome (a lost reply may hide a delete that happened), this owner's
	// record of the key goes first: a master restart must not bring it back.
	st := o.lock()
	st.replicas.drop(key, math.MaxInt64)
	o.unlock()
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().Delete(ctx, &mp.DeleteRequest{Node: o.master.ref, Key: key})
	if err := o.master.check(respCode(resp, err)); err != nil {
		return false, err
	}
	upTo := resp.PutId
	if upTo == 0 { // no route, or a master that does not say: nothing of the key is current
		upTo = math.MaxInt64
	}
	st = o.lock()
	st.invalidate(key, upTo)
	o.unlock()
	return resp.Deleted, nil
}

func (o *Owner) exists(key string) (bool, error) {
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().Exists(ctx, &mp.ExistsRequest{Node: o.master.ref, Key: key})
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
