package ssd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// engineFile opens a 16 MiB test file through open (OpenOSFile or Faults.OpenFile),
// with O_DIRECT when the directory supports it.
func engineFile(t *testing.T, open func(string, int, os.FileMode) (File, error)) (File, bool) {
	t.Helper()
	dir, buffered := storageDir(t)
	flags := unix.O_RDWR | unix.O_CREAT | unix.O_TRUNC | unix.O_CLOEXEC
	if !buffered {
		flags |= unix.O_DIRECT
	}
	f, err := open(filepath.Join(dir, "engine.dat"), flags, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(16 << 20); err != nil {
		t.Fatal(err)
	}
	return f, !buffered
}

func startEngine(t *testing.T, kind string, depth int) Engine {
	t.Helper()
	e, err := NewEngine(kind, depth)
	if err != nil {
		t.Fatal(err)
	}
	if e.Kind() != kind {
		t.Fatalf("kind %q, want %q", e.Kind(), kind)
	}
	return e
}

// do submits one IO and waits for it.
func do(t *testing.T, e Engine, op Op, f File, buf []byte, off int64) *Request {
	t.Helper()
	done := make(chan *Request, 1)
	if err := e.Submit(&Request{Op: op, File: f, Buf: buf, Off: off, Done: done}); err != nil {
		t.Fatal(err)
	}
	return <-done
}

func TestEngineRoundTrip(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		f, _ := engineFile(t, OpenOSFile)
		e := startEngine(t, kind, 4)
		defer e.Close()

		// Far more IOs than the depth, writes and reads racing on disjoint blocks.
		const n, size = 96, 64 << 10
		want := make([][]byte, n)
		done := make(chan *Request, n)
		for i := range n {
			want[i] = alignedAlloc(size)
			copy(want[i], pattern(fmt.Sprint(kind, i), size))
			if err := e.Submit(&Request{Op: OpWrite, File: f, Buf: want[i], Off: int64(i) * size, Done: done}); err != nil {
				t.Fatal(err)
			}
		}
		for range n {
			req := <-done
			if req.Err != nil || req.N != size {
				t.Fatalf("write at %d: n=%d err=%v", req.Off, req.N, req.Err)
			}
		}
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got := alignedAlloc(size)
				req := do(t, e, OpRead, f, got, int64(i)*size)
				if req.Err != nil || req.N != size || !bytes.Equal(got, want[i]) {
					t.Errorf("read block %d: n=%d err=%v equal=%v", i, req.N, req.Err, bytes.Equal(got, want[i]))
				}
			}()
			if i%3 == 0 { // keep writes in the mix
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := do(t, e, OpWrite, f, want[i], int64(i)*size)
					if req.Err != nil || req.N != size {
						t.Errorf("rewrite %d: %v", i, req.Err)
					}
				}()
			}
		}
		wg.Wait()
	})
}

func TestEngineDirectIOAlignment(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		f, direct := engineFile(t, OpenOSFile)
		if !direct {
			t.Skip("no O_DIRECT directory")
		}
		e := startEngine(t, kind, 2)
		defer e.Close()
		buf := alignedAlloc(8192)
		// A misaligned file offset must be refused: proof the file is O_DIRECT. (Memory
		// alignment is not checked: some kernels quietly accept misaligned buffers.)
		if req := do(t, e, OpWrite, f, buf[:512], 100); !errors.Is(req.Err, unix.EINVAL) {
			t.Fatalf("misaligned offset: n=%d err=%v", req.N, req.Err)
		}
		// Reading past the end of the file is a short (here empty) read, not an error.
		if req := do(t, e, OpRead, f, buf[:4096], 16<<20); req.Err != nil || req.N != 0 {
			t.Fatalf("read at EOF: n=%d err=%v", req.N, req.Err)
		}
	})
}

