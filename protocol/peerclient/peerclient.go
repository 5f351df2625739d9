// Package peerclient keeps Kitex clients of owners' PeerService, one per address,
// for the master and for owners calling each other: every connection authenticates
// with the cluster secrets, and a call to a dead owner fails within about one connect
// timeout.
package peerclient

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/client/callopt"
	"github.com/cloudwego/kitex/pkg/remote"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

// Clients caches one PeerService client per owner address; their connections
// authenticate with the cluster secrets. Connecting is bounded by connectTimeout (with
// authentication the owner's hello must come within max(connectTimeout, 500ms)), and a
// failed dial is not repeated within the same call (fastFailDialer), so a call to a
// dead owner fails within about one connect timeout whatever the call's own timeout.
type Clients struct {
	secrets        *auth.Secrets // nil: insecure
	connectTimeout time.Duration

	mu      sync.Mutex // protects clients
	clients map[string]peerservice.Client
}

// New returns clients whose connections authenticate with s (nil: insecure) and give
// up a dial after connectTimeout.
func New(s *auth.Secrets, connectTimeout time.Duration) *Clients {
	return &Clients{secrets: s, connectTimeout: connectTimeout, clients: make(map[string]peerservice.Client)}
}

// Get returns the client of addr and the options for each call to it. An IP address
// is also named per call (callopt.WithHostPort): a call with its instance set skips
// Kitex's resolver middleware, which would retry a failed dial up to 6 times (and log
// each retry); a host name (resolved by Kitex) keeps the retries, made cheap by
// fastFailDialer.
func (p *Clients) Get(addr string) (peerservice.Client, []callopt.Option, error) {
	var opts []callopt.Option
	if _, err := netip.ParseAddrPort(addr); err == nil {
		opts = []callopt.Option{callopt.WithHostPort(addr)}
	}
	c, err := p.client(addr)
	return c, opts, err
}

func (p *Clients) client(addr string) (peerservice.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[addr]; c != nil {
		return c, nil
	}
	c, err := peerservice.NewClient("fluxkv-owner", append(auth.ClientOptions(p.secrets, auth.PurposePeer),
		client.WithHostPorts(addr), client.WithConnectTimeout(p.connectTimeout),
		// replaces the dialer ClientOptions set, wrapping the same authenticating one
		client.WithDialer(&fastFailDialer{d: auth.NewDialer(p.secrets, auth.PurposePeer), window: p.connectTimeout}))...)
	if err != nil {
		return nil, err
	}
	p.clients[addr] = c
	return c, nil
}

// fastFailDialer wraps the cluster dialer of one owner address: for window after a dial
// failed, dials fail at once with that error, so concurrent calls to a dead owner do
// not each wait for a connect timeout, and the resolver middleware's retries of a
// failed dial (up to 6 until the call's context ends, kitex client/middlewares.go
// maxRetry; they apply to owners advertised by host name) cost one timeout, not six.
type fastFailDialer struct {
	d      remote.Dialer
	window time.Duration

	mu       sync.Mutex // protects failedAt, err
	failedAt time.Time
	err      error
}

func (f *fastFailDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	f.mu.Lock()
	if f.err != nil {
		if ago := time.Since(f.failedAt); ago < f.window {
			err := f.err
			f.mu.Unlock()
			return nil, fmt.Errorf("%w (dial failed %v ago; not retried yet)", err, ago.Round(time.Millisecond))
		}
	}
	f.mu.Unlock()
	c, err := f.d.DialTimeout(network, address, timeout)
	f.mu.Lock()
	if err != nil {
		f.err, f.failedAt = err, time.Now()
	} else {
		f.err = nil
	}
	f.mu.Unlock()
	return c, err
}
