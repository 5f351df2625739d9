package master

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestPooledPutPull runs PutDone through the handler against fake owners over real
// TCP: the put is placed on the owner with the most free bytes, whose PullPut fails;
// the master places it on the next one, which pulls it, and publishes it there. A
// put whose every candidate fails ends with UNAVAILABLE and frees everything; a
// revoke while the target pulls frees the target only once the pull answered.
func TestPooledPutPull(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s})
	h := &handler{s: srv}

	failing := &fakePeer{pull: func(context.Context, *peer.PullPutRequest) common.ErrorCode { return common.ErrorCode_UNAVAILABLE }}
	var okPulls atomic.Int64
	release := make(chan struct{})
	var blockNext atomic.Bool
	good := &fakePeer{pull: func(ctx context.Context, req *peer.PullPutRequest) common.ErrorCode {
		okPulls.Add(1)
		if blockNext.Load() {
			<-release
		}
		return common.ErrorCode_OK
	}}
	reqAddr := startFakePeer(t, s, &fakePeer{})
	register := func(id, addr string, size, reserve int64) NodeRef {
		ref := NodeRef{ID: id, Generation: 1}
		if err := srv.withState(func(st *State) error {
			return st.Register(time.Now(), ref, size, reserve, 0, "data-"+id, addr, SSDInfo{}, nil)
		}); err != nil {
			t.Fatal(err)
		}
		return ref
	}
	a := register("a", reqAddr, 8<<10, 4<<10)              // pool 4KiB + area 4KiB
	register("b", startFakePeer(t, s, failing), 64<<10, 0) // most free: tried first
	register("c", startFakePeer(t, s, good), 32<<10, 0)    // then c
	mref := &mp.NodeRef{NodeId: a.ID, Generation: a.Generation}

	put := func(key string) (*mp.PutStartResponse, *mp.PutDoneResponse) {
		st, _ := h.PutStart(context.Background(), &mp.PutStartRequest{Node: mref, Key: key, Len: 4096})
		if st.Code != common.ErrorCode_OK {
			t.Fatalf("PutStart %s: %v %s", key, st.Code, st.Message)
		}
		done, _ := h.PutDone(context.Background(), &mp.PutDoneRequest{Node: mref, Key: key, PutId: st.PutId})
		return st, done
	}
	if st, done := put("local"); done.Code != common.ErrorCode_OK || st.TargetNodeId != "a" {
		t.Fatalf("first put: target %s, %v %s", st.TargetNodeId, done.Code, done.Message)
	}
	st, done := put("pooled")
	if st.TargetNodeId != "b" || st.SourceOffset != 4096 || done.Code != common.ErrorCode_OK {
		t.Fatalf("pooled put: target %s source %d, PutDone %v %s", st.TargetNodeId, st.SourceOffset, done.Code, done.Message)
	}
	srv.Inspect(func(st *State) {
		r := st.routes["pooled"]
		if r == nil || r.memoryReplica(st.nodes["c"]) == nil || len(r.replicas) != 1 {
			t.Errorf("pooled put not published on c: %+v", r)
		}
		if u := st.nodes["b"].alloc.Used(); u != 0 {
			t.Errorf("failed target b still holds %d bytes", u)
		}
		if u := st.nodes["a"].xfer.Used(); u != 0 {
			t.Errorf("source range not freed: %d bytes of a's area in use", u)
		}
	})
	if failing.pullCalls.Load() != 1 || okPulls.Load() != 1 {
		t.Fatalf("pulls: b %d, c %d; want 1 and 1", failing.pullCalls.Load(), okPulls.Load())
	}

	// A revoke while c pulls: c's range stays until the pull answers.
	blockNext.Store(true)
	var c *node
	var usedBefore int64
	srv.Inspect(func(st *State) { c = st.nodes["c"]; usedBefore = c.alloc.Used() })
	st2, _ := h.PutStart(context.Background(), &mp.PutStartRequest{Node: mref, Key: "revoked", Len: 4096})
	doneCh := make(chan *mp.PutDoneResponse, 1)
	go func() {
		d, _ := h.PutDone(context.Background(), &mp.PutDoneRequest{Node: mref, Key: "revoked", PutId: st2.PutId})
		doneCh <- d
	}()
	deadline := time.Now().Add(5 * time.Second)
	for okPulls.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if rv, _ := h.PutRevoke(context.Background(), &mp.PutRevokeRequest{Node: mref, Key: "revoked", PutId: st2.PutId}); rv.Code != common.ErrorCode_OK {
		t.Fatalf("PutRevoke mid-pull: %v %s", rv.Code, rv.Message)
	}
	srv.Inspect(func(*State) {
		if got := c.alloc.Used(); got != usedBefore+4096 {
			t.Errorf("target freed before the pull answered: c uses %d, want %d", got, usedBefore+4096)
		}
	})
	close(release)
	if d := <-doneCh; d.Code != common.ErrorCode_UNAVAILABLE || !strings.Contains(d.Message, "revoked") {
		t.Fatalf("PutDone of a put revoked mid-pull: %v %s", d.Code, d.Message)
	}
	srv.Inspect(func(st *State) {
		if got := c.alloc.Used(); got != usedBefore {
			t.Errorf("revoked target not freed after the pull answered: c uses %d, want %d", got, usedBefore)
		}
		if len(st.puts) != 0 || st.nodes["a"].xfer.Used() != 0 {
			t.Errorf("revoked put left %d in-flight puts, %d bytes of a's area", len(st.puts), st.nodes["a"].xfer.Used())
		}
	})

	// Every candidate fails: UNAVAILABLE, everything freed.
	good.setPull(func(context.Context, *peer.PullPutRequest) common.ErrorCode { return common.ErrorCode_UNAVAILABLE })
	if _, done := put("doomed"); done.Code != common.ErrorCode_UNAVAILABLE || !strings.Contains(done.Message, "no other owner has room") {
		t.Fatalf("put with every pull failing: %v %s", done.Code, done.Message)
	}
	srv.Inspect(func(st *State) {
		if len(st.puts) != 0 || st.nodes["a"].xfer.Used() != 0 || st.nodes["b"].alloc.Used() != 0 || c.alloc.Used() != usedBefore {
			t.Errorf("failed put leaked: puts %d, area %d, b %d, c %d", len(st.puts), st.nodes["a"].xfer.Used(), st.nodes["b"].alloc.Used(), c.alloc.Used())
		}
	})
}

