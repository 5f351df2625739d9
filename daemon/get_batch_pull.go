package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// A get batch often finds many of its values in one other owner's memory (an engine's
// pages of one prompt, put through one node). Pulled one by one, each value costs a
// round trip and a wake-up of both owners; pullBatch pulls all of one source's values
// with one pipelined PullMany (the source streams them back to back) before the
// batch's gets complete, each as a lone pull would: GetDone, or a revoke and a
// re-plan without that node when its pull failed.

// prePulled is one key of a batch whose value pullBatch pulled: own is the replica
// index's open of its target (replicas.go), err the pull's outcome; for a pull that
// succeeded, done and doneErr are its GetDone's answer (or the pinned target's error,
// as completeGet has it).
type prePulled struct {
	own     uint64
	err     error
	done    *mp.GetDoneResponse
	doneErr error
}

// finishPulled completes a pre-pulled get as pulled and completeGet would have: a failed
// pull revokes it, a completed one becomes its holder.
func (o *Owner) finishPulled(key string, plan *mp.GetStartResponse, pre *prePulled) (*holding, error) {
	if pre.err != nil {
		return o.pulled(key, plan, pre.err)
	}
	return o.gotDone(key, plan, pre.done, pre.doneErr)
}

// pullBatch pulls, one PullMany per source owner (sources concurrently), the values of
// the plans run names (of keys) that are to be pulled from another owner's memory, when a
// source has at least two of them; pre[j] is set for each key it pulled. A target
// outside the segment, a plan too old (planMaxAge) and a source's lone value are left
// to planGet. The pulls share one TransferTimeout: the batch was planned at once.
func (o *Owner) pullBatch(keys []string, starts []startedGet, run []int) (pre []*prePulled) {
	pre = make([]*prePulled, len(starts))
	groups := make(map[string][]int)
	for _, j := range run {
		p := starts[j].plan
		if p.Done || p.Source != common.Source_MEMORY || p.SourceNodeId == o.opts.NodeID ||
			p.TargetOffset < 0 || p.Len <= 0 || p.TargetOffset > o.seg.Size()-p.Len || time.Since(starts[j].at) > planMaxAge {
			continue
		}
		groups[p.SourceDataAddr] = append(groups[p.SourceDataAddr], j)
	}
	for addr, js := range groups {
		if len(js) < 2 {
			delete(groups, addr)
		}
	}
	if len(groups) == 0 {
		return pre
	}
	st := o.lock()
	for _, js := range groups {
		for _, j := range js {
			p := starts[j].plan
			pre[j] = &prePulled{own: st.replicas.open(p.TargetOffset, p.Len)}
		}
	}
	o.unlock()
	ctx, cancel := context.WithTimeout(context.Background(), o.opts.TransferTimeout)
	defer cancel()
	seg := o.seg.Bytes()
	var wg sync.WaitGroup
	for addr, js := range groups {
		wg.Go(func() {
			items := make([]transfer.PullItem, len(js))
			for k, j := range js {
				p := starts[j].plan
				items[k] = transfer.PullItem{
					Fence:  transfer.Fence{SourceNode: p.SourceNodeId, SourceGeneration: p.SourceGeneration, TransferID: p.GetId},
					Offset: p.SourceOffset,
					Dst:    seg[p.TargetOffset : p.TargetOffset+p.Len],
				}
			}
			for k, err := range o.puller.PullMany(ctx, addr, items) {
				pre[js[k]].err = err
			}
		})
	}
	wg.Wait()
	// The values that landed complete together: one BatchGetDone.
	var doneKeys []string
	var ids []int64
	var js []int
	for j, p := range pre {
		if p == nil || p.err != nil {
			continue
		}
		plan := starts[j].plan
		o.targetWritten(plan.GetId)
		if o.getPinned(plan.GetId) {
			p.doneErr = errGetMasterChanged()
			continue
		}
		doneKeys, ids, js = append(doneKeys, keys[j]), append(ids, plan.GetId), append(js, j)
	}
	if len(doneKeys) > 0 {
		for k, c := range o.getDoneMany(doneKeys, ids) {
			pre[js[k]].done, pre[js[k]].doneErr = c.resp, c.err
		}
	}
	return pre
}
