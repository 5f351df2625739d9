package ssd

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Op is the kind of an IO.
type Op uint8

const (
	OpRead Op = iota
	OpWrite
)

func (o Op) String() string {
	if o == OpWrite {
		return "write"
	}
	return "read"
}

// File is a shard file as the engines see it: a descriptor to submit IO on, plus a
// hook that lets fault-injecting files shape an IO before it is submitted. Real
// files (OpenOSFile) let every IO through unchanged; Faults.OpenFile wraps them to
// fail IOs or make them short.
type File interface {
	// Fd is the descriptor engines read and write.
	Fd() int
	// Name is the path, for errors and logs.
	Name() string
	// Shape is called by an engine right before it submits an IO of buf at off. It
	// returns the buffer to submit (a prefix of buf makes a real short IO) or an
	// error that completes the IO without submitting it.
	Shape(op Op, buf []byte, off int64) ([]byte, error)
	// Truncate sets the file size.
	Truncate(size int64) error
	Close() error
}

// osFile is the real File.
type osFile struct{ f *os.File }

// OpenOSFile opens a real file; it is the default Options.OpenFile.
func OpenOSFile(path string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(path, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (f osFile) Fd() int                                         { return int(f.f.Fd()) }
func (f osFile) Name() string                                    { return f.f.Name() }
func (f osFile) Shape(_ Op, buf []byte, _ int64) ([]byte, error) { return buf, nil }
func (f osFile) Truncate(size int64) error                       { return f.f.Truncate(size) }
func (f osFile) Close() error                                    { return f.f.Close() }

// Faults injects IO faults into the shard files it opens: Options.OpenFile =
// faults.OpenFile. Rules apply to every file opened through it, first matching rule
// first; a rule with times > 0 expires after that many IOs, times < 0 never does.
// It is safe for concurrent use.
type Faults struct {
	mu    sync.Mutex // protects rules, hits
	rules []*faultRule
	hits  int
}

type faultRule struct {
	op    Op
	err   error // nil: short IO
	times int
}

// Fail makes the next times IOs of kind op fail with err (for example
// unix.EIO or unix.ENOSPC) without touching the disk; times < 0 means all of them.
func (f *Faults) Fail(op Op, err error, times int) {
	if err == nil {
		panic("BUG: Faults.Fail with a nil error")
	}
	f.add(&faultRule{op: op, err: err, times: times})
}

// Short makes the next times IOs of kind op real but short: they transfer only the
// first half of their bytes, rounded down to a multiple of 512 (possibly zero);
// times < 0 means all of them.
func (f *Faults) Short(op Op, times int) { f.add(&faultRule{op: op, times: times}) }

// Clear drops every rule.
func (f *Faults) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

// Hits is the number of IOs a rule changed so far.
func (f *Faults) Hits() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits
}

func (f *Faults) add(r *faultRule) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = append(f.rules, r)
}

// OpenFile opens a real file whose IOs go through the rules; it fits Options.OpenFile.
func (f *Faults) OpenFile(path string, flag int, perm os.FileMode) (File, error) {
	real, err := OpenOSFile(path, flag, perm)
	if err != nil {
		return nil, err
	}
	return faultyFile{File: real, faults: f}, nil
}

type faultyFile struct {
	File
	faults *Faults
}

func (f faultyFile) Shape(op Op, buf []byte, off int64) ([]byte, error) {
	buf, err := f.File.Shape(op, buf, off)
	if err != nil {
		return nil, err
	}
	ff := f.faults
	ff.mu.Lock()
	defer ff.mu.Unlock()
	for i, r := range ff.rules {
		if r.op != op {
			continue
		}
		if r.times > 0 {
			r.times--
			if r.times == 0 {
				ff.rules = append(ff.rules[:i:i], ff.rules[i+1:]...)
			}
		}
		ff.hits++
		if r.err != nil {
			return nil, &os.PathError{Op: "injected " + op.String(), Path: f.Name(), Err: r.err}
		}
		return buf[:alignDown(int64(len(buf))/2)], nil
	}
	return buf, nil
}

// probePread reads for ProbeDirectIO (tests stand in for a device of 4 KiB sectors).
var probePread = unix.Pread

