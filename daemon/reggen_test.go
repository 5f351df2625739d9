package daemon

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// regGenLink fails heartbeats in transport while cut is set. Its Register clears cut
// and, unless refuse is set, fails in transport without reaching the master; with
// refuse it answers NOT_LEADER (refused: the master took nothing), after letting a
// heartbeat under the Register's new generation reach the master and get its answer
// (STALE_GENERATION: the master does not know it) when probe is set.
type regGenLink struct {
	masterservice.Client
	o             *Owner
	cut           atomic.Bool
	refuse, probe bool
	gen           atomic.Int64 // the generation the Register named
	answered      chan struct{}
	once          sync.Once
	hb            chan error
}

func (l *regGenLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if l.cut.Load() {
		return nil, errors.New("link cut (fault injected by the test)")
	}
	resp, err := l.Client.Heartbeat(ctx, req, o...)
	if g := l.gen.Load(); g != 0 && req.Node.Generation == g {
		l.once.Do(func() { close(l.answered) })
	}
	return resp, err
}

func (l *regGenLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	l.cut.Store(false)
	if !l.refuse {
		return nil, errors.New("connection reset (fault injected by the test: the Register never reached the master)")
	}
	if !l.probe {
		return &mp.RegisterResponse{Code: common.ErrorCode_NOT_LEADER, Message: "not the leader (fault injected by the test)"}, nil
	}
	l.gen.Store(req.Node.Generation)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _, err := l.o.master.heartbeat(ctx, false)
		l.hb <- err
	}()
	select {
	case <-l.answered:
	case <-time.After(5 * time.Second):
	}
	return &mp.RegisterResponse{Code: common.ErrorCode_NOT_LEADER, Message: "not the leader (fault injected by the test)"}, nil
}

// TestRegistrationGenerationNotTaken: a registration whose Register the master never
// took (refused, or failed in transport before it arrived) leaves the registration
// before it standing on both sides. The owner goes back to that one's generation, and
// the master's STALE_GENERATION answer to a heartbeat under the new one, which it never
// had, drops nothing: the master still routes to n1's replica of k and the owner still
// records it (a review: the owner dropped its index while the master kept the
// replica, or, failed in transport, registered again and tombed the registration the
// master still had).
func TestRegistrationGenerationNotTaken(t *testing.T) {
	for _, c := range []struct {
		name          string
		refuse, probe bool
	}{{"failed-in-transport", false, false}, {"refused", true, false}, {"refused-heartbeat-under-it", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m1 := ackMaster(t, "127.0.0.1:0")
			o, _ := ackOwner(t, m1, nil) // k holds value(1, 4096)
			g1 := o.nodeGen()
			l := &regGenLink{Client: m1.LocalClient(), o: o, refuse: c.refuse, probe: c.probe, answered: make(chan struct{}), hb: make(chan error, 1)}
			l.cut.Store(true) // the register's check heartbeat fails: it registers
			useMasterClient(o, l)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := o.master.register(ctx); err == nil {
				t.Fatal("a registration the master never took succeeded")
			}
			if c.probe {
				if err := <-l.hb; err != nil {
					t.Fatal(err)
				}
			}
			if g := o.nodeGen(); g != g1 {
				t.Errorf("the owner names generation %d, want %d: the one the master still has", g, g1)
			}
			st := o.lock()
			rec := st.replicas.lookup("k")
			o.unlock()
			if rec == nil {
				t.Error("the owner dropped its record of k: the master never tombed it")
			}
			if gen, replicas := memberGen(m1, "n1"); gen != g1 || replicas != 1 {
				t.Errorf("the master lists n1 at generation %d with %d replicas, want %d with k's", gen, replicas, g1)
			}
			if _, _, err := o.master.heartbeat(ctx, false); err != nil {
				t.Fatal(err)
			}
			if g := o.nodeGen(); g != g1 {
				t.Errorf("after a heartbeat the owner names generation %d, want %d", g, g1)
			}
		})
	}
}

// memberGen is the generation and memory replica count m lists for owner id.
func memberGen(m *master.Server, id string) (gen, replicas int64) {
	m.Inspect(func(st *master.State) {
		for _, ms := range st.Members() {
			if ms.NodeId == id {
				gen, replicas = ms.Generation, ms.MemoryReplicas
			}
		}
	})
	return gen, replicas
}

// heartbeatCutLink fails every heartbeat in transport and forwards the other calls.
type heartbeatCutLink struct{ masterservice.Client }

func (heartbeatCutLink) Heartbeat(context.Context, *mp.HeartbeatRequest, ...callopt.Option) (*mp.HeartbeatResponse, error) {
	return nil, errors.New("link cut (fault injected by the test)")
}

