package daemon

import (
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/ssd"
)

// evictQueue holds the SSD ring's eviction reports until the master took them. The
// ring's own queue is short (it drops what its consumer does not take in time), so the
// owner drains it at once into this one, whatever its reports to the master wait for;
// past evictReportMaxPending entries the oldest go (logged once until it drains).
type evictQueue struct {
	mu       sync.Mutex
	pending  []ssd.Eviction
	closed   bool
	dropping bool
	ready    chan struct{} // a token: entries came, or the queue closed
	log      *zerolog.Logger
	dropped  func(n int) // counts entries dropped (Storage.DroppedEvictions); nil: none
}

func newEvictQueue(log *zerolog.Logger, dropped func(n int)) *evictQueue {
	return &evictQueue{ready: make(chan struct{}, 1), log: log, dropped: dropped}
}

// fill drains evs into q until it closes, then closes q.
func (q *evictQueue) fill(evs <-chan []ssd.Eviction) {
	for batch := range evs {
		q.add(batch)
	}
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.wake()
}

// add queues batch behind the entries waiting (also the records the owner forgot while
// the master may route to them: they go as evictions).
func (q *evictQueue) add(batch []ssd.Eviction) {
	if len(batch) == 0 {
		return
	}
	q.mu.Lock()
	q.pending = append(q.pending, batch...)
	if over := len(q.pending) - evictReportMaxPending; over > 0 {
		if !q.dropping {
			q.dropping = true
			q.log.Warn().Int("dropped", over).Msg("SSD eviction reports pile up while the master does not take them; dropping the oldest")
		}
		q.pending = q.pending[over:]
		if q.dropped != nil {
			q.dropped(over)
		}
	}
	q.mu.Unlock()
	q.wake()
}

func (q *evictQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// take removes and returns up to n of the oldest entries, waiting for some; ok false
// once the queue closed and its last entries were taken.
func (q *evictQueue) take(n int) (evs []ssd.Eviction, ok bool) {
	for {
		q.mu.Lock()
		if q.closed && len(q.pending) == 0 {
			q.mu.Unlock()
			return nil, false
		}
		if len(q.pending) > 0 {
			k := min(n, len(q.pending))
			evs = append([]ssd.Eviction(nil), q.pending[:k]...)
			q.pending = q.pending[k:]
			if len(q.pending) == 0 {
				q.pending, q.dropping = nil, false
			}
			q.mu.Unlock()
			return evs, true
		}
		q.mu.Unlock()
		<-q.ready
	}
}

// putBack returns evs, which the master did not take, to the front of the queue.
func (q *evictQueue) putBack(evs []ssd.Eviction) {
	q.mu.Lock()
	q.pending = append(evs, q.pending...)
	q.mu.Unlock()
}

// sleep waits d; false once the queue closed meanwhile.
func (q *evictQueue) sleep(d time.Duration) bool {
	if q.isClosed() {
		return false
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
			return true
		case <-q.ready:
			if q.isClosed() {
				return false
			}
		}
	}
}

func (q *evictQueue) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}
