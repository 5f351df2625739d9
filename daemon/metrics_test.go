package daemon

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// TestHotSetHitOfRefillIsMemoryHit: a value refilled from SSD and promoted to this
// owner's memory replica is read from memory by the gets the hot set answers: they
// report source memory (as the same get planned by the master does) and count as memory
// hits, so fluxkv_get_hits_total{source="ssd"} counts SSD reads, not every later get.
func TestHotSetHitOfRefillIsMemoryHit(t *testing.T) {
	t.Parallel()
	const dram, size = 16 << 20, 1<<20 - 128
	om := metrics.New()
	n := startNode(t, dram, ssdOptions(t, 256<<20), master.Options{InsecureCluster: true},
		func(o *Options) { o.Metrics = om })
	var keys []string
	for i := 0; i < 40; i++ {
		k := fmt.Sprintf("hs-ssd-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	key := keys[0] // written first: evicted from memory, on SSD only
	// Deliver the eviction notices (then ack them), so that the owner's replica index
	// no longer lists the key's evicted memory replica.
	heartbeatNow(t, n.o)
	heartbeatNow(t, n.o)
	indexed := func() bool {
		st := n.o.lock()
		defer n.o.unlock()
		return st.replicas.lookup(key) != nil
	}
	if indexed() {
		t.Fatalf("%s: still in the owner's replica index after its eviction notice", key)
	}
	h, err := n.c.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	if h.Source() != "ssd" {
		t.Skipf("%s: source %s, want an SSD refill to start from", key, h.Source())
	}
	h.Release()
	n.c.Flush()
	ssdHits := func() float64 {
		return counter(t, om, "fluxkv_get_hits_total", map[string]string{"source": metrics.SourceSSD})
	}
	if v := ssdHits(); v != 1 {
		t.Fatalf("after one refill: %v SSD hits, want 1", v)
	}
	// The refill's promotion is confirmed in the background (confirmRefills): a get
	// planned before its GetDone reached the master would read the SSD again.
	waitUntil(t, indexed)
	// Get the key again until the hot set answers.
	cached := func() float64 { return counter(t, om, "fluxkv_cached_gets_total", nil) }
	for i := 0; ; i++ {
		before := cached()
		h, err := n.c.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		src := h.Source()
		h.Release()
		n.c.Flush()
		if cached() > before {
			if src != "memory" {
				t.Errorf("get answered by the hot set: source %s, want memory", src)
			}
			break
		}
		if i == 200 {
			t.Fatal("no get of the promoted refill was answered by the hot set")
		}
	}
	if v := ssdHits(); v != 1 {
		t.Errorf("fluxkv_get_hits_total{source=\"ssd\"} = %v after one refill and memory reads, want 1", v)
	}
	if v := counter(t, om, "fluxkv_ops_total", map[string]string{"op": "Get", "result": metrics.ResultHitSSD}); v != 1 {
		t.Errorf("fluxkv_ops_total{op=\"Get\",result=\"hit_ssd\"} = %v, want 1", v)
	}
}

// TestCapacityKeptWhileMasterAway: the segment figures of an owner's capacity gauges
// (kvcache_segment_capacity_bytes, kvcache_segment_used_bytes) come from the master;
// while it does not answer they stay at its last answer, rather than falling to 0 used
// bytes of a pool the size of the whole segment.
func TestCapacityKeptWhileMasterAway(t *testing.T) {
	t.Parallel()
	const dram = 32 << 20
	n := startNode(t, dram, nil, master.Options{InsecureCluster: true}, func(o *Options) { o.TransferReserve = 8 << 20 })
	if err := n.c.Put("cap-1", value(1, 3<<20)); err != nil {
		t.Fatal(err)
	}
	before := capacityOnceUsed(t, n.o, 3<<20)
	if before.SegmentCapacity >= dram {
		t.Fatalf("with the master: %+v, want a pool below the %d-byte segment", before, dram)
	}
	if err := n.m.Stop(); err != nil {
		t.Fatal(err)
	}
	if after := n.o.Capacity(); after != before {
		t.Errorf("with the master stopped: %+v, want the last reading %+v", after, before)
	}
}

// capacityOnceUsed polls the owner's capacity until its segment figures show at least
// used bytes (a heartbeat's answer brings them), up to 10 s.
func capacityOnceUsed(t *testing.T, o *Owner, used int64) metrics.Capacity {
	t.Helper()
	var c metrics.Capacity
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c = o.Capacity(); !c.SegmentUnknown && c.SegmentUsed >= used {
			return c
		}
	}
	t.Fatalf("capacity %+v, want ≥ %d segment bytes used", c, used)
	return c
}

// TestCapacityFromHeartbeats: an owner's scrape takes its pool's figures from the
// master's heartbeat answers, not a Stat call of its own (which under HA also reads
// etcd, and came once a scrape from every owner).
func TestCapacityFromHeartbeats(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	// Heartbeats a second apart: a scrape asks the master itself only when the last
	// answer is two periods old, which at 100 ms a loaded CI machine reached between two
	// scrapes (CI: "5 scrapes made 2 master Stat calls").
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Metrics: mm, HeartbeatInterval: time.Second, NodeTTL: 5 * time.Second},
		func(o *Options) { o.TransferReserve = 8 << 20 })
	if err := n.c.Put("cap-1", value(1, 3<<20)); err != nil {
		t.Fatal(err)
	}
	capacityOnceUsed(t, n.o, 3<<20)
	stats := func() float64 {
		return counter(t, mm, "fluxkv_ops_total", map[string]string{"op": "Stat", "result": metrics.ResultOK})
	}
	heartbeatNow(t, n.o) // the pool's figures just came with a heartbeat's answer
	before := stats()
	for range 5 {
		if c := n.o.Capacity(); c.SegmentUnknown || c.SegmentUsed < 3<<20 {
			t.Fatalf("capacity %+v, want ≥ 3 MiB used", c)
		}
	}
	if after := stats(); after != before {
		t.Errorf("5 scrapes made %v master Stat calls, want none (the heartbeats carry the pool)", after-before)
	}
}

