package shm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shmemTHPPath is where the kernel says which shared memory (memfd, tmpfs) it backs with
// transparent huge pages.
const shmemTHPPath = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"

// ShmemTHP is the kernel's policy for transparent huge pages of shared memory, the
// bracketed word of /sys/kernel/mm/transparent_hugepage/shmem_enabled: always,
// within_size, advise, never, deny or force; "" where the kernel does not say (no
// transparent huge pages, no sysfs).
func ShmemTHP() string {
	b, err := os.ReadFile(shmemTHPPath)
	if err != nil {
		return ""
	}
	return selectedWord(string(b))
}

// selectedWord is the bracketed word of a sysfs choice line ("always [never] deny"), or
// "" without one.
func selectedWord(line string) string {
	for _, w := range strings.Fields(line) {
		if len(w) > 2 && w[0] == '[' && w[len(w)-1] == ']' {
			return w[1 : len(w)-1]
		}
	}
	return ""
}

// ShmemTHPAdvised reports whether the kernel policy p gives huge pages to shared memory
// first touched through a mapping advised with MADV_HUGEPAGE (SegmentOptions.HugePages).
func ShmemTHPAdvised(p string) bool {
	switch p {
	case "always", "within_size", "advise", "force":
		return true
	}
	return false
}

// adviseHugePages asks for transparent huge pages on the mapping (MADV_HUGEPAGE), or
// refuses them (MADV_NOHUGEPAGE). A kernel without transparent huge pages refuses the
// advice with EINVAL: the mapping then has small pages, which is what it would get anyway.
func adviseHugePages(data []byte, on bool) error {
	advice := unix.MADV_NOHUGEPAGE
	if on {
		advice = unix.MADV_HUGEPAGE
	}
	if err := unix.Madvise(data, advice); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("madvise huge pages %v: %w", on, err)
	}
	return nil
}

// HugeBytes is how many bytes of the segment's mapping in this process huge pages map
// (the ShmemPmdMapped of its /proc/self/smaps entry): after a prefault, the part of the
// segment the kernel backed with huge pages. 0 after Close.
func (s *Segment) HugeBytes() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data == nil {
		return 0, nil
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return 0, fmt.Errorf("huge pages of segment %q: %w", s.name, err)
	}
	defer f.Close()
	n, err := pmdMappedBytes(f, uint64(uintptr(unsafe.Pointer(&s.data[0]))))
	if err != nil {
		return 0, fmt.Errorf("huge pages of segment %q: %w", s.name, err)
	}
	return n, nil
}

// pmdMappedBytes reads an smaps listing (proc(5)) and returns the bytes that huge pages
// map (ShmemPmdMapped plus FilePmdMapped) in the mapping that starts at address start.
// A listing without that mapping is an error.
func pmdMappedBytes(r io.Reader, start uint64) (int64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	in, found := false, false
	var total int64
	for sc.Scan() {
		line := sc.Bytes()
		if lo, ok := mappingStart(line); ok {
			in = lo == start
			found = found || in
			continue
		}
		if !in {
			continue
		}
		key, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok || (string(key) != "ShmemPmdMapped" && string(key) != "FilePmdMapped") {
			continue
		}
		f := strings.Fields(string(rest))
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("smaps line %q: want a count of kB", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 || kb > 1<<32 {
			return 0, fmt.Errorf("smaps line %q: bad count", line)
		}
		total += kb << 10
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read smaps: %w", err)
	}
	if !found {
		return 0, fmt.Errorf("no mapping at %#x in smaps", start)
	}
	return total, nil
}

// mappingStart parses the first address of an smaps header line ("7f12-7f34 rw-s ...");
// ok is false for a field line ("Size:   4 kB").
func mappingStart(line []byte) (uint64, bool) {
	rng, _, _ := bytes.Cut(line, []byte(" "))
	lo, hi, ok := bytes.Cut(rng, []byte("-"))
	if !ok || len(lo) == 0 || len(hi) == 0 {
		return 0, false
	}
	a, err := strconv.ParseUint(string(lo), 16, 64)
	if err != nil {
		return 0, false
	}
	if _, err := strconv.ParseUint(string(hi), 16, 64); err != nil {
		return 0, false
	}
	return a, true
}
