package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"golang.org/x/sys/unix"
)

func frameBytes(size uint32, body string) []byte {
	b := binary.BigEndian.AppendUint32(nil, size)
	return append(b, body...)
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	bodies := [][]byte{{}, []byte("a"), bytes.Repeat([]byte("xyz"), 1000), bytes.Repeat([]byte{0xff}, MaxFrame)}
	for _, b := range bodies {
		if err := WriteFrame(&buf, b); err != nil {
			t.Fatalf("WriteFrame(%d bytes): %v", len(b), err)
		}
	}
	if got := buf.Len(); got != 4*len(bodies)+1+3000+MaxFrame {
		t.Fatalf("encoded %d bytes", got)
	}
	// One byte at a time exercises every short read.
	r := iotest.OneByteReader(&buf)
	for i, want := range bodies {
		got, err := ReadFrame(r, MaxFrame)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("frame %d: got %d bytes, want %d", i, len(got), len(want))
		}
	}
	if _, err := ReadFrame(r, MaxFrame); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestReadFrameErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input []byte
		max   int
		want  error
	}{
		{"empty input", nil, 0, io.EOF},
		{"short header", []byte{0, 0}, 0, io.ErrUnexpectedEOF},
		{"short body", frameBytes(5, "ab"), 0, io.ErrUnexpectedEOF},
		{"header only", frameBytes(1, ""), 0, io.ErrUnexpectedEOF},
		{"over max", frameBytes(11, "0123456789a"), 10, ErrFrameTooLarge},
		{"over default max", frameBytes(uint32(MaxFrame)+1, ""), 0, ErrFrameTooLarge},
		{"max uint32", frameBytes(^uint32(0), "garbage"), -1, ErrFrameTooLarge},
	} {
		body, err := ReadFrame(bytes.NewReader(tc.input), tc.max)
		if !errors.Is(err, tc.want) || body != nil {
			t.Errorf("%s: ReadFrame = %q, %v; want %v", tc.name, body, err, tc.want)
		}
		if tc.want != io.EOF && err == io.EOF {
			t.Errorf("%s: bare io.EOF for a truncated frame", tc.name)
		}
	}
	// Exactly max is fine.
	if body, err := ReadFrame(bytes.NewReader(frameBytes(10, "0123456789")), 10); err != nil || string(body) != "0123456789" {
		t.Errorf("frame of exactly max: %q, %v", body, err)
	}
	// Reader errors come through.
	boom := errors.New("boom")
	if _, err := ReadFrame(iotest.ErrReader(boom), 0); !errors.Is(err, boom) {
		t.Errorf("reader error: %v", err)
	}
	if _, err := ReadFrame(io.MultiReader(bytes.NewReader(frameBytes(4, "ab")), iotest.ErrReader(boom)), 0); !errors.Is(err, boom) {
		t.Errorf("reader error in the body: %v", err)
	}
}

type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) / 2, nil }