// TestPinnedLoadCountsOneCachedGet: a prefix lookup that pins a page from the hot set
// and the get that then loads it are one get answered without a master trip:
// fluxkv_cached_gets_total counts it once, as fluxkv_get_hits_total does (a lookup's
// pins are not gets).
func TestPinnedLoadCountsOneCachedGet(t *testing.T) {
	t.Parallel()
	om := metrics.New()
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true}, func(o *Options) { o.Metrics = om })
	const key = "pin-count"
	if err := n.c.Put(key, value(3, 64<<10)); err != nil {
		t.Fatal(err)
	}
	cached := func() float64 { return counter(t, om, "fluxkv_cached_gets_total", nil) }
	hits := func() float64 { return counter(t, om, "fluxkv_get_hits_total", nil) }
	// Gets until one is answered from the hot set: the key's holding is there now.
	for i := 0; ; i++ {
		before := cached()
		h, err := n.c.Get(key)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
		n.c.Flush()
		if cached() > before {
			break
		}
		if i == 200 {
			t.Fatal("no get was answered by the hot set")
		}
	}
	cached0, hits0 := cached(), hits()
	found, err := n.c.BatchExistsPrefix([]string{key}, 5*time.Second)
	if err != nil || found != 1 {
		t.Fatalf("prefix lookup: %d found, %v", found, err)
	}
	h, err := n.c.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	if d := hits() - hits0; d != 1 {
		t.Fatalf("fluxkv_get_hits_total rose by %v for one get, want 1", d)
	}
	if d := cached() - cached0; d != 1 {
		t.Errorf("fluxkv_cached_gets_total rose by %v for one pinned lookup and its get, want 1", d)
	}
}

