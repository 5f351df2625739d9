package master

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fluxkv/fluxkv/internal/workers"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// The batch forms of the per-key calls (master.thrift, BATCH): one round trip serves a
// client batch of an owner. Each item is answered exactly as its per-key call would be
// (the same State method under the lock, the same waits for space); one item's failure
// never fails the others. The response code is not OK only when no item was evaluated:
// more than BATCH items, an unknown or tombed node, a shut gate.

// batchPutDoneParallel bounds the items of one BatchPutDone published at once: each may
// wait for a pull by another owner (a put placed there), which the master runs outside
// its lock.
const batchPutDoneParallel = int(mp.BATCH_PUT_DONE_PARALLEL)

// checkBatch refuses a batch no item of which can be evaluated.
func (h *handler) checkBatch(node *mp.NodeRef, n int) error {
	if n > int(mp.BATCH) {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "%d items in one batch; at most %d", n, mp.BATCH)
	}
	return h.s.withState(func(st *State) error {
		_, err := st.nodeLocked(ref(node))
		return err
	})
}

// spaceWait bounds the waits for space of a whole batch by one Options.AllocWait, as
// for one per-key call: past it, the items still short of space fail NO_SPACE at once
// instead of each waiting its own AllocWait (the owner's call would time out first).
//
// The bound goes on the context the waits end with (waitContext): an in-process call's
// is its caller's, which the handler's context only carries, so a bound on the handler's
// alone was never read there, and each short key waited its own AllocWait until the
// owner's call timed out (a review).
func (h *handler) spaceWait(ctx context.Context) (context.Context, context.CancelFunc) {
	wait := waitContext(ctx)
	bounded, cancel := context.WithTimeout(wait, h.s.opts.AllocWait)
	if wait != ctx {
		return context.WithValue(ctx, callerKey{}, bounded), cancel
	}
	return bounded, cancel
}

