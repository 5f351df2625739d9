package transfer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth"
)

// serveChunk is the most the server writes under one progress deadline.
const serveChunk = 1 << 20

// ServerOptions tune a data-plane server. Zero fields take the defaults.
type ServerOptions struct {
	// Secrets authenticate every connection (protocol/auth, purpose "data"); nil runs
	// without authentication (--insecure-cluster).
	Secrets *auth.Secrets
	// Logger receives connection warnings (at most a few a second). Default: none.
	Logger *zerolog.Logger
	// Metrics counts bytes served, failed serves and refused connections. Default: none.
	Metrics *metrics.Metrics
	// MaxConns caps the authenticated connections (pooled ones included); one more is
	// closed at once. Those still in their handshake are bounded by auth.Listener (at
	// most MaxConns of them, half per source address; the oldest is shed for a
	// newer one). Default 256.
	MaxConns int
	// HandshakeTimeout bounds the authentication handshake. Default 5s.
	HandshakeTimeout time.Duration
	// HeaderTimeout bounds the rest of a request header once its first byte arrived.
	// Default 1s.
	HeaderTimeout time.Duration
	// IdleTimeout closes a connection that waits this long for its next request (a
	// pooled connection the puller forgot). Default 5 minutes.
	IdleTimeout time.Duration
	// ProgressTimeout fails a serve whose connection accepts nothing for this long.
	// Default 2s.
	ProgressTimeout time.Duration
	// UserTimeout is TCP_USER_TIMEOUT on each connection. Default 2s.
	UserTimeout time.Duration

	// beforeChunk, for tests: called before each chunk of a serve is written, with
	// the offset in the data it starts at.
	beforeChunk func(off int)
	// sockBuf, for benchmarks: SO_RCVBUF and SO_SNDBUF (0: kernel autotuning).
	sockBuf int
}

func (o *ServerOptions) fill() {
	if o.MaxConns <= 0 {
		o.MaxConns = 256
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.HeaderTimeout <= 0 {
		o.HeaderTimeout = time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	if o.ProgressTimeout <= 0 {
		o.ProgressTimeout = 2 * time.Second
	}
	if o.UserTimeout <= 0 {
		o.UserTimeout = 2 * time.Second
	}
}

// Server serves pulls from a Source: one goroutine per connection, one pull at a time
// on each.
type Server struct {
	src  Source
	opts ServerOptions
	ln   net.Listener // auth.Listener over a tuningListener
	log  zerolog.Logger
	warn zerolog.Logger // sampled: a few lines a second
	tm   *metrics.Transfer

	wg sync.WaitGroup // the accept loop and every connection's goroutine

	mu     sync.Mutex // protects conns, authed, closed
	conns  map[net.Conn]struct{}
	authed int // the connections in conns past their handshake
	closed bool
}

// Listen serves src on addr (TCP, host:port; port 0 picks one: see Addr).
func Listen(addr string, src Source, opts ServerOptions) (*Server, error) {
	if src == nil {
		return nil, errors.New("transfer: nil Source")
	}
	opts.fill()
	tl, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("data-plane listener on %s: %w", addr, err)
	}
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = opts.Logger.With().Str("component", "transfer").Logger()
	}
	s := &Server{
		src:   src,
		opts:  opts,
		log:   log,
		warn:  log.Sample(&zerolog.BurstSampler{Burst: 3, Period: time.Second}),
		tm:    opts.Metrics.Transfer(),
		conns: make(map[net.Conn]struct{}),
	}
	s.ln = auth.Listener(tuningListener{TCPListener: tl.(*net.TCPListener), userTimeout: opts.UserTimeout, sockBuf: opts.sockBuf},
		opts.Secrets, auth.PurposeData,
		auth.ListenerOptions{Timeout: opts.HandshakeTimeout, MaxPending: opts.MaxConns, Logger: opts.Logger, Metrics: opts.Metrics})
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops accepting, closes every connection (pulls in flight fail at the
// puller) and waits for the server's goroutines. A Source.Open in progress is waited
// for.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := make([]net.Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	err := s.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	s.wg.Wait()
	return err
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept() // auth.Listener retries temporary errors itself
		if err != nil {
			return
		}
		s.mu.Lock()
		switch {
		case s.closed:
			c.Close()
		case s.authed >= s.opts.MaxConns:
			c.Close()
			s.refuseCap(c)
		default:
			s.conns[c] = struct{}{}
			s.wg.Add(1)
			go s.serve(c)
		}
		s.mu.Unlock()
	}
}