// TestExistsOfAbsentKeyIsMiss: an Exists of an absent key is a miss in
// fluxkv_ops_total (result "miss": a get or exists of an absent key), on the owner the
// client called and on the master it asked; one of a present key is ok.
func TestExistsOfAbsentKeyIsMiss(t *testing.T) {
	t.Parallel()
	mm, om := metrics.New(), metrics.New()
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Metrics: mm}, func(o *Options) { o.Metrics = om })
	if err := n.c.Put("exists-present", value(4, 1000)); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.c.Exists("exists-absent"); err != nil || ok {
		t.Fatalf("exists of an absent key: %v, %v", ok, err)
	}
	if ok, err := n.c.Exists("exists-present"); err != nil || !ok {
		t.Fatalf("exists of a present key: %v, %v", ok, err)
	}
	for _, m := range []struct {
		who string
		m   *metrics.Metrics
	}{{"owner", om}, {"master", mm}} {
		if v := counter(t, m.m, "fluxkv_ops_total", map[string]string{"op": "Exists", "result": metrics.ResultMiss}); v != 1 {
			t.Errorf("%s: fluxkv_ops_total{op=\"Exists\",result=\"miss\"} = %v after one exists of an absent key, want 1", m.who, v)
		}
	}
	if v := counter(t, om, "fluxkv_ops_total", map[string]string{"op": "Exists", "result": metrics.ResultOK}); v != 1 {
		t.Errorf("owner: fluxkv_ops_total{op=\"Exists\",result=\"ok\"} = %v after one exists of a present key, want 1", v)
	}
}

// TestBatchPutItemErrorsAreErrors: a BatchPutStart whose items fail (here NO_SPACE: the
// pool is held by a client) is a failed call in fluxkv_ops_total, as a PutStart that
// fails is: FluxkvPutErrors reads result="error" of both to catch puts failing under
// memory pressure, and batch puts (the KV engines' pages) would otherwise never count.
func TestBatchPutItemErrorsAreErrors(t *testing.T) {
	t.Parallel()
	om := metrics.New()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true, AllocWait: 100 * time.Millisecond}, func(o *Options) { o.Metrics = om })
	const size = 10 << 20 // two do not fit in the pool
	if err := n.c.Put("held", value(5, size)); err != nil {
		t.Fatal(err)
	}
	h, err := n.c.Get("held") // its holder keeps it: nothing can be evicted for another
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if err := n.c.Put("second", value(6, size)); !errors.Is(err, fluxkv.ErrNoSpace) {
		t.Fatalf("put with the pool held: %v, want NO_SPACE", err)
	}
	errs, err := n.c.BatchPut([]fluxkv.PutItem{{Key: "third", Value: value(7, size)}}, fluxkv.PutOptions{})
	if err != nil || len(errs) != 1 || !errors.Is(errs[0], fluxkv.ErrNoSpace) {
		t.Fatalf("batch put with the pool held: %v, %v; want the item to fail NO_SPACE", errs, err)
	}
	// A batch whose item finds its key cached (reject_if_exists, as the KV stores put
	// pages) skipped that item: not a failed call.
	errs, err = n.c.BatchPut([]fluxkv.PutItem{{Key: "held", Value: value(5, size)}}, fluxkv.PutOptions{RejectIfExists: true})
	if err != nil || len(errs) != 1 || !errors.Is(errs[0], fluxkv.ErrAlreadyExists) {
		t.Fatalf("batch put of a cached key with reject_if_exists: %v, %v; want ALREADY_EXISTS", errs, err)
	}
	for _, op := range []string{"PutStart", "BatchPutStart"} {
		if v := counter(t, om, "fluxkv_ops_total", map[string]string{"op": op, "result": metrics.ResultError}); v != 1 {
			t.Errorf("fluxkv_ops_total{op=%q,result=\"error\"} = %v after one put failed NO_SPACE, want 1", op, v)
		}
	}
}

