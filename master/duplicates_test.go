package master

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDupSearchRests: a full node whose only duplicate lies beyond the oldest
// victimScanLimit candidates searches once, evicts dupRescan sole copies without
// searching, then searches again; a duplicate a get makes leaves the rest alone, one a
// replica report brings ends it at once.
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
	// The rest is over: the next eviction searches again, finds none, rests again.
	put(dupRescan)
	if a.dupQuiet != dupRescan-1 {
		t.Fatalf("after x%d: quiet=%d, want %d (a new search)", dupRescan, a.dupQuiet, dupRescan-1)
	}
	// A copy a get makes does not end the rest: the get touched its source, so both
	// copies are new in their orders.
	copyToB(fmt.Sprint("k", dupRescan+8))
	if a.dups != 2 || a.dupQuiet != dupRescan-1 {
		t.Fatalf("after b's second copy: dups=%d quiet=%d, want 2 and %d", a.dups, a.dupQuiet, dupRescan-1)
	}
	// A copy learned from a replica report (a new master rebuilding) may be old on a:
	// that ends the rest at once.
	old := fmt.Sprint("k", dupRescan+9)
	scriptLine(t, st, &now, "rebuild window=10s")
	scriptLine(t, st, &now, "register node=c gen=1 size=16KiB reports=1")
	scriptLine(t, st, &now, "report node=c last=1", fmt.Sprintf("%s %d %d mem@0", old, st.routes[old].putID, AllocGranule))
	if a.dups != 3 || a.dupQuiet != 0 {
		t.Fatalf("after c reported a copy of %s: dups=%d quiet=%d, want 3 and 0", old, a.dups, a.dupQuiet)
	}
	if err := dupDrift(st); err != nil {
		t.Fatal(err)
	}
}
