package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
)

// Defaults of GuardOptions.
const (
	// keepGuardBuffer: a frame buffer larger than this is dropped after its frame
	// instead of being kept by the connection.
	keepGuardBuffer = 64 << 10
	// defaultGuardFrameTimeout bounds a frame from its first byte to its last.
	defaultGuardFrameTimeout = 10 * time.Second
)

// ErrGuardRefused is wrapped by the read error of a connection that GuardListener or
// GuardReader closed for a frame it would not pass on.
var ErrGuardRefused = errors.New("frame refused")

// GuardOptions tune GuardListener. Zero fields take the defaults.
type GuardOptions struct {
	// Socket names the port in logs and metrics ("master", "peer").
	Socket string
	// MaxFrame bounds one frame's body. Default MaxFrameBytes.
	MaxFrame int
	// FrameTimeout bounds a frame from its first byte to its last. Default 10s.
	FrameTimeout time.Duration
	// Budget bounds the memory of frames in progress, shared with the process's other
	// ports. Default: none (each frame is still bounded by MaxFrame).
	Budget *FrameBudget
	// Logger receives rate-limited warnings of refused frames. Default: none.
	Logger *zerolog.Logger
	// Metrics counts refusals (fluxkv_conn_refused_total{socket, reason="frame"|
	// "frame_memory"}) and frame timeouts. Default: none.
	Metrics *metrics.Metrics
}

func (o *GuardOptions) fill() {
	if o.MaxFrame <= 0 {
		o.MaxFrame = MaxFrameBytes
	}
	if o.FrameTimeout <= 0 {
		o.FrameTimeout = defaultGuardFrameTimeout
	}
}

// GuardListener wraps a Kitex server's listener (served with the gonet transport,
// which reads through the connections it returns) so that no byte of a request
// reaches the Kitex codec before its frame was checked: each connection must carry
// framed binary thrift (4-byte length, then the message), every frame at most
// MaxFrame bytes, its memory reserved from Budget, complete within FrameTimeout, and
// its message passing CheckMessage. Anything else closes the connection (counted and
// logged) before a byte of it is decoded. Kitex's own codecs would size slices by the
// counts a frame announces: one 40-byte frame announcing 2^31 elements would kill the
// process.
//
// A frame's budget is held until the server reads past it, that is, until its call
// was decoded and served.
func GuardListener(ln net.Listener, opts GuardOptions) net.Listener {
	opts.fill()
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = opts.Logger.With().Str("socket", opts.Socket).Logger().Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Second})
	}
	return &guardListener{Listener: ln, opts: opts, log: log}
}

type guardListener struct {
	net.Listener
	opts GuardOptions
	log  zerolog.Logger
}

func (l *guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c, l: l}, nil
}

// guardConn passes on one checked frame at a time. Only the serving goroutine reads;
// deadlines may be set from others.
type guardConn struct {
	net.Conn
	l *guardListener

	f checkedFrame

	mu       sync.Mutex // protects held, deadline
	held     int64      // budget reserved for the frame in f
	deadline time.Time  // the server's read deadline, applied between frames
}

// checkedFrame is the frame a guard passes on: its length prefix, then its body.
type checkedFrame struct {
	hdr  [4]byte
	pre  []byte // what is left of hdr
	rest []byte // what is left of the body
	buf  []byte // the body's storage, reused across frames
}

func (f *checkedFrame) empty() bool { return len(f.pre) == 0 && len(f.rest) == 0 }

func (f *checkedFrame) read(p []byte) int {
	n := copy(p, f.pre)
	f.pre = f.pre[n:]
	m := copy(p[n:], f.rest)
	f.rest = f.rest[m:]
	return n + m
}

// readBody reads a body of n bytes (the caller checked n) and checks its message.
func (f *checkedFrame) readBody(r io.Reader, n uint32) error {
	if cap(f.buf) > keepGuardBuffer {
		f.buf = nil
	}
	body, err := ReadFrameBody(r, f.buf, int(n))
	if err != nil {
		return err
	}
	f.buf = body
	if err := CheckMessage(body, ClusterMaxElems); err != nil {
		return fmt.Errorf("%w: %w", errBadMessage, err)
	}
	f.pre, f.rest = f.hdr[:], body
	return nil
}

// errBadMessage marks a body that CheckMessage refused (not a read error).
var errBadMessage = errors.New("malformed frame")

// Read returns bytes of the current checked frame, reading and checking the next one
// when it is used up.
func (c *guardConn) Read(p []byte) (int, error) {
	if c.f.empty() {
		c.release()
		if err := c.next(); err != nil {
			return 0, err
		}
	}
	return c.f.read(p), nil
}

