package fluxkv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
)

// Sentinel errors; every error the owner returns matches one of them with errors.Is.
var (
	ErrKeyNotFound     = wire.ErrKeyNotFound
	ErrNoSpace         = wire.ErrNoSpace
	ErrInvalidArgument = wire.ErrInvalidArgument
	ErrAlreadyExists   = wire.ErrAlreadyExists
	ErrStaleGeneration = wire.ErrStaleGeneration
	ErrUnavailable     = wire.ErrUnavailable
	// ErrBusy and ErrInternal: the owner was too busy (BUSY), or failed in a way it did
	// not expect (INTERNAL: its message says how).
	ErrBusy     = wire.ErrBusy
	ErrInternal = wire.ErrInternal
	// ErrPermissionDenied: the owner does not admit this process (PERMISSION_DENIED),
	// or the socket's permissions refused the connect (EACCES).
	ErrPermissionDenied = wire.ErrPermissionDenied
	// ErrClosed: the client or the holder was closed or released.
	ErrClosed = errors.New("fluxkv: closed")
)

// How a call failed without an answer (both also match ErrUnavailable). The retry rules
// of protocol/external.thrift tell them apart: a request that was never sent may always
// be sent again; one whose reply was lost may have taken effect.
var (
	errNotSent = errors.New("request not sent")
	errNoReply = errors.New("request sent, no reply")
)

// Options configures a client.
type Options struct {
	// Socket is the owner's attach socket. Default: wire.DefaultSocket().
	Socket string
	// Name identifies this client in the owner's logs. Default: the program name.
	Name string
	// MaxIdleConns bounds pooled RPC connections. Default 16.
	MaxIdleConns int
	// Timeout bounds one call. Default 30s.
	Timeout time.Duration
	// ReleaseDelay is how long a released holder may wait to ride on the next call
	// before it is sent on its own (a call made while that send is in flight waits for
	// it). Default 2ms.
	ReleaseDelay time.Duration
}

func (o *Options) setDefaults() {
	if o.Socket == "" {
		o.Socket = wire.DefaultSocket()
	}
	if o.Name == "" {
		o.Name = filepath.Base(os.Args[0])
	}
	if o.MaxIdleConns == 0 {
		o.MaxIdleConns = 16
	}
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.ReleaseDelay == 0 {
		o.ReleaseDelay = 2 * time.Millisecond
	}
}

// attachment is one attach session with one owner incarnation: the attach connection
// (its close ends the session), the owner's reply, the mappings and the pooled RPC
// connections. Without isolation the segment is mapped twice, read-only (ro) and
// read-write for the put path (rw); an isolating owner (reply.Isolated) write-seals it,
// so it is mapped read-only only (rw is nil) and puts go through the session's put area.
type attachment struct {
	conn   *net.UnixConn
	reply  *external.AttachReply
	ro, rw *shm.Mapping
	area   *shm.Mapping // isolation: the put area, read-write; nil without
	// areaMu serializes the puts that use area, from the first byte written into it
	// until the PutWrite / PutEnd that copies it is answered.
	areaMu sync.Mutex
	// areaOwed (under areaMu), when set, resends a PutEnd, BatchPutEnd or PutWrite that
	// named the area and went unanswered on this live session: the owner may still copy
	// from the area, so no put writes it until that call is answered (settleArea).
	areaOwed func() error
	idle     chan *rpcConn
	// closed is set by close: a connection given back afterwards (a call that was in
	// flight) is closed instead of pooled.
	closed atomic.Bool
	// Under Client.mu: users counts what views the mappings besides the client itself
	// (live holders, puts writing into rw or area); retired: replaced by reattach, its
	// mappings are unmapped once users falls to 0; unmapped: they were.
	users    int
	retired  bool
	unmapped bool
	// Under Client.mu: endAtLastUse is set by a Close while users > 0 (holders, puts
	// writing): the last of them ends the session (closes the attach connection). Ended
	// at once, the owner would free their ranges and may place other values there, under
	// a holder's reads or a put's writes.
	endAtLastUse bool
}

