package auth_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/client/callopt"
	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

// slowStub answers InvalidateCachedInfo after the delay its request names in
// Generation (milliseconds), or when the test ends.
type slowStub struct {
	peerStub
	done chan struct{}
}

func (s *slowStub) InvalidateCachedInfo(_ context.Context, req *peer.InvalidateCachedInfoRequest) (*peer.InvalidateCachedInfoResponse, error) {
	select {
	case <-time.After(time.Duration(req.Generation) * time.Millisecond):
	case <-s.done:
	}
	return &peer.InvalidateCachedInfoResponse{Code: common.ErrorCode_OK}, nil
}

// boundClient starts an authenticating peer server of slowStub and returns a client of
// it without an RPC timeout, over d = a BoundCalls(bound) dialer.
func boundClient(t *testing.T, bound time.Duration) (peerservice.Client, *auth.Dialer) {
	t.Helper()
	s := authtest.Secrets(t)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stub := &slowStub{done: make(chan struct{})}
	ln := auth.Listener(raw, s, auth.PurposePeer, auth.ListenerOptions{})
	svr := peerservice.NewServer(stub, append(auth.ServerOptions(ln), server.WithExitWaitTime(100*time.Millisecond))...)
	go svr.Run()
	t.Cleanup(func() {
		close(stub.done)
		svr.Stop()
	})
	d := auth.NewDialer(s, auth.PurposePeer).BoundCalls(bound)
	c, err := peerservice.NewClient("peer", append(auth.DialerOptions(d), client.WithHostPorts(raw.Addr().String()))...)
	if err != nil {
		t.Fatal(err)
	}
	return c, d
}

// slowCall makes one call the server answers after delay, with ctx and opts.
func slowCall(ctx context.Context, c peerservice.Client, delay time.Duration, opts ...callopt.Option) error {
	resp, err := c.InvalidateCachedInfo(ctx, &peer.InvalidateCachedInfoRequest{Generation: delay.Milliseconds()}, opts...)
	if err == nil && resp.Code != common.ErrorCode_OK {
		return &net.OpError{Op: resp.Code.String()}
	}
	return err
}

// A call with no timeout of Kitex's on a bound connection fails once its reply is
// later than the bound, and one whose reply comes within it is answered.
func TestBoundCallsReplyLate(t *testing.T) {
	const bound = 300 * time.Millisecond
	c, _ := boundClient(t, bound)
	if err := slowCall(context.Background(), c, 0); err != nil {
		t.Fatalf("prompt call: %v", err)
	}
	start := time.Now()
	err := slowCall(context.Background(), c, time.Minute)
	took := time.Since(start)
	if err == nil {
		t.Fatal("a call answered after a minute succeeded against a bound of 300ms")
	}
	// At least the bound; well under the minute (a busy machine's slack).
	if took < bound || took > 20*time.Second {
		t.Fatalf("the late call failed after %v (%v), want about %v", took, err, bound)
	}
	// The connection it failed on is gone; the next call gets a fresh one.
	if err := slowCall(context.Background(), c, 0); err != nil {
		t.Fatalf("call after the late one: %v", err)
	}
}

// A call with an RPC timeout of its own waits that long for its reply, past the bound.
func TestBoundCallsRPCTimeoutLonger(t *testing.T) {
	c, _ := boundClient(t, 100*time.Millisecond)
	if err := slowCall(context.Background(), c, 600*time.Millisecond, callopt.WithRPCTimeout(time.Minute)); err != nil {
		t.Fatalf("call with a 1m RPC timeout answered after 600ms: %v", err)
	}
	if err := slowCall(context.Background(), c, 600*time.Millisecond); err == nil {
		t.Fatal("the same call without its RPC timeout succeeded against a bound of 100ms")
	}
}

// Cut ends a call waiting on the dialer's connections at once, and the client's later
// calls fail at once with ErrCut.
func TestBoundCallsCut(t *testing.T) {
	c, d := boundClient(t, time.Minute)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = slowCall(context.Background(), c, time.Minute) })
	}
	time.Sleep(200 * time.Millisecond) // the calls are out (a later one fails all the same)
	start := time.Now()
	d.Cut()
	wg.Wait()
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("calls ended %v after the cut, want at once", took)
	}
	for i, err := range errs {
		if err == nil {
			t.Fatalf("call %d succeeded across the cut", i)
		}
	}
	start = time.Now()
	err := slowCall(context.Background(), c, 0)
	if err == nil || !strings.Contains(err.Error(), auth.ErrCut.Error()) {
		t.Fatalf("call after the cut: %v, want %v", err, auth.ErrCut)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("the call after the cut failed after %v, want at once", took)
	}
}

// A write the server does not read is bounded too: a request larger than the socket
// buffers, to a server that accepts and never reads, fails within the bound.
func TestBoundCallsWriteStalled(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	authtest.Silent(t, raw)
	const bound = 300 * time.Millisecond
	d := auth.NewDialer(nil, auth.PurposePeer).BoundCalls(bound)
	c, err := peerservice.NewClient("peer", append(auth.DialerOptions(d), client.WithHostPorts(raw.Addr().String()))...)
	if err != nil {
		t.Fatal(err)
	}
	// 64 MiB of keys: far more than loopback's socket buffers hold.
	entries := make([]*common.KeyVersion, 64)
	for i := range entries {
		entries[i] = &common.KeyVersion{Key: strings.Repeat("k", 1<<20)}
	}
	start := time.Now()
	_, err = c.InvalidateCachedInfo(context.Background(), &peer.InvalidateCachedInfoRequest{Entries: entries})
	took := time.Since(start)
	if err == nil {
		t.Fatal("a 64 MiB call to a server that never reads succeeded")
	}
	if took < bound || took > 20*time.Second {
		t.Fatalf("the stalled write failed after %v (%v), want about %v", took, err, bound)
	}
}
