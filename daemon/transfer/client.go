package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// maxReadChunk is the most one Read asks of the socket.
const maxReadChunk = 4 << 20

// ClientOptions tune a data-plane client. Zero fields take the defaults.
type ClientOptions struct {
	// Secrets authenticate every connection (protocol/auth, purpose "data"); nil runs
	// without authentication (--insecure-cluster).
	Secrets *auth.Secrets
	// ProgressTimeout fails a pull when no byte arrives for this long (a staged pull's
	// source sends a WAIT status every 250 ms while it reads the chunk). Default 1s.
	ProgressTimeout time.Duration
	// UserTimeout is TCP_USER_TIMEOUT on each connection. Default 2s.
	UserTimeout time.Duration
	// MaxPullsPerPeer bounds the pulls in flight to one peer address (a get batch
	// brings its keys in concurrently, several from the same owner): a pull beyond it
	// waits, first come first served, until one of them ends, or until its context
	// ends or the client closes; the wait is not on the wire, so ProgressTimeout does
	// not run meanwhile. A pull that waited while another pull from the peer failed as
	// unreachable (dial failed, connection broke or stalled) fails at once with that
	// error (ErrUnreachable) instead of trying: a batch from a dead peer fails in one
	// deadline, not one per MaxPullsPerPeer pulls. Staged pulls (Fence.Staged) are not
	// counted: each may wait on the source's disk and on its staging, which the other
	// staged pulls of the same refill free, and their caller bounds them
	// (STAGE_PULLS_IN_FLIGHT per refill). Default 4.
	MaxPullsPerPeer int
	// MaxIdlePerPeer caps the pooled idle connections per peer address. Default
	// MaxPullsPerPeer.
	MaxIdlePerPeer int
	// MaxIdle caps the pooled idle connections to all peers together: a connection a
	// pull ends with past it is closed, not pooled (in a large cluster the idle ones,
	// MaxIdlePerPeer to each peer pulled from within IdleTimeout, would otherwise take
	// file descriptors by the thousand). Default 1,024.
	MaxIdle int
	// IdleTimeout: a pooled connection idle longer is closed, not reused (keep it
	// under the server's IdleTimeout). Default 1 minute.
	IdleTimeout time.Duration
	// DialTimeout bounds the TCP connect and the wait for the server's hello (the
	// rest of the handshake has protocol/auth's 5s). Default 1s.
	DialTimeout time.Duration
	// Logger receives pull failures (at most a few lines a second). Default: none.
	Logger *zerolog.Logger
	// Metrics counts bytes pulled and failed pulls. Default: none.
	Metrics *metrics.Metrics

	// sockBuf, for benchmarks: SO_RCVBUF and SO_SNDBUF (0: kernel autotuning).
	sockBuf int
}

func (o *ClientOptions) fill() {
	if o.ProgressTimeout <= 0 {
		o.ProgressTimeout = time.Second
	}
	if o.UserTimeout <= 0 {
		o.UserTimeout = 2 * time.Second
	}
	if o.MaxPullsPerPeer <= 0 {
		o.MaxPullsPerPeer = 4
	}
	if o.MaxIdlePerPeer <= 0 {
		o.MaxIdlePerPeer = o.MaxPullsPerPeer
	}
	if o.MaxIdle <= 0 {
		o.MaxIdle = 1024
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = time.Minute
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = time.Second
	}
}

// Client pulls from data-plane servers over pooled connections. It is safe for
// concurrent use; each pull holds one connection for its duration.
type Client struct {
	opts ClientOptions
	warn zerolog.Logger // sampled
	tm   *metrics.Transfer

	dials atomic.Int64   // connections dialled (tests count pool reuse)
	wg    sync.WaitGroup // dial goroutines
	stop  chan struct{}  // closed by Close: abandons dials in progress

	mu     sync.Mutex // protects idle, nIdle, swept, active, gates, closed
	idle   map[string][]idleConn
	nIdle  int       // the connections in idle, all addresses together
	swept  time.Time // the last sweep of every address's idle connections (sweepLocked)
	active map[*net.TCPConn]struct{}
	gates  map[string]*gate // per peer address, while a pull holds or waits for a slot
	closed bool
}

