package master

import (
	"testing"
	"time"
)

// TestStaleAckAcrossReregistration: an owner's heartbeat carries the ack of the
// eviction notices it applied, numbered by the incarnation it registered as. If the
// same master (same epoch) tombs and re-registers the owner while that heartbeat is
// in flight, the new incarnation numbers its notices from 1 again: the stale ack must
// not drop notices the owner never saw (it would keep the evicted version in its
// replica index, and the master would stop counting it as a holder).
func TestStaleAckAcrossReregistration(t *testing.T) {
	st := NewState(Options{IDBase: 100, NodeTTL: time.Minute, HeartbeatInterval: time.Second, InflightTTL: time.Minute})
	now := time.Unix(1000, 0)
	ref := NodeRef{ID: "n1", Generation: 7}
	if err := st.Register(now, ref, 1<<20, 0, 0, "d1", "p1", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	n := st.nodes["n1"]
	for i := range 10 {
		n.evicted.push("old", int64(i+1), false)
	}
	// The owner applies the ten notices; its next heartbeat (sent now) will ack seq 10.
	if _, err := st.Heartbeat(now, ref, SSDInfo{}, 0); err != nil {
		t.Fatal(err)
	}
	staleAck := int64(10)
	// Meanwhile the owner registers again with this master (it was tombed, or a
	// background registration ran): a new incarnation, same ref.
	now = now.Add(time.Second)
	if err := st.Register(now, ref, 1<<20, 0, 0, "d1", "p1", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	n2 := st.nodes["n1"]
	n2.evicted.push("k", 500, false) // the new incarnation evicts k@500
	// The heartbeat sent before the registration arrives now, acking seq 10.
	ns, err := st.Heartbeat(now, ref, SSDInfo{}, staleAck)
	if err != nil {
		t.Fatal(err)
	}
	if len(ns.Evicted) != 1 || !n2.evicted.has("k") {
		t.Fatalf("the notice of k@500, never delivered, was acked by a stale ack of the previous registration: evicted=%v has(k)=%v", ns.Evicted, n2.evicted.has("k"))
	}
}
