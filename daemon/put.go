package daemon

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/fluxkv/fluxkv/internal/workers"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// putStart asks the master for a target and records the in-flight put in the session;
// parent is set for a KV page (see PutStartRequest.parent).
func (o *Owner) putStart(c *session, key string, length int64, opts *external.PutOptions, parent *string) (putID, offset int64, err error) {
	r := o.putStartMany(c, []*external.PutStartItem{{Key: key, Len: length, Opts: opts, Parent: parent}})[0]
	return r.PutId, r.Offset, wire.FromResponse(r.Code, r.Message)
}

// putStartMany starts the puts of items (PutStart for one, else one BatchPutStart per
// masterParts) and records each in the session; results[i] answers items[i].
func (o *Owner) putStartMany(c *session, items []*external.PutStartItem) []*external.PutStartResponse {
	out := make([]*external.PutStartResponse, len(items))
	var valid []int
	for i, it := range items {
		out[i] = &external.PutStartResponse{}
		err := errCode(common.ErrorCode_INVALID_ARGUMENT, "null item")
		if it != nil {
			if err = wire.ValidateKey(it.Key); err == nil {
				err = wire.ValidateLen(it.Len, o.seg.Size())
			}
		}
		if err != nil {
			out[i].Code, out[i].Message = wire.ToResponse(err)
			continue
		}
		valid = append(valid, i)
	}
	for part := range masterParts(valid, func(i int) int { return len(items[i].Key) + len(items[i].GetParent()) }) {
		reqs := make([]*mp.PutStartItem, len(part))
		for j, i := range part {
			it := items[i]
			reqs[j] = &mp.PutStartItem{Key: it.Key, Len: it.Len, RejectIfExists: it.Opts != nil && it.Opts.RejectIfExists, Parent: it.Parent}
		}
		sent := time.Now()
		plans, epoch, callErr := o.askPutStart(reqs)
		for j, i := range part {
			err := callErr
			if err == nil {
				var r *external.PutStartResponse
				if r, err = o.acceptStartedPut(c, reqs[j], plans[j], epoch, sent); err == nil {
					out[i] = r
				}
			}
			out[i].Code, out[i].Message = wire.ToResponse(err)
		}
	}
	return out
}

// askPutStart is one PutStart (one item) or BatchPutStart call, carrying the queued
// holder acks, once no registration is in progress; epoch is the registration's when it
// was sent.
func (o *Owner) askPutStart(items []*mp.PutStartItem) (plans []*mp.PutStartResponse, epoch uint64, err error) {
	wait, cancel := o.master.waitCtx()
	defer cancel()
	if err := o.master.settled(wait); err != nil {
		return nil, 0, err
	}
	epoch = o.regEpoch()
	acks := o.acks.takeForCall(wait)
	ctx := o.master.callCtx(wait)
	code, msg := common.ErrorCode_OK, ""
	if len(items) == 1 {
		it := items[0]
		var resp *mp.PutStartResponse
		if resp, err = o.master.cl().PutStart(ctx, &mp.PutStartRequest{Node: o.master.ref(), Key: it.Key, Len: it.Len, RejectIfExists: it.RejectIfExists, Parent: it.Parent, Acks: acks}); err == nil {
			plans = []*mp.PutStartResponse{resp}
		}
	} else {
		var resp *mp.BatchPutStartResponse
		if resp, err = o.master.cl().BatchPutStart(ctx, &mp.BatchPutStartRequest{Node: o.master.ref(), Items: items, Acks: acks}); err == nil {
			code, msg, plans = resp.Code, resp.Message, resp.Results
		}
	}
	if err != nil || acksRefused(code) || (len(plans) == 1 && plans[0] != nil && acksRefused(plans[0].Code)) {
		o.acks.giveBack(acks) // unsent, or the master applied none of them
	}
	if err := o.master.check(code, msg, err); err != nil {
		return nil, 0, err
	}
	if len(plans) != len(items) || slices.Contains(plans, nil) {
		return nil, 0, errCode(common.ErrorCode_INTERNAL, "the master answered %d of %d puts of a BatchPutStart", len(plans), len(items))
	}
	return plans, epoch, nil
}

