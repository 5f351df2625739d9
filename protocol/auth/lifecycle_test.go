package auth

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/pkg/remote"
	"github.com/cloudwego/kitex/pkg/utils"
)

// slowShutdown is a transport whose Shutdown closes the listener and then waits for
// release, as gonet's waits for its next check; conns is its connection count.
type slowShutdown struct {
	ln      net.Listener
	conns   atomic.Int64
	release chan struct{}
	served  chan struct{}
}

func (s *slowShutdown) CreateListener(net.Addr) (net.Listener, error) { return nil, nil }
func (s *slowShutdown) BootstrapServer(ln net.Listener) error {
	s.ln = ln
	close(s.served)
	return nil
}
func (s *slowShutdown) Shutdown() error {
	s.ln.Close()
	<-s.release
	return nil
}
func (s *slowShutdown) ConnCount() utils.AtomicInt { return utils.AtomicInt(s.conns.Load()) }

var _ remote.TransServer = (*slowShutdown)(nil)

// A stopping server returns as soon as its listener is closed and no connection is
// left, not at the transport's next check; while a connection is left it waits for
// the transport's own shutdown.
func TestPromptShutdown(t *testing.T) {
	for _, left := range []int64{0, 1} {
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		inner := &slowShutdown{release: make(chan struct{}), served: make(chan struct{})}
		inner.conns.Store(left)
		s := &servedServer{TransServer: inner, started: newSignal(), closed: newSignal()}
		go s.BootstrapServer(raw)
		<-inner.served
		<-s.started.c
		stopped := make(chan error, 1)
		go func() { stopped <- s.Shutdown() }()
		if left != 0 {
			select {
			case <-stopped:
				t.Fatalf("%d connection(s) left: Shutdown returned before the transport's", left)
			case <-time.After(200 * time.Millisecond):
			}
			close(inner.release)
		}
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d connection(s) left: Shutdown did not return (the transport's returned: %v)", left, left != 0)
		}
		if left == 0 {
			close(inner.release)
		}
		if _, err := raw.Accept(); err == nil {
			t.Fatal("the listener is open after Shutdown")
		}
	}
}
