package auth

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"

	"github.com/fluxkv/fluxkv/metrics"
)

// Shedding. Connections still in their handshake cost a server an fd and a goroutine
// each, and anyone who reaches a port can open them, so Listener bounds them per source
// address and in total (docs/architecture.md §11). A full bound never turns away the connection that
// just arrived: an honest dial answers its hello within a round trip, so the youngest
// connection is the one most likely to authenticate, and the oldest pending one (the
// slowest: the longest since its hello without an answer) is shed instead. A flood of
// connections that never answer then only displaces its own older connections, however
// fast it re-dials, and a member's dial completes within the time the flood takes to
// open a bound's worth of newer ones.

// verdictBusy is the verdict a shed connection gets when the server's hello had gone out
// (the client may be waiting for a verdict): the server is overloaded with connections
// that do not authenticate, and a later dial may succeed. It follows the verdict codes
// of handshake.go.
const verdictBusy byte = 5

// ErrHandshakeIncomplete is wrapped, with ErrAuthFailed, by a client handshake that
// ended before the server's verdict: the connection was closed, reset or timed out, or
// the server answered busy. An overloaded server sheds connections in their handshake,
// so a caller may retry these, unlike a verdict (wrong secret, version) or a port of
// another kind.
var ErrHandshakeIncomplete = errors.New("the handshake did not complete")

// sourceKey groups connections by where they come from: the IPv4 address, or the /64
// of an IPv6 address (one host's usual allocation). Other addresses (pipes, Unix
// sockets) share the zero key.
type sourceKey = netip.Addr

func sourceOf(a net.Addr) sourceKey {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return sourceKey{}
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return sourceKey{}
	}
	ip = ip.Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

// pendingEntry is one connection in its handshake, in its shedQueue's lists.
type pendingEntry struct {
	c   *serverConn // the connection (nil in tests of the queue alone)
	src sourceKey
	seq uint64 // admission order: lower is older

	queued       bool
	prev, next   *pendingEntry // in the queue's list of all entries
	sprev, snext *pendingEntry // in its source's list
}

// entryList is a list of entries, oldest first, linked through all or by-source links.
type entryList struct {
	head, tail *pendingEntry
	n          int
}

// maxSkip is how many of a source's oldest entries add looks at for one whose client
// is not waiting on the server.
const maxSkip = 16

// shedQueue holds the connections in their handshake and picks the one to shed when
// one more arrives. Not safe for concurrent use (the listener's mutex guards it).
type shedQueue struct {
	max, perSource int
	// answered says whether an entry's client has sent bytes the server has not read
	// yet: it answered, and waits on the server (a busy machine), so it is not the
	// slowest and is passed over. Nil: none is.
	answered func(*pendingEntry) bool
	seq      uint64
	all      entryList
	sources  map[sourceKey]*entryList
}

func newShedQueue(max, perSource int) *shedQueue {
	if max < 1 || perSource < 1 {
		panic("BUG: shedQueue bounds must be at least 1")
	}
	return &shedQueue{max: max, perSource: min(perSource, max), sources: make(map[sourceKey]*entryList)}
}

// Reasons add sheds a connection for (fluxkv_conn_refused_total reason labels).
const (
	shedSourceCap = metrics.RefuseSourceCap // its source holds perSource pending connections: its oldest is shed
	shedTotal     = metrics.RefuseShed      // max are pending: the oldest of the source holding the most is shed
)

// add queues e and returns the entry it displaced (already removed) with the reason, or
// nil. A source at its cap loses its own oldest; otherwise, when the total is full, the
// source holding the most pending connections loses its oldest (the oldest of all among
// equals), so a source with few pending connections is not shed while another holds
// more. Within the source, one that answered and waits for the server to read it is
// passed over (see slowest).
func (q *shedQueue) add(e *pendingEntry) (victim *pendingEntry, reason string) {
	if e.queued {
		panic("BUG: pending entry queued twice")
	}
	s := q.sources[e.src]
	if s == nil {
		s = &entryList{}
		q.sources[e.src] = s
	}
	switch {
	case s.n >= q.perSource:
		victim, reason = q.slowest(s), shedSourceCap
	case q.all.n >= q.max:
		victim, reason = q.slowest(q.heaviest()), shedTotal
	}
	if victim != nil {
		q.remove(victim)
		if q.sources[e.src] == nil { // the victim was its source's last entry
			q.sources[e.src] = s
		}
	}
	q.seq++
	e.seq = q.seq
	e.queued = true
	e.prev, e.next = q.all.tail, nil
	if q.all.tail != nil {
		q.all.tail.next = e
	} else {
		q.all.head = e
	}
	q.all.tail = e
	q.all.n++
	e.sprev, e.snext = s.tail, nil
	if s.tail != nil {
		s.tail.snext = e
	} else {
		s.head = e
	}
	s.tail = e
	s.n++
	return victim, reason
}

