package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// forgetfulLink answers heartbeats STALE_GENERATION (the master tombed this owner)
// until a Register went through, and loses that Register's answer (the master took it).
type forgetfulLink struct {
	masterservice.Client
	registered atomic.Bool
	registers  atomic.Int32
}

func (f *forgetfulLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if !f.registered.Load() {
		return &mp.HeartbeatResponse{Code: common.ErrorCode_STALE_GENERATION, Message: "not registered (fault injected by the test)"}, nil
	}
	return f.Client.Heartbeat(ctx, req, o...)
}

func (f *forgetfulLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	f.registers.Add(1)
	resp, err := f.Client.Register(ctx, req, o...)
	if err != nil || f.registered.Swap(true) {
		return resp, err
	}
	return nil, errReplyLost
}

// TestRegisterAnswerLost: a Register the master took (dropping every replica of this
// owner) whose answer was lost leaves the owner's heartbeats answered OK by the same
// master; their registration_seq names that Register, and the owner forgets its
// replicas as the master did, without registering again, instead of keeping an index of
// replicas the master no longer knows (a review: its exists answered true for keys the
// master had dropped, and a later master rebuilt from its report would route to
// versions deleted since). Nothing stays held at the master.
func TestRegisterAnswerLost(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil) // k holds value(1, 4096)
	f := &forgetfulLink{Client: m1.LocalClient()}
	useMasterClient(o, f)
	deadline := time.Now().Add(20 * time.Second)
	for !f.registered.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the owner did not register again after heartbeats answered STALE_GENERATION")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		st := o.lock()
		rec := st.replicas.lookup("k")
		o.unlock()
		if rec == nil && !o.master.unsettled() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the owner still records k (%+v) after the master took a registration that dropped it", rec)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ok, err := c.Exists("k"); err != nil || ok {
		t.Errorf("exists of k: %v %v; the master dropped it with the registration", ok, err)
	}
	if _, err := c.Get("k"); err == nil {
		t.Error("k served after the master dropped this owner's replicas")
	}
	if err := c.Put("k", value(2, 4096)); err != nil {
		t.Fatalf("put after the registrations: %v", err)
	}
	if n := f.registers.Load(); n != 1 {
		t.Errorf("%d Registers sent; want the one whose answer was lost", n)
	}
	waitNoHolders(t, o, m1, "a range stays held after the lost registration")
}

