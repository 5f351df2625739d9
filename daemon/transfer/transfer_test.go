package transfer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth"
)

const mib = 1 << 20

// TestPullSizes pulls byte-exact ranges of several sizes, at odd offsets, from one
// mapping into another over one pooled connection.
func TestPullSizes(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 40*mib, true))
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	cl := newClient(t, ClientOptions{Secrets: sec})
	dstSeg := segment(t, 40*mib, false)
	off := int64(3)
	for i, n := range []int64{1, 4095, 4 * mib, 16*mib + 1} {
		f := src.retain(int64(100+i), off, n)
		dst := dstSeg[off+5 : off+5+n]
		if err := cl.Pull(context.Background(), srv.Addr().String(), f, off, dst); err != nil {
			t.Fatalf("pull %d bytes: %v", n, err)
		}
		if !bytes.Equal(dst, src.seg[off:off+n]) {
			t.Fatalf("pull %d bytes at %d: bytes differ", n, off)
		}
		off += n + 7
	}
	if d := cl.dials.Load(); d != 1 {
		t.Errorf("%d dials for 4 sequential pulls, want 1 (pooled)", d)
	}
	waitFor(t, "4 opens and 4 releases", func() bool { return src.opens.Load() == 4 && src.releases.Load() == 4 })
}

// TestPullConcurrent runs 4 goroutines of pulls over the pool.
func TestPullConcurrent(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 8*mib, true))
	f := src.retain(1, 0, 8*mib)
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	cl := newClient(t, ClientOptions{Secrets: sec})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, 2*mib+int64(g))
			for i := range 10 {
				off := int64((g*10 + i) * 97 % (6 * mib))
				if err := cl.Pull(context.Background(), srv.Addr().String(), f, off, dst); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(dst, src.seg[off:off+int64(len(dst))]) {
					errs <- errors.New("bytes differ")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if d := cl.dials.Load(); d > 4 {
		t.Errorf("%d dials for 4 concurrent pullers, want at most 4", d)
	}
}

// TestFenced: a wrong node, generation, transfer or range is refused with ErrFenced,
// dst stays untouched, and the connection serves the next pull.
func TestFenced(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, mib, true))
	good := src.retain(5, 1000, 5000)
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	cl := newClient(t, ClientOptions{Secrets: sec})
	addr := srv.Addr().String()
	cases := []struct {
		name   string
		f      Fence
		off, n int64
	}{
		{"generation", Fence{SourceNode: good.SourceNode, SourceGeneration: good.SourceGeneration + 1, TransferID: good.TransferID}, 1000, 5000},
		{"node", Fence{SourceNode: "node-b", SourceGeneration: good.SourceGeneration, TransferID: good.TransferID}, 1000, 5000},
		{"transfer", Fence{SourceNode: good.SourceNode, SourceGeneration: good.SourceGeneration, TransferID: 6}, 1000, 5000},
		{"range before", good, 999, 10},
		{"range after", good, 5000, 1001},
		{"beyond the segment", good, mib - 1, 100},
	}
	for _, tc := range cases {
		dst := bytes.Repeat([]byte{0xEE}, int(tc.n))
		err := cl.Pull(context.Background(), addr, tc.f, tc.off, dst)
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("%s: got %v, want ErrFenced", tc.name, err)
		}
		if !bytes.Equal(dst, bytes.Repeat([]byte{0xEE}, int(tc.n))) {
			t.Fatalf("%s: dst written by a refused pull", tc.name)
		}
		t.Logf("%s: %v", tc.name, err)
	}
	dst := make([]byte, 5000)
	if err := cl.Pull(context.Background(), addr, good, 1000, dst); err != nil || !bytes.Equal(dst, src.seg[1000:6000]) {
		t.Fatalf("pull after refusals: %v", err)
	}
	if d := cl.dials.Load(); d != 1 {
		t.Errorf("%d dials, want 1: a refusal keeps the connection", d)
	}
	waitFor(t, "the range released", func() bool { return src.releases.Load() == 1 })
}

// TestUnavailable: a Source error that is not a fence answers UNAVAILABLE
// (ErrUnreachable), the connection stays usable.
func TestUnavailable(t *testing.T) {
	checkLeaks(t)
	srv := startServer(t, failSource{}, ServerOptions{})
	cl := newClient(t, ClientOptions{})
	for range 2 {
		err := cl.Pull(context.Background(), srv.Addr().String(), Fence{SourceNode: "x"}, 0, make([]byte, 10))
		if !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrFenced) {
			t.Fatalf("got %v, want ErrUnreachable", err)
		}
	}
	if d := cl.dials.Load(); d != 1 {
		t.Errorf("%d dials, want 1", d)
	}
}

