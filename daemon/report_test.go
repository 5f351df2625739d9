package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// TestRegisterOnceAfterMasterRestart: after a master restart several callers ask for a
// registration at once (the heartbeat loop, and every call answered STALE_GENERATION);
// only the first registers and reports the replica index: a second would make the new
// master drop the incarnation the first rebuilt, and the owner its index.
func TestRegisterOnceAfterMasterRestart(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true})
	const keys = 10
	for i := range keys {
		if err := n.c.Put(fmt.Sprintf("k%d", i), value(i, 1000+i)); err != nil {
			t.Fatal(err)
		}
	}
	m2 := restartMaster(t, n)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := n.o.master.register(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	routes := 0
	m2.Inspect(func(st *master.State) { routes = st.Keys() })
	if routes != keys {
		t.Fatalf("the new master routes %d keys after the registrations, want %d", routes, keys)
	}
	for i := range keys {
		h, err := n.c.Get(fmt.Sprintf("k%d", i))
		if err != nil {
			t.Fatalf("get k%d: %v", i, err)
		}
		if !bytes.Equal(h.Bytes(), value(i, 1000+i)) {
			t.Fatalf("get k%d: wrong bytes", i)
		}
		h.Release()
	}
}

// TestLeaseEndsCachedGets: an owner answers from its cached holdings only while its
// lease runs (two heartbeat periods after the last heartbeat the master answered): with
// the master gone, a hot key is still served at once, and once the lease ran out the
// get goes to the master (and fails: it is gone) instead of answering what another
// owner's delete may have killed meanwhile.
//
// Not parallel: the get right after the master stops must land within the lease left
// (two 1 s heartbeat periods after the last heartbeat, less a margin: about 1 s).
func TestLeaseEndsCachedGets(t *testing.T) {
	n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true, HeartbeatInterval: time.Second, NodeTTL: 5 * time.Second})
	if err := n.c.Put("hot", value(1, 5000)); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the first get is a master trip; the second a hot-set hit
		h, err := n.c.Get("hot")
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	// A heartbeat answered just now: the lease then has its full 1.75 s left when the
	// master stops, not whatever the last periodic one left (as little as 0.75 s; a
	// review of flaky tests).
	heartbeatNow(t, n.o)
	n.m.Stop()
	stopped := time.Now()
	h, err := n.c.Get("hot")
	if err != nil {
		t.Fatalf("a hot-set get right after the master stopped (%v ago): %v", time.Since(stopped), err)
	}
	h.Release()
	time.Sleep(2 * time.Second) // the lease: at most 2 periods less a margin
	if h, err := n.c.Get("hot"); err == nil {
		h.Release()
		t.Fatal("a cached get was answered after the owner's lease ran out")
	}
}

// restartMaster stops n's master and starts a new one (empty, a new epoch) on its
// address, stopped when the test ends.
func restartMaster(t *testing.T, n *node) *master.Server {
	t.Helper()
	return restartMasterWith(t, n, master.Options{InsecureCluster: true})
}

// restartMasterWith is restartMaster with the new master's options.
func restartMasterWith(t *testing.T, n *node, opts master.Options) *master.Server {
	t.Helper()
	addr := n.m.Addr().String()
	n.m.Stop()
	m, err := master.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop() })
	return m
}

// commitHeld holds the first BatchSsdReplicaCommit until release closes, then fails it
// (its master is gone) or, with pass, sends it on; later ones pass.
type commitHeld struct {
	masterservice.Client
	entered, release chan struct{}
	pass             bool
	first            sync.Once
}

func (h *commitHeld) BatchSsdReplicaCommit(ctx context.Context, req *mp.BatchSsdReplicaCommitRequest, opts ...callopt.Option) (*mp.BatchSsdReplicaCommitResponse, error) {
	held := false
	h.first.Do(func() { held = true })
	if !held {
		return h.Client.BatchSsdReplicaCommit(ctx, req, opts...)
	}
	close(h.entered)
	<-h.release
	if h.pass {
		return h.Client.BatchSsdReplicaCommit(ctx, req, opts...)
	}
	return nil, errors.New("injected: the master that assigned the persist is gone")
}