// TestFailedRegisterAcksIdleHolders: a registration lets the hot set's idle holdings go
// unacked (the new master never knew them); one that fails before reaching the master
// acks them, or the master it still has kept their holders for good (a review). The
// heartbeat after the Register fails too, so the owner names the failed registration's
// generation, which the master never took: acks answered STALE_GENERATION under it are
// kept for the one the owner goes back to at its next heartbeat, and that heartbeat's
// STALE_GENERATION sends no Register (which would tomb the registration the master
// still has; reviews): the master still lists n1 at its generation, with k's replica.
func TestFailedRegisterAcksIdleHolders(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, func(o *Options) { o.CacheGrace = time.Minute })
	getAndRelease(t, c)
	for deadline := time.Now().Add(5 * time.Second); ; {
		st := o.lock()
		idle := st.hot.idleLen()
		o.unlock()
		if idle == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("k never idle in the hot set")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := nodeHolders(t, m1); n == 0 {
		t.Fatal("the idle holding holds no holder at the master: the test did not reach the fault")
	}
	g1 := o.nodeGen()
	l := &flakyLink{Client: m1.LocalClient()}
	l.failHeartbeats.Store(2) // register's check and settleLost's; the Register itself never reaches m1
	useMasterClient(o, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err == nil {
		t.Fatal("a registration through a cut link succeeded")
	}
	useMasterClient(o, m1.LocalClient())
	waitNoHolders(t, o, m1, "the idle hot-set holding's holder, let go unacked by a Register that never reached the master")
	if gen, replicas := memberGen(m1, "n1"); gen != g1 || replicas != 1 || o.nodeGen() != g1 {
		t.Fatalf("the master lists n1 at generation %d with %d replicas, the owner names %d; want %d with k's on both sides", gen, replicas, o.nodeGen(), g1)
	}
}

// waitRegisteredWith waits up to 20 s for o to have registered with m and settled.
func waitRegisteredWith(t *testing.T, o *Owner, m *master.Server) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); o.masterEpoch() != m.Epoch() || o.master.unsettled(); {
		if time.Now().After(deadline) {
			t.Fatal("the owner did not register with the next master")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deposedLink answers heartbeats STALE_GENERATION from the master epoch the owner
// registered with (that master tombed it) and fails every Register: the master is
// deposed before the owner registers with it again.
type deposedLink struct {
	masterservice.Client
	epoch int64
}

func (d *deposedLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	return &mp.HeartbeatResponse{Code: common.ErrorCode_STALE_GENERATION, Message: "unknown owner incarnation (fault injected by the test)", MasterEpoch: d.epoch}, nil
}

func (d *deposedLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	return nil, errReplyLost
}

// TestTombedThenDeposed: the master this owner registered with tombed it (heartbeats
// answered STALE_GENERATION under that master's epoch: it dropped the owner's replicas,
// and may have answered deletes of their keys since), and was deposed before the owner
// registered with it again. The owner drops its index and SSD entries at that answer:
// kept until a Register answered by the same master, they were reported to the next
// master instead (PrevEpoch the old epoch), which adopted k and served it (a review).
func TestTombedThenDeposed(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil) // k holds value(1, 4096)
	useMasterClient(o, &deposedLink{Client: m1.LocalClient(), epoch: m1.Epoch()})
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := o.lock()
		rec := st.replicas.lookup("k")
		o.unlock()
		if rec == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the owner still records k after its master answered that it tombed this owner")
		}
		time.Sleep(20 * time.Millisecond)
	}
	m1.Stop()
	m2 := ackMaster(t, "127.0.0.1:0")
	useMasterClient(o, m2.LocalClient())
	waitRegisteredWith(t, o, m2)
	if ok, err := c.Exists("k"); err != nil || ok {
		t.Errorf("exists of k at the next master: %v %v; the master before it had dropped it", ok, err)
	}
	if h, err := c.Get("k"); err == nil {
		h.Release()
		t.Error("k served by the next master, rebuilt from the report of an owner the master before it had tombed")
	}
}

type heldHeartbeat struct{}

// lateStaleLink answers the heartbeat whose context carries heldHeartbeat from the
// master, and delivers that answer (STALE_GENERATION: the master did not know this
// incarnation yet) only once release is closed; Registers go through only after that
// heartbeat was answered: the heartbeat reached the master before the Register did, its
// answer came back late.
type lateStaleLink struct {
	masterservice.Client
	answered, release chan struct{}
	once              atomic.Bool
}

func (l *lateStaleLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	resp, err := l.Client.Heartbeat(ctx, req, o...)
	if ctx.Value(heldHeartbeat{}) != nil && l.once.CompareAndSwap(false, true) {
		close(l.answered)
		if err == nil && resp.Code == common.ErrorCode_STALE_GENERATION {
			<-l.release
		}
	}
	return resp, err
}

func (l *lateStaleLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	<-l.answered
	return l.Client.Register(ctx, req, o...)
}

