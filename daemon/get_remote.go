package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// pullRemote serves a get planned from another owner's memory replica: this owner
// pulls the bytes over the data plane straight into the target the master allocated
// in its segment (only this owner writes its segment: docs/architecture.md §10), then GetDone turns
// the target into a holder (and maybe the key's memory replica here). A failed pull
// revokes the get with the reason; the caller re-plans without that node.
func (o *Owner) pullRemote(key string, plan *mp.GetStartResponse) (*holding, error) {
	if err := o.checkTarget(key, plan); err != nil {
		return nil, err
	}
	return o.pullInto(key, plan, plan.SourceOffset)
}

// errRemoteSSD marks a refill whose SSD read on the source owner failed: the get is
// revoked with drop_ssd_source and re-planned, as a local SSD failure is.
var errRemoteSSD = errors.New("SSD read on the source owner failed")

// errRemoteSSDNotNow marks a refill the source owner answered UNAVAILABLE: its read
// could not run now and says nothing about the record (a refresh moved it, its staging
// was full, its disk too slow for the deadline, it is stopping). The get is revoked,
// keeping the replica, and re-planned as after a local read that failed (at most
// maxSSDFailures times), the source not excluded nor reported failed: a key whose only
// copy is on that owner's SSD failed UNAVAILABLE after one such answer (a review).
var errRemoteSSDNotNow = errors.New("the source owner could not read the SSD value now")

// stageRefused is the error of a stage read the source owner (node) answered code,
// neither OK nor KEY_NOT_FOUND: errRemoteSSDNotNow for UNAVAILABLE, else unreachable.
func stageRefused(what, node string, code common.ErrorCode, msg string) error {
	if code == common.ErrorCode_UNAVAILABLE {
		return fmt.Errorf("%w: %s on node %q: %s", errRemoteSSDNotNow, what, node, msg)
	}
	return fmt.Errorf("%w: %s on node %q: %s: %s", transfer.ErrUnreachable, what, node, code, msg)
}

// stageVerdictWait bounds the wait for the SSD owner's answer after a staged pull
// failed: it says whether its read failed (drop the SSD replica) or not (exclude it).
const stageVerdictWait = 500 * time.Millisecond

// refillRemote serves a get planned from another owner's SSD (docs/architecture.md §10 "SSD pool"):
// one SsdStageRead makes that owner read the value in 4 MiB chunks into staging of
// its own, while this owner pulls each chunk as it is read into its target (at most
// STAGE_PULLS_IN_FLIGHT pulls at once); the SSD owner answers once every chunk was
// pulled and the value's checksum verified, and only then does the value go out (its
// holder recorded at GetStart, t, mark and own for its confirmation; from a master
// that recorded none, after GetDone). A failed read (a checksum mismatch included)
// revokes with drop_ssd_source; a failed pull revokes, and the node is excluded from
// the re-plan.
func (o *Owner) refillRemote(key string, plan *mp.GetStartResponse, t *getTarget, mark, own uint64) (*holding, error) {
	if err := o.checkTarget(key, plan); err != nil {
		return nil, err
	}
	deadline := o.bounds().stageDeadline(plan.Len)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	c, callOpts, err := o.peers.Get(plan.SourcePeerAddr)
	if err != nil {
		err = fmt.Errorf("%w: stage read on node %q (%s): %v", transfer.ErrUnreachable, plan.SourceNodeId, plan.SourcePeerAddr, err)
		o.revokePlan(key, plan, false, err)
		return nil, err
	}
	verdict := make(chan error, 1) // the SSD owner's answer: nil, errRemoteSSD, errRemoteSSDNotNow or unreachable
	go func() {
		resp, err := c.SsdStageRead(ctx, &peer.SsdStageReadRequest{Key: key, PutId: plan.PutId, GetId: plan.GetId,
			TargetNodeId: o.opts.NodeID, TargetDataAddr: o.dataAddr, TargetOffset: plan.TargetOffset, Len: plan.Len,
			Generation: plan.SourceGeneration, DeadlineMs: deadline.Milliseconds()}, callOpts...)
		switch {
		case err != nil:
			err = fmt.Errorf("%w: stage read on node %q (%s): %v", transfer.ErrUnreachable, plan.SourceNodeId, plan.SourcePeerAddr, err)
		case resp.Code == common.ErrorCode_KEY_NOT_FOUND: // the read failed (stageAnswer)
			err = fmt.Errorf("%w: %s", errRemoteSSD, resp.Message)
		case resp.Code != common.ErrorCode_OK:
			err = stageRefused("stage read", plan.SourceNodeId, resp.Code, resp.Message)
		}
		if err != nil {
			// The get fails with this answer whatever its pulls do (a refused call's
			// pulls would wait for a session that never comes): they end now.
			cancel()
		}
		verdict <- err
	}()
	pullErr := o.pullStaged(ctx, plan)
	var stageErr error
	if pullErr == nil {
		stageErr = <-verdict // bounded by ctx
	} else {
		select {
		case stageErr = <-verdict:
		case <-time.After(stageVerdictWait):
			// No longer wait for the SSD owner's answer: its call ends with ctx, and
			// the goroutine making it is joined.
			cancel()
			<-verdict
		}
		stageErr = refillOutcome(stageErr, pullErr)
	}
	// Every pull has returned: nothing writes the target any more.
	switch {
	case stageErr != nil:
		return nil, o.refillFailed(key, plan, stageErr)
	case plan.HolderId != 0:
		// The master recorded the holder at GetStart: it goes out now, confirmed in
		// the background, as a local refill's.
		h := &holding{key: key, putID: plan.PutId, len: plan.Len, source: plan.Source, offset: plan.TargetOffset, remote: true}
		return o.handOutRefill(key, plan, h, t, mark, own)
	default:
		return o.completeGet(key, plan)
	}
}

