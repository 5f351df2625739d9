package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/metrics"
)

// TestBatchPullsPerSource: a batch get through n2 of values held in n1's and n3's
// memory pulls each source's values pipelined (get_batch_pull.go) and completes them
// with one BatchGetDone; every byte is right. With n1's data plane gone (the owner
// still registered), n1's keys fail alone, each get revoked, while n3's still read
// back; nothing stays allocated on n2.
func TestBatchPullsPerSource(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	n := startNode(t, 64<<20, nil, master.Options{Metrics: mm, Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true})
	om := metrics.New()
	_, c2 := n.addOwner(t, "n2", 64<<20, nil, func(o *Options) { o.CacheGrace = -1; o.Metrics = om })
	_, c3 := n.addOwner(t, "n3", 64<<20, nil)
	var keys []string
	want := map[string][]byte{}
	onN1 := map[string]bool{}
	var total int
	for i := range 40 {
		k := fmt.Sprintf("bp-%d", i)
		c := n.c
		if i%4 == 3 {
			c = c3
		} else {
			onN1[k] = true
		}
		want[k] = value(i, 64<<10+i*513)
		total += len(want[k])
		if err := c.Put(k, want[k]); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		keys = append(keys, k)
	}
	calls := []string{"BatchGetStart", "GetStart", "BatchGetDone", "GetDone", "GetRevoke"}
	before := masterCalls(t, mm, calls...)
	pulled := counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"})
	hs, errs, err := c2.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if errs[i] != nil || hs[i] == nil || !bytes.Equal(hs[i].Bytes(), want[k]) || !hs[i].Remote() {
			t.Fatalf("%s: %v (holder %v)", k, errs[i], hs[i] != nil)
		}
		hs[i].Release()
	}
	if got := callsSince(t, mm, before); got["BatchGetStart"] != 1 || got["BatchGetDone"] != 1 || got["GetStart"]+got["GetDone"]+got["GetRevoke"] != 0 {
		t.Errorf("batch get of 40 values of two other owners: master calls %v, want one BatchGetStart and one BatchGetDone", got)
	}
	if got := counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"}) - pulled; got != float64(total) {
		t.Errorf("n2 pulled %v bytes, want %d", got, total)
	}

	// n1 stays registered but its data plane is gone: every pull from it fails.
	n.o.data.Close()
	before = masterCalls(t, mm, calls...)
	hs, errs, err = c2.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for i, k := range keys {
		switch {
		case !onN1[k] && (errs[i] != nil || hs[i] == nil || !bytes.Equal(hs[i].Bytes(), want[k])):
			t.Errorf("%s (on n3): %v (holder %v)", k, errs[i], hs[i] != nil)
		case onN1[k] && hs[i] != nil:
			t.Errorf("%s (on n1, data plane closed): got a holder", k)
		case onN1[k]:
			failed++
		}
		if hs[i] != nil {
			hs[i].Release()
		}
	}
	if got := callsSince(t, mm, before); got["GetRevoke"] != failed || failed != len(onN1) {
		t.Errorf("%d of n1's %d keys failed, master calls %v: want each revoked", failed, len(onN1), got)
	}
	// Every target the failed gets had on n2 is freed, every holder released.
	waitUntil(t, func() bool {
		c2.Flush()
		st, err := c2.Stat()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range st.Members {
			if m.NodeId == "n2" {
				return m.MemorySegment.UsedBytes == 0 && m.Holders == 0
			}
		}
		return false
	})
}