// ProbeDirectIO checks that dir accepts O_DIRECT IO of 512-aligned 4 KiB blocks: it
// writes, reads back and removes a small file. tmpfs, for one, refuses O_DIRECT. It
// also reads 512 bytes at offset 512, as a record's header is read: a device of 4 KiB
// logical sectors refuses that (EINVAL), and on kernels before 6.1, which do not report
// direct IO's alignment (directIOAlign), only this read finds it: the tier opened and
// then failed every read (a review).
func ProbeDirectIO(dir string) error {
	f, err := os.CreateTemp(dir, ".fluxkv-odirect-probe-*")
	if err != nil {
		return fmt.Errorf("probe O_DIRECT in %s: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	fd, err := unix.Open(name, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s does not support O_DIRECT: %w", dir, err)
	}
	defer unix.Close(fd)
	buf := alignedAlloc(4096)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	if n, err := unix.Pwrite(fd, buf, 0); err != nil || n != len(buf) {
		return fmt.Errorf("%s: O_DIRECT write failed (n=%d): %w", dir, n, cmp.Or(err, io.ErrShortWrite))
	}
	got := alignedAlloc(4096)
	if n, err := probePread(fd, got, 0); err != nil || n != len(got) {
		return fmt.Errorf("%s: O_DIRECT read failed (n=%d): %w", dir, n, cmp.Or(err, io.ErrUnexpectedEOF))
	}
	if string(got) != string(buf) {
		return errors.New(dir + ": O_DIRECT read back different bytes")
	}
	part := got[:Align]
	n, err := probePread(fd, part, Align)
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%s: the device refuses O_DIRECT IO of %d-byte granules (4 KiB logical sectors?): fluxkv aligns records to %d bytes: %w", dir, Align, Align, err)
	}
	if err != nil || n != len(part) {
		return fmt.Errorf("%s: O_DIRECT read of %d bytes at %d failed (n=%d): %w", dir, Align, Align, n, cmp.Or(err, io.ErrUnexpectedEOF))
	}
	if string(part) != string(buf[Align:2*Align]) {
		return errors.New(dir + ": O_DIRECT read back different bytes")
	}
	return nil
}

// deviceOf is the st_dev of path: the identity used to de-duplicate roots.
func deviceOf(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Dev, nil
}

// directIOAlign is the file offset alignment O_DIRECT needs for the regular file at
// path, or 0 when the kernel does not say (statx STATX_DIOALIGN, Linux 6.1+).
func directIOAlign(path string) uint32 {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_DIOALIGN, &st); err != nil {
		return 0
	}
	if st.Mask&unix.STATX_DIOALIGN == 0 {
		return 0
	}
	return st.Dio_offset_align
}

// safeName turns an instance key into one safe path element: letters, digits, '.',
// '-' and '_' stay, every other byte becomes '_'. A key that had to change (or is
// too long) gets a hash of the original appended, so distinct keys stay distinct.
func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_'
		if !ok {
			b[i] = '_'
		}
	}
	out := string(b)
	if out == s && len(out) <= 128 && out != "." && out != ".." && out != "" {
		return out
	}
	if len(out) > 128 {
		out = out[:128]
	}
	h := fnv.New64a()
	h.Write([]byte(s))
	return fmt.Sprintf("%s-%016x", out, h.Sum64())
}

// memAlign is the address alignment of buffers this package allocates: a page, which
// satisfies every O_DIRECT memory alignment in practice.
const memAlign = 4096

// alignedAlloc returns a zeroed slice of n bytes whose first byte is memAlign-aligned.
func alignedAlloc(n int) []byte {
	b := make([]byte, n+memAlign)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) % memAlign); r != 0 {
		off = memAlign - r
	}
	return b[off : off+n : off+n]
}

// AllocAligned returns a zeroed buffer of n bytes whose address is 4 KiB-aligned and
// whose capacity is AlignedLen(n): loads into it take the direct path (no scratch
// copy).
func AllocAligned(n int64) []byte {
	return alignedAlloc(int(alignUp(n)))[:n]
}

func isAligned(b []byte) bool {
	return cap(b) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%Align == 0
}
