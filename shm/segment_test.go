package shm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

var page = int64(os.Getpagesize())

func TestCreateSegmentRejectsBadArguments(t *testing.T) {
	checkFds(t)
	for _, tc := range []struct {
		name string
		size int64
		want string
	}{
		{"zero", 0, "must be > 0"},
		{"negative", -page, "must be > 0"},
		{"sub-page", 100, "multiple of the page size"},
		{"page-plus-one", page + 1, "multiple of the page size"},
		{strings.Repeat("n", 250), page, "at most 249"},
		{"nul\x00byte", page, "memfd_create"},
	} {
		s, err := CreateSegment(tc.name, tc.size, SegmentOptions{})
		if err == nil {
			s.Close()
			t.Errorf("CreateSegment(%.20q, %d) succeeded, want error containing %q", tc.name, tc.size, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CreateSegment(%.20q, %d) = %v, want error containing %q", tc.name, tc.size, err, tc.want)
		}
	}
}

func TestSegmentSharedMappings(t *testing.T) {
	checkFds(t)
	s := newSegment(t, 4)
	if got, want := s.Size(), 4*page; got != want {
		t.Fatalf("Size = %d, want %d", got, want)
	}
	if len(s.Bytes()) != int(s.Size()) {
		t.Fatalf("len(Bytes) = %d, want %d", len(s.Bytes()), s.Size())
	}
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", s.Fd()))
	if err != nil || !strings.HasPrefix(target, "/memfd:"+t.Name()) {
		t.Errorf("fd link = %q, %v; want /memfd:%s...", target, err, t.Name())
	}
	flags, err := unix.FcntlInt(uintptr(s.Fd()), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("segment fd flags = %#x, %v; want FD_CLOEXEC", flags, err)
	}

	copy(s.Bytes()[page-3:], "across a page boundary")

	ro, err := MapFd(s.Fd(), s.Size(), false)
	if err != nil {
		t.Fatalf("MapFd read-only: %v", err)
	}
	defer ro.Close()
	if ro.Writable() || ro.Size() != s.Size() {
		t.Errorf("read-only mapping: Writable=%t Size=%d", ro.Writable(), ro.Size())
	}
	if got := string(ro.Bytes()[page-3 : page-3+22]); got != "across a page boundary" {
		t.Fatalf("read-only mapping sees %q", got)
	}
	if &ro.Bytes()[0] == &s.Bytes()[0] {
		t.Fatal("read-only mapping is the segment's own mapping, want a second mapping")
	}

	rw, err := MapFd(s.Fd(), s.Size(), true)
	if err != nil {
		t.Fatalf("MapFd read-write: %v", err)
	}
	copy(rw.Bytes()[3*page:], "written by the client")
	if got := string(s.Bytes()[3*page : 3*page+21]); got != "written by the client" {
		t.Fatalf("segment sees %q after a write through the client mapping", got)
	}
	if got := string(ro.Bytes()[3*page : 3*page+21]); got != "written by the client" {
		t.Fatalf("read-only mapping sees %q after a write through the client mapping", got)
	}
	if err := rw.Close(); err != nil {
		t.Fatalf("Mapping.Close: %v", err)
	}
	if err := rw.Close(); err != nil {
		t.Fatalf("second Mapping.Close: %v", err)
	}
	if rw.Bytes() != nil {
		t.Error("Bytes after Close is not nil")
	}
	// Mapping.Close leaves the fd alone.
	if _, err := unix.FcntlInt(uintptr(s.Fd()), unix.F_GETFD, 0); err != nil {
		t.Fatalf("segment fd after Mapping.Close: %v", err)
	}

	// The memory outlives the segment's own fd and mapping while a mapping remains.
	fd := s.Fd()
	if err := s.Close(); err != nil {
		t.Fatalf("Segment.Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Segment.Close: %v", err)
	}
	if s.Fd() != -1 || s.Bytes() != nil {
		t.Errorf("after Close: Fd=%d, Bytes nil=%t", s.Fd(), s.Bytes() == nil)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("segment fd after Close: F_GETFD err = %v, want EBADF", err)
	}
	if got := string(ro.Bytes()[3*page : 3*page+21]); got != "written by the client" {
		t.Fatalf("read-only mapping after Segment.Close sees %q", got)
	}
}

func TestSegmentSeals(t *testing.T) {
	checkFds(t)
	s := newSegment(t, 2)
	seals, err := unix.FcntlInt(uintptr(s.Fd()), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatalf("F_GET_SEALS: %v", err)
	}
	want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if seals != want {
		t.Errorf("seals = %#x, want %#x", seals, want)
	}
	for _, size := range []int64{page, 0, 3 * page} {
		if err := unix.Ftruncate(s.Fd(), size); !errors.Is(err, unix.EPERM) {
			t.Errorf("ftruncate(%d) on a sealed segment: %v, want EPERM", size, err)
		}
	}
	// Growing through a write past the end is refused too.
	if _, err := unix.Pwrite(s.Fd(), []byte("x"), s.Size()); !errors.Is(err, unix.EPERM) {
		t.Errorf("pwrite past the end: %v, want EPERM", err)
	}
	// F_SEAL_SEAL comes last: nobody (a client included) can add seals afterwards, e.g.
	// to freeze writes of a segment that was created without SealWrites.
	if _, err := unix.FcntlInt(uintptr(s.Fd()), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE); !errors.Is(err, unix.EPERM) {
		t.Errorf("adding F_SEAL_FUTURE_WRITE: %v, want EPERM", err)
	}
	if s.WriteSealed() {
		t.Error("WriteSealed = true for a segment created without SealWrites")
	}
	var st unix.Stat_t
	if err := unix.Fstat(s.Fd(), &st); err != nil || st.Size != 2*page {
		t.Errorf("size after refused truncates = %d, %v; want %d", st.Size, err, 2*page)
	}
}

// memfd creates a bare memfd of size bytes (closed at the end of the test) and adds seals.
func memfd(t *testing.T, flags int, size int64, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("bare", flags|unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatalf("memfd_create: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatalf("ftruncate: %v", err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatalf("F_ADD_SEALS: %v", err)
		}
	}
	return fd
}

func TestMapFdRejects(t *testing.T) {
	checkFds(t)
	s := newSegment(t, 2)
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		t.Fatalf("pipe: %v", err)
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])

	for _, tc := range []struct {
		name     string
		fd       int
		size     int64
		writable bool
		want     string
	}{
		{"unsealed memfd", memfd(t, unix.MFD_ALLOW_SEALING, page, 0), page, false, "not sealed"},
		{"memfd without sealing", memfd(t, 0, page, 0), page, false, "not sealed"},
		{"shrink seal only", memfd(t, unix.MFD_ALLOW_SEALING, page, unix.F_SEAL_SHRINK), page, false, "not sealed"},
		{"grow seal only", memfd(t, unix.MFD_ALLOW_SEALING, page, unix.F_SEAL_GROW), page, false, "not sealed"},
		{"smaller than the file", s.Fd(), page, false, "expected"},
		{"larger than the file", s.Fd(), 3 * page, false, "expected"},
		{"zero size", s.Fd(), 0, false, "must be > 0"},
		{"pipe", pipe[0], page, false, "not a sealable memfd"},
		{"closed fd", 1 << 20, page, false, "bad file descriptor"},
		{"writable but write-sealed", memfd(t, unix.MFD_ALLOW_SEALING, page,
			unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_FUTURE_WRITE), page, true, "write-sealed"},
	} {
		m, err := MapFd(tc.fd, tc.size, tc.writable)
		if err == nil {
			m.Close()
			t.Errorf("%s: MapFd succeeded", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: MapFd = %v, want error containing %q", tc.name, err, tc.want)
		}
	}

	// Sealed against shrink and grow but with a non-page-multiple size: accepted.
	fd := memfd(t, unix.MFD_ALLOW_SEALING, 100, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	m, err := MapFd(fd, 100, true)
	if err != nil {
		t.Fatalf("MapFd of a sealed 100-byte memfd: %v", err)
	}
	if len(m.Bytes()) != 100 {
		t.Errorf("len = %d, want 100", len(m.Bytes()))
	}
	m.Close()
}

const faultChildEnv = "FLUXKV_SHM_TEST_FAULT_CHILD"

// TestReadOnlyMappingFaults proves a write through a read-only mapping faults. The
// write runs in a child (this test binary re-executed) with SIGSEGV's default action
// restored, so the kernel's SIGSEGV kills it and the parent sees the signal.
func TestReadOnlyMappingFaults(t *testing.T) {
	if os.Getenv(faultChildEnv) == "1" {
		faultChild()
		return
	}
	checkFds(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestReadOnlyMappingFaults$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), faultChildEnv+"=1")
	cmd.Dir = t.TempDir() // a core dump, if any, lands there
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: err = %v, want death by SIGSEGV; output:\n%s", err, out)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSEGV {
		t.Fatalf("child: %v, want death by SIGSEGV; output:\n%s", ee, out)
	}
	if !bytes.Contains(out, []byte("read-only mapping verified; writing")) || bytes.Contains(out, []byte("survived")) {
		t.Fatalf("child died before or after the write, not at it; output:\n%s", out)
	}
}

func faultChild() {
	fail := func(format string, args ...any) {
		fmt.Printf(format+"\n", args...)
		os.Exit(3)
	}
	s, err := CreateSegment("fault", page, SegmentOptions{})
	if err != nil {
		fail("CreateSegment: %v", err)
	}
	s.Bytes()[0] = 42
	ro, err := MapFd(s.Fd(), s.Size(), false)
	if err != nil {
		fail("MapFd: %v", err)
	}
	if ro.Bytes()[0] != 42 {
		fail("read-only mapping reads %d, want 42", ro.Bytes()[0])
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		fail("setrlimit: %v", err)
	}
	// The Go runtime turns a fault into a panic or a throw (exit status 2); restore
	// the default action so the kernel's signal ends the process visibly. A zeroed
	// struct sigaction is SIG_DFL with no flags and an empty mask on every ABI.
	var act [4]uintptr
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGSEGV),
		uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); errno != 0 {
		fail("rt_sigaction: %v", errno)
	}
	fmt.Println("read-only mapping verified; writing")
	ro.Bytes()[0] = 1
	fmt.Println("survived the write")
	os.Exit(0)
}