// TestShutGateKeepsPull: an HA leader whose gate shuts for a moment (etcd slow to
// acknowledge a keepalive; the term goes on) answers calls NOT_LEADER meanwhile, but
// does not take the owner pulling a pooled put for gone: the pull is not cancelled,
// its target not freed under it, and the put is published once the gate opens again.
func TestShutGateKeepsPull(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s})
	var shut atomic.Bool
	srv.gate = func() error {
		if shut.Load() {
			return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: test")
		}
		return nil
	}
	h := &handler{s: srv}
	pulling, release := make(chan struct{}), make(chan struct{})
	var cancelled atomic.Bool
	target := &fakePeer{pull: func(ctx context.Context, req *peer.PullPutRequest) common.ErrorCode {
		close(pulling)
		select {
		case <-release:
		case <-ctx.Done():
			cancelled.Store(true)
		}
		return common.ErrorCode_OK
	}}
	a := NodeRef{ID: "a", Generation: 1}
	for _, n := range []struct {
		ref        NodeRef
		addr       string
		size, area int64
	}{{a, startFakePeer(t, s, &fakePeer{}), 8 << 10, 4 << 10}, {NodeRef{ID: "c", Generation: 1}, startFakePeer(t, s, target), 32 << 10, 0}} {
		if err := srv.withState(func(st *State) error {
			return st.Register(time.Now(), n.ref, n.size, n.area, 0, "data-"+n.ref.ID, n.addr, SSDInfo{}, nil)
		}); err != nil {
			t.Fatal(err)
		}
	}
	mref := &mp.NodeRef{NodeId: a.ID, Generation: a.Generation}
	// a's 4 KiB pool takes the first put; the second goes to c through a's area.
	if st, _ := h.PutStart(context.Background(), &mp.PutStartRequest{Node: mref, Key: "first", Len: 4096}); st.TargetNodeId != "a" {
		t.Fatalf("first put placed on %q: %v %s", st.TargetNodeId, st.Code, st.Message)
	}
	st, _ := h.PutStart(context.Background(), &mp.PutStartRequest{Node: mref, Key: "k", Len: 4096})
	if st.Code != common.ErrorCode_OK || st.TargetNodeId != "c" {
		t.Fatalf("PutStart: %v %s, target %q", st.Code, st.Message, st.TargetNodeId)
	}
	doneCh := make(chan *mp.PutDoneResponse, 1)
	go func() {
		d, _ := h.PutDone(context.Background(), &mp.PutDoneRequest{Node: mref, Key: "k", PutId: st.PutId})
		doneCh <- d
	}()
	<-pulling
	shut.Store(true)
	if hb, _ := h.Heartbeat(context.Background(), &mp.HeartbeatRequest{Node: mref}); hb.Code != common.ErrorCode_NOT_LEADER {
		t.Fatalf("heartbeat with the gate shut: %v %s", hb.Code, hb.Message)
	}
	time.Sleep(5 * persistWatchInterval) // the pull's watcher looks at the target meanwhile
	shut.Store(false)
	close(release)
	if d := <-doneCh; d.Code != common.ErrorCode_OK {
		t.Fatalf("PutDone after the gate opened: %v %s", d.Code, d.Message)
	}
	if cancelled.Load() {
		t.Fatal("the pull was cancelled while the gate was shut")
	}
	srv.Inspect(func(st *State) {
		if r := st.routes["k"]; r == nil || r.memoryReplica(st.nodes["c"]) == nil {
			t.Fatalf("put not published on c: %+v", r)
		}
	})
}

