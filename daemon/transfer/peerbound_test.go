package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatedSource holds every plain pull in Open until open is closed, counting the Opens
// in progress (staged pulls pass at once).
type gatedSource struct {
	*testSource
	open chan struct{}

	mu        sync.Mutex // protects cur, max
	cur, max  int
	entered   chan struct{} // one send per plain Open that began waiting
	closeOnce sync.Once
}

func newGatedSource(src *testSource) *gatedSource {
	return &gatedSource{testSource: src, open: make(chan struct{}), entered: make(chan struct{}, 64)}
}

func (s *gatedSource) Open(f Fence, off, n int64) ([]byte, func(), error) {
	if !f.Staged {
		s.mu.Lock()
		s.cur++
		s.max = max(s.max, s.cur)
		s.mu.Unlock()
		s.entered <- struct{}{}
		<-s.open
		s.mu.Lock()
		s.cur--
		s.mu.Unlock()
	}
	f.Staged = false
	return s.testSource.Open(f, off, n)
}

func (s *gatedSource) release() { s.closeOnce.Do(func() { close(s.open) }) }

func (s *gatedSource) counts() (cur, max int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.max
}

// gateState is addr's gate: the pulls holding or waiting for a slot, and the slots
// held.
func (c *Client) gateState(addr string) (users, held int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.gates[addr]
	if g == nil {
		return 0, 0
	}
	return g.users, len(g.slots)
}

// TestPullsPerPeer: with MaxPullsPerPeer 3, 12 concurrent pulls from one peer are 3 in
// flight and 9 waiting (counted at the source and at the client's gate, no timing);
// meanwhile another peer, a staged pull of the same peer, and a waiter whose context
// ends are not held up; then all 12 complete over 3 connections, never more than 3 in
// flight.
func TestPullsPerPeer(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	const bound, pulls = 3, 12
	src := newGatedSource(newTestSource(segment(t, 4*mib, true)))
	f := src.retain(1, 0, 4*mib)
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	t.Cleanup(src.release) // before the server's Close, which waits for Opens
	other := newTestSource(segment(t, mib, true))
	fo := other.retain(1, 0, mib)
	srvOther := startServer(t, other, ServerOptions{Secrets: sec})
	// Pulls wait at the source for as long as the test needs: no progress deadline.
	cl := newClient(t, ClientOptions{Secrets: sec, MaxPullsPerPeer: bound, ProgressTimeout: time.Minute})
	addr := srv.Addr().String()

	var wg sync.WaitGroup
	errs := make(chan error, pulls)
	for g := range pulls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			off := int64(g * 4096)
			dst := make([]byte, mib)
			if err := cl.Pull(context.Background(), addr, f, off, dst); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(dst, src.seg[off:off+mib]) {
				errs <- fmt.Errorf("pull %d: bytes differ", g)
			}
		}()
	}
	waitFor(t, "12 pulls at the gate, 3 of them at the source", func() bool {
		users, _ := cl.gateState(addr)
		cur, _ := src.counts()
		return users == pulls && cur == bound
	})
	users, held := cl.gateState(addr)
	if cur, mx := src.counts(); cur != bound || mx != bound || held != bound || users != pulls {
		t.Fatalf("%d pulls at the source (at most %d), %d slots held, %d at the gate; want %d, %d, %d, %d",
			cur, mx, held, users, bound, bound, bound, pulls)
	}
	if d := cl.dials.Load(); d != bound {
		t.Fatalf("%d connections dialled with %d pulls in flight", d, bound)
	}

	// Another peer is not behind this one's gate.
	if err := cl.Pull(context.Background(), srvOther.Addr().String(), fo, 0, make([]byte, mib)); err != nil {
		t.Fatalf("pull from another peer while the first is at its bound: %v", err)
	}
	// A staged pull is not counted (its source may be waiting on a disk).
	staged := f
	staged.Staged = true
	dst := make([]byte, 4096)
	if err := cl.Pull(context.Background(), addr, staged, 0, dst); err != nil || !bytes.Equal(dst, src.seg[:4096]) {
		t.Fatalf("staged pull while the peer is at its bound: %v", err)
	}
	// A waiter whose context ends gives up without a slot.
	ctx, cancel := context.WithCancel(context.Background())
	waiter := make(chan error, 1)
	go func() { waiter <- cl.Pull(ctx, addr, f, 0, make([]byte, 10)) }()
	waitFor(t, "a 13th pull at the gate", func() bool { users, _ := cl.gateState(addr); return users == pulls+1 })
	cancel()
	if err := <-waiter; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter whose context ended: %v, want context.Canceled", err)
	}
	if users, held := cl.gateState(addr); users != pulls || held != bound {
		t.Fatalf("after the canceled waiter: %d at the gate, %d slots held; want %d, %d", users, held, pulls, bound)
	}

	src.release()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if _, mx := src.counts(); mx != bound {
		t.Errorf("at most %d pulls were at the source at once, want %d", mx, bound)
	}
	if d := cl.dials.Load(); d != bound+2 { // + the other peer's and the staged pull's
		t.Errorf("%d connections dialled, want %d (the pool reused)", d, bound+2)
	}
	if users, _ := cl.gateState(addr); users != 0 || len(cl.gates) != 0 {
		t.Errorf("gates left after every pull ended: %d users, %d gates", users, len(cl.gates))
	}
}

