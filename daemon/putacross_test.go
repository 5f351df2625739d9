package daemon

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// heldPutDone lets the next PutDone reach the master (which publishes) and holds its
// answer until release: an answer in transit across a re-registration.
type heldPutDone struct {
	masterservice.Client
	entered, release chan struct{}
}

func (h *heldPutDone) PutDone(ctx context.Context, req *mp.PutDoneRequest, o ...callopt.Option) (*mp.PutDoneResponse, error) {
	resp, err := h.Client.PutDone(ctx, req, o...)
	close(h.entered)
	<-h.release
	return resp, err
}

// TestPutAnsweredAcrossARegistration: a put whose PutDone answer (OK, from the old
// master) comes back after the owner registered with a new one and reported its index
// is not answered OK: the new master rebuilt its routes without that version (a new key
// is missing there, an overwritten one has its old value), and the owner learns no
// record of it (a review: the client was told stored, the new master served the old
// bytes or none).
func TestPutAnsweredAcrossARegistration(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"k2", "k"} {
		t.Run(key, func(t *testing.T) { putAnsweredAcrossARegistration(t, key) })
	}
}

func putAnsweredAcrossARegistration(t *testing.T, key string) {
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil) // k holds value(1, 4096)
	held := &heldPutDone{Client: m1.LocalClient(), entered: make(chan struct{}), release: make(chan struct{})}
	useMasterClient(o, held)
	done := make(chan error, 1)
	go func() { done <- c.Put(key, value(2, 4096)) }()
	<-held.entered
	addr := m1.Addr().String()
	m1.Stop()
	m2 := ackMaster(t, addr)
	useMasterClient(o, m2.LocalClient())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	close(held.release)
	perr := <-done
	if wire.CodeOf(perr) != common.ErrorCode_UNAVAILABLE {
		t.Errorf("put answered across the registration: %v, want UNAVAILABLE (outcome unknown)", perr)
	}
	st := o.lock()
	rec := st.replicas.lookup(key)
	o.unlock()
	if rec != nil && rec.putID > 1 && key == "k2" {
		t.Errorf("the owner's index records %+v, which the new master does not know", rec)
	}
	h, gerr := c.Get(key)
	if gerr == nil {
		if !bytes.Equal(h.Bytes(), value(1, 4096)) {
			t.Errorf("the new master serves bytes of neither the old value nor a miss (byte 0 %#x)", h.Bytes()[0])
		}
		h.Release()
	}
	t.Logf("put: %v; get at the new master: %v", perr, gerr)
}
