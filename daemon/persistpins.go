package daemon

import (
	"golang.org/x/sync/semaphore"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// pinBudget bounds the bytes of SSD entries this owner's persists have written and not
// committed yet (each holds a commit pin, ssd.CommitPin, until the master answered its
// BatchSsdReplicaCommit) to half its smallest ring. A pinned entry cannot be
// overwritten, so a persist that needs its ring space waits for the commit (up to
// ssd.Options.BusyWait, then fails): pins of more than a ring would make a batch, or
// concurrent batches, wait for their own commits, which come only after their last
// write (measured before: a batch of 1.4 MiB into a 1 MiB ring failed 14 of 24 values
// after BusyWait each). persistMany writes and commits its items in groups within the
// budget, so rings of any size serve batches of any size; on rings much larger than a
// batch the budget never waits.
type pinBudget struct {
	*semaphore.Weighted
	size int64 // the budget, and the most bytes one group takes
}

func newPinBudget(ringBytes int64) *pinBudget {
	size := max(ringBytes/2, 1)
	return &pinBudget{Weighted: semaphore.NewWeighted(size), size: size}
}

// persistPinWeight bounds the ring bytes of one persist's entry.
func (o *Owner) persistPinWeight(req *peer.SsdReplicaPersistRequest) int64 {
	return o.store.RecordSpan(req.Key, max(req.Len, 0))
}