// TestUnauthenticated: plain TCP, a wrong secret and an insecure client are refused
// before any Source.Open.
func TestUnauthenticated(t *testing.T) {
	checkLeaks(t)
	src := newTestSource(segment(t, mib, true))
	f := src.retain(1, 0, mib)
	srv := startServer(t, src, ServerOptions{Secrets: secrets(t)})
	addr := srv.Addr().String()

	// Plain TCP: a well-formed request without a handshake.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	raw.Write(appendRequest(nil, request{op: opPull, fence: f, offset: 0, length: 100}))
	got, _ := io.ReadAll(raw) // the server's hello and refusal, then EOF
	raw.Close()
	if bytes.Contains(got, []byte(frameMagic)) {
		t.Fatalf("plain TCP client got a data-plane reply: %q", got)
	}

	for name, opts := range map[string]ClientOptions{
		"wrong secret": {Secrets: secrets(t)},
		"insecure":     {},
	} {
		cl := NewClient(opts)
		dst := make([]byte, 100)
		err := cl.Pull(context.Background(), addr, f, 0, dst)
		cl.Close()
		if !errors.Is(err, ErrUnreachable) {
			t.Fatalf("%s: got %v, want ErrUnreachable", name, err)
		}
		if name == "wrong secret" && !errors.Is(err, auth.ErrAuthFailed) {
			t.Fatalf("%s: got %v, want auth.ErrAuthFailed", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	if n := src.opens.Load(); n != 0 {
		t.Fatalf("Source.Open called %d times for unauthenticated clients", n)
	}

	// A secure client against an insecure server fails clearly too.
	insecure := startServer(t, src, ServerOptions{})
	cl := newClient(t, ClientOptions{Secrets: secrets(t)})
	if err := cl.Pull(context.Background(), insecure.Addr().String(), f, 0, make([]byte, 10)); !errors.Is(err, auth.ErrAuthFailed) {
		t.Fatalf("secure client, insecure server: got %v", err)
	}
}

// TestBadRequest: a malformed header after a good handshake is answered BAD_REQUEST
// and the connection closed; nothing is allocated from its length fields.
func TestBadRequest(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, mib, true))
	f := src.retain(1, 0, mib)
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	for name, mutate := range map[string]func([]byte) []byte{
		"node id too long": func(b []byte) []byte { binary.BigEndian.PutUint16(b[6:], 60000); return b },
		"version":          func(b []byte) []byte { b[4] = 9; return b },
		"op":               func(b []byte) []byte { b[5] = 7; return b },
		"negative length":  func(b []byte) []byte { binary.BigEndian.PutUint64(b[32:], 1<<63); return b },
		"zero length":      func(b []byte) []byte { binary.BigEndian.PutUint64(b[32:], 0); return b },
	} {
		conn, err := net.DialTimeout("tcp", srv.Addr().String(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := auth.ClientHandshake(conn, sec, auth.PurposeData, srv.Addr().String(), time.Second); err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write(mutate(appendRequest(nil, request{op: opPull, fence: f, offset: 0, length: 100})))
		got, _ := io.ReadAll(conn)
		conn.Close()
		if len(got) < responseFixedLen {
			t.Fatalf("%s: reply %q", name, got)
		}
		status, _, _, err := parseResponseFixed(got)
		if err != nil || status != statusBadRequest {
			t.Fatalf("%s: status %s, err %v", name, statusName(status), err)
		}
		t.Logf("%s: %s", name, got[responseFixedLen:])
	}
	if n := src.opens.Load(); n != 0 {
		t.Fatalf("Source.Open called %d times for bad requests", n)
	}
}

// blockingServer serves src with a hook that, once a serve reaches half of a pull of
// more than 8 MiB, signals reached and blocks until release is closed.
func blockingServer(t *testing.T, src Source, sec *auth.Secrets) (srv *Server, reached <-chan struct{}, release func()) {
	r := make(chan struct{}, 16)
	rel := make(chan struct{})
	var once sync.Once
	srv = startServer(t, src, ServerOptions{Secrets: sec, beforeChunk: func(off int) {
		if off >= 8*mib {
			r <- struct{}{}
			<-rel
		}
	}})
	return srv, r, func() { once.Do(func() { close(rel) }) }
}

// TestStalledSource: a source that stops writing halfway fails the pull within the
// progress timeout; the connection is not pooled again.
func TestStalledSource(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 17*mib, true))
	f := src.retain(1, 0, 16*mib+1)
	srv, _, release := blockingServer(t, src, sec)
	t.Cleanup(release) // before the server's Close (cleanups run in reverse)
	const progress = 200 * time.Millisecond
	cl := newClient(t, ClientOptions{Secrets: sec, ProgressTimeout: progress})
	start := time.Now()
	err := cl.Pull(context.Background(), srv.Addr().String(), f, 0, make([]byte, 16*mib+1))
	took := time.Since(start)
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want ErrUnreachable by the progress deadline", err)
	}
	if took > 10*progress {
		t.Fatalf("stalled pull failed after %v, progress timeout %v", took, progress)
	}
	t.Logf("failed after %v: %v", took, err)
	cl.mu.Lock()
	idle := len(cl.idle)
	cl.mu.Unlock()
	if idle != 0 {
		t.Fatal("a connection that failed mid-pull was pooled")
	}
}