// nodeWithCommitHeld is a node with SSD whose first SSD commit, of key "k" put here, is
// out and held (commitHeld, sent on with pass) when it returns.
func nodeWithCommitHeld(t *testing.T, pass bool) (*node, *commitHeld) {
	t.Helper()
	n := startNode(t, 8<<20, ssdOptions(t, 64<<20), master.Options{InsecureCluster: true})
	held := &commitHeld{entered: make(chan struct{}), release: make(chan struct{}), pass: pass}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { held.Client = c; return held })
	if err := n.c.Put("k", value(1, 100_000)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no SSD commit came")
	}
	return n, held
}

// TestReportLeavesCommitsInFlight: an SSD record whose commit to the master is still out
// when the owner registers with a new master is not reported to it. The owner forgets
// the record once the commit fails or it sees the master changed; a new master that
// adopted it would route gets to a record the owner no longer has (and, with
// --ssd-admit evict, drop the page's memory copy as clean). What the new master records
// on the owner's SSD is what the owner holds.
//
// Whether the held commit then fails or reaches the new master (which publishes it:
// the node reported the memory replica), the owner that forgets the record tells the
// master so (an eviction report).
func TestReportLeavesCommitsInFlight(t *testing.T) {
	t.Parallel()
	for _, pass := range []bool{false, true} {
		t.Run(fmt.Sprintf("commit reaches the new master=%t", pass), func(t *testing.T) {
			t.Parallel()
			testReportLeavesCommitsInFlight(t, pass)
		})
	}
}

func testReportLeavesCommitsInFlight(t *testing.T, pass bool) {
	n, held := nodeWithCommitHeld(t, pass)
	n.m = restartMaster(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	close(held.release)
	waitUntil(t, func() bool { return len(n.o.store.Committed()) == 0 }) // the record whose commit failed
	n.waitPersisted(t)                                                   // whatever the new master persists again
	waitUntil(t, func() bool { return n.ssdReplicasOf(t, "n1") == int64(len(n.o.store.Committed())) })
	h, err := n.c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Bytes(), value(1, 100_000)) {
		t.Error("wrong bytes")
	}
	h.Release()
}

// TestCommitKeptAcrossAFailedRegister: a registration that reported nothing (its Register
// failed; the heartbeat then reached the same master again) does not make an SSD commit
// that was out meanwhile forget a record the master published.
func TestCommitKeptAcrossAFailedRegister(t *testing.T) {
	t.Parallel()
	n, held := nodeWithCommitHeld(t, true)
	st := n.o.lock()
	_, prev := st.beginRegister(time.Now(), time.Minute)
	st.endRegister(nil, time.Now(), prev) // the Register call failed
	n.o.unlock()
	close(held.release)
	n.waitPersisted(t)
	if master, owner := n.ssdReplicasOf(t, "n1"), len(n.o.store.Committed()); master != 1 || owner != 1 {
		t.Errorf("the master records %d SSD replicas on the owner, which holds %d; want the one published", master, owner)
	}
}

// reportHeld holds the first ReportReplicas until release closes, then sends it on.
type reportHeld struct {
	masterservice.Client
	entered, release chan struct{}
	first            sync.Once
}

func (h *reportHeld) ReportReplicas(ctx context.Context, req *mp.ReportReplicasRequest, opts ...callopt.Option) (*mp.ReportReplicasResponse, error) {
	held := false
	h.first.Do(func() { held = true })
	if held {
		close(h.entered)
		<-h.release
	}
	return h.Client.ReportReplicas(ctx, req, opts...)
}

// TestEvictionDuringAReport: SSD records the ring overwrites while the owner reports
// them to a new master are not adopted there. The eviction reports reach the master
// before the records' report batch; it refuses them until the report ended (it would
// otherwise find no route to clear, then adopt the gone records and route gets to them).
func TestEvictionDuringAReport(t *testing.T) {
	t.Parallel()
	n, ids := persistedOnASmallRing(t)
	held := &reportHeld{entered: make(chan struct{}), release: make(chan struct{})}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { held.Client = c; return held })
	n.m = restartMaster(t, n)
	regDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		regDone <- n.o.master.register(ctx)
	}()
	select {
	case <-held.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no replica report came")
	}
	overwriteRing(t, n, ids)
	time.Sleep(300 * time.Millisecond) // the eviction reports go out (and are refused)
	close(held.release)
	if err := <-regDone; err != nil {
		t.Fatal(err)
	}
	held6 := func() (c int64) { // of the six, those on the ring (the new master may persist them again)
		for k, id := range ids {
			if n.o.store.Contains(k, id) {
				c++
			}
		}
		return c
	}
	waitUntil(t, func() bool { return n.ssdReplicasOf(t, "n1") == held6() })
}

