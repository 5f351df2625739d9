package daemon

import (
	"context"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// ssdInfo is what the owner declares about its SSD tier at Register and Heartbeat.
func (o *Owner) ssdInfo() *mp.KvSsdStorageInfo {
	if o.store == nil {
		return &mp.KvSsdStorageInfo{}
	}
	st := o.store.Stats()
	return &mp.KvSsdStorageInfo{Enabled: true, CapacityBytes: st.CapacityBytes, UsedBytes: st.UsedBytes}
}

// persist writes the memory replica of key@putID to the local SSD ring and commits it
// at the master; the commit pin keeps the SSD entry from being overwritten until the
// master answered. The master keeps the memory range alive meanwhile. A replica on
// another owner (the SSD pool, docs/architecture.md §10) is pulled over the data plane straight into
// the SSD record's buffer first.
func (o *Owner) persist(req *peer.SsdReplicaPersistRequest) error {
	if o.store == nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "this owner has no SSD tier")
	}
	if req.Generation != o.generation {
		return errCode(common.ErrorCode_STALE_GENERATION, "persist for generation %d, this owner is %d", req.Generation, o.generation)
	}
	if err := wire.ValidateKey(req.Key); err != nil {
		return err
	}
	if !o.useSegment() {
		return errCode(common.ErrorCode_UNAVAILABLE, "owner %q is shutting down", o.opts.NodeID)
	}
	defer o.doneSegment()
	epoch := o.regEpoch()
	var pin ssd.CommitPin
	var err error
	if req.SourceNodeId == "" || req.SourceNodeId == o.opts.NodeID {
		if req.Offset < 0 || req.Len <= 0 || req.Offset+req.Len > o.seg.Size() {
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "range [%d,+%d) outside the segment", req.Offset, req.Len)
		}
		pin, err = o.store.Persist(req.Key, req.PutId, o.seg.Bytes()[req.Offset:req.Offset+req.Len])
	} else {
		if c := o.store.Stats().CapacityBytes; req.Offset < 0 || req.Len <= 0 || req.Len > c {
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "persist of [%d,+%d) from node %q: this SSD tier holds %d bytes", req.Offset, req.Len, req.SourceNodeId, c)
		}
		f := transfer.Fence{SourceNode: req.SourceNodeId, SourceGeneration: req.SourceGeneration, TransferID: req.PutId}
		ctx, cancel := context.WithTimeout(context.Background(), o.opts.TransferTimeout)
		pin, err = o.store.PersistFrom(req.Key, req.PutId, req.Len, func(dst []byte) error {
			return o.puller.Pull(ctx, req.SourceDataAddr, f, req.Offset, dst)
		})
		cancel()
	}
	if err != nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "SSD persist: %v", err)
	}
	defer pin.Release()
	if o.regEpoch() != epoch {
		// The owner registered with another master while the replica was read: that
		// master never retained the source range for this persist and may have handed
		// it out meanwhile, so the bytes read may not be the value's.
		o.store.Forget(req.Key, req.PutId)
		return errCode(common.ErrorCode_UNAVAILABLE, "the owner registered with another master during the SSD persist")
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().SsdReplicaCommit(ctx, &mp.SsdReplicaCommitRequest{Node: o.master.ref, Key: req.Key, PutId: req.PutId, Len: req.Len})
	if err := o.master.check(respCode(resp, err)); err != nil {
		// The master may not know this entry: keep none it might not know (a later
		// delete would not reach it, and a restarted master would adopt it). If the
		// commit did land, a get finds the entry gone and drops that replica.
		o.store.Forget(req.Key, req.PutId)
		return err
	}
	if !resp.Published {
		// The version died while it was written (deleted, overwritten, node tombed):
		// the entry must not hold ring space nor count as used.
		o.store.Forget(req.Key, req.PutId)
	}
	return nil
}

// forwardEvictions reports SSD ring evictions to the master in the storage's batches.
func (o *Owner) forwardEvictions() {
	defer o.wg.Done()
	for batch := range o.store.Evictions() {
		entries := make([]*common.KeyVersion, len(batch))
		for i, e := range batch {
			entries[i] = &common.KeyVersion{Key: e.Key, PutId: e.PutID}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := o.master.cl().BatchSsdReplicaEvict(ctx, &mp.BatchSsdReplicaEvictRequest{Node: o.master.ref, Entries: entries})
		cancel()
		if err := o.master.check(respCode(resp, err)); err != nil {
			// A master that lost us forgot these routes anyway; an unreachable one will
			// find a failed read (ErrNotFound) and drop the replica then.
			o.log.Warn().Err(err).Int("entries", len(entries)).Msg("SSD eviction report failed")
		}
	}
}