// TestHearsayLeavesRegistrationToTheLoop: a re-registration asked for by hearsay (a
// call answered STALE_GENERATION, as one sent under a registration and answered after
// the next one is) whose check heartbeat fails in transport sends no Register: the
// master may still have the registration (here it does), and a Register would tomb it,
// dropping n1's replicas. The heartbeat loop registers once the master says it lost
// this owner.
func TestHearsayLeavesRegistrationToTheLoop(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, _ := ackOwner(t, m1, nil) // k holds value(1, 4096)
	g1 := o.nodeGen()
	useMasterClient(o, heartbeatCutLink{m1.LocalClient()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.registerAgain(ctx, true); err == nil {
		t.Fatal("a re-registration by hearsay through a cut heartbeat link succeeded")
	}
	if gen, replicas := memberGen(m1, "n1"); gen != g1 || replicas != 1 || o.nodeGen() != g1 {
		t.Fatalf("the master lists n1 at generation %d with %d replicas, the owner names %d; want %d with k's on both sides", gen, replicas, o.nodeGen(), g1)
	}
}

// TestFollowingRegistersOncePerLeader: the follow loop's registration with a leader the
// owner registered with meanwhile (the heartbeat loop, told STALE_GENERATION by it, went
// first while the follow loop waited for regMu) sends nothing: through a check heartbeat
// failing in transport it sent a second Register, which tombed the registration the
// first one's report had rebuilt (a review).
func TestFollowingRegistersOncePerLeader(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, _ := ackOwner(t, m1, nil) // k holds value(1, 4096)
	g1 := o.nodeGen()
	l := &askedLink{Client: m1.LocalClient()}
	l.cut.Store(true)
	useMasterClient(o, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.registerFollowing(ctx, o.masterEpoch()); err != nil {
		t.Fatalf("following the leader this owner is registered with: %v", err)
	}
	if n := l.registers.Load(); n != 0 {
		t.Errorf("%d Registers sent to the leader this owner was registered with", n)
	}
	if gen, replicas := memberGen(m1, "n1"); gen != g1 || replicas != 1 {
		t.Fatalf("the master lists n1 at generation %d with %d replicas; want %d with k's", gen, replicas, g1)
	}
}

// askedLink fails every Register in transport, and every heartbeat whose context does
// not carry heldHeartbeat (the heartbeat loop's, settleLost's) once cut is set.
type askedLink struct {
	masterservice.Client
	cut       atomic.Bool
	registers atomic.Int32
}

func (l *askedLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if l.cut.Load() && ctx.Value(heldHeartbeat{}) == nil {
		return nil, errors.New("link cut (fault injected by the test)")
	}
	return l.Client.Heartbeat(ctx, req, o...)
}

func (l *askedLink) Register(context.Context, *mp.RegisterRequest, ...callopt.Option) (*mp.RegisterResponse, error) {
	l.registers.Add(1)
	return nil, errors.New("connection reset (fault injected by the test: the Register never reached the master)")
}

// TestHearsayAfterAFailedRegistration: an owner whose Register and the heartbeat after it
// failed in transport names a generation the master never took, while the master still
// has the one before. A re-registration by hearsay (a client call answered
// STALE_GENERATION under the new one) checks with a heartbeat: answered
// STALE_GENERATION, the owner goes back to the generation the master has, and asks
// again under it, answered OK: no Register (one would tomb the registration the master
// still has: a review).
func TestHearsayAfterAFailedRegistration(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, _ := ackOwner(t, m1, nil) // k holds value(1, 4096)
	g1 := o.nodeGen()
	l := &askedLink{Client: m1.LocalClient()}
	l.cut.Store(true)
	useMasterClient(o, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err == nil {
		t.Fatal("a registration through a cut link succeeded")
	}
	if o.nodeGen() == g1 {
		t.Fatal("the owner did not name a new generation: the test did not reach the fault")
	}
	asked := context.WithValue(ctx, heldHeartbeat{}, true)
	if err := o.master.registerAgain(asked, true); err != nil {
		t.Fatal(err)
	}
	if n := l.registers.Load(); n != 1 {
		t.Errorf("%d Registers sent, want only the one that failed", n)
	}
	if gen, replicas := memberGen(m1, "n1"); gen != g1 || replicas != 1 || o.nodeGen() != g1 {
		t.Fatalf("the master lists n1 at generation %d with %d replicas, the owner names %d; want %d with k's on both sides", gen, replicas, o.nodeGen(), g1)
	}
}

// tombingLink answers the heartbeats whose context carries heldHeartbeat
// STALE_GENERATION from the master epoch given (that master tombed this owner, or does
// not know the generation named) and fails every other heartbeat, and every Register,
// in transport.
type tombingLink struct {
	masterservice.Client
	epoch int64
}

func (l *tombingLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if ctx.Value(heldHeartbeat{}) == nil {
		return nil, errors.New("link cut (fault injected by the test)")
	}
	return &mp.HeartbeatResponse{Code: common.ErrorCode_STALE_GENERATION, Message: "unknown owner registration (fault injected by the test)", MasterEpoch: l.epoch}, nil
}

func (l *tombingLink) Register(context.Context, *mp.RegisterRequest, ...callopt.Option) (*mp.RegisterResponse, error) {
	return nil, errors.New("connection reset (fault injected by the test: the Register never reached the master)")
}

// TestUnsureRegistrationNotReported: an owner names a generation no master took (its
// Register and the heartbeat after it failed in transport), and its master answers a
// heartbeat under it STALE_GENERATION: the owner goes back to the generation before,
// keeping its index (the master may still have that registration), but that master may
// as well have tombed it and answered deletes of its keys since. Deposed before it
// answered under the generation gone back to, it leaves the next master without the
// owner's report: that master does not serve k (a review).
func TestUnsureRegistrationNotReported(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil) // k holds value(1, 4096)
	g1 := o.nodeGen()
	useMasterClient(o, &tombingLink{Client: m1.LocalClient(), epoch: m1.Epoch()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err == nil {
		t.Fatal("a registration through a cut link succeeded")
	}
	if _, _, err := o.master.heartbeat(context.WithValue(ctx, heldHeartbeat{}, true), false); err != nil {
		t.Fatal(err)
	}
	st := o.lock()
	rec := st.replicas.lookup("k")
	o.unlock()
	if o.nodeGen() != g1 || rec == nil {
		t.Fatalf("the owner names %d (want %d, gone back) and records k: %v", o.nodeGen(), g1, rec != nil)
	}
	m1.Stop()
	m2 := ackMaster(t, "127.0.0.1:0")
	useMasterClient(o, m2.LocalClient())
	waitRegisteredWith(t, o, m2)
	if ok, err := c.Exists("k"); err != nil || ok {
		t.Errorf("exists of k at the next master: %v %v; the master before it may have deleted it", ok, err)
	}
}