// Client is an attached external. Safe for concurrent use. It follows the retry rules
// of protocol/external.thrift: when the owner restarts (STALE_GENERATION, or it closed
// the attach connection) the client attaches again by itself and retries the call once
// where that is safe, a lost reply of a retry-safe call is retried on a fresh
// connection, a lost PutEnd reply is retried on the same session (see PutWithID).
// Holders of a previous incarnation keep viewing their old mapping until released (the
// last one unmaps it, also after Close); their Release sends nothing.
type Client struct {
	opts Options

	hooks hooks // test instrumentation; zero in production
	stats stats

	mu       sync.Mutex // protects cur, old, releases, timerSet, relTimer, relFlights, relIdle, closed
	cur      *attachment
	old      []*attachment // previous incarnations still in use, unmapped by their last user
	releases []int64       // holder ids of cur waiting to ride on a call
	timerSet bool          // relTimer is armed
	relTimer *time.Timer   // sends releases no call carried within ReleaseDelay; reused
	// relFlights counts Flush's Release calls in flight; relIdle is closed when it falls
	// to 0. Every other call waits for them first (afterReleases): on another connection
	// such a call could reach the owner before the releases it follows, and plan room
	// (a put, a get's target) that those releases were about to free.
	relFlights int
	relIdle    chan struct{}
	// carrying holds a done channel per call in flight that carries releases (session):
	// Flush waits for those it finds (their releases reach the owner, or come back to
	// the queue), as the wire's rules ask of a call that depends on them.
	carrying map[chan struct{}]struct{}
	// requeues counts the calls that failed and gave the releases they carried back to
	// the queue (requeue): Flush looks again when one did while it waited.
	requeues   int64
	relBackoff time.Duration // grows while the release timer's Flush fails; 0 after a success
	closed     bool
	closing    atomic.Bool // set with closed: the check a call makes before it dials, lock-free
}

// Connect attaches to the owner at opts.Socket.
func Connect(opts Options) (*Client, error) {
	opts.setDefaults()
	if opts.MaxIdleConns < 0 || opts.Timeout < 0 || opts.ReleaseDelay < 0 {
		return nil, fmt.Errorf("%w: MaxIdleConns %d, Timeout %v and ReleaseDelay %v must not be negative",
			ErrInvalidArgument, opts.MaxIdleConns, opts.Timeout, opts.ReleaseDelay)
	}
	if n := len(opts.Socket); n == 0 || n > shm.MaxSocketPath {
		// connect(2) answers EINVAL, which says nothing of the path.
		return nil, fmt.Errorf("%w: socket path %q is %d bytes: a Unix socket path holds 1 to %d",
			ErrInvalidArgument, opts.Socket, n, shm.MaxSocketPath)
	}
	a, err := attach(opts)
	if err != nil {
		return nil, err
	}
	return &Client{opts: opts, cur: a}, nil
}

// attach runs the attach handshake and maps the segment.
func attach(opts Options) (*attachment, error) {
	c, err := net.DialTimeout("unix", opts.Socket, opts.Timeout)
	if errors.Is(err, syscall.EACCES) {
		return nil, fmt.Errorf("attach: %w", wire.ConnectDenied(opts.Socket, err))
	}
	if err != nil {
		return nil, fmt.Errorf("%w: attach %s: %v", ErrUnavailable, opts.Socket, err)
	}
	conn := c.(*net.UnixConn)
	hello := &external.AttachHello{ProtocolVersion: external.PROTOCOL_VERSION, Name: opts.Name, Pid: int32(os.Getpid())}
	conn.SetDeadline(time.Now().Add(opts.Timeout))
	// An owner that accepts and drops the connection (stopping, out of file descriptors)
	// or stalls is unavailable, as one that refuses the connect.
	if err := shm.WriteFrame(conn, thrift.FastMarshal(hello)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: attach hello to %s: %w", ErrUnavailable, opts.Socket, err)
	}
	body, fds, err := shm.RecvFrameWithFds(conn, wire.MaxAttachFrameBytes)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: attach reply from %s: %w", ErrUnavailable, opts.Socket, err)
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd) // the mappings stay valid
		}
	}()
	reply := &external.AttachReply{}
	if _, err := reply.FastRead(body); err != nil {
		conn.Close()
		return nil, fmt.Errorf("attach reply: %w", err)
	}
	if err := wire.FromResponse(reply.Code, reply.Message); err != nil {
		conn.Close()
		return nil, fmt.Errorf("attach: %w", err)
	}
	a, err := mapAttachment(reply, fds)
	if err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	a.conn, a.idle = conn, make(chan *rpcConn, opts.MaxIdleConns)
	return a, nil
}