func (h *handler) BatchGetStart(ctx context.Context, req *mp.BatchGetStartRequest) (*mp.BatchGetStartResponse, error) {
	resp := &mp.BatchGetStartResponse{}
	err := h.checkBatch(req.Node, len(req.Keys))
	if err == nil {
		err = h.applyAcks(req.Node, req.Acks)
	}
	if err == nil {
		ctx, cancel := h.spaceWait(ctx)
		defer cancel()
		resp.Results = make([]*mp.GetStartResponse, len(req.Keys))
		// The keys the requester has a memory replica of first, under one hold of the
		// lock: each is reused at once (its holder recorded; no room taken), and held
		// that way it is passed over by the evictions that make room for the batch's
		// other keys. In key order, a target made room for before them could evict those
		// very replicas (the oldest of a full pool) and fail the keys KEY_NOT_FOUND.
		h.s.withState(func(st *State) error { // a shut gate answers every key below
			now := time.Now()
			for i, k := range req.Keys {
				if st.localReplicaLocked(ref(req.Node), k) {
					resp.Results[i] = getStartResponse(st.GetStartAs(now, ref(req.Node), k, nil, holderIDOf(req, i)))
				}
			}
			return nil
		})
		// A key whose target cannot fit in the requester's segment (pool, landing and
		// transfer areas) beside the ranges this call already holds there (the replicas
		// reused above, the targets planned), were every other range free, does not wait
		// for room: only its own batch holds it, until the client releases the batch's
		// holders. It makes its attempts at once and fails NO_SPACE if they find none.
		// The ranges the batch holds already that the owner answered without this call
		// count too (held_bytes).
		own := max(req.HeldBytes, 0)
		reused := make(map[int64]bool)
		for _, r := range resp.Results {
			if r != nil && r.Code == common.ErrorCode_OK && !reused[r.TargetOffset] {
				reused[r.TargetOffset] = true
				own += roundUp(r.Len, AllocGranule)
			}
		}
		for i, k := range req.Keys {
			if resp.Results[i] == nil {
				kctx := ctx
				if h.outgrowsSegment(req.Node, k, own) {
					kctx = doneContext
				}
				r := h.getStart(kctx, req.Node, k, nil, holderIDOf(req, i))
				if r.Code == common.ErrorCode_OK && !reused[r.TargetOffset] {
					reused[r.TargetOffset] = true
					own += roundUp(r.Len, AllocGranule)
				}
				resp.Results[i] = r
			}
		}
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) BatchGetDone(ctx context.Context, req *mp.BatchGetDoneRequest) (*mp.BatchGetDoneResponse, error) {
	resp := &mp.BatchGetDoneResponse{}
	err := h.checkBatch(req.Node, len(req.Items))
	if err == nil {
		resp.Results = make([]*mp.GetDoneResponse, len(req.Items))
		for i, it := range req.Items {
			if it == nil {
				resp.Results[i] = &mp.GetDoneResponse{Code: common.ErrorCode_INVALID_ARGUMENT, Message: "null item"}
				continue
			}
			resp.Results[i] = h.getDone(req.Node, it.Key, it.GetId)
		}
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

// BatchExists evaluates the keys under one hold of the lock; with prefix it stops
// after the first absent key (or the first failed one).
func (h *handler) BatchExists(ctx context.Context, req *mp.BatchExistsRequest) (*mp.BatchExistsResponse, error) {
	resp := &mp.BatchExistsResponse{}
	err := h.checkBatch(req.Node, len(req.Keys))
	if err == nil {
		err = h.s.withState(func(st *State) error {
			resp.Results = make([]*mp.ExistsResponse, 0, len(req.Keys))
			for _, k := range req.Keys {
				r := &mp.ExistsResponse{}
				var err error
				r.Exists, err = st.Exists(ref(req.Node), k)
				r.Code, r.Message = wire.ToResponse(err)
				resp.Results = append(resp.Results, r)
				if req.Prefix && !r.Exists {
					break
				}
			}
			return nil
		})
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) BatchDelete(ctx context.Context, req *mp.BatchDeleteRequest) (*mp.BatchDeleteResponse, error) {
	resp := &mp.BatchDeleteResponse{}
	err := h.checkBatch(req.Node, len(req.Keys))
	if err == nil {
		resp.Results = make([]*mp.DeleteResponse, len(req.Keys))
		for i, k := range req.Keys {
			resp.Results[i] = h.delete(req.Node, k)
		}
		err = h.s.writeQuiet(ctx)
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

// BatchPutStart makes every item's first attempt in order under one hold of the lock
// (the first attempt of withSpace: sparing held copies); an item short of space then
// waits for it as its per-key call would, the batch's waits bounded by spaceWait.
func (h *handler) BatchPutStart(ctx context.Context, req *mp.BatchPutStartRequest) (*mp.BatchPutStartResponse, error) {
	resp := &mp.BatchPutStartResponse{}
	err := h.checkBatch(req.Node, len(req.Items))
	if err == nil {
		err = h.applyAcks(req.Node, req.Acks)
	}
	if err == nil {
		ctx, cancel := h.spaceWait(ctx)
		defer cancel()
		n := len(req.Items)
		resp.Results = make([]*mp.PutStartResponse, n)
		plans, errs := make([]PutPlan, n), make([]error, n)
		_, gateErr := h.s.withSpare(true, func(st *State) error { // withSpace's first attempt
			now := time.Now()
			for i, it := range req.Items {
				if it != nil {
					plans[i], errs[i] = st.PutStart(now, ref(req.Node), it.Key, it.Len, it.RejectIfExists, it.Parent)
				}
			}
			return nil
		})
		for i, it := range req.Items {
			switch {
			case it == nil:
				resp.Results[i] = &mp.PutStartResponse{Code: common.ErrorCode_INVALID_ARGUMENT, Message: "null item"}
			case gateErr != nil:
				resp.Results[i] = putStartResponse(PutPlan{}, gateErr)
			case errors.Is(errs[i], wire.ErrNoSpace): // the waits for space of a per-key call
				resp.Results[i] = h.putStart(ctx, req.Node, it.Key, it.Len, it.RejectIfExists, it.Parent)
			default:
				resp.Results[i] = putStartResponse(plans[i], errs[i])
			}
		}
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

// pullTargets groups the items pulls (indexes of results whose Pull is set) by their
// target owner incarnation, each group in item order and of at most
// PULL_PUT_BATCH_ITEMS (one BatchPullPut), the groups in the order of their first item.
func pullTargets(results []PutResult, pulls []int) [][]int {
	type target struct {
		node string
		gen  int64
	}
	at := make(map[target]int)
	var groups [][]int
	for _, i := range pulls {
		t := target{results[i].Pull.TargetNode, results[i].Pull.TargetGeneration}
		g, ok := at[t]
		if !ok || len(groups[g]) == int(peer.PULL_PUT_BATCH_ITEMS) {
			g = len(groups)
			at[t] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// BatchPutDone publishes the items in order under one hold of the lock (State.PutDone,
// as PutDone does for each), then finishes them as PutDone does: the items done at once
// (local puts, the common case, and failures) with their invalidations sent together (one
// message per owner) before their persists are queued; the puts placed on other owners,
// whose pulls run outside the lock: one call per target owner (BatchPullPut: the target
// pulls them back to back), at most batchPutDoneParallel targets at once, their
// PullDones under one hold of the lock (whether or not the gate is open: a pull that
// ended must end its put, or its ranges stay taken), and then each finished as PutDone
// does; the puts placed again after a failed pull are pulled in a next round, grouped by
// their new targets. It waits out the write quiet period once.
func (h *handler) BatchPutDone(ctx context.Context, req *mp.BatchPutDoneRequest) (*mp.BatchPutDoneResponse, error) {
	resp := &mp.BatchPutDoneResponse{}
	err := h.checkBatch(req.Node, len(req.Items))
	if err == nil {
		n := len(req.Items)
		resp.Results = make([]*mp.PutDoneResponse, n)
		results, errs := make([]PutResult, n), make([]error, n)
		gateErr := h.s.withState(func(st *State) error {
			now := time.Now()
			for i, it := range req.Items {
				if it != nil {
					results[i], errs[i] = st.PutDone(now, ref(req.Node), it.Key, it.PutId)
				}
			}
			return nil
		})
		var pulls []int
		var invs []Invalidation // of the items done now: sent together, one message per owner
		var persists []*PersistTask
		for i, it := range req.Items {
			switch {
			case it == nil:
				resp.Results[i] = &mp.PutDoneResponse{Code: common.ErrorCode_INVALID_ARGUMENT, Message: "null item"}
				continue
			case gateErr != nil:
				errs[i] = gateErr
			case errs[i] == nil && results[i].Pull != nil:
				pulls = append(pulls, i)
				continue
			}
			invs = append(invs, results[i].Invalidations...)
			persists = append(persists, results[i].Persist)
			resp.Results[i] = putDoneResponse(errs[i])
		}
		if ierr := h.s.invalidate(invs); ierr != nil {
			for i, r := range resp.Results { // published, but the term lapsed meanwhile: outcome unknown
				if r != nil && r.Code == common.ErrorCode_OK {
					resp.Results[i] = putDoneResponse(ierr)
				}
			}
		}
		for _, t := range persists {
			h.s.persist.submit(t)
		}
		// Rounds of pulls: a put placed again after a failed pull goes to its new target
		// with the others placed there in the same round.
		for len(pulls) > 0 {
			var mu sync.Mutex
			var again []int
			targets := pullTargets(results, pulls)
			workers.ForEach(len(targets), batchPutDoneParallel, func(g int) {
				is := targets[g]
				ts := make([]*PullTask, len(is))
				for k, i := range is {
					ts[k] = results[i].Pull
				}
				pullErrs, answered := h.s.pullMany(ts)
				h.s.locked(func(st *State) error { // ends of pulls: not the gate's (Server.locked)
					now := time.Now()
					for k, i := range is {
						results[i], errs[i] = st.PullDone(now, ts[k].PutID, pullErrs[k], answered[k])
					}
					return nil
				})
				for _, i := range is {
					if errs[i] == nil && results[i].Pull != nil {
						mu.Lock()
						again = append(again, i)
						mu.Unlock()
						continue
					}
					resp.Results[i] = h.finishPutDone(results[i], errs[i])
				}
			})
			slices.Sort(again)
			pulls = again
		}
		err = h.s.writeQuiet(ctx)
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

// outgrowsSegment reports whether a target for key, beside own bytes the batch holds in
// the requester's segment, would exceed every area a get's target may take (its pool,
// landing and transfer areas) together.
func (h *handler) outgrowsSegment(node *mp.NodeRef, key string, own int64) bool {
	out := false
	h.s.withState(func(st *State) error {
		n, err := st.reportedNodeLocked(ref(node))
		if r := st.routes[key]; err == nil && r != nil && r.memoryReplica(n) == nil {
			room := n.alloc.Capacity()
			for _, a := range []*Allocator{n.landing, n.xfer} {
				if a != nil {
					room += a.Capacity()
				}
			}
			out = own+roundUp(r.len, AllocGranule) > room
		}
		return nil
	})
	return out
}

// doneContext is a context already done: a wait for space under it makes its attempts
// at once.
var doneContext = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// holderIDOf is the holder id the requester chose for its i-th key (0: none).
func holderIDOf(req *mp.BatchGetStartRequest, i int) int64 {
	if i < len(req.HolderIds) {
		return req.HolderIds[i]
	}
	return 0
}
