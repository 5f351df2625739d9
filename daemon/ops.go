package daemon

import (
	"math"
	"slices"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// deleteMany removes keys at the master (Delete for one key, else one BatchDelete per
// masterParts of keys); results[i] answers keys[i]. This owner then drops each key from
// its hot set, replica index and SSD entries of the removed version (other owners learn
// it from the master).
func (o *Owner) deleteMany(keys []string) []*external.DeleteResponse {
	out := make([]*external.DeleteResponse, len(keys))
	var valid []int
	// Whatever the outcome (a lost reply may hide a delete that happened), this owner's
	// record of each key goes first: a master restart must not bring it back.
	st := o.lock()
	for i, k := range keys {
		out[i] = &external.DeleteResponse{}
		if err := wire.ValidateKey(k); err != nil {
			out[i].Code, out[i].Message = wire.ToResponse(err)
			continue
		}
		st.replicas.drop(k, math.MaxInt64)
		st.beginWrite(k) // no cached answer of the key until it is dropped below
		valid = append(valid, i)
	}
	o.unlock()
	for part := range masterParts(valid, func(i int) int { return len(keys[i]) }) {
		names := make([]string, len(part))
		for j, i := range part {
			names[j] = keys[i]
		}
		results, callErr := o.askDelete(names)
		errs := make([]error, len(part))
		for j := range part {
			if errs[j] = callErr; errs[j] == nil {
				errs[j] = o.master.check(results[j].Code, results[j].Message, nil)
			}
		}
		st := o.lock()
		for j, i := range part {
			if errs[j] == nil {
				out[i].Deleted = results[j].Deleted
				upTo := results[j].PutId
				if upTo == 0 { // no route, or a master that does not say: nothing of the key is current
					upTo = math.MaxInt64
				}
				st.invalidate(keys[i], upTo)
			} else if callErr != nil || outcomeUnknown(results[j].Code) {
				// The call failed, or its answer leaves the outcome unknown: the delete
				// may have happened and only its reply been lost, and the master
				// invalidates every owner but the requester. What this owner keeps of the
				// key goes (its hot set would go on serving it without the master; its
				// SSD entries, unknown to the master, would come back in a report to a
				// restarted one); a master that did not delete it finds this owner's SSD
				// entry gone at the next read and drops it.
				st.invalidate(keys[i], math.MaxInt64)
			}
			st.endWrite(keys[i])
			out[i].Code, out[i].Message = wire.ToResponse(errs[j])
		}
		o.unlock()
	}
	return out
}

// outcomeUnknown reports whether a write (PutDone, Delete) the master answered with
// code may have been applied all the same: NOT_LEADER (an HA leader that applied it
// may have lost its fence before the answer, its synchronous invalidations
// unconfirmed) and UNAVAILABLE (among others, a write applied whose caller gave up
// within the master's write quiet period, or whose invalidations could not be sent).
// The master invalidates every owner but the requester, so the requester drops what it
// keeps of the key's older versions itself: at worst a miss for a write that did not
// happen.
func outcomeUnknown(code common.ErrorCode) bool {
	return code == common.ErrorCode_NOT_LEADER || code == common.ErrorCode_UNAVAILABLE
}

// askDelete is one Delete (one key) or BatchDelete call; results[i] answers keys[i].
func (o *Owner) askDelete(keys []string) ([]*mp.DeleteResponse, error) {
	ctx, cancel := o.master.ctx()
	defer cancel()
	if len(keys) == 1 {
		resp, err := o.master.cl().Delete(ctx, &mp.DeleteRequest{Node: o.master.ref(), Key: keys[0]})
		if err != nil {
			return nil, o.master.check(0, "", err)
		}
		return []*mp.DeleteResponse{resp}, nil
	}
	resp, err := o.master.cl().BatchDelete(ctx, &mp.BatchDeleteRequest{Node: o.master.ref(), Keys: keys})
	if err := o.master.check(respCode(resp, err)); err != nil {
		return nil, err
	}
	if len(resp.Results) != len(keys) || slices.Contains(resp.Results, nil) {
		return nil, errCode(common.ErrorCode_INTERNAL, "the master answered %d of %d keys of a BatchDelete", len(resp.Results), len(keys))
	}
	return resp.Results, nil
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
