package master

import "testing"

// TestEvictOrderEvict: a key evicted out of turn (a take-back's victim) leaves the
// order as a drawn victim would: a page is remembered in the pool's ghost with its hits,
// a plain key from small in the policy's ghost (put again, it goes straight to main),
// one from main is forgotten; a key the order does not hold is not evicted.
func TestEvictOrderEvict(t *testing.T) {
	var clock int64
	o := newEvictOrder(&clock, newPageGhosts())
	o.InsertPage("p", 1, "", false)
	o.Touch("p")
	o.InsertPage("q", 1, "p", false)
	o.Insert("s", 1) // small
	o.Insert("m", 1)
	o.Touch("m")
	for _, k := range []string{"x1", "x2", "x3"} {
		o.Insert(k, 1)
	}
	// m, hit in small, moves to main when small is drawn from: draw until x1 goes.
	if k, ok := o.plain.VictimWhere(func(k string) bool { return k == "x1" }, 8); !ok || k != "x1" {
		t.Fatalf("VictimWhere = %q, %v; want x1", k, ok)
	}
	if e := o.plain.entries["m"]; e == nil || e.queue != inMain {
		t.Fatalf("m is not in main: %+v", e)
	}

	for _, k := range []string{"p", "s", "m"} {
		if !o.Evict(k) || o.IsPage(k) || o.plain.has(k) {
			t.Fatalf("Evict(%s): not evicted", k)
		}
		if o.Evict(k) {
			t.Fatalf("Evict(%s) twice evicted it twice", k)
		}
	}
	if o.Evict("absent") {
		t.Fatal("Evict of a key the order does not hold reported an eviction")
	}
	if f, ok := o.pages.ghosts.take("p"); !ok || f != 2 {
		t.Fatalf("page p in the ghost: %d hits, %v; want 2 (its put, one touch)", f, ok)
	}
	if e := o.plain.entries["s"]; e == nil || e.queue != inGhost || e.weight != 0 {
		t.Fatalf("s, evicted from small, is not a ghost: %+v", e)
	}
	if o.plain.entries["m"] != nil {
		t.Fatal("m, evicted from main, is still remembered")
	}
	o.Insert("s", 1)
	if e := o.plain.entries["s"]; e.queue != inMain {
		t.Fatalf("s put again: queue %d, want main", e.queue)
	}
	checkPolicy(t, o.plain)
	if o.Len() != 4 { // the page q, x2, x3, s
		t.Fatalf("%d keys left in the order, want 4", o.Len())
	}
}
