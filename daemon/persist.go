package daemon

import (
	"context"
	"fmt"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/internal/workers"
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
	return &mp.KvSsdStorageInfo{Enabled: true, CapacityBytes: st.CapacityBytes, UsedBytes: st.UsedBytes,
		MaxValueBytes: o.store.MaxValueBytes()}
}

// persistMany serves BatchSsdReplicaPersist (docs/architecture.md §4 put step 3): it writes
// each item's memory replica to the local SSD ring (values of its own segment in write
// runs of up to ssd.PersistRunBytes, one IO each; PERSIST_BATCH_IN_FLIGHT runs or pulled
// values at a time) and commits the written ones with one master BatchSsdReplicaCommit; a commit pin keeps each
// SSD entry from being overwritten until the master answered. The master keeps the memory
// ranges alive meanwhile. A replica on another owner (the SSD pool, docs/architecture.md §10)
// is pulled over the data plane straight into its SSD record's buffer first. It returns
// one answer per item (nil: persisted and published, or the version died meanwhile and
// the entry was dropped), or err for the whole call.
func (o *Owner) persistMany(items []*peer.SsdReplicaPersistRequest) ([]error, error) {
	if n := len(items); n > int(peer.PERSIST_BATCH_ITEMS) {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT, "batch persist of %d values, at most %d", n, peer.PERSIST_BATCH_ITEMS)
	}
	if o.store == nil {
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "this owner has no SSD tier")
	}
	if !o.useSegment() {
		return nil, errCode(common.ErrorCode_UNAVAILABLE, "owner %q is shutting down", o.opts.NodeID)
	}
	defer o.doneSegment()
	readBy := time.Now().Add(o.bounds().persistRead)
	errs := make([]error, len(items))
	weight := func(req *peer.SsdReplicaPersistRequest) int64 {
		switch {
		case req == nil:
			return 0
		case req.Len <= 0 || req.Len > o.persistPins.size:
			return o.persistPins.size // refused by checkPersist, or a group of its own
		}
		return o.persistPinWeight(req)
	}
	for lo := 0; lo < len(items); {
		hi, bytes := lo+1, weight(items[lo])
		for hi < len(items) && bytes+weight(items[hi]) <= o.persistPins.size {
			bytes += weight(items[hi])
			hi++
		}
		// A group waits until the entries of other calls not yet committed leave it room
		// (they are committed without waiting for anything but their writes).
		w := min(bytes, o.persistPins.size)
		if err := o.persistPins.Acquire(context.Background(), w); err != nil {
			return nil, err
		}
		func() {
			defer o.persistPins.Release(w)
			copy(errs[lo:hi], o.persistGroup(items[lo:hi], readBy))
		}()
		lo = hi
	}
	return errs, nil
}

// persistGroup writes and commits items (persistMany), one answer per item. Written
// records are committed as their jobs finish (one BatchSsdReplicaCommit at a time, for
// every job written since the last), not after the group's last job: a record's commit
// pin blocks its ring once the ring's head comes round to it, so it must not wait for
// a slow job of the same group (a pull from another owner may take TransferTimeout,
// and the group runs its jobs PERSIST_BATCH_IN_FLIGHT at a time).
func (o *Owner) persistGroup(items []*peer.SsdReplicaPersistRequest, readBy time.Time) []error {
	st := o.lock()
	epoch, reports := st.reg.epoch, st.reg.reports
	o.unlock()
	errs := make([]error, len(items))
	pins := make([]ssd.CommitPin, len(items))
	jobs := o.persistJobs(items, errs)
	done := make(chan []int, len(jobs)) // each job's written items, once written
	go func() {
		defer close(done)
		workers.ForEach(len(jobs), int(peer.PERSIST_BATCH_IN_FLIGHT), func(j int) {
			job := jobs[j]
			if o.isLocalSource(items[job[0]]) {
				o.persistRun(items, job, func(i int) []byte { return o.seg.Bytes()[items[i].Offset : items[i].Offset+items[i].Len] }, readBy, pins, errs)
			} else {
				o.persistPulled(items, job, readBy, pins, errs)
			}
			var written []int
			for _, i := range job {
				if errs[i] == nil {
					written = append(written, i)
				}
			}
			done <- written
		})
	}()
	for at := range done {
		for more := true; more; {
			select {
			case w, ok := <-done:
				at, more = append(at, w...), ok
			default:
				more = false
			}
		}
		if len(at) > 0 {
			o.commitPersisted(items, errs, pins, at, epoch, reports)
		}
	}
	return errs
}

