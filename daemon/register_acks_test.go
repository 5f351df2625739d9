package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// heldRegister is a master client whose next Register waits, once armed, until release
// is closed (a Register call in flight).
type heldRegister struct {
	masterservice.Client
	hold    atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (h *heldRegister) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	if h.hold.CompareAndSwap(true, false) {
		close(h.entered)
		<-h.release
	}
	return h.Client.Register(ctx, req, o...)
}

// TestPinAckDuringRegister: a holder released while the owner's Register call to a
// restarted master is in flight. The registration reported the holding as a pin, so the
// new master holds its range until the owner acks the pin id. The release queues that
// ack at once: sent before the Register landed, the new master answered it
// STALE_GENERATION and the acker dropped it, and the new master held the range for good
// (a replica sharing it never evictable). The acker now waits for the registration.
func TestPinAckDuringRegister(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil)
	h, err := c.Get("k") // reported as a pin at the next registration
	if err != nil {
		t.Fatal(err)
	}

	// The master restarts; the owner's next Register waits in flight.
	addr := m1.Addr().String()
	m1.Stop()
	m2 := ackMaster(t, addr)
	held := &heldRegister{Client: m2.LocalClient(), entered: make(chan struct{}), release: make(chan struct{})}
	held.hold.Store(true)
	useMasterClient(o, held)

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- o.master.register(ctx)
	}()
	<-held.entered
	h.Release() // while the Register call is out
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the acker's flush (AckDelay 1 ms) runs
	close(held.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitNoHolders(t, o, m2, "the acks of pins released during the registration were dropped")
}

// lapsedAcks is a master client whose next n BatchDeleteAck calls are answered
// NOT_LEADER without reaching the master: an HA leader whose etcd lease lapsed for a
// moment (Server.gate) answers exactly that, applying none of the acks, and serves on
// under the same term once a keepalive lands again.
type lapsedAcks struct {
	masterservice.Client
	n atomic.Int32
}

func (l *lapsedAcks) BatchDeleteAck(ctx context.Context, req *mp.BatchDeleteAckRequest, o ...callopt.Option) (*mp.BatchDeleteAckResponse, error) {
	if len(req.HolderIds) > 0 && l.n.Add(-1) >= 0 {
		return &mp.BatchDeleteAckResponse{Code: common.ErrorCode_NOT_LEADER, Message: "not the leader: the leadership of epoch 1 lapsed"}, nil
	}
	return l.Client.BatchDeleteAck(ctx, req, o...)
}

// TestAckNotLeaderKept: a holder ack answered NOT_LEADER (the leader's gate shut for a
// moment) was applied by nobody: it is sent again (the acker dropped it like a
// STALE_GENERATION answer, and the master held the range for good).
func TestAckNotLeaderKept(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m, func(o *Options) { o.CacheGrace = -1 })
	lapsed := &lapsedAcks{Client: m.LocalClient()}
	lapsed.n.Store(1)
	useMasterClient(o, lapsed)

	getAndRelease(t, c)
	waitNoHolders(t, o, m, "the ack answered NOT_LEADER was dropped")
}

// lapsedStart answers the next GetStart that carries holder acks NOT_LEADER without
// reaching the master (a leader whose gate is shut applies none of them: applyAcks).
type lapsedStart struct {
	masterservice.Client
	n atomic.Int32
}

func (l *lapsedStart) GetStart(ctx context.Context, req *mp.GetStartRequest, o ...callopt.Option) (*mp.GetStartResponse, error) {
	if len(req.Acks) > 0 && l.n.Add(-1) >= 0 {
		return &mp.GetStartResponse{Code: common.ErrorCode_NOT_LEADER, Message: "not the leader: the leadership of epoch 1 lapsed"}, nil
	}
	return l.Client.GetStart(ctx, req, o...)
}