// slowest is the entry of s to shed: its oldest whose client is not waiting on the
// server among the maxSkip oldest, or else its oldest.
func (q *shedQueue) slowest(s *entryList) *pendingEntry {
	if q.answered != nil {
		e := s.head
		for range maxSkip {
			if e == nil {
				break
			}
			if !q.answered(e) {
				return e
			}
			e = e.snext
		}
	}
	return s.head
}

// heaviest is the source list with the most entries; among equals, the one whose oldest
// entry is oldest (a total order: map order does not pick). The scan is over at most max
// sources; the queue must not be empty.
func (q *shedQueue) heaviest() *entryList {
	var best *entryList
	for _, s := range q.sources {
		if s.n == 0 {
			continue
		}
		if best == nil || s.n > best.n || (s.n == best.n && s.head.seq < best.head.seq) {
			best = s
		}
	}
	return best
}

// remove takes e out of the queue; an entry no longer queued is left alone.
func (q *shedQueue) remove(e *pendingEntry) {
	if !e.queued {
		return
	}
	e.queued = false
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		q.all.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		q.all.tail = e.prev
	}
	q.all.n--
	s := q.sources[e.src]
	if e.sprev != nil {
		e.sprev.snext = e.snext
	} else {
		s.head = e.snext
	}
	if e.snext != nil {
		e.snext.sprev = e.sprev
	} else {
		s.tail = e.sprev
	}
	s.n--
	if s.n == 0 {
		delete(q.sources, e.src)
	}
	e.prev, e.next, e.sprev, e.snext = nil, nil, nil, nil
}

// len is the number of queued entries.
func (q *shedQueue) len() int { return q.all.n }

// What a client says when a handshake ends early. Each wraps ErrAuthFailed and
// ErrHandshakeIncomplete and says what most likely happened.

// helloError is the error of a client whose read of the server's hello failed with err.
func helloError(addr, purpose string, err error) error {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: %w: no authentication hello from %s within the wait (%v): it is overloaded with connections in their handshake, runs with --insecure-cluster, or is not a fluxkv %s port",
			ErrAuthFailed, ErrHandshakeIncomplete, addr, err, purpose)
	case closedEarly(err):
		return fmt.Errorf("%w: %w: %s closed the connection before its authentication hello (%v): it sheds connections in their handshake when too many are pending (a flood of connections that never authenticate), or it is shutting down",
			ErrAuthFailed, ErrHandshakeIncomplete, addr, err)
	}
	return fmt.Errorf("%w: %w: read the authentication hello from %s: %v", ErrAuthFailed, ErrHandshakeIncomplete, addr, err)
}

// verdictError is the error of a client whose write of its answer or read of the
// verdict failed with err (what names the step: "send answer to", "read verdict from").
func verdictError(addr, what string, err error) error {
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%w: %w: %s %s: no verdict within the wait (%v): it is overloaded", ErrAuthFailed, ErrHandshakeIncomplete, what, addr, err)
	case closedEarly(err):
		return fmt.Errorf("%w: %w: %s %s: it closed the connection before its verdict (%v): it shed this connection (too many connections in their handshake), or it is shutting down",
			ErrAuthFailed, ErrHandshakeIncomplete, what, addr, err)
	}
	return fmt.Errorf("%w: %w: %s %s: %v", ErrAuthFailed, ErrHandshakeIncomplete, what, addr, err)
}

// busyError is the error of a client that got verdictBusy.
func busyError(addr string) error {
	return fmt.Errorf("%w: %w: %s is busy: it shed this connection in its handshake because too many were pending (a flood of connections that never authenticate); a later dial may succeed",
		ErrAuthFailed, ErrHandshakeIncomplete, addr)
}

// closedEarly says whether err is the peer closing or resetting the connection.
func closedEarly(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrClosedPipe)
}
