package master

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/endpoint"
	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// startCounted starts a master on loopback whose Kitex server counts the calls that
// reach its middleware (every handler runs behind it).
func startCounted(t *testing.T, opts Options) (*Server, *atomic.Int64) {
	t.Helper()
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	srv.testServerOpts = []server.Option{server.WithMiddleware(func(next endpoint.Endpoint) endpoint.Endpoint {
		return func(ctx context.Context, req, resp any) error {
			calls.Add(1)
			return next(ctx, req, resp)
		}
	})}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	return srv, &calls
}

func masterClient(t *testing.T, addr string, s *auth.Secrets) masterservice.Client {
	t.Helper()
	c, err := masterservice.NewClient("fluxkv-master", append(auth.ClientOptions(s, auth.PurposeMaster),
		client.WithHostPorts(addr), client.WithRPCTimeout(10*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Every MasterService method, from every kind of unauthenticated caller, is refused
// before a handler runs; the master's state is unchanged and it keeps serving
// authenticated callers.
func TestMasterRefusesUnauthenticated(t *testing.T) {
	s := authtest.Secrets(t)
	srv, calls := startCounted(t, Options{Secrets: s})
	addr := srv.Addr().String()
	c := masterClient(t, addr, s)
	reg, err := c.Register(context.Background(), &mp.RegisterRequest{Node: &mp.NodeRef{NodeId: "n1", Generation: 1},
		SegmentSize: 1 << 20, PeerAddr: "127.0.0.1:1"})
	if err != nil || reg.Code != 0 {
		t.Fatalf("register: %v %v", err, reg)
	}
	before, err := c.Stat(context.Background(), &mp.StatRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n := calls.Load()

	authtest.CheckRefused(t, masterservice.NewServiceInfo(), addr, auth.PurposeMaster, func() int64 { return calls.Load() - n })

	after, err := c.Stat(context.Background(), &mp.StatRequest{})
	if err != nil {
		t.Fatalf("authenticated Stat after the refusals: %v", err)
	}
	if before.String() != after.String() {
		t.Fatalf("state changed:\nbefore %v\nafter  %v", before, after)
	}
}
