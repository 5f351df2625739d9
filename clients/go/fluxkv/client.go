package fluxkv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
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
	// ErrClosed: the client or the holder was closed or released.
	ErrClosed = errors.New("fluxkv: closed")
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
	// before it is sent on its own. Default 2ms.
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

// Client is an attached external. Safe for concurrent use.
type Client struct {
	opts   Options
	attach *net.UnixConn
	reply  *external.AttachReply
	ro, rw *shm.Mapping

	idle chan *rpcConn

	mu       sync.Mutex // protects releases, closed, timerSet
	releases []int64
	timerSet bool
	closed   bool
}

// Connect attaches to the owner at opts.Socket.
func Connect(opts Options) (*Client, error) {
	opts.setDefaults()
	c, err := net.DialTimeout("unix", opts.Socket, opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", opts.Socket, err)
	}
	conn := c.(*net.UnixConn)
	hello := &external.AttachHello{ProtocolVersion: external.PROTOCOL_VERSION, Name: opts.Name, Pid: int32(os.Getpid())}
	conn.SetDeadline(time.Now().Add(opts.Timeout))
	if err := shm.WriteFrame(conn, thrift.FastMarshal(hello)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("attach hello: %w", err)
	}
	body, fd, err := shm.RecvFrameWithFd(conn, shm.MaxFrame)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("attach reply: %w", err)
	}
	reply := &external.AttachReply{}
	if _, err := reply.FastRead(body); err != nil {
		unixClose(fd)
		conn.Close()
		return nil, fmt.Errorf("attach reply: %w", err)
	}
	if err := wire.FromResponse(reply.Code, reply.Message); err != nil {
		unixClose(fd)
		conn.Close()
		return nil, fmt.Errorf("attach: %w", err)
	}
	if fd < 0 {
		conn.Close()
		return nil, fmt.Errorf("attach: the owner sent no segment fd")
	}
	defer unixClose(fd)
	conn.SetDeadline(time.Time{})
	ro, err := shm.MapFd(fd, reply.SegmentSize, false)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("map segment: %w", err)
	}
	rw, err := shm.MapFd(fd, reply.SegmentSize, true)
	if err != nil {
		ro.Close()
		conn.Close()
		return nil, fmt.Errorf("map segment: %w", err)
	}
	return &Client{opts: opts, attach: conn, reply: reply, ro: ro, rw: rw,
		idle: make(chan *rpcConn, opts.MaxIdleConns)}, nil
}

func unixClose(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// NodeID is the owner's node id; Generation its incarnation; SegmentSize the mapping size.
func (c *Client) NodeID() string     { return c.reply.NodeId }
func (c *Client) Generation() int64  { return c.reply.OwnerGeneration }
func (c *Client) SegmentSize() int64 { return c.reply.SegmentSize }
func (c *Client) ClientID() int64    { return c.reply.ClientId }
func (c *Client) Segment() []byte    { return c.ro.Bytes() }
func (c *Client) Options() Options   { return c.opts }

// SessionToken is the session's secret; with ClientID and Generation it lets callers
// build raw requests for Call.
func (c *Client) SessionToken() int64 { return c.reply.SessionToken }

// Close sends pending releases, closes connections and unmaps the segment. Holders
// still open become invalid: their Bytes must not be used after Close.
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
	c.mu.Unlock()
	for {
		select {
		case rc := <-c.idle:
			rc.close()
			continue
		default:
		}
		break
	}
	c.attach.Close()
	c.rw.Close()
	return c.ro.Close()
}

// session builds the Session of a request, carrying the releases queued so far.
func (c *Client) session() *external.Session {
	c.mu.Lock()
	rel := c.releases
	c.releases = nil
	c.mu.Unlock()
	return &external.Session{ClientId: c.reply.ClientId, SessionToken: c.reply.SessionToken,
		OwnerGeneration: c.reply.OwnerGeneration, Releases: rel}
}

// requeue puts back releases of a request that never reached the owner.
func (c *Client) requeue(s *external.Session) {
	if len(s.Releases) == 0 {
		return
	}
	c.mu.Lock()
	c.releases = append(c.releases, s.Releases...)
	c.mu.Unlock()
}

// Call sends one raw ExternalService call (method name, generated Args and Result
// structs). It bypasses every client-side check: tests use it to send bad requests.
func (c *Client) Call(method string, args, result thrift.FastCodec) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	var rc *rpcConn
	select {
	case rc = <-c.idle:
	default:
		var err error
		rc, err = dialRPC(c.reply.RpcSocket, c.opts.Timeout)
		if err != nil {
			return fmt.Errorf("%w: dial %s: %v", ErrUnavailable, c.reply.RpcSocket, err)
		}
	}
	if err := rc.call(method, args, result, c.opts.Timeout); err != nil {
		rc.close()
		var ex *thrift.ApplicationException
		if errors.As(err, &ex) {
			return fmt.Errorf("%s: %w", method, err)
		}
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, method, err)
	}
	select {
	case c.idle <- rc:
	default:
		rc.close()
	}
	return nil
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

// invoke runs one call whose request carries s and maps the response code to an error;
// transport failures give s's releases back for the next call.
func invoke[R coded](c *Client, method string, s *external.Session, args thrift.FastCodec, res resultOf[R]) (R, error) {
	var zero R
	if err := c.Call(method, args, res); err != nil {
		c.requeue(s)
		return zero, err
	}
	if !res.IsSetSuccess() {
		return zero, fmt.Errorf("%w: %s: reply without a result", ErrUnavailable, method)
	}
	r := res.GetSuccess()
	return r, wire.FromResponse(r.GetCode(), r.GetMessage())
}