// mapAttachment maps what an attach reply carried: the segment (fds[0]), read-only and,
// without isolation, read-write; under isolation the put area (fds[1]) read-write.
func mapAttachment(reply *external.AttachReply, fds []int) (*attachment, error) {
	want := 1
	if reply.Isolated {
		want = 2
	}
	if len(fds) != want {
		return nil, fmt.Errorf("attach: the reply carried %d fds, want %d (isolated=%t)", len(fds), want, reply.Isolated)
	}
	ro, err := shm.MapFd(fds[0], reply.SegmentSize, false)
	if err != nil {
		return nil, fmt.Errorf("map segment: %w", err)
	}
	a := &attachment{reply: reply, ro: ro}
	if reply.Isolated {
		a.area, err = shm.MapFd(fds[1], reply.PutAreaSize, true)
	} else {
		a.rw, err = shm.MapFd(fds[0], reply.SegmentSize, true)
	}
	if err != nil {
		ro.Close()
		return nil, fmt.Errorf("map segment or put area: %w", err)
	}
	return a, nil
}

// close drops the session and the pooled connections; unmap only when no holder can
// view the mapping any more.
func (a *attachment) close(unmap bool) {
	a.closed.Store(true)
	a.drainIdle()
	a.conn.Close()
	if unmap {
		a.unmap()
	}
}

// drainIdle closes the pooled connections.
func (a *attachment) drainIdle() {
	for {
		select {
		case rc := <-a.idle:
			rc.close()
			continue
		default:
		}
		return
	}
}

// unmap unmaps the segment and the put area.
func (a *attachment) unmap() {
	for _, m := range []*shm.Mapping{a.rw, a.area, a.ro} {
		if m != nil {
			m.Close()
		}
	}
}

// use counts a user of a's mappings (a holder, a put writing into them); false when
// they are gone (a was retired by reattach and had no user left) or the client is
// closed.
func (c *Client) use(a *attachment) bool { return c.useIf(a, false) }

// useLive is use for a put about to write into a's mappings: false also when a was
// retired (its session, and the put, are gone: the write would be wasted, and its
// PutEnd refused).
func (c *Client) useLive(a *attachment) bool { return c.useIf(a, true) }

