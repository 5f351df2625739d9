package master

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// fakePeer is an owner's PeerService that records what the master sends it.
type fakePeer struct {
	persistDelay time.Duration    // each BatchSsdReplicaPersist call takes this long
	invalDelay   time.Duration    // each InvalidateCachedInfo takes this long
	invalCode    common.ErrorCode // what each InvalidateCachedInfo answers (zero: OK)
	invalFails   atomic.Int64     // while positive, InvalidateCachedInfo answers UNAVAILABLE (counted down)
	block        chan struct{}    // when set, BatchSsdReplicaPersist waits until it is closed
	// pull, when set, answers PullPut; else PullPut answers OK at once. Set it before
	// the server runs, or later with setPull.
	pull           func(ctx context.Context, req *peer.PullPutRequest) common.ErrorCode
	pullCalls      atomic.Int64 // PullPut and BatchPullPut calls
	batchPullCalls atomic.Int64 // BatchPullPut calls
	pullItems      atomic.Int64 // puts pulled by either
	// hotSet, when set, answers ReleaseHotSet (set it before the server runs); else
	// ReleaseHotSet answers OK at once, releasing nothing.
	hotSet func(ctx context.Context, req *peer.ReleaseHotSetRequest) *peer.ReleaseHotSetResponse
	// without names methods this owner does not serve (an owner of an earlier release):
	// callers get Kitex's unknown-method error.
	without []string

	persistCalls   atomic.Int64 // BatchSsdReplicaPersist calls
	persistItems   atomic.Int64 // values in them
	persistRunning atomic.Int64
	persistMaxRun  atomic.Int64
	invalCalls     atomic.Int64

	mu   sync.Mutex // protects seen, pull once the server runs
	seen map[string]time.Time
}

// setPull replaces the PullPut behaviour while the server runs.
func (f *fakePeer) setPull(pull func(ctx context.Context, req *peer.PullPutRequest) common.ErrorCode) {
	f.mu.Lock()
	f.pull = pull
	f.mu.Unlock()
}

func (f *fakePeer) BatchSsdReplicaPersist(ctx context.Context, req *peer.BatchSsdReplicaPersistRequest) (*peer.BatchSsdReplicaPersistResponse, error) {
	f.persistCalls.Add(1)
	f.persistItems.Add(int64(len(req.Items)))
	n := f.persistRunning.Add(1)
	defer f.persistRunning.Add(-1)
	for {
		m := f.persistMaxRun.Load()
		if n <= m || f.persistMaxRun.CompareAndSwap(m, n) {
			break
		}
	}
	if f.block != nil {
		<-f.block
	}
	time.Sleep(f.persistDelay)
	resp := &peer.BatchSsdReplicaPersistResponse{Code: common.ErrorCode_OK}
	for _, it := range req.Items {
		r := &peer.SsdReplicaPersistResponse{Code: common.ErrorCode_OK}
		if strings.HasPrefix(it.Key, "fail-") {
			r.Code, r.Message = common.ErrorCode_UNAVAILABLE, "fake: this record could not be written"
		}
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

func (f *fakePeer) SsdStageRead(ctx context.Context, req *peer.SsdStageReadRequest) (*peer.SsdStageReadResponse, error) {
	return &peer.SsdStageReadResponse{Code: common.ErrorCode_UNAVAILABLE}, nil
}

func (f *fakePeer) BatchSsdStageRead(ctx context.Context, req *peer.BatchSsdStageReadRequest) (*peer.BatchSsdStageReadResponse, error) {
	return &peer.BatchSsdStageReadResponse{Code: common.ErrorCode_UNAVAILABLE}, nil
}

func (f *fakePeer) PullPut(ctx context.Context, req *peer.PullPutRequest) (*peer.PullPutResponse, error) {
	f.pullCalls.Add(1)
	return f.pullOne(ctx, req), nil
}

// BatchPullPut answers each item as PullPut would.
func (f *fakePeer) BatchPullPut(ctx context.Context, req *peer.BatchPullPutRequest) (*peer.BatchPullPutResponse, error) {
	f.pullCalls.Add(1)
	f.batchPullCalls.Add(1)
	resp := &peer.BatchPullPutResponse{}
	for _, it := range req.Items {
		resp.Results = append(resp.Results, f.pullOne(ctx, it))
	}
	return resp, nil
}

func (f *fakePeer) pullOne(ctx context.Context, req *peer.PullPutRequest) *peer.PullPutResponse {
	f.pullItems.Add(1)
	code := common.ErrorCode_OK
	f.mu.Lock()
	pull := f.pull
	f.mu.Unlock()
	if pull != nil {
		code = pull(ctx, req)
	}
	return &peer.PullPutResponse{Code: code, Message: fmt.Sprintf("fake pull of put %d: %v", req.PutId, code)}
}

func (f *fakePeer) ReleaseHotSet(ctx context.Context, req *peer.ReleaseHotSetRequest) (*peer.ReleaseHotSetResponse, error) {
	if f.hotSet != nil {
		return f.hotSet(ctx, req), nil
	}
	return &peer.ReleaseHotSetResponse{Code: common.ErrorCode_OK}, nil
}

func (f *fakePeer) InvalidateCachedInfo(ctx context.Context, req *peer.InvalidateCachedInfoRequest) (*peer.InvalidateCachedInfoResponse, error) {
	f.invalCalls.Add(1)
	time.Sleep(f.invalDelay)
	now := time.Now()
	f.mu.Lock()
	for _, e := range req.Entries {
		if _, ok := f.seen[e.Key]; !ok {
			f.seen[e.Key] = now
		}
	}
	f.mu.Unlock()
	if f.invalFails.Add(-1) >= 0 {
		return &peer.InvalidateCachedInfoResponse{Code: common.ErrorCode_UNAVAILABLE}, nil
	}
	return &peer.InvalidateCachedInfoResponse{Code: f.invalCode}, nil
}

func (f *fakePeer) seenAt(key string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at, ok := f.seen[key]
	return at, ok
}

// startFakePeer serves f on loopback behind the cluster authentication.
func startFakePeer(t *testing.T, s *auth.Secrets, f *fakePeer) string {
	t.Helper()
	f.seen = make(map[string]time.Time)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := auth.Listener(raw, s, auth.PurposePeer, auth.ListenerOptions{})
	opts := append(auth.ServerOptions(ln),
		server.WithServerBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "fluxkv-owner"}),
		server.WithExitWaitTime(100*time.Millisecond))
	svr := peerservice.NewServer(f, opts...)
	if len(f.without) > 0 {
		svr = server.NewServer(append(opts, server.WithCompatibleMiddlewareForUnary())...)
		info := peerservice.NewServiceInfo()
		for _, m := range f.without {
			delete(info.Methods, m)
		}
		if err := svr.RegisterService(info, f); err != nil {
			t.Fatal(err)
		}
	}
	go svr.Run()
	time.Sleep(20 * time.Millisecond)
	t.Cleanup(func() {
		if f.block != nil {
			select {
			case <-f.block:
			default:
				close(f.block)
			}
		}
		svr.Stop()
		ln.Close()
	})
	return raw.Addr().String()
}

