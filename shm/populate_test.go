package shm

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// allocatedBytes is what the memfd holds in memory (fstat's blocks).
func allocatedBytes(t *testing.T, s *Segment) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(s.Fd(), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func TestPopulateAllocatesTheSegment(t *testing.T) {
	checkFds(t)
	const size = 3*populateChunk + 5*4096 // the last range is short
	lazy, err := CreateSegment("populate-lazy", size, SegmentOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer lazy.Close()
	if got := allocatedBytes(t, lazy); got != 0 {
		t.Fatalf("a segment created without Populate holds %d bytes, want 0", got)
	}
	var calls int
	var last int64
	s, err := CreateSegment("populate", size, SegmentOptions{Populate: true, Progress: func(done, total int64) {
		calls++
		if total != size || done <= last || done > total {
			t.Errorf("progress(%d, %d) after %d", done, total, last)
		}
		last = done
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := allocatedBytes(t, s); got != size {
		t.Fatalf("a populated segment holds %d bytes, want %d", got, size)
	}
	if calls != 4 || last != size {
		t.Fatalf("progress called %d times, last with %d; want 4 calls ending at %d", calls, last, size)
	}
	b := s.Bytes()
	for i := 0; i < len(b); i += 4096 {
		if b[i] != 0 {
			t.Fatalf("byte %d of a populated segment is %d, want 0", i, b[i])
		}
	}
}

// A kernel without MADV_POPULATE_WRITE (EINVAL) gets every page written instead; any
// other failure fails the creation and leaves no fd behind.
func TestPopulateWithoutTheAdvice(t *testing.T) {
	checkFds(t)
	real := madvisePopulate
	defer func() { madvisePopulate = real }()
	madvisePopulate = func([]byte) error { return unix.EINVAL }
	const size = populateChunk + 4096
	s, err := CreateSegment("populate-old-kernel", size, SegmentOptions{Populate: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := allocatedBytes(t, s); got != size {
		t.Errorf("populated by writes: holds %d bytes, want %d", got, size)
	}
	s.Close()

	madvisePopulate = func([]byte) error { return unix.ENOMEM }
	if s, err := CreateSegment("populate-no-memory", size, SegmentOptions{Populate: true}); err == nil {
		s.Close()
		t.Fatal("CreateSegment succeeded where populating failed")
	} else if want := "lacks the memory"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
}
