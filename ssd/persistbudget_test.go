package ssd

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPersistBufferBudget: however many persists run at once, the record buffers they
// hold stay within persistBufferBudget: of ten 16 MiB persists (32 MiB buffers) four
// fill at a time; the others wait, and all complete once the fills go on.
func TestPersistBufferBudget(t *testing.T) {
	const n, size = 10, 16 << 20
	s := openTest(t, EnginePsync, n*(size+1<<20), nil)
	perBuf := bufCapacity(int(headerSize(len("budget-0")) + alignUp(size)))
	want := persistBufferBudget / perBuf
	var filling, most atomic.Int64
	gate := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pin, err := s.PersistFrom(fmt.Sprintf("budget-%d", i), 1, size, func(dst []byte) error {
				c := filling.Add(1)
				for m := most.Load(); c > m && !most.CompareAndSwap(m, c); m = most.Load() {
				}
				<-gate
				filling.Add(-1)
				return nil
			})
			if err == nil {
				pin.Release()
			}
			errs <- err
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for filling.Load() < int64(want) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a persist past the budget would be filling by now
	if got := most.Load(); got != int64(want) {
		t.Errorf("%d persists filled their buffers at once, want %d (budget %d B, buffers of %d B)", got, want, persistBufferBudget, perBuf)
	}
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("persist: %v", err)
		}
	}
}
