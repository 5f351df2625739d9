package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestIsolatedCopyAfterPutDeadline: under client isolation the owner copies a put's
// bytes from the session's put area into the put's range at PutEnd (and PutWrite). A
// put whose client took longer than the master's --inflight-ttl to fill its value was
// revoked by the master meanwhile and its range freed; another put may have been
// placed there and published since. The owner must not copy into that range: the other
// key's bytes would change under its published version. Past PutCopyDeadline (below the
// master's TTL) the owner refuses the copy (UNAVAILABLE: put again). The master sends
// its TTL at registration: an owner left at the default deadline (50 s, below the
// master's default TTL) lowers it to fit a master with a shorter one.
func TestIsolatedCopyAfterPutDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		deadline time.Duration
	}{{"option", 200 * time.Millisecond}, {"master's TTL", 0}} {
		t.Run(tc.name, func(t *testing.T) { testIsolatedCopyAfterPutDeadline(t, tc.deadline) })
	}
}

func testIsolatedCopyAfterPutDeadline(t *testing.T, deadline time.Duration) {
	n := startNode(t, 8<<20, nil, master.Options{InflightTTL: 300 * time.Millisecond},
		func(o *Options) {
			o.ClientIsolation = true
			o.PutArea = 1 << 20
			o.PutCopyDeadline = deadline
		})
	if !n.c.Isolated() {
		t.Fatal("client not isolated")
	}
	c2, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: t.Name() + "-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()

	const size = 64 << 10
	good := bytes.Repeat([]byte{0x11}, size)
	bad := bytes.Repeat([]byte{0xEE}, size)
	slowDone := make(chan error, 1)
	go func() {
		// A slow writer: its fill outlasts the master's in-flight TTL.
		slowDone <- n.c.PutWith("slow", size, fluxkv.PutOptions{}, func(dst []byte) error {
			time.Sleep(2 * time.Second)
			copy(dst, bad)
			return nil
		})
	}()
	// Meanwhile the master expires the slow put (Maintain runs every 500 ms) and frees
	// its range; another client's puts take the room.
	time.Sleep(1200 * time.Millisecond)
	keys := []string{"victim-0", "victim-1", "victim-2", "victim-3"}
	for _, k := range keys {
		if err := c2.Put(k, good); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-slowDone; !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Errorf("the put past its copy deadline: %v, want UNAVAILABLE", err)
	}
	for _, k := range keys {
		h, err := c2.Get(k)
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		if !bytes.Equal(h.Bytes(), good) {
			t.Errorf("%s: its published bytes were overwritten by the expired put's PutEnd copy (first byte %#x)", k, h.Bytes()[0])
		}
		h.Release()
	}
}

// putDoneReplyLost publishes at the master, then loses the reply.
type putDoneReplyLost struct {
	masterservice.Client
	lost atomic.Int64
}

func (r *putDoneReplyLost) PutDone(ctx context.Context, req *mp.PutDoneRequest, opts ...callopt.Option) (*mp.PutDoneResponse, error) {
	if _, err := r.Client.PutDone(ctx, req, opts...); err != nil {
		return nil, err
	}
	r.lost.Add(1)
	return nil, errors.New("injected: connection reset after the master answered")
}

// TestPutDoneReplyLostHotSet: when a PutDone's reply is lost the master may have
// published the new version, so the owner drops the older one from its hot set as from
// its replica index: its gets must not answer the old bytes from the hot set (with no
// master call, for the whole cache grace) while every other owner reads the new one.
func TestPutDoneReplyLostHotSet(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{})
	_, c2 := n.addOwner(t, "n2", 8<<20, nil)
	v1, v2 := bytes.Repeat([]byte{1}, 4096), bytes.Repeat([]byte{2}, 4096)
	if err := n.c.Put("k", v1); err != nil {
		t.Fatal(err)
	}
	h, err := n.c.Get("k") // the replica's holding joins the hot set
	if err != nil {
		t.Fatal(err)
	}
	h.Release()
	lost := &putDoneReplyLost{}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { lost.Client = c; return lost })
	err = n.c.Put("k", v2)
	t.Logf("put of v2: %v (replies lost: %d)", err, lost.lost.Load())
	h2, err := c2.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	other := h2.Bytes()[0]
	h2.Release()
	h1, err := n.c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	here := h1.Bytes()[0]
	h1.Release()
	if other == 2 && here != 2 {
		t.Errorf("owner n2 reads the published v2, the requester's owner still answers v%d from its hot set", here)
	}
}

