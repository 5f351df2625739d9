package master

import (
	"fmt"
	"testing"
	"time"
)

// TestPageGhosts: the ghost keeps the newest pageGhostFactor × live pages (at least
// minGhost), forgets the oldest first, hands a page's hits back once, and a page
// remembered again is not forgotten for its older record.
func TestPageGhosts(t *testing.T) {
	g := newPageGhosts()
	for i := range minGhost + 4 {
		g.remember(fmt.Sprint("k", i), uint32(i+1))
	}
	if g.Len() != minGhost {
		t.Fatalf("ghost holds %d pages with none live, want %d", g.Len(), minGhost)
	}
	for i := range 4 {
		if _, ok := g.take(fmt.Sprint("k", i)); ok {
			t.Fatalf("k%d, among the oldest, is still remembered", i)
		}
	}
	if f, ok := g.take("k5"); !ok || f != 6 {
		t.Fatalf("take(k5) = %d, %v; want 6, true", f, ok)
	}
	if _, ok := g.take("k5"); ok {
		t.Fatal("k5 was handed back twice")
	}

	// k6 is remembered again: its first record's turn to go does not forget it.
	g.remember("k6", 9)
	for i := range minGhost - 1 {
		g.remember(fmt.Sprint("n", i), 1)
	}
	if f, ok := g.take("k6"); !ok || f != 9 {
		t.Fatalf("take(k6) = %d, %v after it was remembered again; want 9, true", f, ok)
	}

	// Live pages lengthen it.
	g.live = 10
	for i := range pageGhostFactor * 10 {
		g.remember(fmt.Sprint("m", i), 1)
	}
	if g.Len() != pageGhostFactor*10 {
		t.Fatalf("ghost holds %d pages for 10 live, want %d", g.Len(), pageGhostFactor*10)
	}
}

// TestPageGhostShared: two nodes' page policies share one ghost; a page evicted on one
// comes back with its hits on the other, and the ghost counts both nodes' live pages
// until one detaches.
func TestPageGhostShared(t *testing.T) {
	g := newPageGhosts()
	var clock int64
	a, b := newEvictOrder(&clock, g), newEvictOrder(&clock, g)
	a.InsertPage("p", 1, "", false)
	a.Touch("p")
	a.Touch("p")
	a.InsertPage("q", 1, "", false)
	b.InsertPage("r", 1, "", false)
	if g.live != 3 {
		t.Fatalf("ghost counts %d live pages, want 3", g.live)
	}
	if k, ok := a.VictimWhere(func(k string) bool { return k == "p" }, 2); !ok || k != "p" {
		t.Fatalf("VictimWhere = %q, %v; want p", k, ok)
	}
	b.InsertPage("p", 1, "", false)
	if e := b.pages.entries["p"]; e == nil || e.freq != 4 {
		t.Fatalf("p put again on b: %+v, want 4 hits (3 on a, the put again)", e)
	}
	b.Detach()
	if g.live != 1 {
		t.Fatalf("after b detached the ghost counts %d live pages, want 1 (a's q)", g.live)
	}
	b.InsertPage("s", 1, "", false)
	if g.live != 1 {
		t.Fatalf("a detached node's put counted in the pool's ghost: %d live", g.live)
	}
}

// TestPageGhostQueueBounded: a node whose pages are evicted and put again in turn (a
// working set a page larger than its memory) keeps the ghost's map tiny (each put takes
// its page back), and its queue must stay as small: every eviction appends a reference,
// which nothing popped while the map was within its bound (19,992 references for one
// remembered page after 20,000 puts).
func TestPageGhostQueueBounded(t *testing.T) {
	st := NewState(Options{IDBase: 100, SSDAdmit: SSDAdmitPut})
	now := time.Unix(1000, 0)
	ref := NodeRef{ID: "n1", Generation: 1}
	if err := st.Register(now, ref, 8*1024, 0, 0, "", "peer-n1", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	const keys = 9 // 8 fit
	root := ""
	for i := range 20000 {
		k := fmt.Sprintf("p%d", i%keys)
		p, err := st.PutStart(now, ref, k, 1024, false, &root)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.PutDone(now, ref, k, p.PutID); err != nil {
			t.Fatal(err)
		}
	}
	g := st.ghosts
	if refs := len(g.queue) - g.at; refs > 4*max(g.bound(), g.Len()) {
		t.Fatalf("the ghost's queue holds %d references for %d remembered pages (bound %d)", refs, g.Len(), g.bound())
	}
}
