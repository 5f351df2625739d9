package auth

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/internal/rawsock"
	"github.com/fluxkv/fluxkv/metrics"
)

// Accept tuning: a failed accept is retried after a doubling delay in these bounds
// (like net/http's Server.Serve), never returned to the server, whose accept loop
// would end.
const (
	acceptBackoffMin  = 5 * time.Millisecond
	acceptBackoffMax  = time.Second
	defaultMaxPending = 256
	// defaultSourceShare is the default per-source bound, as a fraction of MaxPending:
	// one source (one attacker host) holds at most half the slots, so members connecting
	// from elsewhere always find the other half free (and when several sources fill the
	// total, the one holding the most is shed first). Not less: a member on the
	// attacker's own host has its source's share as its window (shed.go).
	defaultSourceShare = 2
	// busyWriteWait bounds the write of a busy verdict to a shed connection (it fits in
	// any socket buffer; the bound only keeps accept from waiting on a stuck one).
	busyWriteWait = 10 * time.Millisecond
)

// ListenerOptions tune Listener. Zero fields take the defaults.
type ListenerOptions struct {
	// Timeout bounds a handshake, from the connection's first read. Default 5s.
	Timeout time.Duration
	// MaxPending caps the connections accepted but not yet authenticated. One more
	// does not wait and is not refused: the oldest pending connection of the source
	// holding the most is shed instead (shed.go), so a flood of silent connections
	// displaces its own. Default 256.
	MaxPending int
	// MaxPendingPerSource caps those of one source address (an IPv6 /64); one more
	// sheds that source's oldest. Default MaxPending/2 (at least 1).
	MaxPendingPerSource int
	// Logger receives rate-limited warnings of refused and shed connections. Default:
	// none.
	Logger *zerolog.Logger
	// Metrics counts refusals (fluxkv_conn_refused_total{socket=purpose,
	// reason="auth"|"shed"|"source_cap"|"accept"}) and handshake timeouts. Default:
	// none.
	Metrics *metrics.Metrics
	// MasterCheck verifies the master claims of clients (role.go: an owner's peer
	// port); ConnRole then reports RoleMaster for their calls. Default nil: a claim is
	// read and the client is a member.
	MasterCheck *MasterCheck
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

	mu      sync.Mutex // protects conns, pending, closed, and each conn's pe, phase, shed
	conns   map[*serverConn]struct{}
	pending *shedQueue // the connections in their handshake (secure listeners)
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
	if opts.MaxPendingPerSource <= 0 {
		opts.MaxPendingPerSource = max(opts.MaxPending/defaultSourceShare, 1)
	}
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = opts.Logger.With().Str("socket", purpose).Logger().Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Second})
	}
	l := &listener{Listener: ln, secrets: s, purpose: purpose, opts: opts, log: log, conns: make(map[*serverConn]struct{}),
		pending: newShedQueue(opts.MaxPending, opts.MaxPendingPerSource)}
	l.pending.answered = func(e *pendingEntry) bool { return unread(e.c.Conn) }
	return l
}

// unread says whether bytes wait in c's receive buffer (a peek that neither blocks nor
// takes the read lock a blocked Read holds); false when it cannot tell.
func unread(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var n int
	rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
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
			l.opts.Metrics.ConnRefused(l.purpose, metrics.AcceptRefusal(err))
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

// admit wraps raw, shedding an older pending connection when the bounds are reached,
// or closes raw when the listener is closed.
func (l *listener) admit(raw net.Conn) *serverConn {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		raw.Close()
		return nil
	}
	c := &serverConn{Conn: raw, raw: rawsock.New(raw), l: l}
	var victim *serverConn
	var reason string
	var busy bool
	if l.secrets != nil {
		c.pe = pendingEntry{c: c, src: sourceOf(raw.RemoteAddr())}
		if v, r := l.pending.add(&c.pe); v != nil {
			victim, reason = v.c, r
			victim.shed = r
			// Past its hello and before its answer: the client may be waiting for a
			// verdict (nothing else is written to it from now on: see handshakeIO).
			busy = victim.phase == phaseHello
		}
	}
	l.conns[c] = struct{}{}
	pending := l.pending.len()
	l.mu.Unlock()
	if victim != nil {
		l.shedConn(victim, reason, busy, pending)
	}
	return c
}

// shedConn closes a connection admit displaced, after a busy verdict when its client
// may be waiting for one, and counts it. Its server goroutine then reads it as closed.
func (l *listener) shedConn(c *serverConn, reason string, busy bool, pending int) {
	if busy {
		var v [verdictLen]byte
		v[0] = verdictBusy
		c.Conn.SetWriteDeadline(time.Now().Add(busyWriteWait))
		c.Conn.Write(v[:])
	}
	c.Conn.Close()
	l.opts.Metrics.ConnRefused(l.purpose, reason)
	l.log.Warn().Str("remote", c.RemoteAddr().String()).Str("reason", reason).Int("pending", pending).
		Int("max_pending", l.opts.MaxPending).Int("max_pending_per_source", l.opts.MaxPendingPerSource).
		Msg("too many connections in their handshake; shed the oldest")
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
	if l.pending != nil {
		l.pending.remove(&c.pe)
	}
}