// TestCutLink: the server closes its listener and connections mid-transfer; the pull
// fails at once (not by its progress deadline), and the next one fails to dial.
func TestCutLink(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 17*mib, true))
	f := src.retain(1, 0, 16*mib+1)
	srv, reached, release := blockingServer(t, src, sec)
	cl := newClient(t, ClientOptions{Secrets: sec, ProgressTimeout: 20 * time.Second})
	addr := srv.Addr().String()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- cl.Pull(context.Background(), addr, f, 0, make([]byte, 16*mib+1)) }()
	<-reached
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	time.Sleep(20 * time.Millisecond) // let Close close the connections
	release()
	<-closed
	err := <-done
	if !errors.Is(err, ErrUnreachable) || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want ErrUnreachable from the cut", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("cut pull failed after %v", took)
	}
	t.Logf("cut: %v", err)
	if err := cl.Pull(context.Background(), addr, f, 0, make([]byte, 10)); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("pull from a closed server: %v", err)
	}
}

// TestContextCancel: cancelling the context aborts a pull that is waiting for bytes.
func TestContextCancel(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 17*mib, true))
	f := src.retain(1, 0, 16*mib+1)
	srv, reached, release := blockingServer(t, src, sec)
	t.Cleanup(release)
	cl := newClient(t, ClientOptions{Secrets: sec, ProgressTimeout: 20 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-reached; cancel() }()
	start := time.Now()
	err := cl.Pull(ctx, srv.Addr().String(), f, 0, make([]byte, 16*mib+1))
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnreachable) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("cancelled pull returned after %v", took)
	}
	// An already cancelled context fails before dialling.
	if err := cl.Pull(ctx, srv.Addr().String(), f, 0, make([]byte, 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
}

// TestServerCloseInFlight: Server.Close with pulls in flight returns, and every pull
// ends (succeeded, or failed with ErrUnreachable).
func TestServerCloseInFlight(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 16*mib, true))
	f := src.retain(1, 0, 16*mib)
	srv, err := Listen("127.0.0.1:0", src, ServerOptions{Secrets: sec})
	if err != nil {
		t.Fatal(err)
	}
	cl := newClient(t, ClientOptions{Secrets: sec})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	started := make(chan struct{}, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, 16*mib)
			for i := 0; ; i++ {
				if i == 1 {
					started <- struct{}{}
				}
				if err := cl.Pull(context.Background(), srv.Addr().String(), f, 0, dst); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 4 {
		<-started
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrUnreachable) {
			t.Errorf("pull during Close: %v, want ErrUnreachable", err)
		}
	}
	if o, r := src.opens.Load(), src.releases.Load(); o != r {
		t.Errorf("opens %d, releases %d: a range was not released", o, r)
	}
}

