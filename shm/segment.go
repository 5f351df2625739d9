package shm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// requiredSeals are the seals a segment carries and MapFd insists on: with them nobody
// can shrink the memfd under a live mapping (which would turn accesses into SIGBUS) or
// grow it past what the master allocates from.
const requiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// maxMemfdName is the longest name memfd_create accepts (249 bytes, NAME_MAX minus the
// "memfd:" prefix the kernel adds).
const maxMemfdName = 249

// MemfdName joins prefix, middle and suffix into a memfd name (a label in
// /proc/PID/fd, nothing looks it up), shortening middle from its end so the name fits
// memfd_create's limit: a node id may be 256 bytes, longer than a name allows.
func MemfdName(prefix, middle, suffix string) string {
	if over := len(prefix) + len(middle) + len(suffix) - maxMemfdName; over > 0 {
		middle = middle[:max(len(middle)-over, 0)]
	}
	return prefix + middle + suffix
}

// Segment is the owner's shared memory: a sealed memfd mapped read-write in the owner.
//
// The Segment owns both its fd and its mapping; Close releases both. Mappings made from
// the fd (MapFd, in this process or another one that received the fd) stay valid after
// Close: the memory lives as long as any mapping or fd refers to it.
// The methods are safe for concurrent use; the bytes themselves are not guarded.
type Segment struct {
	name        string
	size        int64
	writeSealed bool

	mu   sync.Mutex // protects fd, data
	fd   int        // -1 once closed
	data []byte     // nil once closed
}

// SegmentOptions tune CreateSegment.
type SegmentOptions struct {
	// SealWrites adds F_SEAL_FUTURE_WRITE once the segment is mapped read-write here:
	// from then on every new writable mapping, write(2), hole punch and mprotect
	// upgrade of the memfd fails with EPERM, whatever fd is used (a re-open of
	// /proc/PID/fd/N included), while this process's own mapping, read(2) into it and
	// O_DIRECT reads into it keep working. Client isolation (docs/architecture.md §11).
	SealWrites bool
	// Populate allocates the whole segment now (populate): every page faulted in
	// writable before CreateSegment returns, so puts never pay first-touch faults and a
	// machine without the memory fails at creation. Progress, when not nil, is told the
	// bytes done so far while that runs.
	Populate bool
	Progress func(done, total int64)
	// HugePages advises transparent huge pages for the segment (MADV_HUGEPAGE on this
	// mapping, before Populate touches it): where the kernel's policy for shared memory
	// allows it (ShmemTHP: advise, within_size, always), the pages this mapping faults in
	// are 2 MiB ones, and every process that maps the segment maps them with a fraction of
	// the page-table entries, TLB misses and, on a virtual machine with shadow page
	// tables, of the hypervisor's first-touch faults. False refuses them (MADV_NOHUGEPAGE),
	// so a kernel set to always gives this segment small pages. Pages a client first
	// writes through its own mapping (no Populate) are huge only where the policy is
	// always or within_size.
	HugePages bool
}

// CreateSegment creates a memfd named name (visible in /proc/PID/fd as "memfd:name") of
// size bytes and seals it in this order: F_SEAL_SHRINK|F_SEAL_GROW, a MAP_SHARED
// read-write mapping (advised for huge pages or against them, opts.HugePages),
// F_SEAL_FUTURE_WRITE when opts.SealWrites, then F_SEAL_SEAL (so no holder of the fd can
// add or drop seals later). size must be positive and a multiple of
// the page size. The fd is close-on-exec.
func CreateSegment(name string, size int64, opts SegmentOptions) (*Segment, error) {
	if err := checkSize(size, true); err != nil {
		return nil, fmt.Errorf("create segment %q: %w", name, err)
	}
	if len(name) > maxMemfdName {
		return nil, fmt.Errorf("create segment: name is %d bytes, memfd_create allows at most %d", len(name), maxMemfdName)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("create segment %q: memfd_create: %w", name, err)
	}
	fail := func(format string, args ...any) (*Segment, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("create segment %q: "+format, append([]any{name}, args...)...)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fail("ftruncate to %d bytes: %w", size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, requiredSeals); err != nil {
		return fail("seal shrink and grow: %w", err)
	}
	data, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap %d bytes: %w", size, err)
	}
	if err := adviseHugePages(data, opts.HugePages); err != nil {
		unix.Munmap(data)
		return fail("%w", err)
	}
	if opts.Populate {
		if err := populate(data, opts.Progress); err != nil {
			unix.Munmap(data)
			return fail("%w", err)
		}
	}
	final := unix.F_SEAL_SEAL
	if opts.SealWrites {
		final |= unix.F_SEAL_FUTURE_WRITE
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, final); err != nil {
		unix.Munmap(data)
		return fail("seal (seals %#x): %w", final, err)
	}
	return &Segment{name: name, size: size, fd: fd, data: data, writeSealed: opts.SealWrites}, nil
}

