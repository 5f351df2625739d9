package daemon

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/cloudwego/kitex/pkg/serviceinfo"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/internal/rawsock"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
)

// Per-connection buffers of the RPC server.
const (
	// connReadBuffer is the bufio size per connection: a get request is ~100 bytes, and
	// an idle connection should cost little (large frames bypass it).
	connReadBuffer = 8 << 10
	// keepBuffer: a frame or reply buffer larger than this is dropped after its call
	// instead of being kept by the connection.
	keepBuffer = 64 << 10
)

// framedServer serves one thrift service as framed binary thrift on a Unix socket,
// dispatching through the Kitex-generated method table and codecs. It exists because
// the external hot path cannot afford Kitex's server stack on this socket (docs/architecture.md §3:
// measured, see the README): a get is one read, one handler call and one write.
//
// A frame that cannot be parsed closes that connection only, after a
// TApplicationException when the message header parsed; an unknown method gets a
// TApplicationException and the connection stays. Input is bounded: frames over
// wire.MaxFrameBytes close the connection, a frame's buffer grows as its bytes arrive,
// a frame once begun must complete within FrameTimeout, and a connection that names no
// live session is closed after IdleTimeout idle.
type framedServer struct {
	acc     *acceptor
	svc     *serviceinfo.ServiceInfo
	handler any
	log     zerolog.Logger
	metrics *metrics.Metrics // nil: no metrics
	limits  connLimits
	uids    *uidFrames     // bounded uids' shares of limits.Budget (nil: none)
	wg      sync.WaitGroup // the accept loop
}

// connLimits are the RPC socket's bounds (from Options).
type connLimits struct {
	MaxConns     int
	FrameTimeout time.Duration
	IdleTimeout  time.Duration
	// Live reports whether a client id is an attached session; nil: none is.
	Live func(clientID int64) bool
	// Budget bounds the memory of frames in progress (the owner's RPC socket has its own,
	// apart from the peer port's); nil:
	// each frame is bounded by wire.MaxFrameBytes alone.
	Budget *wire.FrameBudget
	// UIDShare is Options.UIDShare: a bounded uid's share of the connection cap and of
	// Budget (uidshare.go); ≥ 1: none.
	UIDShare float64
	// Lost takes back what a reply the client never read handed out (lostreply.go); nil:
	// nothing is taken back.
	Lost func(g grant)
}

// connState is what the server knows about one connection across calls: the client id
// its last successful session check named (0: none), and what its last reply granted
// until the client shows it read that reply (its next request). The handler fills
// them through the call's context (setConnClient, grantHolder, grantPut); only the
// connection's goroutine touches it.
type connState struct {
	client int64
	sent   grant
}

func listenFramed(path string, mode os.FileMode, svc *serviceinfo.ServiceInfo, handler any, log zerolog.Logger, m *metrics.Metrics, lim connLimits) (*framedServer, error) {
	ln, err := shm.ListenUnix(path, mode)
	if err != nil {
		return nil, err
	}
	s := &framedServer{svc: svc, handler: handler, log: log, metrics: m, limits: lim}
	if lim.Budget != nil {
		s.uids = newUIDFrames(lim.Budget.Limit(), lim.UIDShare)
	}
	s.acc = newAcceptor(ln, socketRPC, lim.MaxConns, lim.UIDShare, log, m, s.serve, nil)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.acc.run()
	}()
	return s, nil
}

func (s *framedServer) serve(conn *net.UnixConn, uid uint32) {
	own := s.uids.open(uid)
	defer s.uids.close(uid)
	err := s.serveConn(conn, uid, own)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, errConnDone) {
		s.log.Debug().Err(err).Msg("rpc connection closed")
	}
}

// errConnDone ends a connection whose closing was already counted and logged.
var errConnDone = errors.New("connection closed by the server")

