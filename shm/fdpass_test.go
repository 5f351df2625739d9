package shm

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// checkReceivedSegment checks that fd is a close-on-exec duplicate of seg's memfd by mapping it
// read-only and comparing a marker.
func checkReceivedSegment(t *testing.T, fd int, seg *Segment, marker string) {
	t.Helper()
	if fd < 0 {
		t.Fatal("no fd received")
	}
	if fd == seg.Fd() {
		t.Fatalf("received fd %d is the sender's own fd", fd)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("received fd flags = %#x, %v; want FD_CLOEXEC", flags, err)
	}
	m, err := MapFd(fd, seg.Size(), false)
	if err != nil {
		t.Fatalf("MapFd of the received fd: %v", err)
	}
	defer m.Close()
	if got := string(m.Bytes()[:len(marker)]); got != marker {
		t.Fatalf("received segment holds %q, want %q", got, marker)
	}
}

func TestSendRecvFdSocketpair(t *testing.T) {
	checkFds(t)
	seg := newSegment(t, 1)
	copy(seg.Bytes(), "segment marker")
	a, b := socketPair(t)

	if err := SendFd(a, []byte("hello"), seg.Fd()); err != nil {
		t.Fatalf("SendFd: %v", err)
	}
	buf := make([]byte, 64)
	n, fd, err := RecvFd(b, buf)
	if err != nil {
		t.Fatalf("RecvFd: %v", err)
	}
	defer closeFdT(t, fd)
	if string(buf[:n]) != "hello" {
		t.Fatalf("payload = %q, want hello", buf[:n])
	}
	checkReceivedSegment(t, fd, seg, "segment marker")
}

func TestRecvFdWithoutFd(t *testing.T) {
	checkFds(t)
	a, b := socketPair(t)
	if _, err := a.Write([]byte("plain")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, fd, err := RecvFd(b, buf)
	if err != nil || fd != -1 || string(buf[:n]) != "plain" {
		t.Fatalf("RecvFd = %d %d %v (%q), want 5 -1 nil (plain)", n, fd, err, buf[:n])
	}
	a.Close()
	n, fd, err = RecvFd(b, buf)
	if err != io.EOF || n != 0 || fd != -1 {
		t.Fatalf("RecvFd at end of stream = %d %d %v, want 0 -1 EOF", n, fd, err)
	}
	if _, _, err := RecvFd(b, nil); err == nil {
		t.Error("RecvFd with an empty buffer succeeded")
	}
}

// pipes returns k pipe read ends, closed at the end of the test (write ends are closed at once).
func pipes(t *testing.T, k int) []int {
	t.Helper()
	var fds []int
	for range k {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[1])
		fds = append(fds, p[0])
		t.Cleanup(func() { unix.Close(p[0]) })
	}
	return fds
}

func TestRecvFdClosesExtraFds(t *testing.T) {
	checkFds(t)
	seg := newSegment(t, 1)
	copy(seg.Bytes(), "first")
	a, b := socketPair(t)
	extra := pipes(t, 3)
	if _, _, err := a.WriteMsgUnix([]byte("x"), unix.UnixRights(append([]int{seg.Fd()}, extra...)...), nil); err != nil {
		t.Fatal(err)
	}
	before := len(openFds(t))
	buf := make([]byte, 8)
	n, fd, err := RecvFd(b, buf)
	if err != nil || n != 1 {
		t.Fatalf("RecvFd = %d %d %v", n, fd, err)
	}
	if got := len(openFds(t)); got != before+1 {
		t.Errorf("open fds went from %d to %d, want exactly one more (the kept fd)", before, got)
	}
	checkReceivedSegment(t, fd, seg, "first")
	closeFdT(t, fd)
}

func TestRecvFdTooManyFds(t *testing.T) {
	checkFds(t)
	a, b := socketPair(t)
	fds := pipes(t, maxRecvFds+4)
	if _, _, err := a.WriteMsgUnix([]byte("flood"), unix.UnixRights(fds...), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("next")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	n, fd, err := RecvFd(b, buf)
	if !errors.Is(err, ErrControlTruncated) || fd != -1 || n != 5 {
		t.Fatalf("RecvFd = %d %d %v, want 5 -1 ErrControlTruncated", n, fd, err)
	}
	// The stream stays aligned after the error.
	n, fd, err = RecvFd(b, buf)
	if err != nil || fd != -1 || string(buf[:n]) != "next" {
		t.Fatalf("RecvFd after truncation = %d %d %v (%q)", n, fd, err, buf[:n])
	}
}

func TestSendFdRejects(t *testing.T) {
	checkFds(t)
	seg := newSegment(t, 1)
	a, _ := socketPair(t)
	if err := SendFd(a, nil, seg.Fd()); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("SendFd with an empty payload = %v", err)
	}
	if err := SendFd(a, []byte("x"), -1); err == nil {
		t.Error("SendFd with fd -1 succeeded")
	}
	if err := SendFd(a, []byte("x"), 1<<20); err == nil || !errors.Is(err, unix.EBADF) {
		t.Errorf("SendFd with a closed fd = %v, want EBADF", err)
	}
}

