package master

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// fullOwner is a master with two owners: a holds k1 and k2; b's pool (2 KiB, no transfer
// area) is full of q1 and q2, and b's owner answers ReleaseHotSet 150 ms after the
// master's 20 ms timeout, acking then (when ack is set) the holder its client released
// last (held).
type fullOwner struct {
	srv   *Server
	b     NodeRef
	held  atomic.Int64 // the holder b's client released, not acked yet
	asked atomic.Int64 // ReleaseHotSet calls b's owner received
}

func startFullOwner(t *testing.T, allocWait time.Duration, ack bool) *fullOwner {
	return startFullOwnerAnswering(t, allocWait, ack, common.ErrorCode_OK)
}

// startFullOwnerAnswering is startFullOwner whose owner b answers ReleaseHotSet with
// code: OK after its ack (150 ms, past the master's timeout), or UNAVAILABLE at once
// (the acks of what it released did not reach the master), its ack 150 ms later.
func startFullOwnerAnswering(t *testing.T, allocWait time.Duration, ack bool, code common.ErrorCode) *fullOwner {
	t.Helper()
	s := authtest.Secrets(t)
	f := &fullOwner{b: NodeRef{ID: "b", Generation: 1}}
	f.srv = startPeerFailMaster(t, Options{Secrets: s, InvalidateTimeout: 20 * time.Millisecond, AllocWait: allocWait})
	sendAck := func() {
		time.Sleep(150 * time.Millisecond)
		if id := f.held.Load(); ack && id != 0 && f.held.CompareAndSwap(id, 0) {
			f.srv.withState(func(st *State) error {
				_, err := st.BatchDeleteAck(f.b, []int64{id}, nil)
				return err
			})
		}
	}
	owner := &fakePeer{hotSet: func(ctx context.Context, req *peer.ReleaseHotSetRequest) *peer.ReleaseHotSetResponse {
		f.asked.Add(1)
		if code == common.ErrorCode_OK {
			sendAck()
		} else {
			go sendAck()
		}
		return &peer.ReleaseHotSetResponse{Code: code}
	}}
	addr := startFakePeer(t, s, owner)
	a := NodeRef{ID: "a", Generation: 1}
	f.must(t, f.srv.withState(func(st *State) error {
		if err := st.Register(time.Now(), a, 4096, 0, 0, "", "", SSDInfo{}, nil); err != nil {
			return err
		}
		return st.Register(time.Now(), f.b, 2048, 0, 0, "", addr, SSDInfo{}, nil)
	}))
	for _, p := range []struct {
		ref NodeRef
		key string
	}{{a, "k1"}, {a, "k2"}, {f.b, "q1"}, {f.b, "q2"}} {
		f.must(t, f.srv.withState(func(st *State) error {
			plan, err := st.PutStart(time.Now(), p.ref, p.key, 1024, false, nil)
			if err != nil {
				return err
			}
			_, err = st.PutDone(time.Now(), p.ref, p.key, plan.PutID)
			return err
		}))
	}
	return f
}

func (f *fullOwner) must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// done ends a get of key through b started by plan; its holder is then b's client's,
// released by it and not acked (held). sole: the get's range must not be promoted.
func (f *fullOwner) done(t *testing.T, key string, plan GetPlan, sole bool) {
	t.Helper()
	f.must(t, f.srv.withState(func(st *State) error {
		res, err := st.GetDone(f.b, key, plan.GetID)
		if res.Promoted && sole {
			t.Errorf("get of %s promoted: the test needs its range to be a sole holding", key)
		}
		f.held.Store(res.HolderID)
		return err
	}))
}

// get runs a get of key through b as the handler does (withSpace).
func (f *fullOwner) get(t *testing.T, key string, sole bool) {
	t.Helper()
	var plan GetPlan
	f.must(t, f.srv.withSpace(context.Background(), func(st *State) error {
		var err error
		plan, err = st.GetStart(time.Now(), f.b, key, nil)
		return err
	}))
	f.done(t, key, plan, sole)
}