// commitPersisted commits the written records of items[i], i in at (each holding
// pins[i], released here), with one BatchSsdReplicaCommit; a record the master did not
// publish, or whose commit failed, is forgotten (errs[i] says why it failed).
//
// A registration's report leaves out the records still pinned (Storage.Settled): the
// pins of committed records are released under Owner.mu with a look at the count of
// reports (registration.reports, as it was when the persist call came: reports), so a
// record is either in the new master's report (its commit returned before the report
// began) or forgotten here (a report or an SSD forget began while it was out: the
// master that published it may not be the one the owner follows now). epoch is the
// registration epoch the call came at: the sources were read for that master.
func (o *Owner) commitPersisted(items []*peer.SsdReplicaPersistRequest, errs []error, pins []ssd.CommitPin, at []int, epoch, reports uint64) {
	defer func() {
		for _, i := range at {
			pins[i].Release() // a no-op for the pins released below
		}
	}()
	commit := make([]*mp.SsdReplicaCommitItem, len(at)) // commit[j] is items[at[j]]
	for j, i := range at {
		commit[j] = &mp.SsdReplicaCommitItem{Key: items[i].Key, PutId: items[i].PutId, Len: items[i].Len, RecordSeq: pins[i].Seq()}
		if src := items[i].SourceNodeId; src != "" && src != o.opts.NodeID {
			// Pulled from another owner: published only while this persist is pending
			// (a late commit of this owner's own memory keeps the older rule).
			commit[j].PersistId = items[i].PersistId
		}
	}
	forget := func(err error) {
		gone := make([]ssd.Eviction, 0, len(at))
		for _, i := range at {
			pins[i].Forget() // this record, not a rewrite of the version committed since
			errs[i] = err
			gone = append(gone, ssd.Eviction{Key: items[i].Key, PutID: items[i].PutId, Seq: pins[i].Seq()})
		}
		// The commit may have reached a master (this one, whose answer was lost, or
		// the one a registration reported to meanwhile) that now routes gets to the
		// records: they go to it as evictions (a master that knows none ignores them;
		// one rewritten since is left out when sent: Storage.Unrewritten).
		o.evictQ.add(gone)
	}
	if o.regEpoch() != epoch {
		// The owner registered with another master while the replicas were read: that
		// master never retained the source ranges for these persists and may have handed
		// them out meanwhile, so the bytes read may not be the values'.
		forget(errCode(common.ErrorCode_UNAVAILABLE, "the owner registered with another master during the SSD persist"))
		return
	}
	ctx, cancel := o.master.ctx()
	defer cancel()
	resp, err := o.master.cl().BatchSsdReplicaCommit(ctx, &mp.BatchSsdReplicaCommitRequest{Node: o.master.ref(), Items: commit})
	if err := o.master.check(respCode(resp, err)); err != nil {
		// The master may not know these entries: keep none it might not know (a later
		// delete would not reach it, and a restarted master would adopt them). If the
		// commit did land, a get finds the entry gone and drops that replica.
		forget(err)
		return
	}
	if len(resp.Published) != len(commit) {
		forget(errCode(common.ErrorCode_INTERNAL, "the master answered %d of %d SSD commits", len(resp.Published), len(commit)))
		return
	}
	st := o.lock()
	same := st.reg.reports == reports
	var gone []ssd.Eviction
	if same {
		for j, i := range at {
			switch {
			case !resp.Published[j]:
				// The version died while it was written (deleted, overwritten, node
				// tombed): the entry must not hold ring space nor count as used.
				pins[i].Forget()
			case !pins[i].Alive():
				// Forgotten while the commit was out: an SSD-drop notice of the version
				// (the master gave up on this persist), applied and acked before the
				// commit arrived, which the master then published (the memory copy is
				// still here). The master learns the record is gone as an eviction;
				// unreported, it routed gets to it and evicted the memory copy as clean.
				gone = append(gone, ssd.Eviction{Key: items[i].Key, PutID: items[i].PutId, Seq: pins[i].Seq()})
			}
			pins[i].Release()
		}
	}
	o.unlock()
	if len(gone) > 0 {
		o.evictQ.add(gone)
	}
	if !same {
		forget(errCode(common.ErrorCode_UNAVAILABLE, "the owner reported its replicas to a new master during the SSD commit"))
	}
}

// persistJobs checks each item (errs[i] set for those refused) and groups the others
// into jobs, each one write run: items of one source (this owner's segment, or one
// incarnation of another owner) in call order, up to ssd.PersistRunBytes of records.
func (o *Owner) persistJobs(items []*peer.SsdReplicaPersistRequest, errs []error) [][]int {
	var jobs [][]int
	type openRun struct {
		job   int
		bytes int64
	}
	runs := map[string]*openRun{} // by source: "" for this owner's segment
	for i, req := range items {
		if errs[i] = o.checkPersist(req); errs[i] != nil {
			continue
		}
		src := ""
		if !o.isLocalSource(req) {
			src = fmt.Sprintf("%s/%d/%s", req.SourceNodeId, req.SourceGeneration, req.SourceDataAddr)
		}
		span := o.store.RecordSpan(req.Key, req.Len) // as PersistMany groups: one job, one write
		r := runs[src]
		if r == nil || r.bytes+span > ssd.PersistRunBytes {
			r = &openRun{job: len(jobs)}
			runs[src] = r
			jobs = append(jobs, nil)
		}
		jobs[r.job] = append(jobs[r.job], i)
		r.bytes += span
	}
	return jobs
}

