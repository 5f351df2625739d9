package daemon

import (
	"fmt"
	"slices"
	"testing"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/shm"
	"github.com/fluxkv/fluxkv/ssd"
)

// An owner groups the persists of its own segment as its SSD tier's PersistMany does,
// by their records' spans on disk (ssd.Storage.RecordSpan), so each job is one write:
// sixteen 64 KiB KV pages are two jobs (fifteen pages, 1 MiB of records at most, and
// one), not one job PersistMany would split. Values of another owner's segment (the SSD
// pool pulls them) are grouped the same way by their source, one pipelined pull and one
// write per job; a refused item is in none.
func TestPersistJobsAreWriteRuns(t *testing.T) {
	const page = 64 << 10
	seg, err := shm.CreateSegment("persistjobs", 32*page, shm.SegmentOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	store, err := ssd.Open(ssd.Options{Cluster: "c", InstanceKey: "i", Paths: []string{t.TempDir()}, Limits: []int64{64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	o := &Owner{generation: 1, seg: seg, store: store}
	o.opts.NodeID = "n1"

	var items []*peer.SsdReplicaPersistRequest
	for i := range 16 {
		items = append(items, &peer.SsdReplicaPersistRequest{Key: fmt.Sprintf("page-%02d", i), PutId: int64(i + 1),
			Offset: int64(i) * page, Len: page, Generation: 1})
	}
	// Values pulled from two other owners, interleaved, and one for another incarnation
	// of this owner (refused).
	pooled := func(key string, src string) *peer.SsdReplicaPersistRequest {
		return &peer.SsdReplicaPersistRequest{Key: key, PutId: 20 + int64(len(items)), Offset: 0, Len: page, Generation: 1,
			SourceNodeId: src, SourceGeneration: 3, SourceDataAddr: src + ":1"}
	}
	items = append(items, pooled("pooled-a", "n2"))
	items = append(items, pooled("pooled-b", "n3"))
	items = append(items, pooled("pooled-c", "n2"))
	items = append(items, &peer.SsdReplicaPersistRequest{Key: "stale", PutId: 30, Offset: 0, Len: page, Generation: 7})
	errs := make([]error, len(items))
	jobs := o.persistJobs(items, errs)

	perRun := int(ssd.PersistRunBytes / store.RecordSpan("page-00", page))
	var want [][]int
	for lo := 0; lo < 16; lo += perRun {
		var job []int
		for i := lo; i < min(lo+perRun, 16); i++ {
			job = append(job, i)
		}
		want = append(want, job)
	}
	want = append(want, []int{16, 18}, []int{17})
	if !slices.EqualFunc(jobs, want, slices.Equal[[]int]) {
		t.Errorf("jobs %v, want %v (runs of %d records of %d bytes)", jobs, want, perRun, store.RecordSpan("page-00", page))
	}
	for i, err := range errs {
		if (i == 19) != (err != nil) {
			t.Errorf("item %d (%s): %v", i, items[i].Key, err)
		}
	}
}