// registerLost holds the first Register until release, then fails it in transport (the
// master never took it); while cut is set every heartbeat fails in transport, so the
// registration's check heartbeat does not spare it.
type registerLost struct {
	masterservice.Client
	cut              atomic.Bool
	entered, release chan struct{}
	first            sync.Once
}

func (l *registerLost) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if l.cut.Load() {
		return nil, errors.New("link cut (fault injected by the test)")
	}
	return l.Client.Heartbeat(ctx, req, o...)
}

func (l *registerLost) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	l.first.Do(func() {
		close(l.entered)
		<-l.release
	})
	l.cut.Store(false)
	return nil, errors.New("connection reset (fault injected by the test: the Register never reached the master)")
}

// TestEvictionReportsUnderARegistrationNotTaken: SSD records the ring overwrites while a
// Register is out that the master never takes are reported under the registration's new
// generation, which the master does not know (STALE_GENERATION); the owner goes back to
// the generation before, and the reports reach the master under it. They were dropped
// for good: the master kept SSD replicas of records the ring had overwritten (a review).
func TestEvictionReportsUnderARegistrationNotTaken(t *testing.T) {
	t.Parallel()
	n, ids := persistedOnASmallRing(t)
	g1 := n.o.nodeGen()
	l := &registerLost{entered: make(chan struct{}), release: make(chan struct{})}
	l.cut.Store(true)
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { l.Client = c; return l })
	regDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		regDone <- n.o.master.register(ctx)
	}()
	select {
	case <-l.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("no Register came")
	}
	overwriteRing(t, n, ids)
	time.Sleep(300 * time.Millisecond) // the eviction reports go out under the new generation
	close(l.release)
	if err := <-regDone; err == nil {
		t.Fatal("a registration the master never took succeeded")
	}
	if g := n.o.nodeGen(); g != g1 {
		t.Fatalf("the owner names generation %d, want %d: the one the master still has", g, g1)
	}
	waitUntil(t, func() bool { return n.ssdReplicasOf(t, "n1") == 0 })
}

// forgetBeforeCommit applies, to the records of the first BatchSsdReplicaCommit, what an
// SSD-drop notice of their versions does (Storage.Forget), before it reaches the master.
type forgetBeforeCommit struct {
	masterservice.Client
	o     *Owner
	calls atomic.Int32
}

func (f *forgetBeforeCommit) BatchSsdReplicaCommit(ctx context.Context, req *mp.BatchSsdReplicaCommitRequest, o ...callopt.Option) (*mp.BatchSsdReplicaCommitResponse, error) {
	if f.calls.Add(1) == 1 {
		for _, it := range req.Items {
			f.o.store.Forget(it.Key, it.PutId)
		}
	}
	return f.Client.BatchSsdReplicaCommit(ctx, req, o...)
}

// TestCommitOfAForgottenRecordIsReported: a record forgotten while its commit is out (an
// SSD-drop notice of the version, applied and acked before the late commit arrived, which
// the master publishes since the owner still holds the memory copy) is reported to the
// master as evicted. The master counted an SSD replica that no longer existed, routed
// gets to it and evicted the memory copy as clean (a review).
func TestCommitOfAForgottenRecordIsReported(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, ssdOptions(t, 64<<20), master.Options{InsecureCluster: true})
	f := &forgetBeforeCommit{o: n.o}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { f.Client = c; return f })
	if err := n.c.Put("k", value(1, 256<<10)); err != nil {
		t.Fatal(err)
	}
	h, err := n.c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	id := h.PutID()
	h.Release()
	waitUntil(t, func() bool { return f.calls.Load() > 0 })
	n.waitPersisted(t)
	waitUntil(t, func() bool {
		on := int64(0)
		if n.o.store.Contains("k", id) { // (the master may persist it again)
			on = 1
		}
		return n.ssdReplicasOf(t, "n1") == on
	})
}

