package master

import (
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

// TestIDsRunOut: a term resigns once its next id comes within idMargin of the next
// epoch's base, not before.
func TestIDsRunOut(t *testing.T) {
	const epoch = 7
	base, next := int64(epoch)<<idEpochShift, int64(epoch+1)<<idEpochShift
	for _, c := range []struct {
		id   int64
		want bool
	}{{base, false}, {next - idMargin - 1, false}, {next - idMargin, true}, {next + 1, true}} {
		if got := idsRunOut(c.id, epoch); got != c.want {
			t.Errorf("idsRunOut(%d, %d) = %v, want %v", c.id, epoch, got, c.want)
		}
	}
}