// TestClientCloseInFlight: Client.Close fails the pulls in flight and later ones.
func TestClientCloseInFlight(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 17*mib, true))
	f := src.retain(1, 0, 16*mib+1)
	srv, reached, release := blockingServer(t, src, sec)
	t.Cleanup(release)
	cl := NewClient(ClientOptions{Secrets: sec, ProgressTimeout: 20 * time.Second})
	done := make(chan error, 1)
	go func() { done <- cl.Pull(context.Background(), srv.Addr().String(), f, 0, make([]byte, 16*mib+1)) }()
	<-reached
	cl.Close()
	if err := <-done; !errors.Is(err, ErrUnreachable) {
		t.Fatalf("in flight: %v", err)
	}
	if err := cl.Pull(context.Background(), srv.Addr().String(), f, 0, make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// TestIdleClosedByServer: a pooled connection the server closed for idleness is
// noticed and replaced without failing the pull.
func TestIdleClosedByServer(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, mib, true))
	f := src.retain(1, 0, mib)
	srv := startServer(t, src, ServerOptions{Secrets: sec, IdleTimeout: 50 * time.Millisecond})
	cl := newClient(t, ClientOptions{Secrets: sec})
	dst := make([]byte, 1000)
	for i := range 3 {
		if err := cl.Pull(context.Background(), srv.Addr().String(), f, 0, dst); err != nil {
			t.Fatalf("pull %d: %v", i, err)
		}
		waitIdleClosed(t, srv)
	}
	if d := cl.dials.Load(); d != 3 {
		t.Errorf("%d dials, want 3 (each idle connection closed by the server)", d)
	}
}

// TestConnCap: connections beyond MaxConns are closed at once.
func TestConnCap(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, mib, true))
	f := src.retain(1, 0, mib)
	srv := startServer(t, src, ServerOptions{Secrets: sec, MaxConns: 2})
	var clients []*Client
	var failed int
	for range 3 {
		cl := newClient(t, ClientOptions{Secrets: sec}) // each keeps its connection pooled
		clients = append(clients, cl)
		if err := cl.Pull(context.Background(), srv.Addr().String(), f, 0, make([]byte, 10)); err != nil {
			if !errors.Is(err, ErrUnreachable) {
				t.Fatalf("over the cap: %v", err)
			}
			t.Logf("over the cap: %v", err)
			failed++
		}
	}
	if failed != 1 {
		t.Fatalf("%d pulls failed with MaxConns 2 and 3 connections, want 1", failed)
	}
	clients[0].Close() // frees a slot
	// Once the server has seen that close (not a fixed 50 ms, which a busy machine may
	// not give its connection goroutine).
	waitFor(t, "the server to free the closed connection's slot", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.authed < 2
	})
	if err := clients[2].Pull(context.Background(), srv.Addr().String(), f, 0, make([]byte, 10)); err != nil {
		t.Fatalf("after a slot was freed: %v", err)
	}
}

