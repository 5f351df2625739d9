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
	mem, ssd, seq, more := b.pending()
	if len(mem)+len(ssd) != evictNoticeBatch || seq != evictNoticeBatch || !more || len(ssd) != evictNoticeBatch/2 {
		t.Fatalf("first batch: %d memory + %d ssd, seq %d, more %v", len(mem), len(ssd), seq, more)
	}
	b.ack(seq)
	if !b.has("k") || !b.has("last") {
		t.Fatal("keys with unacked notices not held")
	}
	mem, ssd, seq, more = b.pending()
	if len(mem)+len(ssd) != n-evictNoticeBatch+1 || seq != n+1 || more {
		t.Fatalf("second batch: %d memory + %d ssd, seq %d, more %v", len(mem), len(ssd), seq, more)
	}
	b.ack(seq - 1)
	if b.has("k") || !b.has("last") || b.len() != 1 {
		t.Fatalf("after acking all but the last: has(k)=%v has(last)=%v len=%d", b.has("k"), b.has("last"), b.len())
	}
	b.ack(seq)
	if b.has("last") || b.len() != 0 {
		t.Fatal("notices left after the last ack")
	}
	if _, _, s, more := b.pending(); s != n+1 || more {
		t.Fatalf("empty outbox: seq %d more %v", s, more)
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
