package wire

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"
)

// TestReadFrameBodyGrowsAsBytesArrive: a body announced large but not sent is never
// allocated up front, and a buffer passed back is reused.
func TestReadFrameBodyGrowsAsBytesArrive(t *testing.T) {
	const announced = 32 << 20
	r := bytes.NewReader(bytes.Repeat([]byte{7}, 1000)) // then the stream ends
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	body, err := ReadFrameBody(r, nil, announced)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) || body != nil {
		t.Fatalf("short body: %v, %d bytes", err, len(body))
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4*growStep {
		t.Fatalf("allocated %d bytes for 1000 received of %d announced", got, announced)
	}
	// Whole bodies of several sizes, read one byte at a time, into a reused buffer.
	var buf []byte
	for _, n := range []int{0, 1, growStep - 1, growStep, growStep + 1, 5*growStep + 3, 10} {
		want := make([]byte, n)
		for i := range want {
			want[i] = byte(i * 31)
		}
		got, err := ReadFrameBody(iotest.OneByteReader(bytes.NewReader(want)), buf, n)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("body of %d bytes: %v", n, err)
		}
		buf = got
	}
	if cap(buf) < 5*growStep+3 {
		t.Fatalf("buffer not reused: cap %d", cap(buf))
	}
	if _, err := ReadFrameBody(bytes.NewReader(nil), nil, -1); err == nil {
		t.Fatal("negative size accepted")
	}
}