type idleConn struct {
	tc    *net.TCPConn
	since time.Time
}

var _ Puller = (*Client)(nil)

// NewClient returns a client; Close it to close its connections.
func NewClient(opts ClientOptions) *Client {
	opts.fill()
	warn := zerolog.Nop()
	if opts.Logger != nil {
		warn = opts.Logger.With().Str("component", "transfer").Logger().Sample(&zerolog.BurstSampler{Burst: 3, Period: time.Second})
	}
	return &Client{
		opts:   opts,
		warn:   warn,
		tm:     opts.Metrics.Transfer(),
		stop:   make(chan struct{}),
		idle:   make(map[string][]idleConn),
		active: make(map[*net.TCPConn]struct{}),
		gates:  make(map[string]*gate),
	}
}

// Close closes every connection, failing the pulls in flight, and waits for dials in
// progress. Pulls after Close fail.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.stop)
	var conns []*net.TCPConn
	for _, list := range c.idle {
		for _, ic := range list {
			conns = append(conns, ic.tc)
		}
	}
	c.idle, c.nIdle = nil, 0
	for tc := range c.active {
		conns = append(conns, tc)
	}
	c.mu.Unlock()
	for _, tc := range conns {
		tc.Close()
	}
	c.wg.Wait()
	return nil
}

// Pull implements Puller.
func (c *Client) Pull(ctx context.Context, addr string, f Fence, offset int64, dst []byte) error {
	if len(dst) == 0 || offset < 0 {
		return fmt.Errorf("transfer: pull of %d bytes at offset %d from %s: want at least one byte at a non-negative offset", len(dst), offset, addr)
	}
	if err := wire.ValidateNodeID(f.SourceNode); err != nil {
		return fmt.Errorf("transfer: pull from %s: %w", addr, err)
	}
	if f.Staged {
		ctx, cancel := budgeted(ctx)
		defer cancel()
		_, err := c.pull(ctx, addr, f, offset, dst)
		return err
	}
	g, _, err := c.enter(ctx, addr, f)
	if err != nil {
		return err
	}
	ctx, cancel := budgeted(ctx)
	kind, err := c.pull(ctx, addr, f, offset, dst)
	cancel()
	c.leave(addr, g, kind, err)
	return err
}

// pull runs one pull (and its one retry); kind is the metrics kind of err.
func (c *Client) pull(ctx context.Context, addr string, f Fence, offset int64, dst []byte) (kind string, err error) {
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			c.tm.Error(metrics.TransferPull, metrics.TransferErrCanceled)
			return metrics.TransferErrCanceled, fmt.Errorf("pull from %s (node %q): %w", addr, f.SourceNode, err)
		}
		tc, reused, err := c.get(ctx, addr)
		if err != nil {
			kind := metrics.TransferErrUnreachable
			if ctx.Err() != nil {
				kind = metrics.TransferErrCanceled
			}
			c.tm.Error(metrics.TransferPull, kind)
			c.warn.Warn().Str("peer", addr).Err(err).Msg("data-plane dial failed")
			return kind, err
		}
		res := c.pullOn(ctx, tc, addr, f, offset, dst)
		if res.keep {
			c.put(addr, tc)
		} else {
			c.discard(tc)
		}
		if res.err == nil {
			c.tm.Bytes(metrics.TransferPull, int64(len(dst)))
			return "", nil
		}
		// A pooled connection the server closed meanwhile (idle timeout, restart)
		// fails before any reply byte: the pull reads nothing, so one retry on a
		// fresh connection is safe.
		if reused && !res.started && !res.timeout && ctx.Err() == nil && attempt == 0 {
			continue
		}
		c.tm.Error(metrics.TransferPull, res.kind)
		if res.kind != metrics.TransferErrFenced {
			c.warn.Warn().Str("peer", addr).Err(res.err).Msg("pull failed")
		}
		return res.kind, res.err
	}
}

