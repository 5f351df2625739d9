package auth

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Calls bounded by their connection. Kitex bounds a call with an RPC timeout (or a
// context that can end) by running it on a goroutine of its timeout pool while the
// caller waits for it: a hand-over and a wake-up each way, about as long as the round
// trip itself on a busy machine of two cores. A client made without an RPC timeout,
// called with a context that cannot end, runs the call on the caller's goroutine; its
// connections from a BoundCalls dialer then bound the call instead: every write, and
// the read of each reply, must finish within the timeout, and Cut ends the calls on
// them at once.

// ErrCut is what a dial or a call on a connection of a dialer that was cut fails with.
var ErrCut = errors.New("the client was cut off (another server is current, or a shutdown)")

// callBound is what the connections of one BoundCalls dialer share: their bound, and
// the live ones, for Cut.
type callBound struct {
	timeout time.Duration
	mu      sync.Mutex // protects conns and cut
	conns   map[*clientConn]struct{}
	cut     bool
}

// BoundCalls returns a dialer like d whose connections bound each call to timeout
// themselves, for a Kitex client made without an RPC timeout and called with contexts
// that have no deadline and are never cancelled (context.Background()): a write must
// finish, and a reply be read, within timeout of its start. A call made with an RPC
// timeout (callopt.WithRPCTimeout) waits for its reply that long instead.
func (d *Dialer) BoundCalls(timeout time.Duration) *Dialer {
	b := *d
	b.bound = &callBound{timeout: timeout, conns: make(map[*clientConn]struct{})}
	return &b
}

// Cut closes every connection of a BoundCalls dialer, ending the calls waiting on
// them, and makes its later dials fail with ErrCut: a call on such a client fails at
// once. Cut does nothing to a dialer without bound.
func (d *Dialer) Cut() {
	b := d.bound
	if b == nil {
		return
	}
	b.mu.Lock()
	b.cut = true
	conns := b.conns
	b.conns = nil
	b.mu.Unlock()
	for c := range conns {
		// The socket only: a call reading through c's buffers fails at once, and Kitex
		// closes c (and releases them) when that call gives it back.
		c.Conn.Close()
	}
}

// add records c, a connection just dialed, or closes it when the dialer was cut.
func (b *callBound) add(c *clientConn) error {
	b.mu.Lock()
	cut := b.cut
	if !cut {
		b.conns[c] = struct{}{}
	}
	b.mu.Unlock()
	if cut {
		c.Close()
		return ErrCut
	}
	return nil
}

func (b *callBound) remove(c *clientConn) {
	b.mu.Lock()
	delete(b.conns, c)
	b.mu.Unlock()
}

// boundWriter is the raw side a bound connection's buffered writer flushes to: each
// write (to w, conn's writes) must finish within the bound.
type boundWriter struct {
	conn    net.Conn
	w       io.Writer
	timeout time.Duration
}

func (w boundWriter) Write(p []byte) (int, error) {
	if err := w.conn.SetWriteDeadline(time.Now().Add(w.timeout)); err != nil {
		return 0, err
	}
	return w.w.Write(p)
}