// TestGetStartNotLeaderKeepsAcks: the holder acks a GetStart carried are queued again
// when the call is answered NOT_LEADER (askMaster gave them back only on a transport
// error, and they were lost).
func TestGetStartNotLeaderKeepsAcks(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m, func(o *Options) { o.CacheGrace, o.AckDelay = -1, time.Hour })
	lapsed := &lapsedStart{Client: m.LocalClient()}
	lapsed.n.Store(1)
	useMasterClient(o, lapsed)

	getAndRelease(t, c) // its ack waits in the queue (AckDelay)
	time.Sleep(20 * time.Millisecond)
	if _, err := c.Get("k"); err == nil { // carries the ack; answered NOT_LEADER
		t.Fatal("the lapsed GetStart succeeded")
	}
	waitNoHolders(t, o, m, "the acks of a GetStart answered NOT_LEADER were dropped")
}

// ackMaster starts an in-process master on addr ("127.0.0.1:0": any port); the test
// stops it at its end unless it stops it first.
func ackMaster(t *testing.T, addr string) *master.Server {
	t.Helper()
	return ackMasterWith(t, addr, master.Options{})
}

// ackMasterWith is ackMaster with opts (insecure, logging nowhere).
func ackMasterWith(t *testing.T, addr string, opts master.Options) *master.Server {
	t.Helper()
	log := zerolog.Nop()
	opts.InsecureCluster, opts.Logger = true, &log
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

// ackOwner starts owner n1 of m (its master calls in process, tweak applied to its
// options) with key k put through its client.
func ackOwner(t *testing.T, m *master.Server, tweak func(*Options)) (*Owner, *fluxkv.Client) {
	t.Helper()
	log := zerolog.Nop()
	opts := Options{Dir: t.TempDir(), DRAM: 4 << 20, MasterAddr: m.Addr().String(), NodeID: "n1", Logger: &log, InsecureCluster: true,
		LocalMaster: m.LocalClient()}
	if tweak != nil {
		tweak(&opts)
	}
	o, c := startOwnerClient(t, opts, t.Name())
	if err := c.Put("k", value(1, 4096)); err != nil {
		t.Fatal(err)
	}
	return o, c
}

// useMasterClient makes o's master calls go through mc.
func useMasterClient(o *Owner, mc masterservice.Client) {
	cur := o.master.client.Load()
	o.master.client.Store(&masterClient{Client: mc, addr: cur.addr, ctx: cur.ctx, cancel: cur.cancel})
}

// waitNoHolders waits up to 5 s for m to hold no range of o's node (o's acks flushed
// meanwhile), else fails with why.
func waitNoHolders(t *testing.T, o *Owner, m *master.Server, why string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		o.acks.sync()
		n := nodeHolders(t, m)
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the master still holds %d range(s) of n1 that no client uses: %s", n, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lostStart loses the replies of the next n GetStart and BatchGetStart calls after the
// master answered them (a reply lost in transport, or a call that timed out after the
// master acted).
type lostStart struct {
	masterservice.Client
	n atomic.Int32
}

var errReplyLost = errors.New("connection reset: reply lost (fault injected by the test)")

func (l *lostStart) GetStart(ctx context.Context, req *mp.GetStartRequest, o ...callopt.Option) (*mp.GetStartResponse, error) {
	resp, err := l.Client.GetStart(ctx, req, o...)
	if err == nil && l.n.Add(-1) >= 0 {
		return nil, errReplyLost
	}
	return resp, err
}

func (l *lostStart) BatchGetStart(ctx context.Context, req *mp.BatchGetStartRequest, o ...callopt.Option) (*mp.BatchGetStartResponse, error) {
	resp, err := l.Client.BatchGetStart(ctx, req, o...)
	if err == nil && l.n.Add(-1) >= 0 {
		return nil, errReplyLost
	}
	return resp, err
}

// TestLostGetStartReplyReleasesItsHolder: the master records a local hit's holder when
// it answers GetStart; a reply lost on the way left that holder unknown to the owner,
// and the replica held (never evictable) until the owner registered again. The owner
// now names the holder id in its request and acks it when the call fails, for one key
// and for a batch.
func TestLostGetStartReplyReleasesItsHolder(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m, func(o *Options) { o.CacheGrace = -1 })
	if err := c.Put("k2", value(2, 4096)); err != nil {
		t.Fatal(err)
	}
	lost := &lostStart{Client: m.LocalClient()}
	useMasterClient(o, lost)

	lost.n.Store(1)
	if _, err := c.Get("k"); err == nil {
		t.Fatal("a get whose GetStart reply was lost succeeded")
	}
	waitNoHolders(t, o, m, "the holder of a lost GetStart reply")

	lost.n.Store(1)
	_, errs, err := c.BatchGet([]string{"k", "k2"})
	if err == nil && errs[0] == nil && errs[1] == nil {
		t.Fatal("a batch get whose BatchGetStart reply was lost succeeded")
	}
	waitNoHolders(t, o, m, "the holders of a lost BatchGetStart reply")

	// Without a fault the gets are served and their holders released as usual.
	hs, errs, err := c.BatchGet([]string{"k", "k2"})
	if err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatal(err, errs)
	}
	for _, h := range hs {
		h.Release()
	}
	c.Flush()
	waitNoHolders(t, o, m, "the holders of a batch get released")
}