// inMemory lists which of k1, k2, q1, q2 have a memory replica.
func (f *fullOwner) inMemory() []string {
	var keys []string
	f.srv.Inspect(func(st *State) {
		for _, k := range []string{"k1", "k2", "q1", "q2"} {
			if r := st.routes[k]; r != nil && (r.memoryReplica(st.nodes["a"]) != nil || r.memoryReplica(st.nodes["b"]) != nil) {
				keys = append(keys, k)
			}
		}
	})
	return keys
}

// TestGetWaitsForUnansweredRelease: a get on a full owner, whose previous get's range
// its client released but the owner has not acked yet, waits for that ack instead of
// evicting a sole copy, also when the owner's answer to ReleaseHotSet comes after the
// master's timeout (a loaded machine: the ack and the answer are late together).
func TestGetWaitsForUnansweredRelease(t *testing.T) {
	f := startFullOwner(t, 5*time.Second, true)
	f.get(t, "k1", true)  // b is full: the first get costs b a value (q1)
	f.get(t, "k2", false) // k1's range is released by the client but not acked: no eviction
	memory := f.inMemory()
	t.Logf("asked %d times; values in memory: %v", f.asked.Load(), memory)
	if f.asked.Load() == 0 {
		t.Fatal("the second get never asked the owner for its hot set: the test did not reach the fault")
	}
	if len(memory) != 3 {
		t.Fatalf("values in memory after two gets through full b: %v; want k1, k2 and one of b's (the first get's room)", memory)
	}
}

// TestGetWaitsForAcksOnTheirWay: an owner that answers ReleaseHotSet UNAVAILABLE has
// released holdings whose acks did not reach the master yet: the get waits for them as
// for an owner that did not answer in time, instead of evicting a sole copy (a review:
// the master took the answer as final).
func TestGetWaitsForAcksOnTheirWay(t *testing.T) {
	f := startFullOwnerAnswering(t, 5*time.Second, true, common.ErrorCode_UNAVAILABLE)
	f.get(t, "k1", true)
	f.get(t, "k2", false)
	if memory := f.inMemory(); len(memory) != 3 {
		t.Fatalf("values in memory after two gets through full b: %v; want k1, k2 and one of b's", memory)
	}
}

// TestGetAsksItsOwnShortage: a get's ReleaseHotSet round asks the owner its own
// allocation found short, though other allocations fail NO_SPACE meanwhile (c's gets
// here, its pool held full): the shortage was read under another hold of the lock, where
// theirs had replaced it, and the get asked c, which answered at once, and stopped
// sparing b's sole copies (a review).
func TestGetAsksItsOwnShortage(t *testing.T) {
	f := startFullOwner(t, 5*time.Second, true)
	caddr := startFakePeer(t, f.srv.opts.Secrets, &fakePeer{}) // answers ReleaseHotSet OK at once
	c := NodeRef{ID: "c", Generation: 1}
	f.must(t, f.srv.withState(func(st *State) error {
		if err := st.Register(time.Now(), c, 1024, 0, 0, "", caddr, SSDInfo{}, nil); err != nil {
			return err
		}
		plan, err := st.PutStart(time.Now(), c, "r1", 1024, false, nil)
		if err != nil {
			return err
		}
		if _, err = st.PutDone(time.Now(), c, "r1", plan.PutID); err != nil {
			return err
		}
		_, err = st.GetStart(time.Now(), c, "r1", nil) // held for good: c cannot evict it
		return err
	}))
	f.get(t, "k1", true)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { // c's gets of k2 fail NO_SPACE, one after another
			for !stop.Load() {
				f.srv.withState(func(st *State) error {
					_, err := st.GetStart(time.Now(), c, "k2", nil)
					return err
				})
			}
		})
	}
	f.get(t, "k2", false)
	stop.Store(true)
	wg.Wait()
	if memory := f.inMemory(); len(memory) != 3 {
		t.Fatalf("values in memory after two gets through full b: %v; want k1, k2 and one of b's", memory)
	}
}

