package auth

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
)

// Accept tuning: a failed accept is retried after a doubling delay in these bounds
// (like net/http's Server.Serve), never returned to the server, whose accept loop
// would end.
const (
	acceptBackoffMin  = 5 * time.Millisecond
	acceptBackoffMax  = time.Second
	defaultMaxPending = 256
)

// ListenerOptions tune Listener. Zero fields take the defaults.
type ListenerOptions struct {
	// Timeout bounds a handshake, from the connection's first read. Default 5s.
	Timeout time.Duration
	// MaxPending caps the connections accepted but not yet authenticated; one more is
	// closed at once (a flood of silent connections cannot hold more). Default 256.
	MaxPending int
	// Logger receives rate-limited warnings of refused connections. Default: none.
	Logger *zerolog.Logger
	// Metrics counts refusals (fluxkv_conn_refused_total{socket=purpose,
	// reason="auth"|"cap"|"accept"}) and handshake timeouts. Default: none.
	Metrics *metrics.Metrics
}

// listener authenticates every connection it accepts. Accept returns at once; the
// server side of the handshake runs in the connection's first Read or Write (in the
// goroutine that serves it, under a deadline), so a slow or hostile caller never
// blocks accept. Closing the listener also ends its idle connections (see drain): a
// stopped server must not keep serving the connections it had.
type listener struct {
	net.Listener
	secrets *Secrets // nil: insecure, no handshake
	purpose string
	opts    ListenerOptions
	log     zerolog.Logger // sampled: at most one line a second

	mu      sync.Mutex // protects conns, pending, closed
	conns   map[*serverConn]struct{}
	pending int
	closed  bool
}

// Listener wraps ln so that every connection it returns authenticates its peer with
// s for purpose before a byte of it reaches the caller. A nil s runs without
// authentication (both sides must agree: a client that authenticates is then refused
// by the timeout of its own handshake). Serve it with Kitex's gonet transport.
func Listener(ln net.Listener, s *Secrets, purpose string, opts ListenerOptions) net.Listener {
	checkPurpose(purpose)
	if opts.Timeout <= 0 {
		opts.Timeout = defaultLimit
	}
	if opts.MaxPending <= 0 {
		opts.MaxPending = defaultMaxPending
	}
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = opts.Logger.With().Str("socket", purpose).Logger().Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Second})
	}
	return &listener{Listener: ln, secrets: s, purpose: purpose, opts: opts, log: log, conns: make(map[*serverConn]struct{})}
}

// Accept returns the next connection; its errors are only those of a closed listener.
func (l *listener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		raw, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.isClosed() {
				return nil, err
			}
			delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
			l.opts.Metrics.ConnRefused(l.purpose, metrics.RefuseAccept)
			l.log.Warn().Err(err).Dur("backoff", delay).Msg("accept failed; retrying")
			time.Sleep(delay)
			continue
		}
		delay = 0
		if c := l.admit(raw); c != nil {
			return c, nil
		}
	}
}

// admit wraps raw, or closes it when too many handshakes are pending or the listener
// is closed.
func (l *listener) admit(raw net.Conn) *serverConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		raw.Close()
		return nil
	}
	c := &serverConn{Conn: raw, l: l}
	if l.secrets != nil {
		if l.pending >= l.opts.MaxPending {
			raw.Close()
			l.opts.Metrics.ConnRefused(l.purpose, metrics.RefuseCap)
			l.log.Warn().Str("remote", raw.RemoteAddr().String()).Int("max_pending", l.opts.MaxPending).
				Msg("too many unauthenticated connections; closed one")
			return nil
		}
		l.pending++
		c.pending = true
	}
	l.conns[c] = struct{}{}
	return c
}

func (l *listener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// Close stops accepting and drains every connection: each ends at its next wait for
// a request (a call being served still gets its reply).
func (l *listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	conns := make([]*serverConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	err := l.Listener.Close()
	for _, c := range conns {
		c.drain()
	}
	return err
}

func (l *listener) forget(c *serverConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, c)
	l.donePendingLocked(c)
}

// donePendingLocked takes c off the count of pending handshakes, once.
func (l *listener) donePendingLocked(c *serverConn) {
	if c.pending {
		c.pending = false
		l.pending--
	}
}

// handshakeDone records the end of c's handshake.
func (l *listener) handshakeDone(c *serverConn, err error) {
	l.mu.Lock()
	l.donePendingLocked(c)
	l.mu.Unlock()
	if err == nil {
		return
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		l.opts.Metrics.ConnTimeout(l.purpose, metrics.TimeoutAuth)
	} else {
		l.opts.Metrics.ConnRefused(l.purpose, metrics.RefuseAuth)
	}
	l.log.Warn().Str("remote", c.RemoteAddr().String()).Err(err).Msg("cluster authentication failed; connection closed")
}

// serverConn runs the server side of the handshake before its first read or write
// passes through. Read deadlines the server sets before or during the handshake are
// applied once it is done.
type serverConn struct {
	net.Conn
	l *listener

	pending bool // counted in l.pending; protected by l.mu

	once  sync.Once
	hsErr error

	mu           sync.Mutex // protects handshaking, readDeadline, draining
	handshaking  bool
	readDeadline time.Time
	draining     bool
}

func (c *serverConn) handshake() error {
	c.once.Do(func() {
		if c.l.secrets == nil {
			return
		}
		c.mu.Lock()
		c.handshaking = true
		c.mu.Unlock()
		c.Conn.SetDeadline(time.Now().Add(c.l.opts.Timeout))
		err := serverHandshake(c.Conn, c.l.secrets, c.l.purpose)
		c.l.handshakeDone(c, err)
		c.mu.Lock()
		c.handshaking = false
		c.Conn.SetWriteDeadline(time.Time{})
		if c.draining {
			c.Conn.SetReadDeadline(time.Now())
		} else {
			c.Conn.SetReadDeadline(c.readDeadline)
		}
		c.mu.Unlock()
		if err != nil {
			c.hsErr = err
			c.Conn.Close()
		}
	})
	return c.hsErr
}

// Read authenticates the peer first. A refused or drained connection reads as closed
// by the peer (io.EOF): the refusal was counted and logged here, and the server
// should not log it again as an error.
func (c *serverConn) Read(b []byte) (int, error) {
	if c.handshake() != nil {
		return 0, io.EOF
	}
	n, err := c.Conn.Read(b)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && c.isDraining() {
		err = io.EOF
	}
	return n, err
}

// Write authenticates the peer first (servers read before they write; this is the guard).
func (c *serverConn) Write(b []byte) (int, error) {
	if c.handshake() != nil {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}

// SetReadDeadline applies t, after the handshake when one is running; a draining
// connection keeps its expired deadline.
func (c *serverConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDeadline = t
	if c.handshaking || c.draining {
		return nil
	}
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline and SetWriteDeadline.
func (c *serverConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *serverConn) Close() error {
	c.l.forget(c)
	return c.Conn.Close()
}

// drain makes the connection's next (or current) wait for a request end: the server
// then closes it.
func (c *serverConn) drain() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.draining = true
	if !c.handshaking {
		c.Conn.SetReadDeadline(time.Now())
	}
}

func (c *serverConn) isDraining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining
}