// TestSendFdLargePayload sends more than the socket buffer holds, so the sendmsg is
// partial and SendFd finishes with plain writes.
func TestSendFdLargePayload(t *testing.T) {
	checkFds(t)
	seg := newSegment(t, 1)
	copy(seg.Bytes(), "large")
	a, b := socketPair(t)
	payload := make([]byte, 4<<20)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	errc := make(chan error, 1)
	go func() { errc <- SendFd(a, payload, seg.Fd()) }()

	got := make([]byte, len(payload))
	n, fd, err := RecvFd(b, got)
	if err != nil {
		t.Fatalf("RecvFd: %v", err)
	}
	defer closeFdT(t, fd)
	if n >= len(payload) {
		t.Logf("first read took the whole payload (%d bytes): no partial send happened", n)
	}
	if _, err := io.ReadFull(b, got[n:]); err != nil {
		t.Fatalf("reading the rest: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("SendFd: %v", err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatal("payload corrupted")
	}
	checkReceivedSegment(t, fd, seg, "large")
}

func TestRecvFdDeadline(t *testing.T) {
	checkFds(t)
	_, b := socketPair(t)
	b.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	_, fd, err := RecvFd(b, make([]byte, 8))
	if !errors.Is(err, os.ErrDeadlineExceeded) || fd != -1 {
		t.Fatalf("RecvFd past its deadline = %d %v, want -1 and ErrDeadlineExceeded", fd, err)
	}
}

// TestAttachOverListener runs the attach exchange over a real listening socket: the
// server checks the caller with PeerCred and sends the segment in a frame.
func TestAttachOverListener(t *testing.T) {
	checkFds(t)
	seg := newSegment(t, 2)
	copy(seg.Bytes(), "attached")
	path := filepath.Join(t.TempDir(), "fluxkv.sock")
	l, err := ListenUnix(path, 0)
	if err != nil {
		t.Fatalf("ListenUnix: %v", err)
	}
	defer l.Close()

	type result struct {
		cred Cred
		err  error
	}
	done := make(chan result, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		hello, err := ReadFrame(c, 0)
		if err != nil {
			done <- result{err: err}
			return
		}
		cred, err := PeerCred(c)
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{cred: cred, err: SendFrameWithFd(c, append([]byte("welcome "), hello...), seg.Fd())}
	}()

	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	if err := WriteFrame(c, []byte("client-1")); err != nil {
		t.Fatal(err)
	}
	body, fd, err := RecvFrameWithFd(c, 0)
	if err != nil {
		t.Fatalf("RecvFrameWithFd: %v", err)
	}
	defer closeFdT(t, fd)
	if string(body) != "welcome client-1" {
		t.Fatalf("body = %q", body)
	}
	checkReceivedSegment(t, fd, seg, "attached")

	r := <-done
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	want := ownCred(t)
	if !reflect.DeepEqual(r.cred, want) {
		t.Errorf("server's PeerCred = %+v, want %+v", r.cred, want)
	}
	cc, err := PeerCred(c)
	if err != nil || !reflect.DeepEqual(cc, want) {
		t.Errorf("client's PeerCred = %+v, %v; want %+v", cc, err, want)
	}
}

func TestPeerCredSocketpair(t *testing.T) {
	checkFds(t)
	a, _ := socketPair(t)
	cred, err := PeerCred(a)
	if err != nil {
		t.Fatal(err)
	}
	if cred.Pid != int32(os.Getpid()) || cred.Uid != uint32(os.Getuid()) || cred.Gid != uint32(os.Getgid()) {
		t.Errorf("PeerCred = %+v, want pid %d uid %d gid %d", cred, os.Getpid(), os.Getuid(), os.Getgid())
	}
}

// ownCred is this process's identity as SO_PEERCRED and SO_PEERGROUPS report it.
func ownCred(t *testing.T) Cred {
	t.Helper()
	gs, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	c := Cred{Pid: int32(os.Getpid()), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), Groups: []uint32{}}
	for _, g := range gs {
		c.Groups = append(c.Groups, uint32(g))
	}
	return c
}