func TestWriteFrameErrors(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteFrame(&buf, make([]byte, MaxFrame+1)); !errors.Is(err, ErrFrameTooLarge) || buf.Len() != 0 {
		t.Errorf("oversize WriteFrame = %v (wrote %d bytes)", err, buf.Len())
	}
	if err := WriteFrame(shortWriter{}, []byte("body")); !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("short write = %v", err)
	}
	boom := errors.New("boom")
	if err := WriteFrame(errWriter{boom}, []byte("body")); !errors.Is(err, boom) {
		t.Errorf("writer error = %v", err)
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

// TestFramesWithFdInterleaved mixes fd-carrying and plain frames on one connection: each
// read takes exactly its frame and the fds arrive with the right frames.
func TestFramesWithFdInterleaved(t *testing.T) {
	checkFds(t)
	seg1 := newSegment(t, 1)
	copy(seg1.Bytes(), "one")
	seg2 := newSegment(t, 1)
	copy(seg2.Bytes(), "two")
	a, b := socketPair(t)

	if err := SendFrameWithFd(a, []byte("first"), seg1.Fd()); err != nil {
		t.Fatal(err)
	}
	if err := WriteFrame(a, []byte("plain")); err != nil {
		t.Fatal(err)
	}
	if err := SendFrameWithFd(a, nil, seg2.Fd()); err != nil {
		t.Fatal(err)
	}
	if err := WriteFrame(a, []byte("no fd here")); err != nil {
		t.Fatal(err)
	}

	body, fd, err := RecvFrameWithFd(b, 0)
	if err != nil || string(body) != "first" {
		t.Fatalf("frame 1: %q %v", body, err)
	}
	checkReceivedSegment(t, fd, seg1, "one")
	closeFdT(t, fd)

	if body, err := ReadFrame(b, 0); err != nil || string(body) != "plain" {
		t.Fatalf("frame 2: %q %v", body, err)
	}

	body, fd, err = RecvFrameWithFd(b, 0)
	if err != nil || len(body) != 0 {
		t.Fatalf("frame 3: %q %v", body, err)
	}
	checkReceivedSegment(t, fd, seg2, "two")
	closeFdT(t, fd)

	body, fd, err = RecvFrameWithFd(b, 0)
	if err != nil || fd != -1 || string(body) != "no fd here" {
		t.Fatalf("frame 4: %q %d %v, want a frame without fd", body, fd, err)
	}
	a.Close()
	if _, fd, err := RecvFrameWithFd(b, 0); err != io.EOF || fd != -1 {
		t.Fatalf("at end of stream: %d %v, want -1 io.EOF", fd, err)
	}
}

// TestRecvFrameWithFdShortFirstRead splits the length prefix: the fd comes with its
// first two bytes, the rest follows in a later write.
func TestRecvFrameWithFdShortFirstRead(t *testing.T) {
	checkFds(t)
	seg := newSegment(t, 1)
	copy(seg.Bytes(), "split")
	a, b := socketPair(t)
	frame := frameBytes(6, "body!!")
	if _, _, err := a.WriteMsgUnix(frame[:2], unix.UnixRights(seg.Fd()), nil); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := a.Write(frame[2:])
		errc <- err
	}()
	body, fd, err := RecvFrameWithFd(b, 0)
	if err != nil || string(body) != "body!!" {
		t.Fatalf("RecvFrameWithFd = %q %v", body, err)
	}
	checkReceivedSegment(t, fd, seg, "split")
	closeFdT(t, fd)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestRecvFrameWithFdErrorsCloseFd checks that every failure after the fd arrived
// closes it (checkFds would see it otherwise).
func TestRecvFrameWithFdErrorsCloseFd(t *testing.T) {
	checkFds(t)
	seg := newSegment(t, 1)
	for _, tc := range []struct {
		name  string
		frame []byte
		max   int
		want  error
	}{
		{"oversize", frameBytes(2<<20, "x"), 0, ErrFrameTooLarge},
		{"over caller max", frameBytes(17, "x"), 16, ErrFrameTooLarge},
		{"truncated body", frameBytes(100, "only a bit"), 0, io.ErrUnexpectedEOF},
		{"truncated header", []byte{0, 0, 1}, 0, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := socketPair(t)
			if _, _, err := a.WriteMsgUnix(tc.frame, unix.UnixRights(seg.Fd()), nil); err != nil {
				t.Fatal(err)
			}
			a.Close()
			body, fd, err := RecvFrameWithFd(b, tc.max)
			if !errors.Is(err, tc.want) || fd != -1 || body != nil {
				t.Fatalf("RecvFrameWithFd = %q %d %v, want %v", body, fd, err, tc.want)
			}
		})
	}
	a, _ := socketPair(t)
	if err := SendFrameWithFd(a, make([]byte, MaxFrame+1), seg.Fd()); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversize SendFrameWithFd = %v", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	f.Add(frameBytes(3, "abc"))
	f.Add(frameBytes(3, "abcdef"))
	f.Add(frameBytes(64, ""))
	f.Add(frameBytes(65, ""))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1, 2})
	f.Add([]byte{0, 1})
	const max = 64
	f.Fuzz(func(t *testing.T, data []byte) {
		body, err := ReadFrame(bytes.NewReader(data), max)
		if err != nil {
			if body != nil {
				t.Fatalf("error %v with a non-nil body", err)
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("unexpected error class: %v", err)
			}
			switch size := len(data); {
			case size == 0 && err != io.EOF:
				t.Fatalf("empty input: %v, want io.EOF", err)
			case size > 0 && err == io.EOF:
				t.Fatalf("bare io.EOF for a %d-byte truncated frame", size)
			}
			return
		}
		if len(body) > max {
			t.Fatalf("body of %d bytes exceeds max %d", len(body), max)
		}
		if int(binary.BigEndian.Uint32(data)) != len(body) || !bytes.Equal(body, data[4:4+len(body)]) {
			t.Fatalf("body %q does not match input %q", body, data)
		}
		var buf bytes.Buffer
		if err := WriteFrame(&buf, body); err != nil || !bytes.Equal(buf.Bytes(), data[:4+len(body)]) {
			t.Fatalf("re-encoding differs: %q %v", buf.Bytes(), err)
		}
	})
}

// TestFrameWithTwoFds sends the isolated attach reply's shape: one frame carrying the
// segment and a put area. RecvFrameWithFds returns both in order; RecvFrameWithFd keeps
// the first and closes the second.
func TestFrameWithTwoFds(t *testing.T) {
	checkFds(t)
	seg := newSegment(t, 1)
	copy(seg.Bytes(), "segment")
	area, err := CreatePutArea("area", page)
	if err != nil {
		t.Fatal(err)
	}
	defer area.Close()
	copy(area.Bytes(), "area")
	a, b := socketPair(t)
	if err := SendFrameWithFds(a, []byte("two"), seg.Fd(), area.Fd()); err != nil {
		t.Fatal(err)
	}
	body, fds, err := RecvFrameWithFds(b, 0)
	if err != nil || string(body) != "two" || len(fds) != 2 {
		t.Fatalf("RecvFrameWithFds = %q %v %v, want two fds", body, fds, err)
	}
	checkReceivedSegment(t, fds[0], seg, "segment")
	checkReceivedSegment(t, fds[1], area, "area")
	closeFdT(t, fds[0])
	closeFdT(t, fds[1])

	if err := SendFrameWithFds(a, []byte("again"), seg.Fd(), area.Fd()); err != nil {
		t.Fatal(err)
	}
	body, fd, err := RecvFrameWithFd(b, 0)
	if err != nil || string(body) != "again" {
		t.Fatalf("RecvFrameWithFd = %q %v", body, err)
	}
	checkReceivedSegment(t, fd, seg, "segment")
	closeFdT(t, fd)
	if err := SendFrameWithFds(a, []byte("none")); err == nil {
		t.Error("SendFrameWithFds without fds succeeded")
	}
}