func TestEngineFaults(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		var faults Faults
		f, _ := engineFile(t, faults.OpenFile)
		e := startEngine(t, kind, 4)
		defer e.Close()
		data := alignedAlloc(8192)
		copy(data, pattern("faults", 8192))

		faults.Fail(OpWrite, unix.ENOSPC, 1)
		if req := do(t, e, OpWrite, f, data, 0); !errors.Is(req.Err, unix.ENOSPC) || req.N != 0 {
			t.Fatalf("injected ENOSPC: n=%d err=%v", req.N, req.Err)
		}
		faults.Short(OpWrite, 1)
		if req := do(t, e, OpWrite, f, data, 0); req.Err != nil || req.N != 4096 {
			t.Fatalf("short write: n=%d err=%v", req.N, req.Err)
		}
		faults.Fail(OpRead, unix.EIO, 1)
		got := alignedAlloc(8192)
		if req := do(t, e, OpRead, f, got, 0); !errors.Is(req.Err, unix.EIO) {
			t.Fatalf("injected EIO: n=%d err=%v", req.N, req.Err)
		}
		// The short write really put the first half on disk, and only that.
		if req := do(t, e, OpRead, f, got, 0); req.Err != nil || req.N != 8192 {
			t.Fatalf("read: n=%d err=%v", req.N, req.Err)
		}
		if !bytes.Equal(got[:4096], data[:4096]) || !bytes.Equal(got[4096:], make([]byte, 4096)) {
			t.Fatal("short write did not land exactly its first half")
		}
		if faults.Hits() != 3 {
			t.Fatalf("hits %d, want 3", faults.Hits())
		}
	})
}

