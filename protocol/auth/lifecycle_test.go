package auth

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/pkg/remote"
	"github.com/cloudwego/kitex/pkg/remote/trans/gonet"
	"github.com/cloudwego/kitex/pkg/utils"
)

// slowShutdown is a transport whose Shutdown closes the listener and then waits for
// release, as gonet's waits for its next check; conns is its connection count. It
// serves as gonet does: records the listener, then accepts until it is closed.
type slowShutdown struct {
	ln      atomic.Value // net.Listener
	conns   atomic.Int64
	release chan struct{}
}

func (s *slowShutdown) CreateListener(net.Addr) (net.Listener, error) { return nil, nil }
func (s *slowShutdown) BootstrapServer(ln net.Listener) error {
	s.ln.Store(ln)
	for {
		if _, err := ln.Accept(); err != nil {
			return nil
		}
	}
}
func (s *slowShutdown) Shutdown() error {
	s.ln.Load().(net.Listener).Close()
	<-s.release
	return nil
}
func (s *slowShutdown) ConnCount() utils.AtomicInt { return utils.AtomicInt(s.conns.Load()) }

var _ remote.TransServer = (*slowShutdown)(nil)

// within waits for c, failing the test after 10 s.
func within(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10 s", what)
	}
}

// A stopping server returns as soon as its listener is closed and no connection is
// left, not at the transport's next check; while a connection is left it waits for
// the transport's own shutdown.
func TestPromptShutdown(t *testing.T) {
	for _, left := range []int64{0, 1} {
		raw, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		inner := &slowShutdown{release: make(chan struct{})}
		inner.conns.Store(left)
		s := &servedServer{TransServer: inner, started: newStartSignal(), closed: newSignal()}
		s.started.running() // (Kitex's Run would, asking for its exit signal)
		served := make(chan struct{})
		go func() {
			defer close(served)
			s.BootstrapServer(raw)
		}()
		within(t, s.started.s.c, "the server's first accept")
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			s.Shutdown()
		}()
		if left != 0 {
			select {
			case <-stopped:
				t.Fatalf("%d connection(s) left: Shutdown returned before the transport's", left)
			case <-time.After(200 * time.Millisecond):
			}
			close(inner.release)
		}
		within(t, stopped, "Shutdown")
		if left == 0 {
			close(inner.release)
		}
		within(t, served, "the accept loop's end")
	}
}

// closeAware is a transport handler whose graceful shutdown does nothing, as Kitex's
// default handler's does (it only flags it); nothing else of it is called here.
type closeAware struct{ remote.ServerTransHandler }

func (closeAware) GracefulShutdown(context.Context) error { return nil }

// The gonet transport is served through noteClose: its first Accept says it serves,
// and its Shutdown's Close of the listener is seen, which lets served's Shutdown return
// before gonet's next check.
func TestServedWrapsGonet(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := served{TransServerFactory: gonet.NewTransServerFactory(), started: newStartSignal()}
	s := f.NewTransServer(&remote.ServerOption{ExitWaitTime: time.Minute}, closeAware{}).(*servedServer)
	f.started.running()
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		s.BootstrapServer(raw)
	}()
	within(t, f.started.s.c, "the server's first accept")
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.closed.c:
	default:
		t.Fatal("Shutdown returned without gonet closing the listener through noteClose")
	}
	within(t, ran, "the accept loop's end")
}

// A server says it serves only once both its transport accepts and Kitex's Run asked
// for its exit signal, in either order: Run checks the transport's first result after
// starting it, and a Stop before that check made the transport return nil there, which
// Run's log of it dereferenced (a fresh-clone CI run: an owner stopped at once after
// it started panicked).
func TestStartSignalNeedsBoth(t *testing.T) {
	for _, order := range [][]string{{"accept", "run"}, {"run", "accept"}} {
		b := newStartSignal()
		for i, ev := range order {
			if ev == "accept" {
				b.accepting()
				b.accepting() // (every Accept says so)
			} else {
				b.running()
			}
			select {
			case <-b.s.c:
				if i == 0 {
					t.Fatalf("%v: the signal fired after %s alone", order, ev)
				}
			default:
				if i == 1 {
					t.Fatalf("%v: the signal did not fire after both", order)
				}
			}
		}
	}
}
