package master

import (
	"testing"
	"time"
)

// TestOverwrittenPutWaitsForPendingSyncs: a put whose PutDone finds a later put of the
// key already published is answered at once, ordered right before that one. An owner
// whose Sync invalidation of the later publish is not confirmed yet may still serve the
// older version from its hot set: the overwritten put's answer waits for it too (a
// Sync invalidation of its own), or a read through that owner after the put returned
// could see the version both puts overwrote (rw_stress_test.go,
// TestReadYourWritesConcurrentWriters).
func TestOverwrittenPutWaitsForPendingSyncs(t *testing.T) {
	st := NewState(Options{IDBase: 100, NodeTTL: time.Minute, InflightTTL: time.Minute})
	now := time.Unix(1000, 0)
	for _, n := range []string{"a", "b", "c"} {
		scriptLine(t, st, &now, "register node="+n+" gen=1 size=64KiB")
	}
	scriptLine(t, st, &now, "put node=a key=k len=4KiB")
	// b keeps a replica of k (its hot set may serve it).
	scriptLine(t, st, &now, "get node=b key=k")
	if out := scriptLine(t, st, &now, "get-done node=b key=k"); out != "holder=102 promoted=true\n" {
		t.Fatalf("b's get: %q", out)
	}
	// Two puts of k: c's starts first, a's second; a's is published first.
	if out := scriptLine(t, st, &now, "put-start node=c key=k len=4KiB"); out != "put_id=103 offset=0 ssd=false\n" {
		t.Fatalf("c's put: %q", out)
	}
	scriptLine(t, st, &now, "put-start node=a key=k len=4KiB")
	if out := scriptLine(t, st, &now, "put-done node=a key=k id=104"); out != "ok invalidate=b,c sync=b\n" {
		t.Fatalf("a's put: %q", out)
	}
	// b has not confirmed yet (syncPending). c's put is answered as overwritten: b must
	// have dropped the first version before it returns, and c (which may hold it too)
	// everything older than a's.
	got := scriptLine(t, st, &now, "put-done node=c key=k id=103")
	if got != "ok invalidate=b,c sync=b,c\n" {
		t.Fatalf("c's overwritten put: %q, want b invalidated (Sync) too", got)
	}
}