// TestBatchPooledPutPull: the puts of one BatchPutDone placed on one other owner go to it
// in one BatchPullPut; the items it fails are placed again on the next owner and pulled
// there together, in one call too, while the others are published where they were
// pulled. Nothing of the requester's transfer area stays in use.
func TestBatchPooledPutPull(t *testing.T) {
	b := &fakePeer{pull: func(_ context.Context, req *peer.PullPutRequest) common.ErrorCode {
		if req.Key == "p1" || req.Key == "p2" {
			return common.ErrorCode_UNAVAILABLE
		}
		return common.ErrorCode_OK
	}}
	c := &fakePeer{}
	srv, results := pooledBatch(t, nil, b, c)
	if calls, batch, items := b.pullCalls.Load(), b.batchPullCalls.Load(), b.pullItems.Load(); calls != 1 || batch != 1 || items != 4 {
		t.Errorf("b: %d calls (%d BatchPullPut) for %d items; want 1 BatchPullPut of 4", calls, batch, items)
	}
	if calls, batch, items := c.pullCalls.Load(), c.batchPullCalls.Load(), c.pullItems.Load(); calls != 1 || batch != 1 || items != 2 {
		t.Errorf("c: %d calls (%d BatchPullPut) for %d items; want the 2 failed items in 1 BatchPullPut", calls, batch, items)
	}
	checkPooledBatch(t, srv, results, map[string]string{"local": "a", "p0": "b", "p1": "c", "p2": "c", "p3": "b"})
}

// TestBatchPullPutOldOwner: an owner of an earlier release does not know BatchPullPut
// (masters are upgraded first): the master pulls each put with its own PullPut there,
// and nothing is placed elsewhere or lost.
func TestBatchPullPutOldOwner(t *testing.T) {
	b := &fakePeer{without: []string{"BatchPullPut"}}
	c := &fakePeer{}
	srv, results := pooledBatch(t, nil, b, c)
	if calls, batch, items := b.pullCalls.Load(), b.batchPullCalls.Load(), b.pullItems.Load(); calls != 4 || batch != 0 || items != 4 {
		t.Errorf("b: %d calls (%d BatchPullPut) for %d items; want 4 PullPut", calls, batch, items)
	}
	if n := c.pullItems.Load(); n != 0 {
		t.Errorf("c pulled %d puts; want none placed there", n)
	}
	checkPooledBatch(t, srv, results, map[string]string{"local": "a", "p0": "b", "p1": "b", "p2": "b", "p3": "b"})
}

