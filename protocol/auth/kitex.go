package auth

import (
	"net"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/remote/trans/gonet"
	"github.com/cloudwego/kitex/server"
	"github.com/cloudwego/kitex/transport"
)

// ServerOptions serve ln (from Listener) with Kitex's gonet transport, which reads
// through the listener's connections; netpoll would take their raw fds and skip the
// handshake. Handlers find the role their connection proved with ConnRole. A server's
// Stop returns once its connections are gone (served); signals do not stop it.
func ServerOptions(ln net.Listener) []server.Option {
	opts, _ := ServerOptionsStarted(ln)
	return opts
}

// ServerOptionsStarted is ServerOptions and a channel closed once the server built
// with them serves ln: its Run got past every check that fails at once, so a caller
// that waits for this or for Run's error knows whether it started.
func ServerOptionsStarted(ln net.Listener) ([]server.Option, <-chan struct{}) {
	f := served{TransServerFactory: gonet.NewTransServerFactory(), started: newStartSignal()}
	return []server.Option{
		server.WithTransServerFactory(f),
		server.WithTransHandlerFactory(gonet.NewSvrTransHandlerFactory()),
		server.WithBoundHandler(roleHandler{}),
		server.WithListener(ln),
		server.WithServiceAddr(ln.Addr()),
		// Kitex's default stops the server on SIGINT, SIGTERM and SIGHUP by itself: a
		// hangup closed the master's and the peer service's ports while the process
		// stayed up and ready, and a SIGTERM stopped them before the owner drained.
		// The process's own signal handling stops its servers, in order.
		// Run asks for it once past its start (startSignal).
		server.WithExitSignal(func() <-chan error {
			f.started.running()
			return nil // never fires
		}),
	}, f.started.s.c
}

// ClientOptions make a Kitex client authenticate with s for purpose (nil s: insecure)
// and speak framed binary thrift, the only transport cluster servers accept (their
// frames are checked before decoding: wire.GuardListener).
func ClientOptions(s *Secrets, purpose string) []client.Option {
	return DialerOptions(NewDialer(s, purpose))
}

// DialerOptions are ClientOptions with the connections of d (NewDialer, BoundCalls).
func DialerOptions(d *Dialer) []client.Option {
	return []client.Option{
		client.WithTransportProtocol(transport.Framed),
		client.WithTransHandlerFactory(gonet.NewCliTransHandlerFactory()),
		client.WithDialer(d),
	}
}
