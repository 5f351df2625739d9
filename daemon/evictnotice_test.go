package daemon

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
)

// TestLateEvictNoticeKeepsPromotedReplica: an eviction notice names key@putID only. The
// master evicts k's memory replica on n1 (a notice queued for the next heartbeat), and
// before that heartbeat a get of k on n1 refills the same version from n1's SSD into a
// new range, which GetDone promotes to n1's memory replica of k. The notice, applied
// after, must not drop that new record from n1's replica index: the master counts the
// replica, and after a master restart n1 would not report it (the new master loses it
// and takes its range for free). (The master now promotes no refill onto an owner while
// a notice naming the key waits for its ack.)
//
// The heartbeat loop is slowed to a minute; the test makes the heartbeats itself.
func TestLateEvictNoticeKeepsPromotedReplica(t *testing.T) {
	t.Parallel()
	const size = 600 << 10 // one value fits the 1 MiB pool, two do not
	n := startNode(t, 1<<20, ssdOptions(t, 16<<20),
		master.Options{InsecureCluster: true, HeartbeatInterval: time.Minute, NodeTTL: 5 * time.Minute, WriteQuiet: -1},
		func(o *Options) { o.TransferReserve = -1; o.CacheGrace = -1 })
	heartbeat := func() {
		t.Helper()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, _, err := n.o.master.heartbeat(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if !resp.EvictionsMore {
				return
			}
		}
	}
	memReplicas := func() int64 {
		t.Helper()
		st, err := n.c.Stat()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range st.Members {
			if m.NodeId == "n1" {
				return m.MemoryReplicas
			}
		}
		t.Fatal("n1 is not a member")
		return 0
	}
	records := func() int {
		st := n.o.lock()
		defer n.o.unlock()
		return st.replicas.len()
	}
	hasRecord := func(key string) bool {
		st := n.o.lock()
		defer n.o.unlock()
		return st.replicas.lookup(key) != nil
	}

	want := value(1, size)
	if err := n.c.Put("k", want); err != nil {
		t.Fatal(err)
	}
	n.waitPersisted(t)
	heartbeat()
	if !hasRecord("k") {
		t.Fatal("n1 does not record its replica of k after the put")
	}
	// k's memory replica goes for other's room (k stays on SSD); its notice waits.
	if err := n.c.Put("other", value(2, size)); err != nil {
		t.Fatal(err)
	}
	n.waitPersisted(t)
	if got := memReplicas(); got != 1 {
		t.Fatalf("the master counts %d memory replicas on n1 after the second put, want 1 (k evicted)", got)
	}
	// The get refills k from n1's SSD into a new range (other goes for it), which GetDone
	// may promote to n1's memory replica of k.
	h, err := n.c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Bytes(), want) {
		t.Fatal("get k: wrong bytes")
	}
	h.Release()
	n.c.Flush()
	// Now the notices of k's first replica (and of other's) arrive. Whatever the master
	// counts on n1 (k, if it promoted the refill), n1's replica index must record.
	waitUntil(t, func() bool { // the refill's GetDone goes in the background
		gets := 0
		n.m.Inspect(func(st *master.State) { gets = st.GetsInFlight() })
		return gets == 0
	})
	heartbeat()
	heartbeat() // acks them
	counted, recs := memReplicas(), records()
	if int64(recs) != counted || hasRecord("k") != (counted == 1) {
		t.Fatalf("after the eviction notices n1's replica index holds %d records (k: %v); the master counts %d memory replicas on n1",
			recs, hasRecord("k"), counted)
	}

	if counted == 0 {
		// Not promoted while the notice waited: once acked, a get promotes again.
		h, err := n.c.Get("k")
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
		n.c.Flush()
		waitUntil(t, func() bool { return hasRecord("k") })
		heartbeat()
		if counted, recs = memReplicas(), records(); counted != 1 || recs != 1 {
			t.Fatalf("after a get with no notice waiting, n1's replica index holds %d records; the master counts %d memory replicas on n1, want 1 (k promoted)",
				recs, counted)
		}
	}

	// What it costs: a new master rebuilds its routes from n1's report.
	m2 := restartMaster(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { // the new master adopts n1's report
		keys := 0
		m2.Inspect(func(st *master.State) { keys = st.Keys() })
		return keys == 2
	})
	var mem int64
	m2.Inspect(func(st *master.State) {
		for _, m := range st.Members() {
			if m.NodeId == "n1" {
				mem = m.MemoryReplicas
			}
		}
	})
	if mem != counted {
		t.Fatalf("the new master learned %d memory replicas from n1's report; the old one counted %d", mem, counted)
	}
}
