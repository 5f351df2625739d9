package daemon

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// stallFlushAndRegister holds the next BatchDeleteAck with holder ids (then fails it in
// transport) and the next Register, and counts the acks of GetStart and PutStart calls
// answered STALE_GENERATION.
type stallFlushAndRegister struct {
	masterservice.Client
	holdAck, holdReg atomic.Bool
	ackIn, ackGo     chan struct{}
	regIn, regGo     chan struct{}
	staleCarried     atomic.Int32
}

func (s *stallFlushAndRegister) BatchDeleteAck(ctx context.Context, req *mp.BatchDeleteAckRequest, o ...callopt.Option) (*mp.BatchDeleteAckResponse, error) {
	if len(req.HolderIds) > 0 && s.holdAck.CompareAndSwap(true, false) {
		close(s.ackIn)
		<-s.ackGo
		return nil, errReplyLost
	}
	return s.Client.BatchDeleteAck(ctx, req, o...)
}

func (s *stallFlushAndRegister) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	if s.holdReg.CompareAndSwap(true, false) {
		close(s.regIn)
		<-s.regGo
	}
	return s.Client.Register(ctx, req, o...)
}

func (s *stallFlushAndRegister) GetStart(ctx context.Context, req *mp.GetStartRequest, o ...callopt.Option) (*mp.GetStartResponse, error) {
	resp, err := s.Client.GetStart(ctx, req, o...)
	if err == nil && resp.Code == common.ErrorCode_STALE_GENERATION {
		s.staleCarried.Add(int32(len(req.Acks)))
	}
	return resp, err
}

func (s *stallFlushAndRegister) PutStart(ctx context.Context, req *mp.PutStartRequest, o ...callopt.Option) (*mp.PutStartResponse, error) {
	resp, err := s.Client.PutStart(ctx, req, o...)
	if err == nil && resp.Code == common.ErrorCode_STALE_GENERATION {
		s.staleCarried.Add(int32(len(req.Acks)))
	}
	return resp, err
}

func (s *stallFlushAndRegister) BatchPutStart(ctx context.Context, req *mp.BatchPutStartRequest, o ...callopt.Option) (*mp.BatchPutStartResponse, error) {
	resp, err := s.Client.BatchPutStart(ctx, req, o...)
	if err == nil && (resp.Code == common.ErrorCode_STALE_GENERATION ||
		len(resp.Results) == 1 && resp.Results[0] != nil && resp.Results[0].Code == common.ErrorCode_STALE_GENERATION) {
		s.staleCarried.Add(int32(len(req.Acks)))
	}
	return resp, err
}

// TestPlanningCallKeepsAcksAStaleMasterRefused: a GetStart (or PutStart) that waited for
// an ack flush in flight takes acks released after a registration began (pins it
// reported) and carries them to a master that does not know the registration yet
// (STALE_GENERATION). They go back to the queue: dropped, the master held the pin for
// good (a review).
func TestPlanningCallKeepsAcksAStaleMasterRefused(t *testing.T) {
	calls := map[string]func(c *fluxkv.Client) error{
		"get": func(c *fluxkv.Client) error {
			g, err := c.Get("k3")
			if err == nil {
				g.Release()
			}
			return err
		},
		"put": func(c *fluxkv.Client) error { return c.Put("k3", value(3, 4096)) },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			planningCallKeepsAcks(t, call)
		})
	}
}

