package master

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDupSearchRests: a full node whose only duplicate lies beyond the oldest
// victimScanLimit candidates searches once, evicts dupRescan sole copies without
// searching, then searches again and, finding none again, rests twice as long; a
// duplicate a get makes leaves the rest alone, one a replica report brings ends it at
// once, and the search that follows finds it.
func TestDupSearchRests(t *testing.T) {
	st := NewState(Options{IDBase: 100, NodeTTL: time.Minute, InflightTTL: time.Minute})
	now := time.Unix(1000, 0)
	const keys = victimScanLimit + 64
	scriptLine(t, st, &now, fmt.Sprintf("register node=a gen=1 size=%d", keys*AllocGranule))
	scriptLine(t, st, &now, "register node=b gen=1 size=16KiB")
	for i := range keys {
		scriptLine(t, st, &now, fmt.Sprintf("put node=a key=k%d len=%d", i, AllocGranule))
	}
	a := st.nodes["a"]
	copyToB := func(key string) {
		scriptLine(t, st, &now, "get node=b key="+key)
		if out := scriptLine(t, st, &now, "get-done node=b key="+key); !strings.Contains(out, "promoted=true") {
			t.Fatalf("b's copy of %s was not kept: %s", key, out)
		}
	}
	put := func(i int) {
		scriptLine(t, st, &now, fmt.Sprintf("put node=a key=x%d len=%d", i, AllocGranule))
	}
	// b copies the newest key: a duplicate on a, at the end of a's order.
	copyToB(fmt.Sprintf("k%d", keys-1))
	if a.dups != 1 || a.dupQuiet != 0 {
		t.Fatalf("a: dups=%d quiet=%d, want 1 and 0", a.dups, a.dupQuiet)
	}
	// The search finds no duplicate among the oldest candidates: k0 goes, the first of
	// dupRescan evictions without a search.
	put(0)
	if st.routes["k0"] != nil || a.dupQuiet != dupRescan-1 {
		t.Fatalf("after x0: k0 routed %v, quiet=%d; want k0 evicted, quiet=%d", st.routes["k0"] != nil, a.dupQuiet, dupRescan-1)
	}
	for i := 1; i < dupRescan; i++ {
		put(i)
	}
	if a.dupQuiet != 0 || st.routes[fmt.Sprint("k", dupRescan-1)] != nil {
		t.Fatalf("after %d puts: quiet=%d, want 0 (and k%d evicted)", dupRescan, a.dupQuiet, dupRescan-1)
	}
	// The rest is over: the next eviction searches again, finds none, rests twice as
	// long.
	put(dupRescan)
	if a.dupQuiet != 2*dupRescan-1 {
		t.Fatalf("after x%d: quiet=%d, want %d (a new search, a longer rest)", dupRescan, a.dupQuiet, 2*dupRescan-1)
	}
	// A copy a get makes does not end the rest: the get touched its source, so both
	// copies are new in their orders.
	copyToB(fmt.Sprint("k", dupRescan+8))
	if a.dups != 2 || a.dupQuiet != 2*dupRescan-1 {
		t.Fatalf("after b's second copy: dups=%d quiet=%d, want 2 and %d", a.dups, a.dupQuiet, 2*dupRescan-1)
	}
	// A copy learned from a replica report (a new master rebuilding) may be old on a:
	// that ends the rest at once.
	old := fmt.Sprint("k", dupRescan+9)
	scriptLine(t, st, &now, "rebuild window=10s")
	scriptLine(t, st, &now, "register node=c gen=1 size=16KiB reports=1")
	scriptLine(t, st, &now, "report node=c last=1", fmt.Sprintf("%s %d %d mem@0", old, st.routes[old].putID, AllocGranule))
	if a.dups != 3 || a.dupQuiet != 0 || a.dupRest != 0 {
		t.Fatalf("after c reported a copy of %s: dups=%d quiet=%d rest=%d, want 3, 0 and 0", old, a.dups, a.dupQuiet, a.dupRest)
	}
	// The next eviction finds it among a's oldest: a's copy goes, c's stays.
	put(dupRescan + 1)
	if r := st.routes[old]; r == nil || r.memoryReplica(a) != nil || r.memoryReplica(st.nodes["c"]) == nil || a.dups != 2 {
		t.Fatalf("after x%d: %s routed %v, dups=%d; want a's copy evicted, c's kept, 2 duplicates left", dupRescan+1, old, r != nil, a.dups)
	}
	if err := dupDrift(st); err != nil {
		t.Fatal(err)
	}
}

// TestDupRestDoubles: each search in a row that finds no duplicate rests twice as long,
// up to maxDupRest (shorter than the window, so a duplicate entering it at its end is
// still found before it is the oldest); a search that finds one, or a duplicate that
// may be old (endDupRest), starts again from dupRescan.
func TestDupRestDoubles(t *testing.T) {
	if maxDupRest >= victimScanLimit {
		t.Fatalf("maxDupRest %d: want below the window of %d", maxDupRest, victimScanLimit)
	}
	n := &node{}
	var rests []int
	for range 6 {
		restFromDupSearch(n)
		rests = append(rests, n.dupQuiet)
	}
	if want := []int{dupRescan, 2 * dupRescan, 4 * dupRescan, maxDupRest, maxDupRest, maxDupRest}; fmt.Sprint(rests) != fmt.Sprint(want) {
		t.Fatalf("rests %v, want %v", rests, want)
	}
	n.dupRest = 0 // a search found one (allocateEvictingLocked)
	if restFromDupSearch(n); n.dupQuiet != dupRescan {
		t.Fatalf("rest after a find, then none: %d, want %d", n.dupQuiet, dupRescan)
	}
	restFromDupSearch(n)
	if endDupRest(n); n.dupQuiet != 0 || n.dupRest != 0 {
		t.Fatalf("after endDupRest: quiet=%d rest=%d, want 0 and 0", n.dupQuiet, n.dupRest)
	}
}
