package daemon

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// TestLateEvictNoticeKeepsPromotedReplica: an eviction notice names key@putID only. The
// master evicts k's memory replica on n1 (a notice queued for the next heartbeat), and
// before that heartbeat a get of k on n1 refills the same version from n1's SSD into a
// new range, which GetDone promotes to n1's memory replica of k. The notice, applied
// after, must not drop that new record from n1's replica index: the master counts the
// replica, and after a master restart n1 would not report it (the new master loses it
// and takes its range for free). GetDone's answer names the last notice numbered for n1
// then: the older notice leaves the new record alone.
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
		for heartbeatNow(t, n.o).EvictionsMore {
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
	waitUntil(t, func() bool { return hasRecord("k") }) // GetDone's answer promoted the refill
	heartbeat()
	heartbeat() // acks them
	counted, recs := memReplicas(), records()
	if counted != 1 || recs != 1 || !hasRecord("k") {
		t.Fatalf("after the eviction notices n1's replica index holds %d records (k: %v); the master counts %d memory replicas on n1, want 1 (k promoted)",
			recs, hasRecord("k"), counted)
	}

	// What it costs otherwise: a new master rebuilds its routes from n1's report.
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

// excludeOnce is a master client whose next GetStart, once armed, excludes a node (as
// after a failed pull from it).
type excludeOnce struct {
	masterservice.Client
	node  string
	armed atomic.Bool
}

func (e *excludeOnce) GetStart(ctx context.Context, req *mp.GetStartRequest, o ...callopt.Option) (*mp.GetStartResponse, error) {
	if e.armed.CompareAndSwap(true, false) {
		req.ExcludeNodes = append(req.ExcludeNodes, e.node)
	}
	return e.Client.GetStart(ctx, req, o...)
}

// TestLateSSDDropNoticeKeepsRewrittenRecord: SSD-drop notices name key@putID only too. A
// get through s1 reads page a from s1's SSD (n1, which holds a in memory, excluded as
// after a failed pull) and the record is corrupt (s1 drops it from its ring's index):
// the master drops s1's SSD replica, queues
// s1 a notice to forget it, and writes a back again from n1's memory, to s1's ring
// (the only SSD). The notice, applied after that write-back committed, must not make
// s1 forget the new record: the master counts it (n1's copy is clean, evictable), and
// a later read of it would miss.
//
// The heartbeat loops are slowed to a minute; the test makes s1's heartbeats itself.
func TestLateSSDDropNoticeKeepsRewrittenRecord(t *testing.T) {
	t.Parallel()
	n := startNode(t, 4<<20, nil, master.Options{InsecureCluster: true, HeartbeatInterval: time.Minute, NodeTTL: 5 * time.Minute,
		WriteQuiet: -1, Placement: master.PlacementLocal})
	so := ssdOptions(t, 16<<20)
	so.InstanceKey = "s1"
	s1, c1 := n.addOwner(t, "s1", 4<<20, so)
	heartbeat := func() *mp.HeartbeatResponse {
		t.Helper()
		return heartbeatNow(t, s1)
	}
	ssdReplicas := func() int64 {
		t.Helper()
		var c int64
		n.m.Inspect(func(st *master.State) {
			for _, m := range st.Members() {
				if m.NodeId == "s1" {
					c = m.SsdReplicas
				}
			}
		})
		return c
	}

	want := value(3, 100<<10)
	first := ""
	putID, err := n.c.PutWithID("a", int64(len(want)), fluxkv.PutOptions{Parent: &first}, func(_ int64, dst []byte) error {
		copy(dst, want)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n.waitPersisted(t) // written back from n1's memory to s1's ring
	if ssdReplicas() != 1 || !s1.store.Contains("a", putID) {
		t.Fatalf("a was not written back to s1's ring (the master counts %d SSD replicas there)", ssdReplicas())
	}
	heartbeat()
	heartbeat()

	ex := &excludeOnce{Client: s1.master.cl(), node: "n1"}
	ex.armed.Store(true)
	useMasterClient(s1, ex)
	// a's record goes bad (zeros): its read fails verification, and s1 drops the entry.
	garbage := bytes.Repeat([]byte{0xa5}, 4096)
	overwritten := 0
	filepath.WalkDir(so.Paths[0], func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(garbage, 0); err != nil { // a's record is the ring's first
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			overwritten++
		}
		return nil
	})
	if overwritten == 0 {
		t.Fatal("no shard files found")
	}
	h, err := c1.Get("a") // fails the read, then re-plans: a pull from n1
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Bytes(), want) {
		t.Fatal("get a: wrong bytes")
	}
	h.Release()
	if got := s1.store.Stats().CorruptReads; got != 1 {
		t.Fatalf("%d corrupt SSD reads, want 1", got)
	}
	pendingPersists := func() int {
		pending := 0
		n.m.Inspect(func(st *master.State) { pending = st.PendingPersists() })
		return pending
	}
	waitUntil(t, func() bool { return pendingPersists() == 0 }) // a write-back again, if any
	counted := ssdReplicas()
	if has := s1.store.Contains("a", putID); (counted == 1) != has {
		t.Fatalf("before the notices the master counts %d SSD replicas on s1; s1's ring holds a: %v", counted, has)
	}
	// Now the notice of the record whose read failed arrives.
	resp := heartbeat()
	t.Logf("s1's notices: SSD dropped %v (the master counted %d SSD replicas on s1)", resp.SsdDropped, counted)
	heartbeat() // acks it
	check := func(when string) {
		t.Helper()
		if got, has := ssdReplicas(), s1.store.Contains("a", putID); (got == 1) != has {
			t.Fatalf("%s the master counts %d SSD replicas on s1; s1's ring holds a: %v", when, got, has)
		}
	}
	check("after the notices")

	// Once acked, a is written back there again (with the next page's, a publish tops
	// n1's write-back up).
	if _, err := n.c.PutWithID("b", int64(len(want)), fluxkv.PutOptions{Parent: &first}, func(_ int64, dst []byte) error {
		copy(dst, want)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return pendingPersists() == 0 })
	if got := ssdReplicas(); got != 2 || !s1.store.Contains("a", putID) {
		t.Fatalf("after the next write-back the master counts %d SSD replicas on s1 (want 2: a and b); s1's ring holds a: %v",
			got, s1.store.Contains("a", putID))
	}
}

// heartbeatNow sends one heartbeat of owner o, which applies the eviction notices its
// answer carries (the next heartbeat acks them).
func heartbeatNow(t testing.TB, o *Owner) *mp.HeartbeatResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, _, err := o.master.heartbeat(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