// TestIsolatedCopyStopsAtItsDeadline: a PutEnd copy that started before the put's copy
// deadline but runs past it (starved of CPU, or one of many at once) stops before its
// next chunk. The master frees an expired put's range; a chunk copied later would land
// in bytes another key published there since. The value is copied at its PutEnd (it
// fits the put area) or streamed through PutWrites (twice the area).
func TestIsolatedCopyStopsAtItsDeadline(t *testing.T) {
	t.Parallel()
	const value = 4 << 20
	for _, tc := range []struct {
		name string
		area int64
	}{{"PutEnd", value}, {"PutWrite", value / 2}} {
		t.Run(tc.name, func(t *testing.T) { testIsolatedCopyStopsAtItsDeadline(t, value, tc.area) })
	}
}

func testIsolatedCopyStopsAtItsDeadline(t *testing.T, value int, area int64) {
	var chunks atomic.Int64
	stalled := make(chan struct{})
	n := startNode(t, 8<<20, nil, master.Options{InflightTTL: 300 * time.Millisecond},
		func(o *Options) {
			o.ClientIsolation = true
			o.PutArea = area
			o.PutCopyDeadline = 200 * time.Millisecond
			o.testCopyChunk = func(key string, chunk int) {
				if key == "slow" && chunks.Add(1) == 1 {
					<-stalled // after the first chunk, in time, the copy stalls past the deadline
				}
			}
		})
	c2, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: t.Name() + "-2"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	slowDone := make(chan error, 1)
	go func() { slowDone <- n.c.Put("slow", bytes.Repeat([]byte{0xEE}, value)) }()
	// The master expires the stalled put (Maintain runs every 500 ms) and frees its
	// range; another client's puts take the whole segment.
	time.Sleep(1200 * time.Millisecond)
	good := bytes.Repeat([]byte{0x11}, 1<<20)
	var keys []string
	for i := range 8 {
		k := fmt.Sprintf("victim-%d", i)
		if err := c2.Put(k, good); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	close(stalled)
	if err := <-slowDone; !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Errorf("the put whose copy ran past its deadline: %v, want UNAVAILABLE", err)
	}
	// One chunk, copied in time (none on a machine so slow that the deadline passed first).
	if got := chunks.Load(); got > 1 {
		t.Errorf("%d chunks of the expired put were copied, want at most the 1 copied in time", got)
	}
	present := 0
	for _, k := range keys {
		h, err := c2.Get(k)
		if errors.Is(err, fluxkv.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		present++
		if !bytes.Equal(h.Bytes(), good) {
			t.Errorf("%s: its published bytes were overwritten by the expired put's late copy", k)
		}
		h.Release()
	}
	if present == 0 {
		t.Fatal("no victim left to check")
	}
}

// TestDeadPutLeavesItsSession: a put whose client never ends it leaves its session once
// the master's in-flight TTL ran out (the master freed its range meanwhile), and its
// late PutEnd answers UNAVAILABLE.
func TestDeadPutLeavesItsSession(t *testing.T) {
	t.Parallel()
	// A TTL long enough that the put is still pending when the test first looks, on a
	// busy machine too.
	n := startNode(t, 8<<20, nil, master.Options{InflightTTL: 2 * time.Second})
	filling, done := make(chan struct{}), make(chan error, 1)
	release := make(chan struct{})
	go func() {
		done <- n.c.PutWith("stuck", 4096, fluxkv.PutOptions{}, func(dst []byte) error {
			close(filling)
			<-release
			return nil
		})
	}()
	<-filling
	pending := func() int {
		st := n.o.lock()
		defer n.o.unlock()
		k := 0
		for _, c := range st.sessions {
			k += len(c.puts)
		}
		return k
	}
	if pending() != 1 {
		t.Fatalf("%d puts pending, want the one being filled", pending())
	}
	waitUntil(t, func() bool { return pending() == 0 })
	close(release)
	if err := <-done; !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Errorf("the put ended after its master's TTL: %v, want UNAVAILABLE", err)
	}
}

