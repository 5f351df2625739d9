package transfer

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
)

// segment maps n bytes of anonymous shared memory, as a stand-in for an owner's
// segment; random contents when fill is set.
func segment(t testing.TB, n int, fill bool) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	if fill {
		rand.Read(b)
	}
	return b
}

type span struct{ off, len int64 }

// testSource retains ranges of seg for transfer ids, fenced to one node incarnation,
// as an owner does for the transfers the master planned.
type testSource struct {
	seg  []byte
	node string
	gen  int64

	mu       sync.Mutex // protects retained
	retained map[int64]span

	opens, releases atomic.Int64
}

func newTestSource(seg []byte) *testSource {
	return &testSource{seg: seg, node: "node-a", gen: 7, retained: map[int64]span{}}
}

func (s *testSource) retain(id int64, off, n int64) Fence {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retained[id] = span{off, n}
	return Fence{SourceNode: s.node, SourceGeneration: s.gen, TransferID: id}
}

func (s *testSource) Open(f Fence, off, n int64) ([]byte, func(), error) {
	s.opens.Add(1)
	if f.SourceNode != s.node || f.SourceGeneration != s.gen {
		return nil, nil, fmt.Errorf("%w: this is node %q generation %d", ErrFenced, s.node, s.gen)
	}
	s.mu.Lock()
	r, ok := s.retained[f.TransferID]
	s.mu.Unlock()
	if !ok {
		return nil, nil, fmt.Errorf("%w: transfer %d is not retained", ErrFenced, f.TransferID)
	}
	if off < r.off || off+n > r.off+r.len {
		return nil, nil, fmt.Errorf("%w: range [%d,+%d) is outside transfer %d's [%d,+%d)", ErrFenced, off, n, f.TransferID, r.off, r.len)
	}
	return s.seg[off : off+n], func() { s.releases.Add(1) }, nil
}

// failSource fails every Open with a non-fence error.
type failSource struct{}

func (failSource) Open(Fence, int64, int64) ([]byte, func(), error) {
	return nil, nil, errors.New("the source is shutting down")
}

func secrets(t testing.TB) *auth.Secrets { return authtest.Secrets(t) }

// startServer serves src on loopback; closed at cleanup.
func startServer(t testing.TB, src Source, opts ServerOptions) *Server {
	t.Helper()
	s, err := Listen("127.0.0.1:0", src, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newClient(t testing.TB, opts ClientOptions) *Client {
	c := NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// checkLeaks registers, first, a cleanup that runs last: goroutines and open fds
// must come back to what they were when the test started.
func checkLeaks(t *testing.T) {
	t.Helper()
	g0, f0 := runtime.NumGoroutine(), openFDs()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			g, f := runtime.NumGoroutine(), openFDs()
			if g <= g0 && f <= f0 {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Fatalf("leak: %d goroutines (was %d), %d fds (was %d)\n%s", g, g0, f, f0, buf)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(ents)
}

// waitFor polls cond (the server releases a range after its last write, which may be
// after the puller returned).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitIdleClosed waits until srv has closed every connection (its IdleTimeout), instead
// of sleeping a multiple of it: a busy machine may run the server's close late, and a
// pull on a connection the server has not closed yet reuses it (one dial fewer).
func waitIdleClosed(t *testing.T, srv *Server) {
	t.Helper()
	waitFor(t, "the server to close its idle connections", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.conns) == 0
	})
}
