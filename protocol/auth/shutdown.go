package auth

import (
	"net"
	"sync"
	"time"

	"github.com/cloudwego/kitex/pkg/remote"
)

// shutdownPoll is how often a stopping server checks whether its connections are gone.
const shutdownPoll = time.Millisecond

// promptShutdown makes the gonet transport's servers stop as soon as their last
// connection is gone. gonet's Shutdown closes the listener (Listener's Close drains the
// connections: an idle one closes at once, one in a call after its reply) and then
// checks the connection count every 100 ms until it is zero or the server's exit wait
// passed, so every stop took at least 100 ms: an owner's, a master's, each test's.
type promptShutdown struct{ remote.TransServerFactory }

func (f promptShutdown) NewTransServer(opt *remote.ServerOption, h remote.ServerTransHandler) remote.TransServer {
	return &promptServer{TransServer: f.TransServerFactory.NewTransServer(opt, h), closed: make(chan struct{})}
}

// promptServer is one server of promptShutdown.
type promptServer struct {
	remote.TransServer
	closed chan struct{} // closed once the server closed its listener
	once   sync.Once
}

// BootstrapServer serves ln, noting when the server closes it.
func (s *promptServer) BootstrapServer(ln net.Listener) error {
	return s.TransServer.BootstrapServer(&noteClose{Listener: ln, s: s})
}

// Shutdown runs the transport's shutdown and returns when it returns or, once the
// listener is closed, when no connection is left. In the second case the transport's
// own wait ends at its next check (within 100 ms) in the background: it holds nothing
// of the caller's.
func (s *promptServer) Shutdown() error {
	done := make(chan error, 1)
	go func() { done <- s.TransServer.Shutdown() }()
	t := time.NewTicker(shutdownPoll)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			select {
			case <-s.closed:
				if n := s.ConnCount(); n.Value() == 0 {
					return nil
				}
			default:
			}
		}
	}
}

// noteClose is a served listener whose Close tells its promptServer.
type noteClose struct {
	net.Listener
	s *promptServer
}

func (l *noteClose) Close() error {
	err := l.Listener.Close()
	l.s.once.Do(func() { close(l.s.closed) })
	return err
}