// serveConn serves conn, whose peer is uid; own is the uid's frame budget (nil: it has
// none apart from the socket's).
func (s *framedServer) serveConn(conn *net.UnixConn, uid uint32, own *wire.FrameBudget) error {
	rs := rawsock.New(conn) // (no sysmon wake-up per call: see the package)
	r := bufio.NewReaderSize(rs, connReadBuffer)
	st := &connState{}
	var buf, out []byte
	for {
		if err := s.awaitFrame(conn, r, st); err != nil {
			if errors.Is(err, syscall.ECONNRESET) {
				// The client closed the connection with unread bytes: the last reply.
				s.replyLost(st)
			}
			return err
		}
		st.sent.reset() // a client sends its next request once it read the last reply
		// The frame has begun: the rest must follow within FrameTimeout, unless it is
		// already buffered (then no deadline is needed: the common small request).
		if !frameBuffered(r) {
			conn.SetReadDeadline(time.Now().Add(s.limits.FrameTimeout))
		}
		var hdr [4]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return s.readFailed(err)
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 || uint64(n)+4 > uint64(wire.MaxFrameBytes) {
			s.acc.refused(metrics.RefuseFrame, "rpc frame refused", func(e *zerolog.Event) { e.Uint32("bytes", n) })
			return fmt.Errorf("frame of %d bytes: not a framed thrift request of at most %d bytes: %w", n, wire.MaxFrameBytes, errConnDone)
		}
		// Large frames reserve their memory from the owner's budget first (and the uid's
		// share of it before): a frame that finds no room within FrameTimeout is refused
		// with the budget's message.
		held, err := reserveFrame(uid, own, s.limits.Budget, int(n), time.Now().Add(s.limits.FrameTimeout))
		if err != nil {
			s.acc.refused(metrics.RefuseFrameMemory, "rpc frame refused", func(e *zerolog.Event) { e.Uint32("bytes", n).Err(err) })
			ex := thrift.NewApplicationException(thrift.INTERNAL_ERROR, err.Error())
			conn.SetWriteDeadline(time.Now().Add(s.limits.FrameTimeout))
			conn.Write(appendFrame(nil, exceptionMsg("", 0, ex)))
			return fmt.Errorf("%w: %w", err, errConnDone)
		}
		buf, err = wire.ReadFrameBody(r, buf, int(n))
		if err != nil {
			releaseFrame(own, s.limits.Budget, held)
			return s.readFailed(err)
		}
		method, typ, seq, off, err := thrift.Binary.ReadMessageBegin(buf)
		if err != nil {
			releaseFrame(own, s.limits.Budget, held)
			s.acc.refused(metrics.RefuseFrame, "rpc frame refused", func(e *zerolog.Event) { e.Err(err) })
			return fmt.Errorf("garbage frame: %w: %w", err, errConnDone)
		}
		if len(method) > wire.MaxMethodNameBytes {
			// (No reply: it would repeat the name, and no method is named so.)
			releaseFrame(own, s.limits.Budget, held)
			s.acc.refused(metrics.RefuseFrame, "rpc frame refused", func(e *zerolog.Event) { e.Int("method_bytes", len(method)) })
			return fmt.Errorf("garbage frame: a method name of %d bytes: %w", len(method), errConnDone)
		}
		reply, fatal := s.dispatch(st, method, typ, seq, buf[off:])
		releaseFrame(own, s.limits.Budget, held)
		out = appendFrame(out[:0], reply)
		conn.SetWriteDeadline(time.Now().Add(s.limits.FrameTimeout))
		if _, err := rs.Write(out); err != nil {
			if isTimeout(err) {
				s.acc.timedOut(metrics.TimeoutFrame)
			}
			if !errors.Is(err, net.ErrClosed) {
				// (Closed by this server: the owner stops, and its sessions' end takes
				// back everything, within its shutdown timeout.)
				s.replyLost(st)
			}
			return err
		}
		if fatal != nil {
			s.acc.refused(metrics.RefuseFrame, "rpc call refused", func(e *zerolog.Event) { e.Err(fatal) })
			return fmt.Errorf("%w: %w", fatal, errConnDone)
		}
		if cap(buf) > keepBuffer {
			buf = nil
		}
		if cap(out) > keepBuffer {
			out = nil
		}
	}
}

