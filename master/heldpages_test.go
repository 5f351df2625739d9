package master

import (
	"fmt"
	"testing"
	"time"
)

// heldPagesNode is one node of 1024 pages of 512 bytes, with put (PutStart and PutDone,
// a page under parent) and hold (a GetStart whose holder stays).
func heldPagesNode(t *testing.T) (st *State, put func(k, parent string) error, hold func(k string), nd *node) {
	t.Helper()
	now := time.Unix(1000, 0)
	st = NewState(Options{IDBase: 100, NodeTTL: time.Hour, HeartbeatInterval: time.Hour, Placement: PlacementLocal})
	n := NodeRef{ID: "n", Generation: 1}
	if err := st.Register(now, n, 1024*512, 0, 0, "dn", "pn", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	put = func(k, parent string) error {
		plan, err := st.PutStart(now, n, k, 512, false, &parent)
		if err != nil {
			return err
		}
		_, err = st.PutDone(now, n, k, plan.PutID)
		return err
	}
	hold = func(k string) {
		if _, err := st.GetStart(now, n, k, nil); err != nil {
			t.Fatal(err)
		}
	}
	return st, put, hold, st.nodes["n"]
}

// answerStillHeld answers the node's release asks as an owner whose clients still hold
// every page asked about.
func answerStillHeld(st *State, nd *node) {
	nd.release.answered(nd.release.take(), func(k string) bool { return st.heldLocked(k, nd) })
}

// A chain of held pages longer than one eviction's draw (victimScanLimit), an engine
// holding a long prefix: each pass lifts the pages drawn (their parent's cap
// notwithstanding), so the draws reach the unheld pages above them. Each page's cap kept
// the drawn pages at the bottom, passed or not, and once the hit bonus was behind the
// clock every put got NO_SPACE with hundreds of unheld pages live.
func TestHeldChainLongerThanADraw(t *testing.T) {
	for _, chain := range []int{victimScanLimit + 44} {
		t.Run(fmt.Sprint(chain), func(t *testing.T) {
			st, put, hold, nd := heldPagesNode(t)
			for i := range chain {
				parent := ""
				if i > 0 {
					parent = fmt.Sprintf("c%d", i-1)
				}
				if err := put(fmt.Sprintf("c%d", i), parent); err != nil {
					t.Fatal(err)
				}
				hold(fmt.Sprintf("c%d", i))
			}
			failures := 0
			for i := 0; i < 25000 && failures < 20; i++ { // past the hit bonus (pageFreqBonus ticks) it failed
				if put(fmt.Sprintf("q%d", i), "") == nil {
					failures = 0
					continue
				}
				failures++
				answerStillHeld(st, nd)
			}
			unheld := 0
			for k := range nd.policy.pages.entries {
				if !st.heldLocked(k, nd) {
					unheld++
				}
			}
			if failures >= 20 {
				t.Errorf("chain of %d held pages: 20 puts in a row got NO_SPACE while %d unheld pages could be evicted", chain, unheld)
			}
		})
	}
}

// victimScanLimit held orphans (pages whose parent has no route: priority zero) are
// lifted by a pass as well: once the owner answered that it still holds them, the put
// that passes them draws again and finds an unheld page.
func TestHeldOrphansLifted(t *testing.T) {
	st, put, hold, nd := heldPagesNode(t)
	for i := range victimScanLimit {
		k := fmt.Sprintf("o%d", i)
		if err := put(k, fmt.Sprintf("gone%d", i)); err != nil { // a parent never put, or evicted elsewhere
			t.Fatal(err)
		}
		hold(k)
	}
	for i := range 2000 {
		if err := put(fmt.Sprintf("q%d", i), ""); err != nil {
			answerStillHeld(st, nd) // the first put to meet them asked the owner
			if err = put(fmt.Sprintf("q%d", i), ""); err != nil {
				t.Fatalf("put %d: %v, with %d unheld pages on the node", i, err, nd.policy.Len()-victimScanLimit)
			}
		}
	}
}
