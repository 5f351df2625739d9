package daemon

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/client/callopt"
	"github.com/cloudwego/kitex/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// masterLink is the owner's connection to the master: the client of the current
// master and the bounds of its calls (this file), following the leader on etcd
// (leader.go), registration and re-registration (register.go), heartbeats
// (heartbeat.go). What the registration leaves behind — epochs, the lease, the
// eviction acks — is ownerState's (registration.go). With masters on etcd
// (Options.MasterEtcd) it follows the leader published there and registers with each
// new one.
type masterLink struct {
	o      *Owner
	client atomic.Pointer[masterClient] // nil: no leader known yet (etcd)
	etcd   *clientv3.Client             // nil without MasterEtcd
	// follow runs the leader watch; cancelled by close, joined by release.
	followCtx    context.Context
	followCancel context.CancelFunc
	followWG     sync.WaitGroup
	// peerAddr and dataAddr are the advertised addresses, fixed for this incarnation.
	peerAddr, dataAddr string
	stop               chan struct{}
	regMu              sync.Mutex // serialises (re-)registration
	// registers counts the Register calls sent (under regMu): each after the first names
	// a new registration generation (register).
	registers int

	// settling is closed once the registration in progress (and its replica report) is
	// over; allocating calls wait for it (settled).
	settling atomic.Pointer[chan struct{}]

	mu     sync.Mutex // protects closed, rereg
	closed bool       // no background re-registration starts once set
	rereg  bool       // a background re-registration is running
}

// masterClient is a Kitex client of one master address. When another master becomes
// the current one it is cut (stop): calls still waiting on this one (a leader cut off
// the network answers nothing) fail at once instead of at their timeout, and so do
// later ones. Its calls are bounded by its connections (dialer, auth.Dialer.BoundCalls),
// not by Kitex's RPC timeout: see masterLink.ctx.
type masterClient struct {
	masterservice.Client
	addr   string
	dialer *auth.Dialer // nil: the in-process master (Options.LocalMaster)
	// ctx bounds the waits before calls (masterLink.waitCtx); cancelled by stop.
	ctx    context.Context
	cancel context.CancelFunc
}

// stop ends the calls and waits on c, and fails later ones at once.
func (c *masterClient) stop() {
	c.cancel()
	if c.dialer != nil {
		c.dialer.Cut()
	}
}

func newMasterLink(o *Owner) (*masterLink, error) {
	m := &masterLink{o: o, stop: make(chan struct{}), peerAddr: o.peerAddr, dataAddr: o.dataAddr}
	m.followCtx, m.followCancel = context.WithCancel(context.Background())
	if o.opts.MasterEtcd == nil {
		if err := m.dial(o.opts.MasterAddr); err != nil {
			return nil, err
		}
		return m, nil
	}
	cli, err := o.opts.MasterEtcd.Client()
	if err != nil {
		return nil, fmt.Errorf("master on etcd: %w", err)
	}
	m.etcd = cli
	m.followWG.Add(1)
	go m.follow()
	return m, nil
}

// dial makes the client of the master at addr the current one: the in-process
// master's (Options.LocalMaster) when there is one, else a Kitex client of addr.
func (m *masterLink) dial(addr string) error {
	if c := m.o.opts.LocalMaster; c != nil {
		m.use(c, addr, nil)
		return nil
	}
	// Kitex resolves a host name once, when the client is made, and takes one that does
	// not resolve for a Unix socket path: every call would fail for the client's life.
	if _, err := net.ResolveTCPAddr("tcp", addr); err != nil {
		return fmt.Errorf("master address %q: %w", addr, err)
	}
	d := auth.NewDialer(m.o.opts.Secrets, auth.PurposeMaster).BoundCalls(m.o.opts.MasterTimeout)
	c, err := masterservice.NewClient("fluxkv-master", append(auth.DialerOptions(d),
		client.WithHostPorts(addr),
		client.WithConnectTimeout(time.Second),
		client.WithTransportProtocol(transport.Framed),
	)...)
	if err != nil {
		return fmt.Errorf("master client: %w", err)
	}
	m.use(c, addr, d)
	return nil
}

// use makes c, the client of the master at addr (its connections from d; nil: the
// in-process master), the current one.
func (m *masterLink) use(c masterservice.Client, addr string, d *auth.Dialer) {
	ctx, cancel := context.WithCancel(context.Background())
	if old := m.client.Swap(&masterClient{Client: c, addr: addr, dialer: d, ctx: ctx, cancel: cancel}); old != nil {
		old.stop()
	}
}

// cl is the client of the current master. Only register runs before the first
// registration, and it checks that a master (the leader on etcd) is known.
func (m *masterLink) cl() masterservice.Client { return m.client.Load() }

// ref names this owner in a master call: its node id, registration (Owner.nodeGen) and
// token.
func (m *masterLink) ref() *mp.NodeRef {
	return &mp.NodeRef{NodeId: m.o.opts.NodeID, Generation: m.o.nodeGen(), Token: m.o.token}
}

