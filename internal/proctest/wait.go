package proctest

import "time"

// WaitUntil polls cond every 5 ms until it holds, failing t after 10 s: for tests
// that wait on another goroutine or process (count what happened; the bound is slack
// for a busy machine, not a timing claim).
func WaitUntil(t TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
