package daemon

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/master"
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
	o.regGen.Store(1)
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

// fenceSource is a data-plane Source over one buffer that serves only the transfers
// it was told to retain, and counts the pulls it served.
type fenceSource struct {
	data   []byte
	retain map[int64]bool
	served atomic.Int32
}

func (s *fenceSource) Open(f transfer.Fence, offset, length int64) ([]byte, func(), error) {
	if !s.retain[f.TransferID] || offset < 0 || offset+length > int64(len(s.data)) {
		return nil, nil, fmt.Errorf("transfer %d at %d: %w", f.TransferID, offset, transfer.ErrFenced)
	}
	s.served.Add(1)
	return s.data[offset : offset+length], func() {}, nil
}

// TestPersistPulledRun: values another owner's segment holds are pulled together, one
// pipelined PullMany per source, and written as one run; a value the source no longer
// retains fails alone, with the pull's error, and the others are written. (The keys
// are unknown to the master, which publishes none: the owner forgets the entries after
// the commit, so what is checked is each item's outcome; TestClusterSSDPool refills
// pooled values byte-exact.)
func TestPersistPulledRun(t *testing.T) {
	n := startNode(t, 8<<20, ssdOptions(t, 64<<20), master.Options{InsecureCluster: true})
	const page = 60000
	src := &fenceSource{data: make([]byte, 4*page), retain: map[int64]bool{1: true, 2: true, 4: true}}
	for i := range src.data {
		src.data[i] = byte(i * 7)
	}
	srv, err := transfer.Listen("127.0.0.1:0", src, transfer.ServerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	var items []*peer.SsdReplicaPersistRequest
	for i := range 4 {
		items = append(items, &peer.SsdReplicaPersistRequest{Key: fmt.Sprintf("pooled-%d", i), PutId: int64(i + 1), Generation: n.o.generation,
			Offset: int64(i) * page, Len: page, SourceNodeId: "n2", SourceGeneration: 5, SourceDataAddr: srv.Addr().String()})
	}
	if jobs := n.o.persistJobs(items, make([]error, len(items))); len(jobs) != 1 {
		t.Fatalf("jobs %v, want the four values in one", jobs)
	}
	errs, err := n.o.persistMany(items)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		switch {
		case i == 2 && (err == nil || !strings.Contains(err.Error(), "fenced")):
			t.Errorf("item 2, not retained by its source: %v, want the pull's refusal", err)
		case i != 2 && err != nil:
			t.Errorf("item %d: %v", i, err)
		}
	}
	if got := src.served.Load(); got != 3 {
		t.Errorf("the source served %d pulls, want 3", got)
	}
	if used := n.o.store.Stats().UsedBytes; used != 0 {
		t.Errorf("%d bytes of SSD used by entries the master never published", used)
	}
}