// TestGetEvictsWhenReleaseNeverComes: when the owner never acks the released range and
// never answers in time, a get waits its AllocWait (400 ms here) and then evicts a sole
// copy on its last attempt, alone or in a batch (whose wait ends with its context).
func TestGetEvictsWhenReleaseNeverComes(t *testing.T) {
	for _, batch := range []bool{false, true} {
		f := startFullOwner(t, 400*time.Millisecond, false)
		f.get(t, "k1", true)
		if batch {
			h := &handler{s: f.srv}
			resp, err := h.BatchGetStart(context.Background(), &mp.BatchGetStartRequest{Node: &mp.NodeRef{NodeId: "b", Generation: 1}, Keys: []string{"k2"}})
			if err != nil || resp.Code != common.ErrorCode_OK || len(resp.Results) != 1 || resp.Results[0].Code != common.ErrorCode_OK {
				t.Fatalf("batch get of k2 past b's wait: %+v, %v; want its last attempt to evict", resp, err)
			}
		} else {
			f.get(t, "k2", false)
		}
		memory := f.inMemory()
		t.Logf("batch %v: asked %d times; values in memory: %v", batch, f.asked.Load(), memory)
		if len(memory) != 2 {
			t.Fatalf("batch %v: values in memory: %v; want k1 and k2 (b gave q1 and q2 for the gets' room)", batch, memory)
		}
	}
}

// TestReleaseAskForgetsGonePages: pages the eviction order reached while held, whose
// owner answered while they were still held, leave the node's release-ask set once they
// are deleted (or evicted): kept, maxReleaseAsk of them ended every later ask of the node
// for good, and the hot set, not the page order, decided what stayed (a review).
func TestReleaseAskForgetsGonePages(t *testing.T) {
	const held, free = maxReleaseAsk + 104, 100
	st := NewState(Options{IDBase: 100, Placement: PlacementLocal, SSDAdmit: SSDAdmitPut,
		NodeTTL: 1000 * time.Hour, HeartbeatInterval: 1000 * time.Hour})
	now := time.Unix(1000, 0)
	ref := NodeRef{ID: "n1", Generation: 1}
	if err := st.Register(now, ref, (held+free)*512, 0, 0, "d1", "p1", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	n := st.nodes["n1"]
	root := ""
	put := func(k string) error {
		plan, err := st.PutStart(now, ref, k, 512, false, &root)
		if err != nil {
			return err
		}
		_, err = st.PutDone(now, ref, k, plan.PutID)
		return err
	}
	var holders []int64
	for i := range held {
		k := fmt.Sprintf("c/p%d", i)
		if err := put(k); err != nil {
			t.Fatal(err)
		}
		g, err := st.GetStart(now, ref, k, nil)
		if err != nil || !g.Done {
			t.Fatalf("get of %s: %+v, %v", k, g, err)
		}
		holders = append(holders, g.HolderID)
	}
	for i := range free {
		if err := put(fmt.Sprintf("c/f%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	serve := func() (calls int) { // the owner answers, releasing nothing (every page in use, and hit)
		for _, c := range st.takeReleasesLocked() {
			calls++
			n.release.answered(c.keys, func(k string) bool { return st.heldLocked(k, n) })
			st.BatchDeleteAck(ref, nil, c.keys)
		}
		return calls
	}
	for i := 0; i < pageFreqBonus/16; i++ { // the held pages' hit bonus runs out
		put(fmt.Sprintf("c/age%d", i%free))
	}
	for round := 0; round < 40 && len(n.release.asked) < maxReleaseAsk; round++ {
		st.PutStart(now, ref, fmt.Sprintf("d/q%d", round), 512, false, &root) // NO_SPACE: asks the owner
		serve()
	}
	if len(n.release.asked) < maxReleaseAsk {
		t.Fatalf("only %d pages asked for: the test did not fill the set", len(n.release.asked))
	}
	st.BatchDeleteAck(ref, holders, nil) // the externals end; the prefix is deleted
	for i := range held {
		st.Delete(ref, fmt.Sprintf("c/p%d", i))
	}
	stale := 0
	for k := range n.release.asked {
		if st.routes[k] == nil {
			stale++
		}
	}
	if err := put("e/p0"); err != nil { // a new page in use, reached by the eviction order
		t.Fatal(err)
	}
	if g, err := st.GetStart(now, ref, "e/p0", nil); err != nil || !g.Done {
		t.Fatal(err)
	}
	st.releasesDue = false
	st.passHeldLocked(n, []string{"e/p0"})
	if calls := serve(); calls == 0 {
		t.Errorf("a held page reached by eviction was not asked for: %d entries in the set, %d of deleted pages", len(n.release.asked), stale)
	}
}
