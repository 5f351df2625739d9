package workers

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestForEachRunsEveryItemWithinTheBound(t *testing.T) {
	for _, tc := range []struct{ n, limit int }{{0, 4}, {1, 4}, {5, 1}, {100, 4}, {3, 10}} {
		var mu sync.Mutex
		seen := make(map[int]int)
		var running, peak atomic.Int32
		ForEach(tc.n, tc.limit, func(i int) {
			r := running.Add(1)
			for {
				p := peak.Load()
				if r <= p || peak.CompareAndSwap(p, r) {
					break
				}
			}
			mu.Lock()
			seen[i]++
			mu.Unlock()
			running.Add(-1)
		})
		if len(seen) != tc.n {
			t.Fatalf("n=%d limit=%d: %d items ran", tc.n, tc.limit, len(seen))
		}
		for i, c := range seen {
			if c != 1 || i < 0 || i >= tc.n {
				t.Fatalf("item %d ran %d times", i, c)
			}
		}
		if int(peak.Load()) > max(tc.limit, 1) {
			t.Fatalf("n=%d limit=%d: %d ran at once", tc.n, tc.limit, peak.Load())
		}
	}
}
