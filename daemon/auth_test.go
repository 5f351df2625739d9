package daemon

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/endpoint"
	"github.com/cloudwego/kitex/server"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

func startAuthMaster(t testing.TB, s *auth.Secrets) *master.Server {
	t.Helper()
	nop := zerolog.Nop()
	m, err := master.NewServer(master.Options{Logger: &nop, Secrets: s})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop() })
	return m
}

func authOwnerOptions(t testing.TB, m *master.Server, s *auth.Secrets) Options {
	nop := zerolog.Nop()
	return Options{Dir: t.TempDir(), DRAM: 4 << 20, MasterAddr: m.Addr().String(), NodeID: "n1", Logger: &nop,
		Secrets: s, RegisterTimeout: 10 * time.Second}
}

// Every PeerService method, from every kind of unauthenticated caller, is refused
// before a handler runs, and the owner keeps serving authenticated callers.
func TestPeerRefusesUnauthenticated(t *testing.T) {
	s := authtest.Secrets(t)
	m := startAuthMaster(t, s)
	var calls atomic.Int64
	opts := authOwnerOptions(t, m, s)
	opts.testPeerServerOpts = []server.Option{server.WithMiddleware(func(next endpoint.Endpoint) endpoint.Endpoint {
		return func(ctx context.Context, req, resp any) error {
			calls.Add(1)
			return next(ctx, req, resp)
		}
	})}
	o, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer o.Stop()
	addr := o.peer.addr()
	n := calls.Load()
	authtest.CheckRefused(t, peerservice.NewServiceInfo(), addr, auth.PurposePeer, func() int64 { return calls.Load() - n })

	c, err := peerservice.NewClient("fluxkv-owner", append(auth.ClientOptions(s, auth.PurposePeer),
		client.WithHostPorts(addr), client.WithRPCTimeout(10*time.Second))...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.InvalidateCachedInfo(context.Background(), &peer.InvalidateCachedInfoRequest{}); err != nil {
		t.Fatalf("authenticated call after the refusals: %v", err)
	}
}

// An owner whose secret the master does not accept fails to start at once with a
// clear error; rotation (master [new, old], owner [old]) works.
func TestOwnerClusterSecrets(t *testing.T) {
	t.Parallel()
	key := func(c byte) []byte { return []byte(strings.Repeat(string(c), 40)) }
	secrets := func(keys ...[]byte) *auth.Secrets {
		s, err := auth.NewSecrets(keys...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	m := startAuthMaster(t, secrets(key('n'), key('o')))
	for _, tc := range []struct {
		name    string
		s       *auth.Secrets
		wantErr string
	}{
		{"old secret during rotation", secrets(key('o')), ""},
		{"new secret", secrets(key('n')), ""},
		{"unrelated secret", secrets(key('u')), "cluster authentication failed: wrong secret"},
		{"insecure owner", nil, "requires cluster authentication and this node runs with --insecure-cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := authOwnerOptions(t, m, tc.s)
			opts.InsecureCluster = tc.s == nil
			opts.NodeID = strings.ReplaceAll(tc.name, " ", "-")
			o, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			err = o.Start(context.Background())
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				o.Stop()
				return
			}
			if err == nil {
				o.Stop()
				t.Fatal("started")
			}
			if !errors.Is(err, auth.ErrAuthFailed) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want %q", err, tc.wantErr)
			}
			if d := time.Since(t0); d > 5*time.Second {
				t.Fatalf("failed after %v: an auth failure must not be retried until the register timeout", d)
			}
		})
	}
}