// TestBatchRefillsPerSource: a batch get through n2 of pages on n1's SSD only is one
// BatchSsdStageRead and two pipelined staged pulls (get_batch_pull.go): every page
// byte-exact, remote, from SSD. Their holders were recorded at BatchGetStart: the
// pages go out while n2's GetDones are held back, and are confirmed afterwards with one
// BatchGetDone; a lone get's value too (refillRemote). With n1's data plane gone, the pages fail alone (each get revoked) and
// n1 keeps every SSD replica: a failed pull is not a failed read.
func TestBatchRefillsPerSource(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	n := startNode(t, 4<<20, ssdOptions(t, 64<<20), master.Options{Metrics: mm, Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true})
	o2, c2 := n.addOwner(t, "n2", 16<<20, nil, func(o *Options) { o.CacheGrace = -1 })
	var keys []string
	want := map[string][]byte{}
	for i := range 24 {
		k := fmt.Sprintf("page-%d", i)
		want[k] = value(i, 64<<10+i*517)
		if err := n.c.Put(k, want[k]); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	for i := range 12 { // 3x n1's DRAM: the pages are on its SSD only
		if err := n.c.Put(fmt.Sprintf("filler-%d", i), value(100+i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	replicas := n.ssdReplicasOf(t, "n1")
	calls := []string{"BatchGetStart", "GetStart", "BatchGetDone", "GetDone", "GetRevoke"}
	before := masterCalls(t, mm, calls...)
	// n2's GetDones wait as behind a call already out, until it is let go.
	q := &o2.getDones
	q.mu.Lock()
	q.sending = true
	q.mu.Unlock()
	got := batchGetAsync(c2, keys)
	var a batchGetAnswer
	select {
	case a = <-got:
	case <-time.After(30 * time.Second):
		o2.sendQueued(nil)
		<-got
		t.Fatal("the batch get waited for its GetDones")
	}
	if a.err != nil {
		t.Fatal(a.err)
	}
	for i, k := range keys {
		if a.errs[i] != nil || a.hs[i] == nil || !bytes.Equal(a.hs[i].Bytes(), want[k]) {
			t.Fatalf("%s: %v (holder %v)", k, a.errs[i], a.hs[i] != nil)
		}
		if a.hs[i].Source() != "ssd" || !a.hs[i].Remote() {
			t.Errorf("%s: source %s remote %v, want a remote SSD refill", k, a.hs[i].Source(), a.hs[i].Remote())
		}
		a.hs[i].Release()
	}
	queued := func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.queue)
	}
	waitUntil(t, func() bool { return queued() >= len(keys) }) // (sent in the background)
	if n := queued(); n != len(keys) {
		t.Errorf("%d GetDones queued after the batch get, want %d", n, len(keys))
	}
	o2.sendQueued(nil) // lets them go
	waitUntil(t, func() bool { return callsSince(t, mm, before)["BatchGetDone"] >= 1 })
	if got := callsSince(t, mm, before); got["BatchGetStart"] != 1 || got["BatchGetDone"] != 1 || got["GetStart"]+got["GetDone"]+got["GetRevoke"] != 0 {
		t.Errorf("batch get of 24 pages on n1's SSD: master calls %v, want one BatchGetStart and one BatchGetDone", got)
	}

	// A lone get (refillRemote) goes out before its GetDone too.
	q.mu.Lock()
	q.sending = true
	q.mu.Unlock()
	lone := make(chan error, 1)
	go func() {
		h, err := c2.Get(keys[0])
		if err == nil {
			if !bytes.Equal(h.Bytes(), want[keys[0]]) || h.Source() != "ssd" || !h.Remote() {
				err = fmt.Errorf("wrong bytes or source (%s, remote %v)", h.Source(), h.Remote())
			}
			h.Release()
		}
		lone <- err
	}()
	select {
	case err := <-lone:
		if err != nil {
			t.Fatalf("lone get of %s: %v", keys[0], err)
		}
	case <-time.After(30 * time.Second):
		o2.sendQueued(nil)
		<-lone
		t.Fatal("the lone get waited for its GetDone")
	}
	waitUntil(t, func() bool { return queued() == 1 })
	o2.sendQueued(nil)

	n.o.data.Close()
	before = masterCalls(t, mm, calls...)
	hs, _, err := c2.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys { // a miss (the plan without n1 finds no copy) or an error
		if hs[i] != nil {
			hs[i].Release()
			t.Errorf("%s: a holder from an owner whose data plane is closed", k)
		}
	}
	if got := callsSince(t, mm, before); got["GetRevoke"] < len(keys) {
		t.Errorf("master calls %v: want every get revoked", got)
	}
	if got := n.ssdReplicasOf(t, "n1"); got != replicas {
		t.Errorf("n1 holds %d SSD replicas after failed pulls, %d before: a failed pull dropped its source", got, replicas)
	}
}

// TestBatchRefillCorruptSource: a batch get through n2 of pages whose records on n1's
// SSD are corrupt gets no holder for any of them (never other bytes): each failed read
// drops that SSD replica (drop_ssd_source). The requester's pipelined pulls of items
// whose refill already failed are answered at once (the stager remembers ended
// refills), so the batch is not held a session wait per page.
func TestBatchRefillCorruptSource(t *testing.T) {
	t.Parallel()
	n, c2, keys := ssdOnlyPages(t, 16)
	n.truncateShards(t)
	before := n.ssdReplicasOf(t, "n1")
	start := time.Now()
	hs, _, err := c2.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	for i, h := range hs {
		if h != nil {
			h.Release()
			t.Errorf("%s: a holder from a corrupt record", keys[i])
		}
	}
	t.Logf("batch of %d corrupt pages answered in %v", len(keys), took)
	if took > 2*stageSessionWait { // a session wait per page in each pipeline: over 5 s
		t.Errorf("batch of corrupt pages answered in %v: its pulls waited for sessions that had ended", took)
	}
	if after := n.ssdReplicasOf(t, "n1"); before-after < int64(len(keys)) {
		t.Errorf("n1's SSD replicas %d -> %d after %d failed reads: want each dropped", before, after, len(keys))
	}
	for i, k := range keys { // the replicas were dropped: a miss now, not an SSD read
		if h, err := c2.Get(k); err == nil {
			h.Release()
			t.Errorf("%s: a holder after its SSD replica was dropped", keys[i])
		}
	}
}

// pipelineFault is how faultyRuns breaks one of the two pipelines of a remote SSD
// refill.
type pipelineFault int

const (
	// breaks: the second PullMany loses its connection after its first two values;
	// the rest of that run fail unpulled, as on a reset.
	breaks pipelineFault = iota
	// hangs: the second pulls nothing and waits for its context to end.
	hangs
	// servedCancelled: the first takes every value from the source, but not into its
	// targets, and reports each cancelled once its context ends (the source sent the
	// bytes, the reader was cut off); the second pulls for real and reports its last
	// value as a broken connection once the first was served.
	servedCancelled
)

// faultyRuns is a puller with one pipeline of each refill broken as fault says; the
// other stays healthy.
type faultyRuns struct {
	pullClient
	fault  pipelineFault
	calls  atomic.Int32
	lone   atomic.Int32 // Pull calls: the chunks of lone refills (a re-plan's)
	served chan struct{}
}

func (f *faultyRuns) Pull(ctx context.Context, addr string, fence transfer.Fence, offset int64, dst []byte) error {
	f.lone.Add(1)
	return f.pullClient.Pull(ctx, addr, fence, offset, dst)
}

func (f *faultyRuns) PullMany(ctx context.Context, addr string, items []transfer.PullItem) []error {
	call := f.calls.Add(1)
	switch {
	case call > 2 || len(items) <= 2:
	case f.fault == servedCancelled && call == 1:
		scratch := slices.Clone(items)
		for i := range scratch {
			scratch[i].Dst = make([]byte, len(items[i].Dst))
		}
		errs := f.pullClient.PullMany(ctx, addr, scratch)
		close(f.served)
		<-ctx.Done()
		for i := range errs {
			errs[i] = fmt.Errorf("pull (test): %w", ctx.Err())
		}
		return errs
	case f.fault == servedCancelled:
		errs := f.pullClient.PullMany(ctx, addr, items)
		<-f.served
		errs[len(errs)-1] = fmt.Errorf("%w: the connection broke reading the last reply (test)", transfer.ErrUnreachable)
		return errs
	case call == 2:
		var errs []error
		if f.fault == hangs {
			<-ctx.Done()
		} else {
			errs = f.pullClient.PullMany(ctx, addr, items[:2])
		}
		for range items[len(errs):] {
			errs = append(errs, fmt.Errorf("%w: the connection broke (test)", transfer.ErrUnreachable))
		}
		return errs
	}
	return f.pullClient.PullMany(ctx, addr, items)
}

// TestBatchRefillPipelineFails: one of the two pipelines of a batch get's remote SSD
// refill of 80 pages fails while the other is healthy. No holder ever goes out whose
// bytes did not land in its target, and the source gives its staging back.
//   - breaks after two values: the values it left unpulled hold the source's places,
//     so the healthy pipeline's pulls would each wait there until the batch's deadline
//     (about 5 s): they end at once instead, and the batch answers within a second or
//     so.
//   - hangs: at the deadline the source answers for every value, and that answer
//     reaches the requester, whose call waits stageVerdictWait longer than its pulls
//     (the source counts the same deadline from the call's arrival, later): the values
//     that landed are served (before, the call ended first and every value failed).
//     The hung pipeline's values, which the source answers as not read now (their
//     session ended), are planned again alone: each is served only through a pull of
//     its own.
//   - its values served by the source but cut off on the way (cancelled when the other
//     pipeline broke): the source's answer says each was served, and none of them may
//     go out on that answer alone.
func TestBatchRefillPipelineFails(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault pipelineFault
	}{{"breaks", breaks}, {"hangs", hangs}, {"served, cancelled", servedCancelled}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &faultyRuns{fault: tc.fault, served: make(chan struct{})}
			n, c2, keys := ssdOnlyPages(t, 80, func(o *Options) {
				o.testPuller = func(p pullClient) pullClient {
					f.pullClient = p
					return f
				}
			})
			start := time.Now()
			hs, _, err := c2.BatchGet(keys)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			var got [2]int // holders of even and odd values: the pipelines'
			for i, h := range hs {
				if h != nil {
					got[i%2]++
					if !bytes.Equal(h.Bytes(), value(i, 64<<10+i)) {
						t.Errorf("%s: a holder of wrong bytes", keys[i])
					}
					h.Release()
				}
			}
			t.Logf("answered in %v; holders of %d even and %d odd values", took, got[0], got[1])
			switch {
			case tc.fault == breaks && took >= stageSessionWait+time.Second:
				t.Errorf("the batch answered after %v: its healthy pipeline waited at the source for places its broken one held", took)
			case tc.fault == hangs && got[0]+got[1] == 0:
				t.Error("no value served: the source's answer at its deadline did not reach the requester")
			case tc.fault == hangs && min(got[0], got[1]) > int(f.lone.Load()):
				t.Errorf("holders of both pipelines' values, %d lone pulls: the hung one pulled nothing", f.lone.Load())
			}
			waitUntil(t, func() bool { // by the batch's deadline at the latest
				idle, _ := stagerIdle(n)
				return idle
			})
		})
	}
}

