package transfer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/metrics"
)

// TestPullMany: a batch of more values than pipelineDepth, some refused, comes over
// one pooled connection; each refused or invalid item fails alone, every other one
// holds its bytes, and the connection stays in step for the next batch.
func TestPullMany(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 6*mib, true))
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	cl := newClient(t, ClientOptions{Secrets: sec})
	addr := srv.Addr().String()

	const n = 3*pipelineDepth + 5
	items := make([]PullItem, n)
	want := make([][]byte, n)
	off := int64(0)
	for i := range items {
		size := int64(1000 + 997*i)
		f := src.retain(int64(i+1), off, size)
		items[i] = PullItem{Fence: f, Offset: off, Dst: make([]byte, size)}
		want[i] = src.seg[off : off+size]
		off += size + 512
	}
	fenced := map[int]bool{7: true, pipelineDepth: true, n - 1: true}
	items[7].Fence.TransferID = 10_000            // not retained
	items[pipelineDepth].Fence.SourceGeneration++ // another incarnation
	items[n-1].Offset++                           // outside its transfer's range
	invalid := map[int]bool{3: true, 40: true}
	items[3].Dst = nil    // no bytes
	items[40].Offset = -1 // a negative offset

	for round := range 2 {
		for i := range items {
			clear(items[i].Dst)
		}
		errs := cl.PullMany(context.Background(), addr, items)
		for i, err := range errs {
			switch {
			case fenced[i]:
				if !errors.Is(err, ErrFenced) {
					t.Fatalf("round %d item %d: got %v, want ErrFenced", round, i, err)
				}
			case invalid[i]:
				if err == nil || errors.Is(err, ErrFenced) || errors.Is(err, ErrUnreachable) {
					t.Fatalf("round %d item %d: got %v, want an invalid pull", round, i, err)
				}
			case err != nil:
				t.Fatalf("round %d item %d: %v", round, i, err)
			case !bytes.Equal(items[i].Dst, want[i]):
				t.Fatalf("round %d item %d: wrong bytes", round, i)
			}
		}
	}
	if d := cl.dials.Load(); d != 1 {
		t.Errorf("%d dials for two batches under %d bytes, want 1 pooled connection", d, pipelineRunBytes)
	}
	// Every valid request reached the source; nothing was opened for the invalid ones.
	if o := src.opens.Load(); o != 2*(n-int64(len(invalid))) {
		t.Errorf("source opened %d ranges, want %d", o, 2*(n-int64(len(invalid))))
	}
	waitFor(t, "every opened range released", func() bool { return src.releases.Load() == 2*(n-int64(len(invalid))-int64(len(fenced))) })
}

// TestPullManyRuns: a batch of more than pipelineRunBytes goes in runs of its own
// connections (at most MaxPullsPerPeer), and every byte lands.
func TestPullManyRuns(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 26*mib, true))
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	cl := newClient(t, ClientOptions{Secrets: sec, MaxPullsPerPeer: 2})
	var items []PullItem
	for i := range 24 {
		off := int64(i) * mib
		items = append(items, PullItem{Fence: src.retain(int64(i+1), off, mib), Offset: off, Dst: make([]byte, mib)})
	}
	for i, err := range cl.PullMany(context.Background(), srv.Addr().String(), items) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
		if !bytes.Equal(items[i].Dst, src.seg[int64(i)*mib:int64(i+1)*mib]) {
			t.Fatalf("item %d: wrong bytes", i)
		}
	}
	if d := cl.dials.Load(); d != 2 {
		t.Errorf("%d dials for a 24 MiB batch with MaxPullsPerPeer 2, want 2", d)
	}
	if got := splitRuns(items, []int{0, 1, 2}, 3*mib, 4); len(got) != 1 {
		t.Errorf("3 MiB split into %d runs, want 1", len(got))
	}
	idx := make([]int, 24)
	for i := range idx {
		idx[i] = i
	}
	runs := splitRuns(items, idx, 24*mib, 4)
	if len(runs) != 3 || len(runs[0])+len(runs[1])+len(runs[2]) != 24 || runs[0][0] != 0 || runs[2][len(runs[2])-1] != 23 {
		t.Errorf("24 MiB in runs of %d MiB at most 4: %v", pipelineRunBytes>>20, runs)
	}
}