// TestLateStaleHeartbeatKeepsTheIndex: the heartbeat loop's answer STALE_GENERATION,
// from the master the owner has registered with since the heartbeat was sent, names
// that master's epoch but not a tomb of this registration: the index and SSD entries
// the master adopted from the report stay (a review: they were wiped, and the master
// went on routing to them; a later master rebuilt nothing of them).
func TestLateStaleHeartbeatKeepsTheIndex(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil) // k holds value(1, 4096)
	m1.Stop()
	m2 := ackMaster(t, "127.0.0.1:0")
	l := &lateStaleLink{Client: m2.LocalClient(), answered: make(chan struct{}), release: make(chan struct{})}
	useMasterClient(o, l)
	hb := make(chan error, 1)
	go func() { // a heartbeat of the loop (regMu not held)
		_, _, err := o.master.heartbeat(context.WithValue(context.Background(), heldHeartbeat{}, true), false)
		hb <- err
	}()
	<-l.answered
	waitRegisteredWith(t, o, m2)
	close(l.release)
	if err := <-hb; err != nil {
		t.Fatal(err)
	}
	st := o.lock()
	rec := st.replicas.lookup("k")
	o.unlock()
	if rec == nil {
		t.Fatal("a late STALE_GENERATION answer dropped k from the index m2 adopted")
	}
	if h, err := c.Get("k"); err != nil {
		t.Fatalf("k at m2 after the late answer: %v", err)
	} else {
		h.Release()
	}
}

// tombThenSwitchLink answers the first heartbeat STALE_GENERATION under the epoch the
// owner registered with (that master tombed it), after switching the owner's master
// client to next: the master was deposed right after, and the registration the answer
// starts goes to the next master.
type tombThenSwitchLink struct {
	masterservice.Client
	o     *Owner
	epoch int64
	next  masterservice.Client
	once  atomic.Bool
}

func (l *tombThenSwitchLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if !l.once.CompareAndSwap(false, true) {
		return l.Client.Heartbeat(ctx, req, o...)
	}
	useMasterClient(l.o, l.next)
	return &mp.HeartbeatResponse{Code: common.ErrorCode_STALE_GENERATION, Message: "unknown owner incarnation (fault injected by the test)", MasterEpoch: l.epoch}, nil
}

// TestTombAnswerThenSwitch: the heartbeat loop learns that its master tombed it, and the
// registration that follows goes to the next master (the leader changed in between):
// the index goes at that answer, before the registration's own check (which reaches the
// next master, who answers STALE_GENERATION under its own epoch) (a review: it was
// reported to the next master, which served k).
func TestTombAnswerThenSwitch(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil) // k holds value(1, 4096)
	m2 := ackMaster(t, "127.0.0.1:0")
	useMasterClient(o, &tombThenSwitchLink{Client: m1.LocalClient(), o: o, epoch: m1.Epoch(), next: m2.LocalClient()})
	waitRegisteredWith(t, o, m2)
	if ok, err := c.Exists("k"); err != nil || ok {
		t.Errorf("exists of k at the next master: %v %v; the master before it had tombed this owner", ok, err)
	}
	if h, err := c.Get("k"); err == nil {
		h.Release()
		t.Error("k served by the next master, rebuilt from the report of an owner the master before it had tombed")
	}
}

// failedRegisterLink fails every call in transport but the heartbeat whose context
// carries heldHeartbeat, which it answers STALE_GENERATION under epoch (the master
// registered with tombed the owner) once a Register has failed.
type failedRegisterLink struct {
	masterservice.Client
	epoch        int64
	sent, failed chan struct{}
	once         atomic.Bool
}

func (l *failedRegisterLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if ctx.Value(heldHeartbeat{}) == nil {
		return nil, errReplyLost
	}
	close(l.sent)
	<-l.failed
	return &mp.HeartbeatResponse{Code: common.ErrorCode_STALE_GENERATION, Message: "unknown owner incarnation (fault injected by the test)", MasterEpoch: l.epoch}, nil
}

func (l *failedRegisterLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	if l.once.CompareAndSwap(false, true) {
		defer close(l.failed)
	}
	return nil, errReplyLost
}