// TestBatchPullDoneGateShut: the gate shuts (etcd slow for a moment) while the target
// pulls a batch's puts: the pulls' ends still end the puts (published, their ranges
// settled), so none stays marked as being pulled, holding its ranges for good. The
// batch answers NOT_LEADER: its fence lapsed before the answer.
func TestBatchPullDoneGateShut(t *testing.T) {
	var shut atomic.Bool
	b := &fakePeer{pull: func(context.Context, *peer.PullPutRequest) common.ErrorCode {
		shut.Store(true)
		return common.ErrorCode_OK
	}}
	srv, results := pooledBatch(t, func() error {
		if shut.Load() {
			return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: test")
		}
		return nil
	}, b, &fakePeer{})
	shut.Store(false)
	checkPooledBatch(t, srv, results, map[string]string{"local": "a", "p0": "b", "p1": "b", "p2": "b", "p3": "b"})
}

// pooledBatch runs a master (gate: its gate, or nil; it must be open until the
// BatchPutDone) with owner a (a 4 KiB pool and a
// 16 KiB transfer area), b (64 KiB, most free: the batch's other puts are placed there)
// and c (32 KiB), and puts "local", p0..p3 of 4 KiB through a in one BatchPutStart and
// one BatchPutDone; it returns each key's PutDone answer.
func pooledBatch(t *testing.T, gate func() error, b, c *fakePeer) (*Server, map[string]*mp.PutDoneResponse) {
	t.Helper()
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s})
	srv.mu.Lock()
	srv.gate = gate
	srv.mu.Unlock()
	h := &handler{s: srv}
	register := func(id, addr string, size, reserve int64) {
		if err := srv.withState(func(st *State) error {
			return st.Register(time.Now(), NodeRef{ID: id, Generation: 1}, size, reserve, 0, "data-"+id, addr, SSDInfo{}, nil)
		}); err != nil {
			t.Fatal(err)
		}
	}
	register("a", startFakePeer(t, s, &fakePeer{}), 20<<10, 16<<10)
	register("b", startFakePeer(t, s, b), 64<<10, 0)
	register("c", startFakePeer(t, s, c), 32<<10, 0)
	mref := &mp.NodeRef{NodeId: "a", Generation: 1}

	keys := []string{"local", "p0", "p1", "p2", "p3"}
	var starts []*mp.PutStartItem
	for _, k := range keys {
		starts = append(starts, &mp.PutStartItem{Key: k, Len: 4096})
	}
	st, _ := h.BatchPutStart(context.Background(), &mp.BatchPutStartRequest{Node: mref, Items: starts})
	if st.Code != common.ErrorCode_OK || len(st.Results) != len(keys) {
		t.Fatalf("BatchPutStart: %v %s, %d results", st.Code, st.Message, len(st.Results))
	}
	var dones []*mp.PutDoneItem
	for i, r := range st.Results {
		want := "b"
		if i == 0 {
			want = "a"
		}
		if r.Code != common.ErrorCode_OK || r.TargetNodeId != want {
			t.Fatalf("PutStart %s: %v %s, target %q, want %q", keys[i], r.Code, r.Message, r.TargetNodeId, want)
		}
		dones = append(dones, &mp.PutDoneItem{Key: keys[i], PutId: r.PutId})
	}
	done, _ := h.BatchPutDone(context.Background(), &mp.BatchPutDoneRequest{Node: mref, Items: dones})
	want := common.ErrorCode_OK
	if gate != nil && gate() != nil {
		want = common.ErrorCode_NOT_LEADER // answered after the fence lapsed, the items' outcomes as they are
	}
	if done.Code != want || len(done.Results) != len(keys) {
		t.Fatalf("BatchPutDone: %v %s, %d results; want %v", done.Code, done.Message, len(done.Results), want)
	}
	out := make(map[string]*mp.PutDoneResponse)
	for i, r := range done.Results {
		out[keys[i]] = r
	}
	return srv, out
}

// checkPooledBatch checks that every PutDone of results answered OK, that each key of
// on is published on that node alone, that no put is in flight and that a's transfer
// area is free.
func checkPooledBatch(t *testing.T, srv *Server, results map[string]*mp.PutDoneResponse, on map[string]string) {
	t.Helper()
	for k, r := range results {
		if r.Code != common.ErrorCode_OK {
			t.Errorf("PutDone %s: %v %s", k, r.Code, r.Message)
		}
	}
	srv.Inspect(func(st *State) {
		for k, n := range on {
			r := st.routes[k]
			if r == nil || len(r.replicas) != 1 || r.memoryReplica(st.nodes[n]) == nil {
				t.Errorf("%s not published on %s alone: %+v", k, n, r)
			}
		}
		if len(st.puts) != 0 || st.nodes["a"].xfer.Used() != 0 {
			t.Errorf("%d puts in flight, %d bytes of a's area in use", len(st.puts), st.nodes["a"].xfer.Used())
		}
	})
}