// TestMetrics: a server and a client of one node share the transfer counters.
func TestMetrics(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	m := metrics.New()
	src := newTestSource(segment(t, mib, true))
	f := src.retain(1, 0, 1000)
	srv := startServer(t, src, ServerOptions{Secrets: sec, Metrics: m})
	cl := newClient(t, ClientOptions{Secrets: sec, Metrics: m})
	if err := cl.Pull(context.Background(), srv.Addr().String(), f, 0, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Pull(context.Background(), srv.Addr().String(), f, 1, make([]byte, 1000)); !errors.Is(err, ErrFenced) {
		t.Fatal(err)
	}
	want := map[string]float64{
		`fluxkv_transfer_bytes_total{dir="pull"}`:                 1000,
		`fluxkv_transfer_bytes_total{dir="serve"}`:                1000,
		`fluxkv_transfer_errors_total{dir="pull",kind="fenced"}`:  1,
		`fluxkv_transfer_errors_total{dir="serve",kind="fenced"}`: 1,
	}
	waitFor(t, "the counters", func() bool {
		got := map[string]float64{}
		mfs, err := m.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, mt := range mf.GetMetric() {
				name := mf.GetName() + "{"
				for i, l := range mt.GetLabel() {
					if i > 0 {
						name += ","
					}
					name += l.GetName() + `="` + l.GetValue() + `"`
				}
				got[name+"}"] = mt.GetCounter().GetValue()
			}
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
}

// slowStagedSource answers staged pulls after delay (a chunk still being read from
// SSD), plain ones at once.
type slowStagedSource struct {
	*testSource
	delay time.Duration
}

func (s slowStagedSource) Open(f Fence, off, n int64) ([]byte, func(), error) {
	if f.Staged {
		time.Sleep(s.delay)
		f.Staged = false
	}
	return s.testSource.Open(f, off, n)
}

// waitingStagedSource is slowStagedSource as a WaitingSource: the server waits on its
// own goroutine, and the source says it is alive every WaitInterval while it waits.
type waitingStagedSource struct {
	*testSource
	delay  time.Duration
	gaveUp *atomic.Int64 // waits ended by a failed alive
	// lendAnyway breaks the contract: after alive failed it lends the range all the
	// same (the server must give it back).
	lendAnyway bool
}

func (s waitingStagedSource) Open(f Fence, off, n int64) ([]byte, func(), error) {
	return s.OpenWaiting(f, off, n, nil)
}

func (s waitingStagedSource) OpenWaiting(f Fence, off, n int64, alive func() error) ([]byte, func(), error) {
	if f.Staged {
		for end := time.Now().Add(s.delay); time.Now().Before(end); {
			time.Sleep(min(WaitInterval, time.Until(end)))
			if alive != nil && time.Now().Before(end) {
				if err := alive(); err != nil {
					s.gaveUp.Add(1)
					if s.lendAnyway {
						f.Staged = false
						return s.testSource.Open(f, off, n)
					}
					return nil, nil, err
				}
			}
		}
		f.Staged = false
	}
	return s.testSource.Open(f, off, n)
}

// TestStagedWait: a staged pull whose source takes several progress deadlines to have
// its chunk succeeds, kept alive by WAIT statuses (a silent source fails by the
// progress deadline: TestStalledSource), whether the server waits for the source on a
// goroutine of its own or the source waits on the server's (WaitingSource).
func TestStagedWait(t *testing.T) {
	const progress = 4 * waitInterval
	for _, tc := range []struct {
		name string
		src  func(*testSource) Source
	}{
		{"source", func(s *testSource) Source { return slowStagedSource{s, 3 * progress} }},
		{"waiting-source", func(s *testSource) Source { return waitingStagedSource{s, 3 * progress, new(atomic.Int64), false} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			sec := secrets(t)
			src := newTestSource(segment(t, 5*mib, true))
			f := src.retain(1, 0, 4*mib)
			srv := startServer(t, tc.src(src), ServerOptions{Secrets: sec})
			cl := newClient(t, ClientOptions{Secrets: sec, ProgressTimeout: progress})
			dst := make([]byte, 4*mib)
			staged := f
			staged.Staged = true
			if err := cl.Pull(context.Background(), srv.Addr().String(), staged, 0, dst); err != nil {
				t.Fatalf("staged pull of a slow chunk: %v", err)
			}
			if !bytes.Equal(dst, src.seg[:4*mib]) {
				t.Fatal("staged pull: wrong bytes")
			}
			waitFor(t, "release", func() bool { return src.releases.Load() == 1 })
		})
	}
}

// TestStagedWaitPullerGone: the puller of a staged pull gives up while a WaitingSource
// waits for the chunk. The server's next WAITs find the connection closed: the source
// stops waiting then (not when its chunk would have been read), lends nothing, and the
// serving goroutine and connection end. A source that lends the range all the same
// gets it back, and nothing more is sent.
func TestStagedWaitPullerGone(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lendAnyway bool
	}{{"source stops", false}, {"source lends anyway", true}} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			sec := secrets(t)
			src := newTestSource(segment(t, mib, true))
			f := src.retain(1, 0, mib)
			gaveUp := new(atomic.Int64)
			srv := startServer(t, waitingStagedSource{src, time.Minute, gaveUp, tc.lendAnyway}, ServerOptions{Secrets: sec})
			cl := newClient(t, ClientOptions{Secrets: sec, ProgressTimeout: time.Minute})
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			staged := f
			staged.Staged = true
			if err := cl.Pull(ctx, srv.Addr().String(), staged, 0, make([]byte, mib)); err == nil {
				t.Fatal("a pull cancelled while its chunk waits succeeded")
			}
			waitFor(t, "the source to stop waiting", func() bool { return gaveUp.Load() == 1 })
			if tc.lendAnyway {
				waitFor(t, "the range lent after the puller left given back", func() bool { return src.releases.Load() == 1 })
				if o := src.opens.Load(); o != 1 {
					t.Errorf("%d ranges opened, want 1", o)
				}
			} else if o := src.opens.Load(); o != 0 {
				t.Errorf("%d ranges opened for a pull whose puller left", o)
			}
			waitIdleClosed(t, srv)
		})
	}
}