// skipTerm restarts n's master as the term after one n never registered with, which n
// learns as how says: "seen" on etcd (its watch saw that term lead), or "named" by the
// new master (RegisterResponse.last_term_epoch: a term its watch never saw); "none":
// the term before the new master is the one n registered with (no term skipped).
func skipTerm(t *testing.T, n *node, how string) {
	t.Helper()
	e1 := n.o.masterEpoch()
	opts := master.Options{InsecureCluster: true, Epoch: e1 + 2}
	switch how {
	case "seen":
		n.o.sawLeaderEpoch(e1 + 1)
	case "named":
		opts.LastTermEpoch = e1 + 1
	case "none":
		opts.LastTermEpoch = e1
	}
	n.m = restartMasterWith(t, n, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.o.master.register(ctx); err != nil && n.o.masterEpoch() != e1+2 {
		t.Fatal(err) // (the heartbeat loop may have registered first)
	}
	waitUntil(t, func() bool { return n.o.masterEpoch() == e1+2 })
}

// An owner that missed a whole HA term (cut off from that leader while it served, then
// registered with the next) reports nothing to the next leader, which knows nothing of
// that term's deletes and overwrites: it adopted the versions they dropped. The memory
// index, and the SSD ring's records (they were reported, and the next term served from
// SSD versions the skipped term had deleted). The owner learns of the term either way;
// and one that skipped none reports as before.
func TestRegistrationAfterASkippedTermReportsNothing(t *testing.T) {
	for _, how := range []string{"seen", "named", "none"} {
		t.Run(how+"/memory", func(t *testing.T) {
			t.Parallel()
			n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true})
			if err := n.c.Put("k", value(1, 4096)); err != nil {
				t.Fatal(err)
			}
			skipTerm(t, n, how)
			_, replicas := memberGen(n.m, "n1")
			ok, err := n.c.Exists("k")
			if err != nil || (replicas != 0) != (how == "none") || ok != (how == "none") {
				t.Fatalf("after skipping %q: the master adopted %d replicas, exists k %v %v", how, replicas, ok, err)
			}
		})
		t.Run(how+"/ssd", func(t *testing.T) {
			t.Parallel()
			n, ids := persistedOnASmallRing(t)
			skipTerm(t, n, how)
			for k, id := range ids {
				// (Forgotten on the ring, not only left out of the report: a record
				// kept would be reported to the master after this one.)
				if n.o.store.Contains(k, id) != (how == "none") {
					t.Errorf("after skipping %q: %s on the owner's ring %v", how, k, n.o.store.Contains(k, id))
				}
			}
			var onSSD int64
			n.m.Inspect(func(st *master.State) {
				for _, ms := range st.Members() {
					if ms.NodeId == "n1" {
						onSSD = ms.SsdReplicas
					}
				}
			})
			if (onSSD != 0) != (how == "none") {
				t.Fatalf("after skipping %q: the master adopted %d SSD replicas of n1", how, onSSD)
			}
			for i := range 6 {
				k := fmt.Sprintf("k%d", i)
				if ok, err := n.c.Exists(k); err != nil || ok != (how == "none") {
					t.Fatalf("after skipping %q: exists %s %v %v", how, k, ok, err)
				}
			}
		})
	}
}

// ringValueSize is the size of persistedOnASmallRing's values and overwriteRing's fillers.
const ringValueSize = 256 << 10

// persistedOnASmallRing starts node n1 with a 4 MiB SSD ring and six values k0..k5 of
// ringValueSize persisted there; ids are their put ids.
func persistedOnASmallRing(t *testing.T) (*node, map[string]int64) {
	t.Helper()
	n := startNode(t, 16<<20, ssdOptions(t, 4<<20), master.Options{InsecureCluster: true})
	ids := map[string]int64{}
	for i := range 6 {
		k := fmt.Sprintf("k%d", i)
		if err := n.c.Put(k, value(i, ringValueSize)); err != nil {
			t.Fatal(err)
		}
		h, err := n.c.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		ids[k] = h.PutID()
		h.Release()
	}
	n.waitPersisted(t)
	return n, ids
}

// overwriteRing persists fillers the master knows nothing of until the ring holds none
// of the records ids names.
func overwriteRing(t *testing.T, n *node, ids map[string]int64) {
	t.Helper()
	for i := range 20 { // over the 4 MiB ring
		pin, err := n.o.store.Persist(fmt.Sprintf("filler%d", i), 1, value(100+i, ringValueSize))
		if err != nil {
			t.Fatal(err)
		}
		pin.Release()
	}
	for k, id := range ids {
		if n.o.store.Contains(k, id) {
			t.Fatalf("%s is still on the ring: the test overwrote nothing", k)
		}
	}
}
