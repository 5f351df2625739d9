// Package workers runs the items of a batch on a bounded number of goroutines.
package workers

import "sync"

// ForEach runs f(0), …, f(n-1) on at most limit goroutines (one item at a time on the
// caller's goroutine when n or limit is at most 1) and returns when every call has.
func ForEach(n, limit int, f func(i int)) {
	if n <= 1 || limit <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, limit) {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
