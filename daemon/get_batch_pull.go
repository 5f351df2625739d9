package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// A get batch often finds many of its values on one other owner (an engine's pages of
// one prompt, put through one node). Brought in one by one, each value costs a round
// trip and a wake-up of both owners, and from SSD a peer call of its own; pullBatch
// brings all of one source's values in together before the batch's gets complete:
//   - from its memory with one pipelined PullMany (the source streams them back to back);
//   - from its SSD (values of one chunk) with one BatchSsdStageRead (stage_batch.go)
//     while two pipelined PullMany pull them as they are staged, in the batch's order.
// Then the values that landed from memory complete with one BatchGetDone; the refills'
// holders, recorded at BatchGetStart, go out at once (refilled: their GetDones follow
// in the background). Each failed one is revoked and re-planned alone by planGet, as a
// lone get's would be.

// prePulled is one key of a batch whose value pullBatch brought in: err the transfer's
// outcome (for a refill:
// errRemoteSSD when the source's read failed); for a transfer that succeeded, done and
// doneErr are its GetDone's answer (or the pinned target's error, as completeGet has
// it).
type prePulled struct {
	err     error
	done    *mp.GetDoneResponse
	doneErr error
	// h: a refill whose holder the master recorded at BatchGetStart, handed out at
	// once (its GetDone follows in the background), unless doneErr says it failed.
	h *holding
}

// finishPulled completes a pre-pulled get as pulled and refilled would have: a failed
// transfer revokes it, a completed one becomes its holder.
func (o *Owner) finishPulled(key string, plan *mp.GetStartResponse, pre *prePulled) (*holding, error) {
	refill := plan.Source == common.Source_SSD
	switch {
	case pre.err == nil && refill && plan.HolderId != 0:
		return pre.h, pre.doneErr // handed out by pullBatch
	case pre.err == nil:
		return o.gotDone(key, plan, pre.done, pre.doneErr)
	case refill:
		return nil, o.refillFailed(key, plan, pre.err)
	default:
		return o.pulled(key, plan, pre.err)
	}
}

// batchSource is one source owner's share of a batch: its memory or its SSD.
type batchSource struct {
	node           string
	gen            int64  // the source's registration (plans of two fail its fence apart)
	data, peerAddr string // where its values are pulled and its staging asked for
	ssd            bool
}

// pullBatch brings in, per source owner and tier (sources concurrently), the values of
// the plans run names (of keys) that come from another owner's memory or SSD, when a
// source has at least two of them; pre[j] is set for each key it brought in. A target
// outside the segment, a plan too old (bounds.planAge), an SSD value of more than one
// staging chunk and a source's lone value are left to planGet. A source's pulls share
// one deadline: the transfer bound from memory, each run of their pulls pullDeadline of
// their bytes once it holds a slot of the peer's; stageDeadline from SSD.
func (o *Owner) pullBatch(keys []string, starts []startedGet, run []int) (pre []*prePulled) {
	pre = make([]*prePulled, len(starts))
	groups := make(map[batchSource][]int)
	planAge := o.bounds().planAge
	for _, j := range run {
		p := starts[j].plan
		if p.Done || p.SourceNodeId == o.opts.NodeID || p.TargetOffset < 0 || p.Len <= 0 ||
			p.TargetOffset > o.seg.Size()-p.Len || time.Since(starts[j].at) > planAge {
			continue
		}
		// By registration and addresses too: a batch planned over several calls may name
		// a source that registered again elsewhere between them (a review: its plans were
		// all pulled from the first one's address).
		src := batchSource{node: p.SourceNodeId, gen: p.SourceGeneration, data: p.SourceDataAddr, peerAddr: p.SourcePeerAddr}
		switch {
		case p.Source == common.Source_MEMORY:
			groups[src] = append(groups[src], j)
		case p.Source == common.Source_SSD && p.Len <= stageChunk:
			src.ssd = true
			groups[src] = append(groups[src], j)
		}
	}
	for src, js := range groups {
		if len(js) < 2 {
			delete(groups, src)
		}
	}
	if len(groups) == 0 {
		return pre
	}
	for _, js := range groups {
		for _, j := range js {
			pre[j] = &prePulled{} // (the targets' records went when their plans were accepted)
		}
	}
	// The sources concurrently, the last on this goroutine (most batches have one: no
	// wake-up of another before its first call goes out).
	var wg sync.WaitGroup
	left := len(groups)
	for src, js := range groups {
		bring := func() {
			if src.ssd {
				for part := range chunkInts(js, int(peer.STAGE_BATCH_ITEMS)) {
					if slices.ContainsFunc(part, func(j int) bool { return time.Since(starts[j].at) > planAge }) {
						// The parts before took long: these plans' targets must not be
						// written this late (the master frees them at its in-flight TTL).
						// Each is revoked and planned again alone (leadNow).
						for _, j := range part {
							pre[j] = nil
						}
						continue
					}
					o.refillGroup(keys, starts, part, pre)
				}
			} else {
				o.pullGroup(starts, js, pre)
			}
		}
		if left--; left > 0 {
			wg.Go(bring)
		} else {
			bring()
		}
	}
	wg.Wait()
	// The values that landed complete together: one BatchGetDone. A refill whose holder
	// the master recorded at once goes out now, confirmed in the background together
	// with the batch's others.
	var doneKeys []string
	var ids []int64
	var js []int
	var confirms []refillConfirm
	for j, p := range pre {
		if p == nil || p.err != nil {
			continue
		}
		plan := starts[j].plan
		if plan.Source == common.Source_SSD && plan.HolderId != 0 {
			if p.doneErr = o.refillWritten(plan); p.doneErr == nil {
				p.h = &holding{key: keys[j], putID: plan.PutId, len: plan.Len, source: plan.Source, offset: plan.TargetOffset,
					masterID: plan.HolderId, remote: true}
				confirms = append(confirms, refillConfirm{key: keys[j], getID: plan.GetId, h: p.h, t: starts[j].t, mark: starts[j].mark, own: starts[j].t.own})
			}
			continue
		}
		o.targetWritten(plan.GetId)
		if o.getPinned(plan.GetId) {
			p.doneErr = errGetMasterChanged()
			continue
		}
		doneKeys, ids, js = append(doneKeys, keys[j]), append(ids, plan.GetId), append(js, j)
	}
	if len(confirms) > 0 {
		o.confirmRefills(confirms)
	}
	if len(doneKeys) > 0 {
		for k, c := range o.getDoneMany(doneKeys, ids) {
			pre[js[k]].done, pre[js[k]].doneErr = c.resp, c.err
		}
	}
	return pre
}

