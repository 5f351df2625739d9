package daemon

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/shm"
)

// Accept-loop tuning.
const (
	// acceptBackoffMin and acceptBackoffMax bound the retry delay after a failed accept
	// (doubling, like net/http's Server.Serve).
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
	// refuseWriteTimeout bounds the write of a refusal: a fresh socket's buffer is empty,
	// so it only guards against the impossible.
	refuseWriteTimeout = 100 * time.Millisecond
	// lingerTimeout is how long a refused attach connection stays open so that a client
	// that has not sent its hello yet still reads the refusal instead of EPIPE.
	lingerTimeout = time.Second
	// maxLingering bounds the refused connections lingering per socket; beyond it they
	// are closed right after the refusal is written.
	maxLingering = 32
	// refusalLogPeriod: at most one refusal log line per socket per period.
	refusalLogPeriod = time.Second
)

// Socket labels of the connection metrics.
const (
	socketAttach = "attach"
	socketRPC    = "rpc"
)

// acceptor runs the accept loop of one of the owner's Unix sockets. It never returns
// before its listener is closed: failed accepts are retried with backoff, and when the
// process is out of file descriptors (EMFILE/ENFILE) it closes a spare fd kept for the
// purpose, accepts the waiting connection and refuses it with a clear error instead of
// leaving clients hanging in the backlog. It caps the open connections of its socket:
// one more is accepted and refused at once, and so is one more of a bounded uid that
// holds its share of the cap (uidshare.go). Both sockets share it; what differs is
// serve (one connection's protocol) and refuse (how a refusal is told).
type acceptor struct {
	ln     *net.UnixListener
	socket string // socketAttach or socketRPC: metrics label and log field
	max    int    // connection cap
	// uidMax caps the connections of one bounded uid (0: no per-uid cap); share is the
	// Options.UIDShare it came from, for the refusal.
	uidMax  int
	share   float64
	nofile  uint64 // RLIMIT_NOFILE at start, for the refusal message
	log     zerolog.Logger
	metrics *metrics.Metrics // nil: no metrics
	// serve runs one accepted connection of the peer uid (0 without per-uid shares) in
	// its own goroutine; the acceptor closes the connection when serve returns.
	serve func(conn *net.UnixConn, uid uint32)
	// refuse writes a refusal carrying msg to conn before it is closed; nil: close only.
	refuse func(conn *net.UnixConn, msg string)

	spare *os.File // closed to make room for one accept under fd exhaustion; nil when lost

	mu     sync.Mutex // protects conns, byUID, closed
	conns  map[*net.UnixConn]struct{}
	byUID  map[uint32]int // open connections of each bounded uid (with uidMax)
	closed bool

	lingering atomic.Int32
	logs      logLimiter
	wg        sync.WaitGroup // serve goroutines and lingering refusals
}

// newAcceptor caps ln's connections at max, and those of one bounded uid at its share
// of max (share ≥ 1: no per-uid cap).
func newAcceptor(ln *net.UnixListener, socket string, max int, share float64, log zerolog.Logger, m *metrics.Metrics,
	serve func(*net.UnixConn, uint32), refuse func(*net.UnixConn, string)) *acceptor {
	a := &acceptor{ln: ln, socket: socket, max: max, nofile: nofileLimit(), metrics: m, serve: serve, refuse: refuse,
		log: log.With().Str("socket", socket).Logger(), conns: make(map[*net.UnixConn]struct{}), share: share}
	if share < 1 {
		a.uidMax = int(shareOf(int64(max), share, 1, 1))
		a.byUID = make(map[uint32]int)
	}
	a.reopenSpare()
	return a
}