// gate bounds the pulls in flight to one peer (MaxPullsPerPeer). A slot is a send on
// slots: a channel's blocked senders go first come first served. Every field but
// slots is protected by Client.mu.
type gate struct {
	slots chan struct{}
	users int // pulls holding or waiting for a slot; the gate is dropped at 0
	// downs counts the pulls that failed because the peer looked down (its dial
	// failed, its connection broke or stalled past ProgressTimeout); down is the last
	// such error. A pull that waited while one failed so does not try the peer: it
	// fails with that error at once, so a batch of pulls from a dead peer fails in one
	// ProgressTimeout, not one per MaxPullsPerPeer of them.
	downs uint64
	down  error
}

// peerDown reports whether a pull that failed with kind says its peer is down.
func peerDown(kind string) bool {
	return kind == metrics.TransferErrUnreachable || kind == metrics.TransferErrTimeout || kind == metrics.TransferErrIO
}

// enter takes one of addr's MaxPullsPerPeer slots, waiting while they are all held;
// leave gives it back. It fails when ctx ends or the client closes first, or when a
// pull from the peer failed as down (peerDown) while it waited; kind is the metrics
// kind it counted that failure as, once ("" for a closed client's: not counted).
func (c *Client) enter(ctx context.Context, addr string, f Fence) (g *gate, kind string, err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, "", fmt.Errorf("%w: pull from %s: the transfer client is closed: %w", ErrUnreachable, addr, net.ErrClosed)
	}
	g = c.gates[addr]
	if g == nil {
		g = &gate{slots: make(chan struct{}, c.opts.MaxPullsPerPeer)}
		c.gates[addr] = g
	}
	g.users++
	downs := g.downs
	c.mu.Unlock()
	select {
	case g.slots <- struct{}{}:
		return g, "", nil // no wait: nothing failed meanwhile
	default:
	}
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		c.drop(addr, g)
		c.tm.Error(metrics.TransferPull, metrics.TransferErrCanceled)
		return nil, metrics.TransferErrCanceled, fmt.Errorf("pull from %s (node %q): waiting for one of the %d pulls in flight to end: %w",
			addr, f.SourceNode, c.opts.MaxPullsPerPeer, ctx.Err())
	case <-c.stop:
		c.drop(addr, g)
		return nil, "", fmt.Errorf("%w: pull from %s: the transfer client is closed: %w", ErrUnreachable, addr, net.ErrClosed)
	}
	c.mu.Lock()
	down := g.down
	failed := g.downs != downs
	c.mu.Unlock()
	if failed {
		<-g.slots
		c.drop(addr, g)
		c.tm.Error(metrics.TransferPull, metrics.TransferErrUnreachable)
		return nil, metrics.TransferErrUnreachable, fmt.Errorf("%w: pull from %s (node %q) not tried: a pull from it failed while this one waited: %w",
			ErrUnreachable, addr, f.SourceNode, down)
	}
	return g, "", nil
}

// leave gives back g's slot after a pull that ended with err (of metrics kind kind).
func (c *Client) leave(addr string, g *gate, kind string, err error) {
	if err != nil && peerDown(kind) {
		c.mu.Lock()
		g.downs++
		g.down = err
		c.mu.Unlock()
	}
	<-g.slots
	c.drop(addr, g)
}

// drop ends one user of g, dropping g with its last.
func (c *Client) drop(addr string, g *gate) {
	c.mu.Lock()
	if g.users--; g.users == 0 && c.gates[addr] == g {
		delete(c.gates, addr)
	}
	c.mu.Unlock()
}

// pullResult is the outcome of one pull on one connection.
type pullResult struct {
	err     error
	kind    string // the metrics kind of err
	keep    bool   // the connection is in step for another pull
	started bool   // a reply byte arrived
	timeout bool   // err is a progress deadline
}