// planningCallKeepsAcks runs TestPlanningCallKeepsAcksAStaleMasterRefused with call as
// the planning call that waits for the flush.
func planningCallKeepsAcks(t *testing.T, call func(c *fluxkv.Client) error) {
	// Heartbeats far apart: one to the new master (STALE_GENERATION) registers the owner
	// again on its own, and the planning call then waits for that registration (held
	// below) instead of the flush: the test missed its interleaving and hung (1 run in
	// 5 or so).
	slow := master.Options{HeartbeatInterval: time.Minute, NodeTTL: 5 * time.Minute, WriteQuiet: -1}
	m1 := ackMasterWith(t, "127.0.0.1:0", slow)
	o, c := ackOwner(t, m1, func(o *Options) { o.CacheGrace, o.AckDelay = -1, time.Hour })
	h, err := c.Get("k") // a pin of the coming registration
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put("k2", value(2, 4096)); err != nil {
		t.Fatal(err)
	}
	h2, err := c.Get("k2")
	if err != nil {
		t.Fatal(err)
	}
	h2.Release() // its ack waits in the queue (AckDelay): the flush held in flight below
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	addr := m1.Addr().String()
	m1.Stop()
	m2 := ackMasterWith(t, addr, slow)
	s := &stallFlushAndRegister{Client: m2.LocalClient(), ackIn: make(chan struct{}), ackGo: make(chan struct{}),
		regIn: make(chan struct{}), regGo: make(chan struct{})}
	var ackGone, regGone bool
	defer func() { // a failure lets the held calls go, or the owner's Stop waits for them
		if !ackGone {
			close(s.ackGo)
		}
		if !regGone {
			close(s.regGo)
		}
	}()
	s.holdAck.Store(true)
	s.holdReg.Store(true)
	useMasterClient(o, s)

	go o.acks.sync()
	<-s.ackIn
	c2, err := fluxkv.Connect(fluxkv.Options{Socket: o.SocketPath(), Name: t.Name() + "-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	getErr := make(chan error, 1)
	go func() { getErr <- call(c2) }() // no registration yet: it waits for the flush in takeForCall
	// (Waited for, not slept on: a call that came later, slowed on a busy machine, met
	// the registration below and waited for it, which waits for this call.)
	waitUntil(t, func() bool { return o.acks.flightWaiters.Load() > 0 })
	regDone := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		regDone <- o.master.register(ctx)
	}()
	<-s.regIn // pins collected (k's holding among them); Register held
	h.Release()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		o.acks.mu.Lock()
		n := len(o.acks.pending)
		o.acks.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the release was not queued")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(s.ackGo) // the flush fails; the waiting call takes the pin's ack with its own
	ackGone = true
	t.Logf("planning call: %v", <-getErr)
	close(s.regGo)
	regGone = true
	if err := <-regDone; err != nil {
		t.Fatal(err)
	}
	if s.staleCarried.Load() == 0 {
		t.Fatal("no planning call carried acks into a STALE_GENERATION answer: the test missed its interleaving")
	}
	waitNoHolders(t, o, m2, "the pin's ack rode a planning call answered STALE_GENERATION and was dropped")
}

// lateDone fails the next GetDone on the owner's side at once while the master gets it
// only after the owner acked the get id (its holder id): a master that was slow to take
// the call.
type lateDone struct {
	masterservice.Client
	o    *Owner
	n    atomic.Int32
	done chan struct{}
}

func (l *lateDone) GetDone(ctx context.Context, req *mp.GetDoneRequest, o ...callopt.Option) (*mp.GetDoneResponse, error) {
	if l.n.Add(-1) < 0 {
		return l.Client.GetDone(ctx, req, o...)
	}
	go func() {
		defer close(l.done)
		time.Sleep(100 * time.Millisecond)
		l.o.acks.sync()
		l.Client.GetDone(context.Background(), req)
	}()
	return nil, errReplyLost
}

// TestLateGetDoneAfterItsAck: a GetDone the owner gave up on (UNAVAILABLE) that reaches
// the master after the owner acked the get id records a holder nobody holds; the owner
// acks the id again once the in-flight TTL passed, as for a late GetStart (a review: the
// master held the range for good).
func TestLateGetDoneAfterItsAck(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true, InflightTTL: time.Second})
	o2, c2 := n.addOwner(t, "n2", 8<<20, nil, func(o *Options) { o.CacheGrace = -1 })
	if err := n.c.Put("k", value(7, 64<<10)); err != nil {
		t.Fatal(err)
	}
	late := &lateDone{o: o2, done: make(chan struct{})}
	late.n.Store(1)
	(&node{o: o2}).wrapMaster(func(c masterservice.Client) masterservice.Client { late.Client = c; return late })
	if h, err := c2.Get("k"); err == nil {
		h.Release()
		t.Fatal("a get whose GetDone failed succeeded")
	}
	<-late.done
	if memberHolders(t, n.m, "n2") == 0 {
		t.Fatal("the late GetDone recorded no holder")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		o2.acks.sync()
		h := memberHolders(t, n.m, "n2")
		if h == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the master holds %d range(s) of n2 that no client uses: the holder a late GetDone recorded under an id already acked", h)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