// run accepts until the listener is closed, then waits for every goroutine it started.
func (a *acceptor) run() {
	defer a.wg.Wait()
	defer a.closeSpare()
	var delay time.Duration
	for {
		conn, err := a.ln.AcceptUnix()
		if err == nil {
			delay = 0
			a.admit(conn)
			continue
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if isFDExhaustion(err) && a.spare != nil {
			closed, handled := a.acceptWithSpare()
			if closed {
				return
			}
			if handled {
				delay = 0
				continue
			}
		}
		a.metrics.ConnRefused(a.socket, metrics.AcceptRefusal(err))
		delay = min(max(2*delay, acceptBackoffMin), acceptBackoffMax)
		a.note(metrics.RefuseAccept, "accept failed; retrying", func(e *zerolog.Event) { e.Err(err).Dur("backoff", delay) })
		time.Sleep(delay)
		if a.spare == nil {
			a.reopenSpare()
		}
	}
}

// acceptWithSpare handles one accept under fd exhaustion: the spare fd makes room for
// the waiting connection, which is refused unless fds came back meanwhile (the spare
// reopens next to it). closed: the listener was closed. handled: a connection was
// taken off the backlog.
func (a *acceptor) acceptWithSpare() (closed, handled bool) {
	a.closeSpare()
	conn, err := a.ln.AcceptUnix()
	a.reopenSpare()
	if err != nil {
		return errors.Is(err, net.ErrClosed), false
	}
	if a.spare != nil {
		a.admit(conn) // the spare found an fd besides this connection's: pressure is over
		return false, true
	}
	a.refuseConn(conn, metrics.RefuseNoFD, fmt.Sprintf("owner out of file descriptors (RLIMIT_NOFILE %d)", a.nofile), false)
	a.reopenSpare()
	return false, true
}

// admit serves conn, or refuses it when the socket is at its cap or closing, or its
// peer's uid is bounded and holds its share of the cap.
func (a *acceptor) admit(conn *net.UnixConn) {
	var uid uint32 // 0 (not bounded) without per-uid shares
	if a.uidMax > 0 {
		var err error
		if uid, err = shm.PeerUID(conn); err != nil { // the peer is gone already
			a.refused(metrics.RefuseAccept, "no peer credentials", func(e *zerolog.Event) { e.Err(err) })
			conn.Close()
			return
		}
	}
	counted := a.uidMax > 0 && boundedUID(uid)
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		conn.Close()
		return
	}
	if len(a.conns) >= a.max {
		a.mu.Unlock()
		a.refuseConn(conn, metrics.RefuseCap, fmt.Sprintf("connection cap %d reached", a.max), true)
		return
	}
	if counted && a.byUID[uid] >= a.uidMax {
		a.mu.Unlock()
		a.refuseConn(conn, metrics.RefuseUIDShare, fmt.Sprintf("uid %d holds %d connections, its share of this socket's cap %d (--uid-share %g)",
			uid, a.uidMax, a.max, a.share), true)
		return
	}
	a.conns[conn] = struct{}{}
	if counted {
		a.byUID[uid]++
	}
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.serve(conn, uid)
		conn.Close()
		a.mu.Lock()
		delete(a.conns, conn)
		if counted {
			if a.byUID[uid]--; a.byUID[uid] == 0 {
				delete(a.byUID, uid)
			}
		}
		a.mu.Unlock()
	}()
}

// refuseConn tells conn why it is refused and closes it. With linger (and room for it)
// the connection stays open up to lingerTimeout, until the peer has sent its request and
// closed: a peer still writing its hello would otherwise get EPIPE and never read why.
func (a *acceptor) refuseConn(conn *net.UnixConn, reason, msg string, linger bool) {
	a.metrics.ConnRefused(a.socket, reason)
	a.note(reason, "connection refused", func(e *zerolog.Event) { e.Str("why", msg) })
	if a.refuse == nil {
		conn.Close()
		return
	}
	if !linger || a.lingering.Add(1) > maxLingering {
		if linger {
			a.lingering.Add(-1)
		}
		conn.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
		a.refuse(conn, msg)
		conn.Close()
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer a.lingering.Add(-1)
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(lingerTimeout))
		a.refuse(conn, msg)
		io.Copy(io.Discard, conn) // until the peer closes or the deadline
	}()
}

// refused counts and logs (rate-limited) a connection the protocol refused after accept.
func (a *acceptor) refused(reason, msg string, fields func(*zerolog.Event)) {
	a.metrics.ConnRefused(a.socket, reason)
	a.note(reason, msg, fields)
}

// timedOut counts and logs (rate-limited) a connection closed by a deadline.
func (a *acceptor) timedOut(kind string) {
	a.metrics.ConnTimeout(a.socket, kind)
	a.note(kind, "connection closed by its deadline", nil)
}

// note logs one refusal or timeout at most once per refusalLogPeriod per socket, with
// the number of lines suppressed since the last one.
func (a *acceptor) note(reason, msg string, fields func(*zerolog.Event)) {
	suppressed, ok := a.logs.allow(time.Now())
	if !ok {
		return
	}
	e := a.log.Warn().Str("reason", reason).Int("suppressed", suppressed)
	if fields != nil {
		fields(e)
	}
	e.Msg(msg)
}

// closeConns stops admitting and closes every open connection (their serve returns).
func (a *acceptor) closeConns() {
	a.mu.Lock()
	a.closed = true
	for c := range a.conns {
		c.Close()
	}
	a.mu.Unlock()
}

// open is the number of connections being served.
func (a *acceptor) open() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.conns)
}

func (a *acceptor) reopenSpare() {
	if a.spare != nil {
		return
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		return // out of fds: retried after the next exhaustion or backoff
	}
	a.spare = f
}

func (a *acceptor) closeSpare() {
	if a.spare != nil {
		a.spare.Close()
		a.spare = nil
	}
}

// isFDExhaustion reports an accept that failed for want of a file descriptor.
func isFDExhaustion(err error) bool { return metrics.AcceptRefusal(err) == metrics.RefuseNoFD }

// logLimiter lets one log line through per refusalLogPeriod and counts the rest.
type logLimiter struct {
	mu         sync.Mutex // protects next, suppressed
	next       time.Time
	suppressed int
}

// allow reports whether a line may be logged now, and how many were suppressed since
// the last one that was.
func (l *logLimiter) allow(now time.Time) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Before(l.next) {
		l.suppressed++
		return 0, false
	}
	suppressed, l.suppressed = l.suppressed, 0
	l.next = now.Add(refusalLogPeriod)
	return suppressed, true
}