// TestPullManyStalled: a source that stops halfway through a batch's second value
// fails it and the values after it by the progress deadline, not the first; the
// connection is not pooled again.
func TestPullManyStalled(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, 18*mib, true))
	srv, _, release := blockingServer(t, src, sec)
	t.Cleanup(release)
	const progress = 200 * time.Millisecond
	cl := newClient(t, ClientOptions{Secrets: sec, ProgressTimeout: progress, MaxPullsPerPeer: 1})
	items := []PullItem{
		{Fence: src.retain(1, 0, 1000), Offset: 0, Dst: make([]byte, 1000)},
		{Fence: src.retain(2, mib, 16*mib), Offset: mib, Dst: make([]byte, 16*mib)},
		{Fence: src.retain(3, 17*mib, 1000), Offset: 17 * mib, Dst: make([]byte, 1000)},
	}
	start := time.Now()
	errs := cl.PullMany(context.Background(), srv.Addr().String(), items)
	if took := time.Since(start); took > 10*progress {
		t.Fatalf("stalled batch failed after %v, progress timeout %v", took, progress)
	}
	if errs[0] != nil || !bytes.Equal(items[0].Dst, src.seg[:1000]) {
		t.Fatalf("the value before the stall: %v", errs[0])
	}
	for _, i := range []int{1, 2} {
		if !errors.Is(errs[i], ErrUnreachable) || !errors.Is(errs[i], os.ErrDeadlineExceeded) {
			t.Fatalf("item %d: got %v, want ErrUnreachable by the progress deadline", i, errs[i])
		}
	}
	cl.mu.Lock()
	idle := len(cl.idle)
	cl.mu.Unlock()
	if idle != 0 {
		t.Fatal("a connection that failed mid-batch was pooled")
	}
}

