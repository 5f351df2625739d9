package master

import (
	"math"
	"testing"
	"time"
)

// TestIDsPastPins: a master that takes a registration with pins issues ids above
// every pin's, whatever its id base: a term after one whose ids ran past the next
// epoch's base never hands a new holder the id of a holding an owner still acks.
func TestIDsPastPins(t *testing.T) {
	st := NewState(Options{IDBase: 1000})
	ref := NodeRef{ID: "n1", Generation: 1}
	if err := st.Register(time.Unix(1000, 0), ref, 1<<20, 0, 0, "d1", "p1", SSDInfo{}, []Pin{{PinID: 5000, Offset: 0, Len: 4096}}); err != nil {
		t.Fatal(err)
	}
	if id := st.newID(); id <= 5000 {
		t.Fatalf("id %d issued after a pin of id 5000 was registered", id)
	}
}

// TestIDsRunOut: a term resigns once the ids it issued come within idMargin of the
// next epoch's base, not before, and not for ids its owners carried from a master
// numbered otherwise (a standalone master's, by time: every later term would adopt
// them and resign too, a review).
func TestIDsRunOut(t *testing.T) {
	const epoch = 7
	base, next := int64(epoch)<<idEpochShift, int64(epoch+1)<<idEpochShift
	for _, c := range []struct {
		id, carried int64
		want        bool
	}{
		{base, 0, false},
		{next - idMargin - 1, base - 5, false},
		{next - idMargin, base - 5, true},
		{next + 1, 0, true},
		{next + 1, next + 1, false},
	} {
		if got := idsRunOut(c.id, c.carried, epoch); got != c.want {
			t.Errorf("idsRunOut(%d, %d, %d) = %v, want %v", c.id, c.carried, epoch, got, c.want)
		}
	}
	old := time.Now().UnixNano() // a pin a standalone master issued
	for e := int64(1); e <= 3; e++ {
		st := NewState(Options{IDBase: e << idEpochShift, Epoch: e})
		if err := st.Register(time.Unix(1000, 0), NodeRef{ID: "n1", Generation: 1}, 1<<20, 0, 0, "d1", "p1", SSDInfo{}, []Pin{{PinID: old, Offset: 0, Len: 4096}}); err != nil {
			t.Fatal(err)
		}
		if idsRunOut(st.nextID, st.carriedID, e) {
			t.Errorf("term of epoch %d resigns for a pin a standalone master numbered: every later term would", e)
		}
	}
}

// TestOwnPinKeepsTheResign: an owner that registers again with a term past its margin
// pins a holder the term issued itself: that id counts as the term's, not as one
// carried from an earlier master, and the term still resigns (a review).
func TestOwnPinKeepsTheResign(t *testing.T) {
	const epoch = 7
	limit := int64(epoch+1)<<idEpochShift - idMargin
	st := NewState(Options{IDBase: limit - 10, Epoch: epoch})
	ref := NodeRef{ID: "n1", Generation: 1}
	if err := st.Register(time.Unix(1000, 0), ref, 1<<20, 0, 0, "d1", "p1", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	var own int64
	for own < limit+5 {
		own = st.newID()
	}
	if err := st.Register(time.Unix(1001, 0), ref, 1<<20, 0, 0, "d1", "p1", SSDInfo{}, []Pin{{PinID: own, Offset: 0, Len: 4096}}); err != nil {
		t.Fatal(err)
	}
	if !idsRunOut(st.nextID, st.carriedID, epoch) {
		t.Errorf("a term past its margin no longer resigns after an owner pinned one of its own ids (next %d, carried %d, limit %d)", st.nextID, st.carriedID, limit)
	}
}

// TestIDsPastTheBoundRefused: a pin or a reported record whose id leaves the master less
// than a term's range of ids is refused: the counter stays, and a later overwrite is
// published (a review: a pin of MaxInt64 wrapped the counter, the next put id was
// negative and each overwrite was dropped as older).
func TestIDsPastTheBoundRefused(t *testing.T) {
	st := NewState(Options{IDBase: 1000})
	a, b := NodeRef{ID: "a", Generation: 1}, NodeRef{ID: "b", Generation: 1}
	now := time.Unix(1000, 0)
	if err := st.Register(now, a, 1<<20, 0, 0, "da", "pa", SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	put := func(key string) int64 {
		t.Helper()
		p, err := st.PutStart(now, a, key, 100, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.PutDone(now, a, key, p.PutID); err != nil {
			t.Fatal(err)
		}
		return p.PutID
	}
	first := put("k")
	if err := st.Register(now, b, 1<<20, 0, 0, "db", "pb", SSDInfo{}, []Pin{{PinID: math.MaxInt64, Offset: 0, Len: 4096}}); err != nil {
		t.Fatal(err)
	}
	if st.nextID > maxCarriedID {
		t.Fatalf("the counter took a pin of id MaxInt64: %d", st.nextID)
	}
	if second := put("k"); second <= first || st.routes["k"].putID != second {
		t.Fatalf("an overwrite after a pin of id MaxInt64: put id %d, route %d (first %d)", second, st.routes["k"].putID, first)
	}
	if ok, _ := st.adoptLocked(st.nodes["b"], ReplicaRecord{Key: "r", Len: 100, PutID: math.MaxInt64, Memory: true}); ok {
		t.Error("a record of put id MaxInt64 was adopted")
	}
}
