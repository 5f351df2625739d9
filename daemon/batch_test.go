package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// addOwner starts one more in-process owner (node id id) on n's master, with a client.
func (n *node) addOwner(t *testing.T, id string, dram int64, so *ssd.Options, tweaks ...func(*Options)) (*Owner, *fluxkv.Client) {
	t.Helper()
	opts := n.opts
	opts.Dir, opts.NodeID, opts.DRAM, opts.SSD, opts.Metrics = filepath.Join(t.TempDir(), id), id, dram, so, nil
	for _, f := range tweaks {
		f(&opts)
	}
	return startOwnerClient(t, opts, t.Name()+"-"+id)
}

// counter sums the samples of a counter in m whose labels include want.
func counter(t *testing.T, m *metrics.Metrics, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	sample:
		for _, s := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue sample
				}
			}
			sum += s.GetCounter().GetValue()
		}
	}
	return sum
}

// batchGetAnswer is what a BatchGet answered.
type batchGetAnswer struct {
	hs   []*fluxkv.MemHolder
	errs []error
	err  error
}

// batchGetAsync runs c.BatchGet(keys) in the background; its answer comes on the channel.
func batchGetAsync(c *fluxkv.Client, keys []string) <-chan batchGetAnswer {
	done := make(chan batchGetAnswer, 1)
	go func() {
		hs, errs, err := c.BatchGet(keys)
		done <- batchGetAnswer{hs, errs, err}
	}()
	return done
}

// masterCalls counts the master's calls of each method so far.
func masterCalls(t *testing.T, m *metrics.Metrics, methods ...string) map[string]int {
	out := map[string]int{}
	for _, op := range methods {
		out[op] = int(counter(t, m, "fluxkv_ops_total", map[string]string{"op": op}))
	}
	return out
}

// callsSince is the calls of each method made since before.
func callsSince(t *testing.T, m *metrics.Metrics, before map[string]int) map[string]int {
	methods := make([]string, 0, len(before))
	for k := range before {
		methods = append(methods, k)
	}
	now := masterCalls(t, m, methods...)
	for k, v := range before {
		now[k] -= v
	}
	return now
}

var planCalls = []string{"GetStart", "BatchGetStart", "Exists", "BatchExists", "Delete", "BatchDelete", "PutStart", "BatchPutStart", "PutDone", "BatchPutDone"}

// TestBatchesOneMasterCall: a batch get through n2 mixing hot-set hits, a local memory
// replica, values held by n1 (pulled), values on n1's SSD only (staged and pulled),
// absent keys, an invalid key and a repeated key answers every key in order, byte-exact,
// with one BatchGetStart and no per-key GetStart; the same holds through n1 (its own SSD,
// n2's memory). Exists, deletes and puts of a batch are one master call each; nothing
// leaks.
func TestBatchesOneMasterCall(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	const dram = 16 << 20
	n := startNode(t, dram, ssdOptions(t, 256<<20), master.Options{Metrics: mm, Placement: master.PlacementLocal, InsecureCluster: true})
	_, c2 := n.addOwner(t, "n2", 64<<20, nil)
	c1 := n.c

	// Sizes stay under 1 MiB: a batch holds all its values at once, and a few values
	// of a quarter of n1's segment each, held there together, could leave no free range
	// large enough for the next one to land in (a NO_SPACE this test is not about).
	size := func(i int) int { return 256<<10 + i%128*4099 + 1 }
	var onSSD, onN1, onN2 []string
	want := map[string][]byte{}
	put := func(c *fluxkv.Client, k string, i int) {
		want[k] = value(i, size(i))
		if err := c.Put(k, want[k]); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	// 3× n1's DRAM through n1: the first ones remain on its SSD only.
	for i := range 3 * dram / size(40) {
		k := fmt.Sprintf("s-%d", i)
		put(c1, k, i)
		onSSD = append(onSSD, k)
	}
	n.waitPersisted(t)
	onN1, onSSD = onSSD[len(onSSD)-4:], onSSD[:6]
	for i := range 6 {
		k := fmt.Sprintf("m2-%d", i)
		put(c2, k, 1000+i)
		onN2 = append(onN2, k)
	}
	hot := onN2[0]
	if h, err := c2.Get(hot); err != nil {
		t.Fatal(err)
	} else {
		h.Release() // idle in n2's hot set now
	}

	mixed := []string{hot, onN2[1], onN1[0], onSSD[0], "absent-1", onN1[1], "", onSSD[1], onN2[2], onN1[0], "absent-2"}
	check := func(via string, c *fluxkv.Client, keys []string) {
		t.Helper()
		before := masterCalls(t, mm, planCalls...)
		hs, errs, err := c.BatchGet(keys)
		if err != nil {
			t.Fatalf("batch get through %s: %v", via, err)
		}
		for i, k := range keys {
			switch {
			case k == "":
				if !errors.Is(errs[i], fluxkv.ErrInvalidArgument) {
					t.Errorf("%s: key %d (empty) = %v, want invalid argument", via, i, errs[i])
				}
			case want[k] == nil:
				if errs[i] != nil || hs[i] != nil {
					t.Errorf("%s: %s = %v, want a miss (no holder, no error)", via, k, errs[i])
				}
			case errs[i] != nil:
				t.Errorf("%s: %s: %v", via, k, errs[i])
			case !bytes.Equal(hs[i].Bytes(), want[k]):
				t.Errorf("%s: %s: wrong bytes (source %s)", via, k, hs[i].Source())
			}
			if hs[i] != nil {
				hs[i].Release()
			}
		}
		calls := callsSince(t, mm, before)
		if calls["BatchGetStart"] != 1 || calls["GetStart"] != 0 {
			t.Errorf("batch get of %d keys through %s: %v master calls, want 1 BatchGetStart and no GetStart", len(keys), via, calls)
		}
	}
	check("n2", c2, mixed)
	check("n1", c1, []string{onSSD[2], onN1[2], onN2[3], "absent-3", onSSD[3], onN2[4]})

	// Exists: what n2 holds is answered without the master, the rest in one call.
	before := masterCalls(t, mm, planCalls...)
	ex, err := c2.BatchExists([]string{onN2[0], onN1[3], "absent-4", onSSD[4], onN2[5]})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ex) != "[true true false true true]" {
		t.Errorf("batch exists = %v", ex)
	}
	if calls := callsSince(t, mm, before); calls["BatchExists"] != 1 || calls["Exists"] != 0 {
		t.Errorf("batch exists: %v master calls, want one BatchExists", calls)
	}
	before = masterCalls(t, mm, planCalls...)
	if ex, err := c2.BatchExists(onN2); err != nil || fmt.Sprint(ex) != "[true true true true true true]" {
		t.Errorf("batch exists of n2's own keys = %v, %v", ex, err)
	}
	if calls := callsSince(t, mm, before); calls["BatchExists"] != 0 || calls["Exists"] != 0 {
		t.Errorf("batch exists of keys n2 holds: %v master calls, want none", calls)
	}

	// Puts in one wave: one BatchPutStart and one BatchPutDone.
	var items []fluxkv.PutItem
	for i := range 20 {
		k := fmt.Sprintf("bp-%d", i)
		want[k] = value(2000+i, 1000+i)
		items = append(items, fluxkv.PutItem{Key: k, Value: want[k]})
	}
	before = masterCalls(t, mm, planCalls...)
	if errs, err := c2.BatchPut(items, fluxkv.PutOptions{}); err != nil || errors.Join(errs...) != nil {
		t.Fatalf("batch put: %v %v", err, errs)
	}
	if calls := callsSince(t, mm, before); calls["BatchPutStart"] != 1 || calls["BatchPutDone"] != 1 || calls["PutStart"]+calls["PutDone"] != 0 {
		t.Errorf("batch put of 20 small values: %v master calls, want one BatchPutStart and one BatchPutDone", calls)
	}
	check("n1", c1, []string{"bp-0", "bp-19", "bp-7"})

	// Deletes: one call, and every key is gone everywhere.
	all := append(append(append([]string{}, onSSD...), onN1...), onN2...)
	for _, it := range items {
		all = append(all, it.Key)
	}
	before = masterCalls(t, mm, planCalls...)
	deleted, err := c1.BatchDelete(all)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range deleted {
		if !d {
			t.Errorf("delete %s: not deleted", all[i])
		}
	}
	if calls := callsSince(t, mm, before); calls["BatchDelete"] != 1 || calls["Delete"] != 0 {
		t.Errorf("batch delete: %v master calls, want one BatchDelete", calls)
	}
	if ex, err := c2.BatchExists(all[:8]); err != nil || fmt.Sprint(ex) != "[false false false false false false false false]" {
		t.Errorf("exists after delete = %v, %v", ex, err)
	}
	for _, c := range []*fluxkv.Client{c1, c2} {
		c.Flush()
		st, err := c.Stat()
		if err != nil {
			t.Fatal(err)
		}
		if st.ClientHolders != 0 {
			t.Errorf("%s: %d holders left", st.NodeId, st.ClientHolders)
		}
	}
}