// isLocalSource reports whether req's memory replica is in this owner's segment.
func (o *Owner) isLocalSource(req *peer.SsdReplicaPersistRequest) bool {
	return req.SourceNodeId == "" || req.SourceNodeId == o.opts.NodeID
}

// checkPersist refuses a persist item this owner cannot serve.
func (o *Owner) checkPersist(req *peer.SsdReplicaPersistRequest) error {
	if req == nil {
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "batch persist: an item is empty")
	}
	if err := o.checkNodeGen("persist", req.Generation); err != nil {
		return err
	}
	if err := wire.ValidateKey(req.Key); err != nil {
		return err
	}
	if o.isLocalSource(req) {
		if req.Offset < 0 || req.Len <= 0 || req.Offset+req.Len > o.seg.Size() {
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "range [%d,+%d) outside the segment", req.Offset, req.Len)
		}
	} else if c := o.store.Stats().CapacityBytes; req.Offset < 0 || req.Len <= 0 || req.Len > c {
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "persist of [%d,+%d) from node %q: this SSD tier holds %d bytes", req.Offset, req.Len, req.SourceNodeId, c)
	}
	return nil
}

// persistRun persists the items of job (one write run) from src(i), their bytes, and
// sets their pins and errors.
func (o *Owner) persistRun(items []*peer.SsdReplicaPersistRequest, job []int, src func(i int) []byte, readBy time.Time, pins []ssd.CommitPin, errs []error) {
	batch := make([]ssd.PersistItem, len(job))
	for k, i := range job {
		batch[k] = ssd.PersistItem{Key: items[i].Key, PutID: items[i].PutId, Src: src(i), ReadBy: readBy}
	}
	ps, es := o.store.PersistMany(batch)
	for k, i := range job {
		pins[i], errs[i] = ps[k], es[k]
		if errs[i] != nil {
			errs[i] = errCode(common.ErrorCode_UNAVAILABLE, "SSD persist: %v", errs[i])
		}
	}
}