// TestBatchRefillStageCallRefused: n1's peer service is down while its data plane
// serves: the stage calls of a batch get (and then of a lone get) through n2 of pages
// on n1's SSD fail at once. Their pulls, which would each wait for a session that never comes, are
// cancelled then, and every page fails at once, not after a session wait per page:
// re-planned without n1, UNAVAILABLE (the call's failure decides, not the cancelled
// pull's); n1 keeps every SSD replica (the call failed, not a read).
func TestBatchRefillStageCallRefused(t *testing.T) {
	t.Parallel()
	n, c2, keys := ssdOnlyPages(t, 8)
	replicas := n.ssdReplicasOf(t, "n1")
	n.o.peer.stop()
	start := time.Now()
	hs, errs, err := c2.BatchGet(keys)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if hs[i] != nil {
			hs[i].Release()
			t.Errorf("%s: a holder from an owner whose stage calls fail", k)
		}
		if !errors.Is(errs[i], fluxkv.ErrUnavailable) {
			t.Errorf("%s: %v; want UNAVAILABLE (re-planned without n1, whose call failed)", k, errs[i])
		}
	}
	// A session wait (2 s) per page, or the batch's deadline, is what the pulls took
	// before; a refused call takes a connect attempt.
	if took >= stageSessionWait {
		t.Errorf("the batch get took %v: its pulls waited for sessions of refused stage calls", took)
	}
	// A lone get (SsdStageRead) the same.
	start = time.Now()
	if h, err := c2.Get(keys[0]); err == nil {
		h.Release()
		t.Errorf("%s: a holder from an owner whose stage calls fail", keys[0])
	} else if !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Errorf("%s: %v; want UNAVAILABLE (re-planned without n1, whose call failed)", keys[0], err)
	}
	if took := time.Since(start); took >= stageSessionWait {
		t.Errorf("the get took %v: its pull waited for the session of a refused stage call", took)
	}
	if got := n.ssdReplicasOf(t, "n1"); got != replicas {
		t.Errorf("n1 holds %d SSD replicas after refused stage calls, %d before: a refused call dropped its source", got, replicas)
	}
}

