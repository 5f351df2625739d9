package shm

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// populateChunk is the range one MADV_POPULATE_WRITE call covers: small enough that
// progress is reported often and the workers share the work evenly, large enough that
// the calls cost nothing beside the faults they take.
const populateChunk = 64 << 20

// populate faults every page of the shared mapping data in, writable, so the memfd's
// memory is allocated and zeroed now instead of on the first write of each page (which
// on a virtual machine also makes the host back the page: micro-seconds per 4 KiB,
// paid on a put's copy otherwise), and so a node without the memory fails here, at
// start, instead of when a client first writes. Ranges go to up to GOMAXPROCS workers;
// progress, when not nil, is called with the bytes done so far after each range (from
// any worker, one call at a time, the counts rising). A kernel without MADV_POPULATE_WRITE (before 5.14) gets each
// page written instead: a zero byte over a zero page, before anybody else maps it.
func populate(data []byte, progress func(done, total int64)) error {
	total := int64(len(data))
	if total == 0 {
		return nil
	}
	var (
		next     atomic.Int64
		failed   atomic.Bool
		mu       sync.Mutex // protects done; serialises progress
		done     int64
		errOnce  sync.Once
		firstErr error // set once, read after wg.Wait
		wg       sync.WaitGroup
	)
	workers := min(runtime.GOMAXPROCS(0), int((total+populateChunk-1)/populateChunk))
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := next.Add(populateChunk) - populateChunk
				if lo >= total || failed.Load() {
					return
				}
				hi := min(lo+populateChunk, total)
				if err := populateRange(data[lo:hi]); err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("populate bytes %d-%d of %d: %w", lo, hi, total, err) })
					failed.Store(true)
					return
				}
				mu.Lock()
				done += hi - lo
				if progress != nil {
					progress(done, total)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// madvisePopulate is unix.Madvise(b, MADV_POPULATE_WRITE); a test stands in a kernel
// without it.
var madvisePopulate = func(b []byte) error { return unix.Madvise(b, unix.MADV_POPULATE_WRITE) }

// populateRange faults b in writable: MADV_POPULATE_WRITE, or (EINVAL: an older kernel)
// a write to each page.
func populateRange(b []byte) error {
	err := madvisePopulate(b)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EFAULT) {
			return fmt.Errorf("the machine lacks the memory (MADV_POPULATE_WRITE: %w)", err)
		}
		return fmt.Errorf("MADV_POPULATE_WRITE: %w", err)
	}
	page := os.Getpagesize()
	for i := 0; i < len(b); i += page {
		b[i] = 0
	}
	return nil
}
