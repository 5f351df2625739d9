package auth

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/kitex/pkg/remote"
)

// shutdownPoll is how often a stopping server checks whether its connections are gone.
const shutdownPoll = time.Millisecond

// served wraps the gonet transport's servers: they say when they start serving
// (started; a server built with options that replace the factory never says it), and
// they stop as soon as their last connection is gone. gonet's Shutdown
// closes the listener (Listener's Close drains the connections: an idle one closes at
// once, one in a call after its reply) and then checks the connection count every
// 100 ms until it is zero or the server's exit wait passed, so every stop took at
// least 100 ms: an owner's, a master's, each test's.
type served struct {
	remote.TransServerFactory
	started *startSignal // when the first server built with the factory serves
}

func (f served) NewTransServer(opt *remote.ServerOption, h remote.ServerTransHandler) remote.TransServer {
	return &servedServer{TransServer: f.TransServerFactory.NewTransServer(opt, h), started: f.started,
		closed: newSignal()}
}

// servedServer is one server of served.
type servedServer struct {
	remote.TransServer
	started *startSignal
	closed  *signal // once the server closed its listener
}

// BootstrapServer serves ln, noting when the server first accepts from it (it has
// recorded the listener, which its Shutdown closes) and when it closes it.
func (s *servedServer) BootstrapServer(ln net.Listener) error {
	return s.TransServer.BootstrapServer(&noteClose{Listener: ln, s: s})
}

// Shutdown runs the transport's shutdown and returns when it returns or, once the
// listener is closed, when no connection is left. In the second case the transport's
// own wait ends at its next check (within 100 ms) in the background: it holds nothing
// of the caller's.
func (s *servedServer) Shutdown() error {
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
			case <-s.closed.c:
				if n := s.ConnCount(); n.Value() == 0 {
					return nil
				}
			default:
			}
		}
	}
}

// noteClose is a served listener whose Accept and Close tell its servedServer.
type noteClose struct {
	net.Listener
	s *servedServer
}

// Accept says the server serves: gonet accepts only once it recorded the listener, so
// a Stop from then on closes it (before, Stop would leave it open and return while it
// still served).
func (l *noteClose) Accept() (net.Conn, error) {
	l.s.started.accepting()
	return l.Listener.Accept()
}

func (l *noteClose) Close() error {
	err := l.Listener.Close()
	l.s.closed.fire()
	return err
}

// startSignal says a Kitex server serves (its channel closes) once both have happened:
// its transport accepts (gonet recorded the listener, which Stop then closes) and Run
// asked for its exit signal (it is past its check of the transport's first result: a
// Stop before then made the transport return nil there, and Run panicked logging it).
type startSignal struct {
	accept, run sync.Once
	n           atomic.Int32
	s           *signal
}

func newStartSignal() *startSignal { return &startSignal{s: newSignal()} }

func (b *startSignal) accepting() { b.accept.Do(b.one) }
func (b *startSignal) running()   { b.run.Do(b.one) }

func (b *startSignal) one() {
	if b.n.Add(1) == 2 {
		b.s.fire()
	}
}

// signal is a channel closed once, by the first fire.
type signal struct {
	c    chan struct{}
	once sync.Once
}

func newSignal() *signal { return &signal{c: make(chan struct{})} }
func (s *signal) fire()  { s.once.Do(func() { close(s.c) }) }
