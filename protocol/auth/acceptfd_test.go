package auth

import (
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/fluxkv/fluxkv/metrics"
)

// fdLimitedListener fails its first fails accepts as a process out of file descriptors
// does (the fault), then accepts from the real listener.
type fdLimitedListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *fdLimitedListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestAcceptOutOfFDsCounted: a TCP socket (master, peer, data plane) whose accept fails
// for want of a file descriptor counts it as no_fd, what FluxkvOutOfFileDescriptors
// alerts on (counted as accept, a master at its RLIMIT_NOFILE never raised it: a
// review), and serves once descriptors are back; another accept error stays accept.
func TestAcceptOutOfFDsCounted(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	inner := &fdLimitedListener{Listener: raw}
	inner.fails.Store(2)
	m := metrics.New()
	ln := Listener(inner, nil, PurposeMaster, ListenerOptions{Metrics: m})
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	c, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if s, ok := <-accepted; !ok {
		t.Fatal("no connection accepted after the descriptors came back")
	} else {
		s.Close()
	}
	if got := refused(t, m, PurposeMaster, metrics.RefuseNoFD); got != 2 {
		t.Errorf("no_fd refusals %v, want 2", got)
	}
	if got := refused(t, m, PurposeMaster, metrics.RefuseAccept); got != 0 {
		t.Errorf("accept refusals %v, want 0 (they were for want of descriptors)", got)
	}
	for err, want := range map[error]string{
		os.NewSyscallError("accept4", syscall.ENFILE):       metrics.RefuseNoFD,
		os.NewSyscallError("accept4", syscall.ECONNABORTED): metrics.RefuseAccept,
	} {
		if got := metrics.AcceptRefusal(&net.OpError{Op: "accept", Err: err}); got != want {
			t.Errorf("AcceptRefusal(%v) = %s, want %s", err, got, want)
		}
	}
}