func (c *Client) pullOn(ctx context.Context, tc *net.TCPConn, addr string, f Fence, offset int64, dst []byte) (res pullResult) {
	// Context cancellation makes every pending and later read or write fail at once.
	stop := context.AfterFunc(ctx, func() { tc.SetDeadline(time.Unix(1, 0)) })
	defer func() { res = cancelled(stop, ctx, addr, f, res) }()
	var hb [maxRequestLen]byte
	op := byte(opPull)
	if f.Staged {
		op = opPullStaged
	}
	req := appendRequest(hb[:0], request{op: op, fence: f, offset: offset, length: int64(len(dst))})
	rr, err := c.newReplyReader(ctx, tc)
	if err != nil {
		return c.ioFail(pullRef{addr, f, offset, len(dst)}, "sending the request", 0, false, err)
	}
	tc.SetWriteDeadline(time.Now().Add(c.opts.ProgressTimeout))
	if _, err := tc.Write(req); err != nil {
		return c.ioFail(pullRef{addr, f, offset, len(dst)}, "sending the request", 0, false, err)
	}
	res = rr.read(pullRef{addr, f, offset, len(dst)}, dst)
	res.keep = res.keep && rr.inStep()
	return res
}

// cancelled ends a pull on a connection whose context deadline stop was armed: when
// the context ended (its deadline forced on the connection) the connection is done,
// and a failure is the context's.
func cancelled(stop func() bool, ctx context.Context, addr string, f Fence, res pullResult) pullResult {
	if !stop() {
		// The deadline was (or is being) forced: this connection is done.
		res.keep = false
		if res.err != nil {
			res.err = fmt.Errorf("pull from %s (node %q): %w", addr, f.SourceNode, ctx.Err())
			res.kind = metrics.TransferErrCanceled
		}
	}
	return res
}

// pullRef names one pull in errors.
type pullRef struct {
	addr   string
	f      Fence
	offset int64
	n      int
}

func (r pullRef) String() string {
	return fmt.Sprintf("pull of [%d,+%d) from %s (node %q generation %d transfer %d)",
		r.offset, r.n, r.addr, r.f.SourceNode, r.f.SourceGeneration, r.f.TransferID)
}

// ioFail is the result of a pull whose connection failed while stage, got bytes of
// its data in (started: a reply byte of it arrived before).
func (c *Client) ioFail(r pullRef, stage string, got int, started bool, err error) pullResult {
	res := pullResult{kind: metrics.TransferErrIO, started: started || got > 0}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		res.kind, res.timeout = metrics.TransferErrTimeout, true
		res.err = fmt.Errorf("%w: %s: no byte for %v while %s (%d of %d bytes arrived): %w",
			ErrUnreachable, r, c.opts.ProgressTimeout, stage, got, r.n, err)
	} else {
		res.err = fmt.Errorf("%w: %s: connection failed while %s (%d of %d bytes arrived): %w",
			ErrUnreachable, r, stage, got, r.n, err)
	}
	return res
}

// get returns a pooled connection to addr (reused) or dials one.
func (c *Client) get(ctx context.Context, addr string) (tc *net.TCPConn, reused bool, err error) {
	now := time.Now()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, false, fmt.Errorf("%w: pull from %s: the transfer client is closed: %w", ErrUnreachable, addr, net.ErrClosed)
	}
	stale := c.sweepLocked(now)
	for list := c.idle[addr]; len(list) > 0; list = c.idle[addr] {
		ic := list[len(list)-1]
		c.idle[addr] = list[:len(list)-1]
		c.nIdle--
		if now.Sub(ic.since) > c.opts.IdleTimeout || !alive(ic.tc) {
			stale = append(stale, ic.tc)
			continue
		}
		tc = ic.tc
		c.active[tc] = struct{}{}
		break
	}
	if len(c.idle[addr]) == 0 {
		delete(c.idle, addr)
	}
	if tc == nil {
		c.wg.Add(1) // under mu, before closed is set: Close's Wait sees it
	}
	c.mu.Unlock()
	for _, s := range stale {
		s.Close()
	}
	if tc != nil {
		return tc, true, nil
	}
	tc, err = c.dialAsync(ctx, addr)
	return tc, false, err
}