// TestReleaseHotSetAnswersWhetherTheAcksWentOut: a ReleaseHotSet whose holder acks did
// not reach the master (answered NOT_LEADER: sent again later) is not answered OK. The
// master, told the room was given back, stops sparing held duplicates and may evict a
// sole copy for room that is still held (a review).
func TestReleaseHotSetAnswersWhetherTheAcksWentOut(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m, func(o *Options) { o.CacheGrace, o.AckDelay = -1, time.Hour })
	lapsed := &lapsedAcks{Client: m.LocalClient()}
	lapsed.n.Store(1)
	useMasterClient(o, lapsed)
	getAndRelease(t, c) // the owner has the release; its ack waits (AckDelay)
	if r := o.releaseHotSet(nil, 1<<20); r.Code != common.ErrorCode_UNAVAILABLE {
		t.Fatalf("ReleaseHotSet with its acks answered NOT_LEADER: %v %q, want UNAVAILABLE", r.Code, r.Message)
	}
	if r := o.releaseHotSet(nil, 1<<20); r.Code != common.ErrorCode_OK {
		t.Fatalf("ReleaseHotSet once the acks went out: %v %q", r.Code, r.Message)
	}
	waitNoHolders(t, o, m, "the acks were not sent again")
}

// TestReleaseHotSetKeepsItsAcksFromCalls: while a hot-set release syncs the acks of what
// it released, master calls carry none of them (take): they go in the release's own
// BatchDeleteAck, whose answer is the release's. A GetStart or PutStart that took them
// carried them instead, and the release answered OK while they were on their way.
func TestReleaseHotSetKeepsItsAcksFromCalls(t *testing.T) {
	t.Parallel()
	a := &acker{}
	done := a.holdForSync()
	a.add(7)
	if ids := a.take(); len(ids) != 0 {
		t.Fatalf("a master call took %v while a hot-set release synced them", ids)
	}
	done()
	if ids := a.take(); len(ids) != 1 || ids[0] != 7 {
		t.Fatalf("after the release a call takes %v, want [7]", ids)
	}
}

// getAndRelease gets k through c, releases the holder and flushes the release to the
// owner (which queues its ack).
func getAndRelease(t *testing.T, c *fluxkv.Client) {
	t.Helper()
	h, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestUnsentPlanningCallQueuesNoAcks: planning calls that never left the owner (a
// registration in progress outlasted their wait) recorded no holder at the master, so
// their holder ids are not queued as acks: queued, now and again after the in-flight
// TTL, each such batch's 4,096 ids pushed real acks out of the bounded queue (a review).
func TestUnsentPlanningCallQueuesNoAcks(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, _ := ackOwner(t, m, func(o *Options) { o.AckDelay, o.MasterTimeout = time.Hour, 500*time.Millisecond })
	ch := make(chan struct{}) // a registration that does not end
	o.master.settling.Store(&ch)
	defer close(ch)
	pending := func() int {
		o.acks.mu.Lock()
		defer o.acks.mu.Unlock()
		return len(o.acks.pending)
	}
	before := pending()
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	for _, ks := range [][]string{keys[:1], keys} { // a GetStart, a BatchGetStart
		if res := o.startGets(ks, 0); wire.CodeOf(res[0].err) != common.ErrorCode_UNAVAILABLE {
			t.Fatalf("%d gets planned during a registration: %v, want UNAVAILABLE", len(ks), res[0].err)
		}
	}
	if after := pending(); after != before {
		t.Errorf("%d holder ids of calls never sent were queued as acks", after-before)
	}
}