// release gives back the budget of the frame passed on.
func (c *guardConn) release() {
	c.mu.Lock()
	held := c.held
	c.held = 0
	c.mu.Unlock()
	c.l.opts.Budget.Release(held)
}

// next reads and checks one frame into c.rest.
func (c *guardConn) next() error {
	hdr := c.f.hdr[:]
	// The first byte waits under the server's deadline (its idle timeout); from there
	// the frame must complete within FrameTimeout.
	if _, err := io.ReadFull(c.Conn, hdr[:1]); err != nil {
		return err
	}
	o := &c.l.opts
	frameDeadline := time.Now().Add(o.FrameTimeout)
	c.applyDeadline(frameDeadline)
	defer c.applyDeadline(time.Time{})
	if _, err := io.ReadFull(c.Conn, hdr[1:]); err != nil {
		return c.readFailed(err)
	}
	n := binary.BigEndian.Uint32(hdr)
	if n == 0 || uint64(n) > uint64(o.MaxFrame) {
		return c.refuse(metrics.RefuseFrame, fmt.Errorf("frame of %d bytes: not a framed thrift message of at most %d bytes", n, o.MaxFrame))
	}
	held, err := o.Budget.Reserve(int(n), frameDeadline)
	if err != nil {
		return c.refuse(metrics.RefuseFrameMemory, err)
	}
	c.mu.Lock()
	c.held = held
	c.mu.Unlock()
	if err := c.f.readBody(c.Conn, n); err != nil {
		if errors.Is(err, errBadMessage) {
			return c.refuse(metrics.RefuseFrame, err)
		}
		return c.readFailed(err)
	}
	return nil
}

// applyDeadline sets the connection's read deadline to the earlier of the server's and
// t (the zero t: the server's alone).
func (c *guardConn) applyDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.deadline
	if !t.IsZero() && (d.IsZero() || t.Before(d)) {
		d = t
	}
	c.Conn.SetReadDeadline(d)
}

// SetReadDeadline records the server's deadline and applies it.
func (c *guardConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline and SetWriteDeadline.
func (c *guardConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// Close gives back the budget of a frame not read to its end.
func (c *guardConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

func (c *guardConn) readFailed(err error) error {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.l.opts.Metrics.ConnTimeout(c.l.opts.Socket, metrics.TimeoutFrame)
		c.l.log.Warn().Str("remote", c.RemoteAddr().String()).Dur("frame_timeout", c.l.opts.FrameTimeout).
			Msg("partial frame not completed in time; connection closed")
		c.Conn.Close()
		return fmt.Errorf("partial frame: %w: %w", err, ErrGuardRefused)
	}
	return err
}

// refuse closes the connection for a frame that is not passed on.
func (c *guardConn) refuse(reason string, err error) error {
	c.l.opts.Metrics.ConnRefused(c.l.opts.Socket, reason)
	c.l.log.Warn().Str("remote", c.RemoteAddr().String()).Str("reason", reason).Err(err).
		Msg("frame refused before decoding; connection closed")
	c.Conn.Close()
	return fmt.Errorf("%w: %w", ErrGuardRefused, err)
}

// GuardReader checks the replies a Kitex client reads from r (framed binary thrift)
// the way GuardListener checks requests, without a budget: a reply answers a call of
// this process, so their number is bounded by its calls in flight. Deadlines are the
// connection's own. A frame that fails ends the stream with an error wrapping
// ErrGuardRefused.
func GuardReader(r io.Reader, maxFrame int) io.Reader {
	if maxFrame <= 0 {
		maxFrame = MaxFrameBytes
	}
	return &guardReader{r: r, max: maxFrame}
}

type guardReader struct {
	r   io.Reader
	max int
	f   checkedFrame
	err error // sticky
}

func (g *guardReader) Read(p []byte) (int, error) {
	if g.f.empty() {
		if g.err != nil {
			return 0, g.err
		}
		if err := g.next(); err != nil {
			return 0, err
		}
	}
	return g.f.read(p), nil
}

func (g *guardReader) next() error {
	hdr := g.f.hdr[:]
	if _, err := io.ReadFull(g.r, hdr); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr)
	if n == 0 || uint64(n) > uint64(g.max) {
		g.err = fmt.Errorf("%w: reply frame of %d bytes: not a framed thrift message of at most %d bytes", ErrGuardRefused, n, g.max)
		return g.err
	}
	if err := g.f.readBody(g.r, n); err != nil {
		if errors.Is(err, errBadMessage) {
			g.err = fmt.Errorf("%w: reply: %w", ErrGuardRefused, err)
			return g.err
		}
		return err
	}
	return nil
}