// TestPullTargets: pulls are grouped by target incarnation in item order, a group never
// longer than one BatchPullPut takes.
func TestPullTargets(t *testing.T) {
	task := func(node string, gen int64) PutResult {
		return PutResult{Pull: &PullTask{TargetNode: node, TargetGeneration: gen}}
	}
	results := []PutResult{task("b", 1), {}, task("c", 1), task("b", 1), task("b", 2), task("c", 1)}
	got := pullTargets(results, []int{0, 2, 3, 4, 5})
	if want := [][]int{{0, 3}, {2, 5}, {4}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pullTargets = %v, want %v", got, want)
	}
	n := int(peer.PULL_PUT_BATCH_ITEMS) + 3
	many := make([]PutResult, n)
	idx := make([]int, n)
	for i := range many {
		many[i], idx[i] = task("b", 1), i
	}
	if got := pullTargets(many, idx); len(got) != 2 || len(got[0]) != int(peer.PULL_PUT_BATCH_ITEMS) || len(got[1]) != 3 {
		t.Fatalf("%d pulls to one target: groups of %d and %d", n, len(got[0]), len(got[len(got)-1]))
	}
}

// TestAcksOfAShutGateAnswerTheWholeCall: a gate that shuts between a batch's check and
// its holder acks applies none of them; the call is answered NOT_LEADER as a whole, the
// answer on which the owner queues the acks again. (Its items were answered NOT_LEADER
// under an OK call: the owner dropped the acks, and the master kept those holders and
// their ranges.)
func TestAcksOfAShutGateAnswerTheWholeCall(t *testing.T) {
	s := authtest.Secrets(t)
	srv, err := NewServer(Options{Secrets: s, NodeTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// The gate is set before the server runs (its maintenance reads it); while armed it
	// is open for a batch's check and shut after.
	var armed atomic.Bool
	var checks atomic.Int32
	srv.gate = func() error {
		if armed.Load() && checks.Add(1) > 1 {
			return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: test")
		}
		return nil
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	a := NodeRef{ID: "a", Generation: 1}
	if err := srv.withState(func(st *State) error {
		return st.Register(time.Now(), a, 64<<10, 0, 0, "data-a", startFakePeer(t, s, &fakePeer{}), SSDInfo{}, nil)
	}); err != nil {
		t.Fatal(err)
	}
	h := &handler{s: srv}
	mref := &mp.NodeRef{NodeId: a.ID, Generation: a.Generation}
	for _, batch := range []string{"BatchPutStart", "BatchGetStart"} {
		ps, _ := h.PutStart(context.Background(), &mp.PutStartRequest{Node: mref, Key: "k-" + batch, Len: 4096})
		if ps.Code != common.ErrorCode_OK {
			t.Fatal(ps.Message)
		}
		if d, _ := h.PutDone(context.Background(), &mp.PutDoneRequest{Node: mref, Key: "k-" + batch, PutId: ps.PutId}); d.Code != common.ErrorCode_OK {
			t.Fatal(d.Message)
		}
		g, _ := h.GetStart(context.Background(), &mp.GetStartRequest{Node: mref, Key: "k-" + batch})
		if g.Code != common.ErrorCode_OK {
			t.Fatal(g.Message)
		}
		checks.Store(0)
		armed.Store(true)
		var code common.ErrorCode
		if batch == "BatchPutStart" {
			r, _ := h.BatchPutStart(context.Background(), &mp.BatchPutStartRequest{Node: mref, Acks: []int64{g.HolderId},
				Items: []*mp.PutStartItem{{Key: "x", Len: 4096}, {Key: "y", Len: 4096}}})
			code = r.Code
		} else {
			r, _ := h.BatchGetStart(context.Background(), &mp.BatchGetStartRequest{Node: mref, Acks: []int64{g.HolderId}, Keys: []string{"x", "y"}})
			code = r.Code
		}
		armed.Store(false)
		if code != common.ErrorCode_NOT_LEADER {
			t.Errorf("%s whose acks a shut gate refused: answered %v, want NOT_LEADER as a whole", batch, code)
		}
	}
}