// acceptStartedPut records the put the master placed for it (resp, answered to a call
// sent at registration epoch, at sent) in session c; no copy into its range starts
// after its copy deadline, and it is dropped once the master's TTL ran out.
func (o *Owner) acceptStartedPut(c *session, it *mp.PutStartItem, resp *mp.PutStartResponse, epoch uint64, sent time.Time) (*external.PutStartResponse, error) {
	if err := o.master.check(resp.Code, resp.Message, nil); err != nil {
		return nil, err
	}
	// The client writes at the source offset: the target itself, or, for a put the
	// master placed on another owner, a range of this owner's transfer area that the
	// target pulls from at PutDone.
	p := &pendingPut{key: it.Key, putID: resp.PutId, offset: resp.SourceOffset, len: it.Len, parent: it.Parent, local: resp.TargetNodeId == o.opts.NodeID,
		copyBy: sent.Add(o.bounds().putCopy), gone: sent.Add(o.bounds().reack)}
	if resp.SourceOffset < 0 || resp.SourceOffset > o.seg.Size()-it.Len {
		o.abandonPut(p)
		return nil, errCode(common.ErrorCode_INTERNAL, "master placed put %d at [%d,+%d), outside the %d-byte segment", resp.PutId, resp.SourceOffset, it.Len, o.seg.Size())
	}
	st := o.lock()
	err := st.acceptPut(c, p, epoch)
	o.unlock()
	if err != nil {
		o.abandonPut(p) // revoked, in case a new master answered it
		return nil, err
	}
	return &external.PutStartResponse{PutId: p.putID, Offset: p.offset}, nil
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
	// A put placed elsewhere is written into a source range of this owner's transfer
	// area (or landing area), which the pool may have borrowed for a replica until the
	// master took it back for this source: the eviction notice of that replica comes
	// only with the next heartbeat, so its record goes now, before the client writes
	// (else a new master would adopt it from this owner's report over the put's bytes).
	st.replicas.open(p.offset, p.len)
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
	}
	st.writes.remove(p.write) // also once its session ended meanwhile (endSession left it)
	c.ended.add(p.putID, p.key, outcome)
	p.outcome = outcome
	close(p.ending)
}

// putsPublished: the master published ps (mark was the replica index's before
// PutDone). A put placed on this owner is the key's replica; older versions of the
// keys are dead here. Every record is learned before any older version is dropped: the
// drops are notes of the index, and a batch's own must not make its records doubtful.
func (st *ownerState) putsPublished(ps []*pendingPut, mark uint64) {
	for _, p := range ps {
		if p.local {
			st.replicas.learn(replicaRecord{key: p.key, putID: p.putID, offset: p.offset, len: p.len, page: p.parent != nil, parent: deref(p.parent)}, mark, 0)
		}
	}
	for _, p := range ps {
		st.invalidate(p.key, p.putID-1)
	}
}

// putEnd publishes the put (putEndMany of one item).
func (o *Owner) putEnd(c *session, key string, putID int64, copies []*external.AreaCopy) error {
	return o.putEndMany(c, []*external.PutEndItem{{Key: key, PutId: putID, Copies: copies}})[0]
}

// putEndMany publishes the puts of items, results[i] answering items[i]: each is
// readied (endingPut), then those ready go to the master together (publish), then
// each ends. The key leaves the owner's hot set only after the master published the
// new version, so no get can install the old one afterwards.
func (o *Owner) putEndMany(c *session, items []*external.PutEndItem) []error {
	out := make([]error, len(items))
	var ready, ending []*pendingPut
	var at, endingAt []int
	for i, it := range items {
		if it == nil {
			out[i] = errCode(common.ErrorCode_INVALID_ARGUMENT, "null item")
			continue
		}
		p, running, err := o.endingPut(c, it.Key, it.PutId, it.Copies)
		switch {
		case p != nil:
			ready, at = append(ready, p), append(at, i)
		case running != nil: // answered once this call (or another) has published it
			ending, endingAt = append(ending, running), append(endingAt, i)
		default:
			out[i] = err
		}
	}
	errs := o.publish(ready)
	var putBytes int64
	st := o.lock()
	for j, p := range ready {
		st.endPut(c, p, errs[j])
		out[at[j]] = errs[j]
		if errs[j] == nil {
			putBytes += p.len
		}
	}
	o.unlock()
	o.opts.Metrics.PutBytes(putBytes)
	for j, p := range ending {
		<-p.ending
		out[endingAt[j]] = p.outcome
	}
	return out
}

