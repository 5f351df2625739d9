package auth_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/endpoint"
	"github.com/cloudwego/kitex/server"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

// peerStub answers every PeerService call with OK.
type peerStub struct{ _ int }

func (*peerStub) BatchSsdReplicaPersist(context.Context, *peer.BatchSsdReplicaPersistRequest) (*peer.BatchSsdReplicaPersistResponse, error) {
	return &peer.BatchSsdReplicaPersistResponse{Code: common.ErrorCode_OK}, nil
}
func (*peerStub) SsdStageRead(context.Context, *peer.SsdStageReadRequest) (*peer.SsdStageReadResponse, error) {
	return &peer.SsdStageReadResponse{Code: common.ErrorCode_OK}, nil
}
func (*peerStub) BatchSsdStageRead(context.Context, *peer.BatchSsdStageReadRequest) (*peer.BatchSsdStageReadResponse, error) {
	return &peer.BatchSsdStageReadResponse{Code: common.ErrorCode_OK}, nil
}
func (*peerStub) InvalidateCachedInfo(context.Context, *peer.InvalidateCachedInfoRequest) (*peer.InvalidateCachedInfoResponse, error) {
	return &peer.InvalidateCachedInfoResponse{Code: common.ErrorCode_OK}, nil
}
func (*peerStub) ReleaseHotSet(context.Context, *peer.ReleaseHotSetRequest) (*peer.ReleaseHotSetResponse, error) {
	return &peer.ReleaseHotSetResponse{}, nil
}
func (*peerStub) PullPut(context.Context, *peer.PullPutRequest) (*peer.PullPutResponse, error) {
	return &peer.PullPutResponse{Code: common.ErrorCode_OK}, nil
}
func (*peerStub) BatchPullPut(context.Context, *peer.BatchPullPutRequest) (*peer.BatchPullPutResponse, error) {
	return &peer.BatchPullPutResponse{Code: common.ErrorCode_OK}, nil
}

type testServer struct {
	addr  string
	calls atomic.Int64
	m     *metrics.Metrics
	svr   server.Server
}

// serve runs PeerService behind auth.Listener with s (nil: insecure), counting the
// calls that reach its middleware.
func serve(t *testing.T, s *auth.Secrets) *testServer {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{addr: raw.Addr().String(), m: metrics.New()}
	log := zerolog.Nop()
	ln := auth.Listener(raw, s, auth.PurposePeer, auth.ListenerOptions{Metrics: ts.m, Logger: &log, Timeout: time.Second})
	count := func(next endpoint.Endpoint) endpoint.Endpoint {
		return func(ctx context.Context, req, resp any) error {
			ts.calls.Add(1)
			return next(ctx, req, resp)
		}
	}
	ts.svr = peerservice.NewServer(&peerStub{}, append(auth.ServerOptions(ln),
		server.WithMiddleware(count), server.WithExitWaitTime(time.Second))...)
	go ts.svr.Run()
	time.Sleep(20 * time.Millisecond)
	t.Cleanup(func() { ts.svr.Stop() })
	return ts
}

func dial(t *testing.T, addr string, s *auth.Secrets, purpose string) peerservice.Client {
	t.Helper()
	// The RPC timeout outlasts the 5s handshake deadline, so its error is the one seen.
	c, err := peerservice.NewClient("peer", append(auth.ClientOptions(s, purpose),
		client.WithHostPorts(addr), client.WithRPCTimeout(10*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func invalidate(c peerservice.Client) error {
	_, err := c.InvalidateCachedInfo(context.Background(), &peer.InvalidateCachedInfoRequest{})
	return err
}

func TestKitexAuthenticated(t *testing.T) {
	s := authtest.Secrets(t)
	ts := serve(t, s)
	c := dial(t, ts.addr, s, auth.PurposePeer)
	for i := 0; i < 3; i++ {
		if err := invalidate(c); err != nil {
			t.Fatal(err)
		}
	}
	if n := ts.calls.Load(); n != 3 {
		t.Fatalf("%d calls reached the server, want 3", n)
	}
}

// Every method, three kinds of unauthenticated caller: no handler runs, and the
// server keeps serving authenticated callers.
func TestKitexUnauthenticatedRefused(t *testing.T) {
	s := authtest.Secrets(t)
	ts := serve(t, s)
	authtest.CheckRefused(t, peerservice.NewServiceInfo(), ts.addr, auth.PurposePeer, ts.calls.Load)
	if err := invalidate(dial(t, ts.addr, s, auth.PurposePeer)); err != nil {
		t.Fatalf("authenticated call after the refusals: %v", err)
	}
}

func TestKitexWrongSecret(t *testing.T) {
	ts := serve(t, authtest.Secrets(t))
	err := invalidate(dial(t, ts.addr, authtest.Secrets(t), auth.PurposePeer))
	if !errors.Is(err, auth.ErrAuthFailed) || !strings.Contains(err.Error(), "wrong secret") {
		t.Fatalf("got %v", err)
	}
	if ts.calls.Load() != 0 {
		t.Fatal("a handler ran")
	}
}

func TestKitexWrongPurpose(t *testing.T) {
	s := authtest.Secrets(t)
	ts := serve(t, s)
	err := invalidate(dial(t, ts.addr, s, auth.PurposeMaster))
	if !errors.Is(err, auth.ErrAuthFailed) || !strings.Contains(err.Error(), `"peer" port, not "master"`) {
		t.Fatalf("got %v", err)
	}
}

// Both sides insecure: calls work. A secure client against an insecure server fails
// within its handshake deadline with a message that names the likely cause.
func TestKitexInsecure(t *testing.T) {
	ts := serve(t, nil)
	if err := invalidate(dial(t, ts.addr, nil, auth.PurposePeer)); err != nil {
		t.Fatal(err)
	}
	if testing.Short() {
		return
	}
	err := invalidate(dial(t, ts.addr, authtest.Secrets(t), auth.PurposePeer))
	if !errors.Is(err, auth.ErrAuthFailed) || !strings.Contains(err.Error(), "--insecure-cluster") {
		t.Fatalf("got %v", err)
	}
}

// A connection that never speaks is closed by the handshake deadline and counted.
func TestKitexSilentClientTimesOut(t *testing.T) {
	ts := serve(t, authtest.Secrets(t))
	conn, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	n, _ := conn.Read(buf) // the hello
	if n == 0 {
		t.Fatal("no hello")
	}
	t0 := time.Now()
	if _, err := conn.Read(buf); err == nil {
		t.Fatal("connection not closed")
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("closed after %v, want about 1s", d)
	}
}

// Stop ends idle authenticated connections instead of waiting for them (gonet would
// otherwise keep serving them after Stop).
func TestKitexStopDrains(t *testing.T) {
	s := authtest.Secrets(t)
	ts := serve(t, s)
	c := dial(t, ts.addr, s, auth.PurposePeer)
	if err := invalidate(c); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := ts.svr.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if d := time.Since(t0); d > 500*time.Millisecond {
		t.Fatalf("stop took %v with an idle connection", d)
	}
	if err := invalidate(c); err == nil {
		t.Fatal("a stopped server answered")
	}
}
