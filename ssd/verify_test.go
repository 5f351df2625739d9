package ssd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// recordLoc is where an entry's record lies, found through the index.
type recordLoc struct {
	path      string
	off, hdr  int64 // record start in the file, header bytes
	size      int64 // whole record on disk
	length    int64 // value bytes
	indexedAs *entry
}

func locate(t *testing.T, s *Storage, key string) recordLoc {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.index[key]
	if e == nil {
		t.Fatalf("%s not indexed", key)
	}
	return recordLoc{path: e.shard.file.Name(), off: e.shard.fileOffset(e), hdr: headerSize(len(key)),
		size: e.size, length: e.length, indexedAs: e}
}

// behindTheBack changes a shard file the way a disk, a stray process or an operator
// could: through a separate descriptor, synced, never through the Storage.
func behindTheBack(t *testing.T, path string, f func(*os.File)) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	f(fh)
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
}

func writeAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	behindTheBack(t, path, func(fh *os.File) {
		if _, err := fh.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	})
}

func readAt(t *testing.T, path string, n, off int64) []byte {
	t.Helper()
	b := make([]byte, n)
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// loadFn is one way of reading: LoadInto, or LoadChunks recording what fn saw.
type loadFn struct {
	name string
	load func(s *Storage, key string, putID int64, dst []byte, n int64) (delivered int64, err error)
}

var loadFns = []loadFn{
	{"LoadInto", func(s *Storage, key string, putID int64, dst []byte, n int64) (int64, error) {
		return -1, s.LoadInto(key, putID, dst, n)
	}},
	{"LoadChunks", func(s *Storage, key string, putID int64, dst []byte, n int64) (int64, error) {
		var got int64
		err := s.LoadChunks(key, putID, dst, n, func(off, k int64) error {
			if off != got {
				return fmt.Errorf("chunk at %d, want %d", off, got)
			}
			got += k
			return nil
		})
		return got, err
	}},
	// Fewer slots than ChunkInflight: the load waits for slots given back by fn.
	{"LoadStaged", func(s *Storage, key string, putID int64, dst []byte, n int64) (int64, error) {
		sl := newTestSlots(3, s.opts.ChunkSize)
		var got int64
		err := s.LoadStaged(context.Background(), key, putID, n, s.opts.ChunkSize, s.opts.ChunkInflight, sl, func(i int, off, k int64, buf []byte) error {
			if off != got {
				return fmt.Errorf("chunk at %d, want %d", off, got)
			}
			copy(dst[off:off+k], buf[:k])
			got += k
			sl.give(i)
			return nil
		})
		if held := sl.maxHeld(); held > 3 {
			return got, fmt.Errorf("%d slots held at once, 3 lent", held)
		}
		return got, err
	}},
}

// testSlots lends a LoadStaged a few chunk buffers.
type testSlots struct {
	mu      sync.Mutex
	bufs    [][]byte
	free    []int
	byChunk map[int]int
	held    int
	peak    int
	freed   chan struct{}
}

func newTestSlots(n int, size int64) *testSlots {
	s := &testSlots{byChunk: make(map[int]int), freed: make(chan struct{}, 1)}
	for i := range n {
		s.bufs = append(s.bufs, AllocAligned(size))
		s.free = append(s.free, i)
	}
	return s
}

func (s *testSlots) Take(i int, n int64) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) == 0 {
		return nil
	}
	b := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.byChunk[i] = b
	s.held++
	s.peak = max(s.peak, s.held)
	return s.bufs[b]
}

func (s *testSlots) Freed() <-chan struct{} { return s.freed }

func (s *testSlots) give(i int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, s.byChunk[i])
	delete(s.byChunk, i)
	s.held--
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

func (s *testSlots) maxHeld() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peak
}