// refillOutcome is a remote SSD refill's outcome for one value from the source's answer
// and this owner's pull (nil: the value landed and its bytes were verified). A read
// that failed at the source decides (the SSD replica is dropped), as does one it could
// not run now (the source is alive: its answer came; the pulls failed because its
// session ended, or ran out of time with it); else a pull that
// failed does, except one cancelled because the answer failed, which says why. A pull
// that failed never ends as a success: the source counts a chunk served once its send
// ended, so it may answer OK for bytes a cancelled pull never took in.
func refillOutcome(answer, pull error) error {
	switch {
	case pull == nil || errors.Is(answer, errRemoteSSD) || errors.Is(answer, errRemoteSSDNotNow):
		return answer
	case !errors.Is(pull, context.Canceled):
		return pull
	case answer == nil:
		return fmt.Errorf("%w: %w", transfer.ErrUnreachable, pull)
	default:
		return answer
	}
}

// refillFailed revokes a remote SSD refill that ended with stageErr, dropping the SSD
// source when its read failed (errRemoteSSD), and returns stageErr.
func (o *Owner) refillFailed(key string, plan *mp.GetStartResponse, stageErr error) error {
	o.revokePlan(key, plan, errors.Is(stageErr, errRemoteSSD), stageErr)
	return stageErr
}

// pullStaged pulls the value staged on the source owner for plan's get into its
// target, chunk by chunk in order, at most STAGE_PULLS_IN_FLIGHT at once. The first
// failure stops the rest; it returns once no pull is running.
func (o *Owner) pullStaged(ctx context.Context, plan *mp.GetStartResponse) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	dst := o.seg.Bytes()[plan.TargetOffset : plan.TargetOffset+plan.Len]
	f := transfer.Fence{SourceNode: plan.SourceNodeId, SourceGeneration: plan.SourceGeneration, TransferID: plan.GetId, Staged: true}
	chunks := int((plan.Len + stageChunk - 1) / stageChunk)
	var (
		mu       sync.Mutex
		next     int
		inflight int
		firstErr error
		wg       sync.WaitGroup
	)
	stats := o.opts.Metrics.Stage()
	for range min(chunks, peer.STAGE_PULLS_IN_FLIGHT) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next == chunks || firstErr != nil {
					mu.Unlock()
					return
				}
				i := next
				next++
				inflight++
				stats.Pulls(inflight)
				mu.Unlock()
				off := int64(i) * stageChunk
				err := o.puller.Pull(ctx, plan.SourceDataAddr, f, off, dst[off:min(off+stageChunk, plan.Len)])
				mu.Lock()
				inflight--
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("staged pull of chunk %d from node %q (%s): %w", i, plan.SourceNodeId, plan.SourceDataAddr, err)
					cancel(firstErr)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// checkTarget refuses (and revokes) a plan whose target is not inside the segment.