func (c *Client) useIf(a *attachment, live bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a.unmapped || c.closed || (live && a.retired) {
		return false
	}
	a.users++
	return true
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// inSegment reports whether [off, off+n) lies in a segment of size bytes (no overflow:
// the owner's answers are checked before the client slices its mapping with them).
func inSegment(off, n, size int64) bool {
	return off >= 0 && n >= 0 && off <= size && n <= size-off
}

// unuse ends a use; the last user of a retired attachment unmaps it, and ends its
// session when Close left that to it.
func (c *Client) unuse(a *attachment) {
	c.mu.Lock()
	a.users--
	drop := a.retired && a.users == 0 && !a.unmapped
	if drop {
		a.unmapped = true
		c.old = slices.DeleteFunc(c.old, func(x *attachment) bool { return x == a })
	}
	end := a.endAtLastUse && a.users == 0
	if end {
		a.endAtLastUse = false
	}
	c.mu.Unlock()
	if end {
		a.close(false)
	}
	if drop {
		a.unmap()
	}
}

func (c *Client) current() *attachment {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur
}

// NodeID is the owner's node id; Generation its incarnation; SegmentSize the mapping size.
func (c *Client) NodeID() string     { return c.current().reply.NodeId }
func (c *Client) Generation() int64  { return c.current().reply.OwnerGeneration }
func (c *Client) SegmentSize() int64 { return c.current().reply.SegmentSize }
func (c *Client) ClientID() int64    { return c.current().reply.ClientId }

// Segment is the current mapping of the owner's segment, read-only. It stays mapped
// only while this attachment does: a re-attach (after the owner restarted, or the
// session was lost) or Close unmaps it once nothing uses it (an open holder of it, a
// put in flight), and reading the slice after that faults. Read values through holders
// (Holder.Bytes), which keep their mapping; Segment is for checks such as whether a
// holder views shared memory.
func (c *Client) Segment() []byte { return c.current().ro.Bytes() }

func (c *Client) Options() Options { return c.opts }

// Isolated reports whether the owner isolates its clients (docs/architecture.md §11): the segment is
// mapped read-only only and puts go through the session's put area.
func (c *Client) Isolated() bool { return c.current().reply.Isolated }

// PutAreaSize is the session's put area size under isolation (0 without): values up to
// it are copied once into the area, larger ones streamed through it.
func (c *Client) PutAreaSize() int64 { return c.current().reply.PutAreaSize }

// SessionToken is the session's secret; with ClientID and Generation it lets callers
// build raw requests for Call.
func (c *Client) SessionToken() int64 { return c.current().reply.SessionToken }

// Close sends pending releases, ends the session and unmaps the segment once nothing
// uses it: a put whose fill runs on another goroutine, or a holder still open, keeps
// the session and the mapping until it ends (a holder's Release; the put fails
// ErrClosed), so the owner keeps their bytes; calls made after Close fail.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	c.Flush()
	c.mu.Lock()
	c.closed = true
	c.closing.Store(true)
	if c.relTimer != nil {
		c.relTimer.Stop()
	}
	all := append(slices.Clone(c.old), c.cur) // a copy: unuse edits c.old
	var drop, end []*attachment
	for _, a := range all {
		a.retired = true // unmapped by its last user from now on
		if a.users == 0 && !a.unmapped {
			a.unmapped = true
			drop = append(drop, a)
		}
		if a.users > 0 {
			a.endAtLastUse = true // ended by its last holder or put (unuse)
		} else {
			end = append(end, a)
		}
	}
	c.mu.Unlock()
	for _, a := range end {
		a.close(false)
	}
	for _, a := range drop {
		a.unmap()
	}
	return nil
}

// alive reports whether the owner still holds the attach connection open: false once it
// closed it (it exited, restarted or ended the session), which ends the session.
func (a *attachment) alive() bool {
	raw, err := a.conn.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, rerr := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		alive = rerr == unix.EAGAIN || (rerr == nil && n > 0)
		return true
	})
	return err == nil && alive
}

// reattach replaces the attachment a with a new one when its session is gone: the
// owner behind the socket is a new incarnation, or it closed a's attach connection
// (closing the old session costs nothing then), unless another goroutine already did.
func (c *Client) reattach(a *attachment) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.cur != a {
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	n, err := attach(c.opts)
	if err != nil {
		return err
	}
	if n.reply.OwnerGeneration == a.reply.OwnerGeneration && a.alive() {
		// The same incarnation (a transient failure): keep the session and its holders.
		n.close(true)
		return nil
	}
	c.mu.Lock()
	if c.cur != a || c.closed {
		c.mu.Unlock()
		n.close(true)
		return nil
	}
	a.close(false) // holders may still view its mapping
	a.retired = true
	unmap := a.users == 0
	if unmap {
		a.unmapped = true // nothing views it: the dead owner's segment can go now
	} else {
		c.old = append(c.old, a) // unmapped by its last user
	}
	c.cur = n
	c.releases = nil // the old owner's holders are gone with it
	c.mu.Unlock()
	if unmap {
		a.unmap()
	}
	return nil
}