// expectCorrupt checks the contract of a corrupt read: ErrCorrupt (never success),
// counted, the entry gone from the index and its bytes from UsedBytes, and a second
// read a plain miss.
func expectCorrupt(t *testing.T, s *Storage, lf loadFn, key string, putID, n int64, wantDelivered int64) {
	t.Helper()
	before := s.Stats()
	loc := locate(t, s, key)
	delivered, err := lf.load(s, key, putID, AllocAligned(n), n)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("%s %s: %v, want ErrCorrupt", lf.name, key, err)
	}
	if wantDelivered >= 0 && delivered != wantDelivered && lf.name != "LoadInto" {
		t.Fatalf("%s %s: fn saw %d bytes before the failure, want %d", lf.name, key, delivered, wantDelivered)
	}
	after := s.Stats()
	if after.CorruptReads != before.CorruptReads+1 || after.Entries != before.Entries-1 ||
		after.UsedBytes != before.UsedBytes-loc.size {
		t.Fatalf("after corrupt read: %+v, before %+v (record %d bytes)", after, before, loc.size)
	}
	if s.Contains(key, putID) {
		t.Fatalf("%s still indexed after a corrupt read", key)
	}
	if _, err := lf.load(s, key, putID, AllocAligned(n), n); !errors.Is(err, ErrNotFound) {
		t.Fatalf("%s read again: %v, want ErrNotFound", key, err)
	}
}

// headerModes are the two ways a load reads the record header: a separate IO
// submitted with the first chunk, or one READV/preadv with the first chunk.
var headerModes = []struct {
	name  string
	readv bool
}{{"header-io", false}, {"readv", true}}

// forEachLoad runs f for every engine, load function and header mode.
func forEachLoad(t *testing.T, f func(t *testing.T, kind string, lf loadFn, readv bool)) {
	forEachEngine(t, func(t *testing.T, kind string) {
		for _, lf := range loadFns {
			for _, m := range headerModes {
				t.Run(lf.name+"/"+m.name, func(t *testing.T) { f(t, kind, lf, m.readv) })
			}
		}
	})
}

