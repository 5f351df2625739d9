package auth_test

import (
	"context"
	"net"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

// heldStub answers InvalidateCachedInfo after release is closed, saying so on entered.
type heldStub struct {
	peerStub
	entered, release chan struct{}
}

func (h *heldStub) InvalidateCachedInfo(context.Context, *peer.InvalidateCachedInfoRequest) (*peer.InvalidateCachedInfoResponse, error) {
	h.entered <- struct{}{}
	<-h.release
	return &peer.InvalidateCachedInfoResponse{Code: common.ErrorCode_OK}, nil
}

// serveStarted serves h with ServerOptionsStarted (and extra) on a loopback port and
// waits until it says it serves; the server stops at the test's end. ran gets Run's
// answer.
func serveStarted(t *testing.T, h peer.PeerService, extra ...server.Option) (svr server.Server, addr string, s *auth.Secrets, ran <-chan error) {
	t.Helper()
	s = authtest.Secrets(t)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	opts, started := auth.ServerOptionsStarted(auth.Listener(raw, s, auth.PurposePeer, auth.ListenerOptions{}))
	svr = peerservice.NewServer(h, append(opts, extra...)...)
	done := make(chan error, 1)
	go func() { done <- svr.Run() }()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not say it serves")
	}
	t.Cleanup(func() { svr.Stop() })
	return svr, raw.Addr().String(), s, done
}

// A server built with ServerOptionsStarted says when it serves; its Stop waits for a
// call in flight, which gets its reply, but not for an idle pooled connection.
func TestKitexStopWaitsForCallsInFlight(t *testing.T) {
	stub := &heldStub{entered: make(chan struct{}, 2), release: make(chan struct{})}
	svr, addr, s, _ := serveStarted(t, stub, server.WithExitWaitTime(30*time.Second))

	idle := dial(t, addr, s, auth.PurposePeer)
	go invalidate(idle)
	<-stub.entered
	stub.release <- struct{}{} // the first call ends; its connection stays pooled, idle
	busy := dial(t, addr, s, auth.PurposePeer)
	answered := make(chan error, 1)
	go func() { answered <- invalidate(busy) }()
	<-stub.entered

	stopped := make(chan error, 1)
	go func() { stopped <- svr.Stop() }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while a call was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	close(stub.release)
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the call in flight during Stop: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call in flight got no answer")
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return after the call in flight ended (an idle pooled connection kept it?)")
	}
}

// A server of ServerOptions keeps serving through a signal to the process: the process
// decides when to stop it. Kitex's default stopped it on SIGHUP, SIGINT and SIGTERM by
// itself, leaving the process up with its port closed.
func TestKitexServerIgnoresSignals(t *testing.T) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGHUP) // this test process's own: it must not die of it
	defer signal.Stop(sigs)
	_, addr, s, ran := serveStarted(t, &peerStub{})
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	<-sigs
	select {
	case err := <-ran:
		t.Fatalf("the server stopped on SIGHUP (Run: %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := invalidate(dial(t, addr, s, auth.PurposePeer)); err != nil {
		t.Fatalf("a call after SIGHUP: %v", err)
	}
}

// A server stopped as soon as it says it serves stops cleanly, Run answering nil (it
// panicked when the Stop came before Run checked the transport's first result).
func TestKitexStopAtOnce(t *testing.T) {
	for range 20 {
		svr, _, _, ran := serveStarted(t, &peerStub{})
		if err := svr.Stop(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-ran:
			if err != nil {
				t.Fatalf("Run after a Stop at once: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after Stop")
		}
	}
}
