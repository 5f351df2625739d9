package metrics

import (
	"errors"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a socket refuses a connection (the reason label of fluxkv_conn_refused_total).
const (
	RefuseCap         = "cap"          // the socket's connection cap (--max-connections) was reached
	RefuseNoFD        = "no_fd"        // accept failed with EMFILE/ENFILE (an owner's Unix sockets: the spare fd accepted and closed it; TCP: retried with backoff)
	RefuseHello       = "hello"        // an attach hello that was malformed, too large or refused
	RefusePerm        = "permission"   // an attach by a uid or group the owner does not admit
	RefuseFrame       = "frame"        // a frame over the limit, not a CALL, or announcing sizes its bytes do not hold
	RefuseFrameMemory = "frame_memory" // a frame that did not fit in the process's frame memory budget in time
	RefuseAccept      = "accept"       // a temporary accept error (retried with backoff)
	RefusePutArea     = "put_area"     // client isolation: the put areas' total (--put-area-total) or the uid's share of it is used up
	RefuseUIDShare    = "uid_share"    // a uid other than the owner's and root holds its share (--uid-share) of the socket's connection cap
	RefuseAuth        = "auth"         // a cluster connection that failed authentication (protocol/auth)
	RefuseShed        = "shed"         // a cluster connection in its handshake shed for a newer one: too many pending (protocol/auth)
	RefuseSourceCap   = "source_cap"   // the same, shed because its source address held its share of the pending ones
)

// Sockets a connection is refused or timed out on (the socket label of
// fluxkv_conn_refused_total and fluxkv_conn_timeouts_total): the owner's two Unix
// sockets (daemon) and the authenticated TCP listeners, named by their purpose
// (protocol/auth.Purpose*).
const (
	SocketAttach = "attach" // the owner's attach socket (DIR/fluxkv.sock)
	SocketRPC    = "rpc"    // the owner's RPC socket (DIR/fluxkv.sock.rpc)
	SocketMaster = "master" // the master's TCP listener
	SocketPeer   = "peer"   // the owner's peer service
	SocketData   = "data"   // the owner's data plane
)

var (
	sockets       = []string{SocketAttach, SocketRPC, SocketMaster, SocketPeer, SocketData}
	refuseReasons = []string{RefuseCap, RefuseNoFD, RefuseHello, RefusePerm, RefuseFrame, RefuseFrameMemory,
		RefuseAccept, RefusePutArea, RefuseUIDShare, RefuseAuth, RefuseShed, RefuseSourceCap}
	timeoutKinds = []string{TimeoutHello, TimeoutFrame, TimeoutIdle, TimeoutAuth}
)

// Kinds of connection timeouts (the kind label of fluxkv_conn_timeouts_total).
const (
	TimeoutHello = "hello" // no complete attach hello within the deadline
	TimeoutFrame = "frame" // a partial request frame not completed within the deadline
	TimeoutIdle  = "idle"  // an RPC connection without a live session stayed idle
	TimeoutAuth  = "auth"  // a cluster connection that did not finish authenticating
)

// events are counters of rare events: refused connections, connection timeouts,
// corrupt SSD reads and replies the client never read.
type events struct {
	refused    *prometheus.CounterVec
	timeouts   *prometheus.CounterVec
	ssdCorrupt prometheus.Counter
	lostReply  prometheus.Counter
}

// newEvents returns the counters with every socket × reason (and socket × kind) at 0,
// pairs that cannot happen included, so that increase() sees the first event.
func newEvents() *events {
	e := &events{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fluxkv_conn_refused_total",
			Help: "Connections refused or closed early, by socket (attach, rpc, master, peer, data) and reason (cap, no_fd, hello, permission, frame, frame_memory, accept, put_area, uid_share, auth, shed, source_cap).",
		}, []string{"socket", "reason"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fluxkv_conn_timeouts_total",
			Help: "Connections closed by a deadline, by socket (attach, rpc, master, peer, data) and kind (hello, frame, idle, auth).",
		}, []string{"socket", "kind"}),
		ssdCorrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fluxkv_ssd_corrupt_total",
			Help: "SSD reads whose record failed verification (checksum, key, version or length mismatch); each dropped that SSD replica.",
		}),
		lostReply: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fluxkv_lost_replies_total",
			Help: "Replies handing out holders or started puts that the client closed its connection without reading (a timeout); each one's holders were released and puts aborted.",
		}),
	}
	for _, s := range sockets {
		for _, r := range refuseReasons {
			e.refused.WithLabelValues(s, r)
		}
		for _, k := range timeoutKinds {
			e.timeouts.WithLabelValues(s, k)
		}
	}
	return e
}

func (e *events) collectors() []prometheus.Collector {
	return []prometheus.Collector{e.refused, e.timeouts, e.ssdCorrupt, e.lostReply}
}

// ConnRefused counts a connection refused or closed early on socket for reason.
func (m *Metrics) ConnRefused(socket, reason string) {
	if m == nil {
		return
	}
	m.events.refused.WithLabelValues(socket, reason).Inc()
}

// ConnTimeout counts a connection closed by a deadline of kind on socket.
func (m *Metrics) ConnTimeout(socket, kind string) {
	if m == nil {
		return
	}
	m.events.timeouts.WithLabelValues(socket, kind).Inc()
}

// SSDCorrupt counts one SSD read that failed record verification.
func (m *Metrics) SSDCorrupt() {
	if m == nil {
		return
	}
	m.events.ssdCorrupt.Inc()
}

// LostReply counts one reply whose grants were taken back: its client never read it.
func (m *Metrics) LostReply() {
	if m == nil {
		return
	}
	m.events.lostReply.Inc()
}

// AcceptRefusal is the reason an accept that failed with err counts as: RefuseNoFD for
// want of a file descriptor (EMFILE, ENFILE), else RefuseAccept.
func AcceptRefusal(err error) string {
	if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
		return RefuseNoFD
	}
	return RefuseAccept
}