func TestCorruptRecordsNeverServed(t *testing.T) {
	forEachLoad(t, func(t *testing.T, kind string, lf loadFn, readv bool) {
		checkLeaks(t)
		// One shard; 64 KiB chunks so that values span several chunks.
		s := openTest(t, kind, 32<<20, func(o *Options) { o.ChunkSize = 64 << 10; o.separateHeaderRead = !readv })
		const n = 300<<10 + 7 // 5 chunks, the last one short
		vals := map[string][]byte{}
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			vals[k] = pattern(k, n)
			persist(t, s, k, 1, vals[k])
		}

		// Value bytes: the header matches, every chunk is handed over, then the
		// CRC32C of the value says no.
		loc := locate(t, s, "a")
		writeAt(t, loc.path, []byte{^vals["a"][n-3]}, loc.off+loc.hdr+n-3)
		expectCorrupt(t, s, lf, "a", 1, n, n)

		// Metadata bytes (one byte of the key): refused before fn sees a byte.
		loc = locate(t, s, "b")
		writeAt(t, loc.path, []byte("B"), loc.off+recordFixed)
		expectCorrupt(t, s, lf, "b", 1, n, 0)

		// The whole record of another key copied over c: consistent in
		// itself, but not c's.
		locD, locC := locate(t, s, "d"), locate(t, s, "c")
		writeAt(t, locC.path, readAt(t, locD.path, locD.size, locD.off), locC.off)
		expectCorrupt(t, s, lf, "c", 1, n, 0)

		// An older version of the same key copied over the current one:
		// same key and length, other put id and ring position.
		old := readAt(t, locD.path, locD.size, locD.off)
		persist(t, s, "d", 2, pattern("d2", n))
		locD2 := locate(t, s, "d")
		writeAt(t, locD2.path, old, locD2.off)
		expectCorrupt(t, s, lf, "d", 2, n, 0)

		// e was not touched: still served, byte for byte, straight into
		// aligned memory.
		dst := AllocAligned(n)
		before := s.Stats()
		if _, err := lf.load(s, "e", 1, dst, n); err != nil || !bytes.Equal(dst, vals["e"]) {
			t.Fatalf("untouched e: %v", err)
		}
		if st := s.Stats(); st.DirectReadChunks != before.DirectReadChunks+5 || st.ScratchReadChunks != before.ScratchReadChunks {
			t.Fatalf("aligned load of 5 chunks: direct %d→%d, scratch %d→%d", before.DirectReadChunks,
				st.DirectReadChunks, before.ScratchReadChunks, st.ScratchReadChunks)
		}
		if st := s.Stats(); st.CorruptReads != 4 || st.Entries != 1 || st.UsedBytes != locate(t, s, "e").size {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestTruncatedShardIsCorrupt is the outside test's scenario: shard files truncated
// under a running storage, then more puts; every earlier entry reads zeros (a hole)
// and must fail, never come back as a value of zeros.
func TestTruncatedShardIsCorrupt(t *testing.T) {
	forEachLoad(t, func(t *testing.T, kind string, lf loadFn, readv bool) {
		checkLeaks(t)
		s := openTest(t, kind, 64<<20, func(o *Options) { o.separateHeaderRead = !readv })
		const n = 1 << 20
		for i := range 6 {
			persist(t, s, fmt.Sprint("old", i), 1, pattern(fmt.Sprint(i), n))
		}
		for _, p := range shardFiles(t, s) {
			if err := os.Truncate(p, 0); err != nil {
				t.Fatal(err)
			}
		}
		for i := range 3 {
			persist(t, s, fmt.Sprint("new", i), 1, pattern(fmt.Sprint("n", i), n))
		}
		for i := range 6 {
			expectCorrupt(t, s, lf, fmt.Sprint("old", i), 1, n, -1)
		}
		for i := range 3 {
			dst := AllocAligned(n)
			if _, err := lf.load(s, fmt.Sprint("new", i), 1, dst, n); err != nil || !bytes.Equal(dst, pattern(fmt.Sprint("n", i), n)) {
				t.Fatalf("new%d after the truncation: %v", i, err)
			}
		}
		if st := s.Stats(); st.CorruptReads != 6 || st.Entries != 3 {
			t.Fatalf("stats %+v", st)
		}
	})
}

// TestVerifiedRoundTrip: values around every boundary (sector, chunk) come back
// exactly, verified, direct into aligned memory, through scratch otherwise, and with
// SkipVerify as well.
func TestVerifiedRoundTrip(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		for _, mode := range []struct {
			name        string
			skip, readv bool
		}{{"header-io", false, false}, {"readv", false, true}, {"skip-verify", true, false}} {
			t.Run(mode.name, func(t *testing.T) {
				checkLeaks(t)
				s := openTest(t, kind, 64<<20, func(o *Options) { o.SkipVerify, o.separateHeaderRead = mode.skip, !mode.readv })
				sizes := []int64{1, 511, 512, 513, 4<<20 + 1, 3*(4<<20) + 4096 + 5}
				var used int64
				for i, n := range sizes {
					key := fmt.Sprintf("%0*d", 1+i*200, i) // keys of 1 .. 1001 bytes: 1 or 3 header sectors
					want := pattern(key, n)
					persist(t, s, key, int64(i+1), want)
					used += recordSize(key, n)
					if got := s.Stats().UsedBytes; got != used {
						t.Fatalf("used %d after %d records, want %d", got, i+1, used)
					}
					chunks := (n + s.opts.ChunkSize - 1) / s.opts.ChunkSize
					dst := AllocAligned(n)
					before := s.Stats()
					if err := s.LoadInto(key, int64(i+1), dst, n); err != nil || !bytes.Equal(dst, want) {
						t.Fatalf("%d bytes direct: %v", n, err)
					}
					if st := s.Stats(); st.DirectReadChunks-before.DirectReadChunks != uint64(chunks) || st.ScratchReadChunks != before.ScratchReadChunks {
						t.Fatalf("%d bytes into aligned memory: %+v → %+v", n, before, st)
					}
					raw := make([]byte, n+1)
					if err := s.LoadInto(key, int64(i+1), raw[1:], n); err != nil || !bytes.Equal(raw[1:], want) {
						t.Fatalf("%d bytes through scratch: %v", n, err)
					}
				}
				if st := s.Stats(); st.CorruptReads != 0 || st.Entries != len(sizes) {
					t.Fatalf("stats %+v", st)
				}
			})
		}
	})
}

func TestForgetAndUsedBytes(t *testing.T) {
	checkLeaks(t)
	s := openTest(t, EngineAuto, 64<<10, nil)
	rec := recordSize("k", 3000)
	persist(t, s, "k", 5, pattern("k", 3000))
	persist(t, s, "j", 1, pattern("j", 3000))
	if st := s.Stats(); st.UsedBytes != 2*rec || st.Devices[0].UsedBytes != 2*rec {
		t.Fatalf("used %+v, want %d", st, 2*rec)
	}
	if s.Forget("k", 4) || !s.Contains("k", 5) {
		t.Fatal("Forget dropped a newer put id")
	}
	if !s.Forget("k", 5) || s.Contains("k", 5) || s.Forget("k", 5) {
		t.Fatal("Forget of the current put id")
	}
	if !s.Forget("j", 0) || s.Forget("absent", 0) {
		t.Fatal("Forget of any version")
	}
	if st := s.Stats(); st.UsedBytes != 0 || st.Entries != 0 {
		t.Fatalf("after forgetting everything: %+v", st)
	}
	// An overwrite counts the new record only; an eviction takes its bytes away.
	persist(t, s, "k", 6, pattern("k6", 3000))
	persist(t, s, "k", 7, pattern("k7", 3000))
	if st := s.Stats(); st.UsedBytes != rec {
		t.Fatalf("after an overwrite: %+v, want %d", st, rec)
	}
	for i := range 20 { // 64 KiB ring, records of at most 4 KiB: k is overwritten
		persist(t, s, fmt.Sprint("fill", i), 1, pattern("f", 3000))
	}
	if st := s.Stats(); st.UsedBytes != int64(st.Entries)*recordSize("fill0", 3000) || s.Contains("k", 7) {
		t.Fatalf("after the ring wrapped: %+v", st)
	}
}

// TestForgetWhileWriting: a persist whose key is forgotten while its bytes are being
// written fails with ErrStale and leaves nothing readable.
func TestForgetWhileWriting(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		gate := &writeHold{entered: make(chan struct{}), release: make(chan struct{})}
		s := openTest(t, kind, 1<<20, func(o *Options) { o.OpenFile = gate.OpenFile })
		done := make(chan error, 1)
		gate.arm()
		go func() {
			_, err := s.Persist("k", 3, pattern("k", 5000))
			done <- err
		}()
		<-gate.entered // the write is submitted and held
		if !s.Forget("k", 3) {
			t.Fatal("Forget of a writing entry")
		}
		close(gate.release)
		if err := <-done; !errors.Is(err, ErrStale) {
			t.Fatalf("persist of a forgotten key: %v", err)
		}
		if st := s.Stats(); st.Entries != 0 || st.UsedBytes != 0 || s.Contains("k", 3) {
			t.Fatalf("stats %+v", st)
		}
	})
}

