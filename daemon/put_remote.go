package daemon

import (
	"context"
	"fmt"
	"sync"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// pullPuts serves the master's PullPut and BatchPullPut: puts placed on this owner by
// other ones (pooled placement, docs/architecture.md §10). This owner pulls each value
// from its requester's transfer area straight into the target range the master
// allocated in this segment, the values of one source with one pipelined PullMany
// (one deadline: TransferTimeout), and answers once every value's bytes are in or its
// pull failed: errs[i] is reqs[i]'s outcome. Only this process writes its segment, and
// never after answering (the master frees or publishes the ranges then).
func (o *Owner) pullPuts(ctx context.Context, reqs []*peer.PullPutRequest) (errs []error) {
	errs = make([]error, len(reqs))
	for i, req := range reqs {
		switch {
		case req == nil:
			errs[i] = errCode(common.ErrorCode_INVALID_ARGUMENT, "null PullPut item")
		case req.Len <= 0 || req.TargetOffset < 0 || req.TargetOffset > o.seg.Size()-req.Len:
			errs[i] = errCode(common.ErrorCode_INVALID_ARGUMENT, "PullPut target [%d,+%d) outside the %d-byte segment", req.TargetOffset, req.Len, o.seg.Size())
		}
	}
	if !o.useSegment() {
		for i, err := range errs {
			if err == nil {
				errs[i] = errCode(common.ErrorCode_UNAVAILABLE, "owner %q is shutting down", o.opts.NodeID)
			}
		}
		return errs
	}
	defer o.doneSegment()
	writes := make([]*segmentWrite, len(reqs))
	bySource := make(map[string][]int)
	st := o.lock()
	for i, req := range reqs {
		if errs[i] == nil {
			// Under the lock, as a registration switches the generation: a pull begun
			// before it is among the ranges that registration pins.
			errs[i] = o.checkNodeGen("PullPut", req.Generation)
		}
		if errs[i] == nil {
			if writes[i], errs[i] = st.beginPull(req); errs[i] == nil {
				bySource[req.SourceDataAddr] = append(bySource[req.SourceDataAddr], i)
			}
		}
	}
	o.unlock()
	pctx, cancel := context.WithTimeout(ctx, o.bounds().pullPut)
	defer cancel()
	seg := o.seg.Bytes()
	var wg sync.WaitGroup
	for addr, is := range bySource {
		wg.Go(func() {
			items := make([]transfer.PullItem, len(is))
			for k, i := range is {
				req := reqs[i]
				items[k] = transfer.PullItem{
					Fence:  transfer.Fence{SourceNode: req.SourceNodeId, SourceGeneration: req.SourceGeneration, TransferID: req.PutId},
					Offset: req.SourceOffset,
					Dst:    seg[req.TargetOffset : req.TargetOffset+req.Len],
				}
			}
			for k, err := range o.puller.PullMany(pctx, addr, items) {
				errs[is[k]] = err
			}
		})
	}
	wg.Wait()
	st = o.lock()
	for i, t := range writes {
		if t != nil {
			if perr := st.endPull(t); perr != nil {
				errs[i] = perr
			}
		}
	}
	o.unlock()
	for i, t := range writes {
		if t != nil && errs[i] != nil {
			req := reqs[i]
			errs[i] = errCode(common.ErrorCode_UNAVAILABLE, "%s", fmt.Sprintf("pull of put %d from node %q (%s): %v", req.PutId, req.SourceNodeId, req.SourceDataAddr, errs[i]))
		}
	}
	return errs
}

// pullPut serves one PullPut (pullPuts).
func (o *Owner) pullPut(ctx context.Context, req *peer.PullPutRequest) error {
	return o.pullPuts(ctx, []*peer.PullPutRequest{req})[0]
}

// beginPull registers the target of the master's PullPut in segmentWrites (kind
// writePull) before a byte is pulled into it, and opens its range in the replica
// index (the master placed a new value there). It is refused while a registration is
// out — the master the call came from may be deposed by it, whose pins are already
// collected: writing now could hit a range the new master hands out (the master places
// the put again) — and when the call's master is older than the registered one (a whole
// registration may have run since the handler admitted it).
func (st *ownerState) beginPull(req *peer.PullPutRequest) (*segmentWrite, error) {
	if st.reg.registering {
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "owner %q is registering with a master; place the put again", st.nodeID)
	}
	if err := st.admit(req.MasterEpoch); err != nil {
		return nil, err
	}
	st.replicas.open(req.TargetOffset, req.Len)
	return st.writes.add(writePull, req.PutId, req.TargetOffset, req.Len), nil
}

// endPull ends a PullPut target once nothing writes it. When the owner registered
// with another master meanwhile, that master holds the range as a pin until this ack:
// the range was written, the calling master is gone, and the pull fails.
func (st *ownerState) endPull(t *segmentWrite) error {
	st.writes.remove(t)
	if t.pinned {
		st.ack(t.id)
		return fmt.Errorf("the owner registered with another master during the pull")
	}
	return nil
}