// ssdOnlyPages starts n1 (4 MiB of DRAM, an SSD) and n2 (no cache grace: every get of
// n1's values through it is a pull), and puts pages values of about 64 KiB through n1
// followed by 3x its DRAM of filler, so that the pages are on n1's SSD only; it
// returns n1's node, n2's client and the pages' keys. tweaks apply to n2's options.
func ssdOnlyPages(t *testing.T, pages int, tweaks ...func(*Options)) (*node, *fluxkv.Client, []string) {
	t.Helper()
	return ssdOnlyPagesOn(t, pages, nil, tweaks...)
}

// ssdOnlyPagesOn is ssdOnlyPages with tweak1 applied to n1's options (nil: none).
func ssdOnlyPagesOn(t *testing.T, pages int, tweak1 func(*Options), tweaks ...func(*Options)) (*node, *fluxkv.Client, []string) {
	t.Helper()
	var n1 []func(*Options)
	if tweak1 != nil {
		n1 = append(n1, tweak1)
	}
	n := startNode(t, 4<<20, ssdOptions(t, 64<<20), master.Options{Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true}, n1...)
	_, c2 := n.addOwner(t, "n2", 16<<20, nil, append([]func(*Options){func(o *Options) { o.CacheGrace = -1 }}, tweaks...)...)
	var keys []string
	for i := range pages {
		k := fmt.Sprintf("page-%d", i)
		if err := n.c.Put(k, value(i, 64<<10+i)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	for i := range 12 {
		if err := n.c.Put(fmt.Sprintf("filler-%d", i), value(100+i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	return n, c2, keys
}
