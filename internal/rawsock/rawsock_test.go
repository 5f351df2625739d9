package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// networks are the sockets the package serves: the owner's Unix socket and the cluster's
// TCP connections.
var networks = []string{"unix", "tcp"}

// pair is a connected pair of sockets of network: a (wrapped by New) and b (a plain
// net.Conn).
func pair(t *testing.T, network string) (net.Conn, *Conn, net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(t.TempDir(), "s")
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		got <- c
	}()
	a, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-got
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	raw, ok := New(a).(*Conn)
	if !ok {
		t.Fatalf("New of a Unix socket: %T, want *Conn", New(a))
	}
	return a, raw, b
}

func TestReadWrite(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw, func(t *testing.T) { testReadWrite(t, nw) })
	}
}

func testReadWrite(t *testing.T, nw string) {
	_, raw, b := pair(t, nw)
	if _, err := raw.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("peer read %q, %v", buf, err)
	}
	go b.Write([]byte("world"))
	if _, err := io.ReadFull(raw, buf); err != nil || string(buf) != "world" {
		t.Fatalf("raw read %q, %v", buf, err)
	}
	if n, err := raw.Read(nil); n != 0 || err != nil {
		t.Fatalf("empty read: %d, %v", n, err)
	}
	b.Close()
	if n, err := raw.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("read after the peer closed: %d, %v; want io.EOF", n, err)
	}
}

// A write larger than the socket buffer and than MaxIO waits for room and arrives whole.
func TestLargeWriteWaitsForRoom(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw, func(t *testing.T) { testLargeWrite(t, nw) })
	}
}

func testLargeWrite(t *testing.T, nw string) {
	_, raw, b := pair(t, nw)
	want := make([]byte, 12*MaxIO+12345)
	for i := range want {
		want[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // the writer fills the buffer and waits first
		buf := make([]byte, len(want))
		io.ReadFull(b, buf)
		got <- buf
	}()
	n, err := raw.Write(want)
	if err != nil || n != len(want) {
		t.Fatalf("write: %d of %d, %v", n, len(want), err)
	}
	if !bytes.Equal(<-got, want) {
		t.Fatal("the peer read other bytes")
	}
}

func TestDeadlines(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw, func(t *testing.T) { testDeadlines(t, nw) })
	}
}

func testDeadlines(t *testing.T, nw string) {
	a, raw, _ := pair(t, nw)
	a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := raw.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}
	// Nobody reads b: the write fills the buffers, then times out having written part.
	big := make([]byte, 64<<20) // (made before the deadline starts: it takes a while)
	a.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := raw.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 || n >= 64<<20 {
		t.Fatalf("write past its deadline: %d bytes, %v", n, err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a deadline's error is not a net.Error timeout: %#v", err)
	}
}

func TestErrors(t *testing.T) {
	for _, nw := range networks {
		t.Run(nw, func(t *testing.T) { testErrors(t, nw) })
	}
}

func testErrors(t *testing.T, nw string) {
	a, raw, b := pair(t, nw)
	b.Close()
	var err error
	for range 100 { // the first write after the peer's close may still succeed
		if _, err = raw.Write([]byte("x")); err != nil {
			break
		}
	}
	var oe *net.OpError
	broken := errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) // (TCP: reset by the peer's close)
	if !broken || !errors.As(err, &oe) || oe.Op != "write" {
		t.Fatalf("write to a closed peer: %v; want an OpError of EPIPE or ECONNRESET", err)
	}
	a.Close()
	if _, err := raw.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read of a closed conn: %v; want net.ErrClosed", err)
	}
	if _, err := raw.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write to a closed conn: %v; want net.ErrClosed", err)
	}
}

// A read waiting for data returns as soon as another goroutine writes it, and a Close
// ends a read that waits.
func TestWaitingRead(t *testing.T) {
	a, raw, b := pair(t, "unix")
	go func() {
		time.Sleep(20 * time.Millisecond)
		b.Write([]byte("late"))
	}()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(raw, buf); err != nil || string(buf) != "late" {
		t.Fatalf("read %q, %v", buf, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := raw.Read(buf)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a read of a socket with nothing to read returned: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("waiting read ended by Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end a waiting read")
	}
}

func TestNewOfAConnWithoutAFileDescriptor(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if rw := New(a); rw != a {
		t.Fatalf("New(net.Pipe) = %T, want the conn itself", rw)
	}
}

// What a goroutine wrote before it sent on a socket is seen by the goroutine that read
// what it sent: the race detector must see that order (sys_race.go), as with a
// net.Conn, or every test whose handler records something and then replies reports a
// race. This test fails under -race without it.
func TestSocketOrdersMemoryForTheRaceDetector(t *testing.T) {
	a, raw, b := pair(t, "unix")
	var x int
	go func() {
		buf := make([]byte, 1)
		io.ReadFull(b, buf)
		x = 1
		b.Write(buf)
	}()
	if _, err := raw.Write([]byte{7}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(raw, buf); err != nil {
		t.Fatal(err)
	}
	if x != 1 {
		t.Fatalf("x = %d after the reply", x)
	}
	_ = a
}

// A read asks for at most MaxIO bytes of the kernel: a larger buffer gets that much even
// when more is there.
func TestReadCappedAtMaxIO(t *testing.T) {
	_, raw, b := pair(t, "tcp")
	want := make([]byte, 2*MaxIO)
	go b.Write(want)
	buf := make([]byte, len(want))
	got := 0
	for got < len(want) {
		n, err := raw.Read(buf[got:])
		if err != nil {
			t.Fatal(err)
		}
		if n > MaxIO {
			t.Fatalf("one read returned %d bytes, over MaxIO (%d)", n, MaxIO)
		}
		got += n
	}
}