// endingPut readies one put for publishing and returns it (p), or the put whose PutEnd
// is already in progress (running: the caller waits for its outcome once its own puts
// are published, since this call may be the one publishing it), or the outcome to
// answer at once. A PutEnd repeated on the same session (its reply was lost) answers
// the outcome of the first: it waits for one still in progress, or finds it among the
// session's last putEndMemory ended puts.
//
// Under client isolation the copies (validated first: a bad one leaves the put pending)
// are copied from the session's put area into the put's range after any PutWrite still
// copying has finished; a repeated PutEnd copies nothing again.
func (o *Owner) endingPut(c *session, key string, putID int64, copies []*external.AreaCopy) (p, running *pendingPut, err error) {
	if err := checkCopyCount(len(copies)); err != nil {
		return nil, nil, err
	}
	st := o.lock()
	p = c.puts[putID]
	switch {
	case p != nil && p.key == key && p.ending != nil:
		o.unlock()
		return nil, p, nil
	case p == nil || p.key != key:
		outcome, ok := c.ended.lookup(putID, key)
		o.unlock()
		if ok {
			return nil, nil, outcome
		}
		return nil, nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (never started, aborted, or ended longer ago than the last %d puts)", putID, putEndMemory)
	}
	if err := st.checkPutCopies(c, p, copies); err != nil {
		o.unlock()
		return nil, nil, err
	}
	if len(copies) > 0 && time.Now().After(p.copyBy) {
		err := o.expirePutLocked(st, c, p)
		o.unlock()
		o.abandonPut(p)
		return nil, nil, err
	}
	p.ending = make(chan struct{}) // no PutWrite starts from now on
	if len(copies) > 0 {
		c.copying++ // keeps the area mapped while PutWrites finish and ours runs
		o.waitCopiesLocked(p)
		area := c.area
		o.unlock()
		copied := o.copyIn(area, p, copies)
		st = o.lock()
		c.copying--
		o.copied.Broadcast()
		p.expired = p.expired || !copied // the deadline passed while PutWrites ran or during the copy
	}
	o.waitCopiesLocked(p)
	if p.expired { // a PutWrite's copy, or ours, stopped at the deadline: the value is part-copied
		err := errPutExpired(p, o.bounds().putCopy)
		st.endPut(c, p, err)
		o.unlock()
		o.abandonPut(p)
		return nil, nil, err
	}
	o.unlock()
	return p, nil, nil
}

// expirePutLocked takes p, whose copy deadline passed, out of session c (as PutAbort
// does, once no copy into it runs) and returns the error to answer; the caller
// abandons p once it released Owner.mu.
func (o *Owner) expirePutLocked(st *ownerState, c *session, p *pendingPut) error {
	delete(c.puts, p.putID)
	err := errPutExpired(p, o.bounds().putCopy)
	c.ended.add(p.putID, p.key, err) // a repeated PutEnd or PutWrite answers the same, also while copies end
	o.waitCopiesLocked(p)
	st.writes.remove(p.write) // (registered while a copy runs: a registration meanwhile pins the range)
	return err
}

// errPutExpired is the answer to a copy into p past its deadline (d after its PutStart).
func errPutExpired(p *pendingPut, d time.Duration) error {
	return errCode(common.ErrorCode_UNAVAILABLE, "put %d of %q started more than %v ago: the master may have expired it; put the value again", p.putID, p.key, d)
}

