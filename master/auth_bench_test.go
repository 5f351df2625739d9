package master

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/server"
	"github.com/cloudwego/kitex/transport"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// The cost of cluster authentication on the master round trip: the served master
// (gonet transport, authenticated connections) against the same handler on Kitex's
// default netpoll transport without authentication (the master before issue 12),
// measured in one run. Stat is the smallest call; the client is the owner's
// (framed). Connect measures a fresh connection's dial (and handshake) plus one call.
//
//	go test ./master/ -run '^$' -bench 'MasterRoundTrip|MasterConnect' -count 5

func benchMasters(b *testing.B) (netpollAddr, gonetAddr string, s *auth.Secrets) {
	s = authtest.Secrets(b)
	srv, err := NewServer(Options{Secrets: s})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Stop() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	plain := masterservice.NewServer(&handler{s: srv}, server.WithListener(ln), server.WithServiceAddr(ln.Addr()))
	go plain.Run()
	time.Sleep(50 * time.Millisecond)
	b.Cleanup(func() { plain.Stop() })
	return ln.Addr().String(), srv.Addr().String(), s
}

func benchClient(b *testing.B, addr string, extra ...client.Option) masterservice.Client {
	c, err := masterservice.NewClient("fluxkv-master", append(extra, client.WithHostPorts(addr),
		client.WithRPCTimeout(5*time.Second), client.WithTransportProtocol(transport.Framed))...)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func stat(b *testing.B, c masterservice.Client) {
	if _, err := c.Stat(context.Background(), &mp.StatRequest{}); err != nil {
		b.Fatal(err)
	}
}

func BenchmarkMasterRoundTrip(b *testing.B) {
	np, gn, s := benchMasters(b)
	for _, tc := range []struct {
		name string
		c    masterservice.Client
	}{
		{"netpoll-noauth", benchClient(b, np)},
		{"gonet-auth", benchClient(b, gn, auth.ClientOptions(s, auth.PurposeMaster)...)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			stat(b, tc.c) // connect outside the timing
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				stat(b, tc.c)
			}
		})
	}
}

func BenchmarkMasterConnect(b *testing.B) {
	np, gn, s := benchMasters(b)
	for _, tc := range []struct {
		name string
		addr string
		opts []client.Option
	}{
		{"netpoll-noauth", np, nil},
		{"gonet-auth", gn, auth.ClientOptions(s, auth.PurposeMaster)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// A short pool: every call dials (and authenticates) a new connection.
			c := benchClient(b, tc.addr, append(tc.opts, client.WithShortConnection())...)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				stat(b, c)
			}
		})
	}
}