// writeHold holds the first write after arm in Shape (that is, submitted to the
// engine) until release is closed.
type writeHold struct {
	entered, release chan struct{}
	armed            atomic.Bool
}

func (h *writeHold) arm() { h.armed.Store(true) }

// OpenFile fits Options.OpenFile.
func (h *writeHold) OpenFile(path string, flag int, perm os.FileMode) (File, error) {
	f, err := OpenOSFile(path, flag, perm)
	if err != nil {
		return nil, err
	}
	return heldFile{File: f, h: h}, nil
}

type heldFile struct {
	File
	h *writeHold
}

func (f heldFile) Shape(op Op, buf []byte, off int64) ([]byte, error) {
	if op == OpWrite && f.h.armed.CompareAndSwap(true, false) {
		close(f.h.entered)
		<-f.h.release
	}
	return f.File.Shape(op, buf, off)
}

// TestReadFaultsAreNotCorruption: IO errors and short reads of a load stay plain
// errors in both header modes: not counted as corruption, the entry stays readable.
func TestReadFaultsAreNotCorruption(t *testing.T) {
	forEachLoad(t, func(t *testing.T, kind string, lf loadFn, readv bool) {
		checkLeaks(t)
		var faults Faults
		s := openTest(t, kind, 8<<20, func(o *Options) {
			o.OpenFile, o.separateHeaderRead, o.ChunkSize = faults.OpenFile, !readv, 64<<10
		})
		const n = 200<<10 + 1
		want := pattern("v", n)
		persist(t, s, "v", 1, want)
		for _, tc := range []struct {
			inject func()
			want   error
		}{
			{func() { faults.Fail(OpRead, unix.EIO, 1) }, unix.EIO},
			{func() { faults.Short(OpRead, 1) }, io.ErrUnexpectedEOF},
			{func() { faults.Fail(OpRead, unix.EIO, -1) }, unix.EIO},
		} {
			tc.inject()
			if _, err := lf.load(s, "v", 1, AllocAligned(n), n); !errors.Is(err, tc.want) || errors.Is(err, ErrCorrupt) {
				t.Fatalf("load: %v, want %v", err, tc.want)
			}
			faults.Clear()
		}
		dst := AllocAligned(n)
		if _, err := lf.load(s, "v", 1, dst, n); err != nil || !bytes.Equal(dst, want) {
			t.Fatalf("after the faults: %v", err)
		}
		if st := s.Stats(); st.CorruptReads != 0 || st.Entries != 1 || faults.Hits() < 3 {
			t.Fatalf("stats %+v, %d faults hit", st, faults.Hits())
		}
	})
}

