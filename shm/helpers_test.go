package shm

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	// Open the runtime's lazily created descriptors (the netpoller's epoll fd and its
	// wakeup fd) before any test snapshots /proc/self/fd.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "warm up netpoller:", err)
		os.Exit(1)
	}
	for _, fd := range fds {
		f := os.NewFile(uintptr(fd), "warmup")
		if c, err := net.FileConn(f); err == nil {
			c.Close()
		}
		f.Close()
	}
	os.Exit(m.Run())
}

// openFds lists the process's open descriptors, leaving out the one it reads the
// listing through.
func openFds(t testing.TB) []int {
	t.Helper()
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatalf("open /proc/self/fd: %v", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	var fds []int
	for _, name := range names {
		fd, err := strconv.Atoi(name)
		if err != nil || uintptr(fd) == d.Fd() {
			continue
		}
		fds = append(fds, fd)
	}
	return fds
}

// checkFds fails the test if it ends with descriptors open that were not open when it
// started. Call it first so its cleanup runs after every other cleanup.
func checkFds(t *testing.T) {
	t.Helper()
	before := openFds(t)
	t.Cleanup(func() {
		var leaked []string
		for _, fd := range openFds(t) {
			if !slices.Contains(before, fd) {
				target, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
				leaked = append(leaked, fmt.Sprintf("%d -> %s", fd, target))
			}
		}
		if len(leaked) > 0 {
			t.Errorf("leaked descriptors: %v", leaked)
		}
	})
}

// socketPair returns the two ends of a connected AF_UNIX stream socketpair, closed at
// the end of the test.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatalf("FileConn: %v", err)
		}
		conns[i] = c.(*net.UnixConn)
		t.Cleanup(func() { conns[i].Close() })
	}
	return conns[0], conns[1]
}

// newSegment creates a segment of n pages closed at the end of the test.
func newSegment(t *testing.T, pages int) *Segment {
	t.Helper()
	s, err := CreateSegment(t.Name(), int64(pages*os.Getpagesize()), SegmentOptions{})
	if err != nil {
		t.Fatalf("CreateSegment: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// closeFdT closes fd, failing the test on error.
func closeFdT(t *testing.T, fd int) {
	t.Helper()
	if err := unix.Close(fd); err != nil {
		t.Errorf("close fd %d: %v", fd, err)
	}
}