// TestPullsPerPeerClose: a pull waiting at the gate fails when the client closes.
func TestPullsPerPeerClose(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newGatedSource(newTestSource(segment(t, mib, true)))
	f := src.retain(1, 0, mib)
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	t.Cleanup(src.release)
	cl := NewClient(ClientOptions{Secrets: sec, MaxPullsPerPeer: 1, ProgressTimeout: time.Minute})
	addr := srv.Addr().String()
	first := make(chan error, 1)
	go func() { first <- cl.Pull(context.Background(), addr, f, 0, make([]byte, 10)) }()
	<-src.entered
	second := make(chan error, 1)
	go func() { second <- cl.Pull(context.Background(), addr, f, 0, make([]byte, 10)) }()
	waitFor(t, "a second pull at the gate", func() bool { users, _ := cl.gateState(addr); return users == 2 })
	cl.Close()
	for name, ch := range map[string]chan error{"in flight": first, "waiting": second} {
		if err := <-ch; !errors.Is(err, ErrUnreachable) {
			t.Errorf("%s at Close: %v, want ErrUnreachable", name, err)
		}
	}
	if err := cl.Pull(context.Background(), addr, f, 0, make([]byte, 10)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// oneSlotPeer is a gated source served at addr (held pulls wait in Open until released:
// the test ends it) and a client that pulls at most one value at a time from it.
func oneSlotPeer(t *testing.T) (*gatedSource, Fence, *Client, string) {
	t.Helper()
	checkLeaks(t)
	sec := secrets(t)
	src := newGatedSource(newTestSource(segment(t, mib, true)))
	f := src.retain(1, 0, mib)
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	t.Cleanup(src.release)
	return src, f, newClient(t, ClientOptions{Secrets: sec, MaxPullsPerPeer: 1, ProgressTimeout: time.Minute}), srv.Addr().String()
}

// TestPullsPerPeerDown: a pull that waited while another pull from the same peer failed
// as unreachable fails at once without reaching the peer; a pull that starts afterwards
// tries the peer again.
func TestPullsPerPeerDown(t *testing.T) {
	src, f, cl, addr := oneSlotPeer(t)
	first := make(chan error, 1)
	go func() { first <- cl.Pull(context.Background(), addr, f, 0, make([]byte, 10)) }()
	<-src.entered
	second := make(chan error, 1)
	go func() { second <- cl.Pull(context.Background(), addr, f, 0, make([]byte, 10)) }()
	waitFor(t, "a second pull at the gate", func() bool { users, _ := cl.gateState(addr); return users == 2 })
	// Break the first pull's connection (as a dead peer's would).
	cl.mu.Lock()
	for tc := range cl.active {
		tc.Close()
	}
	cl.mu.Unlock()
	if err := <-first; !errors.Is(err, ErrUnreachable) {
		t.Fatalf("pull over a broken connection: %v", err)
	}
	err := <-second
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "not tried") {
		t.Fatalf("pull that waited meanwhile: %v, want ErrUnreachable without trying", err)
	}
	t.Logf("waiter: %v", err)
	if cur, mx := src.counts(); cur != 1 || mx != 1 {
		t.Fatalf("%d pulls at the source (at most %d), want 1: the waiter reached it", cur, mx)
	}
	src.release()
	dst := make([]byte, 10)
	if err := cl.Pull(context.Background(), addr, f, 0, dst); err != nil || !bytes.Equal(dst, src.seg[:10]) {
		t.Fatalf("pull after the failure: %v", err)
	}
}

// TestBudgetCountsFromTheSlot: a pull's budget (WithBudget) counts from when it holds
// one of its peer's slots, not from before its wait for one (the slots are shared with
// the owner's other pulls from that peer: a small get queued behind large pulls failed
// at its budget having moved no byte, a review); a pull whose transfer outlasts its
// budget fails, for all its context's time left, and leaves its slot.
func TestBudgetCountsFromTheSlot(t *testing.T) {
	src, f, cl, addr := oneSlotPeer(t)
	const budget = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A pull whose transfer waits at the source past its budget fails, and leaves its slot.
	if err := cl.Pull(WithBudget(ctx, budget), addr, f, 0, make([]byte, 4096)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a pull held at the source past its budget: %v; want its deadline", err)
	}
	<-src.entered
	waitFor(t, "the slot given back", func() bool { users, _ := cl.gateState(addr); return users == 0 })
	// The slot's holder (no budget) waits at the source; the next pull waits for the slot
	// longer than its budget, then moves its bytes.
	held := make(chan error, 1)
	go func() { held <- cl.Pull(ctx, addr, f, 0, make([]byte, 4096)) }()
	<-src.entered
	next := make(chan error, 1)
	go func() { next <- cl.Pull(WithBudget(ctx, budget), addr, f, 4096, make([]byte, 4096)) }()
	waitFor(t, "the second pull waiting for the slot", func() bool { users, _ := cl.gateState(addr); return users == 2 })
	time.Sleep(2 * budget) // the waiter has now waited past a budget counted from its call
	src.release()
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if err := <-next; err != nil {
		t.Fatalf("a pull that waited for the slot past its budget: %v; want it served (the budget counts from the slot)", err)
	}
}
