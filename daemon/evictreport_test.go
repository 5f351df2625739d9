package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/ssd"
)

// evictHeld holds every BatchSsdReplicaEvict until release closes.
type evictHeld struct {
	masterservice.Client
	release chan struct{}
}

func (h *evictHeld) BatchSsdReplicaEvict(ctx context.Context, req *mp.BatchSsdReplicaEvictRequest, opts ...callopt.Option) (*mp.BatchSsdReplicaEvictResponse, error) {
	<-h.release
	return h.Client.BatchSsdReplicaEvict(ctx, req, opts...)
}

// TestEvictionReportsKeptWhileOneIsOut: while an SSD eviction report waits for the
// master, the ring's later evictions wait in the owner's queue; none is dropped
// because the ring's own short queue filled behind the call. A dropped report leaves
// the master routing gets to a record that is gone, and counting the version as on SSD
// (its memory copy then goes without a write-back).
func TestEvictionReportsKeptWhileOneIsOut(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 1<<20)
	so.EvictionBatch = 1 // the ring's queue holds 32 reports, its channel 64 batches
	n := startNode(t, 16<<20, so, master.Options{})
	held := &evictHeld{release: make(chan struct{})}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { held.Client = c; return held })
	n.putValues(t, "v", 400, 8<<10) // 3.2 MiB through a 1 MiB ring: ~270 evictions
	close(held.release)
	if st := n.o.store.Stats(); st.DroppedEvictions != 0 {
		t.Errorf("%d eviction reports dropped while one was out", st.DroppedEvictions)
	}
	waitUntil(t, func() bool { return n.ssdReplicasOf(t, "n1") == int64(len(n.o.store.Committed())) })
}

// TestEvictionReportOfARewrittenRecordLeftOut: an eviction report still waiting when the
// ring holds the same key and put id again (a refresh's rewrite) is left out of the
// call that follows: the master knows a record by key and put id only, and would drop
// the new record's route.
func TestEvictionReportOfARewrittenRecordLeftOut(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 1<<20)
	so.EvictionBatch = 1
	n := startNode(t, 16<<20, so, master.Options{})
	n.putValues(t, "first", 8, 8<<10) // evicted before "r": the call held below carries one of these
	n.putValues(t, "r", 1, 8<<10)
	var rid int64
	for _, e := range n.o.store.Committed() {
		if e.Key == "r-0" {
			rid = e.PutID
		}
	}
	if rid == 0 {
		t.Fatal("r-0 is not on SSD")
	}
	held := &evictHeld{release: make(chan struct{})}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { held.Client = c; return held })
	n.putValues(t, "v", 400, 8<<10)
	if n.o.store.Contains("r-0", rid) {
		t.Fatal("the ring did not overwrite r-0")
	}
	pin, err := n.o.store.Persist("r-0", rid, value(0, 8<<10)) // as the master's refresh rewrites it
	if err != nil {
		t.Fatal(err)
	}
	pin.Release()
	close(held.release)
	waitUntil(t, func() bool { return n.ssdReplicasOf(t, "n1") == int64(len(n.o.store.Committed())) })
	h, err := n.c.Get("r-0")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
}

// TestEvictQueueCountsItsDrops: past evictReportMaxPending entries the oldest go, and
// are counted.
func TestEvictQueueCountsItsDrops(t *testing.T) {
	log := zerolog.Nop()
	dropped := 0
	q := newEvictQueue(&log, func(n int) { dropped += n })
	q.add(make([]ssd.Eviction, evictReportMaxPending))
	q.add([]ssd.Eviction{{Key: "last", PutID: 1}, {Key: "after", PutID: 2}})
	if dropped != 2 {
		t.Fatalf("%d drops counted, want 2", dropped)
	}
	if batch, _ := q.take(evictReportMaxPending); len(batch) != evictReportMaxPending || batch[len(batch)-1].Key != "after" {
		t.Fatalf("the queue kept %d entries ending with %q, want the newest %d", len(batch), batch[len(batch)-1].Key, evictReportMaxPending)
	}
}

// TestEvictQueueHandsOutItsLastReports: once the ring's channel closed (the owner is
// stopping), the queue still hands out what it holds, then says it is done.
func TestEvictQueueHandsOutItsLastReports(t *testing.T) {
	log := zerolog.Nop()
	q := newEvictQueue(&log, nil)
	evs := make(chan []ssd.Eviction, 2)
	evs <- []ssd.Eviction{{Key: "a", PutID: 1}, {Key: "b", PutID: 2}}
	evs <- []ssd.Eviction{{Key: "c", PutID: 3}}
	close(evs)
	q.fill(evs)
	var got []string
	for {
		batch, ok := q.take(2)
		if !ok {
			break
		}
		for _, e := range batch {
			got = append(got, e.Key)
		}
	}
	if strings.Join(got, ",") != "a,b,c" {
		t.Fatalf("the closed queue handed out %v, want a,b,c", got)
	}
	if q.sleep(time.Hour) {
		t.Fatal("a closed queue's sleep waited")
	}
}