// serve runs the pulls of one connection until it closes, idles out or misbehaves.
func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	// Authenticate first, then count the connection against MaxConns: connections in
	// their handshake are auth.Listener's to bound (it sheds the oldest, which a count
	// here would only learn of once its goroutine ran). A refused or shed client is
	// counted and logged there.
	if auth.Handshake(c) != nil {
		return
	}
	w := auth.Writer(c)
	s.mu.Lock()
	if s.authed >= s.opts.MaxConns {
		s.mu.Unlock()
		s.refuseCap(c)
		return
	}
	s.authed++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.authed--
		s.mu.Unlock()
	}()
	var hdr [maxRequestLen]byte
	var resp [responseFixedLen + maxMessageBytes]byte
	remote := c.RemoteAddr().String()
	// Requests may come pipelined (PullMany): one read takes in the headers that wait.
	br := bufio.NewReaderSize(c, 4096)
	for {
		// The first byte may take long (a pooled connection); the rest may not. The
		// first Read also runs the authentication handshake: a refused client reads
		// as EOF here (auth.Listener counted and logged it).
		c.SetReadDeadline(time.Now().Add(s.opts.IdleTimeout))
		if _, err := io.ReadFull(br, hdr[:1]); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.log.Debug().Str("remote", remote).Msg("idle data-plane connection closed")
			}
			return
		}
		c.SetReadDeadline(time.Now().Add(s.opts.HeaderTimeout))
		if _, err := io.ReadFull(br, hdr[1:requestFixedLen]); err != nil {
			s.badRequest(c, resp[:0], remote, fmt.Errorf("read request header: %w", err), false)
			return
		}
		n, err := parseRequestFixed(hdr[:requestFixedLen])
		if err != nil {
			s.badRequest(c, resp[:0], remote, err, true)
			return
		}
		if _, err := io.ReadFull(br, hdr[requestFixedLen:requestFixedLen+n]); err != nil {
			s.badRequest(c, resp[:0], remote, fmt.Errorf("read request node id: %w", err), false)
			return
		}
		req, err := parseRequest(hdr[:requestFixedLen+n])
		if err != nil {
			s.badRequest(c, resp[:0], remote, err, true)
			return
		}
		if !s.pull(c, w, resp[:0], remote, req) {
			return
		}
	}
}

// refuseCap counts and logs a connection closed for MaxConns.
func (s *Server) refuseCap(c net.Conn) {
	s.opts.Metrics.ConnRefused(auth.PurposeData, metrics.RefuseCap)
	s.warn.Warn().Str("remote", c.RemoteAddr().String()).Int("max_conns", s.opts.MaxConns).
		Msg("too many data-plane connections; closed one")
}

// badRequest counts and logs a malformed request and, when reply is set, answers
// BAD_REQUEST; the caller then closes the connection.
func (s *Server) badRequest(c net.Conn, buf []byte, remote string, err error, reply bool) {
	s.tm.Error(metrics.TransferServe, metrics.TransferErrBadRequest)
	s.warn.Warn().Str("remote", remote).Err(err).Msg("bad data-plane request; connection closed")
	if reply {
		c.SetWriteDeadline(time.Now().Add(s.opts.ProgressTimeout))
		c.Write(appendResponse(buf, statusBadRequest, 0, err.Error()))
	}
}