// TestPullManyIdleClosed: a pooled connection the server closed meanwhile is
// replaced once, without failing the batch; a cancelled context fails every item.
func TestPullManyIdleClosed(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	src := newTestSource(segment(t, mib, true))
	srv := startServer(t, src, ServerOptions{Secrets: sec, IdleTimeout: 50 * time.Millisecond})
	cl := newClient(t, ClientOptions{Secrets: sec})
	items := []PullItem{
		{Fence: src.retain(1, 0, 1000), Offset: 0, Dst: make([]byte, 1000)},
		{Fence: src.retain(2, 4096, 5000), Offset: 4096, Dst: make([]byte, 5000)},
	}
	for i := range 2 {
		for j, err := range cl.PullMany(context.Background(), srv.Addr().String(), items) {
			if err != nil {
				t.Fatalf("batch %d item %d: %v", i, j, err)
			}
		}
		waitIdleClosed(t, srv)
	}
	if d := cl.dials.Load(); d != 2 {
		t.Errorf("%d dials, want 2 (the idle connection closed by the server)", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for j, err := range cl.PullMany(ctx, srv.Addr().String(), items) {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled batch item %d: %v", j, err)
		}
	}
}

// slowStaged delays the staged opens of one transfer, as a source still reading its
// chunk from SSD does.
type slowStaged struct {
	*testSource
	delays map[int64]time.Duration // transfer id -> how long its staged chunk takes
}

func (s slowStaged) Open(f Fence, off, n int64) ([]byte, func(), error) {
	if f.Staged {
		time.Sleep(s.delays[f.TransferID])
	}
	return s.testSource.Open(f, off, n)
}

// TestPullManyStaged: staged pulls go pipelined too, answered in order: a chunk the
// source reads for longer than a WAIT interval delays the items after it but fails
// none of them (the WAITs keep the progress deadline away, also right after an item
// answered quickly: the wait for a header always gets the whole progress timeout), and
// a run of staged pulls takes none of the peer's MaxPullsPerPeer slots.
func TestPullManyStaged(t *testing.T) {
	for _, tc := range []struct {
		name   string
		delays map[int64]time.Duration
	}{
		{"slow item", map[int64]time.Duration{2: 3 * waitInterval / 2}},
		{"slow item after a quick one", map[int64]time.Duration{1: 70 * time.Millisecond, 2: 3 * waitInterval / 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			sec := secrets(t)
			src := newTestSource(segment(t, mib, true))
			srv := startServer(t, slowStaged{src, tc.delays}, ServerOptions{Secrets: sec})
			cl := newClient(t, ClientOptions{Secrets: sec, ProgressTimeout: waitInterval * 5 / 4, MaxPullsPerPeer: 1})
			addr := srv.Addr().String()
			// A memory pull holds the peer's only slot meanwhile.
			g, _, err := cl.enter(context.Background(), addr, Fence{SourceNode: src.node})
			if err != nil {
				t.Fatal(err)
			}
			defer cl.leave(addr, g, "", nil)
			var items []PullItem
			for i := range 5 {
				off := int64(i) * 10_000
				f := src.retain(int64(i+1), off, 9000)
				f.Staged = true
				items = append(items, PullItem{Fence: f, Offset: off, Dst: make([]byte, 9000)})
			}
			for i, err := range cl.PullMany(context.Background(), addr, items) {
				if err != nil {
					t.Fatalf("item %d: %v", i, err)
				}
				if !bytes.Equal(items[i].Dst, src.seg[items[i].Offset:items[i].Offset+9000]) {
					t.Fatalf("item %d: wrong bytes", i)
				}
			}
		})
	}
}

// TestPullManyAllRefused: a batch whose every item is refused before any pull fails
// item by item and dials nothing (it panicked on its empty list of runs).
func TestPullManyAllRefused(t *testing.T) {
	cl := newClient(t, ClientOptions{Secrets: secrets(t)})
	items := []PullItem{{Offset: 0, Dst: nil}, {Offset: -1, Dst: make([]byte, 8)}}
	errs := cl.PullMany(context.Background(), "127.0.0.1:1", items)
	for i, err := range errs {
		if err == nil || errors.Is(err, ErrUnreachable) {
			t.Errorf("item %d: %v, want an invalid pull", i, err)
		}
	}
	if d := cl.dials.Load(); d != 0 {
		t.Errorf("%d dials for a batch with nothing to pull", d)
	}
}

// TestIdleConnsOfGonePeersClosed: pooled connections to a peer that went away (and is
// never pulled from again: its successor listens elsewhere) are closed once idle past
// IdleTimeout, at the next pull from any peer.
func TestIdleConnsOfGonePeersClosed(t *testing.T) {
	sec := secrets(t)
	src := newTestSource(segment(t, mib, true))
	f := src.retain(1, 0, 8192)
	cl := newClient(t, ClientOptions{Secrets: sec, IdleTimeout: 100 * time.Millisecond})
	var gone []string
	for range 3 {
		srv := startServer(t, src, ServerOptions{Secrets: sec})
		addr := srv.Addr().String()
		if err := cl.Pull(context.Background(), addr, f, 0, make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, addr)
		srv.Close()
	}
	pooled := func() (n int) {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		for _, a := range gone {
			n += len(cl.idle[a])
		}
		return n
	}
	if pooled() == 0 {
		t.Fatal("no connection pooled: the test did not reach the fault")
	}
	time.Sleep(300 * time.Millisecond)
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	if err := cl.Pull(context.Background(), srv.Addr().String(), f, 0, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if n := pooled(); n != 0 {
		t.Errorf("%d pooled connections to peers gone for 3 idle timeouts", n)
	}
}

// TestIdleConnsCappedAcrossPeers: the pool keeps at most MaxIdle idle connections to all
// peers together; one a pull ends with past the cap is closed (a review: 4 to each peer
// pulled from within a minute, uncounted by the owner's file descriptor budget).
func TestIdleConnsCappedAcrossPeers(t *testing.T) {
	sec := secrets(t)
	src := newTestSource(segment(t, mib, true))
	f := src.retain(1, 0, 8192)
	cl := newClient(t, ClientOptions{Secrets: sec, MaxIdle: 2})
	var addrs []string
	for range 4 {
		srv := startServer(t, src, ServerOptions{Secrets: sec})
		addrs = append(addrs, srv.Addr().String())
		if err := cl.Pull(context.Background(), addrs[len(addrs)-1], f, 0, make([]byte, 4096)); err != nil {
			t.Fatal(err)
		}
	}
	pooled := func() (n, counted int) {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		for _, list := range cl.idle {
			n += len(list)
		}
		return n, cl.nIdle
	}
	if n, counted := pooled(); n != 2 || counted != 2 {
		t.Fatalf("%d idle connections pooled (counted %d) after pulls from 4 peers, want MaxIdle 2", n, counted)
	}
	// A pull that reuses a pooled connection frees its place for the next one.
	if err := cl.Pull(context.Background(), addrs[0], f, 0, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if err := cl.Pull(context.Background(), addrs[3], f, 0, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if d := cl.dials.Load(); d != 5 {
		t.Errorf("%d dials, want 5 (4 peers, then the fourth again, whose connection was closed; the first's was reused)", d)
	}
	if n, counted := pooled(); n != 2 || counted != 2 {
		t.Errorf("%d idle connections pooled (counted %d), want 2", n, counted)
	}
}

// TestPullManyWaitCanceledCountsEachItem: a run of a batch that waited for a slot of
// the peer until its context ended counts one error for each of its items, as every
// other failure of a run does (it counted one for the whole run).
func TestPullManyWaitCanceledCountsEachItem(t *testing.T) {
	checkLeaks(t)
	sec := secrets(t)
	m := metrics.New()
	src := newTestSource(segment(t, mib, true))
	srv := startServer(t, src, ServerOptions{Secrets: sec})
	cl := newClient(t, ClientOptions{Secrets: sec, Metrics: m, MaxPullsPerPeer: 1})
	addr := srv.Addr().String()
	g, _, err := cl.enter(context.Background(), addr, Fence{SourceNode: src.node}) // the only slot
	if err != nil {
		t.Fatal(err)
	}
	defer cl.leave(addr, g, "", nil)
	var items []PullItem
	for i := range 3 {
		off := int64(i) * 10_000
		items = append(items, PullItem{Fence: src.retain(int64(i+1), off, 9000), Offset: off, Dst: make([]byte, 9000)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	for i, err := range cl.PullMany(ctx, addr, items) {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("item %d: %v, want the wait's deadline", i, err)
		}
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var canceled float64
	for _, mf := range mfs {
		if mf.GetName() != "fluxkv_transfer_errors_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			dir, kind := "", ""
			for _, l := range mt.GetLabel() {
				switch l.GetName() {
				case "dir":
					dir = l.GetValue()
				case "kind":
					kind = l.GetValue()
				}
			}
			if dir == metrics.TransferPull && kind == metrics.TransferErrCanceled {
				canceled += mt.GetCounter().GetValue()
			}
		}
	}
	if canceled != float64(len(items)) {
		t.Errorf("%v pull errors of kind canceled, want %d (one an item)", canceled, len(items))
	}
}
