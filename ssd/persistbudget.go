package ssd

import "golang.org/x/sync/semaphore"

// persistBufferBudget bounds the bytes of record buffers the persists of one Storage
// hold at once (filled and waiting for a writer's turn, or being written). The master
// runs many persists at a time so that small values keep the disk busy; for large
// values the budget, not the master's concurrency, bounds the owner's memory beside
// its segment: 16 MiB values (32 MiB buffers) persist 4 at a time.
const persistBufferBudget = 128 << 20

func newPersistBudget() *semaphore.Weighted { return semaphore.NewWeighted(persistBufferBudget) }

// acquireBuffer waits until a record buffer of size bytes fits the budget (one larger
// than the whole budget waits for all of it) and returns the weight to release;
// ErrClosed once Close began.
func (s *Storage) acquireBuffer(size int) (int64, error) {
	w := min(int64(bufCapacity(size)), persistBufferBudget)
	if err := s.bufBudget.Acquire(s.budgetCtx, w); err != nil {
		return 0, ErrClosed
	}
	return w, nil
}