// session fills rc's Session for a request on attachment a, carrying up to
// wire.MaxReleasesPerCall of the releases queued so far when a is current. The Session
// and its releases live in rc (reused from call to call): they are valid until rc's next
// call. ErrClosed once the client is closed.
func (c *Client) session(a *attachment, rc *rpcConn) (*external.Session, error) {
	rel := rc.rel[:0]
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	rc.carrying = nil
	if a == c.cur && len(c.releases) > 0 {
		rc.carrying = make(chan struct{})
		if c.carrying == nil {
			c.carrying = make(map[chan struct{}]struct{})
		}
		c.carrying[rc.carrying] = struct{}{}
		k := min(len(c.releases), wire.MaxReleasesPerCall)
		rel = append(rel, c.releases[:k]...)
		if k == len(c.releases) && cap(c.releases) <= wire.MaxReleasesPerCall {
			c.releases = c.releases[:0] // keep the backing array: the next release reuses it
		} else if k == len(c.releases) {
			c.releases = nil
		} else {
			c.releases = c.releases[k:]
		}
	}
	c.mu.Unlock()
	rc.rel = rel
	r := a.reply
	rc.sess = external.Session{ClientId: r.ClientId, SessionToken: r.SessionToken,
		OwnerGeneration: r.OwnerGeneration, Releases: rel}
	if len(rel) == 0 {
		rc.sess.Releases = nil
	}
	return &rc.sess, nil
}

// carried ends a call that carried releases (session's done channel; nil: none).
func (c *Client) carried(done chan struct{}) {
	if done == nil {
		return
	}
	c.mu.Lock()
	delete(c.carrying, done)
	c.mu.Unlock()
	close(done)
}

// requeue puts back releases of a request that never reached the owner.
func (c *Client) requeue(s *external.Session, a *attachment) {
	if len(s.Releases) == 0 {
		return
	}
	c.mu.Lock()
	if c.cur == a {
		// A copy: s.Releases is the connection's buffer.
		c.releases = append(append(make([]int64, 0, len(s.Releases)+len(c.releases)), s.Releases...), c.releases...)
		c.requeues++
		c.armReleaseLocked(c.releaseRetryDelayLocked()) // sent again on their own, not only with a later call
	}
	c.mu.Unlock()
}

// Call sends one raw ExternalService call (method name, generated Args and Result
// structs) on the current attachment. It bypasses every client-side check: tests use
// it to send bad requests.
func (c *Client) Call(method string, args, result thrift.FastCodec) error {
	return c.callOn(c.current(), method, args, result)
}

func (c *Client) callOn(a *attachment, method string, args, result thrift.FastCodec) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	rc, err := c.conn(a)
	if err != nil {
		return err
	}
	return c.exchange(a, rc, method, args, result)
}

// conn takes one of a's pooled RPC connections, or dials a new one.
func (c *Client) conn(a *attachment) (*rpcConn, error) {
	select {
	case rc := <-a.idle:
		return rc, nil
	default:
	}
	rc, err := dialRPC(a.reply.RpcSocket, c.opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("%w: %w: dial %s: %v", ErrUnavailable, errNotSent, a.reply.RpcSocket, err)
	}
	return rc, nil
}

// exchange runs one call on rc, then gives rc back to a's pool, or closes it after a
// failure.
func (c *Client) exchange(a *attachment, rc *rpcConn, method string, args, result thrift.FastCodec) error {
	c.hooks.sent(method, args)
	if err := rc.call(method, args, result, c.opts.Timeout, c.hooks.dropReply); err != nil {
		rc.close()
		var ex *thrift.ApplicationException
		if errors.As(err, &ex) {
			return fmt.Errorf("%s: %w", method, err)
		}
		if errors.Is(err, ErrInvalidArgument) { // a request over a frame: not sent, not to retry
			return fmt.Errorf("%s: %w", method, err)
		}
		if errors.Is(err, errNotSent) {
			return fmt.Errorf("%w: %s: %w", ErrUnavailable, method, err) // keeps errNotSent for invoke's retry
		}
		return fmt.Errorf("%w: %w: %s: %v", ErrUnavailable, errNoReply, method, err)
	}
	if c.hooks.onReply != nil {
		c.hooks.onReply(method, result)
	}
	a.putIdle(rc)
	return nil
}

// putIdle gives rc back to the pool, or closes it when the pool is full.
func (a *attachment) putIdle(rc *rpcConn) {
	if a.closed.Load() {
		rc.close()
		return
	}
	select {
	case a.idle <- rc:
	default:
		rc.close()
	}
	if a.closed.Load() { // close ran meanwhile and may have drained before our send
		a.drainIdle()
	}
}