// TestGetOneFlight: 64 concurrent gets of one cold key held by another owner, from two
// sessions, each get their own holder of the same bytes with one master plan and one
// pull: the 63 that came after the first get's plan was sent queue for one flight
// behind it, which finds the pulled (promoted) replica in the hot set. Without
// promotion that flight plans and pulls once more: 2 and 2 (it may not share a pull
// that is no replica: its gets began after the first plan was sent). The leader's own
// session ending mid-flight fails only its get; the others still get the value and
// nothing leaks.
func TestGetOneFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                   string
		noPromotion            bool
		killLeader, killQueued bool
		plans, pulls           float64
	}{
		{"together", false, false, false, 1, 1},
		{"leader-killed", false, true, false, 2, 1},
		{"queued-leader-killed", false, false, true, 1, 1},
		{"no-promotion", true, false, false, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			oneFlight(t, tc.noPromotion, tc.killLeader, tc.killQueued, tc.plans, tc.pulls)
		})
	}
}

// oneFlight is a case of TestGetOneFlight; killQueued ends the session of the get that
// leads the flight queued behind the first (its followers, of other sessions, then take
// the replica the first left in the hot set).
func oneFlight(t *testing.T, noPromotion, killLeader, killQueued bool, wantPlans, wantPulls float64) {
	mm := metrics.New()
	n := startNode(t, 64<<20, nil, master.Options{Metrics: mm, Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: noPromotion})
	om := metrics.New()
	o2, c2 := n.addOwner(t, "n2", 64<<20, nil, func(o *Options) { o.Metrics = om; o.CacheGrace = -1 })
	c3, err := fluxkv.Connect(fluxkv.Options{Socket: o2.SocketPath(), Name: t.Name() + "-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	const key = "flight"
	val := value(7, 1<<20+3)
	if err := n.c.Put(key, val); err != nil {
		t.Fatal(err)
	}
	leaderC := c2
	if killLeader {
		if leaderC, err = fluxkv.Connect(fluxkv.Options{Socket: o2.SocketPath(), Name: t.Name() + "-leader"}); err != nil {
			t.Fatal(err)
		}
	}
	// The leader's pull waits (hook) until the 63 others have queued behind its flight.
	const gets = 64
	release := make(chan struct{})
	o2.mu.Lock()
	o2.mu.afterWrite = func(int64) { <-release }
	o2.mu.Unlock()
	before := masterCalls(t, mm, "GetStart", "BatchGetStart")
	pulled := counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"})
	// Every holder is kept until all gets answered: an early release would let a get
	// that came late miss a holding it could have shared.
	type got struct {
		h   *fluxkv.MemHolder
		err error
	}
	results := make(chan got, gets)
	var wg sync.WaitGroup
	leaderDone := make(chan got, 1)
	wg.Go(func() {
		h, err := leaderC.Get(key)
		leaderDone <- got{h, err}
	})
	waitUntil(t, func() bool { st := o2.lock(); defer o2.unlock(); f := st.flights[key]; return f != nil && f.sent })
	others := gets - 1
	var queuedC *fluxkv.Client
	queuedDone := make(chan error, 1)
	if killQueued {
		if queuedC, err = fluxkv.Connect(fluxkv.Options{Socket: o2.SocketPath(), Name: t.Name() + "-queued"}); err != nil {
			t.Fatal(err)
		}
		go func() { _, err := queuedC.Get(key); queuedDone <- err }()
		waitUntil(t, func() bool { st := o2.lock(); defer o2.unlock(); return st.flights[key].next != nil })
		others--
	}
	for i := range others {
		c := c2
		if i%2 == 1 {
			c = c3
		}
		wg.Go(func() {
			h, err := c.Get(key)
			results <- got{h, err}
		})
	}
	waitUntil(t, func() bool {
		st := o2.lock()
		defer o2.unlock()
		f := st.flights[key]
		// The leader's call was sent before the others came: they queue for the flight
		// after it (its leader, and its followers).
		return f != nil && f.next != nil && f.followers+1+f.next.followers == gets-1
	})
	if killLeader {
		leaderC.Close()
		waitUntil(t, func() bool { st := o2.lock(); defer o2.unlock(); return len(st.sessions) == 2 })
	}
	if killQueued {
		queuedC.Close()
		waitUntil(t, func() bool { st := o2.lock(); defer o2.unlock(); return len(st.sessions) == 2 })
	}
	o2.mu.Lock()
	o2.mu.afterWrite = nil
	o2.mu.Unlock()
	close(release)
	wg.Wait()
	close(results)
	for r := range results {
		if r.err != nil {
			t.Fatalf("a follower's get: %v", r.err)
		}
		if !bytes.Equal(r.h.Bytes(), val) {
			t.Fatal("a follower's get: wrong bytes")
		}
		r.h.Release()
	}
	if killQueued {
		if err := <-queuedDone; err == nil {
			t.Fatal("the queued flight's leader got the value after its session ended")
		}
	}
	if r := <-leaderDone; killLeader != (r.err != nil) {
		t.Fatalf("the leader's get: %v", r.err)
	} else if r.err == nil {
		r.h.Release()
	}
	calls := callsSince(t, mm, before)
	plans := float64(calls["GetStart"] + calls["BatchGetStart"])
	pulls := (counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"}) - pulled) / float64(len(val))
	t.Logf("%d gets: %v master plans, %.0f pulls", gets, calls, pulls)
	if plans != wantPlans || pulls != wantPulls {
		t.Errorf("%d concurrent gets of one cold key: %v master plans and %.1f pulls, want %v and %v", gets, plans, pulls, wantPlans, wantPulls)
	}
	for _, c := range []*fluxkv.Client{c2, c3} {
		c.Flush()
		if st, err := c.Stat(); err != nil || st.ClientHolders != 0 {
			t.Fatalf("holders left: %v %v", st.GetClientHolders(), err)
		}
	}
	st := o2.lock()
	defer o2.unlock()
	if len(st.flights) != 0 {
		t.Fatalf("%d flights left", len(st.flights))
	}
}

// TestFlightFollowersTakeADeadLeadersHolding: the followers of a flight whose leader's
// session ended while its pull ran take their holders of the value it pulled, as they
// would had the leader lived, instead of planning and pulling again. Without promotion
// (a pulled value is no replica here): a first get's flight, a flight queued behind it
// whose leader is killed during its own pull, and gets that joined that flight before
// its call was sent: two plans and two pulls in all (four of each before: the followers
// planned again), every
// follower's bytes right, and no holder left on either side once they are released.
// The same when the leader's session is at its holder cap when the value lands.
func TestFlightFollowersTakeADeadLeadersHolding(t *testing.T) {
	t.Parallel()
	for _, capped := range []bool{false, true} {
		t.Run(fmt.Sprintf("leader at its holder cap=%t", capped), func(t *testing.T) {
			t.Parallel()
			testFlightFollowersTakeALeadersHolding(t, capped)
		})
	}
}

func testFlightFollowersTakeALeadersHolding(t *testing.T, capped bool) {
	mm := metrics.New()
	n := startNode(t, 64<<20, nil, master.Options{Metrics: mm, Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true})
	om := metrics.New()
	o2, c2 := n.addOwner(t, "n2", 64<<20, nil, func(o *Options) { o.Metrics = om })
	connect := func(name string) *fluxkv.Client {
		c, err := fluxkv.Connect(fluxkv.Options{Socket: o2.SocketPath(), Name: t.Name() + "-" + name})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	const followers = 4
	var fcs []*fluxkv.Client // a session each: with the cap at 1, each holds one holder
	for i := range followers {
		c := connect(fmt.Sprintf("follower-%d", i))
		defer c.Close()
		fcs = append(fcs, c)
	}
	queuedC := connect("queued")
	defer queuedC.Close()
	const key = "orphan"
	val := value(9, 1<<20+5)
	if err := n.c.Put(key, val); err != nil {
		t.Fatal(err)
	}
	if capped {
		if err := c2.Put("here", value(3, 1000)); err != nil {
			t.Fatal(err)
		}
		h, err := c2.Get("here") // into the hot set: the queued leader's get of it asks no master
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
		c2.Flush()
		st := o2.lock()
		st.maxHolders = 1
		o2.unlock()
	}
	// Each pull waits (hook) until its turn: the first until the queue behind it has
	// formed, the queued flight's until its leader's session has ended.
	turns := []chan struct{}{make(chan struct{}), make(chan struct{})}
	pulling := make(chan int, 2)
	var pulls atomic.Int32
	o2.mu.Lock()
	o2.mu.afterWrite = func(int64) {
		i := int(pulls.Add(1)) - 1
		pulling <- i
		if i < len(turns) {
			<-turns[i]
		}
	}
	o2.mu.Unlock()
	defer func() {
		o2.mu.Lock()
		o2.mu.afterWrite = nil
		o2.mu.Unlock()
	}()
	before := masterCalls(t, mm, "GetStart", "BatchGetStart")
	pulled := counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"})
	type got struct {
		h   *fluxkv.MemHolder
		err error
	}
	first := make(chan got, 1)
	go func() { h, err := c2.Get(key); first <- got{h, err} }()
	if i := <-pulling; i != 0 {
		t.Fatalf("pull %d first", i)
	}
	queued := make(chan error, 1)
	go func() { _, err := queuedC.Get(key); queued <- err }()
	waitUntil(t, func() bool { st := o2.lock(); defer o2.unlock(); return st.flights[key].next != nil })
	results := make(chan got, followers)
	for _, c := range fcs {
		go func() { h, err := c.Get(key); results <- got{h, err} }()
	}
	waitUntil(t, func() bool { st := o2.lock(); defer o2.unlock(); return st.flights[key].next.followers == followers })
	close(turns[0]) // the first flight lands; the queued one plans and pulls
	if i := <-pulling; i != 1 {
		t.Fatalf("pull %d second", i)
	}
	var here *fluxkv.MemHolder
	if capped { // the queued leader's session takes its one holder while its pull runs
		var err error
		if here, err = queuedC.Get("here"); err != nil {
			t.Fatal(err)
		}
	} else {
		queuedC.Close()
		waitUntil(t, func() bool { st := o2.lock(); defer o2.unlock(); return len(st.sessions) == 1+followers })
	}
	close(turns[1])
	if err := <-queued; err == nil {
		t.Error("the queued flight's leader got the value after its session ended or while at its holder cap")
	} else if capped && wire.CodeOf(err) != common.ErrorCode_NO_SPACE {
		t.Errorf("the queued flight's leader at its holder cap: %v, want NO_SPACE", err)
	}
	if here != nil {
		here.Release()
	}
	r := <-first
	if r.err != nil {
		t.Fatalf("first get: %v", r.err)
	}
	r.h.Release()
	for range followers {
		r := <-results
		if r.err != nil {
			t.Fatalf("a follower's get: %v", r.err)
		}
		if !bytes.Equal(r.h.Bytes(), val) {
			t.Fatal("a follower's get: wrong bytes")
		}
		r.h.Release()
	}
	calls := callsSince(t, mm, before)
	plans := calls["GetStart"] + calls["BatchGetStart"]
	moved := (counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"}) - pulled) / float64(len(val))
	t.Logf("master calls %v, %.0f pulls", calls, moved)
	if plans != 2 || moved != 2 {
		t.Errorf("%v master plans and %.1f pulls, want 2 and 2: the followers planned again", calls, moved)
	}
	c2.Flush()
	queuedC.Flush()
	for _, c := range fcs {
		c.Flush()
	}
	// Nothing left on the owner (a release the client sent in the background may still
	// be on its way) nor at the master.
	waitUntil(t, func() bool {
		st := o2.lock()
		defer o2.unlock()
		return len(st.flights) == 0 && st.writes.count(writeHolder) == 0
	})
	waitUntil(t, func() bool {
		st, err := fcs[0].Stat()
		if err != nil {
			return false
		}
		for _, m := range st.Members {
			if m.Holders != 0 {
				return false
			}
		}
		return st.ClientHolders == 0
	})
}

// prefix runs a prefix lookup through the owner's handler on c's session.
func prefix(t *testing.T, o *Owner, c *fluxkv.Client, keys []string, pinMS int64) (int32, *external.BatchExistsResponse) {
	t.Helper()
	c.Flush()
	h := &externalHandler{o}
	resp, err := h.BatchExists(context.Background(), &external.BatchExistsRequest{Session: sessionOf(c), Keys: keys, Prefix: true, PinMs: pinMS})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Found, resp
}

// TestPrefixLookup: the count of leading keys present stops at the first gap (absent or
// invalid key) with results only up to it; pins bring the found pages in, keep them
// through memory pressure that evicts unpinned ones, end by themselves, and end with
// their session.
func TestPrefixLookup(t *testing.T) {
	t.Parallel()
	const dram = 16 << 20
	n := startNode(t, dram, nil, master.Options{InsecureCluster: true})
	var keys []string
	for i := range 10 {
		k := fmt.Sprintf("page-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	gap := append(append(append([]string{}, keys[:5]...), "page-absent"), keys[5:]...)
	for _, tc := range []struct {
		name    string
		keys    []string
		found   int32
		results int
		code    common.ErrorCode
	}{
		{"all", keys, 10, 10, common.ErrorCode_OK},
		{"gap", gap, 5, 6, common.ErrorCode_OK},
		{"first-absent", append([]string{"page-absent"}, keys...), 0, 1, common.ErrorCode_OK},
		{"invalid", append(append([]string{}, keys[:3]...), "", keys[3]), 3, 4, common.ErrorCode_INVALID_ARGUMENT},
		{"empty", nil, 0, 0, common.ErrorCode_OK},
	} {
		found, resp := prefix(t, n.o, n.c, tc.keys, 0)
		if resp.Code != common.ErrorCode_OK || found != tc.found || len(resp.Results) != tc.results {
			t.Errorf("%s: code %v found %d results %d, want found %d results %d", tc.name, resp.Code, found, len(resp.Results), tc.found, tc.results)
			continue
		}
		if tc.results > 0 && resp.Results[tc.results-1].Code != tc.code {
			t.Errorf("%s: last result %v, want %v", tc.name, resp.Results[tc.results-1].Code, tc.code)
		}
	}
	for _, pin := range []int64{-1, int64(external.MAX_PIN_MS) + 1} {
		if _, resp := prefix(t, n.o, n.c, keys, pin); resp.Code != common.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("pin_ms %d: %v, want INVALID_ARGUMENT", pin, resp.Code)
		}
	}

	// Pin the first 4 pages, then put 2× DRAM of other values: the pinned pages stay
	// in memory, an unpinned one (page-9) is evicted. (The renewing lookups find the
	// pages in the hot set: only a pin keeps them there.)
	if found, resp := prefix(t, n.o, n.c, keys[:4], int64(external.MAX_PIN_MS)); found != 4 {
		t.Fatalf("pinned lookup: found %d (%v)", found, resp.Results)
	}
	pinned := func() int { st := n.o.lock(); defer n.o.unlock(); return st.pinned() }
	if got := pinned(); got != 4 {
		t.Fatalf("%d pins, want 4", got)
	}
	// The pins are renewed by a new lookup every 4 puts (each interval well inside
	// MAX_PIN_MS even on a slow machine), as an engine renews what it is about to load.
	for i := range 2 * dram / (1 << 20) {
		if err := n.c.Put(fmt.Sprintf("pressure-%d", i), value(100+i, 1<<20)); err != nil {
			t.Fatalf("put under pins: %v", err)
		}
		if i%4 == 3 {
			if found, resp := prefix(t, n.o, n.c, keys[:4], int64(external.MAX_PIN_MS)); found != 4 {
				t.Fatalf("renewing the pins after %d puts: found %d (%v)", i+1, found, resp.Results)
			}
		}
	}
	if got := pinned(); got != 4 {
		t.Fatalf("%d pins left of 4", got)
	}
	for i, k := range keys[:4] {
		h, err := n.c.Get(k)
		if err != nil {
			t.Fatalf("pinned %s after pressure: %v", k, err)
		}
		if !bytes.Equal(h.Bytes(), value(i, 1<<20)) {
			t.Fatalf("pinned %s: wrong bytes", k)
		}
		h.Release()
	}
	if _, err := n.c.Get("page-9"); !errors.Is(err, fluxkv.ErrKeyNotFound) {
		t.Fatalf("unpinned page-9 after 2× DRAM of puts: %v, want evicted", err)
	}
	if got := pinned(); got != 0 {
		t.Fatalf("the session's gets did not take over its pins: %d left", got)
	}

	// Short pins end by themselves; pins end with their session.
	if found, _ := prefix(t, n.o, n.c, keys[:4], 50); found != 4 {
		t.Fatalf("short pins: found %d", found)
	}
	waitUntil(t, func() bool { return pinned() == 0 })
	c2, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: t.Name() + "-2"})
	if err != nil {
		t.Fatal(err)
	}
	if found, _ := prefix(t, n.o, c2, keys[:3], int64(external.MAX_PIN_MS)); found != 3 || pinned() != 3 {
		t.Fatalf("second session: found %d, %d pins", found, pinned())
	}
	c2.Close()
	waitUntil(t, func() bool { return pinned() == 0 })
	n.c.Flush()
	if st, err := n.c.Stat(); err != nil || st.ClientHolders != 0 {
		t.Fatalf("holders left: %v %v", st.GetClientHolders(), err)
	}
}

// TestPrefixPinsWithoutHotSet: an owner whose hot set is off (--hot-set off) still pins
// what a prefix lookup found (the pins have the default hot set's share of the pool),
// so the lookup counts the pages instead of stopping at the first.
func TestPrefixPinsWithoutHotSet(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true}, func(o *Options) { o.HotSet = -1 })
	keys := []string{"page-0", "page-1", "page-2"}
	for i, k := range keys {
		if err := n.c.Put(k, value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	pinned := func() int { st := n.o.lock(); defer n.o.unlock(); return st.pinned() }
	if found, resp := prefix(t, n.o, n.c, keys, int64(external.MAX_PIN_MS)); found != 3 || pinned() != 3 {
		t.Fatalf("found %d (%v), %d pins; want 3 and 3", found, resp.Results, pinned())
	}
	for i, k := range keys {
		h, err := n.c.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(h.Bytes(), value(i, 1<<20)) {
			t.Fatalf("%s: wrong bytes", k)
		}
		h.Release()
	}
	if got := pinned(); got != 0 {
		t.Fatalf("the gets did not take over the pins: %d left", got)
	}
	n.c.Flush()
	if st, err := n.c.Stat(); err != nil || st.ClientHolders != 0 {
		t.Fatalf("holders left: %v %v", st.GetClientHolders(), err)
	}
}

// TestBatchPutEndRepeatedItem: a BatchPutEnd naming one put twice answers both items
// with the put's outcome (the second waits for the first's publish in the same call
// instead of for itself), and the value reads back.
func TestBatchPutEndRepeatedItem(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	h := &externalHandler{n.o}
	ctx := context.Background()
	val := value(3, 5000)
	n.c.Flush()
	start, _ := h.BatchPutStart(ctx, &external.BatchPutStartRequest{Session: sessionOf(n.c),
		Items: []*external.PutStartItem{{Key: "twice", Len: int64(len(val))}}})
	if start.Code != common.ErrorCode_OK || start.Results[0].Code != common.ErrorCode_OK {
		t.Fatalf("put start: %v %v", start.Code, start.Results)
	}
	r := start.Results[0]
	copy(n.o.seg.Bytes()[r.Offset:], val)
	item := &external.PutEndItem{Key: "twice", PutId: r.PutId}
	done := make(chan *external.BatchPutEndResponse, 1)
	go func() {
		end, _ := h.BatchPutEnd(ctx, &external.BatchPutEndRequest{Session: sessionOf(n.c), Items: []*external.PutEndItem{item, item}})
		done <- end
	}()
	select {
	case end := <-done:
		if end.Code != common.ErrorCode_OK || len(end.Results) != 2 || end.Results[0].Code != common.ErrorCode_OK || end.Results[1].Code != common.ErrorCode_OK {
			t.Fatalf("put end of one put twice: %v %v", end.Code, end.Results)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a BatchPutEnd naming one put twice did not answer")
	}
	hd, err := n.c.Get("twice")
	if err != nil || !bytes.Equal(hd.Bytes(), val) {
		t.Fatalf("get after the put: %v", err)
	}
	hd.Release()
}

// TestFlightMissNotSharedAfterInvalidation: a follower takes the leader's KEY_NOT_FOUND
// (landed as a get lands it, marking the key absent) only while no invalidation of the
// key (a put through this owner) happened since the leader missed; else it plans again.
// A get that comes after the leader's master call was sent follows no answer of that
// call (it may predate a put elsewhere that returned before the get began): it leads
// the flight queued behind, which the gets after it follow, and a get coming once that
// one's call was sent queues behind it in turn.
func TestFlightMissNotSharedAfterInvalidation(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	n.c.Flush()
	notFound := errCode(common.ErrorCode_KEY_NOT_FOUND, "not found")
	for _, invalidated := range []bool{false, true} {
		st := n.o.lock()
		c := st.sessions[n.c.ClientID()]
		seq := st.hot.invalSeq()
		f, lead := st.joinFlight("k", seq)
		g, gLead := st.joinFlight("k", seq)
		f.sent = true
		q, qLead := st.joinFlight("k", seq)
		r, rLead := st.joinFlight("k", seq)
		if invalidated {
			st.invalidate("k", math.MaxInt64) // a put while the leader's call was out
		}
		n.o.unlock()
		if !lead || gLead || g != f {
			t.Fatal("the second get did not follow the first's flight")
		}
		if !qLead || q == f || q.after != f || rLead || r != q {
			t.Fatal("the gets after the first's call was sent did not queue for one flight behind it")
		}
		n.o.land(c, getLeg{key: "k", seq: seq, f: f}, nil, nil, notFound, true, make([]getResult, 1))
		if _, _, shared := n.o.follow(c, getLeg{key: "k", f: f}); shared == invalidated {
			t.Errorf("invalidated %v: the follower shared the miss: %v", invalidated, shared)
		}
		st = n.o.lock()
		head := st.flights["k"]
		q.sent, q.after = true, nil
		u, uLead := st.joinFlight("k", seq)
		st.endFlight("k", q, notFound)
		head2 := st.flights["k"]
		st.endFlight("k", u, notFound)
		left := len(st.flights)
		n.o.unlock()
		if head != q || !uLead || u.after != q || head2 != u || left != 0 {
			t.Fatalf("flights after the first landed: head %p (queued %p), next queued %v behind %p, then head %p, %d left",
				head, q, uLead, u.after, head2, left)
		}
	}
}

// TestFlightNoSpaceSharedAfterAWait: a get that waited roomWaitShared or longer on a
// flight of its key that found no room (NO_SPACE) takes that answer, following the
// flight or queued behind it, instead of planning again (another wait for room under the
// same pressure); one that joined just now plans on its own (here: the key is absent),
// as that NO_SPACE may have been the flight's batch's own, answered at once.
func TestFlightNoSpaceSharedAfterAWait(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	n.c.Flush()
	noSpace := errCode(common.ErrorCode_NO_SPACE, "no space")
	for _, waited := range []bool{false, true} {
		joined := time.Now()
		if waited {
			joined = joined.Add(-roomWaitShared)
		}
		st := n.o.lock()
		c := st.sessions[n.c.ClientID()]
		seq := st.hot.invalSeq()
		f, _ := st.joinFlight("k", seq)
		g, _ := st.joinFlight("k", seq)
		f.sent = true
		q, _ := st.joinFlight("k", seq)
		n.o.unlock()
		if g != f || q.after != f {
			t.Fatal("the second get did not follow the first's flight, or the third did not queue behind it")
		}
		n.o.land(c, getLeg{key: "k", seq: seq, f: f}, nil, nil, noSpace, true, make([]getResult, 1))
		r, _, answered := n.o.follow(c, getLeg{key: "k", f: g, joined: joined})
		if answered != waited || (answered && wire.CodeOf(r.err) != common.ErrorCode_NO_SPACE) {
			t.Errorf("waited %v: the follower answered %v (%v); want the NO_SPACE only after the wait", waited, answered, r.err)
		}
		out := make([]getResult, 1)
		n.o.leadLanded(c, []getLeg{{key: "k", seq: seq, f: q, joined: joined}}, out)
		want := common.ErrorCode_KEY_NOT_FOUND // planned
		if waited {
			want = common.ErrorCode_NO_SPACE
		}
		if got := wire.CodeOf(out[0].err); got != want {
			t.Errorf("waited %v: the queued get answered %v (%v), want %v", waited, got, out[0].err, want)
		}
		st = n.o.lock()
		left := len(st.flights)
		n.o.unlock()
		if left != 0 {
			t.Fatalf("waited %v: %d flights left", waited, left)
		}
	}
}

// roomHeld starts a node (n1, its master counting into mm, puts kept on their
// requester) and a second owner n2 of 8 MiB without transfer area or hot set, where its
// client c2 puts a value of held bytes and holds it to the end of the test: the room a
// get through n2 of a value n1 holds needs is short while it is held.
func roomHeld(t *testing.T, mm *metrics.Metrics, held int) (*node, *Owner, *fluxkv.Client) {
	t.Helper()
	n := startNode(t, 32<<20, nil, master.Options{Metrics: mm, Placement: master.PlacementLocal, InsecureCluster: true})
	o2, c2 := n.addOwner(t, "n2", 8<<20, nil, func(o *Options) { o.TransferReserve = -1; o.CacheGrace = -1 })
	if err := c2.Put("other", value(1, held)); err != nil {
		t.Fatal(err)
	}
	other, err := c2.Get("other")
	if err != nil || other == nil {
		t.Fatalf("get other: %v", err)
	}
	t.Cleanup(func() { other.Release() })
	return n, o2, c2
}

// TestQueuedGetTakesTheWaitForRoom: a get queued behind another session's flight of its
// key, which waited the master's whole AllocWait for room and found none, answers that
// NO_SPACE when the flight lands, not after a plan and a wait of its own: one GetStart
// in all (two, and twice the wait, before).
func TestQueuedGetTakesTheWaitForRoom(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	n, o2, c2 := roomHeld(t, mm, 6<<20)
	c3, err := fluxkv.Connect(fluxkv.Options{Socket: o2.SocketPath(), Name: t.Name() + "-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if err := n.c.Put("big", value(3, 3<<20)); err != nil {
		t.Fatal(err)
	}
	before := masterCalls(t, mm, "GetStart", "BatchGetStart")
	first := make(chan error, 1)
	go func() {
		h, err := c2.Get("big")
		if h != nil {
			h.Release()
		}
		first <- err
	}()
	waitUntil(t, func() bool { st := o2.lock(); defer o2.unlock(); f := st.flights["big"]; return f != nil && f.sent })
	start := time.Now()
	h, err := c3.Get("big")
	took := time.Since(start)
	if h != nil {
		h.Release()
	}
	if !errors.Is(err, fluxkv.ErrNoSpace) {
		t.Errorf("queued get: %v, want NO_SPACE (other's holder keeps the room)", err)
	}
	if err := <-first; !errors.Is(err, fluxkv.ErrNoSpace) {
		t.Errorf("first get: %v, want NO_SPACE", err)
	}
	calls := callsSince(t, mm, before)
	t.Logf("queued get took %v; master calls %v", took, calls)
	if calls["GetStart"] != 1 || calls["BatchGetStart"] != 0 {
		t.Errorf("master calls %v, want the first get's GetStart alone", calls)
	}
}

// TestBatchGetQueuedLeg: a batch get one of whose keys queues behind another session's
// flight of it (sent, its pull held) brings its other key in meanwhile, then answers the
// queued key from the replica that flight left: two plans and two pulls in all, every
// byte right.
func TestBatchGetQueuedLeg(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	n := startNode(t, 64<<20, nil, master.Options{Metrics: mm, Placement: master.PlacementLocal, InsecureCluster: true})
	om := metrics.New()
	o2, c2 := n.addOwner(t, "n2", 64<<20, nil, func(o *Options) { o.Metrics = om })
	c3, err := fluxkv.Connect(fluxkv.Options{Socket: o2.SocketPath(), Name: t.Name() + "-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	vals := map[string][]byte{"qa": value(1, 256<<10), "qb": value(2, 256<<10)}
	for k, v := range vals {
		if err := n.c.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	release := make(chan struct{})
	var first atomic.Bool
	o2.mu.Lock()
	o2.mu.afterWrite = func(int64) {
		if first.CompareAndSwap(false, true) {
			<-release // the first get's pull of qa, written, not yet landed
		}
	}
	o2.mu.Unlock()
	before := masterCalls(t, mm, "GetStart", "BatchGetStart")
	pulled := counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"})
	leader := make(chan error, 1)
	go func() {
		h, err := c2.Get("qa")
		if err == nil {
			if !bytes.Equal(h.Bytes(), vals["qa"]) {
				err = fmt.Errorf("wrong bytes")
			}
			h.Release()
		}
		leader <- err
	}()
	waitUntil(t, func() bool { return first.Load() })
	batch := make(chan error, 1)
	go func() {
		hs, errs, err := c3.BatchGet([]string{"qa", "qb"})
		if err == nil {
			for i, k := range []string{"qa", "qb"} {
				if errs[i] != nil {
					err = fmt.Errorf("%s: %w", k, errs[i])
				} else if hs[i] == nil || !bytes.Equal(hs[i].Bytes(), vals[k]) {
					err = fmt.Errorf("%s: wrong bytes or a miss", k)
				}
				if hs[i] != nil {
					hs[i].Release()
				}
			}
		}
		batch <- err
	}()
	// qb comes in while qa's first flight is still held.
	waitUntil(t, func() bool {
		return counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"})-pulled >= float64(2*len(vals["qb"]))
	})
	o2.mu.Lock()
	o2.mu.afterWrite = nil
	o2.mu.Unlock()
	close(release)
	if err := <-leader; err != nil {
		t.Fatalf("the first get of qa: %v", err)
	}
	if err := <-batch; err != nil {
		t.Fatalf("the batch get: %v", err)
	}
	calls := callsSince(t, mm, before)
	pulls := (counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"}) - pulled) / float64(len(vals["qa"]))
	if plans := calls["GetStart"] + calls["BatchGetStart"]; plans != 2 || pulls != 2 {
		t.Errorf("master plans %v and %.1f pulls, want 2 and 2", calls, pulls)
	}
}

// TestGetOneFlightAbsentKey: 64 concurrent gets of a key nobody holds make two master
// plans: the first get's, whose KEY_NOT_FOUND the gets that joined before it was sent
// share, and one for the gets that came while it was out (queued behind it).
func TestGetOneFlightAbsentKey(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	n := startNode(t, 16<<20, nil, master.Options{Metrics: mm, InsecureCluster: true})
	gate := &heldGetStart{release: make(chan struct{})}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { gate.Client = c; return gate })
	const gets = 64
	before := masterCalls(t, mm, "GetStart", "BatchGetStart")
	errs := make(chan error, gets)
	var wg sync.WaitGroup
	wg.Go(func() { _, err := n.c.Get("absent"); errs <- err })
	waitUntil(t, func() bool { return gate.held.Load() })
	for range gets - 1 {
		wg.Go(func() { _, err := n.c.Get("absent"); errs <- err })
	}
	waitUntil(t, func() bool {
		st := n.o.lock()
		defer n.o.unlock()
		f := st.flights["absent"]
		return f != nil && f.next != nil && 1+f.next.followers == gets-1
	})
	close(gate.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, fluxkv.ErrKeyNotFound) {
			t.Fatalf("a get of an absent key: %v", err)
		}
	}
	calls := callsSince(t, mm, before)
	if plans := calls["GetStart"] + calls["BatchGetStart"]; plans != 2 {
		t.Errorf("%d concurrent gets of an absent key made %v master plans, want 2", gets, calls)
	}
}

// heldGetStart is the owner's master client with its first GetStart held until release.
type heldGetStart struct {
	masterservice.Client
	release chan struct{}
	held    atomic.Bool
}

func (g *heldGetStart) GetStart(ctx context.Context, req *mp.GetStartRequest, opts ...callopt.Option) (*mp.GetStartResponse, error) {
	if g.held.CompareAndSwap(false, true) {
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Client.GetStart(ctx, req, opts...)
}

// TestBatchReplansAgedPlans: a batch's plan that waited longer than planMaxAge for a
// worker (every worker held by the test inside an SSD refill) is revoked and planned
// again with GetStart before its transfer starts, and its key still reads back
// byte-exact. (Values pulled from another owner's memory are pulled for the whole
// batch at once, right after its plan: TestBatchPullsPerSource.)
func TestBatchReplansAgedPlans(t *testing.T) {
	t.Parallel()
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("revoke-lost=%v", lost), func(t *testing.T) {
			t.Parallel()
			replansAgedPlan(t, lost)
		})
	}
}

// replansAgedPlan is TestBatchReplansAgedPlans; with lostRevoke the aged plan's GetRevoke
// never reaches the master, and the holder the master recorded for that refill at its
// BatchGetStart (kept by an expiry) must be released by the owner all the same.
func replansAgedPlan(t *testing.T, lostRevoke bool) {
	mm := metrics.New()
	n := startNode(t, 4<<20, ssdOptions(t, 64<<20), master.Options{Metrics: mm, InsecureCluster: true, NoPromotion: true},
		func(o *Options) { o.CacheGrace = -1 })
	keys := make([]string, getParallel+1)
	for i := range keys {
		keys[i] = fmt.Sprintf("aged-%d", i)
		if err := n.c.Put(keys[i], value(i, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 { // 3x DRAM: the keys above are on SSD only
		if err := n.c.Put(fmt.Sprintf("aged-filler-%d", i), value(100+i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	o2, c2 := n.o, n.c
	lost := &revokeLost{}
	if lostRevoke {
		n.wrapMaster(func(c masterservice.Client) masterservice.Client { lost.Client = c; return lost })
	}
	var held sync.WaitGroup
	held.Add(getParallel)
	var once sync.Map
	release := make(chan struct{})
	o2.mu.Lock()
	o2.mu.afterWrite = func(id int64) {
		if _, dup := once.LoadOrStore(id, true); !dup {
			select {
			case <-release:
			default:
				held.Done()
				<-release
			}
		}
	}
	o2.mu.Unlock()
	before := masterCalls(t, mm, "GetStart", "BatchGetStart", "GetRevoke")
	done := batchGetAsync(c2, keys)
	held.Wait() // every worker is inside a transfer; the last key's plan waits
	time.Sleep(planMaxAge + 500*time.Millisecond)
	close(release)
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	for i, h := range a.hs {
		if a.errs[i] != nil || h == nil || !bytes.Equal(h.Bytes(), value(i, 4096)) {
			t.Fatalf("%s: %v (holder %v)", keys[i], a.errs[i], h != nil)
		}
		if h.Source() != "ssd" {
			t.Errorf("%s came from %s, want an SSD refill", keys[i], h.Source())
		}
		h.Release()
	}
	calls := callsSince(t, mm, before)
	if revokes := calls["GetRevoke"] + int(lost.lost.Load()); calls["BatchGetStart"] != 1 || calls["GetStart"] != 1 || revokes != 1 {
		t.Fatalf("master calls %v (%d revokes lost), want 1 BatchGetStart, then 1 GetRevoke and 1 GetStart for the aged plan",
			calls, lost.lost.Load())
	}
	c2.Flush()
	n.o.acks.sync()
	waitUntil(t, func() bool { return nodeHolders(t, n.m) == 0 })
}

// TestBatchPlanOutlivesTheWaitForRoom: a batch whose BatchGetStart waited the master's
// whole AllocWait (its default, 5 s) for room for one key, which another client's holder
// keeps (the key fails NO_SPACE), carries out the plan that call made for its other key:
// one pull, no GetStart of its own. With plans carried out up to 5 s old, every plan
// of such a batch was revoked and planned again, one GetStart each, each free to wait
// another AllocWait.
func TestBatchPlanOutlivesTheWaitForRoom(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	n, _, c2 := roomHeld(t, mm, 5<<20)
	small, big := value(2, 1<<20), value(3, 3<<20)
	if err := n.c.Put("small", small); err != nil {
		t.Fatal(err)
	}
	if err := n.c.Put("big", big); err != nil {
		t.Fatal(err)
	}
	before := masterCalls(t, mm, "GetStart", "BatchGetStart")
	start := time.Now()
	hs, errs, err := c2.BatchGet([]string{"small", "big"})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || hs[0] == nil || !bytes.Equal(hs[0].Bytes(), small) {
		t.Errorf("small: %v (held %v), want its bytes", errs[0], hs[0] != nil)
	}
	if !errors.Is(errs[1], fluxkv.ErrNoSpace) {
		t.Errorf("big: %v, want NO_SPACE (other's holder keeps the room)", errs[1])
	}
	for _, h := range hs {
		if h != nil {
			h.Release()
		}
	}
	calls := callsSince(t, mm, before)
	t.Logf("batch took %v; master calls %v", took, calls)
	if calls["BatchGetStart"] != 1 || calls["GetStart"] != 0 {
		t.Errorf("master calls %v, want one BatchGetStart and no GetStart (small's plan carried out after the %v wait)", calls, took)
	}
}