// publish runs PutDone for ps (one call: PutDone for one put, else BatchPutDone per
// masterParts); errs[i] is ps[i]'s outcome. On success the key's older versions
// are dead here: the hot-set holding and SSD entries of versions before putID go.
func (o *Owner) publish(ps []*pendingPut) []error {
	errs := make([]error, len(ps))
	var send []int
	for i, p := range ps {
		if o.ackPin(p) {
			errs[i] = errCode(common.ErrorCode_UNAVAILABLE, "the master restarted during this put; the value was not stored")
			continue
		}
		send = append(send, i)
	}
	for part := range masterParts(send, func(i int) int { return len(ps[i].key) }) {
		st := o.lock()
		for _, i := range part {
			st.beginWrite(ps[i].key) // no cached answer of the key until it is dropped below
		}
		reports, registered, unknown := st.reg.reports, st.reg.registered, st.reg.unknown
		o.unlock()
		mark := o.replicaMark()
		results, err := o.askPutDone(ps, part)
		if err != nil {
			gone := make([]*pendingPut, len(part))
			for j, i := range part {
				gone[j] = ps[i]
			}
			o.abandonPuts(gone) // best effort: the master may not have seen PutDone
		}
		for j, i := range part {
			if errs[i] = err; err == nil {
				errs[i] = o.master.check(results[j].Code, results[j].Message, nil)
			}
		}
		settled := o.settledAfter(ps, part)
		st = o.lock()
		crossed := st.reg.reports != reports || st.reg.registered != registered || st.reg.unknown != unknown
		for j, i := range part {
			published := err == nil && errs[i] == nil // by the master the call reached
			unknown := err != nil || outcomeUnknown(results[j].Code)
			if published && (crossed || (ps[i].pinned() && !settled)) {
				// The owner registered again while PutDone was out (or its registration
				// begun meanwhile did not end in time): the new master rebuilt its routes
				// from a report that does not have this version (it may have the key's
				// older one), so it was not stored there. The range is the new master's
				// pin, acked when the put ends. A registration begun meanwhile whose
				// Register failed in transport may have been taken by the master that
				// published, or may still be (reg.unknown): answered the same.
				errs[i] = errCode(common.ErrorCode_UNAVAILABLE, "the owner registered with the master while this put was published: its outcome is unknown (the master may not have it); put again")
			}
			switch {
			case published && errs[i] != nil:
				// Published, at a master this owner may no longer stand with: the older
				// versions are dead there, and go here as after an answered put (kept,
				// a later master rebuilt from this owner's report would serve one after
				// the put).
				st.invalidate(ps[i].key, ps[i].putID-1)
			case unknown:
				// It may have published: the older version this owner records, or holds
				// in its hot set as the key's replica, may be dead. (Its SSD entries are
				// kept: a master that did not publish still routes gets to them.)
				st.ack(st.hot.invalidate(ps[i].key, ps[i].putID-1))
				st.replicas.drop(ps[i].key, ps[i].putID-1)
			}
		}
		var published []*pendingPut
		for _, i := range part {
			if err == nil && errs[i] == nil {
				published = append(published, ps[i])
			}
		}
		st.putsPublished(published, mark)
		for _, i := range part {
			st.endWrite(ps[i].key)
		}
		o.unlock()
	}
	return errs
}

// settledAfter waits, when a registration began while the PutDone of ps[i], i in part,
// was out (a put's range was reported as a pin), until it ended; it reports whether
// none is in progress now. Only then do reg.registered and reg.unknown tell a
// registration the master refused (the publishing master is still this owner's) from
// one it took or may take.
func (o *Owner) settledAfter(ps []*pendingPut, part []int) bool {
	o.lock()
	pinned := slices.ContainsFunc(part, func(i int) bool { return ps[i].pinned() })
	o.unlock()
	if !pinned {
		return true
	}
	wait, cancel := o.master.waitCtx()
	defer cancel()
	return o.master.settled(wait) == nil
}

// putDoneParallel is how many items of a BatchPutDone the master publishes at once.
const putDoneParallel = int(mp.BATCH_PUT_DONE_PARALLEL)