// wasShed says whether admit shed c.
func (l *listener) wasShed(c *serverConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return c.shed != ""
}

// advance records that c's handshake reached p; false when c was shed (it must then
// not go on: the shedder may have written a busy verdict).
func (l *listener) advance(c *serverConn, p phase) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.shed != "" {
		return false
	}
	c.phase = max(c.phase, p)
	return true
}

// claimVerdict is called before each handshake write: once c's answer arrived it takes
// c off the pending connections (no shedding from here on) unless it was shed already,
// then false.
func (l *listener) claimVerdict(c *serverConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.shed != "" {
		return false
	}
	if c.phase >= phaseAnswer {
		l.pending.remove(&c.pe)
	}
	return true
}

// handshakeDone records the end of c's handshake and returns its outcome: errShed for a
// connection shed meanwhile (counted when it was shed), whatever the handshake said.
func (l *listener) handshakeDone(c *serverConn, err error) error {
	l.mu.Lock()
	l.pending.remove(&c.pe)
	shed := c.shed != ""
	l.mu.Unlock()
	if shed {
		return errShed
	}
	if err == nil {
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		l.opts.Metrics.ConnTimeout(l.purpose, metrics.TimeoutAuth)
	} else {
		l.opts.Metrics.ConnRefused(l.purpose, metrics.RefuseAuth)
	}
	l.log.Warn().Str("remote", c.RemoteAddr().String()).Err(err).Msg("cluster authentication failed; connection closed")
	return err
}

// errShed is the handshake error of a connection admit shed.
var errShed = errors.New("shed: too many connections in their handshake")

// phase is how far a handshake got, as the shedder needs to know it.
type phase uint8

const (
	phaseAccepted phase = iota // nothing written yet
	phaseHello                 // the hello is out; the client's answer has not started
	phaseAnswer                // the client's answer is arriving: the server may write its verdict
)

// handshakeIO is what serverHandshake reads and writes: c's connection, recording the
// phase, and ending the handshake at its next read once c was shed.
type handshakeIO struct{ c *serverConn }

func (h handshakeIO) Write(b []byte) (int, error) {
	// The verdict (the write after the answer) is sent only by a connection that
	// still holds its slot, and from then on it cannot be shed: a client never reads
	// an OK verdict on a connection the shedder is closing.
	if !h.c.l.claimVerdict(h.c) {
		return 0, errShed
	}
	n, err := h.c.Conn.Write(b)
	if err == nil {
		h.c.l.advance(h.c, phaseHello)
	}
	return n, err
}

func (h handshakeIO) Read(b []byte) (int, error) {
	n, err := h.c.Conn.Read(b)
	if n > 0 && !h.c.l.advance(h.c, phaseAnswer) {
		return 0, errShed
	}
	return n, err
}

// serverConn runs the server side of the handshake before its first read or write
// passes through. Read deadlines the server sets before or during the handshake are
// applied once it is done.
type serverConn struct {
	net.Conn
	raw io.ReadWriter // Conn's reads and writes after the handshake (rawsock)
	l   *listener

	// Protected by l.mu:
	pe    pendingEntry // in l.pending while the handshake runs (secure listeners)
	phase phase
	shed  string // the reason admit shed it; "" while it was not

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
		if c.l.wasShed(c) { // closed by the shedder before it began
			c.hsErr = errShed
			return
		}
		c.mu.Lock()
		c.handshaking = true
		c.mu.Unlock()
		c.Conn.SetDeadline(time.Now().Add(c.l.opts.Timeout))
		role, err := serverRoleHandshake(handshakeIO{c}, c.l.secrets, c.l.purpose, c.Conn.LocalAddr().String(), c.l.opts.MasterCheck)
		if err = c.l.handshakeDone(c, err); err == nil && role == RoleMaster {
			markMaster(c) // for ConnRole (role.go); Close forgets it
		}
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
	n, err := c.raw.Read(b)
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
	return c.raw.Write(b)
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
	unmarkMaster(c)
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

// Handshake runs the server side of the handshake of c, a connection from Listener,
// unless it ran already (it otherwise runs in c's first Read or Write), and returns its
// error; nil for other connections and insecure listeners. A server that bounds its
// authenticated connections separately calls it first.
func Handshake(c net.Conn) error {
	if sc, ok := c.(*serverConn); ok {
		return sc.handshake()
	}
	return nil
}

// Writer returns what a server writes c's replies to once Handshake(c) succeeded: the
// connection under c (a *net.TCPConn from a TCP listener), so that net.Buffers can
// write a header and its data in one writev; c itself for other connections and before
// a successful handshake. Reads stay on c (it turns a draining connection's deadline
// into io.EOF).
func Writer(c net.Conn) net.Conn {
	if sc, ok := c.(*serverConn); ok && sc.handshake() == nil {
		return sc.Conn
	}
	return c
}
