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
