package daemon

import (
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// reportReplicas tells a master that does not know this owner (it restarted) what the
// replica index and the SSD ring hold, in batches of REPORT_BATCH records, so the new
// master rebuilds its routes instead of starting empty. Whatever the master does not
// adopt — refused, or left unsent because a call failed — is forgotten here: the owner
// keeps no record the master does not know, so a later delete or overwrite, which
// reaches the owners the master knows to hold the key, can never miss one.
//
// Each batch is one call bounded by MasterTimeout (a large index takes longer than the
// registration's own bound).
func (o *Owner) reportReplicas() {
	t0 := time.Now()
	o.mu.Lock()
	mem := o.replicas.records()
	o.mu.Unlock()
	var onSSD []replicaRecord
	if o.store != nil {
		for _, e := range o.store.Committed() {
			onSSD = append(onSSD, replicaRecord{key: e.Key, putID: e.PutID, len: e.Length})
		}
	}
	total := len(mem) + len(onSSD)
	recs := make([]*mp.ReplicaRecord, 0, total)
	for _, r := range mem {
		recs = append(recs, &mp.ReplicaRecord{Key: r.key, PutId: r.putID, Len: r.len, Memory: true, Offset: r.offset})
	}
	for _, r := range onSSD {
		recs = append(recs, &mp.ReplicaRecord{Key: r.key, PutId: r.putID, Len: r.len, Ssd: true})
	}
	record := func(i int) replicaRecord {
		if i < len(mem) {
			return mem[i]
		}
		return onSSD[i-len(mem)]
	}
	refuse := func(i int) {
		r := record(i)
		if i < len(mem) {
			o.replicas.forget(r)
		} else {
			o.store.Forget(r.key, r.putID)
		}
	}
	adopted := 0
	batch := int(mp.REPORT_BATCH)
	// The last batch says so (an empty index sends one empty batch): until then the
	// master places no other owner's put here.
	for start := 0; start == 0 || start < total; start += batch {
		end := min(start+batch, total)
		ctx, cancel := o.master.ctx()
		resp, err := o.master.cl().ReportReplicas(ctx, &mp.ReportReplicasRequest{Node: o.master.ref, Records: recs[start:end], Last: end == total})
		cancel()
		if err == nil && resp.Code != common.ErrorCode_OK {
			err = errCode(resp.Code, "%s", resp.Message)
		}
		o.mu.Lock()
		if err != nil {
			for i := start; i < total; i++ {
				refuse(i)
			}
			o.mu.Unlock()
			o.log.Warn().Err(err).Int("reported", start).Int("records", total).Int("adopted", adopted).
				Msg("replica report failed; the unreported records are forgotten")
			o.endReport()
			return
		}
		for _, i := range resp.Rejected {
			if int(i) >= 0 && int(i) < end-start {
				refuse(start + int(i))
			}
		}
		o.mu.Unlock()
		adopted += end - start - len(resp.Rejected)
		if total > batch { // a long report shows its progress
			o.log.Info().Int("reported", end).Int("records", total).Int("adopted", adopted).Msg("replica report progress")
		}
	}
	o.log.Info().Int("memory", len(mem)).Int("ssd", len(onSSD)).Int("adopted", adopted).Int("refused", total-adopted).
		Dur("took", time.Since(t0)).Msg("replica index reported to the new master")
}

// endReport tells the master, after a report failed, that nothing more comes (an empty
// last batch): it allocates in this owner's pool again at once instead of at the end
// of its rebuild window. Best effort: a master that lost this owner or no longer leads
// needs nothing.
func (o *Owner) endReport() {
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().ReportReplicas(ctx, &mp.ReportReplicasRequest{Node: o.master.ref, Last: true})
	if err == nil && resp.Code != common.ErrorCode_OK {
		err = errCode(resp.Code, "%s", resp.Message)
	}
	if err != nil {
		o.log.Warn().Err(err).Msg("could not end the failed replica report; the master allocates here again when its rebuild window ends")
	}
}

// forgetReplicas drops the replica index and the SSD ring's entries: the master they
// were registered with forgot them.
func (o *Owner) forgetReplicas(why string) {
	o.mu.Lock()
	n := o.replicas.len()
	o.replicas.reset()
	o.mu.Unlock()
	dropped := 0
	if o.store != nil {
		for _, e := range o.store.Committed() {
			if o.store.Forget(e.Key, e.PutID) {
				dropped++
			}
		}
	}
	o.log.Warn().Str("why", why).Int("memory", n).Int("ssd", dropped).Msg("replica index forgotten")
}

// applyEvictions drops the records of memory replicas the master evicted, and the SSD
// entries it no longer routes to.
func (o *Owner) applyEvictions(evicted, ssdDropped []*common.KeyVersion) {
	o.mu.Lock()
	for _, e := range evicted {
		if e != nil {
			o.replicas.drop(e.Key, e.PutId)
		}
	}
	o.mu.Unlock()
	if o.store != nil {
		for _, e := range ssdDropped {
			if e != nil {
				o.store.Forget(e.Key, e.PutId)
			}
		}
	}
}
