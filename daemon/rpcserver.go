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
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/cloudwego/kitex/pkg/serviceinfo"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
)

// maxRequestFrame bounds one request frame (a batch of 4096 keys of 4 KiB fits).
const maxRequestFrame = 32 << 20

// framedServer serves one thrift service as framed binary thrift on a Unix socket,
// dispatching through the Kitex-generated method table and codecs. It exists because
// the external hot path cannot afford Kitex's server stack on this socket (DESIGN §3:
// measured, see the README): a get is one read, one handler call and one write.
//
// A frame that cannot be parsed closes that connection only, after a
// TApplicationException when the message header parsed; an unknown method gets a
// TApplicationException and the connection stays.
type framedServer struct {
	ln      *net.UnixListener
	svc     *serviceinfo.ServiceInfo
	handler any
	log     zerolog.Logger
	metrics *metrics.Metrics // nil: no metrics

	mu     sync.Mutex // protects conns
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func listenFramed(path string, mode os.FileMode, svc *serviceinfo.ServiceInfo, handler any, log zerolog.Logger, m *metrics.Metrics) (*framedServer, error) {
	ln, err := shm.ListenUnix(path, mode)
	if err != nil {
		return nil, err
	}
	s := &framedServer{ln: ln, svc: svc, handler: handler, log: log, metrics: m, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

func (s *framedServer) accept() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error().Err(err).Msg("rpc accept")
			}
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.conns[conn] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			err := s.serveConn(conn)
			if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.Warn().Err(err).Msg("rpc connection closed")
			}
			s.mu.Lock()
			delete(s.conns, conn)
			s.mu.Unlock()
			conn.Close()
		}()
	}
}

func (s *framedServer) serveConn(conn net.Conn) error {
	r := bufio.NewReaderSize(conn, 64<<10)
	var hdr [4]byte
	var out []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 || n > maxRequestFrame {
			return fmt.Errorf("frame of %d bytes: not a framed thrift request", n)
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		method, typ, seq, off, err := thrift.Binary.ReadMessageBegin(buf)
		if err != nil {
			return fmt.Errorf("garbage frame: %w", err)
		}
		reply, fatal := s.dispatch(method, typ, seq, buf[off:])
		out = appendFrame(out[:0], reply)
		if _, err := conn.Write(out); err != nil {
			return err
		}
		if fatal != nil {
			return fatal
		}
	}
}

// dispatch decodes, runs and encodes one call. fatal is set when the connection must close.
func (s *framedServer) dispatch(method string, typ thrift.TMessageType, seq int32, body []byte) (reply []byte, fatal error) {
	if typ != thrift.CALL && typ != thrift.ONEWAY {
		ex := thrift.NewApplicationException(thrift.INVALID_MESSAGE_TYPE_EXCEPTION, fmt.Sprintf("message type %d is not a call", typ))
		return exceptionMsg(method, seq, ex), fmt.Errorf("message type %d", typ)
	}
	mi := s.svc.MethodInfo(context.Background(), method)
	if mi == nil {
		ex := thrift.NewApplicationException(thrift.UNKNOWN_METHOD, "unknown method "+method)
		return exceptionMsg(method, seq, ex), nil
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
	res := new(string)
	err := mi.Handler()(context.WithValue(context.Background(), resultKey{}, res), s.handler, args, result)
	done()
	if err != nil {
		s.metrics.Observe(method, metrics.ResultError, time.Since(start))
		ex := thrift.NewApplicationException(thrift.INTERNAL_ERROR, err.Error())
		return exceptionMsg(method, seq, ex), nil
	}
	s.metrics.Observe(method, *res, time.Since(start))
	b, _ := thrift.MarshalFastMsg(method, thrift.REPLY, seq, result)
	return b, nil
}

// resultKey carries a call's metrics result (ok, hit_memory, hit_ssd, miss, error)
// from the handler back to dispatch.
type resultKey struct{}

// setResult records the outcome of a call for metrics, unless a handler already did.
func setResult(ctx context.Context, err error) {
	p, _ := ctx.Value(resultKey{}).(*string)
	if p == nil || *p != "" {
		return
	}
	switch {
	case err == nil:
		*p = metrics.ResultOK
	case errors.Is(err, wire.ErrKeyNotFound):
		*p = metrics.ResultMiss
	default:
		*p = metrics.ResultError
	}
}

// setHit records a get's hit source.
func setHit(ctx context.Context, src common.Source) {
	if p, _ := ctx.Value(resultKey{}).(*string); p != nil {
		*p = metrics.ResultHitMemory
		if src == common.Source_SSD {
			*p = metrics.ResultHitSSD
		}
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
	s.mu.Lock()
	s.closed = true
	s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
