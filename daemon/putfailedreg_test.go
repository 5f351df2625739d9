package daemon

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// flakyLink fails the first failHeartbeats heartbeats in transport (all of them with
// cutHeartbeats), and every Register: without it reaching the master (lose false), after
// the master took it (lose: the answer is lost), or at once while it reaches the master
// late later (landed closes then).
type flakyLink struct {
	masterservice.Client
	failHeartbeats atomic.Int32
	cutHeartbeats  bool
	lose           bool
	late           time.Duration
	landed         chan struct{}
}

func (f *flakyLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if f.cutHeartbeats || f.failHeartbeats.Add(-1) >= 0 {
		return nil, errors.New("link cut (fault injected by the test)")
	}
	return f.Client.Heartbeat(ctx, req, o...)
}

func (f *flakyLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	if f.late > 0 {
		go func() {
			time.Sleep(f.late)
			f.Client.Register(context.Background(), req)
			close(f.landed)
		}()
		return nil, errors.New("deadline exceeded (fault injected by the test: the request is still in flight)")
	}
	if !f.lose {
		return nil, errors.New("link cut (fault injected by the test)")
	}
	if _, err := f.Client.Register(ctx, req, o...); err != nil {
		return nil, err
	}
	return nil, errReplyLost
}

// TestPutAcrossAFailedRegistration: a put whose PutDone the master published while a
// registration began whose Register failed in transport (it never reached the master,
// the master took it and the answer was lost, or the link was cut throughout) answers
// UNAVAILABLE, its outcome unknown: a Register still in flight may land after any
// answer, and one the master took dropped the version with the owner's replicas. The
// owner drops the key's older version, so a later master rebuilt from its report never
// serves it after the put (reviews: answered UNAVAILABLE with the older record kept,
// the next master served it; answered OK across a Register the master took, or took
// later, the version was gone).
func TestPutAcrossAFailedRegistration(t *testing.T) {
	for _, c := range []struct {
		name string
		link func(l *flakyLink)
	}{
		{"register-cut", func(l *flakyLink) { l.failHeartbeats.Store(1) }},
		{"register-taken-answer-lost", func(l *flakyLink) { l.failHeartbeats.Store(1); l.lose = true }},
		{"link-cut", func(l *flakyLink) { l.cutHeartbeats = true }},
		{"register-lands-late", func(l *flakyLink) {
			l.failHeartbeats.Store(1)
			l.late, l.landed = 300*time.Millisecond, make(chan struct{})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			putAcrossAFailedRegistration(t, c.link)
		})
	}
}

func putAcrossAFailedRegistration(t *testing.T, link func(*flakyLink)) {
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil) // k holds value(1, 4096)
	held := &heldPutDone{Client: m1.LocalClient(), entered: make(chan struct{}), release: make(chan struct{})}
	useMasterClient(o, held)
	done := make(chan error, 1)
	go func() { done <- c.Put("k", value(2, 4096)) }()
	<-held.entered // m1 published value 2
	l := &flakyLink{Client: m1.LocalClient()}
	link(l)
	useMasterClient(o, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err == nil {
		t.Fatal("a registration through a faulty link succeeded")
	}
	useMasterClient(o, m1.LocalClient())
	close(held.release)
	perr := <-done
	if l.landed != nil {
		<-l.landed
	}
	if wire.CodeOf(perr) != common.ErrorCode_UNAVAILABLE {
		t.Errorf("put answered %v; want UNAVAILABLE (outcome unknown)", perr)
	}
	st := o.lock()
	rec := st.replicas.lookup("k")
	o.unlock()
	if rec != nil && rec.putID <= 1 {
		t.Errorf("the owner still records k's older version (%+v) after the put", rec)
	}
	addr := m1.Addr().String()
	m1.Stop()
	m2 := ackMaster(t, addr)
	useMasterClient(o, m2.LocalClient())
	if err := o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("k")
	switch {
	case err == nil && bytes.Equal(h.Bytes(), value(1, 4096)):
		t.Error("the next master serves k's older value after the put")
	case err == nil && !bytes.Equal(h.Bytes(), value(2, 4096)):
		t.Errorf("the next master serves bytes of neither version (byte 0 %#x)", h.Bytes()[0])
	case perr == nil && err != nil:
		t.Errorf("the put answered OK, and the next master misses k: %v", err)
	}
	if err == nil {
		h.Release()
	}
	t.Logf("put: %v; get at the next master: %v", perr, err)
}