// coded is any response with a (code, message) pair.
type coded interface {
	GetCode() common.ErrorCode
	GetMessage() string
}

// resultOf is a generated Result struct whose Success is a response with a code.
type resultOf[R coded] interface {
	thrift.FastCodec
	GetSuccess() R
	IsSetSuccess() bool
}

// retryRule says when a call may be sent again (protocol/external.thrift states the
// rules; PutEnd's own rule, retry on the same session, is run by the put code).
type retryRule int

const (
	// retryNever: Release; its ids ride on a later call instead.
	retryNever retryRule = iota
	// retryUnsent: PutStart. Sent again when the request never left, or when the session
	// is gone (its end revoked any put a lost reply started), never after a lost reply on
	// a live session.
	retryUnsent
	// retryAlways: Get, BatchGet, Exists, BatchExists, Stat, Delete, BatchDelete,
	// PutAbort, BatchPutAbort, DeleteNamespace, NamespaceStat: once more after any
	// transport error or STALE_GENERATION.
	retryAlways
)

// call describes one typed ExternalService call: args builds the request around the
// session; retry says when it may be sent again.
type call struct {
	method string
	args   func(s *external.Session) thrift.FastCodec
	// req, when set, builds the request instead of args, without a closure to allocate
	// (Get's pooled getCall).
	req   sessionRequest
	retry retryRule
}

// sessionRequest is a request that takes its Session when it is sent.
type sessionRequest interface {
	withSession(s *external.Session) thrift.FastCodec
}

func (k *call) build(s *external.Session) thrift.FastCodec {
	if k.req != nil {
		return k.req.withSession(s)
	}
	return k.args(s)
}

// invokeOn runs a call on attachment a and maps the response code to an error.
// Transport failures give the session's releases back.
func invokeOn[R coded](c *Client, a *attachment, k call, res resultOf[R]) (R, error) {
	var zero R
	if c.closing.Load() {
		return zero, ErrClosed
	}
	rc, err := c.conn(a)
	if err != nil {
		return zero, err
	}
	if k.method != releaseMethod {
		c.afterReleases()
	}
	s, err := c.session(a, rc)
	if err != nil {
		rc.close()
		return zero, err
	}
	carrying := rc.carrying // (rc goes back to the pool in exchange)
	err = c.exchange(a, rc, k.method, k.build(s), res)
	if err != nil {
		c.requeue(s, a) // the owner may not have seen them: a repeated release is harmless
	}
	c.carried(carrying)
	if err != nil {
		return zero, err
	}
	if !res.IsSetSuccess() {
		return zero, fmt.Errorf("%w: %s: reply without a result", ErrUnavailable, k.method)
	}
	r := res.GetSuccess()
	if err := wire.FromResponse(r.GetCode(), r.GetMessage()); err != nil {
		return r, err
	}
	return r, nil
}

// invoke runs a call on the current attachment, retrying it once as k.retry allows: a
// STALE_GENERATION answer or a closed attach connection first re-attaches (the owner
// restarted), a lost connection to a live session retries on a fresh one.
func invoke[R coded](c *Client, k call, res resultOf[R]) (R, *attachment, error) {
	for attempt := 0; ; attempt++ {
		a := c.current()
		r, err := invokeOn(c, a, k, res)
		if err == nil || attempt > 0 || k.retry == retryNever {
			return r, a, err
		}
		stale := errors.Is(err, ErrStaleGeneration)
		lost := errors.Is(err, errNotSent) || errors.Is(err, errNoReply)
		if !stale && !lost {
			return r, a, err // an answer, or ErrClosed
		}
		gone := stale || !a.alive()
		if !gone && k.retry == retryUnsent && errors.Is(err, errNoReply) {
			return r, a, err
		}
		if gone {
			if rerr := c.reattach(a); rerr != nil {
				return r, a, fmt.Errorf("%w (attaching again: %v)", err, rerr)
			}
		}
		c.stats.retries.Add(1)
	}
}