// TestTombAnswerAcrossAFailedRegistration: a heartbeat's answer that the master
// registered with tombed this owner arrives after a registration began and failed: the
// index still goes (a review: ignored across any registration begun, it was reported to
// the next master).
func TestTombAnswerAcrossAFailedRegistration(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, _ := ackOwner(t, m1, nil) // k holds value(1, 4096)
	l := &failedRegisterLink{Client: m1.LocalClient(), epoch: m1.Epoch(), sent: make(chan struct{}), failed: make(chan struct{})}
	useMasterClient(o, l)
	hb := make(chan error, 1)
	go func() {
		_, _, err := o.master.heartbeat(context.WithValue(context.Background(), heldHeartbeat{}, true), false)
		hb <- err
	}()
	<-l.sent // the heartbeat went out before the registration began
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err == nil {
		t.Fatal("a registration through a failing link succeeded")
	}
	if err := <-hb; err != nil {
		t.Fatal(err)
	}
	st := o.lock()
	rec := st.replicas.lookup("k")
	o.unlock()
	if rec != nil {
		t.Fatal("the owner still records k after its master answered that it tombed this owner")
	}
}

// lostRegisterLink loses the answer of the first Register it forwards (the master took
// it) and fails every heartbeat while failHeartbeats is set.
type lostRegisterLink struct {
	masterservice.Client
	lost, failHeartbeats atomic.Bool
}

func (l *lostRegisterLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	resp, err := l.Client.Register(ctx, req, o...)
	if err == nil && l.lost.CompareAndSwap(false, true) {
		return nil, errReplyLost
	}
	return resp, err
}

func (l *lostRegisterLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if l.failHeartbeats.Load() {
		return nil, errReplyLost
	}
	return l.Client.Heartbeat(ctx, req, o...)
}

// TestLostRegistrationWaitsForRegistrations: a registration whose answer was lost,
// learnt from a later heartbeat of the loop (the one the failed Register sent failed
// too), forgets the SSD ring's entries under regMu, as a registration's outcome: forgotten
// while another registration ran (the leader follower's, a background one), they were
// in that registration's report, and the next master routed gets to entries this owner
// no longer had (a review).
func TestLostRegistrationWaitsForRegistrations(t *testing.T) {
	t.Parallel()
	n := startNode(t, 4<<20, ssdOptions(t, 64<<20), master.Options{InsecureCluster: true})
	for i := range 12 {
		if err := n.c.Put(fmt.Sprintf("lr-%d", i), value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	onSSD := len(n.o.store.Committed())
	if onSSD == 0 {
		t.Fatal("nothing reached SSD")
	}
	l := &lostRegisterLink{Client: n.o.master.cl()}
	l.failHeartbeats.Store(true)
	useMasterClient(n.o, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Its check heartbeat fails, so it registers; the master takes the Register (the
	// same epoch: it drops this owner's replicas) and its answer is lost.
	if err := n.o.master.register(ctx); err == nil || !l.lost.Load() {
		t.Fatalf("register: %v (answer lost: %v); want the Register's answer lost", err, l.lost.Load())
	}
	if got := len(n.o.store.Committed()); got != onSSD {
		t.Fatalf("%d SSD entries of %d left before any heartbeat named the lost registration", got, onSSD)
	}
	n.o.master.regMu.Lock() // a registration in progress
	locked := true
	unlock := func() {
		if locked {
			locked = false
			n.o.master.regMu.Unlock()
		}
	}
	defer unlock()
	l.failHeartbeats.Store(false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.o.master.heartbeat(ctx, false)
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
	}
	if got := len(n.o.store.Committed()); got != onSSD {
		unlock()
		t.Fatalf("%d SSD entries of %d left while a registration held regMu: a lost registration forgot them beside it", got, onSSD)
	}
	unlock()
	<-done
	waitUntil(t, func() bool { return len(n.o.store.Committed()) == 0 })
	st := n.o.lock()
	rec := st.replicas.lookup("lr-11")
	n.o.unlock()
	if rec != nil {
		t.Errorf("lr-11 still indexed (%+v) after the lost registration was learnt", rec)
	}
}