// silentPeer is a dead owner whose kernel still accepts: it listens, accepts and never
// answers (a stopped process, a hung owner). It counts the connections it accepted.
func silentPeer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String(), &accepted
}

// closedPeer is a dead owner whose port refuses connections.
func closedPeer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startPeerFailMaster starts a master on loopback whose owners are never tombed by
// the heartbeat TTL unless a test says so.
func startPeerFailMaster(t *testing.T, opts Options) *Server {
	t.Helper()
	opts.NodeTTL = time.Hour
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv
}

func registerOwner(t *testing.T, srv *Server, id, peerAddr string) NodeRef {
	t.Helper()
	ref := NodeRef{ID: id, Generation: 1}
	err := srv.withState(func(st *State) error {
		return st.Register(time.Now(), ref, 64<<20, 0, 0, "", peerAddr, SSDInfo{Enabled: true, CapacityBytes: 1 << 30}, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// putPersisted publishes a put on ref's owner and returns the persist PutDone asks for.
func putPersisted(t *testing.T, srv *Server, ref NodeRef, key string) *PersistTask {
	t.Helper()
	var task *PersistTask
	err := srv.withState(func(st *State) error {
		plan, err := st.PutStart(time.Now(), ref, key, 4096, false, nil)
		if err != nil {
			return err
		}
		res, err := st.PutDone(time.Now(), ref, key, plan.PutID)
		task = res.Persist
		return err
	})
	if err != nil || task == nil {
		t.Fatalf("put %q: %v, task %v", key, err, task)
	}
	return task
}

// persistLog records how every persist ended.
type persistLog struct {
	mu    sync.Mutex
	ended map[int64]persistEnd
	all   chan struct{}
	want  int
}

type persistEnd struct {
	at  time.Time
	err error
}

func watchPersists(srv *Server, want int) *persistLog {
	l := &persistLog{ended: make(map[int64]persistEnd), all: make(chan struct{}), want: want}
	srv.persist.testDone = func(t *PersistTask, err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if _, dup := l.ended[t.PutID]; dup {
			panic(fmt.Sprintf("persist %d ended twice", t.PutID))
		}
		l.ended[t.PutID] = persistEnd{at: time.Now(), err: err}
		if len(l.ended) == l.want {
			close(l.all)
		}
	}
	return l
}

func (l *persistLog) wait(t *testing.T, within time.Duration) map[int64]persistEnd {
	t.Helper()
	select {
	case <-l.all:
	case <-time.After(within):
		l.mu.Lock()
		n := len(l.ended)
		l.mu.Unlock()
		t.Fatalf("only %d of %d persists ended within %v", n, l.want, within)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ended
}

// Invalidations to a live owner are not held up by a dead owner, whether its port
// accepts and never answers or refuses: every key reaches the live owner well within
// a second of its broadcast (the old single loop spent 2 s per dead owner per batch),
// and the dead owners see a bounded number of attempts, not one per broadcast.
func TestInvalidationsNotHeldUpByDeadOwners(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s})
	live := &fakePeer{}
	liveAddr := startFakePeer(t, s, live)
	silentAddr, silentAccepts := silentPeer(t)
	closedAddr := closedPeer(t)
	registerOwner(t, srv, "live", liveAddr)
	registerOwner(t, srv, "silent", silentAddr)
	registerOwner(t, srv, "closed", closedAddr)

	const rounds = 30
	sent := make([]time.Time, rounds)
	for i := range rounds {
		key := fmt.Sprintf("k%d", i)
		sent[i] = time.Now()
		srv.inval.add([]Invalidation{
			{NodeID: "silent", PeerAddr: silentAddr, Key: key, PutID: int64(i + 1)},
			{NodeID: "closed", PeerAddr: closedAddr, Key: key, PutID: int64(i + 1)},
			{NodeID: "live", PeerAddr: liveAddr, Key: key, PutID: int64(i + 1)},
		})
		time.Sleep(20 * time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	var worst time.Duration
	for i := range rounds {
		key := fmt.Sprintf("k%d", i)
		for {
			at, ok := live.seenAt(key)
			if ok {
				worst = max(worst, at.Sub(sent[i]))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("live owner never got the invalidation of %s", key)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	t.Logf("worst delay to the live owner: %v over %d broadcasts; %d calls; silent owner accepted %d connections",
		worst, rounds, live.invalCalls.Load(), silentAccepts.Load())
	if worst >= time.Second {
		t.Fatalf("an invalidation took %v to reach the live owner while others were dead", worst)
	}
	// ~600ms of broadcasts: one call in flight, then a back-off of one timeout after
	// each failure, so a handful of connections at most.
	if n := silentAccepts.Load(); n > 4 {
		t.Fatalf("the silent owner accepted %d connections for %d broadcasts: retry storm", n, rounds)
	}
}

// Invalidations for an owner that is not registered (tombed, or never known) are
// dropped without a call.
func TestInvalidationsToUnknownOwnerDropped(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s})
	addr, accepts := silentPeer(t)
	ref := registerOwner(t, srv, "gone", addr)
	srv.withState(func(st *State) error {
		st.tombLocked(st.nodes[ref.ID])
		return nil
	})
	srv.inval.add([]Invalidation{{NodeID: "gone", PeerAddr: addr, Key: "a", PutID: 1},
		{NodeID: "never", PeerAddr: addr, Key: "b", PutID: 1}})
	time.Sleep(200 * time.Millisecond)
	if n := accepts.Load(); n != 0 {
		t.Fatalf("%d connections to a tombed or unknown owner", n)
	}
	srv.inval.mu.Lock()
	left := len(srv.inval.queues)
	srv.inval.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d owner queues left after dropping", left)
	}
}

// A slow owner gets one call at a time; what arrives meanwhile goes in its next call.
func TestInvalidationsCollectWhileOwnerIsSlow(t *testing.T) {
	slow := &fakePeer{invalDelay: 200 * time.Millisecond}
	srv, addr := startWithOwner(t, Options{}, "slow", slow)
	const keys = 200
	for i := range keys {
		srv.inval.add([]Invalidation{{NodeID: "slow", PeerAddr: addr, Key: fmt.Sprintf("k%d", i), PutID: 1}})
		if i%50 == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for i := range keys {
		for {
			if _, ok := slow.seenAt(fmt.Sprintf("k%d", i)); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("k%d never arrived", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if n := slow.invalCalls.Load(); n > 4 {
		t.Fatalf("%d calls for %d keys to a slow owner: entries should collect while a call is in flight", n, keys)
	}
}

// While entries keep coming, an owner gets at most one call per invalidateLinger (plus
// the call's own time), not one right after the other (calls back to back cost the
// master and the owner more than the entries).
func TestInvalidationsCollectBetweenCalls(t *testing.T) {
	srv, fast, addr := startInvalidatedOwner(t)
	arrived := func(prefix string, n int) { fast.waitSeen(t, prefix, n) }

	const trickle = 200
	t0 := time.Now()
	for i := range trickle {
		srv.inval.add([]Invalidation{{NodeID: "fast", PeerAddr: addr, Key: fmt.Sprintf("t%d", i), PutID: 1}})
		time.Sleep(time.Millisecond)
	}
	arrived("t", trickle)
	elapsed := time.Since(t0)
	// A slower machine stretches elapsed and so the bound; calls back to back made one
	// per invalDelay here.
	if n, most := fast.invalCalls.Load(), int64(elapsed/invalidateLinger)+2; n > most {
		t.Fatalf("%d calls for %d keys added over %v; want at most %d (one per %v)", n, trickle, elapsed.Round(time.Millisecond), most, invalidateLinger)
	}

}

// A call's worth of entries ends a linger, whether it was queued before the linger
// began or while it ran: here the linger is a minute, one entry starts it, and 3 full
// batches then go in 3 calls at once, the first entry with the first.
func TestInvalidationsFullBatchEndsTheLinger(t *testing.T) {
	srv, fast, addr := startInvalidatedOwner(t)
	srv.inval.lingerFor = time.Minute
	srv.inval.add([]Invalidation{{NodeID: "fast", PeerAddr: addr, Key: "b0", PutID: 1}})
	batch := make([]Invalidation, 3*invalidateBatch-1)
	for i := range batch {
		batch[i] = Invalidation{NodeID: "fast", PeerAddr: addr, Key: fmt.Sprintf("b%d", i+1), PutID: 1}
	}
	srv.inval.add(batch)
	fast.waitSeen(t, "b", 3*invalidateBatch) // within 10 s, not a minute
	if n := fast.invalCalls.Load(); n != 3 {
		t.Fatalf("%d calls for %d keys; want 3 full ones", n, 3*invalidateBatch)
	}
}

// startInvalidatedOwner starts a master with one registered owner "fast", a fake peer
// whose invalidation calls answer in 5 ms (a busy owner), and returns both and its address.
func startInvalidatedOwner(t *testing.T) (*Server, *fakePeer, string) {
	fast := &fakePeer{invalDelay: 5 * time.Millisecond}
	srv, addr := startWithOwner(t, Options{}, "fast", fast)
	return srv, fast, addr
}

// startWithOwner starts a master of opts (with cluster secrets) and owner id registered
// with it, served by the fake peer f; it returns the master and f's address.
func startWithOwner(t *testing.T, opts Options, id string, f *fakePeer) (*Server, string) {
	opts.Secrets = authtest.Secrets(t)
	srv := startPeerFailMaster(t, opts)
	addr := startFakePeer(t, opts.Secrets, f)
	registerOwner(t, srv, id, addr)
	return srv, addr
}

// waitSeen waits up to 10 s until keys prefix0 … prefix(n-1) were invalidated at p.
func (p *fakePeer) waitSeen(t *testing.T, prefix string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for i := range n {
		for {
			if _, ok := p.seenAt(fmt.Sprintf("%s%d", prefix, i)); ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s%d never arrived", prefix, i)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// A replica holder that refuses a synchronous invalidation (it registered with a newer
// master's epoch) has not confirmed it: the master goes on asking until the owner is
// silent, then tombs it, as an owner that does not answer. (The refusal used to count as
// a confirmation: a delete answered while that owner still held the old version.)
func TestSyncInvalidationRefusedIsNotConfirmed(t *testing.T) {
	refusing := &fakePeer{invalCode: common.ErrorCode_UNAVAILABLE}
	srv, addr := startWithOwner(t, Options{HeartbeatInterval: 100 * time.Millisecond}, "refusing", refusing)
	if err := srv.invalidate([]Invalidation{{NodeID: "refusing", PeerAddr: addr, Generation: 1, Key: "k", PutID: 1, Sync: true}}); err != nil {
		t.Fatal(err)
	}
	tombed := false
	srv.Inspect(func(st *State) { n := st.nodes["refusing"]; tombed = n == nil || n.tombed })
	if calls := refusing.invalCalls.Load(); calls < 2 || !tombed {
		t.Fatalf("%d calls, owner tombed %v: a refused invalidation was taken for a confirmation", calls, tombed)
	}
}

// TestSilenceWhileTheGateIsShut: an owner cannot heartbeat while an HA leader's gate is
// shut (its fence, for a moment); an invalidation whose call failed then must not take
// that silence for the owner's and tomb it (a review: it forgot its whole cache when it
// registered again). The owner confirms the retry and stays.
func TestSilenceWhileTheGateIsShut(t *testing.T) {
	flaky := &fakePeer{invalDelay: 400 * time.Millisecond}
	flaky.invalFails.Store(1)
	srv, addr := startWithOwner(t, Options{HeartbeatInterval: 100 * time.Millisecond}, "flaky", flaky)
	var shut atomic.Bool
	srv.mu.Lock()
	srv.gate = func() error {
		if shut.Load() {
			return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: fenced for a moment (test)")
		}
		return nil
	}
	srv.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { // the owner heartbeats every 50 ms; refused while the gate is shut
		c := srv.LocalClient()
		for ctx.Err() == nil {
			c.Heartbeat(ctx, &mp.HeartbeatRequest{Node: &mp.NodeRef{NodeId: "flaky", Generation: 1}})
			time.Sleep(50 * time.Millisecond)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	done := make(chan error, 1)
	go func() {
		done <- srv.invalidate([]Invalidation{{NodeID: "flaky", PeerAddr: addr, Generation: 1, Key: "k", PutID: 1, Sync: true}})
	}()
	time.Sleep(50 * time.Millisecond) // the first call fails after 400 ms: shut the gate across it
	shut.Store(true)
	time.Sleep(600 * time.Millisecond)
	shut.Store(false)
	<-done
	var tombed bool
	srv.Inspect(func(st *State) { n := st.nodes["flaky"]; tombed = n == nil || n.tombed })
	if tombed {
		t.Fatalf("the owner was tombed for the silence of a shut gate (%d invalidation calls)", flaky.invalCalls.Load())
	}
	if calls := flaky.invalCalls.Load(); calls < 2 {
		t.Fatalf("%d invalidation calls: the failed one was not retried", calls)
	}
}

// TestDeadOwnerTombedWhileTheGateFlaps: a leader with a slow path to etcd shuts its gate
// for moments; each reopening forgives the owners the time it was shut, not their whole
// silence, so a dead owner is still tombed (a review: forgiven from scratch at every
// reopening, it never was while the gate flapped within two heartbeat intervals).
func TestDeadOwnerTombedWhileTheGateFlaps(t *testing.T) {
	t.Run("timed", func(t *testing.T) { // shut 60 ms of every 160
		var shut atomic.Bool
		srv := flappingGateMaster(t, func() bool { return shut.Load() })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			for ctx.Err() == nil {
				shut.Store(true)
				time.Sleep(60 * time.Millisecond)
				shut.Store(false)
				time.Sleep(100 * time.Millisecond)
			}
		}()
		waitTombed(t, srv, "dead")
	})
	t.Run("every-other-look", func(t *testing.T) { // (nothing but the TTL check looks)
		var looks atomic.Int64
		srv := flappingGateMaster(t, func() bool { return looks.Add(1)%2 == 0 })
		waitTombed(t, srv, "dead")
	})
}

// flappingGateMaster starts a master (heartbeats 100 ms, node TTL 0.5 s) whose gate is
// shut while shut says so, with owner "dead" registered, which never heartbeats.
func flappingGateMaster(t *testing.T, shut func() bool) *Server {
	srv, err := NewServer(Options{Secrets: authtest.Secrets(t), HeartbeatInterval: 100 * time.Millisecond, NodeTTL: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	registerOwner(t, srv, "dead", "127.0.0.1:1")
	srv.gate = func() error {
		if shut() {
			return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: fenced for a moment (test)")
		}
		return nil
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv
}

// waitTombed waits up to 10 s for owner id to be tombed.
func waitTombed(t *testing.T, srv *Server, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var tombed bool
		srv.Inspect(func(st *State) { n := st.nodes[id]; tombed = n == nil || n.tombed })
		if tombed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a dead owner not tombed in 10 s (node TTL 0.5 s) while the gate flapped")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A write's synchronous invalidations may take long; an HA leader whose term lapsed
// meanwhile (its fence shut) must not answer the write OK: the next leader may undo it.
// invalidate then returns the gate's error, which the write answers.
func TestSyncInvalidationAcrossALapsedTerm(t *testing.T) {
	slow := &fakePeer{invalDelay: 300 * time.Millisecond}
	srv, addr := startWithOwner(t, Options{}, "slow", slow)
	var lapsed atomic.Bool
	srv.mu.Lock()
	srv.gate = func() error {
		if lapsed.Load() {
			return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: the term lapsed (test)")
		}
		return nil
	}
	srv.mu.Unlock()
	inv := []Invalidation{{NodeID: "slow", PeerAddr: addr, Generation: 1, Key: "k", PutID: 1, Sync: true}}
	if err := srv.invalidate(inv); err != nil {
		t.Fatalf("while leading: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.invalidate(inv) }()
	time.Sleep(100 * time.Millisecond) // the owner's answer takes 300 ms
	lapsed.Store(true)
	if err := <-done; wire.CodeOf(err) != common.ErrorCode_NOT_LEADER {
		t.Fatalf("invalidations that ended after the term lapsed: %v, want NOT_LEADER", err)
	}
	if err := srv.invalidate([]Invalidation{{NodeID: "slow", PeerAddr: addr, Key: "k2", PutID: 1}}); err != nil {
		t.Fatalf("background invalidations only: %v, want nil (nothing waited for)", err)
	}
}

// The per-owner queue keeps one entry per key (the highest version) and drops the
// oldest keys past its cap.
func TestInvalQueueCap(t *testing.T) {
	q := newInvalQueue()
	q.push("a", 1, 3)
	q.push("b", 1, 3)
	q.push("a", 5, 3)
	q.push("a", 2, 3)
	if n := q.push("c", 1, 3); n != 0 {
		t.Fatalf("dropped %d under the cap", n)
	}
	if n := q.push("d", 1, 3); n != 1 {
		t.Fatalf("dropped %d, want 1", n)
	}
	q.push("e", 1, 3)
	if q.dropped != 2 {
		t.Fatalf("dropped count %d, want 2", q.dropped)
	}
	got := q.take(10)
	want := []string{"c:1", "d:1", "e:1"}
	if len(got) != len(want) {
		t.Fatalf("took %v", got)
	}
	for i, kv := range got {
		if s := fmt.Sprintf("%s:%d", kv.Key, kv.PutId); s != want[i] {
			t.Fatalf("entry %d = %s, want %s", i, s, want[i])
		}
	}
	q2 := newInvalQueue()
	q2.push("a", 1, 3)
	q2.push("a", 5, 3)
	q2.push("a", 2, 3)
	if got := q2.take(10); len(got) != 1 || got[0].PutId != 5 {
		t.Fatalf("dedup: %v", got)
	}
	if len(q2.order) != 0 || len(q2.upTo) != 0 {
		t.Fatal("queue not empty after take")
	}
}

// Persists to a dead owner (accepts and never answers, or refuses) fail within ~1 s
// each with at most one connection attempt each (Kitex's own retries of a failed
// dial fail at once), while a live owner's persists run beside
// them: the dead owners never hold every worker.
func TestPersistDeadOwnerFailsFastLiveProceeds(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s, PersistWorkers: 4})
	live := &fakePeer{persistDelay: 100 * time.Millisecond}
	liveAddr := startFakePeer(t, s, live)
	silentAddr, silentAccepts := silentPeer(t)
	closedAddr := closedPeer(t)
	liveRef := registerOwner(t, srv, "live", liveAddr)
	silentRef := registerOwner(t, srv, "silent", silentAddr)
	closedRef := registerOwner(t, srv, "closed", closedAddr)

	const dead, alive = 6, 6
	var tasks []*PersistTask
	for i := range dead {
		tasks = append(tasks, putPersisted(t, srv, silentRef, fmt.Sprintf("s%d", i)),
			putPersisted(t, srv, closedRef, fmt.Sprintf("c%d", i)))
	}
	for i := range alive {
		tasks = append(tasks, putPersisted(t, srv, liveRef, fmt.Sprintf("l%d", i)))
	}
	log := watchPersists(srv, len(tasks))
	start := time.Now()
	for _, task := range tasks { // the dead owners' persists are queued first
		srv.persist.submit(task)
	}
	ended := log.wait(t, 10*time.Second)

	var liveLast, silentLast, closedLast time.Duration
	for _, task := range tasks {
		e := ended[task.PutID]
		took := e.at.Sub(start)
		switch task.NodeID {
		case "live":
			if e.err != nil {
				t.Errorf("live persist %s: %v", task.Key, e.err)
			}
			liveLast = max(liveLast, took)
		case "silent":
			if e.err == nil {
				t.Errorf("persist %s to a silent owner succeeded", task.Key)
			}
			silentLast = max(silentLast, took)
		case "closed":
			if e.err == nil {
				t.Errorf("persist %s to a closed port succeeded", task.Key)
			}
			closedLast = max(closedLast, took)
		}
	}
	t.Logf("last persist ended after: live %v, silent %v (%d connections), closed %v; live ran ≤ %d at once",
		liveLast, silentLast, silentAccepts.Load(), closedLast, live.persistMaxRun.Load())
	// The silent owner's 6 persists run 2 at a time (PersistWorkersPerNode), each
	// failing when the hello does not come (500 ms): ~1.5 s for all, ≤ ~1 s each.
	if silentLast > time.Duration(dead/2)*1200*time.Millisecond {
		t.Errorf("the silent owner's persists took %v: each should fail within ~1s", silentLast)
	}
	if n := silentAccepts.Load(); n > dead {
		t.Errorf("the silent owner accepted %d connections for %d persists: at most one dial per persist expected", n, dead)
	}
	if closedLast > time.Second {
		t.Errorf("persists to a closed port took %v", closedLast)
	}
	// 6 live persists of 100 ms, 2 at a time: ~300 ms once they get workers; queued
	// behind the dead ones with 4 shared workers they would end after ≥ 1.5 s.
	if liveLast > time.Second {
		t.Errorf("the live owner's persists took %v: held up by the dead owners", liveLast)
	}
	if m := live.persistMaxRun.Load(); m > 2 {
		t.Errorf("%d persists ran at once on one owner; the cap is 2", m)
	}
	var pending int
	srv.Inspect(func(st *State) { pending = st.PendingPersists() })
	if pending != 0 {
		t.Errorf("%d persists still pending", pending)
	}
}

// An owner tombed while its persists wait: the queued ones end at once, the running
// one is cancelled (it does not wait for PersistTimeout), and another owner's
// persists are unaffected.
func TestPersistTombedOwnerSkipped(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s, PersistWorkers: 2})
	stuck := &fakePeer{block: make(chan struct{})}
	stuckAddr := startFakePeer(t, s, stuck)
	other := &fakePeer{persistDelay: 10 * time.Millisecond}
	otherAddr := startFakePeer(t, s, other)
	stuckRef := registerOwner(t, srv, "stuck", stuckAddr)
	otherRef := registerOwner(t, srv, "other", otherAddr)

	var tasks []*PersistTask
	for i := range 5 {
		tasks = append(tasks, putPersisted(t, srv, stuckRef, fmt.Sprintf("s%d", i)))
	}
	for i := range 3 {
		tasks = append(tasks, putPersisted(t, srv, otherRef, fmt.Sprintf("o%d", i)))
	}
	log := watchPersists(srv, len(tasks))
	for _, task := range tasks {
		srv.persist.submit(task)
	}
	for { // one persist of the stuck owner runs; the other owner's go meanwhile
		log.mu.Lock()
		n := len(log.ended)
		log.mu.Unlock()
		if n == 3 && stuck.persistCalls.Load() == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	tombAt := time.Now()
	srv.withState(func(st *State) error {
		later := time.Now().Add(2 * time.Hour)
		st.Heartbeat(later, otherRef, SSDInfo{Enabled: true, CapacityBytes: 1 << 30}, 0)
		if got := st.Maintain(later); len(got) != 1 || got[0] != "stuck" {
			t.Errorf("tombed %v", got)
		}
		return nil
	})
	ended := log.wait(t, 5*time.Second)
	for _, task := range tasks {
		e := ended[task.PutID]
		switch task.NodeID {
		case "stuck":
			if !errors.Is(e.err, errNodeGone) {
				t.Errorf("persist %s of the tombed owner ended with %v", task.Key, e.err)
			}
			if d := e.at.Sub(tombAt); d > time.Second {
				t.Errorf("persist %s ended %v after the tomb", task.Key, d)
			}
		case "other":
			if e.err != nil || e.at.After(tombAt) {
				t.Errorf("persist %s of the live owner: %v, ended after the tomb: %v", task.Key, e.err, e.at.After(tombAt))
			}
		}
	}
	if n := stuck.persistCalls.Load(); n != 1 {
		t.Errorf("the tombed owner got %d persist calls; 1 was running, the rest should be skipped", n)
	}
}

// Persists queued for one owner while its call runs go in the next call together, and each
// value's outcome is its own: a value the owner could not write ends failed (dropped,
// memory-only) beside the others of its call, which persist.
func TestPersistBatchesQueuedValues(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s, PersistWorkers: 2}) // one call per owner at once
	owner := &fakePeer{block: make(chan struct{})}
	ref := registerOwner(t, srv, "o", startFakePeer(t, s, owner))

	first := putPersisted(t, srv, ref, "v-first")
	var rest []*PersistTask
	for i := range 40 {
		key := fmt.Sprintf("v%d", i)
		if i%10 == 3 {
			key = fmt.Sprintf("fail-%d", i)
		}
		rest = append(rest, putPersisted(t, srv, ref, key))
	}
	log := watchPersists(srv, 1+len(rest))
	srv.persist.submit(first)
	for owner.persistCalls.Load() == 0 { // the first value's call runs, blocked
		time.Sleep(time.Millisecond)
	}
	for _, task := range rest {
		srv.persist.submit(task)
	}
	close(owner.block)
	ended := log.wait(t, 10*time.Second)
	if c, n := owner.persistCalls.Load(), owner.persistItems.Load(); c != 2 || n != 41 {
		t.Errorf("%d calls of %d values; want the 40 queued behind the first in one call (2 calls, 41 values)", c, n)
	}
	failed := 0
	for _, task := range append(rest, first) {
		e := ended[task.PutID]
		if want := strings.HasPrefix(task.Key, "fail-"); (e.err != nil) != want {
			t.Errorf("persist %s ended with %v; want failed %v", task.Key, e.err, want)
		}
		if e.err != nil {
			failed++
		}
	}
	srv.Inspect(func(st *State) {
		if n := st.PendingPersists(); n != 0 {
			t.Errorf("%d persists still pending", n)
		}
		if c := st.persistCount("o"); c.asked != 41 || c.dropped != int64(failed) || failed != 4 {
			t.Errorf("persists asked %d dropped %d (failed %d); want 41, 4, 4", c.asked, c.dropped, failed)
		}
	})
}

func TestPersistOptionsValidate(t *testing.T) {
	o := Options{InsecureCluster: true, PersistWorkers: 2, PersistWorkersPerNode: 3}
	if err := o.Validate(); err == nil {
		t.Fatal("per-node workers above the workers accepted")
	}
	o = Options{InsecureCluster: true, PersistWorkers: 3}
	o.setDefaults()
	if o.PersistWorkersPerNode != 1 {
		t.Fatalf("default per-node workers for 3 workers = %d, want 1", o.PersistWorkersPerNode)
	}
}

// TestSyncInvalidation: a delete or overwrite answers only after the owners that may
// hold an older version confirmed dropping it. A live owner confirms and stays; one
// that is silent (no heartbeat for two intervals) and never answers is tombed, and the
// call returns instead of waiting for it.
func TestSyncInvalidation(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s, HeartbeatInterval: 100 * time.Millisecond})
	live := &fakePeer{}
	liveAddr := startFakePeer(t, s, live)
	silentAddr, _ := silentPeer(t)
	registerOwner(t, srv, "live", liveAddr)
	registerOwner(t, srv, "silent", silentAddr)
	time.Sleep(250 * time.Millisecond) // both silent now; the live one heartbeats below
	if err := srv.withState(func(st *State) error {
		_, err := st.Heartbeat(time.Now(), NodeRef{ID: "live", Generation: 1}, SSDInfo{}, 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	srv.invalidate([]Invalidation{
		{NodeID: "live", PeerAddr: liveAddr, Generation: 1, Key: "k", PutID: 7, Sync: true},
		{NodeID: "silent", PeerAddr: silentAddr, Generation: 1, Key: "k", PutID: 7, Sync: true},
	})
	took := time.Since(t0)
	if _, ok := live.seenAt("k"); !ok {
		t.Fatal("invalidate returned before the live owner confirmed")
	}
	var liveOK, silentTombed bool
	srv.Inspect(func(st *State) {
		liveOK = st.nodes["live"] != nil
		silentTombed = st.nodes["silent"] == nil
	})
	if !liveOK || !silentTombed {
		t.Fatalf("after the sync invalidation: live registered=%v, silent tombed=%v", liveOK, silentTombed)
	}
	t.Logf("sync invalidation returned after %v (the silent owner's one call timing out)", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Fatalf("a silent owner held the invalidation for %v", took)
	}
}

// TestWriteQuiet: a new master answers deletes and publishes no earlier than its write
// quiet period after its start (owners not registered with it yet may still answer
// gets from their hot sets until their leases run out); afterwards at once.
func TestWriteQuiet(t *testing.T) {
	s := authtest.Secrets(t)
	started := time.Now()
	srv := startPeerFailMaster(t, Options{Secrets: s, WriteQuiet: 800 * time.Millisecond})
	ref := registerOwner(t, srv, "n1", closedPeer(t))
	h := &handler{s: srv}
	del := func() time.Duration {
		t0 := time.Now()
		resp, err := h.Delete(context.Background(), &mp.DeleteRequest{Node: &mp.NodeRef{NodeId: ref.ID, Generation: ref.Generation}, Key: "k"})
		if err != nil || resp.Code != common.ErrorCode_OK {
			t.Fatalf("delete: %v %v", err, resp)
		}
		return time.Since(t0)
	}
	del()
	if since := time.Since(started); since < 800*time.Millisecond {
		t.Fatalf("the first delete answered %v after the master's start, within its write quiet period", since)
	}
	if d := del(); d > 500*time.Millisecond {
		t.Fatalf("a delete after the quiet period took %v", d)
	}
}

// TestPersistOfATombedSourceNotSent: a persist queued while the owner holding the
// value's memory replica is tombed is not sent to the SSD owner: that owner, tombed
// while alive, registers again (an owner of an earlier release with its generation
// unchanged: the data plane's fence still matches), and its new pool may give the range the task names to another value,
// which the SSD owner would write under the key with a checksum of those bytes (a
// review). The SSD owner gets no call; the persist ends as skipped.
func TestPersistOfATombedSourceNotSent(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s, PersistWorkers: 2})
	ssdPeer := &fakePeer{}
	registerOwner(t, srv, "ssd", startFakePeer(t, s, ssdPeer))
	src := NodeRef{ID: "src", Generation: 1}
	srcAddr := startFakePeer(t, s, &fakePeer{})
	register := func() {
		t.Helper()
		if err := srv.withState(func(st *State) error {
			return st.Register(time.Now(), src, 64<<20, 0, 0, "d-src", srcAddr, SSDInfo{}, nil)
		}); err != nil {
			t.Fatal(err)
		}
	}
	register()
	task := putPersisted(t, srv, src, "k")
	if task.NodeID != "ssd" || task.SourceNodeID != "src" {
		t.Fatalf("persist task %+v; want ssd pulling from src", task)
	}
	register() // tombed, alive, registered again: its persists end
	log := watchPersists(srv, 1)
	srv.persist.submit(task)
	ended := log.wait(t, 5*time.Second)
	if e := ended[task.PutID]; !errors.Is(e.err, errPersistGone) {
		t.Errorf("the persist of a tombed source ended with %v; want it skipped", e.err)
	}
	if n := ssdPeer.persistCalls.Load(); n != 0 {
		t.Errorf("the SSD owner got %d persist calls for a value whose source was tombed", n)
	}
}

// TestWritesAfterAGiveUpTombWaitForTheLease: an owner that keeps heartbeating but never
// confirms invalidations is tombed by the first write that gives up on it (after the
// node TTL); that write waits out the owner's lease, and so do the writes after it, which
// the tomb hides the owner from (no invalidation for it is computed any more) while its
// hot set may still serve their keys. They answered at once (a review).
func TestWritesAfterAGiveUpTombWaitForTheLease(t *testing.T) {
	s := authtest.Secrets(t)
	hb := 400 * time.Millisecond
	srv, err := NewServer(Options{Secrets: s, HeartbeatInterval: hb, NodeTTL: 3 * hb})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	deaf := registerOwner(t, srv, "deaf", startFakePeer(t, s, &fakePeer{invalCode: common.ErrorCode_UNAVAILABLE}))
	other := registerOwner(t, srv, "other", startFakePeer(t, s, &fakePeer{}))
	for _, k := range []string{"k1", "k2"} {
		if err := srv.withState(func(st *State) error {
			plan, err := st.PutStart(time.Now(), deaf, k, 4096, false, nil)
			if err == nil {
				_, err = st.PutDone(time.Now(), deaf, k, plan.PutID)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	var lastSent atomic.Int64 // the send time of deaf's last heartbeat the master took
	stop := make(chan struct{})
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		for {
			for _, r := range []NodeRef{deaf, other} {
				sent := time.Now()
				if err := srv.withState(func(st *State) error { _, err := st.Heartbeat(sent, r, SSDInfo{}, 0); return err }); err == nil && r == deaf {
					lastSent.Store(sent.UnixNano())
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(hb / 4):
			}
		}
	}()
	defer func() { close(stop); <-beats }()
	h := &handler{s: srv}
	del := func(k string) {
		resp, err := h.Delete(context.Background(), &mp.DeleteRequest{Node: &mp.NodeRef{NodeId: other.ID, Generation: other.Generation}, Key: k})
		if err != nil || resp.Code != common.ErrorCode_OK {
			t.Errorf("delete %s: %v %v", k, err, resp)
		}
	}
	first := make(chan struct{})
	go func() { defer close(first); del("k1") }() // gives up on deaf after the node TTL and tombs it
	proctest.WaitUntil(t, func() (gone bool) {
		srv.Inspect(func(st *State) { gone = st.nodes["deaf"] == nil })
		return gone
	})
	del("k2")
	answered := time.Now()
	<-first
	// deaf's hot set serves until its lease ends, 1.75 intervals after its last heartbeat's send.
	if lease := time.Unix(0, lastSent.Load()).Add(7 * hb / 4); answered.Before(lease) {
		t.Fatalf("the delete of k2 answered %v before the tombed owner's lease ended: its hot set may still serve k2", lease.Sub(answered))
	}
}

// TestWriteAnsweredAfterTheGateShutIsNotLeader: a delete or publish that waits out the
// write quiet period answers NOT_LEADER when its term's fence lapsed meanwhile, as one
// whose synchronous invalidations outlast the fence does. It answered OK: an owner that
// could not register with the lapsed term reported the deleted version to the next
// one, which adopted it (a review).
func TestWriteAnsweredAfterTheGateShutIsNotLeader(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s, WriteQuiet: 800 * time.Millisecond})
	var shut atomic.Bool
	srv.gate = func() error {
		if shut.Load() {
			return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: the leadership lapsed (injected)")
		}
		return nil
	}
	n := registerOwner(t, srv, "n1", closedPeer(t))
	h := &handler{s: srv}
	node := &mp.NodeRef{NodeId: n.ID, Generation: n.Generation}
	time.AfterFunc(200*time.Millisecond, func() { shut.Store(true) })
	del, err := h.Delete(context.Background(), &mp.DeleteRequest{Node: node, Key: "k"})
	if err != nil || del.Code != common.ErrorCode_NOT_LEADER {
		t.Fatalf("a delete whose term lapsed during its quiet period: %v %v, want NOT_LEADER", err, del)
	}
	batch, err := h.BatchDelete(context.Background(), &mp.BatchDeleteRequest{Node: node, Keys: []string{"k"}})
	if err != nil || batch.Code != common.ErrorCode_NOT_LEADER {
		t.Fatalf("a batch delete with the gate shut: %v %v, want NOT_LEADER", err, batch)
	}
}