// chunkInts yields s in parts of at most n.
func chunkInts(s []int, n int) func(yield func([]int) bool) {
	return func(yield func([]int) bool) {
		for len(s) > 0 {
			k := min(n, len(s))
			if !yield(s[:k]) {
				return
			}
			s = s[k:]
		}
	}
}

// pullGroup pulls the values js of one source's memory with one PullMany.
func (o *Owner) pullGroup(starts []startedGet, js []int, pre []*prePulled) {
	var total int64
	for _, j := range js {
		total += starts[j].plan.Len
	}
	b := o.bounds()
	ctx, cancel := context.WithTimeout(context.Background(), b.transfer)
	defer cancel()
	ctx = transfer.WithBudget(ctx, b.pullDeadline(total))
	seg := o.seg.Bytes()
	items := make([]transfer.PullItem, len(js))
	for k, j := range js {
		p := starts[j].plan
		items[k] = transfer.PullItem{
			Fence:  transfer.Fence{SourceNode: p.SourceNodeId, SourceGeneration: p.SourceGeneration, TransferID: p.GetId},
			Offset: p.SourceOffset,
			Dst:    seg[p.TargetOffset : p.TargetOffset+p.Len],
		}
	}
	for k, err := range o.puller.PullMany(ctx, starts[js[0]].plan.SourceDataAddr, items) {
		pre[js[k]].err = err
	}
}