func TestEngineCloseDrainsAndRefuses(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		f, _ := engineFile(t, OpenOSFile)
		e := startEngine(t, kind, 2)
		const n = 16
		done := make(chan *Request, n)
		for i := range n {
			buf := alignedAlloc(4096)
			if err := e.Submit(&Request{Op: opOf(i), File: f, Buf: buf, Off: int64(i) * 4096, Done: done}); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if len(done) != n { // every queued IO completed before Close returned
			t.Fatalf("%d of %d completions after Close", len(done), n)
		}
		if err := e.Submit(&Request{Op: OpRead, File: f, Buf: alignedAlloc(4096), Done: done}); !errors.Is(err, ErrClosed) {
			t.Fatalf("submit after close: %v", err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// opOf alternates reads and writes.
func opOf(i int) Op { return Op(i % 2) }

func TestReadBias(t *testing.T) {
	for _, tc := range []struct {
		r, w     int
		wantRead bool
	}{
		{0, 0, true}, {2, 1, true}, {3, 1, false}, {4, 2, true}, {5, 2, false}, {1, 0, false},
	} {
		rc, wc := make(chan *Request, 1), make(chan *Request, 1)
		rd, wr := &Request{Op: OpRead}, &Request{Op: OpWrite}
		rc <- rd
		wc <- wr
		got := tryNext(&rc, &wc, tc.r, tc.w)
		if (got == rd) != tc.wantRead {
			t.Errorf("read_inflight %d write_inflight %d: took %v", tc.r, tc.w, got.Op)
		}
		// The other kind is taken when the preferred one is empty: no idle slot.
		if next := tryNext(&rc, &wc, tc.r, tc.w); next == nil || next == got {
			t.Errorf("second pick %v", next)
		}
	}
	rc, wc := make(chan *Request), make(chan *Request)
	close(rc)
	if got := tryNext(&rc, &wc, 0, 0); got != nil || rc != nil || wc == nil {
		t.Fatalf("closed read channel: got %v rc %v", got, rc)
	}
}

// pipeFile is a File on the read end of a pipe: a read on it stays in flight until
// the test writes to the pipe.
type pipeFile struct{ r, w *os.File }

func (p pipeFile) Fd() int                                         { return int(p.r.Fd()) }
func (p pipeFile) Name() string                                    { return "pipe" }
func (p pipeFile) Shape(_ Op, buf []byte, _ int64) ([]byte, error) { return buf, nil }
func (p pipeFile) Truncate(int64) error                            { return nil }
func (p pipeFile) Close() error                                    { p.w.Close(); return p.r.Close() }

// gateFile holds its first IO in Shape until the gate opens: a stuck IO for the
// psync engine, whose workers cannot wait on a pipe (pread needs a seekable file).
type gateFile struct {
	File
	gate chan struct{}
}

func (g gateFile) Shape(op Op, buf []byte, off int64) ([]byte, error) {
	<-g.gate
	return g.File.Shape(op, buf, off)
}

// TestEngineNewWorkWhileWaiting: with one IO stuck in flight, new requests must be
// served at once. For io_uring this proves the eventfd wake of a loop blocked in
// io_uring_enter (the stuck IO is a read of an empty pipe); for psync, that the other
// workers keep going.
func TestEngineNewWorkWhileWaiting(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		pipe := pipeFile{r, w}
		defer pipe.Close()
		f, _ := engineFile(t, OpenOSFile)
		e := startEngine(t, kind, 2)
		defer e.Close()

		stuck := make(chan *Request, 1)
		gate := make(chan struct{})
		stuckReq := &Request{Op: OpRead, File: pipe, Buf: make([]byte, 8), Off: -1, Done: stuck}
		if kind == EnginePsync {
			stuckReq = &Request{Op: OpRead, File: gateFile{f, gate}, Buf: alignedAlloc(4096), Done: stuck}
		}
		if err := e.Submit(stuckReq); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // let the engine block on the stuck IO
		for i := range 20 {
			start := time.Now()
			req := do(t, e, OpWrite, f, alignedAlloc(4096), int64(i)*4096)
			if req.Err != nil || req.N != 4096 {
				t.Fatalf("write while an IO is stuck: n=%d err=%v", req.N, req.Err)
			}
			// Without the wake the write would wait for the stuck IO forever; the
			// bound is generous for a loaded machine.
			if d := time.Since(start); d > 30*time.Second {
				t.Fatalf("write took %v", d)
			}
			if i%5 == 0 {
				time.Sleep(5 * time.Millisecond) // let the loop go back to sleep
			}
		}
		select {
		case req := <-stuck:
			t.Fatalf("stuck IO completed early: n=%d err=%v", req.N, req.Err)
		default:
		}
		w.Write([]byte("wake-up!"))
		close(gate)
		req := <-stuck
		if req.Err != nil || kind == EngineUring && string(req.Buf[:req.N]) != "wake-up!" {
			t.Fatalf("stuck IO: %q %v", req.Buf[:req.N], req.Err)
		}
	})
}

// TestEngineVectoredRead: a read with Head fills Head from Off and Buf right after
// it, in one IO, on every engine; a short IO reports what it transferred.
func TestEngineVectoredRead(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		var faults Faults
		f, _ := engineFile(t, faults.OpenFile)
		e := startEngine(t, kind, 4)
		defer e.Close()
		src := alignedAlloc(3 * 4096)
		copy(src, pattern("vectored", int64(len(src))))
		if req := do(t, e, OpWrite, f, src, 8192); req.Err != nil || req.N != len(src) {
			t.Fatalf("write: %d %v", req.N, req.Err)
		}
		head, buf := alignedAlloc(512), alignedAlloc(2*4096)
		done := make(chan *Request, 1)
		if err := e.Submit(&Request{Op: OpRead, File: f, Head: head, Buf: buf, Off: 8192, Done: done}); err != nil {
			t.Fatal(err)
		}
		req := <-done
		if req.Err != nil || req.N != len(head)+len(buf) || !bytes.Equal(head, src[:512]) || !bytes.Equal(buf, src[512:512+len(buf)]) {
			t.Fatalf("vectored read: n=%d err=%v", req.N, req.Err)
		}
		faults.Short(OpRead, 1) // Buf shrinks to half: 4096 bytes
		clear(buf)
		if err := e.Submit(&Request{Op: OpRead, File: f, Head: head, Buf: buf, Off: 8192, Done: done}); err != nil {
			t.Fatal(err)
		}
		if req := <-done; req.Err != nil || req.N != 512+4096 || !bytes.Equal(buf[:4096], src[512:512+4096]) {
			t.Fatalf("short vectored read: n=%d err=%v", req.N, req.Err)
		}
	})
}