// askPutDone is one PutDone (one put) or BatchPutDone call for ps[i], i in part.
func (o *Owner) askPutDone(ps []*pendingPut, part []int) ([]*mp.PutDoneResponse, error) {
	// A put placed on another owner is pulled by it during PutDone: allow for the
	// transfer (its owner gives up after TransferTimeout) on top of the usual bound, once
	// for each round of a batch's pulls (the master runs putDoneParallel at a time). A
	// call of puts placed here only is an ordinary call (masterLink.ctxWithin).
	rounds := (len(part) + putDoneParallel - 1) / putDoneParallel
	wait := o.opts.MasterTimeout + time.Duration(rounds)*o.opts.TransferTimeout
	ctx, cancel, opts := o.master.ctxWithin(wait, slices.ContainsFunc(part, func(i int) bool { return !ps[i].local }))
	defer cancel()
	if len(part) == 1 {
		p := ps[part[0]]
		resp, err := o.master.cl().PutDone(ctx, &mp.PutDoneRequest{Node: o.master.ref(), Key: p.key, PutId: p.putID}, opts...)
		if err != nil {
			return nil, o.master.check(0, "", err)
		}
		return []*mp.PutDoneResponse{resp}, nil
	}
	items := make([]*mp.PutDoneItem, len(part))
	for j, i := range part {
		items[j] = &mp.PutDoneItem{Key: ps[i].key, PutId: ps[i].putID}
	}
	resp, err := o.master.cl().BatchPutDone(ctx, &mp.BatchPutDoneRequest{Node: o.master.ref(), Items: items}, opts...)
	if err := o.master.check(respCode(resp, err)); err != nil {
		return nil, err
	}
	if len(resp.Results) != len(part) || slices.Contains(resp.Results, nil) {
		return nil, errCode(common.ErrorCode_INTERNAL, "the master answered %d of %d puts of a BatchPutDone", len(resp.Results), len(part))
	}
	return resp.Results, nil
}

func (o *Owner) putAbort(c *session, key string, putID int64) error {
	st := o.lock()
	p, err := o.takePutLocked(st, c, key, putID)
	o.unlock()
	if err != nil {
		return err
	}
	o.abandonPut(p)
	return nil
}

// takePutLocked takes session c's put putID of key out of the session, for the caller
// to abandon, once no PutWrite copies into it.
func (o *Owner) takePutLocked(st *ownerState, c *session, key string, putID int64) (*pendingPut, error) {
	p := c.puts[putID]
	switch {
	case p == nil || p.key != key:
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (never started, ended or aborted)", putID)
	case p.ending != nil:
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "put %d is ending (its PutEnd is in progress): it cannot be aborted", putID)
	}
	delete(c.puts, putID)
	// A PutWrite still copying must not land in a freed range: the range stays
	// registered until it ends, so a registration meanwhile pins it.
	o.waitCopiesLocked(p)
	st.writes.remove(p.write)
	return p, nil
}

// abandonPut frees an in-flight put's target at the master (or acks its pin).
func (o *Owner) abandonPut(p *pendingPut) { o.abandonPuts([]*pendingPut{p}) }

// revokePutsParallel bounds the PutRevoke calls of abandonPuts in flight at once.
const revokePutsParallel = 16

// abandonPuts is abandonPut for many puts (a failed BatchPutDone, a session's end),
// revokePutsParallel at a time. Once a revoke fails in transport (the master is out of
// reach) the others are left to the master's in-flight TTL: each would wait out its own
// call's timeout, serially a batch's hours.
func (o *Owner) abandonPuts(ps []*pendingPut) {
	var unreachable atomic.Bool
	var left atomic.Int32
	workers.ForEach(len(ps), revokePutsParallel, func(i int) {
		p := ps[i]
		if unreachable.Load() {
			if !o.ackPin(p) {
				left.Add(1)
			}
			return
		}
		if err := o.revokePut(p); err != nil {
			if wire.CodeOf(err) == common.ErrorCode_UNAVAILABLE {
				unreachable.Store(true)
			}
			o.log.Warn().Err(err).Str("key", p.key).Int64("put_id", p.putID).Msg("put revoke failed; the master's TTL will reclaim it")
		}
	})
	if n := left.Load(); n > 0 {
		o.log.Warn().Int32("puts", n).Msg("the master is out of reach: puts left to its TTL without a revoke")
	}
}

// revokePut frees p's target at the master, or acks its pin.
func (o *Owner) revokePut(p *pendingPut) error {
	if o.ackPin(p) {
		return nil
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().PutRevoke(ctx, &mp.PutRevokeRequest{Node: o.master.ref(), Key: p.key, PutId: p.putID})
	return o.master.check(respCode(resp, err))
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