// addr names the master for logs: its address, or the etcd endpoints it is followed on.
func (m *masterLink) addr() string {
	if c := m.client.Load(); c != nil {
		return c.addr
	}
	if e := m.o.opts.MasterEtcd; e != nil {
		return ha.Scheme + strings.Join(e.Endpoints, ",") + e.Prefix
	}
	return m.o.opts.MasterAddr
}

// close stops the heartbeat loop and the leader watch; no background re-registration
// starts afterwards (running ones are joined by the owner's wait group).
func (m *masterLink) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		close(m.stop)
		m.followCancel()
	}
}

// cutShort makes the master calls waiting on the current master, and any made later
// on it, fail at once (a shutdown past its timeout).
func (m *masterLink) cutShort() {
	if c := m.client.Load(); c != nil {
		c.stop()
	}
}

// release closes the link and its etcd client once the leader watch has ended.
func (m *masterLink) release() {
	m.close()
	m.followWG.Wait()
	if m.etcd != nil {
		m.etcd.Close()
	}
}

// ctx returns the context of one master call, made with a Kitex client: it has no
// deadline and is never cancelled, so Kitex makes the call on the caller's goroutine
// instead of handing it to a goroutine of its timeout pool and waiting (a hand-over and
// a wake-up each way: on two busy cores about as long as the round trip itself). The
// client's connections bound the call: each write, and the read of the reply, within
// MasterTimeout (auth/bound.go), and they are closed when another master becomes the
// current one or a shutdown cuts the calls short (masterClient.stop). With the
// in-process master (Options.LocalMaster) it is waitCtx: the handlers' waits end with
// it. A call that must end sooner derives a context of its own (run on Kitex's pool).
func (m *masterLink) ctx() (context.Context, context.CancelFunc) {
	if c := m.client.Load(); c != nil && c.dialer != nil {
		return context.Background(), func() {}
	}
	return m.waitCtx()
}

// ctxWithin is the context and call options of a master call that may take up to wait
// (more than MasterTimeout) when long: with a Kitex client it carries wait as its RPC
// timeout (and runs on Kitex's pool), or is an ordinary call (ctx) when not long; with
// the in-process master, which ignores call options, its context ends at wait.
func (m *masterLink) ctxWithin(wait time.Duration, long bool) (context.Context, context.CancelFunc, []callopt.Option) {
	if c := m.client.Load(); c != nil && c.dialer != nil {
		if !long {
			return context.Background(), func() {}, nil
		}
		return context.Background(), func() {}, []callopt.Option{callopt.WithRPCTimeout(wait)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	return ctx, cancel, nil
}

// callCtx is ctx for a call that waited with wait (from waitCtx) before it is sent:
// the call's own context, or wait itself with the in-process master.
func (m *masterLink) callCtx(wait context.Context) context.Context {
	if c := m.client.Load(); c != nil && c.dialer != nil {
		return context.Background()
	}
	return wait
}

// waitCtx bounds what a master call waits for before it is sent (a registration in
// progress, holder acks in flight) by MasterTimeout; it ends early when another master
// becomes the current one.
func (m *masterLink) waitCtx() (context.Context, context.CancelFunc) {
	base := context.Background()
	if c := m.client.Load(); c != nil {
		base = c.ctx
	}
	return context.WithTimeout(base, m.o.opts.MasterTimeout)
}

// check maps a master call's outcome to an error: transport failures are UNAVAILABLE;
// STALE_GENERATION (the master lost this owner) triggers re-registration in the background.
func (m *masterLink) check(code common.ErrorCode, msg string, err error) error {
	if err != nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "master unreachable: %v", err)
	}
	switch code {
	case common.ErrorCode_STALE_GENERATION:
		m.reregisterInBackground()
		return errCode(common.ErrorCode_UNAVAILABLE, "master lost this owner's registration (restarted); retry: %s", msg)
	case common.ErrorCode_NOT_LEADER:
		// A failover: the owner registers with the new leader when etcd names it.
		return errCode(common.ErrorCode_UNAVAILABLE, "master failover in progress; retry: %s", msg)
	}
	return wire.FromResponse(code, msg)
}

// unsettled reports whether a registration (or its replica report) is in progress.
func (m *masterLink) unsettled() bool {
	ch := m.settling.Load()
	return ch != nil && !isClosed(*ch)
}

// settled waits until no registration is in progress, or ctx ends (UNAVAILABLE).
func (m *masterLink) settled(ctx context.Context) error {
	ch := m.settling.Load()
	if ch == nil {
		return nil
	}
	select {
	case <-*ch:
		return nil
	case <-ctx.Done():
		return errCode(common.ErrorCode_UNAVAILABLE, "registering with the master took too long; retry")
	}
}