// persistPulled persists the items of job, values of one other owner's segment (the
// SSD pool): one pipelined PullMany brings them into a buffer, which then goes to disk
// as one write run like the values of this segment (a job of one value is pulled into
// its record's buffer): a pull per value, each its own
// write, left every record of a 64 KiB page a pad to the next file-system block (about
// 1 % of the rings with 3 owners on the conversation trace, docs/benchmarks.md) and cost
// a round trip each. The pulls end by readBy: the source serves them from ranges the
// master keeps for the persist only until its call times out.
func (o *Owner) persistPulled(items []*peer.SsdReplicaPersistRequest, job []int, readBy time.Time, pins []ssd.CommitPin, errs []error) {
	deadline := time.Now().Add(o.opts.TransferTimeout)
	if readBy.Before(deadline) {
		deadline = readBy
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	fence := func(req *peer.SsdReplicaPersistRequest) transfer.Fence {
		return transfer.Fence{SourceNode: req.SourceNodeId, SourceGeneration: req.SourceGeneration, TransferID: req.PutId}
	}
	if len(job) == 1 {
		// A run of one (a value of a run's size or more): pulled straight into its
		// record's buffer, without a buffer of its own.
		i := job[0]
		req := items[i]
		pins[i], errs[i] = o.store.PersistFrom(req.Key, req.PutId, req.Len, func(dst []byte) error {
			return o.puller.Pull(ctx, req.SourceDataAddr, fence(req), req.Offset, dst)
		})
		if errs[i] != nil {
			errs[i] = errCode(common.ErrorCode_UNAVAILABLE, "SSD persist: %v", errs[i])
		}
		return
	}
	var total int64
	for _, i := range job {
		total += items[i].Len
	}
	buf := make([]byte, total)
	pulls := make([]transfer.PullItem, len(job))
	dst := make(map[int][]byte, len(job)) // item → its bytes in buf
	var off int64
	for k, i := range job {
		req := items[i]
		dst[i] = buf[off : off+req.Len : off+req.Len]
		pulls[k] = transfer.PullItem{Fence: fence(req), Offset: req.Offset, Dst: dst[i]}
		off += req.Len
	}
	var pulled []int
	for k, err := range o.puller.PullMany(ctx, items[job[0]].SourceDataAddr, pulls) {
		if i := job[k]; err != nil {
			errs[i] = errCode(common.ErrorCode_UNAVAILABLE, "SSD persist: pull from %s: %v", items[i].SourceNodeId, err)
		} else {
			pulled = append(pulled, i)
		}
	}
	if len(pulled) > 0 {
		o.persistRun(items, pulled, func(i int) []byte { return dst[i] }, time.Time{}, pins, errs)
	}
}

// A batch of SSD eviction reports that did not reach the master is sent again after
// evictReportRetry, twice the wait each time up to evictReportMaxWait; at most
// evictReportMaxPending entries wait (the oldest go first past it).
const (
	evictReportRetry      = 200 * time.Millisecond
	evictReportMaxWait    = 2 * time.Second
	evictReportMaxPending = 1 << 16
	evictReportTimeout    = 5 * time.Second // one send (shorter than MasterTimeout: a shutdown waits for it)
)

// forwardEvictions reports SSD ring evictions to the master in batches of up to
// wire.MaxBatch. A report the master never got leaves it routing gets to a gone record,
// and counting the version as on SSD (its memory copy then goes without a write-back)
// until a read fails: the ring's reports are drained at once into an evictQueue while a
// call is out, and reports whose call failed in transport, or that a master did not
// take for now (UNAVAILABLE, NOT_LEADER: a rebuild, a failover), are sent again, with
// what the ring evicted meanwhile, until a master takes them. Right before each call
// the keys the ring holds under that put id again are left out (a refresh's rewrite:
// ssd.Storage.Unrewritten), so a report that waited does not drop the new record; a
// rewrite committed while the call itself is out still can (the master knows a record
// by key and put id only), until a read of it fails or a report rebuilds it. A master
// that does not know this incarnation (STALE_GENERATION) has none of its routes; the
// registration that follows reports what the ring holds.
func (o *Owner) forwardEvictions() {
	defer o.wg.Done()
	q := o.evictQ
	filled := make(chan struct{})
	go func() {
		defer close(filled)
		q.fill(o.store.Evictions())
	}()
	defer func() { <-filled }()
	wait, failing := evictReportRetry, false
	for {
		batch, ok := q.take(wire.MaxBatch)
		if !ok {
			return
		}
		if batch = o.store.Unrewritten(batch); len(batch) == 0 {
			continue
		}
		retry, err := o.reportEvictions(batch)
		if err == nil || !retry {
			if err != nil {
				o.log.Warn().Err(err).Int("entries", len(batch)).Msg("SSD eviction report refused")
			} else if failing {
				o.log.Info().Msg("SSD eviction reports reach the master again")
			}
			wait, failing = evictReportRetry, false
			continue
		}
		if !failing {
			failing = true
			o.log.Warn().Err(err).Int("entries", len(batch)).Msg("SSD eviction report failed; sending it again")
		}
		q.putBack(batch)
		if !q.sleep(wait) {
			return
		}
		wait = min(2*wait, evictReportMaxWait)
	}
}

// reportEvictions sends one BatchSsdReplicaEvict; retry: the master did not take it
// (the call failed in transport, or was answered UNAVAILABLE or NOT_LEADER), or it was
// sent under a registration no master took (STALE_GENERATION: its Register failed in
// transport or was refused): the owner goes back to the registration before (staleAnswer),
// whose master still has the replicas these records were, as holder acks do (acks.go).
// Dropped, the master kept SSD replicas of records the ring had overwritten.
func (o *Owner) reportEvictions(batch []ssd.Eviction) (retry bool, err error) {
	entries := make([]*common.KeyVersion, len(batch))
	seqs := make([]int64, len(batch))
	for i, e := range batch {
		entries[i] = &common.KeyVersion{Key: e.Key, PutId: e.PutID}
		seqs[i] = e.Seq
	}
	base, cancelBase := o.master.ctx() // ends when the owner follows another master
	defer cancelBase()
	ctx, cancel := context.WithTimeout(base, evictReportTimeout)
	defer cancel()
	ref := o.master.ref()
	resp, err := o.master.cl().BatchSsdReplicaEvict(ctx, &mp.BatchSsdReplicaEvictRequest{Node: ref, Entries: entries, RecordSeqs: seqs})
	if err != nil {
		return true, o.master.check(0, "", err)
	}
	retry = resp.Code == common.ErrorCode_UNAVAILABLE || resp.Code == common.ErrorCode_NOT_LEADER ||
		(resp.Code == common.ErrorCode_STALE_GENERATION && !o.masterTook(ref.Generation))
	return retry, o.master.check(resp.Code, resp.Message, nil)
}