// awaitFrame waits for the first byte of the next frame. A connection whose last call
// named a live session waits forever (its session is re-checked every IdleTimeout); any
// other is closed after IdleTimeout.
func (s *framedServer) awaitFrame(conn *net.UnixConn, r *bufio.Reader, st *connState) error {
	if r.Buffered() > 0 {
		return nil
	}
	for {
		conn.SetReadDeadline(time.Now().Add(s.limits.IdleTimeout))
		_, err := r.Peek(1)
		if err == nil {
			return nil
		}
		if !isTimeout(err) {
			return err
		}
		if st.client != 0 && s.limits.Live != nil && s.limits.Live(st.client) {
			continue
		}
		s.acc.timedOut(metrics.TimeoutIdle)
		return fmt.Errorf("idle without a live session: %w", errConnDone)
	}
}

// readFailed classifies a failed read inside a frame.
func (s *framedServer) readFailed(err error) error {
	if isTimeout(err) {
		s.acc.timedOut(metrics.TimeoutFrame)
		return fmt.Errorf("partial frame: %w: %w", err, errConnDone)
	}
	return err
}

// frameBuffered reports whether r holds a whole frame already.
func frameBuffered(r *bufio.Reader) bool {
	if r.Buffered() < 4 {
		return false
	}
	hdr, _ := r.Peek(4)
	return uint64(r.Buffered()) >= 4+uint64(binary.BigEndian.Uint32(hdr))
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// dispatch decodes, runs and encodes one call. fatal is set when the connection must close.
// Only CALL is served: a ONEWAY call would get no reply, and anything else is not a
// request; both get a TApplicationException and the connection closes.
func (s *framedServer) dispatch(st *connState, method string, typ thrift.TMessageType, seq int32, body []byte) (reply []byte, fatal error) {
	if typ != thrift.CALL {
		ex := thrift.NewApplicationException(thrift.INVALID_MESSAGE_TYPE_EXCEPTION, fmt.Sprintf("message type %d is not a CALL (%d)", typ, thrift.CALL))
		return exceptionMsg(method, seq, ex), fmt.Errorf("message type %d is not a call", typ)
	}
	mi := s.svc.MethodInfo(context.Background(), method)
	if mi == nil {
		ex := thrift.NewApplicationException(thrift.UNKNOWN_METHOD, "unknown method "+method)
		return exceptionMsg(method, seq, ex), nil
	}
	// A dry walk first: every container's declared size must fit in the bytes that
	// follow, so decoding allocates in proportion to the frame, not to its claims.
	if err := wire.CheckStruct(body); err != nil {
		ex := thrift.NewApplicationException(thrift.PROTOCOL_ERROR, "cannot decode "+method+" arguments: "+err.Error())
		return exceptionMsg(method, seq, ex), fmt.Errorf("garbage %s arguments: %w", method, err)
	}
	args := mi.NewArgs().(thrift.FastCodec)
	if err := safeRead(args, body); err != nil {
		ex := thrift.NewApplicationException(thrift.PROTOCOL_ERROR, "cannot decode "+method+" arguments: "+err.Error())
		return exceptionMsg(method, seq, ex), fmt.Errorf("garbage %s arguments: %w", method, err)
	}
	if r, ok := args.(interface{ IsSetReq() bool }); ok && !r.IsSetReq() {
		ex := thrift.NewApplicationException(thrift.PROTOCOL_ERROR, method+": missing request struct (field 1)")
		return exceptionMsg(method, seq, ex), nil
	}
	result := mi.NewResult().(thrift.FastCodec)
	start := time.Now()
	done := s.metrics.Inflight(method)
	call := &callInfo{conn: st}
	err := mi.Handler()(context.WithValue(context.Background(), callKey{}, call), s.handler, args, result)
	done()
	if err != nil {
		s.metrics.Observe(method, metrics.ResultError, time.Since(start))
		ex := thrift.NewApplicationException(thrift.INTERNAL_ERROR, err.Error())
		return exceptionMsg(method, seq, ex), nil
	}
	s.metrics.Observe(method, call.result, time.Since(start))
	b, _ := thrift.MarshalFastMsg(method, thrift.REPLY, seq, result)
	return b, nil
}

// callKey carries a call's *callInfo between dispatch and the handler.
type callKey struct{}

// callInfo is one call's exchange with its handler: the metrics result (ok,
// hit_memory, hit_ssd, miss, error) the handler reports, and its connection's state.
type callInfo struct {
	result string
	conn   *connState
}

// setResult records the outcome of a call for metrics, unless a handler already did.
func setResult(ctx context.Context, err error) {
	c, _ := ctx.Value(callKey{}).(*callInfo)
	if c == nil || c.result != "" {
		return
	}
	switch {
	case err == nil:
		c.result = metrics.ResultOK
	case errors.Is(err, wire.ErrKeyNotFound):
		c.result = metrics.ResultMiss
	default:
		c.result = metrics.ResultError
	}
}

// setMiss records an Exists of an absent key: a miss, though the call succeeded.
func setMiss(ctx context.Context) {
	if c, _ := ctx.Value(callKey{}).(*callInfo); c != nil {
		c.result = metrics.ResultMiss
	}
}

// setItemFailed records a batch put whose item failed as a failed call (result
// error), as a PutStart or PutEnd of that item alone would be.
func setItemFailed(ctx context.Context) {
	if c, _ := ctx.Value(callKey{}).(*callInfo); c != nil {
		c.result = metrics.ResultError
	}
}

// setSkipped records a put refused ALREADY_EXISTS under reject_if_exists (the key is
// cached: the KV stores skip such pages by design) as ok, not as a failed call.
func setSkipped(ctx context.Context) {
	if c, _ := ctx.Value(callKey{}).(*callInfo); c != nil {
		c.result = metrics.ResultOK
	}
}

// setHit records a get's hit source.
func setHit(ctx context.Context, src common.Source) {
	if c, _ := ctx.Value(callKey{}).(*callInfo); c != nil {
		c.result = metrics.ResultHitMemory
		if src == common.Source_SSD {
			c.result = metrics.ResultHitSSD
		}
	}
}

// grantHolder records that the call's reply hands session client holder id.
func grantHolder(ctx context.Context, client, id int64) {
	if c, _ := ctx.Value(callKey{}).(*callInfo); c != nil && c.conn != nil && id != 0 {
		c.conn.sent.client = client
		c.conn.sent.holders = append(c.conn.sent.holders, id)
	}
}

// grantPut records that the call's reply hands session client the started put putID.
func grantPut(ctx context.Context, client int64, key string, putID int64) {
	if c, _ := ctx.Value(callKey{}).(*callInfo); c != nil && c.conn != nil && putID != 0 {
		c.conn.sent.client = client
		c.conn.sent.puts = append(c.conn.sent.puts, grantedPut{key: key, putID: putID})
	}
}

// replyLost hands what the last reply granted to limits.Lost: its client never read it.
func (s *framedServer) replyLost(st *connState) {
	if g := st.sent; g.client != 0 && s.limits.Lost != nil {
		s.limits.Lost(g)
	}
	st.sent.reset()
}

// setConnClient records on the call's connection that it serves client id (a session
// check passed): while that session lives the connection may idle forever.
func setConnClient(ctx context.Context, id int64) {
	if c, _ := ctx.Value(callKey{}).(*callInfo); c != nil && c.conn != nil {
		c.conn.client = id
	}
}

// safeRead decodes body into args. The thrift skipper can panic on hostile lengths
// (seen with the fuzzer: a negative container size in an unknown field); such a frame
// is garbage like any other and must only close its connection.
func safeRead(args thrift.FastCodec, body []byte) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("malformed thrift: %v", r)
		}
	}()
	_, err = args.FastRead(body)
	return err
}

func exceptionMsg(method string, seq int32, ex *thrift.ApplicationException) []byte {
	if method == "" {
		method = "unknown"
	}
	b, _ := thrift.MarshalFastMsg(method, thrift.EXCEPTION, seq, ex)
	return b
}

func appendFrame(dst, msg []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(msg)))
	return append(dst, msg...)
}

// close stops accepting, closes every connection and waits for their goroutines.
func (s *framedServer) close() {
	s.acc.ln.Close()
	s.acc.closeConns()
	s.wg.Wait()
}