// TestCommitted: the entries an owner reports after a master restart are exactly the
// readable ones: a forgotten entry and one overwritten by a newer version are not listed.
func TestCommitted(t *testing.T) {
	checkLeaks(t)
	s := openTest(t, EngineAuto, 64<<10, nil)
	persist(t, s, "k", 5, pattern("k", 3000))
	persist(t, s, "j", 1, pattern("j", 100))
	persist(t, s, "gone", 2, pattern("gone", 10))
	persist(t, s, "k", 7, pattern("k", 2000))
	s.Forget("gone", 2)
	got := map[string]Entry{}
	for _, e := range s.Committed() {
		got[e.Key] = e
	}
	want := map[string]Entry{"k": {Key: "k", PutID: 7, Length: 2000, Seq: 4}, "j": {Key: "j", PutID: 1, Length: 100, Seq: 2}}
	if len(got) != len(want) || got["k"] != want["k"] || got["j"] != want["j"] {
		t.Fatalf("Committed() = %+v, want %+v", got, want)
	}
	// An entry whose commit pin is held is committed, but not settled (the owner's
	// commit to the master is still out) until the pin goes.
	pin, err := s.Persist("p", 3, pattern("p", 500))
	if err != nil {
		t.Fatal(err)
	}
	has := func(es []Entry) bool { return slices.ContainsFunc(es, func(e Entry) bool { return e.Key == "p" }) }
	if !has(s.Committed()) || has(s.Settled()) || len(s.Settled()) != 2 {
		t.Fatalf("pinned: Committed() = %+v, Settled() = %+v", s.Committed(), s.Settled())
	}
	pin.Release()
	if !has(s.Settled()) {
		t.Fatalf("released: Settled() = %+v", s.Settled())
	}
}

// TestCommitPinForgetsItsOwnRecord: a commit that failed forgets the record it pinned,
// not a rewrite of the same key and put id committed since (a new master's write-back of
// the version, while the old commit was out).
func TestCommitPinForgetsItsOwnRecord(t *testing.T) {
	checkLeaks(t)
	s := openTest(t, EngineAuto, 64<<10, nil)
	old, err := s.Persist("k", 5, pattern("k", 3000))
	if err != nil {
		t.Fatal(err)
	}
	persist(t, s, "k", 5, pattern("k", 3000)) // the rewrite, committed and released
	old.Forget()
	old.Release()
	if !s.Contains("k", 5) {
		t.Fatal("the old pin's Forget dropped the rewrite")
	}
	got := make([]byte, 3000)
	if err := s.LoadInto("k", 5, got, 3000); err != nil || !bytes.Equal(got, pattern("k", 3000)) {
		t.Fatalf("the rewrite reads %v", err)
	}
	// A pin whose record is still the key's forgets it.
	pin, err := s.Persist("j", 1, pattern("j", 100))
	if err != nil {
		t.Fatal(err)
	}
	pin.Forget()
	pin.Release()
	if s.Contains("j", 1) {
		t.Fatal("Forget left the pinned record")
	}
}
