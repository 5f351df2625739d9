package master

import (
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestGetDoneOfALostSource: a remote get whose source owner was tombed before the get
// ended, and which registered again still alive (same process and segment; an owner of
// an earlier release registered under the same generation, so its pull fence still
// matched, and a pull already being served streams on across a new one), is refused
// at GetDone: the new incarnation's pool may have
// handed the range pulled from to another value, whose bytes the pull then copied. Else
// the requester handed out, and the master promoted to a replica, another key's bytes
// (a review reproduced it: heartbeats lost past the TTL, the owner registered again, a
// new put landed on the range). The target is freed, no holder is left, nothing is
// promoted.
func TestGetDoneOfALostSource(t *testing.T) {
	st := NewState(Options{IDBase: 1, NodeTTL: time.Hour, Placement: PlacementLocal})
	now := time.Unix(1000, 0)
	a, b := NodeRef{ID: "a", Generation: 1}, NodeRef{ID: "b", Generation: 1}
	register := func(ref NodeRef) {
		t.Helper()
		if err := st.Register(now, ref, 16*AllocGranule, 0, 0, "d-"+ref.ID, "p-"+ref.ID, SSDInfo{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	put := func(ref NodeRef, key string) int64 {
		t.Helper()
		p, err := st.PutStart(now, ref, key, AllocGranule, false, nil)
		if err == nil {
			_, err = st.PutDone(now, ref, key, p.PutID)
		}
		if err != nil {
			t.Fatal(err)
		}
		return p.TargetOffset
	}
	register(a)
	register(b)
	at := put(a, "k")
	plan, err := st.GetStart(now, b, "k", nil)
	if err != nil || plan.Source != common.Source_MEMORY || plan.SourceNode != "a" || plan.SourceOffset != at {
		t.Fatalf("plan %+v, %v; want a pull of k from a at %d", plan, err, at)
	}
	// a is tombed and registers again, alive (its generation unchanged, as owners of
	// earlier releases did); a new value takes the range the plan names.
	register(a)
	if off := put(a, "other"); off != at {
		t.Fatalf("the new value landed at %d, not the planned source range %d: the test did not reach the fault", off, at)
	}
	if _, err := st.GetDone(b, "k", plan.GetID); wire.CodeOf(err) != common.ErrorCode_UNAVAILABLE {
		t.Fatalf("GetDone of a get whose source was tombed: %v; want UNAVAILABLE", err)
	}
	if got := len(st.gets); got != 0 {
		t.Errorf("%d gets in flight after the refused GetDone", got)
	}
	nb := st.nodes["b"]
	if n := len(nb.holders); n != 0 {
		t.Errorf("b holds %d ranges after the refused GetDone", n)
	}
	if used := nb.alloc.Capacity() - nb.alloc.FreeBytes(); used != 0 {
		t.Errorf("b's pool has %d bytes in use after the refused GetDone: its target was not freed", used)
	}
	if r := st.routes["k"]; r != nil {
		t.Errorf("k still routed (%d replicas) after its only copy's owner was tombed", len(r.replicas))
	}
}

// TestFailedSourceAvoided: a requester that revokes a get because its pull from the
// source failed for the source's part (source_failed) makes the next plans prefer the
// key's other replicas for a node TTL: a source whose data plane is cut while its
// master link is healthy was every get's first choice again (it wins ties by id), and
// each get paid a failed pull for it (a review). With no other replica the suspect
// source is still planned; a revoke for another reason changes nothing, and so does a
// requester's blame of a second source within a node TTL (the fault may be its own).
func TestFailedSourceAvoided(t *testing.T) {
	st := NewState(Options{IDBase: 1, NodeTTL: 5 * time.Second, Placement: PlacementLocal})
	now := time.Unix(1000, 0)
	refs := map[string]NodeRef{}
	for _, id := range []string{"a", "b", "c"} {
		refs[id] = NodeRef{ID: id, Generation: 1}
		if err := st.Register(now, refs[id], 16*AllocGranule, 0, 0, "d-"+id, "p-"+id, SSDInfo{}, nil); err != nil {
			t.Fatal(err)
		}
	}
	p, err := st.PutStart(now, refs["a"], "k", AllocGranule, false, nil)
	if err == nil {
		_, err = st.PutDone(now, refs["a"], "k", p.PutID)
	}
	if err != nil {
		t.Fatal(err)
	}
	g, err := st.GetStart(now, refs["b"], "k", nil) // promoted on b: a second replica
	if err == nil {
		_, err = st.GetDone(refs["b"], "k", g.GetID)
	}
	if err != nil {
		t.Fatal(err)
	}
	plan := func(at time.Time) GetPlan {
		t.Helper()
		g, err := st.GetStart(at, refs["c"], "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	first := plan(now)
	if first.SourceNode != "a" {
		t.Fatalf("first plan from %s; want a (ties go to the lower id)", first.SourceNode)
	}
	if err := st.GetRevoke(now, refs["c"], "k", first.GetID, false, false); err != nil {
		t.Fatal(err)
	}
	if again := plan(now); again.SourceNode != "a" {
		t.Fatalf("after a revoke for another reason, plan from %s; want a", again.SourceNode)
	} else if err := st.GetRevoke(now, refs["c"], "k", again.GetID, false, true); err != nil {
		t.Fatal(err)
	}
	next := plan(now.Add(time.Second))
	if next.SourceNode != "b" {
		t.Errorf("after a's pull failed, plan from %s; want b", next.SourceNode)
	}
	// c now blames b too, within a node TTL of blaming a: c may be the one at fault (its
	// own data plane cut), and b is not marked (a review: such a requester steered every
	// get away from healthy sources).
	st.GetRevoke(now.Add(time.Second), refs["c"], "k", next.GetID, false, true)
	if again := plan(now.Add(2 * time.Second)); again.SourceNode != "b" {
		t.Errorf("after c blamed a second source, plan from %s; want b, not marked", again.SourceNode)
	} else {
		st.GetRevoke(now, refs["c"], "k", again.GetID, false, false)
	}
	if later := plan(now.Add(6 * time.Second)); later.SourceNode != "a" {
		t.Errorf("a node TTL after a's pull failed, plan from %s; want a again", later.SourceNode)
	}
}

// TestPersistCommitOfATombedSource: an SSD persist sent before its source owner was
// tombed, committed after: the source, alive, may have registered again and given the
// range read to another value. The commit names its persist, which ended at the tomb:
// it is refused even though the SSD owner holds a memory copy of the key (the shortcut
// published it, with the other value's bytes and a checksum of them: a review). A
// commit of the pending persist is published.
func TestPersistCommitOfATombedSource(t *testing.T) {
	st := NewState(Options{IDBase: 1, NodeTTL: time.Hour, Placement: PlacementLocal})
	now := time.Unix(1000, 0)
	src, ssdOwner := NodeRef{ID: "a", Generation: 1}, NodeRef{ID: "s", Generation: 1}
	register := func(ref NodeRef, ssd SSDInfo) {
		t.Helper()
		if err := st.Register(now, ref, 16*AllocGranule, 0, 0, "d-"+ref.ID, "p-"+ref.ID, ssd, nil); err != nil {
			t.Fatal(err)
		}
	}
	put := func(key string) *PersistTask {
		t.Helper()
		p, err := st.PutStart(now, src, key, AllocGranule, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := st.PutDone(now, src, key, p.PutID)
		if err != nil || res.Persist == nil || res.Persist.NodeID != "s" {
			t.Fatalf("put %s: %+v, %v; want a persist on s", key, res.Persist, err)
		}
		return res.Persist
	}
	register(src, SSDInfo{})
	register(ssdOwner, SSDInfo{Enabled: true, CapacityBytes: 1 << 30})
	task := put("k")
	g, err := st.GetStart(now, ssdOwner, "k", nil) // s holds a memory copy of k too
	if err == nil {
		_, err = st.GetDone(ssdOwner, "k", g.GetID)
	}
	if err != nil {
		t.Fatal(err)
	}
	register(src, SSDInfo{}) // tombed while alive, registered again: k's persist ended
	if ok, err := st.SsdReplicaCommit(ssdOwner, "k", task.PutID, task.Len, 0, task.ID); err != nil || ok {
		t.Fatalf("commit of a persist whose source was tombed: published %v, %v; want refused", ok, err)
	}
	next := put("k2")
	if ok, err := st.SsdReplicaCommit(ssdOwner, "k2", next.PutID, next.Len, 0, next.ID); err != nil || !ok {
		t.Fatalf("commit of the pending persist: published %v, %v; want published", ok, err)
	}
}
