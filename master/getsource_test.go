package master

import (
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestGetDoneOfALostSource: a remote get whose source owner was tombed before the get
// ended, and which registered again still alive (same process, same generation: its
// pull fence still matches), is refused at GetDone: the new incarnation's pool may have
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
	// a is tombed and registers again, alive (its generation unchanged); a new value takes
	// the range the plan names.
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
