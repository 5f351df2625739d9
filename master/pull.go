package master

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/cloudwego/kitex/pkg/kerrors"
	"github.com/cloudwego/kitex/pkg/remote"

	"github.com/fluxkv/fluxkv/internal/workers"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// errTargetGone cancels a pull whose target owner incarnation was tombed (or
// re-registered) while it ran.
var errTargetGone = errors.New("target owner tombed or re-registered during the pull")

// pull runs one PullPut (pullMany of one task).
func (s *Server) pull(t *PullTask) (err error, answered bool) {
	errs, ans := s.pullMany([]*PullTask{t})
	return errs[0], ans[0]
}

// pullMany runs the PullPuts ts, all placed on one target owner incarnation (ts[0]'s),
// in one call: PullPut for one, BatchPullPut for more (the target pulls the values of
// one source back to back); an owner of an earlier release, which does not know
// BatchPullPut (masters are upgraded first: docs/upgrades.md), gets one PullPut per
// put instead. errs[i] is ts[i]'s outcome; answered[i] reports that the owner
// answered, or that nothing reached it, or that it was tombed: in each case it will not
// write the target range any more (pullCall).
func (s *Server) pullMany(ts []*PullTask) (errs []error, answered []bool) {
	errs, answered, unknown := s.pullCall(ts)
	if unknown && len(ts) > 1 {
		workers.ForEach(len(ts), batchPutDoneParallel, func(i int) {
			e, a, _ := s.pullCall(ts[i : i+1])
			errs[i], answered[i] = e[0], a[0]
		})
	}
	return errs, answered
}

// pullCall is one PullPut (one task) or BatchPullPut call: the target owner pulls each
// pooled put from its requester's transfer area. It waits up to PullTimeout (the owner
// gives up after its own, shorter, transfer deadline); connecting to a dead owner fails
// within PeerConnectTimeout, and the call is cancelled when the target is tombed
// meanwhile. A call that failed in transport leaves answered false for every task.
// unknown reports that the owner does not know the method (nothing was pulled; the
// tasks are answered).
func (s *Server) pullCall(ts []*PullTask) (errs []error, answered []bool, unknown bool) {
	errs, answered = make([]error, len(ts)), make([]bool, len(ts))
	fail := func(err error, ans bool) {
		for i := range ts {
			errs[i], answered[i] = err, ans
		}
	}
	t := ts[0]
	c, callOpts, err := s.peers.GetNode(t.TargetNode, t.TargetPeerAddr)
	if err != nil {
		fail(fmt.Errorf("PeerService client for %s: %w", t.TargetPeerAddr, err), true)
		return errs, answered, false
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ctx, cancelTimeout := context.WithTimeout(ctx, s.opts.PullTimeout)
	defer cancelTimeout()

	// Watch the target's membership while the call runs (as the persister does).
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(persistWatchInterval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-s.stop:
				cancel(errMasterStopping)
				return
			case <-tick.C:
				live := false
				s.locked(func(st *State) error {
					live = liveOwnerLocked(st, t.TargetNode, t.TargetGeneration, "")
					return nil
				})
				if !live {
					cancel(errTargetGone)
					return
				}
			}
		}
	}()
	opts := append(callOpts, callopt.WithRPCTimeout(s.opts.PullTimeout))
	reqs := make([]*peer.PullPutRequest, len(ts))
	for i, t := range ts {
		reqs[i] = &peer.PullPutRequest{Key: t.Key, PutId: t.PutID, Generation: t.TargetGeneration,
			TargetOffset: t.TargetOffset, Len: t.Len, SourceNodeId: t.SourceNode, SourceGeneration: t.SourceGeneration,
			SourceDataAddr: t.SourceDataAddr, SourceOffset: t.SourceOffset, MasterEpoch: s.epoch}
	}
	var results []*peer.PullPutResponse
	if len(ts) == 1 {
		var resp *peer.PullPutResponse
		if resp, err = c.PullPut(ctx, reqs[0], opts...); err == nil {
			results = []*peer.PullPutResponse{resp}
		}
	} else {
		var resp *peer.BatchPullPutResponse
		if resp, err = c.BatchPullPut(ctx, &peer.BatchPullPutRequest{Items: reqs}, opts...); err == nil {
			if err = wire.FromResponse(resp.Code, resp.Message); err == nil && len(resp.Results) != len(ts) {
				err = wire.Errorf(common.ErrorCode_INTERNAL, "BatchPullPut to node %q answered %d of %d items", t.TargetNode, len(resp.Results), len(ts))
			}
			if err != nil {
				fail(err, true) // the owner answered the call: it writes none of the ranges
				results = nil
			} else {
				results = resp.Results
			}
			err = nil
		}
	}
	close(done)
	wg.Wait()
	if err != nil {
		var app interface{ TypeID() int32 }
		switch {
		case errors.Is(context.Cause(ctx), errTargetGone):
			fail(errTargetGone, true) // PullDone sees the tomb too
		case errors.As(err, &app) && (app.TypeID() == remote.UnknownMethod || app.TypeID() == remote.UnknownService):
			// (A Kitex server that serves the service without the method says "unknown
			// service": it looks the service up by the method's name.)
			unknown = true
			fail(fmt.Errorf("node %q (%s) does not know the call: %w", t.TargetNode, t.TargetPeerAddr, err), true)
		default:
			// A call that never connected never reached the owner.
			fail(fmt.Errorf("PullPut to node %q (%s): %w", t.TargetNode, t.TargetPeerAddr, err), errors.Is(err, kerrors.ErrGetConnection))
		}
		return errs, answered, unknown
	}
	for i, r := range results {
		answered[i] = true
		if r == nil {
			errs[i] = wire.Errorf(common.ErrorCode_INTERNAL, "BatchPullPut to node %q answered item %d with nothing", t.TargetNode, i)
			continue
		}
		errs[i] = wire.FromResponse(r.Code, r.Message)
	}
	return errs, answered, false
}
