package daemon

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
)

// TestAckQueueBounds: the holder-ack queue keeps at most maxPendingAcks ids (the
// oldest go), and a registration that succeeded drops the ids queued before it began,
// also when calls took some of them and gave them back meanwhile.
func TestAckQueueBounds(t *testing.T) {
	t.Parallel()
	a := &acker{kick: make(chan struct{}, 1), warn: zerolog.Nop()}
	for i := range maxPendingAcks + 10 {
		a.add(int64(i))
	}
	if len(a.pending) != maxPendingAcks || a.dropped != 10 || a.pending[0] != 10 {
		t.Fatalf("%d pending (first %d), %d dropped; want %d, the oldest 10 dropped", len(a.pending), a.pending[0], a.dropped, maxPendingAcks)
	}
	a.pending, a.dropped = nil, 0
	for i := range 100 {
		a.add(int64(i)) // released before the registration began
	}
	mark := a.mark()
	for i := range 5 {
		a.add(int64(1000 + i)) // released since: pins it reported
	}
	a.giveBack([]int64{7, 8, 9}) // a call took them before the mark, and failed after it
	a.dropBefore(mark)
	want := []int64{1000, 1001, 1002, 1003, 1004, 7, 8, 9}
	if !slices.Equal(a.pending, want) || a.dropped != 100 {
		t.Fatalf("after the registration: %v pending, %d dropped; want %v, the 100 queued before its mark dropped", a.pending, a.dropped, want)
	}
}

// TestMasterOutageAcks: while the master is out of reach a Stat answers (it flushed
// the holder acks until the master came back, holding its connection, and the owner's
// Stop waited for it for good; a review), and the owner registers with the next master
// and stops.
func TestMasterOutageAcks(t *testing.T) {
	t.Parallel()
	m1 := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m1, nil)
	addr := m1.Addr().String()
	m1.Stop()
	keys := make([]string, 500)
	for r := range 4 {
		for i := range keys {
			keys[i] = fmt.Sprintf("absent-%d-%d", r, i)
		}
		if _, errs, err := c.BatchGet(keys); err != nil || errs[0] == nil {
			t.Fatalf("a batch get with the master stopped: %v %v", err, errs)
		}
	}
	o.acks.mu.Lock()
	queued := len(o.acks.pending)
	o.acks.mu.Unlock()
	if queued < len(keys) {
		t.Fatalf("%d acks queued by failed gets: the test did not reach the outage's queue", queued)
	}
	c2, err := fluxkv.Connect(fluxkv.Options{Socket: o.SocketPath(), Name: t.Name() + "-stat", Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	statDone := make(chan error, 1)
	go func() {
		_, err := c2.StatWith(fluxkv.StatOptions{KeepHotSet: true})
		statDone <- err
	}()
	select {
	case err := <-statDone:
		t.Logf("stat with the master out of reach: %v", err)
	case <-time.After(8 * time.Second):
		t.Fatal("a Stat with the master out of reach did not answer in 8 s")
	}
	m2 := ackMaster(t, addr)
	useMasterClient(o, m2.LocalClient())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	o.acks.mu.Lock()
	left := len(o.acks.pending)
	o.acks.mu.Unlock()
	t.Logf("acks queued: %d during the outage, %d after the registration", queued, left)
	stopped := make(chan struct{})
	go func() { o.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(3*o.opts.ShutdownTimeout + 5*time.Second):
		t.Fatal("Stop did not return")
	}
}