// open asks the Source for the bytes of req. A staged pull may wait for its chunk to
// be read: meanwhile the puller hears statusWait every waitInterval. ok false: the
// connection failed while waiting (a release the Source returned later is called).
func (s *Server) open(c net.Conn, buf []byte, req request) (data []byte, release func(), err error, ok bool) {
	if !req.fence.Staged {
		data, release, err = s.src.Open(req.fence, req.offset, req.length)
		return data, release, err, true
	}
	if ws, isWaiting := s.src.(WaitingSource); isWaiting {
		var aliveErr error
		data, release, err = ws.OpenWaiting(req.fence, req.offset, req.length, func() error {
			if aliveErr != nil {
				return aliveErr // a WAIT went out in part at most: the stream is broken
			}
			c.SetWriteDeadline(time.Now().Add(s.opts.ProgressTimeout))
			_, aliveErr = c.Write(appendResponse(buf, statusWait, 0, ""))
			return aliveErr
		})
		if aliveErr != nil {
			if err == nil {
				release()
			}
			return nil, nil, aliveErr, false
		}
		return data, release, err, true
	}
	type opened struct {
		data    []byte
		release func()
		err     error
	}
	ch := make(chan opened, 1)
	go func() {
		d, r, e := s.src.Open(req.fence, req.offset, req.length)
		ch <- opened{d, r, e}
	}()
	tick := time.NewTicker(waitInterval)
	defer tick.Stop()
	for {
		select {
		case o := <-ch:
			return o.data, o.release, o.err, true
		case <-tick.C:
			c.SetWriteDeadline(time.Now().Add(s.opts.ProgressTimeout))
			if _, werr := c.Write(appendResponse(buf, statusWait, 0, "")); werr != nil {
				if o := <-ch; o.err == nil {
					o.release()
				}
				return nil, nil, werr, false
			}
		}
	}
}

// pull answers one request on c, writing an OK answer's header and data to w (c's
// TCP connection: auth.Writer); false means the connection must close.
func (s *Server) pull(c, w net.Conn, buf []byte, remote string, req request) bool {
	data, release, err, ok := s.open(c, buf, req)
	if !ok {
		s.serveFailed(remote, req, 0, err)
		return false
	}
	if err == nil && int64(len(data)) != req.length {
		release()
		err = fmt.Errorf("BUG: the source returned %d bytes for a pull of %d", len(data), req.length)
		s.log.Error().Err(err).Msg("data-plane source")
	}
	if err != nil {
		status, kind, msg := statusUnavailable, metrics.TransferErrUnavailable, err.Error()
		if errors.Is(err, ErrFenced) {
			// The puller wraps ErrFenced itself: send the reason only.
			status, kind, msg = statusFenced, metrics.TransferErrFenced, strings.TrimPrefix(msg, ErrFenced.Error()+": ")
		}
		s.tm.Error(metrics.TransferServe, kind)
		s.log.Debug().Str("remote", remote).Str("status", statusName(status)).Err(err).Msg("pull refused")
		c.SetWriteDeadline(time.Now().Add(s.opts.ProgressTimeout))
		_, werr := c.Write(appendResponse(buf, status, 0, msg))
		return werr == nil
	}
	defer release()
	// The header goes out with the first chunk in one writev: the puller, reading the
	// header, finds the data behind it instead of waiting for a second segment (a wake-up
	// less per value of a PullMany, whose answers stream back to back).
	hdr := appendResponse(buf, statusOK, req.length, okPadding[:okPad(data)])
	for off := 0; off < len(data); {
		end := min(off+serveChunk, len(data))
		if s.opts.beforeChunk != nil {
			s.opts.beforeChunk(off)
		}
		c.SetWriteDeadline(time.Now().Add(s.opts.ProgressTimeout))
		var n int
		var err error
		if off == 0 {
			bufs := net.Buffers{hdr, data[:end]}
			var m int64
			m, err = bufs.WriteTo(w)
			n = max(0, int(m)-len(hdr))
		} else {
			n, err = w.Write(data[off:end])
		}
		off += n
		if err != nil {
			s.serveFailed(remote, req, off, err)
			return false
		}
	}
	s.tm.Bytes(metrics.TransferServe, req.length)
	return true
}

func (s *Server) serveFailed(remote string, req request, sent int, err error) {
	kind := metrics.TransferErrIO
	if errors.Is(err, os.ErrDeadlineExceeded) {
		kind = metrics.TransferErrTimeout
	}
	s.tm.Error(metrics.TransferServe, kind)
	s.warn.Warn().Str("remote", remote).Int64("transfer", req.fence.TransferID).Int64("offset", req.offset).
		Int64("length", req.length).Int("sent", sent).Err(err).Msg("serving a pull failed")
}
