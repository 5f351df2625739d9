package daemon

import (
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/ssd"
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
	st := o.lock()
	st.reg.reports++ // before the SSD ring's entries are listed (commitPersisted)
	mem := st.replicas.records()
	o.unlock()
	var onSSD []replicaRecord
	if o.store != nil {
		for _, e := range o.store.Settled() { // a record whose commit is still out is the commit's (commitPersisted)
			onSSD = append(onSSD, replicaRecord{key: e.Key, putID: e.PutID, len: e.Length, seq: e.Seq})
		}
	}
	rep := newReplicaReport(mem, onSSD, int(mp.REPORT_BATCH))
	total, recs := len(rep.recs), rep.recs
	refuse := rep.refuse
	adopted := 0
	for _, b := range rep.batches() {
		start, end := b[0], b[1]
		ctx, cancel := o.master.ctx()
		resp, err := o.master.cl().ReportReplicas(ctx, &mp.ReportReplicasRequest{Node: o.master.ref(), Records: recs[start:end], Last: end == total})
		cancel()
		if err == nil && resp.Code != common.ErrorCode_OK {
			err = errCode(resp.Code, "%s", resp.Message)
		}
		lost := err != nil && resp == nil // failed in transport: the master may have adopted the batch
		st := o.lock()
		if err != nil {
			for i := start; i < total; i++ {
				refuse(st, i)
			}
			o.unlock()
			o.log.Warn().Err(err).Int("reported", start).Int("records", total).Int("adopted", adopted).
				Msg("replica report failed; the unreported records are forgotten")
			if lost {
				o.unreportSSD(rep.ssdIn(start, end))
			}
			o.endReport()
			return
		}
		for _, i := range resp.Rejected {
			if int(i) >= 0 && int(i) < end-start {
				refuse(st, start+int(i))
			}
		}
		o.unlock()
		adopted += end - start - len(resp.Rejected)
		if total > rep.batch { // a long report shows its progress
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
	resp, err := o.master.cl().ReportReplicas(ctx, &mp.ReportReplicasRequest{Node: o.master.ref(), Last: true})
	if err == nil && resp.Code != common.ErrorCode_OK {
		err = errCode(resp.Code, "%s", resp.Message)
	}
	if err != nil {
		o.log.Warn().Err(err).Msg("could not end the failed replica report; the master allocates here again when its rebuild window ends")
	}
}

// unreportSSD tells the master the SSD entries of a report batch whose call failed in
// transport are gone (they were forgotten here): the batch may have landed and only its
// answer been lost, and the master would then route gets to (and count) records this
// owner no longer has. They go as a ring's evictions do, through the queue that sends
// them until the master takes them (it refuses them while the owner reports: its last
// batch, or endReport, ends that); an entry the master did not adopt is ignored.
func (o *Owner) unreportSSD(entries []ssd.Eviction) {
	o.evictQ.add(entries)
}

// forgetSSD drops the SSD ring's entries: the master they were registered with forgot
// them (ownerState.endRegister dropped the replica index already).
func (o *Owner) forgetSSD(why string) {
	st := o.lock()
	st.reg.reports++ // a commit out now forgets its record too (commitPersisted)
	o.unlock()
	dropped := 0
	if o.store != nil {
		for _, e := range o.store.Committed() {
			// (The record listed, not the key's: a record of the version committed
			// since, which the new master may have asked for, stays.)
			if o.store.ForgetRecord(e.Key, e.Seq) {
				dropped++
			}
		}
	}
	o.log.Warn().Str("why", why).Int("ssd", dropped).Msg("replica index and SSD entries forgotten")
}

// replicaReport is one report of the replica index (mem) and the SSD ring's entries
// (ssd) to a new master, as wire records cut in batches of batch.
type replicaReport struct {
	mem, ssd []replicaRecord
	recs     []*mp.ReplicaRecord
	batch    int
}

func newReplicaReport(mem, ssd []replicaRecord, batch int) *replicaReport {
	r := &replicaReport{mem: mem, ssd: ssd, batch: batch, recs: make([]*mp.ReplicaRecord, 0, len(mem)+len(ssd))}
	for _, x := range mem {
		rec := &mp.ReplicaRecord{Key: x.key, PutId: x.putID, Len: x.len, Memory: true, Offset: x.offset}
		if x.page {
			rec.Parent = &x.parent
		}
		r.recs = append(r.recs, rec)
	}
	for _, x := range ssd {
		r.recs = append(r.recs, &mp.ReplicaRecord{Key: x.key, PutId: x.putID, Len: x.len, Ssd: true, RecordSeq: x.seq})
	}
	return r
}

// batches are the [start, end) record ranges of the report's calls: at most batch
// records, their keys and parents within a master call's bytes (partsOf): REPORT_BATCH
// records of the longest key and parent (wire.MaxKeyBytes each) would not fit a frame,
// and the master would refuse the call. The last batch says so
// (ReportReplicasRequest.last; an empty report sends one empty batch): until then the
// master places no other owner's put here.
func (r *replicaReport) batches() [][2]int {
	var out [][2]int
	start := 0
	for part := range partsOf(r.recs, r.batch, func(rec *mp.ReplicaRecord) int { return len(rec.Key) + len(rec.GetParent()) }) {
		out = append(out, [2]int{start, start + len(part)})
		start += len(part)
	}
	if out == nil {
		out = [][2]int{{0, 0}}
	}
	return out
}

// ssdIn is the SSD entries among records [start, end).
func (r *replicaReport) ssdIn(start, end int) []ssd.Eviction {
	var out []ssd.Eviction
	for i := max(start, len(r.mem)); i < end; i++ {
		x := r.ssd[i-len(r.mem)]
		out = append(out, ssd.Eviction{Key: x.key, PutID: x.putID, Seq: x.seq})
	}
	return out
}

// refuse forgets record i, which the master did not adopt (rejected, or left unsent):
// a memory record leaves the replica index, an SSD entry the ring.
func (r *replicaReport) refuse(st *ownerState, i int) {
	if i < len(r.mem) {
		st.replicas.forget(r.mem[i])
		return
	}
	x := r.ssd[i-len(r.mem)]
	// That record only: a rewrite of the version since (a write-back the new master
	// assigned and published before this batch came) lives on, and the master routes to it.
	st.fx.ssdForgetRecords = append(st.fx.ssdForgetRecords, ssd.Eviction{Key: x.key, PutID: x.putID, Seq: x.seq})
}

// deref is *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