// refillGroup refills the values js of one source's SSD (one chunk each, at most
// STAGE_BATCH_ITEMS): one BatchSsdStageRead makes that owner stage them while this one
// pulls them into their targets with two PullMany of staged pulls (the even and the
// odd items, each answered in order). The call goes out from this goroutine, at once
// (the source reads nothing before it arrives; the pulls wait there for their
// sessions). Each value's outcome is refillRemote's: the source's answer for it once
// its pull succeeded (a failed read is errRemoteSSD), else the pull's failure unless
// the answer says the read failed. When no pull succeeded, or the source left one
// unanswered, the answer is waited for at most stageVerdictWait after the pulls
// ended; then the call is abandoned and the values without an answer fail as
// unreachable. A call that fails as a whole (refused, or never answered) fails every
// value with it at once: their pulls are cancelled.
func (o *Owner) refillGroup(keys []string, starts []startedGet, js []int, pre []*prePulled) {
	first := starts[js[0]].plan
	var total int64
	for _, j := range js {
		total += starts[j].plan.Len
	}
	deadline := o.bounds().stageDeadline(total)
	// The call gets stageVerdictWait beyond the pulls' deadline: the source counts the
	// same deadline from the call's arrival, and when it ends there it answers for each
	// value, the ones that landed included.
	callCtx, cancel := context.WithTimeout(context.Background(), deadline+stageVerdictWait)
	defer cancel()
	ctx, stopPulls := context.WithTimeout(callCtx, deadline)
	defer stopPulls()
	c, callOpts, err := o.peers.Get(first.SourcePeerAddr)
	if err != nil {
		for _, j := range js {
			pre[j].err = fmt.Errorf("%w: stage read on node %q (%s): %v", transfer.ErrUnreachable, first.SourceNodeId, first.SourcePeerAddr, err)
		}
		return
	}
	stage := make([]*peer.SsdStageReadRequest, len(js))
	seg := o.seg.Bytes()
	items := make([]transfer.PullItem, len(js))
	for k, j := range js {
		p := starts[j].plan
		stage[k] = &peer.SsdStageReadRequest{Key: keys[j], PutId: p.PutId, GetId: p.GetId,
			TargetNodeId: o.opts.NodeID, TargetDataAddr: o.dataAddr, TargetOffset: p.TargetOffset, Len: p.Len,
			Generation: p.SourceGeneration, DeadlineMs: deadline.Milliseconds()}
		items[k] = transfer.PullItem{
			Fence: transfer.Fence{SourceNode: p.SourceNodeId, SourceGeneration: p.SourceGeneration, TransferID: p.GetId, Staged: true},
			Dst:   seg[p.TargetOffset : p.TargetOffset+p.Len], // the value's one chunk, at offset 0
		}
	}
	// Two pipelines, of the even and the odd items: while one waits for a value still
	// being read, the other sends, and both stay near the source's read position (it
	// reads in list order; halves would start the second pipeline a half batch ahead,
	// waiting for reads that start only as the first half is pulled).
	pulls := make([]error, len(items))
	var pipelines sync.WaitGroup
	for parity := range 2 {
		pipelines.Go(func() {
			var part []transfer.PullItem
			for k := parity; k < len(items); k += 2 {
				part = append(part, items[k])
			}
			errs := o.puller.PullMany(ctx, first.SourceDataAddr, part)
			for i, err := range errs {
				pulls[parity+2*i] = err
			}
			if n := len(errs); n > 0 && errs[n-1] != nil && !errors.Is(errs[n-1], transfer.ErrFenced) {
				// This pipeline broke (or its last value was refused): the values it
				// left unpulled keep the source's places, so the other pipeline's pulls
				// would wait there until the deadline. They end now.
				stopPulls()
			}
		})
	}
	// The source's answer says which landed values are good. It comes once every item's
	// read ended, the failed ones included: worth waiting for (bounded by the call's
	// deadline) when values landed and the source answered every pull (a refused one,
	// e.g. a chunk not read in time, proves it alive); after a pull it did not answer
	// (down, or cut off) it gets stageVerdictWait, then the call is cancelled.
	answered := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		pipelines.Wait()
		landed := slices.ContainsFunc(pulls, func(err error) bool { return err == nil })
		silent := slices.ContainsFunc(pulls, func(err error) bool { return err != nil && !errors.Is(err, transfer.ErrFenced) })
		if landed && !silent {
			return
		}
		t := time.NewTimer(stageVerdictWait)
		defer t.Stop()
		select {
		case <-answered:
		case <-t.C:
			cancel()
		}
	})
	resp, err := c.BatchSsdStageRead(callCtx, &peer.BatchSsdStageReadRequest{Items: stage}, callOpts...)
	if err != nil || resp.Code != common.ErrorCode_OK {
		// Every value fails with the call (the source refused or never got it): its
		// pulls would wait there for sessions that never come. They end now.
		cancel()
	}
	close(answered)
	watch.Wait() // the pulls ended: nothing writes the targets any more

	var refused error // the call refused as a whole: each value fails with it
	switch {
	case err == nil && resp.Code == common.ErrorCode_OK && len(resp.Results) != len(js):
		err = fmt.Errorf("it answered %d of %d values", len(resp.Results), len(js))
	case err == nil && resp.Code != common.ErrorCode_OK:
		refused = stageRefused("batch stage read", first.SourceNodeId, resp.Code, resp.Message)
	}
	for k, j := range js {
		var answer error // nil, errRemoteSSD, errRemoteSSDNotNow or unreachable
		switch {
		case refused != nil:
			answer = refused
		case err != nil:
			answer = fmt.Errorf("%w: batch stage read on node %q (%s): %v", transfer.ErrUnreachable, first.SourceNodeId, first.SourcePeerAddr, err)
		case resp.Results[k] == nil:
			answer = fmt.Errorf("%w: batch stage read on node %q: no answer for %q", transfer.ErrUnreachable, first.SourceNodeId, keys[j])
		case resp.Results[k].Code == common.ErrorCode_KEY_NOT_FOUND: // the read failed (stageAnswer)
			answer = fmt.Errorf("%w: %s", errRemoteSSD, resp.Results[k].Message)
		case resp.Results[k].Code != common.ErrorCode_OK:
			answer = stageRefused("batch stage read", first.SourceNodeId, resp.Results[k].Code, resp.Results[k].Message)
		}
		pre[j].err = refillOutcome(answer, pulls[k])
	}
}
