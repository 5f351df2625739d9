package daemon

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/master"
)

// stalledPulls is a puller whose pulls hang (a live peer that sends nothing) until their
// context ends or the puller is closed.
type stalledPulls struct {
	pullClient
	started   chan struct{}
	closed    chan struct{}
	startOnce sync.Once
	closeOnce sync.Once
}

func (p *stalledPulls) Pull(ctx context.Context, _ string, _ transfer.Fence, _ int64, _ []byte) error {
	p.startOnce.Do(func() { close(p.started) })
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closed:
		return errors.New("the puller is closed")
	}
}

func (p *stalledPulls) Close() error {
	p.closeOnce.Do(func() { close(p.closed) })
	return p.pullClient.Close()
}

// TestStopCutsAStalledPull: Stop is bounded by ShutdownTimeout while a get pulls from a
// peer that sends nothing: the pull ends when the puller closes past the bound (a review:
// Stop joined the get before its bound began, and waited for the pull's whole transfer
// timeout).
func TestStopCutsAStalledPull(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true, Placement: master.PlacementLocal})
	want := value(1, 64<<10)
	if err := n.c.Put("k", want); err != nil {
		t.Fatal(err)
	}
	p := &stalledPulls{started: make(chan struct{}), closed: make(chan struct{})}
	o2, c2 := n.addOwner(t, "n2", 16<<20, nil, func(o *Options) {
		o.ShutdownTimeout = 300 * time.Millisecond
		o.TransferTimeout = time.Minute
		o.CacheGrace = -1
		o.testPuller = func(inner pullClient) pullClient { p.pullClient = inner; return p }
	})
	got := make(chan error, 1)
	go func() {
		h, err := c2.Get("k")
		if err == nil {
			if !bytes.Equal(h.Bytes(), want) {
				err = errors.New("wrong bytes")
			}
			h.Release()
		}
		got <- err
	}()
	select {
	case <-p.started:
	case <-time.After(30 * time.Second):
		t.Fatal("n2's get did not pull")
	}
	start := time.Now()
	o2.Stop()
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("Stop took %v with a get pulling from a stalled peer (ShutdownTimeout 300 ms)", took)
	}
	if err := <-got; err == nil {
		t.Error("a get whose pull was cut short by Stop answered a value")
	}
}
