package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
)

// TestLocalHitOfPreviousMasterBoundsNoNoticeOfTheNext: a local GetStart hit's answer
// names the last eviction notice its master numbered for this owner (notices_seq), and
// the owner stores that bound with the record, tagged with a registration. A plan is
// accepted under one registration (acceptPlans checks the epoch), but a local hit was
// learned afterwards, in planGet, under Owner.mu taken again: in a BatchGet the pulls of
// the batch's other keys (pullBatch) run in between. If the owner registered with a new
// master meanwhile (a master restart or failover), the old master's number was stored
// as a bound of the NEW registration, whose master numbers its notices from 1 again:
// its eviction notices of the record up to the old number were taken as older than the
// replica and ignored. The owner kept a record the master no longer counts (it answers
// exists from it, and reports it to the master after the next one, though the key may
// have been deleted meanwhile: the master tells no owner that acked the eviction).
//
// The test makes the race deterministic: it takes a local-hit plan of k from the first
// master, restarts the master and registers n1 with the new one (which adopts k from
// the report), then lets planGet finish the old plan. The new master then evicts k
// (its first notice for n1): n1's index must drop k, as the master does.
func TestLocalHitOfPreviousMasterBoundsNoNoticeOfTheNext(t *testing.T) {
	t.Parallel()
	const (
		big  = 150 << 12 // a and b: one fits the 1 MiB pool, two do not
		mid  = 100 << 12 // d: with b and k, leaves 5 pages free
		tiny = 1 << 12   // k
	)
	n := startNode(t, 1<<20, nil,
		master.Options{InsecureCluster: true, HeartbeatInterval: time.Minute, NodeTTL: 5 * time.Minute, WriteQuiet: -1},
		func(o *Options) { o.TransferReserve = -1; o.CacheGrace = -1 })
	heartbeat := func() {
		t.Helper()
		for heartbeatNow(t, n.o).EvictionsMore {
		}
		heartbeatNow(t, n.o) // acks them
	}
	// The first master numbers a notice for n1: a goes for b's room (#1).
	for i, kv := range []struct {
		key  string
		size int
	}{{"a", big}, {"b", big}, {"k", tiny}, {"d", mid}} {
		if err := n.c.Put(kv.key, value(i, kv.size)); err != nil {
			t.Fatal(err)
		}
	}
	heartbeat()

	// A local hit of k, planned by the first master under n1's first registration.
	s := n.o.getStart("k", nil)
	if s.err != nil {
		t.Fatal(s.err)
	}
	if !s.plan.Done || s.plan.NoticesSeq < 1 {
		t.Fatalf("get k on n1: done=%v notices_seq=%d, want a local hit naming notice 1 or later", s.plan.Done, s.plan.NoticesSeq)
	}

	// The master restarts; n1 registers with the new one (and reports b, k and d)
	// before its planGet learns the hit.
	restartMasterWith(t, n, master.Options{InsecureCluster: true, HeartbeatInterval: time.Minute, NodeTTL: 5 * time.Minute,
		WriteQuiet: -1, AllocWait: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	if _, gt, err := n.o.planGet("k", s, nil); err != nil {
		t.Fatal(err)
	} else if n.o.endGet(gt) == nil {
		t.Fatal("the plan of the previous registration is not stale")
	}

	// The new master evicts k: b and d are held, and a put of 8 pages finds 5 free.
	// Its room never comes (k's page is not next to them): the put fails NO_SPACE, and
	// nothing opens k's range on n1. k's notice is the new master's first for n1.
	for _, key := range []string{"b", "d"} {
		h, err := n.c.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
	}
	if err := n.c.Put("c", value(9, 8<<12)); err == nil {
		t.Fatal("put c found room")
	}
	heartbeat()
	var counted int64
	st, err := n.c.Stat()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.NodeId == "n1" {
			counted = m.MemoryReplicas
		}
	}
	// k had no other copy: it is gone. n1 answers exists from its replica index (under
	// its lease, without the master): a record left behind answers true until some
	// put happens to reuse k's range.
	if ok, err := n.c.Exists("k"); err != nil || ok {
		t.Errorf("exists k after its only copy was evicted: %v, %v; want false", ok, err)
	}
	ost := n.o.lock()
	recs, rec := ost.replicas.len(), ost.replicas.lookup("k")
	n.o.unlock()
	if rec != nil || int64(recs) != counted {
		t.Fatalf("after the new master evicted k, n1's replica index holds %d records (k: %v, bound %+v); the master counts %d memory replicas on n1",
			recs, rec != nil, func() any {
				if rec == nil {
					return nil
				}
				return rec.notices
			}(), counted)
	}
}
