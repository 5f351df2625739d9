package daemon

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// flakyLink fails the first failHeartbeats heartbeats in transport (all of them with
// cutHeartbeats), and every Register: without it reaching the master (lose false), or
// after the master took it (lose: the answer is lost).
type flakyLink struct {
	masterservice.Client
	failHeartbeats atomic.Int32
	cutHeartbeats  bool
	lose           bool
}

func (f *flakyLink) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, o ...callopt.Option) (*mp.HeartbeatResponse, error) {
	if f.cutHeartbeats || f.failHeartbeats.Add(-1) >= 0 {
		return nil, errors.New("link cut (fault injected by the test)")
	}
	return f.Client.Heartbeat(ctx, req, o...)
}

func (f *flakyLink) Register(ctx context.Context, req *mp.RegisterRequest, o ...callopt.Option) (*mp.RegisterResponse, error) {
	if !f.lose {
		return nil, errors.New("link cut (fault injected by the test)")
	}
	if _, err := f.Client.Register(ctx, req, o...); err != nil {
		return nil, err
	}
	return nil, errReplyLost
}

// TestPutAcrossAFailedRegistration: a put whose PutDone the master published while a
// registration began that failed is answered by what the owner learns before the
// registration ends (one heartbeat: the master's registration_seq). A Register that
// never reached the master leaves the publishing master in charge: OK, and the owner
// records the version, so a later master rebuilt from its report serves it. One the
// master took (its answer lost) dropped the version with the owner's replicas, and
// one nobody answered for leaves the outcome unknown: UNAVAILABLE, and the owner drops
// its record of the key's older version. Never does a later master serve the older
// version after the put (a review: answered UNAVAILABLE with the older record kept,
// the next master served it; answered OK after a Register the master took, the version
// was gone).
func TestPutAcrossAFailedRegistration(t *testing.T) {
	for _, c := range []struct {
		name   string
		link   func(l *flakyLink)
		wantOK bool
	}{
		{"register-cut", func(l *flakyLink) { l.failHeartbeats.Store(1) }, true},
		{"register-taken-answer-lost", func(l *flakyLink) { l.failHeartbeats.Store(1); l.lose = true }, false},
		{"link-cut", func(l *flakyLink) { l.cutHeartbeats = true }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			putAcrossAFailedRegistration(t, c.link, c.wantOK)
		})
	}
}

func putAcrossAFailedRegistration(t *testing.T, link func(*flakyLink), wantOK bool) {
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
	if wantOK != (perr == nil) {
		t.Errorf("put answered %v; want OK %v", perr, wantOK)
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
