// Package peerclient calls owners' PeerService for the master and for owners calling
// each other: every connection authenticates with the cluster secrets, and a call to a
// dead owner fails within about one connect timeout.
package peerclient

import (
	"context"
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

// Clients is one Kitex PeerService client for every owner: each call names its owner's
// address (callopt.WithHostPort), and Kitex pools connections per address. One client,
// not one per address: Kitex keeps a balancer cache with a goroutine that never exits
// for every client built on its own address list (client.WithHostPorts), so a client
// per address leaked one each time an owner came back on a new port. Connecting is
// bounded by connectTimeout (with authentication the owner's hello must come within
// max(connectTimeout, 500ms)), and a failed dial is not repeated within connectTimeout
// (fastFailDialer), so a call to a dead owner fails within about one connect timeout
// whatever the call's own timeout.
type Clients struct {
	secrets        *auth.Secrets // nil: insecure
	connectTimeout time.Duration
	dialer         *fastFailDialer

	idMu sync.Mutex        // protects ids
	ids  map[string]string // a master's: the node id of the owner at each address (GetNode)

	once sync.Once
	c    peerservice.Client
	err  error
}

// New returns clients whose connections authenticate with s (nil: insecure) and give
// up a dial after connectTimeout: an owner's, for the calls owners make to each other.
func New(s *auth.Secrets, connectTimeout time.Duration) *Clients {
	return &Clients{secrets: s, connectTimeout: connectTimeout,
		dialer: &fastFailDialer{d: auth.NewDialer(s, auth.PurposePeer), window: connectTimeout, failed: make(map[string]dialFailure)}}
}

// NewMaster returns a master's clients: their connections also prove a master with
// key (docs/architecture.md §11), so owners answer its master-only calls; call owners through
// GetNode, which names the owner the proof is for. A nil key makes New's clients.
func NewMaster(s *auth.Secrets, key *auth.MasterKey, connectTimeout time.Duration) *Clients {
	p := &Clients{secrets: s, connectTimeout: connectTimeout, ids: make(map[string]string)}
	p.dialer = &fastFailDialer{d: auth.NewMasterDialer(s, auth.PurposePeer, key, p.nodeAt), window: connectTimeout,
		failed: make(map[string]dialFailure)}
	return p
}

// maxNodeAddrs bounds the addresses a master remembers node ids of.
const maxNodeAddrs = 4096

// nodeAt is the node id GetNode last named for addr (as dialled: IP and port).
func (p *Clients) nodeAt(addr string) string {
	p.idMu.Lock()
	defer p.idMu.Unlock()
	return p.ids[addr]
}

// GetNode is Get for a call to owner nodeID at addr: a master's connection proves it
// to that node only (an owner cannot relay the proof to another owner).
func (p *Clients) GetNode(nodeID, addr string) (peerservice.Client, []callopt.Option, error) {
	ap, err := p.resolve(addr)
	if err != nil {
		return nil, nil, err
	}
	if p.ids != nil {
		p.idMu.Lock()
		if len(p.ids) >= maxNodeAddrs && p.ids[ap.String()] == "" {
			// Owners that left on ports not used again: every call names its node
			// again right before it dials, so starting afresh loses nothing.
			clear(p.ids)
		}
		p.ids[ap.String()] = nodeID
		p.idMu.Unlock()
	}
	return p.get(ap)
}

// Get returns the client and the options that direct a call to the owner at addr
// (host:port). A host name is resolved here, within the connect timeout, so the call
// itself names an IP address: Kitex's per-call option would resolve it again on every
// call, and panic when that fails.
func (p *Clients) Get(addr string) (peerservice.Client, []callopt.Option, error) {
	ap, err := p.resolve(addr)
	if err != nil {
		return nil, nil, err
	}
	return p.get(ap)
}

func (p *Clients) get(ap netip.AddrPort) (peerservice.Client, []callopt.Option, error) {
	p.once.Do(func() {
		p.c, p.err = peerservice.NewClient("fluxkv-owner", append(auth.ClientOptions(p.secrets, auth.PurposePeer),
			client.WithConnectTimeout(p.connectTimeout),
			// replaces the dialer ClientOptions set, wrapping the same authenticating one
			client.WithDialer(p.dialer))...)
	})
	if p.err != nil {
		return nil, nil, p.err
	}
	return p.c, []callopt.Option{callopt.WithHostPort(ap.String())}, nil
}

// resolve turns addr into an IP address and port.
func (p *Clients) resolve(addr string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("peer address %q: %w", addr, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(p.connectTimeout, time.Second))
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return netip.AddrPort{}, fmt.Errorf("peer address %q: cannot resolve %q: %v", addr, host, err)
	}
	ap, err := netip.ParseAddrPort(net.JoinHostPort(ips[0].Unmap().String(), port))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("peer address %q: %w", addr, err)
	}
	return ap, nil
}

// fastFailDialer wraps the cluster dialer: for window after a dial to an address failed,
// dials to it fail at once with that error, so concurrent calls to a dead owner do not
// each wait for a connect timeout. It remembers only addresses whose last dial failed
// within window.
type fastFailDialer struct {
	d      remote.Dialer
	window time.Duration

	mu     sync.Mutex // protects failed
	failed map[string]dialFailure
}

type dialFailure struct {
	at  time.Time
	err error
}

func (f *fastFailDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	f.mu.Lock()
	if fl, ok := f.failed[address]; ok {
		if ago := time.Since(fl.at); ago < f.window {
			f.mu.Unlock()
			return nil, fmt.Errorf("%w (dial failed %v ago; not retried yet)", fl.err, ago.Round(time.Millisecond))
		}
		delete(f.failed, address)
	}
	f.mu.Unlock()
	c, err := f.d.DialTimeout(network, address, timeout)
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	for a, fl := range f.failed { // forget stale failures: the map holds dead owners of the last window only
		if now.Sub(fl.at) >= f.window {
			delete(f.failed, a)
		}
	}
	if err != nil {
		f.failed[address] = dialFailure{at: now, err: err}
	}
	return c, err
}
