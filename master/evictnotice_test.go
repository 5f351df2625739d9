package master

import "testing"

// TestEvictOutbox: notices go out in batches of evictNoticeBatch (more set while others
// wait), memory and SSD ones apart; an ack drops exactly those up to its seq, and a key
// counts as held by the owner until every notice naming it is acked.
func TestEvictOutbox(t *testing.T) {
	var b evictOutbox
	const n = evictNoticeBatch + 100
	for i := range n {
		b.push("k", int64(i+1), i%2 == 1)
	}
	b.push("last", 9, false)
	ns := b.pending()
	if len(ns.Evicted)+len(ns.SSDDropped) != evictNoticeBatch || ns.Seq != evictNoticeBatch || !ns.More || len(ns.SSDDropped) != evictNoticeBatch/2 {
		t.Fatalf("first batch: %d memory + %d ssd, seq %d, more %v", len(ns.Evicted), len(ns.SSDDropped), ns.Seq, ns.More)
	}
	// Each memory notice comes with its own sequence number (the i-th push has i+1).
	if len(ns.EvictedSeqs) != len(ns.Evicted) {
		t.Fatalf("%d sequence numbers for %d memory notices", len(ns.EvictedSeqs), len(ns.Evicted))
	}
	for i, e := range ns.Evicted {
		if ns.EvictedSeqs[i] != e.PutId {
			t.Fatalf("notice of k@%d numbered %d, want %d", e.PutId, ns.EvictedSeqs[i], e.PutId)
		}
	}
	b.ack(ns.Seq)
	if !b.has("k") || !b.has("last") {
		t.Fatal("keys with unacked notices not held")
	}
	ns = b.pending()
	if len(ns.Evicted)+len(ns.SSDDropped) != n-evictNoticeBatch+1 || ns.Seq != n+1 || ns.More {
		t.Fatalf("second batch: %d memory + %d ssd, seq %d, more %v", len(ns.Evicted), len(ns.SSDDropped), ns.Seq, ns.More)
	}
	if last := len(ns.EvictedSeqs) - 1; ns.Evicted[last].Key != "last" || ns.EvictedSeqs[last] != n+1 {
		t.Fatalf("the last memory notice is %s numbered %d, want last numbered %d", ns.Evicted[last].Key, ns.EvictedSeqs[last], n+1)
	}
	b.ack(ns.Seq - 1)
	if b.has("k") || !b.has("last") || b.len() != 1 {
		t.Fatalf("after acking all but the last: has(k)=%v has(last)=%v len=%d", b.has("k"), b.has("last"), b.len())
	}
	b.ack(ns.Seq)
	if b.has("last") || b.len() != 0 {
		t.Fatal("notices left after the last ack")
	}
	if ns := b.pending(); ns.Seq != n+1 || ns.More {
		t.Fatalf("empty outbox: seq %d more %v", ns.Seq, ns.More)
	}
}

// TestEvictOutboxNames: names finds an unacked notice of the key's memory replica (or
// SSD entry) at the put id or above, until it is acked.
func TestEvictOutboxNames(t *testing.T) {
	var b evictOutbox
	b.push("k", 5, false)
	b.push("k", 7, true)
	for _, c := range []struct {
		key   string
		putID int64
		ssd   bool
		want  bool
	}{
		{"k", 5, false, true}, {"k", 4, false, true}, {"k", 6, false, false},
		{"k", 7, true, true}, {"k", 8, true, false}, {"j", 1, false, false},
	} {
		if got := b.names(c.key, c.putID, c.ssd); got != c.want {
			t.Errorf("names(%s, %d, ssd=%v) = %v, want %v", c.key, c.putID, c.ssd, got, c.want)
		}
	}
	b.ack(1)
	if b.names("k", 5, false) || !b.names("k", 7, true) {
		t.Fatal("after acking the memory notice")
	}
	b.ack(2)
	if b.names("k", 7, true) {
		t.Fatal("after acking both")
	}
}
