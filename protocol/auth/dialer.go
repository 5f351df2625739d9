package auth

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cloudwego/gopkg/bufiox"
	"github.com/cloudwego/kitex/pkg/remote"

	"github.com/fluxkv/fluxkv/internal/rawsock"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// minHelloWait is the shortest wait for a server's hello, whatever the dial timeout.
const minHelloWait = 500 * time.Millisecond

// Dialer is the client side of Listener: a Kitex remote.Dialer (client.WithDialer,
// with the gonet client transport) whose connections are authenticated before
// Kitex writes a call on them.
type Dialer struct {
	secrets *Secrets // nil: insecure
	purpose string
	master  *masterProof // nil: a member's connections (NewMasterDialer sets it)
	bound   *callBound   // nil: Kitex bounds the calls (BoundCalls sets it, bound.go)
}

var _ remote.Dialer = (*Dialer)(nil)

// NewDialer returns a dialer that authenticates with s for purpose; a nil s runs
// without authentication and fails clearly against a server that requires it.
// A handshake may take up to 5s after the connection is made; the server's hello must
// come within the dial timeout (at least 500ms).
func NewDialer(s *Secrets, purpose string) *Dialer {
	checkPurpose(purpose)
	return &Dialer{secrets: s, purpose: purpose}
}

// DialTimeout connects to address within timeout (TCP_NODELAY) and authenticates.
func (d *Dialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	raw, err := net.DialTimeout(network, address, timeout)
	if err != nil {
		return nil, err
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	var rd io.Reader = rawsock.New(raw)
	if d.secrets == nil {
		rd = &insecureReader{r: rd, addr: address}
	} else if err := clientHandshakeConn(raw, d.secrets, d.purpose, address, timeout, d.master); err != nil {
		raw.Close()
		return nil, err
	}
	c := newClientConn(raw, rd, d.bound)
	if d.bound != nil {
		if err := d.bound.add(c); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// ClientHandshake authenticates an established connection to address as a client for
// purpose, for protocols of fluxkv's own on a plain connection (the data plane); a nil
// s does nothing. The server's hello must come within helloWait (at least 500ms), the
// rest of the handshake within 5s. The connection's deadline is cleared on success; on
// failure the caller closes it.
func ClientHandshake(conn net.Conn, s *Secrets, purpose, address string, helloWait time.Duration) error {
	return clientHandshakeConn(conn, s, purpose, address, helloWait, nil)
}

// clientHandshakeConn is ClientHandshake, proving a master with master set.
func clientHandshakeConn(conn net.Conn, s *Secrets, purpose, address string, helloWait time.Duration, master *masterProof) error {
	checkPurpose(purpose)
	if s == nil {
		return nil
	}
	// An authenticating server sends its hello as soon as it accepts, so a short wait
	// for it tells an insecure server quickly (Kitex retries a failed dial several
	// times within one call's timeout); the rest of the handshake has defaultLimit.
	start := time.Now()
	conn.SetDeadline(start.Add(min(max(helloWait, minHelloWait), defaultLimit)))
	serverNonce, err := readHello(conn, purpose, address)
	if err == nil {
		conn.SetDeadline(start.Add(defaultLimit))
		err = answerHello(conn, s, purpose, address, serverNonce, master)
	}
	if err != nil {
		return err
	}
	conn.SetDeadline(time.Time{})
	return nil
}

// insecureReader is an unauthenticated client's read side: a server that requires
// authentication speaks first with its hello, which no thrift reply starts with (as
// a framed length its first byte "F" means over 1 GiB), so the first byte tells.
type insecureReader struct {
	r       io.Reader
	addr    string
	checked bool
}

func (r *insecureReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if !r.checked && n > 0 {
		r.checked = true
		if b[0] == magic[0] {
			return 0, fmt.Errorf("%w: %s requires cluster authentication and this node runs with --insecure-cluster: give it --cluster-secret-file", ErrAuthFailed, r.addr)
		}
	}
	return n, err
}

// clientConn is what Kitex's gonet client transport expects of a connection:
// buffered readers and writers (bufiox) over it, and a liveness check for the pool.
type clientConn struct {
	net.Conn
	r      *bufiox.DefaultReader
	w      *bufiox.DefaultWriter
	bound  *callBound // nil: Kitex bounds the calls
	closed atomic.Bool
}

var (
	_ remote.IsActive = (*clientConn)(nil)
	// errConnClosed is what a second Close returns, as Kitex's own connections do.
	errConnClosed = errors.New("connection has been closed")
)

func newClientConn(conn net.Conn, rd io.Reader, bound *callBound) *clientConn {
	// Replies are checked before Kitex decodes them, like the calls servers read.
	c := &clientConn{Conn: conn, r: bufiox.NewDefaultReader(wire.GuardReader(rd, 0)), bound: bound}
	if bound != nil {
		// (The calls to the master: raw writes, see rawsock. An unbound client writes to
		// conn itself, whose requests of several buffers go out in one writev.)
		c.w = bufiox.NewDefaultWriter(boundWriter{conn: conn, w: rawsock.New(conn), timeout: bound.timeout})
	} else {
		c.w = bufiox.NewDefaultWriter(conn)
	}
	return c
}

// SetReadDeadline is how Kitex bounds the read of a reply, before it starts: with the
// call's RPC timeout, or none (the zero time). A bound connection reads a reply with no
// timeout of Kitex's within its own bound.
func (c *clientConn) SetReadDeadline(t time.Time) error {
	if t.IsZero() && c.bound != nil {
		t = time.Now().Add(c.bound.timeout)
	}
	return c.Conn.SetReadDeadline(t)
}

// Reader and Writer are the buffered sides Kitex's gonet transport reads and writes through.
func (c *clientConn) Reader() *bufiox.DefaultReader { return c.r }
func (c *clientConn) Writer() *bufiox.DefaultWriter { return c.w }

func (c *clientConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *clientConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		if c.bound != nil {
			c.bound.remove(c)
		}
		c.r.Release(nil)
		return c.Conn.Close()
	}
	return errConnClosed
}

// IsActive reports whether the pooled connection may carry another call: not closed
// here, and not closed, reset or unexpectedly written to by the server (a peek that
// does not block). A master that restarted then costs a reconnect, not a failed call.
func (c *clientConn) IsActive() bool {
	if c.closed.Load() {
		return false
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	// The read deadline of the connection's last call (Kitex's RPC timeout, or the
	// bound) may have passed while it idled: the poller would refuse the peek without
	// running it. Nothing reads an idle connection, and Kitex sets the deadline again
	// before it reads the next reply.
	if err := c.Conn.SetReadDeadline(time.Time{}); err != nil {
		return false
	}
	active := true
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case n == 0 && err == nil: // orderly shutdown by the server
			active = false
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK: // idle: the expected state
		case err != nil:
			active = false
		default: // bytes nobody asked for: the stream is out of step
			active = false
		}
		return true
	})
	return active && err == nil // err: closed here (a cut dialer) or the peek refused
}
