package wire

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Frame memory (docs/architecture.md §11): every process bounds the bytes of request frames in
// progress across all its connections with one FrameBudget.
const (
	// FreeFrameBytes: a frame up to this size is not charged to the budget. Such frames
	// are the common small call, read from the connection's own read buffer; what they
	// cost is bounded by the connection cap.
	FreeFrameBytes = 8 << 10
	// minFrameBudget is the smallest derived budget: two frames of the largest size.
	minFrameBudget = 2 * int64(MaxFrameBytes)
)

// FrameBudget bounds the memory of frames in progress: a frame over FreeFrameBytes
// reserves its announced size before its body is read and gives it back when its call
// is done. A reservation that does not fit waits for others to end, until its
// deadline; then it is refused (the connection closes with ErrFrameBudget's message).
// Reserving the whole announced size up front, not as bytes arrive, means no frame
// holds part of the budget while waiting for the rest: waits always end. A nil
// *FrameBudget is unbounded. Safe for concurrent use.
type FrameBudget struct {
	limit int64

	mu   sync.Mutex // protects used, wake
	used int64
	wake chan struct{} // closed and replaced by every release
}

// NewFrameBudget returns a budget of limit bytes (at least two frames of
// MaxFrameBytes: a smaller one could never serve the largest frame).
func NewFrameBudget(limit int64) *FrameBudget {
	return &FrameBudget{limit: max(limit, minFrameBudget), wake: make(chan struct{})}
}

// DefaultFrameBudget derives a process's budget: an eighth of basis (an owner's
// segment; 0 for a master), at most an eighth of physical memory, and never less than
// two frames of MaxFrameBytes. A master (basis 0) gets a thirty-second of memory.
func DefaultFrameBudget(basis int64) int64 {
	ram := physicalMemory()
	if basis <= 0 {
		return max(ram/32, minFrameBudget)
	}
	if ram > 0 {
		basis = min(basis, ram)
	}
	return max(basis/8, minFrameBudget)
}

// physicalMemory is the machine's RAM in bytes (0 if unknown).
func physicalMemory() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// Limit is the budget's size in bytes (0 for a nil budget: unbounded).
func (b *FrameBudget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// InUse is the bytes reserved now.
func (b *FrameBudget) InUse() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Reserve reserves the memory of a frame of size bytes, waiting for room until
// deadline (the zero time: no wait). It returns the bytes to Release once the frame's
// call is done: 0 for a frame up to FreeFrameBytes or a nil budget. The error wraps
// ErrFrameBudget and says how large the budget is and how much is in use.
func (b *FrameBudget) Reserve(size int, deadline time.Time) (int64, error) {
	n := int64(size)
	if b == nil || n <= FreeFrameBytes {
		return 0, nil
	}
	if n > b.limit {
		return 0, b.refusal(n)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		b.mu.Lock()
		if b.used+n <= b.limit {
			b.used += n
			b.mu.Unlock()
			return n, nil
		}
		wake := b.wake
		b.mu.Unlock()
		wait := time.Until(deadline)
		if wait <= 0 {
			return 0, b.refusal(n)
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-wake:
		case <-timer.C:
			return 0, b.refusal(n)
		}
	}
}

// Release gives back n bytes from Reserve.
func (b *FrameBudget) Release(n int64) {
	if b == nil || n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if b.used < 0 {
		panic(fmt.Sprintf("BUG: frame budget released %d bytes more than reserved", -b.used))
	}
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
}

func (b *FrameBudget) refusal(n int64) error {
	return fmt.Errorf("%w: a frame of %d bytes does not fit in the %d bytes of frame memory (%d in use by frames in progress); retry later",
		ErrFrameBudget, n, b.limit, b.InUse())
}

// ErrFrameBudget is wrapped by every refusal of a frame for want of frame memory.
var ErrFrameBudget = errors.New("frame memory budget exhausted")
