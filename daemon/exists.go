package daemon

import (
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Exists and prefix lookups. A key whose current version this owner holds as a replica
// — in its hot set or its replica index, under the lease — is answered here without
// the master (the master reaches both through invalidations before it answers an
// overwrite or delete; a hot-set holding that is not a replica is invalidated in the
// background, so it does not count; an eviction reaches the replica index with the
// next heartbeat, so a key evicted within the last heartbeat period may still answer
// true here, and a get of it then misses, as one racing any eviction would). The rest
// of a batch goes to the master in one BatchExists per masterParts of keys.

// knows reports whether this owner holds key's current version at now. While a
// registration and its replica report are out (settling) the replica index does not
// count: the new master may still refuse any of its records.
func (st *ownerState) knows(key string, now time.Time, settling bool) bool {
	if !st.leased(now) || st.writing[key] > 0 {
		return false // a write of key through this owner is out at the master: ownerState.writing
	}
	if h := st.hot.lookup(key); h != nil && h.replica {
		return true
	}
	return !settling && st.replicas.byKey[key] != nil
}

// exists reports whether key has a readable replica.
func (o *Owner) exists(key string) (bool, error) {
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	settling := o.master.unsettled()
	st := o.lock()
	known := st.knows(key, time.Now(), settling)
	o.unlock()
	if known {
		return true, nil
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().Exists(ctx, &mp.ExistsRequest{Node: o.master.ref(), Key: key})
	if err := o.master.check(respCode(resp, err)); err != nil {
		return false, err
	}
	return resp.Exists, nil
}

// existsMany answers BatchExists: results[i] answers keys[i]; found counts the keys
// present. With prefix the keys are evaluated in order and results stop after the
// first absent or failed one; found is then the count of leading keys present, and pin
// > 0 pins them (pins.go, pinFound) — a page that cannot be pinned ends the count there.
func (o *Owner) existsMany(c *session, keys []string, prefix bool, pin time.Duration) (results []*external.ExistsResponse, found int32) {
	results = make([]*external.ExistsResponse, len(keys))
	var ask []int // indexes of valid keys this owner does not know
	settling := o.master.unsettled()
	st, now := o.lock(), time.Now()
	for i, k := range keys {
		r := &external.ExistsResponse{}
		results[i] = r
		if err := wire.ValidateKey(k); err != nil {
			r.Code, r.Message = wire.ToResponse(err)
			if prefix {
				results = results[:i+1]
				break
			}
			continue
		}
		switch {
		case len(ask) == 0 || !prefix:
			if r.Exists = st.knows(k, now, settling); !r.Exists {
				ask = append(ask, i)
			}
		default:
			ask = append(ask, i) // past the first key the master must see: it stops the count
		}
	}
	o.unlock()
	o.askExists(keys, ask, prefix, results)
	if prefix {
		for n, r := range results {
			if r.Code != common.ErrorCode_OK || !r.Exists {
				results = results[:n+1]
				break
			}
			found++
		}
		if pin > 0 && found > 0 {
			found = o.pinFound(c, keys[:found], pin, results)
			results = results[:min(int(found)+1, len(results))]
		}
		return results, found
	}
	for _, r := range results {
		if r.Exists {
			found++
		}
	}
	return results, found
}

// askExists fills results[i] for i in ask from the master, one BatchExists per
// masterParts of keys; with prefix it stops at the first chunk not wholly present.
func (o *Owner) askExists(keys []string, ask []int, prefix bool, results []*external.ExistsResponse) {
	for part := range masterParts(ask, func(i int) int { return len(keys[i]) }) {
		names := make([]string, len(part))
		for j, i := range part {
			names[j] = keys[i]
		}
		ctx, cancel := o.master.ctx()
		resp, err := o.master.cl().BatchExists(ctx, &mp.BatchExistsRequest{Node: o.master.ref(), Keys: names, Prefix: prefix})
		cancel()
		err = o.master.check(respCode(resp, err))
		all := true
		for j, i := range part {
			r := results[i]
			switch {
			case err != nil:
				r.Code, r.Message = wire.ToResponse(err)
			case j < len(resp.Results) && resp.Results[j] != nil:
				r.Exists, r.Code, r.Message = resp.Results[j].Exists, resp.Results[j].Code, resp.Results[j].Message
			default: // past where a prefix lookup stopped
				r.Exists = false
			}
			all = all && r.Exists && r.Code == common.ErrorCode_OK
		}
		if prefix && !all {
			return
		}
	}
}

// pinFound pins the found pages for pin: every page this owner holds in memory (its hot
// set or replica index knows it), and of the others (another owner's, or on SSD) as many
// as half the landing area takes (--landing-reserve), brought in now so the load that follows reads
// them here. The others are counted unpinned, and the get that loads them pulls them:
// bringing a page in for its pin takes room where the landing area has none (on a full
// owner, the room of a sole copy evicted for a load that may never come), which cost
// the trace replay on 3 owners more hits than the pins saved. The first page that
// cannot be brought in or pinned ends the count, and results[found] says why. It
// returns the new count; holders past it are released at once.
func (o *Owner) pinFound(c *session, keys []string, pin time.Duration, results []*external.ExistsResponse) (found int32) {
	st := o.lock()
	seq := st.hot.invalSeq() // the invalidations from here on may kill what bringIn gets
	o.unlock()
	gets := o.bringIn(c, keys, o.opts.LandingReserve/2)
	if o.opts.testBeforePin != nil {
		o.opts.testBeforePin()
	}
	now := time.Now()
	st = o.lock()
	defer o.unlock()
	stopped := false
	for j, g := range gets {
		if g == nil {
			if !stopped {
				found++ // held elsewhere, past the landing room: counted unpinned
			}
			continue
		}
		if g.err != nil || g.resp == nil || stopped {
			if !stopped {
				// A page gone since the lookup (a miss) is absent; one larger than this
				// owner can ever hold (INVALID_ARGUMENT: the keys are valid) does not fit,
				// NO_SPACE; any other failure is the key's error.
				stopped = true
				results[j].Exists = false
				switch wire.CodeOf(g.err) {
				case common.ErrorCode_KEY_NOT_FOUND:
				case common.ErrorCode_INVALID_ARGUMENT:
					_, msg := wire.ToResponse(g.err)
					results[j].Code, results[j].Message = common.ErrorCode_NO_SPACE, msg
				default:
					results[j].Code, results[j].Message = wire.ToResponse(g.err)
				}
			}
			if g.resp != nil {
				st.release(c, g.resp.HolderId, now)
			}
			continue
		}
		if cur := st.hot.lookup(keys[j]); cur == nil || cur.putID != g.resp.PutId {
			// Not the hot set's: no load would be answered from the pin, which would
			// hold the bytes (and budget) for nothing. When an overwrite or delete of
			// the version reached this owner while the lookup's other pages landed, the
			// count ends there; else (the hot set did not keep it: it cannot tell what
			// the invalidations during the get's master trip killed) the page counts
			// unpinned, as one held elsewhere.
			st.release(c, g.resp.HolderId, now)
			if dead, known := st.hot.diedSince(keys[j], g.resp.PutId, seq); (known && dead) || (cur != nil && cur.putID > g.resp.PutId) {
				stopped = true
				results[j].Exists = false
				continue
			}
			found++
			continue
		}
		if !st.pinHolder(c, keys[j], g.resp, now.Add(pin), now) {
			stopped = true
			st.release(c, g.resp.HolderId, now)
			results[j].Exists = false
			results[j].Code, results[j].Message = wire.ToResponse(errCode(common.ErrorCode_NO_SPACE, "no room to pin %q: the hot-set budget is full, or this session's pins hold its share of it", keys[j]))
			continue
		}
		found++
	}
	return found
}

// bringIn gets the keys a prefix lookup pins (pinFound): one result per key, nil for
// a key held elsewhere that was left where it is. Keys this owner knows, and the first
// one it does not, go in one getMany; then as many more of the others as landing bytes
// take, each counted at the length of that first one.
func (o *Owner) bringIn(c *session, keys []string, landing int64) []*getResult {
	settling := o.master.unsettled()
	st, now := o.lock(), time.Now()
	var first, away []int
	for i, k := range keys {
		if st.knows(k, now, settling) {
			first = append(first, i)
		} else if len(away) == 0 && landing > 0 {
			away = append(away, i)
			first = append(first, i)
		} else {
			away = append(away, i)
		}
	}
	o.unlock()
	out := make([]*getResult, len(keys))
	fetch := func(idx []int) {
		ks := make([]string, len(idx))
		for j, i := range idx {
			ks[j] = keys[i]
		}
		for j, g := range o.getMany(c, ks) {
			out[idx[j]] = &g
		}
	}
	fetch(first)
	if len(away) < 2 || landing <= 0 {
		return out
	}
	g := out[away[0]]
	if g.err != nil || g.resp == nil || g.resp.Len <= 0 {
		return out // the count ends there
	}
	more := min(int64(len(away)-1), landing/g.resp.Len-1)
	if more > 0 {
		fetch(away[1 : 1+more])
	}
	return out
}