func (o *Owner) checkTarget(key string, plan *mp.GetStartResponse) error {
	if plan.TargetOffset < 0 || plan.Len <= 0 || plan.TargetOffset > o.seg.Size()-plan.Len {
		err := errCode(common.ErrorCode_INTERNAL, "pull target [%d,+%d) outside the segment", plan.TargetOffset, plan.Len)
		o.revokePlan(key, plan, false, err)
		return err
	}
	return nil
}

// pullInto pulls the planned value from srcOffset of the source owner's segment into
// the target, then completes the get with GetDone; a failed pull revokes it.
func (o *Owner) pullInto(key string, plan *mp.GetStartResponse, srcOffset int64) (*holding, error) {
	dst := o.seg.Bytes()[plan.TargetOffset : plan.TargetOffset+plan.Len]
	f := transfer.Fence{SourceNode: plan.SourceNodeId, SourceGeneration: plan.SourceGeneration, TransferID: plan.GetId}
	b := o.bounds()
	ctx, cancel := context.WithTimeout(context.Background(), b.transfer)
	err := o.puller.Pull(transfer.WithBudget(ctx, b.pullDeadline(plan.Len)), plan.SourceDataAddr, f, srcOffset, dst)
	cancel()
	return o.pulled(key, plan, err)
}

// pulled completes a get whose pull into its target ended with err (nil: the target
// holds the value) with GetDone; a failed pull revokes it.
func (o *Owner) pulled(key string, plan *mp.GetStartResponse, err error) (*holding, error) {
	if err != nil {
		err = fmt.Errorf("pull from node %q (%s): %w", plan.SourceNodeId, plan.SourceDataAddr, err)
		o.revokePlan(key, plan, false, err)
		return nil, err
	}
	return o.completeGet(key, plan)
}

// completeGet turns a filled target into a holder with GetDone.
//
// A target pinned meanwhile (the owner registered with a new master, getpins.go) sends
// no GetDone: the master that planned the get is gone; the get fails.
func (o *Owner) completeGet(key string, plan *mp.GetStartResponse) (*holding, error) {
	o.targetWritten(plan.GetId)
	if o.getPinned(plan.GetId) {
		return nil, errGetMasterChanged()
	}
	done, err := o.getDone(key, plan.GetId)
	return o.gotDone(key, plan, done, err)
}

// gotDone turns the master's answer to a get's GetDone into its holder.
func (o *Owner) gotDone(key string, plan *mp.GetStartResponse, done *mp.GetDoneResponse, err error) (*holding, error) {
	if err != nil {
		return nil, o.getDoneFailed(key, plan, err)
	}
	return &holding{key: key, putID: plan.PutId, len: plan.Len, source: plan.Source, offset: plan.TargetOffset,
		masterID: done.HolderId, replica: done.Promoted, noticesSeq: done.NoticesSeq, remote: true}, nil
}

// getDoneFailed is what a get whose GetDone failed with err answers, once the holder
// that GetDone may have recorded is let go.
func (o *Owner) getDoneFailed(key string, plan *mp.GetStartResponse, err error) error {
	switch wire.CodeOf(err) {
	case common.ErrorCode_UNAVAILABLE:
		// The reply may be lost after the master recorded the holder, whose id is the
		// get id, or the call may reach the master only after this ack (it waited for the
		// lock): release it now and again after the in-flight TTL (an ack of a holder
		// that does not exist does no harm; an unfinished get expires with that TTL).
		o.ackUnanswered([]int64{plan.GetId})
	case common.ErrorCode_INVALID_ARGUMENT:
		// The master no longer knows the get: it expired (the transfer ended past the
		// in-flight TTL) or was dropped. Nothing was published; the client may retry.
		return errCode(common.ErrorCode_UNAVAILABLE, "get of %q ended after the master dropped it; retry: %v", key, err)
	}
	return err
}
