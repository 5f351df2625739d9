package daemon

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// cutLink fails heartbeats and registrations in transport, as a link cut for a moment.
type cutLink struct{ masterservice.Client }

func (cutLink) Heartbeat(context.Context, *mp.HeartbeatRequest, ...callopt.Option) (*mp.HeartbeatResponse, error) {
	return nil, errors.New("link cut")
}

func (cutLink) Register(context.Context, *mp.RegisterRequest, ...callopt.Option) (*mp.RegisterResponse, error) {
	return nil, errors.New("link cut")
}

// TestPutAcrossAFailedRegistration: a registration begun while a put's PutDone was out
// that failed (the Register never reached a master) leaves the master that published
// the put in charge: the put is answered OK and the owner records its version, so the
// next master, rebuilt from the owner's report, serves it (a review: the put was
// answered UNAVAILABLE and the owner kept the older version's record, which a later
// master served).
func TestPutAcrossAFailedRegistration(t *testing.T) {
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil) // k holds value(1, 4096)
	held := &heldPutDone{Client: m1.LocalClient(), entered: make(chan struct{}), release: make(chan struct{})}
	useMasterClient(o, held)
	done := make(chan error, 1)
	go func() { done <- c.Put("k", value(2, 4096)) }()
	<-held.entered // m1 published value 2
	useMasterClient(o, cutLink{m1.LocalClient()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err == nil {
		t.Fatal("a registration through a cut link succeeded")
	}
	useMasterClient(o, m1.LocalClient())
	close(held.release)
	if err := <-done; err != nil {
		t.Errorf("put answered %v after a registration that failed: m1 published it and is still in charge", err)
	}
	st := o.lock()
	rec := st.replicas.lookup("k")
	o.unlock()
	if rec == nil || rec.putID <= 1 {
		t.Errorf("the owner's record of k after the put: %+v, want the put's version", rec)
	}
	addr := m1.Addr().String()
	m1.Stop()
	m2 := ackMaster(t, addr)
	useMasterClient(o, m2.LocalClient())
	if err := o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("k")
	if err != nil {
		t.Fatalf("get after the failover: %v", err)
	}
	defer h.Release()
	if !bytes.Equal(h.Bytes(), value(2, 4096)) {
		t.Errorf("the next master serves k's older value (byte 0 %#x), not the put's", h.Bytes()[0])
	}
}