// TestMasterBatchPutItemErrorsAreErrors: the master counts a BatchPutStart with an
// item that failed (NO_SPACE) as a failed call, as the owner does (FluxkvPutErrors fires
// per process, a standalone master included), and one whose items found their keys
// cached under reject_if_exists as ok.
func TestMasterBatchPutItemErrorsAreErrors(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true, AllocWait: 100 * time.Millisecond, Metrics: mm},
		func(o *Options) { o.TransferReserve = -1 }) // no transfer area to lend room
	pool := n.o.Capacity().SegmentCapacity
	if err := n.c.Put("held", value(5, int(pool-2<<20))); err != nil {
		t.Fatal(err)
	}
	h, err := n.c.Get("held") // its holder keeps it: nothing can be evicted for another
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	// One wave, one BatchPutStart: 3 MiB do not fit in the 2 MiB left.
	const size = 3 << 19
	errs, err := n.c.BatchPut([]fluxkv.PutItem{{Key: "b1", Value: value(7, size)}, {Key: "b2", Value: value(8, size)}}, fluxkv.PutOptions{})
	if err != nil || len(errs) != 2 || !errors.Is(errors.Join(errs...), fluxkv.ErrNoSpace) {
		t.Fatalf("batch put with the pool held: %v, %v; want an item to fail NO_SPACE", errs, err)
	}
	for _, k := range []string{"small-1", "small-2"} {
		if err := n.c.Put(k, value(6, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	errs, err = n.c.BatchPut([]fluxkv.PutItem{{Key: "small-1", Value: value(6, 1000)}, {Key: "small-2", Value: value(6, 1000)}}, fluxkv.PutOptions{RejectIfExists: true})
	if err != nil || len(errs) != 2 || !errors.Is(errs[0], fluxkv.ErrAlreadyExists) || !errors.Is(errs[1], fluxkv.ErrAlreadyExists) {
		t.Fatalf("batch put of cached keys with reject_if_exists: %v, %v; want ALREADY_EXISTS", errs, err)
	}
	if v := counter(t, mm, "fluxkv_ops_total", map[string]string{"op": "BatchPutStart", "result": metrics.ResultError}); v != 1 {
		t.Errorf("master: fluxkv_ops_total{op=\"BatchPutStart\",result=\"error\"} = %v after one batch with an item failed NO_SPACE, want 1", v)
	}
	if v := counter(t, mm, "fluxkv_ops_total", map[string]string{"op": "BatchPutStart", "result": metrics.ResultOK}); v != 1 {
		t.Errorf("master: fluxkv_ops_total{op=\"BatchPutStart\",result=\"ok\"} = %v after one batch of cached keys, want 1", v)
	}
	// A BatchPutDone with an item the master does not know (expired or revoked) failed.
	ctx, cancel := n.o.master.ctx()
	defer cancel()
	resp, err := n.o.master.cl().BatchPutDone(ctx, &mp.BatchPutDoneRequest{Node: n.o.master.ref(), Items: []*mp.PutDoneItem{{Key: "gone", PutId: 12345}}})
	if err != nil || resp.Code != common.ErrorCode_OK || len(resp.Results) != 1 || resp.Results[0].Code == common.ErrorCode_OK {
		t.Fatalf("BatchPutDone of an unknown put: %+v, %v; want its item refused", resp, err)
	}
	if v := counter(t, mm, "fluxkv_ops_total", map[string]string{"op": "BatchPutDone", "result": metrics.ResultError}); v != 1 {
		t.Errorf("master: fluxkv_ops_total{op=\"BatchPutDone\",result=\"error\"} = %v after one batch with an item refused, want 1", v)
	}
}

// TestFlightJoinersOfRefillAreSSDHits: gets of an SSD-only key that join one flight
// (its leader refills the value from SSD) waited for that read: each reports source
// ssd, as the leader does, not memory (the hot set's answer to a get that began
// after the bytes were in memory). Promotion off: no get finds the key in memory, so
// every one of them is an SSD hit, joined or not.
func TestFlightJoinersOfRefillAreSSDHits(t *testing.T) {
	t.Parallel()
	const dram, size = 16 << 20, 1<<20 - 128
	n := startNode(t, dram, ssdOptions(t, 256<<20), master.Options{InsecureCluster: true, NoPromotion: true})
	var keys []string
	for i := 0; i < 40; i++ {
		k := fmt.Sprintf("fj-ssd-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	const readers = 16
	for round, key := range keys[:4] { // written first: evicted from memory, on SSD only
		srcs := make(chan string, readers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range readers {
			wg.Go(func() {
				<-start
				h, err := n.c.Get(key)
				if err != nil {
					srcs <- "error: " + err.Error()
					return
				}
				srcs <- h.Source()
				h.Release()
			})
		}
		close(start)
		wg.Wait()
		close(srcs)
		for s := range srcs {
			if s != "ssd" {
				t.Errorf("round %d: a get of an SSD-only key with promotion off reported %q, want ssd", round, s)
			}
		}
	}
}

// TestRejectedPutStartIsNotError: a PutStart refused ALREADY_EXISTS under
// reject_if_exists (the key is cached, which the KV stores skip by design) counts as ok
// on the owner and the master, as the same put in a BatchPutStart does, and not as a
// failed call that FluxkvPutErrors would read.
func TestRejectedPutStartIsNotError(t *testing.T) {
	t.Parallel()
	mm, om := metrics.New(), metrics.New()
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Metrics: mm}, func(o *Options) { o.Metrics = om })
	if err := n.c.Put("cached", value(4, 1000)); err != nil {
		t.Fatal(err)
	}
	err := n.c.PutWith("cached", 1000, fluxkv.PutOptions{RejectIfExists: true}, func(dst []byte) error { return nil })
	if !errors.Is(err, fluxkv.ErrAlreadyExists) {
		t.Fatalf("put of a cached key with reject_if_exists: %v, want ALREADY_EXISTS", err)
	}
	for _, m := range []struct {
		who string
		m   *metrics.Metrics
	}{{"owner", om}, {"master", mm}} {
		if v := counter(t, m.m, "fluxkv_ops_total", map[string]string{"op": "PutStart", "result": metrics.ResultError}); v != 0 {
			t.Errorf("%s: fluxkv_ops_total{op=\"PutStart\",result=\"error\"} = %v after a put refused ALREADY_EXISTS under reject_if_exists, want 0", m.who, v)
		}
		if v := counter(t, m.m, "fluxkv_ops_total", map[string]string{"op": "PutStart", "result": metrics.ResultOK}); v != 2 {
			t.Errorf("%s: fluxkv_ops_total{op=\"PutStart\",result=\"ok\"} = %v after a put and a put refused ALREADY_EXISTS under reject_if_exists, want 2", m.who, v)
		}
	}
}

// TestCapacityUnknownBeforeMasterAnswers: before the master first answered about this
// owner's pool, the owner's scrape leaves the segment gauges out (kvcache_segment_*
// are the pool and its use as the master allocates it) rather than reporting the whole
// segment with 0 bytes used; the SSD gauges, known locally, are there.
func TestCapacityUnknownBeforeMasterAnswers(t *testing.T) {
	t.Parallel()
	// No heartbeat before the stop: the first comes a period after registering.
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, HeartbeatInterval: 30 * time.Second, NodeTTL: time.Minute},
		func(o *Options) { o.TransferReserve = 8 << 20 })
	if err := n.m.Stop(); err != nil { // before any Capacity call or heartbeat asked it
		t.Fatal(err)
	}
	c := n.o.Capacity()
	m := metrics.New()
	m.SetCapacityFunc(func() metrics.Capacity { return c })
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]float64{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			have[mf.GetName()] = s.GetGauge().GetValue()
		}
	}
	for _, name := range []string{"kvcache_segment_capacity_bytes", "kvcache_segment_used_bytes"} {
		if v, ok := have[name]; ok {
			t.Errorf("%s = %v before the master answered about the pool, want it left out", name, v)
		}
	}
	if _, ok := have["kv_ssd_capacity_bytes"]; !ok {
		t.Error("kv_ssd_capacity_bytes left out: the SSD figures do not come from the master")
	}
}

