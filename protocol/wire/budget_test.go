package wire

import (
	"errors"
	"testing"
	"time"
)

// TestFrameBudget: small frames are free, large ones reserve their size, one that does
// not fit waits for a release until its deadline and is refused after it, one larger
// than the budget is refused at once; a nil budget is unbounded.
func TestFrameBudget(t *testing.T) {
	b := NewFrameBudget(0)
	if b.Limit() != minFrameBudget {
		t.Fatalf("limit %d, want the floor %d", b.Limit(), minFrameBudget)
	}
	if n, err := b.Reserve(FreeFrameBytes, time.Time{}); n != 0 || err != nil {
		t.Fatalf("small frame: %d, %v", n, err)
	}
	h1, err := b.Reserve(MaxFrameBytes, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	h2, err := b.Reserve(MaxFrameBytes, time.Time{})
	if err != nil || b.InUse() != 2*int64(MaxFrameBytes) {
		t.Fatalf("second frame: %v, in use %d", err, b.InUse())
	}
	if _, err := b.Reserve(FreeFrameBytes+1, time.Time{}); !errors.Is(err, ErrFrameBudget) {
		t.Fatalf("full budget without a wait: %v", err)
	}
	if _, err := b.Reserve(FreeFrameBytes+1, time.Now().Add(20*time.Millisecond)); !errors.Is(err, ErrFrameBudget) {
		t.Fatalf("full budget past the deadline: %v", err)
	}
	if _, err := b.Reserve(int(b.Limit())+1, time.Now().Add(time.Hour)); !errors.Is(err, ErrFrameBudget) {
		t.Fatalf("a frame larger than the budget must be refused at once: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := b.Reserve(MaxFrameBytes, time.Now().Add(time.Minute))
		got <- err
	}()
	b.Release(h1)
	if err := <-got; err != nil {
		t.Fatalf("a waiter after a release: %v", err)
	}
	b.Release(h2)
	b.Release(int64(MaxFrameBytes))
	if b.InUse() != 0 {
		t.Fatalf("in use %d after every release", b.InUse())
	}
	var none *FrameBudget
	if n, err := none.Reserve(1<<30, time.Time{}); n != 0 || err != nil {
		t.Fatalf("nil budget: %d, %v", n, err)
	}
	none.Release(0)
}

func TestDefaultFrameBudget(t *testing.T) {
	if got := DefaultFrameBudget(1 << 20); got != minFrameBudget {
		t.Errorf("tiny segment: %d, want the floor %d", got, minFrameBudget)
	}
	seg := int64(4 << 30)
	want := max(seg/8, minFrameBudget)
	if ram := physicalMemory(); ram > 0 && ram < seg {
		want = max(ram/8, minFrameBudget)
	}
	if got := DefaultFrameBudget(seg); got != want {
		t.Errorf("4 GiB segment: %d, want %d", got, want)
	}
	if got := DefaultFrameBudget(0); got < minFrameBudget || (physicalMemory() > 0 && got > max(physicalMemory()/32, minFrameBudget)) {
		t.Errorf("master: %d", got)
	}
}
