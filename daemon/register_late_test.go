package daemon

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// lateRegisterLink fails every Register in transport, keeping the first request (still
// on its way, to be delivered by the test), and fails heartbeats while cut.
type lateRegisterLink struct {
	masterservice.Client
	cut  atomic.Bool
	mu   sync.Mutex
	held *mp.RegisterRequest
}

func (l *lateRegisterLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if l.cut.Load() {
		return nil, errors.New("link cut (fault injected)")
	}
	return l.Client.Heartbeat(ctx, req, o...)
}

func (l *lateRegisterLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	l.mu.Lock()
	if l.held == nil {
		l.held = req
		l.cut.Store(false) // the check heartbeat after it gets through
	}
	l.mu.Unlock()
	return nil, errors.New("i/o timeout (fault injected: the Register is still on its way)")
}

// TestLateRegisterWaitsOutTheServingLease: a Register that failed in transport, after
// which the owner went back to its registration and served from its hot set again
// under a renewed lease, lands late and tombs that registration: a write answered
// before the lease ends would leave the owner answering the old bytes (a review: an
// overwrite through another owner was answered in 0.5 ms and the hot set served the
// old version). The master holds writes until the tombed registration's lease is out.
func TestLateRegisterWaitsOutTheServingLease(t *testing.T) {
	t.Parallel()
	log := zerolog.Nop()
	const hb = 2 * time.Second
	m := ackMasterWith(t, "127.0.0.1:0", master.Options{HeartbeatInterval: hb, NodeTTL: 6 * hb})
	o1, c1 := startOwnerClient(t, Options{Dir: t.TempDir(), DRAM: 4 << 20, MasterAddr: m.Addr().String(), NodeID: "n1", Logger: &log,
		InsecureCluster: true, LocalMaster: m.LocalClient()}, t.Name()+"-n1")
	_, c2 := startOwnerClient(t, Options{Dir: t.TempDir(), DRAM: 4 << 20, MasterAddr: m.Addr().String(), NodeID: "n2", Logger: &log,
		InsecureCluster: true, LocalMaster: m.LocalClient()}, t.Name()+"-n2")
	old, next := value(1, 4096), value(2, 4096)
	if err := c1.Put("k", old); err != nil {
		t.Fatal(err)
	}
	gen := o1.nodeGen()
	l := &lateRegisterLink{Client: m.LocalClient()}
	l.cut.Store(true) // the check heartbeat fails: a Register is sent
	useMasterClient(o1, l)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := o1.master.register(ctx); err == nil {
		t.Fatal("a registration through a failing link succeeded")
	}
	if g := o1.nodeGen(); g != gen {
		t.Fatalf("the owner names generation %d, want it back at %d", g, gen)
	}
	h, err := c1.Get("k") // k into the hot set, under the registration gone back to
	if err != nil || !bytes.Equal(h.Bytes(), old) {
		t.Fatalf("get: %v", err)
	}
	h.Release()
	if _, _, err := o1.master.heartbeat(ctx, false); err != nil { // a fresh lease
		t.Fatal(err)
	}
	l.cut.Store(true) // no heartbeat tells the owner of the tomb below
	l.mu.Lock()
	req := l.held
	l.mu.Unlock()
	if resp, err := m.LocalClient().Register(ctx, req); err != nil || resp.Code != 0 {
		t.Fatalf("the late Register: %v %v", resp, err)
	}
	t0 := time.Now()
	if err := c2.Put("k", next); err != nil {
		t.Fatal(err)
	}
	waited := time.Since(t0)
	if h, err := c1.Get("k"); err == nil {
		stale := bytes.Equal(h.Bytes(), old)
		h.Release()
		if stale {
			t.Fatalf("n1 answered the overwritten version of k from its hot set, the overwrite answered %v after the late Register", waited)
		}
	}
	t.Logf("the overwrite through n2 was answered %v after the late Register", waited.Round(time.Millisecond))
}

// notLeaderCheckLink answers every heartbeat NOT_LEADER (a leader whose gate is shut a
// moment) and counts the Registers sent through it.
type notLeaderCheckLink struct {
	masterservice.Client
	epoch     int64
	registers atomic.Int32
}

func (l *notLeaderCheckLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	return &mp.HeartbeatResponse{Code: common.ErrorCode_NOT_LEADER, Message: "gate shut (fault injected)", MasterEpoch: l.epoch}, nil
}

func (l *notLeaderCheckLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	l.registers.Add(1)
	return l.Client.Register(ctx, req, o...)
}

// TestHearsayCheckAnsweredNotLeaderRegistersNot: a re-registration asked for by hearsay
// whose check heartbeat is answered NOT_LEADER sends no Register: the leader serves on
// under the same term once its gate opens, and the Register would tomb the live
// registration, every replica of the owner lost (a review).
func TestHearsayCheckAnsweredNotLeaderRegistersNot(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, _ := ackOwner(t, m, nil)
	gen := o.nodeGen()
	l := &notLeaderCheckLink{Client: m.LocalClient(), epoch: m.Epoch()}
	useMasterClient(o, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := o.master.registerAgain(ctx, true)
	if g, replicas := memberGen(m, "n1"); g != gen || replicas != 1 || l.registers.Load() != 0 {
		t.Fatalf("registerAgain: %v; %d Registers sent; the master lists n1 at generation %d with %d replicas, want %d with its one", err, l.registers.Load(), g, replicas, gen)
	}
}