// Name is the name the memfd was created with.
func (s *Segment) Name() string { return s.name }

// Fd is the memfd, or -1 after Close. The Segment still owns it: send it (SendFd), never
// close it.
func (s *Segment) Fd() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fd
}

// Size is the segment's size in bytes.
func (s *Segment) Size() int64 { return s.size }

// WriteSealed reports whether the memfd carries F_SEAL_FUTURE_WRITE (SegmentOptions.SealWrites):
// only this Segment's own mapping can write it.
func (s *Segment) WriteSealed() bool { return s.writeSealed }

// Bytes is the read-write mapping, nil after Close. The slice must not be used after
// Close: the memory is unmapped and an access faults.
func (s *Segment) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data
}

// Close unmaps the segment and closes its fd. It is idempotent.
func (s *Segment) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.data != nil {
		if err := unix.Munmap(s.data); err != nil {
			errs = append(errs, fmt.Errorf("munmap segment %q: %w", s.name, err))
		}
		s.data = nil
	}
	if s.fd >= 0 {
		if err := unix.Close(s.fd); err != nil {
			errs = append(errs, fmt.Errorf("close segment %q: %w", s.name, err))
		}
		s.fd = -1
	}
	return errors.Join(errs...)
}

// Mapping is a client's mapping of a received memfd. It does not own the fd.
// The methods are safe for concurrent use; the bytes themselves are not guarded.
type Mapping struct {
	size     int64
	writable bool

	mu   sync.Mutex // protects data
	data []byte     // nil once closed
}

// MapFd maps size bytes of the memfd fd MAP_SHARED, read-only or read-write. It first
// checks with F_GET_SEALS that the file is sealed against shrinking and growing (and,
// for a writable mapping, not write-sealed: an isolated segment maps read-only) and
// with fstat that it is exactly size bytes long, so the mapping can never lose pages
// under its user. It does not take ownership of fd: the caller still closes it (the
// mapping stays valid after that).
func MapFd(fd int, size int64, writable bool) (*Mapping, error) {
	if err := checkSize(size, false); err != nil {
		return nil, fmt.Errorf("map fd %d: %w", fd, err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("map fd %d: not a sealable memfd (F_GET_SEALS: %w)", fd, err)
		}
		return nil, fmt.Errorf("map fd %d: F_GET_SEALS: %w", fd, err)
	}
	if seals&requiredSeals != requiredSeals {
		return nil, fmt.Errorf("map fd %d: memfd is not sealed against shrink and grow (seals %#x, want %#x set)", fd, seals, requiredSeals)
	}
	if writable && seals&unix.F_SEAL_FUTURE_WRITE != 0 {
		return nil, fmt.Errorf("map fd %d: memfd is write-sealed (F_SEAL_FUTURE_WRITE: the owner isolates its clients): map it read-only", fd)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("map fd %d: fstat: %w", fd, err)
	}
	if st.Size != size {
		return nil, fmt.Errorf("map fd %d: memfd is %d bytes, expected %d", fd, st.Size, size)
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	data, err := unix.Mmap(fd, 0, int(size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map fd %d: mmap %d bytes (writable=%t): %w", fd, size, writable, err)
	}
	return &Mapping{size: size, writable: writable, data: data}, nil
}

// Bytes is the mapped memory, nil after Close. Writing through a read-only mapping
// faults (SIGSEGV). The slice must not be used after Close.
func (m *Mapping) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.data
}

// Size is the mapping's size in bytes.
func (m *Mapping) Size() int64 { return m.size }

// Writable reports whether the mapping is PROT_WRITE.
func (m *Mapping) Writable() bool { return m.writable }

// Close unmaps the memory. It is idempotent and does not close the fd it was mapped from.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.data == nil {
		return nil
	}
	err := unix.Munmap(m.data)
	m.data = nil
	if err != nil {
		return fmt.Errorf("munmap mapping: %w", err)
	}
	return nil
}

// checkSize validates a segment size: positive, addressable, and (for creation) a
// multiple of the page size.
func checkSize(size int64, pageMultiple bool) error {
	if size <= 0 {
		return fmt.Errorf("size %d must be > 0", size)
	}
	if size > math.MaxInt {
		return fmt.Errorf("size %d does not fit in the address space", size)
	}
	if pageMultiple {
		if page := int64(os.Getpagesize()); size%page != 0 {
			return fmt.Errorf("size %d is not a multiple of the page size %d", size, page)
		}
	}
	return nil
}
