package master

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/cloudwego/kitex/pkg/kerrors"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// errTargetGone cancels a pull whose target owner incarnation was tombed (or
// re-registered) while it ran.
var errTargetGone = errors.New("target owner tombed or re-registered during the pull")

// pull runs one PullPut: the target owner pulls a pooled put from the requester's
// transfer area. It waits up to PullTimeout (the owner gives up after its own, shorter,
// transfer deadline); connecting to a dead owner fails within PeerConnectTimeout, and
// the call is cancelled when the target is tombed meanwhile. answered reports that the
// owner answered, or that nothing reached it, or that it was tombed: in each case it
// will not write the target range any more. A call that failed in transport leaves
// answered false.
func (s *Server) pull(t *PullTask) (err error, answered bool) {
	c, callOpts, err := s.peers.GetNode(t.TargetNode, t.TargetPeerAddr)
	if err != nil {
		return fmt.Errorf("PeerService client for %s: %w", t.TargetPeerAddr, err), true
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
	resp, err := c.PullPut(ctx, &peer.PullPutRequest{Key: t.Key, PutId: t.PutID, Generation: t.TargetGeneration,
		TargetOffset: t.TargetOffset, Len: t.Len, SourceNodeId: t.SourceNode, SourceGeneration: t.SourceGeneration,
		SourceDataAddr: t.SourceDataAddr, SourceOffset: t.SourceOffset, MasterEpoch: s.epoch}, append(callOpts, callopt.WithRPCTimeout(s.opts.PullTimeout))...)
	close(done)
	wg.Wait()
	if err != nil {
		if errors.Is(context.Cause(ctx), errTargetGone) {
			return errTargetGone, true // PullDone sees the tomb too
		}
		// A call that never connected never reached the owner.
		return fmt.Errorf("PullPut to node %q (%s): %w", t.TargetNode, t.TargetPeerAddr, err), errors.Is(err, kerrors.ErrGetConnection)
	}
	return wire.FromResponse(resp.Code, resp.Message), true
}