// dialAsync dials in a goroutine (joined by Close) so that ctx and Close abandon a
// dial at once; an abandoned connection is closed when its dial returns.
func (c *Client) dialAsync(ctx context.Context, addr string) (*net.TCPConn, error) {
	type result struct {
		tc  *net.TCPConn
		err error
	}
	ch := make(chan result) // unbuffered: a send succeeds only while Pull waits
	go func() {
		defer c.wg.Done()
		tc, err := c.dial(addr)
		if err == nil {
			c.mu.Lock()
			if c.closed {
				err = fmt.Errorf("%w: dial %s: the transfer client is closed: %w", ErrUnreachable, addr, net.ErrClosed)
			} else {
				c.active[tc] = struct{}{}
			}
			c.mu.Unlock()
			if err != nil {
				tc.Close()
				tc = nil
			}
		}
		select {
		case ch <- result{tc, err}:
		case <-ctx.Done():
			c.discard(tc)
		case <-c.stop:
			c.discard(tc)
		}
	}()
	select {
	case r := <-ch:
		return r.tc, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("dial %s: %w", addr, ctx.Err())
	case <-c.stop:
		return nil, fmt.Errorf("%w: dial %s: the transfer client is closed: %w", ErrUnreachable, addr, net.ErrClosed)
	}
}

func (c *Client) dial(addr string) (*net.TCPConn, error) {
	c.dials.Add(1)
	conn, err := net.DialTimeout("tcp", addr, c.opts.DialTimeout)
	if err != nil {
		return nil, fmt.Errorf("%w: data plane of %s: %w", ErrUnreachable, addr, err)
	}
	tc := conn.(*net.TCPConn)
	if err := tune(tc, c.opts.UserTimeout, c.opts.sockBuf); err != nil {
		tc.Close()
		return nil, fmt.Errorf("%w: data plane of %s: %w", ErrUnreachable, addr, err)
	}
	if err := auth.ClientHandshake(tc, c.opts.Secrets, auth.PurposeData, addr, c.opts.DialTimeout); err != nil {
		tc.Close()
		return nil, fmt.Errorf("%w: data plane of %s: %w", ErrUnreachable, addr, err)
	}
	tc.SetDeadline(time.Time{})
	return tc, nil
}

// sweepLocked takes out the connections idle past IdleTimeout at every address, at
// most once an IdleTimeout, and returns them to close: a peer that went away (restarted
// on another address) is never pulled from again, and its pooled connections would stay
// open for the client's life.
func (c *Client) sweepLocked(now time.Time) []*net.TCPConn {
	if now.Sub(c.swept) < c.opts.IdleTimeout {
		return nil
	}
	c.swept = now
	var stale []*net.TCPConn
	for addr, list := range c.idle {
		kept := list[:0]
		for _, ic := range list {
			if now.Sub(ic.since) > c.opts.IdleTimeout {
				stale = append(stale, ic.tc)
				c.nIdle--
			} else {
				kept = append(kept, ic)
			}
		}
		clear(list[len(kept):])
		if len(kept) == 0 {
			delete(c.idle, addr)
		} else {
			c.idle[addr] = kept
		}
	}
	return stale
}

// put returns a connection in step to the pool, or closes it when the pool is full.
func (c *Client) put(addr string, tc *net.TCPConn) {
	tc.SetDeadline(time.Time{})
	c.mu.Lock()
	delete(c.active, tc)
	if c.closed || len(c.idle[addr]) >= c.opts.MaxIdlePerPeer || c.nIdle >= c.opts.MaxIdle {
		c.mu.Unlock()
		tc.Close()
		return
	}
	c.idle[addr] = append(c.idle[addr], idleConn{tc: tc, since: time.Now()})
	c.nIdle++
	c.mu.Unlock()
}

// discard closes a connection that is out of step (or abandoned); nil is ignored.
func (c *Client) discard(tc *net.TCPConn) {
	if tc == nil {
		return
	}
	c.mu.Lock()
	delete(c.active, tc)
	c.mu.Unlock()
	tc.Close()
}

// alive reports whether an idle connection may carry another pull: not closed or
// reset by the server, and no unexpected bytes (a peek that does not block).
func alive(tc *net.TCPConn) bool {
	rc, err := tc.SyscallConn()
	if err != nil {
		return false
	}
	ok := true
	var buf [1]byte
	rc.Read(func(fd uintptr) bool {
		// Idle and in step: nothing to read (EAGAIN). A read of 0 bytes is the server's
		// close; bytes nobody asked for mean the stream is out of step.
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true
	})
	return ok
}