// TestRejectedPutEndIsNotError: a put under reject_if_exists whose key another put
// published while it was written is refused ALREADY_EXISTS at its PutEnd (the master's
// PutDone): skipped like one refused at PutStart, not a failed call on either process.
func TestRejectedPutEndIsNotError(t *testing.T) {
	t.Parallel()
	mm, om := metrics.New(), metrics.New()
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Metrics: mm}, func(o *Options) { o.Metrics = om })
	c2, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: t.Name() + "-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	err = n.c.PutWith("raced", 1000, fluxkv.PutOptions{RejectIfExists: true}, func(dst []byte) error {
		return c2.Put("raced", value(4, 1000)) // published while this put is written
	})
	if !errors.Is(err, fluxkv.ErrAlreadyExists) {
		t.Fatalf("put under reject_if_exists of a key published meanwhile: %v, want ALREADY_EXISTS", err)
	}
	for _, m := range []struct {
		who, op string
		m       *metrics.Metrics
	}{{"owner", "PutEnd", om}, {"master", "PutDone", mm}} {
		if v := counter(t, m.m, "fluxkv_ops_total", map[string]string{"op": m.op, "result": metrics.ResultError}); v != 0 {
			t.Errorf("%s: fluxkv_ops_total{op=%q,result=\"error\"} = %v after a put refused ALREADY_EXISTS under reject_if_exists, want 0", m.who, m.op, v)
		}
	}
}