// TestPutEndAfterAnExpiredPutWrite: a PutEnd without copies that waits for a PutWrite
// still copying (a client that overlaps its calls; a batch wave ends a streamed item so)
// must not publish the value when that copy stopped at the put's deadline: the range
// holds only the chunks copied in time. Both calls answer UNAVAILABLE and the key stays
// unpublished.
func TestPutEndAfterAnExpiredPutWrite(t *testing.T) {
	t.Parallel()
	n, c, id, inChunk, release := stalledPutWrite(t)
	werr, eerr := make(chan error, 1), make(chan error, 1)
	go func() { werr <- n.o.putWrite(c, "torn", id, []*external.AreaCopy{{Len: 2 << 20}}) }()
	<-inChunk
	time.Sleep(400 * time.Millisecond) // past the copy deadline
	go func() { eerr <- n.o.putEnd(c, "torn", id, nil) }()
	for { // until the PutEnd waits for the PutWrite's copy
		n.o.lock()
		ending := c.puts[id] != nil && c.puts[id].ending != nil
		n.o.unlock()
		if ending {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-werr; wire.CodeOf(err) != common.ErrorCode_UNAVAILABLE {
		t.Errorf("PutWrite stopped at the deadline: %v, want UNAVAILABLE", err)
	}
	if err := <-eerr; wire.CodeOf(err) != common.ErrorCode_UNAVAILABLE {
		t.Errorf("PutEnd after the expired PutWrite: %v, want UNAVAILABLE", err)
	}
	if h, err := n.c.Get("torn"); err == nil {
		t.Errorf("the part-copied value was published: byte 0 %#x, byte 1 MiB %#x", h.Bytes()[0], h.Bytes()[1<<20])
		h.Release()
	} else if !errors.Is(err, fluxkv.ErrKeyNotFound) {
		t.Fatal(err)
	}
	if err := n.o.putEnd(c, "torn", id, nil); wire.CodeOf(err) != common.ErrorCode_UNAVAILABLE {
		t.Errorf("PutEnd repeated: %v, want the first answer, UNAVAILABLE", err)
	}
}

// stalledPutWrite starts an isolated node whose put copies stall in the first chunk of
// key "torn" until release closes (inChunk closes when it is reached), and starts a
// 2 MiB put of "torn" whose value the session's put area holds.
func stalledPutWrite(t *testing.T) (n *node, c *session, id int64, inChunk, release chan struct{}) {
	inChunk, release = make(chan struct{}), make(chan struct{})
	n = startNode(t, 16<<20, nil, master.Options{InsecureCluster: true, InflightTTL: 10 * time.Second}, func(o *Options) {
		o.ClientIsolation, o.PutArea, o.PutCopyDeadline = true, 2<<20, 300*time.Millisecond
		o.testCopyChunk = func(key string, chunk int) {
			if key == "torn" && chunk == 0 {
				close(inChunk)
				<-release
			}
		}
	})
	st := n.o.lock()
	c = st.sessions[n.c.ClientID()]
	n.o.unlock()
	id, _, err := n.o.putStart(c, "torn", 2<<20, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	copy(c.area.Bytes(), bytes.Repeat([]byte{0xAB}, 2<<20))
	return n, c, id, inChunk, release
}

// TestExpiringPutAnsweredWhileCopiesEnd: a PutWrite past the deadline expires the put
// and waits for a copy still running; a PutEnd retried meanwhile answers the expiry
// (UNAVAILABLE), not "unknown put".
func TestExpiringPutAnsweredWhileCopiesEnd(t *testing.T) {
	t.Parallel()
	n, c, id, inChunk, release := stalledPutWrite(t)
	first, second := make(chan error, 1), make(chan error, 1)
	copies := []*external.AreaCopy{{Len: 2 << 20}}
	go func() { first <- n.o.putWrite(c, "torn", id, copies) }()
	<-inChunk
	time.Sleep(400 * time.Millisecond) // past the copy deadline
	go func() { second <- n.o.putWrite(c, "torn", id, copies) }()
	for { // until the second PutWrite took the put out of the session
		n.o.lock()
		gone := c.puts[id] == nil
		n.o.unlock()
		if gone {
			break
		}
		time.Sleep(time.Millisecond)
	}
	err := n.o.putEnd(c, "torn", id, nil)
	close(release)
	if wire.CodeOf(err) != common.ErrorCode_UNAVAILABLE {
		t.Errorf("PutEnd while the expired put's copy ends: %v, want UNAVAILABLE", err)
	}
	for _, ch := range []chan error{first, second} {
		if err := <-ch; wire.CodeOf(err) != common.ErrorCode_UNAVAILABLE {
			t.Errorf("PutWrite: %v, want UNAVAILABLE", err)
		}
	}
}

// TestEndingPutKeepsItsRangeAcrossSessionEnd: a session that ends while a PutEnd still
// copies into its put's range leaves the range among the owner's segment writes until
// that PutEnd ends: a registration meanwhile must report it as a pin (the new master
// would otherwise hand the range out while the copy runs).
func TestEndingPutKeepsItsRangeAcrossSessionEnd(t *testing.T) {
	t.Parallel()
	n, c, id, inChunk, release := stalledPutWrite(t)
	ended := make(chan error, 1)
	go func() { ended <- n.o.putEnd(c, "torn", id, []*external.AreaCopy{{Len: 2 << 20}}) }()
	<-inChunk
	go n.o.endSession(c, "test: the client went away during its PutEnd")
	waitUntil(t, func() bool { n.o.lock(); defer n.o.unlock(); return c.closed })
	st := n.o.lock()
	kept := st.writes.lookup(writePut, id) != nil
	n.o.unlock()
	close(release)
	<-ended
	if !kept {
		t.Fatal("the ending put's range left the segment writes when its session ended, while its copy ran")
	}
	st = n.o.lock()
	left := st.writes.lookup(writePut, id) != nil
	n.o.unlock()
	if left {
		t.Fatal("the put's range is still among the segment writes after its PutEnd ended")
	}
}

// unreachableAtDone fails the first BatchPutDone in transport, and every PutRevoke while
// failing, counting them: the master out of reach during a batch's publish.
type unreachableAtDone struct {
	masterservice.Client
	failing atomic.Bool
	first   atomic.Bool
	revokes atomic.Int32
}

func (u *unreachableAtDone) BatchPutDone(ctx context.Context, req *mp.BatchPutDoneRequest, opts ...callopt.Option) (*mp.BatchPutDoneResponse, error) {
	if u.first.CompareAndSwap(false, true) {
		u.failing.Store(true)
		return nil, errors.New("injected: the master is out of reach")
	}
	u.failing.Store(false)
	return u.Client.BatchPutDone(ctx, req, opts...)
}

func (u *unreachableAtDone) PutRevoke(ctx context.Context, req *mp.PutRevokeRequest, opts ...callopt.Option) (*mp.PutRevokeResponse, error) {
	if u.failing.Load() {
		u.revokes.Add(1)
		return nil, errors.New("injected: the master is out of reach")
	}
	return u.Client.PutRevoke(ctx, req, opts...)
}

// TestFailedBatchPublishRevokesInParallel: a BatchPutDone that failed in transport
// revokes its puts revokePutsParallel at a time, and leaves the rest to the master's
// in-flight TTL once a revoke finds the master out of reach (one revoke after the other,
// each waiting out its call's timeout, a batch took hours).
func TestFailedBatchPublishRevokesInParallel(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	u := &unreachableAtDone{}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { u.Client = c; return u })
	var items []fluxkv.PutItem
	for i := range 64 {
		items = append(items, fluxkv.PutItem{Key: fmt.Sprintf("far-%d", i), Value: value(i, 1000)})
	}
	if _, err := n.c.BatchPut(items, fluxkv.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := u.revokes.Load(); r == 0 || r > revokePutsParallel {
		t.Fatalf("%d revokes sent to an unreachable master for a wave of 64 puts, want 1..%d", r, revokePutsParallel)
	}
}
