package ssd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func persist(t *testing.T, s *Storage, key string, putID int64, data []byte) {
	t.Helper()
	pin, err := s.Persist(key, putID, data)
	if err != nil {
		t.Fatalf("persist %s/%d (%d bytes): %v", key, putID, len(data), err)
	}
	pin.Release()
}

func TestRoundTripSizes(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 64<<20, nil)
		if s.Engine() != kind {
			t.Fatalf("engine %s, want %s", s.Engine(), kind)
		}
		sizes := []int64{1, 511, 512, 513, 4<<20 - 128, 16<<20 - 128 + 1}
		for i, n := range sizes {
			key := fmt.Sprintf("size-%d", n)
			want := pattern(key, n)
			persist(t, s, key, int64(i+1), want)

			// Direct: aligned address, capacity covers the aligned length.
			dst := AllocAligned(n)
			before := s.Stats()
			if err := s.LoadInto(key, int64(i+1), dst, n); err != nil {
				t.Fatalf("load %s direct: %v", key, err)
			}
			if !bytes.Equal(dst, want) {
				t.Fatalf("load %s direct: bytes differ", key)
			}
			if pad := dst[n:cap(dst)]; !bytes.Equal(pad, make([]byte, len(pad))) {
				t.Fatalf("load %s: padding is not zero", key)
			}
			after := s.Stats()
			if after.ScratchReadChunks != before.ScratchReadChunks || after.DirectReadChunks == before.DirectReadChunks {
				t.Fatalf("load %s into aligned memory went through scratch", key)
			}

			// Scratch: misaligned address and a tight capacity with a guard band after
			// the value that must stay untouched.
			raw := make([]byte, n+1+64)
			for j := range raw {
				raw[j] = 0xAA
			}
			dst = raw[1 : 1+n]
			if err := s.LoadInto(key, int64(i+1), dst, n); err != nil {
				t.Fatalf("load %s scratch: %v", key, err)
			}
			if !bytes.Equal(dst, want) {
				t.Fatalf("load %s scratch: bytes differ", key)
			}
			if raw[0] != 0xAA || !bytes.Equal(raw[1+n:], bytes.Repeat([]byte{0xAA}, 64)) {
				t.Fatalf("load %s scratch wrote outside dst[:n]", key)
			}
			if s.Stats().ScratchReadChunks == after.ScratchReadChunks {
				t.Fatalf("load %s into misaligned memory did not use scratch", key)
			}
		}
		// Everything is still there, and wrong versions or lengths are refused.
		for i, n := range sizes {
			key := fmt.Sprintf("size-%d", n)
			if !s.Contains(key, int64(i+1)) {
				t.Fatalf("%s gone", key)
			}
			if err := s.LoadInto(key, int64(i+2), make([]byte, n), n); !errors.Is(err, ErrNotFound) {
				t.Fatalf("wrong put id: %v", err)
			}
		}
		if err := s.LoadInto("size-513", 4, make([]byte, 600), 600); err == nil || errors.Is(err, ErrNotFound) {
			t.Fatalf("wrong length: %v", err)
		}
		if err := s.LoadInto("nope", 1, make([]byte, 10), 10); !errors.Is(err, ErrNotFound) {
			t.Fatalf("absent key: %v", err)
		}
		st := s.Stats()
		var records int64 // used bytes count whole records: header and padded value
		for _, n := range sizes {
			records += recordSize(fmt.Sprintf("size-%d", n), n)
		}
		if st.UsedBytes != records || st.UsedBytes > st.CapacityBytes || st.Entries != len(sizes) {
			t.Fatalf("stats %+v, want used %d", st, records)
		}
	})
}

func TestLoadChunksInOrder(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		for _, tc := range []struct {
			name      string
			n, chunk  int64
			inflight  int
			misaligne bool
		}{
			{"4MiB-chunks", 16<<20 - 127, 0, 0, false},
			{"small-chunks", 1<<20 + 77, 4096, 4, false},
			{"small-chunks-scratch", 1<<20 + 77, 8192, 3, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				s := openTest(t, kind, 64<<20, func(o *Options) {
					o.ChunkSize, o.ChunkInflight = tc.chunk, tc.inflight
				})
				want := pattern(tc.name, tc.n)
				persist(t, s, "v", 7, want)
				dst := AllocAligned(tc.n + 1)[:tc.n]
				if tc.misaligne {
					dst = make([]byte, tc.n+1)[1:]
				}
				chunk := s.opts.ChunkSize
				var next int64
				calls := 0
				err := s.LoadChunks("v", 7, dst, tc.n, func(off, n int64) error {
					calls++
					if off != next || (n != chunk && off+n != tc.n) {
						return fmt.Errorf("chunk (%d, %d), want offset %d", off, n, next)
					}
					if !bytes.Equal(dst[off:off+n], want[off:off+n]) {
						return fmt.Errorf("chunk at %d not ready when handed over", off)
					}
					next += n
					return nil
				})
				if err != nil || next != tc.n {
					t.Fatalf("load: %v (delivered %d of %d)", err, next, tc.n)
				}
				if wantCalls := int((tc.n + chunk - 1) / chunk); calls != wantCalls {
					t.Fatalf("%d chunks, want %d", calls, wantCalls)
				}
				// An error from the callback stops the load; the entry stays readable.
				stop := errors.New("stop")
				calls = 0
				err = s.LoadChunks("v", 7, dst, tc.n, func(off, n int64) error {
					calls++
					if calls == 2 {
						return stop
					}
					return nil
				})
				if !errors.Is(err, stop) || calls != 2 {
					t.Fatalf("callback error: %v after %d calls", err, calls)
				}
				if err := s.LoadInto("v", 7, dst, tc.n); err != nil || !bytes.Equal(dst, want) {
					t.Fatalf("reload: %v", err)
				}
			})
		}
	})
}

// collect gathers eviction batches until the channel closes.
func collect(s *Storage) (batches chan [][]Eviction) {
	out := make(chan [][]Eviction, 1)
	go func() {
		var all [][]Eviction
		for b := range s.Evictions() {
			all = append(all, b)
		}
		out <- all
	}()
	return out
}

func TestEvictionsReportedAndBatched(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		// 1 MiB ring of 4 KiB records (512-byte header + value): 256 fit. Batches flush only when full (delay of
		// an hour) or at Close, so the batching is deterministic.
		dir, buffered := storageDir(t)
		s, err := Open(Options{Cluster: "c", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{1 << 20},
			Engine: kind, BufferedIO: buffered, EvictionDelay: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		got := collect(s)
		const total = 256 + 600
		for i := range total {
			persist(t, s, fmt.Sprintf("k%04d", i), 1, pattern(fmt.Sprint(i), 3584-100))
		}
		// The 600 oldest were overwritten, oldest first; the rest are readable.
		for i := range total {
			key := fmt.Sprintf("k%04d", i)
			err := s.LoadInto(key, 1, make([]byte, 3484), 3484)
			if i < 600 && !errors.Is(err, ErrNotFound) || i >= 600 && err != nil {
				t.Fatalf("%s: %v", key, err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		batches := <-got
		var sizes []int
		var flat []Eviction
		for _, b := range batches {
			sizes = append(sizes, len(b))
			flat = append(flat, b...)
		}
		if fmt.Sprint(sizes) != "[256 256 88]" {
			t.Fatalf("batch sizes %v, want [256 256 88]", sizes)
		}
		for i, ev := range flat {
			if ev != (Eviction{Key: fmt.Sprintf("k%04d", i), PutID: 1, Seq: int64(i + 1)}) {
				t.Fatalf("eviction %d is %+v", i, ev)
			}
		}
	})
}

func TestEvictionsFlushAfterDelay(t *testing.T) {
	checkLeaks(t)
	s := openTest(t, EngineAuto, 8192, nil) // two 4 KiB records fit
	for i := range 5 {
		persist(t, s, fmt.Sprint(i), 1, pattern("x", 3584))
	}
	// Three evictions, far fewer than a batch: they come after the 10 ms delay
	// (in one batch unless the persists themselves took longer than that).
	var got []Eviction
	for len(got) < 3 {
		select {
		case b := <-s.Evictions():
			got = append(got, b...)
		case <-time.After(5 * time.Second):
			t.Fatalf("only %v within 5s", got)
		}
	}
	if fmt.Sprint(got) != "[{0 1 1} {1 1 2} {2 1 3}]" { // key, put id, record number
		t.Fatalf("evictions %v", got)
	}
}

func TestEvictionsDroppedWhenNotConsumed(t *testing.T) {
	checkLeaks(t)
	s := openTest(t, EngineAuto, 1024, func(o *Options) { o.EvictionBatch = 1 })
	for i := range 300 { // nobody reads Evictions: persists must not block
		persist(t, s, fmt.Sprint(i), 1, []byte{byte(i)})
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Stats().DroppedEvictions == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	// 298 evictions: at most 32 queued + 64 batches + 1 in the batcher's hands.
	if d := s.Stats().DroppedEvictions; d < 298-97 {
		t.Fatalf("dropped %d", d)
	}
}

func TestRemoveSupersedeStale(t *testing.T) {
	checkLeaks(t)
	s := openTest(t, EngineAuto, 16384, nil)
	v1, v2 := pattern("v1", 1000), pattern("v2", 3000)
	persist(t, s, "k", 1, v1)
	persist(t, s, "k", 1, v1) // a rewrite (TestRewriteSamePut)
	persist(t, s, "k", 2, v2)
	if _, err := s.Persist("k", 1, v1); !errors.Is(err, ErrStale) {
		t.Fatalf("older put id: %v", err)
	}
	if err := s.LoadInto("k", 1, make([]byte, 1000), 1000); !errors.Is(err, ErrNotFound) {
		t.Fatalf("superseded version: %v", err)
	}
	dst := make([]byte, 3000)
	if err := s.LoadInto("k", 2, dst, 3000); err != nil || !bytes.Equal(dst, v2) {
		t.Fatalf("current version: %v", err)
	}
	if s.Forget("k", 1) || !s.Forget("k", 2) || s.Forget("k", 2) {
		t.Fatal("remove results")
	}
	if err := s.LoadInto("k", 2, dst, 3000); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removed: %v", err)
	}
	// Neither the superseded nor the removed entry is reported when overwritten.
	for i := range 8 {
		persist(t, s, fmt.Sprint("fill", i), 1, pattern("f", 4096))
	}
	time.Sleep(30 * time.Millisecond)
	select {
	case b := <-s.Evictions():
		for _, ev := range b {
			if ev.Key == "k" {
				t.Fatalf("removed key reported: %+v", b)
			}
		}
	default:
	}
	if _, err := s.Persist("", 1, v1); err == nil {
		t.Fatal("empty key accepted")
	}
	if _, err := s.Persist("e", 1, nil); err == nil {
		t.Fatal("empty value accepted")
	}
	if _, err := s.Persist("big", 1, make([]byte, 16385)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
}

// A persist of a committed (key, put id) rewrites its record at the ring's head (the
// master's refresh of a value read back from SSD): the new record is read, the old one
// stops counting as used and is never reported as evicted, neither when the ring comes
// round to it nor when the rewrite's own room is the old record; the key is reported
// once, when the ring overwrites the new record.
func TestRewriteSamePut(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 4<<20, func(o *Options) { o.ShardsPerDevice = 1 })
		reported, waitReported := countEvictions(t, s)

		const page = 60000
		v := pattern("k", page)
		persist(t, s, "k", 7, v)
		used := s.Stats().UsedBytes
		persist(t, s, "k", 7, v)
		if u := s.Stats().UsedBytes; u != used {
			t.Fatalf("used bytes after the rewrite %d, want %d (one record)", u, used)
		}
		dst := make([]byte, page)
		if err := s.LoadInto("k", 7, dst, page); err != nil || !bytes.Equal(dst, v) {
			t.Fatalf("rewritten record: %v", err)
		}
		if _, err := s.Persist("k", 6, v); !errors.Is(err, ErrStale) {
			t.Fatalf("an older put id after the rewrite: %v", err)
		}

		// Fills until one overwrites the rewritten record: the dead one went first,
		// unreported. The fills it took are the ring's length in records.
		lap := 0
		for ; s.Contains("k", 7); lap++ {
			persist(t, s, fmt.Sprintf("fill-%03d", lap), 1, pattern("f", page))
		}
		waitReported(Eviction{Key: "k", PutID: 7})
		if n := reported(Eviction{Key: "k", PutID: 7}); n != 1 {
			t.Fatalf("k reported evicted %d times, want once (the rewritten record)", n)
		}

		// w is the ring's oldest record when it is rewritten: the rewrite's room is the
		// old record's own.
		persist(t, s, "w", 3, v)
		for i := range lap - 1 {
			persist(t, s, fmt.Sprintf("own-%03d", i), 1, pattern("o", page))
		}
		if !s.Contains("w", 3) {
			t.Fatalf("w was overwritten before its rewrite (a lap of %d records)", lap)
		}
		persist(t, s, "w", 3, v)
		if err := s.LoadInto("w", 3, dst, page); err != nil || !bytes.Equal(dst, v) {
			t.Fatalf("w rewritten over its own record: %v", err)
		}
		// The next record overwrites own-000: once that is reported, so is anything
		// reported before it.
		persist(t, s, "marker", 1, pattern("m", page))
		waitReported(Eviction{Key: "own-000", PutID: 1})
		if n := reported(Eviction{Key: "w", PutID: 3}); n != 0 || s.Stats().DroppedEvictions != 0 {
			t.Fatalf("w reported evicted %d times while its rewrite lives (%d reports dropped)", n, s.Stats().DroppedEvictions)
		}
	})
}

func TestPinsBlockTheWriter(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 8192, func(o *Options) { o.BusyWait = 100 * time.Millisecond })
		a := pattern("a", 3584)
		pinA, err := s.Persist("a", 1, a)
		if err != nil {
			t.Fatal(err)
		}
		persist(t, s, "b", 1, pattern("b", 3584))
		// c needs a's range, which is commit-pinned.
		if _, err := s.Persist("c", 1, pattern("c", 3584)); !errors.Is(err, ErrBusy) {
			t.Fatalf("persist over a commit pin: %v", err)
		}
		s.opts.BusyWait = 10 * time.Second
		done := make(chan error, 1)
		go func() {
			pin, err := s.Persist("c", 1, pattern("c", 3584))
			pin.Release()
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		if !s.Contains("a", 1) {
			t.Fatal("a overwritten while commit-pinned")
		}
		pinA.Release()
		pinA.Release() // idempotent
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if s.Contains("a", 1) || !s.Contains("c", 1) {
			t.Fatal("c did not replace a after the pin was released")
		}

		// A load in progress pins b: a writer needing b's range waits for it.
		release := make(chan struct{})
		loaded := make(chan error, 1)
		dst := make([]byte, 3584)
		go func() {
			loaded <- s.LoadChunks("b", 1, dst, 3584, func(off, n int64) error {
				<-release
				return nil
			})
		}()
		for s.Stats().Entries == 0 || !pinnedRead(s, "b") {
			time.Sleep(time.Millisecond)
		}
		go func() {
			pin, err := s.Persist("d", 1, pattern("d", 3584))
			pin.Release()
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		select {
		case err := <-done:
			t.Fatalf("writer overtook a read-pinned entry: %v", err)
		default:
		}
		close(release)
		if err := <-loaded; err != nil || !bytes.Equal(dst, pattern("b", 3584)) {
			t.Fatalf("pinned load: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if s.Contains("b", 1) || !s.Contains("d", 1) {
			t.Fatal("d did not replace b after the read")
		}
	})
}

func pinnedRead(s *Storage, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.index[key]
	return e != nil && e.readPins > 0
}

func TestIOFaults(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		var faults Faults
		s := openTest(t, kind, 1<<20, func(o *Options) { o.OpenFile = faults.OpenFile })
		data := pattern("payload", 70000)
		for _, tc := range []struct {
			name   string
			inject func()
			want   error
		}{
			{"write-EIO", func() { faults.Fail(OpWrite, unix.EIO, 1) }, unix.EIO},
			{"write-ENOSPC", func() { faults.Fail(OpWrite, unix.ENOSPC, 1) }, unix.ENOSPC},
			{"short-write", func() { faults.Short(OpWrite, 1) }, io.ErrShortWrite},
		} {
			tc.inject()
			_, err := s.Persist(tc.name, 1, data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("%s: persist error %v, want %v", tc.name, err, tc.want)
			}
			if s.Contains(tc.name, 1) {
				t.Fatalf("%s: failed write left a committed entry", tc.name)
			}
			if err := s.LoadInto(tc.name, 1, make([]byte, len(data)), int64(len(data))); !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s: load after failed write: %v", tc.name, err)
			}
			// The same version can be persisted again, byte-exact.
			persist(t, s, tc.name, 1, data)
			got := make([]byte, len(data))
			if err := s.LoadInto(tc.name, 1, got, int64(len(got))); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("%s: retry: %v", tc.name, err)
			}
		}
		// Read errors surface; the entry stays and reads fine afterwards.
		got := make([]byte, len(data))
		faults.Fail(OpRead, unix.EIO, 1)
		if err := s.LoadInto("write-EIO", 1, got, int64(len(got))); !errors.Is(err, unix.EIO) {
			t.Fatalf("read EIO: %v", err)
		}
		faults.Short(OpRead, 1)
		if err := s.LoadInto("write-EIO", 1, got, int64(len(got))); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("short read: %v", err)
		}
		if err := s.LoadInto("write-EIO", 1, got, int64(len(got))); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("read after faults: %v", err)
		}
		// A chunked load failing midway hands over no chunk after the failure.
		big := pattern("big", 200000)
		persist(t, s, "big", 1, big)
		s.opts.ChunkSize = 16384
		faults.Fail(OpRead, unix.EIO, -1)
		delivered := 0
		err := s.LoadChunks("big", 1, make([]byte, len(big)), int64(len(big)), func(off, n int64) error { delivered++; return nil })
		if !errors.Is(err, unix.EIO) || delivered != 0 {
			t.Fatalf("failing chunked load: %v, %d chunks delivered", err, delivered)
		}
		faults.Clear()
		// Failed writes left only dead ranges: the ring keeps cycling and every
		// written value is exact.
		for i := range 40 {
			if i%7 == 3 {
				faults.Fail(OpWrite, unix.EIO, 1)
			}
			key := fmt.Sprint("cycle", i)
			v := pattern(key, 60000)
			pin, err := s.Persist(key, 1, v)
			pin.Release()
			if i%7 == 3 {
				if !errors.Is(err, unix.EIO) {
					t.Fatalf("%s: %v", key, err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(v))
			if err := s.LoadInto(key, 1, got, int64(len(v))); err != nil || !bytes.Equal(got, v) {
				t.Fatalf("%s: %v", key, err)
			}
		}
		if faults.Hits() == 0 {
			t.Fatal("no faults hit")
		}
	})
}

func TestConcurrentUse(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 6<<20, func(o *Options) {
			o.minShardSize = 1 << 20
			o.ShardsPerDevice = 3
			o.IODepth = 4
			o.WriteInflight = 3
			o.ReadInflight = 4
			o.ChunkSize = 64 << 10
		})
		if n := len(s.devices[0].shards); n != 3 {
			t.Fatalf("%d shards, want 3", n)
		}
		evicted := collect(s)
		const keys = 40
		var latest [keys]atomic.Int64 // highest put id persisted per key
		var stop atomic.Bool
		var wg, writers sync.WaitGroup
		var loads, hits atomic.Int64
		value := func(k int, put int64) []byte {
			key := fmt.Sprint("key", k, "/", put)
			return pattern(key, int64(1+(k*7919+int(put)*104729)%300000))
		}
		for w := range 4 {
			writers.Add(1)
			go func() {
				defer writers.Done()
				rng := rand.New(rand.NewPCG(uint64(w), 1))
				for i := 0; i < 60; i++ {
					k := rng.IntN(keys)
					put := latest[k].Add(1)
					pin, err := s.Persist(fmt.Sprint("key", k), put, value(k, put))
					if err != nil && !errors.Is(err, ErrStale) {
						t.Errorf("persist: %v", err)
					}
					if rng.IntN(4) == 0 {
						time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
					}
					pin.Release()
					if rng.IntN(10) == 0 {
						s.Forget(fmt.Sprint("key", k), put)
					}
				}
			}()
		}
		for r := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(r), 2))
				for !stop.Load() {
					k := rng.IntN(keys)
					put := latest[k].Load()
					if put == 0 {
						continue
					}
					want := value(k, put)
					dst := make([]byte, len(want))
					if rng.IntN(2) == 0 {
						dst = AllocAligned(int64(len(want)))
					}
					loads.Add(1)
					err := s.LoadInto(fmt.Sprint("key", k), put, dst, int64(len(want)))
					switch {
					case err == nil:
						hits.Add(1)
						if !bytes.Equal(dst, want) {
							t.Errorf("key%d/%d: wrong bytes", k, put)
						}
					case !errors.Is(err, ErrNotFound):
						t.Errorf("load: %v", err)
					}
					_ = s.Stats()
				}
			}()
		}
		// Let the writers finish, then stop the readers once they counted enough hits
		// (operations, not time: a slow machine only takes longer; the deadline
		// bounds a hang).
		writers.Wait()
		deadline := time.Now().Add(2 * time.Minute)
		for hits.Load() < 100 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		st := s.Stats()
		if st.UsedBytes > st.CapacityBytes || st.UsedBytes != committedBytes(s) {
			t.Fatalf("used %d, capacity %d, committed records %d", st.UsedBytes, st.CapacityBytes, committedBytes(s))
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, b := range <-evicted {
			n += len(b)
		}
		t.Logf("%d loads, %d hits, %d evictions reported, stats %+v", loads.Load(), hits.Load(), n, st)
		if hits.Load() < 100 || n == 0 {
			t.Fatal("the workload did not exercise hits and evictions")
		}
	})
}

func TestDevicesDedupAndRoundRobin(t *testing.T) {
	checkLeaks(t)
	dir, buffered := storageDir(t)
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	s, err := Open(Options{Cluster: "prod/x", InstanceKey: "host:1/gpu0", Paths: []string{a, b},
		Limits: []int64{1 << 20, 2 << 20}, BufferedIO: buffered})
	if err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if len(st.Devices) != 1 || st.CapacityBytes != 1<<20 {
		t.Fatalf("same-device roots not de-duplicated: %+v", st)
	}
	root := st.Devices[0].Root
	if filepath.Dir(filepath.Dir(root)) != a || !strings.HasPrefix(filepath.Base(filepath.Dir(root)), "prod_x-") ||
		!strings.HasSuffix(filepath.Dir(root), "_cluster_kv_ssd_storage") || !strings.HasPrefix(filepath.Base(root), "host_1_gpu0-") {
		t.Fatalf("root %s", root)
	}
	if files := shardFiles(t, s); len(files) != 1 {
		t.Fatalf("shard files %v", files)
	}
	s.Close()
	if _, err := os.Stat(filepath.Join(b, safeName("prod/x")+"_cluster_kv_ssd_storage")); err != nil {
		t.Fatalf("the skipped root was not created: %v", err)
	}

	// Three fake devices: values go round-robin, one device each.
	ids := map[string]uint64{}
	s, err = Open(Options{Cluster: "c", InstanceKey: "i", Paths: []string{a, b, c}, Limits: []int64{1 << 20, 1 << 20, 1 << 20},
		BufferedIO: buffered, devOf: func(root string) (uint64, error) {
			if _, ok := ids[root]; !ok {
				ids[root] = uint64(len(ids) + 1)
			}
			return ids[root], nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.devices) != 3 {
		t.Fatalf("%d devices", len(s.devices))
	}
	perDev := map[int]int{}
	for i := range 9 {
		key := fmt.Sprint("k", i)
		persist(t, s, key, 1, pattern(key, 1000))
		s.mu.Lock()
		perDev[s.index[key].shard.dev.id]++
		s.mu.Unlock()
	}
	if fmt.Sprint(perDev) != "map[0:3 1:3 2:3]" {
		t.Fatalf("values per device %v", perDev)
	}
	for i := range 9 {
		key := fmt.Sprint("k", i)
		got := make([]byte, 1000)
		if err := s.LoadInto(key, 1, got, 1000); err != nil || !bytes.Equal(got, pattern(key, 1000)) {
			t.Fatalf("%s: %v", key, err)
		}
	}
}

func TestReopenTruncatesAndDropsExtraShards(t *testing.T) {
	checkLeaks(t)
	dir, buffered := storageDir(t)
	opts := Options{Cluster: "c", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{3 << 20}, BufferedIO: buffered,
		ShardsPerDevice: 3, minShardSize: 1 << 20}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	persist(t, s, "k", 1, pattern("k", 5000))
	if n := len(shardFiles(t, s)); n != 3 {
		t.Fatalf("%d shard files", n)
	}
	s.Close()
	opts.ShardsPerDevice = 1
	s, err = Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	files := shardFiles(t, s)
	if len(files) != 1 || filepath.Base(files[0]) != "shard-000.dat" {
		t.Fatalf("shard files after reopen: %v", files)
	}
	if st, err := os.Stat(files[0]); err != nil || st.Size() != 3<<20 {
		t.Fatalf("shard size: %v %v", st.Size(), err)
	}
	// Runtime cache: nothing survives a restart.
	if err := s.LoadInto("k", 1, make([]byte, 5000), 5000); !errors.Is(err, ErrNotFound) || s.Stats().UsedBytes != 0 {
		t.Fatalf("after reopen: %v, used %d", err, s.Stats().UsedBytes)
	}
}

func TestOpenErrors(t *testing.T) {
	checkLeaks(t)
	dir := t.TempDir()
	base := Options{Cluster: "c", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{4096}}
	for _, tc := range []struct {
		name string
		edit func(o *Options)
		want string
	}{
		{"no cluster", func(o *Options) { o.Cluster = "" }, "cluster"},
		{"no paths", func(o *Options) { o.Paths, o.Limits = nil, nil }, "no paths"},
		{"length mismatch", func(o *Options) { o.Limits = []int64{4096, 4096} }, "same length"},
		{"tiny limit", func(o *Options) { o.Limits = []int64{100} }, "large_limit_size[0]"},
		{"engine", func(o *Options) { o.Engine = "aio" }, "unknown engine"},
		{"chunk", func(o *Options) { o.ChunkSize = 1000 }, "chunk size"},
		{"not a dir", func(o *Options) { o.Paths = []string{"/dev/null"} }, "large_file_paths[0]"},
	} {
		o := base
		tc.edit(&o)
		if _, err := Open(o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A file system without O_DIRECT (tmpfs) is refused with a clear message.
	var fs unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Skip("no tmpfs at /dev/shm")
	}
	shm, err := os.MkdirTemp("/dev/shm", "fluxkv-ssd-test-")
	if err != nil {
		t.Skip(err)
	}
	defer os.RemoveAll(shm)
	if ProbeDirectIO(shm) == nil {
		t.Skip("this kernel's tmpfs accepts O_DIRECT (Linux 6.6+)")
	}
	o := base
	o.Paths = []string{shm}
	s, err := Open(o)
	if err == nil {
		s.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "O_DIRECT") {
		t.Fatalf("tmpfs: %v", err)
	}
}

func TestCloseUnblocksAndRefuses(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		dir, buffered := storageDir(t)
		s, err := Open(Options{Cluster: "c", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{4096},
			Engine: kind, BufferedIO: buffered})
		if err != nil {
			t.Fatal(err)
		}
		pin, err := s.Persist("a", 1, pattern("a", 3584))
		if err != nil {
			t.Fatal(err)
		}
		blocked := make(chan error, 1)
		go func() {
			_, err := s.Persist("b", 1, pattern("b", 3584))
			blocked <- err
		}()
		time.Sleep(20 * time.Millisecond)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-blocked; !errors.Is(err, ErrClosed) {
			t.Fatalf("waiting persist: %v", err)
		}
		pin.Release() // after Close: harmless
		if _, err := s.Persist("c", 1, []byte("x")); !errors.Is(err, ErrClosed) {
			t.Fatalf("persist after close: %v", err)
		}
		if err := s.LoadInto("a", 1, make([]byte, 3584), 3584); !errors.Is(err, ErrClosed) {
			t.Fatalf("load after close: %v", err)
		}
		if _, ok := <-s.Evictions(); ok {
			t.Fatal("evictions channel open after close")
		}
		if st := s.Stats(); st.Engine != kind || len(st.Devices) != 1 || st.Devices[0].Engine != kind {
			t.Fatalf("stats after close: %+v", st)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// committedBytes sums the on-disk size of the committed entries in the index: what
// Stats.UsedBytes must say.
func committedBytes(s *Storage) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, e := range s.index {
		if e.state == stateCommitted {
			n += e.size
		}
	}
	return n
}

// TestLoadStaged: a value of many chunks staged through two lent buffers, given back
// from another goroutine after each delivery, arrives byte-exact and in order with at
// most two buffers taken at once; a load whose buffers are never given back ends with
// its context, no IO left in flight.
func TestLoadStaged(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		const chunk, n = 8192, 10*8192 + 333
		s := openTest(t, kind, 64<<20, nil)
		want := pattern("staged", n)
		persist(t, s, "v", 3, want)
		sl := newTestSlots(2, chunk)
		got := make([]byte, n)
		var next int64
		err := s.LoadStaged(context.Background(), "v", 3, n, chunk, 4, sl, func(i int, off, k int64, buf []byte) error {
			if off != next || off != int64(i)*chunk {
				return fmt.Errorf("chunk %d at %d, want %d", i, off, next)
			}
			copy(got[off:], buf[:k])
			next += k
			go sl.give(i) // the consumer lets go later, elsewhere
			return nil
		})
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("LoadStaged: %v (equal %v)", err, bytes.Equal(got, want))
		}
		if p := sl.maxHeld(); p != 2 {
			t.Fatalf("%d buffers held at once, want 2 (both lent ones)", p)
		}

		stuck := newTestSlots(1, chunk)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err = s.LoadStaged(ctx, "v", 3, n, chunk, 4, stuck, func(int, int64, int64, []byte) error { return nil })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("LoadStaged with a buffer never given back: %v, want the context's deadline", err)
		}
	})
}

// TestStagedLoadWaitingForABufferHoldsNoReaderSlot: a staged load whose consumer has no
// buffer free gives its device's reader slot back while it waits, so a local load of the
// device queues behind no such wait (a review: a refill waited for the staged load's
// whole deadline).
func TestStagedLoadWaitingForABufferHoldsNoReaderSlot(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		const chunk, n = 8192, 4 * 8192
		s := openTest(t, kind, 64<<20, func(o *Options) { o.ReadInflight = 1 })
		persist(t, s, "a", 1, pattern("a", n))
		want := pattern("b", 5000)
		persist(t, s, "b", 1, want)
		stuck := newTestSlots(1, chunk) // one buffer, never given back
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		delivered := make(chan struct{})
		staged := make(chan error, 1)
		go func() {
			staged <- s.LoadStaged(ctx, "a", 1, n, chunk, 2, stuck, func(i int, _, _ int64, _ []byte) error {
				if i == 0 {
					close(delivered)
				}
				return nil
			})
		}()
		<-delivered // the staged load holds its one buffer and waits for another
		got := AllocAligned(AlignedLen(5000))
		loaded := make(chan error, 1)
		go func() { loaded <- s.LoadInto("b", 1, got, 5000) }()
		select {
		case err := <-loaded:
			if err != nil || !bytes.Equal(got[:5000], want) {
				t.Fatalf("LoadInto beside a staged load waiting for a buffer: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a load of the device waits behind a staged load waiting for a buffer")
		}
		cancel()
		if err := <-staged; !errors.Is(err, context.Canceled) {
			t.Fatalf("the staged load: %v, want its context's end", err)
		}
	})
}

// TestRewriteOfOverwrittenRecordNotReported: a committed record the ring overwrites
// just before its own put id is rewritten (the master's refresh; in one PersistMany
// run the record before it takes the old record's room, or another writer did an
// instant earlier) must not be reported evicted once the rewrite holds the key: the
// master knows records by key and put id only, and the report, delivered after the
// rewrite's commit (EvictionDelay later), made it drop the new record, which the
// owner kept (the page read back was lost to the tiers, and its record outlived a
// delete of the key that named no owner).
func TestRewriteOfOverwrittenRecordNotReported(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 4<<20, func(o *Options) { o.ShardsPerDevice = 1 })
		reported, waitReported := countEvictions(t, s)
		const page = 60000
		v := pattern("w", page)
		// The ring's length in records.
		persist(t, s, "k", 7, v)
		lap := 0
		for ; s.Contains("k", 7); lap++ {
			persist(t, s, fmt.Sprintf("fill-%03d", lap), 1, pattern("f", page))
		}
		// w is the ring's oldest record: x, the first of the run, takes its room, and w's
		// rewrite follows right behind.
		persist(t, s, "w", 3, v)
		for i := range lap - 1 {
			persist(t, s, fmt.Sprintf("own-%03d", i), 1, pattern("o", page))
		}
		if !s.Contains("w", 3) {
			t.Fatalf("w was overwritten before the run (a lap of %d records)", lap)
		}
		pins, errs := s.PersistMany([]PersistItem{{Key: "x", PutID: 1, Src: pattern("x", page)}, {Key: "w", PutID: 3, Src: v}})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("item %d: %v", i, err)
			}
			pins[i].Release()
		}
		dst := make([]byte, page)
		if err := s.LoadInto("w", 3, dst, page); err != nil || !bytes.Equal(dst, v) {
			t.Fatalf("w rewritten: %v", err)
		}
		// The run's w took own-000's room: once that is reported, so is anything
		// reported before it.
		waitReported(Eviction{Key: "own-000", PutID: 1})
		persist(t, s, "marker", 1, pattern("m", page))
		waitReported(Eviction{Key: "own-001", PutID: 1})
		if n := reported(Eviction{Key: "w", PutID: 3}); n != 0 || s.Stats().DroppedEvictions != 0 {
			t.Fatalf("w reported evicted %d times while its rewrite lives (%d reports dropped)", n, s.Stats().DroppedEvictions)
		}
	})
}

// countEvictions reads s's eviction reports for the test: reported(ev) is how many times
// ev was reported so far, waitReported(ev) waits (up to 10 s) until it was.
func countEvictions(t *testing.T, s *Storage) (reported func(Eviction) int, waitReported func(Eviction)) {
	var mu sync.Mutex
	reports := map[Eviction]int{}
	go func() {
		for b := range s.Evictions() {
			mu.Lock()
			for _, ev := range b {
				ev.Seq = 0 // counted by key and put id
				reports[ev]++
			}
			mu.Unlock()
		}
	}()
	reported = func(ev Eviction) int {
		mu.Lock()
		defer mu.Unlock()
		return reports[ev]
	}
	waitReported = func(ev Eviction) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); reported(ev) == 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%+v never reported evicted", ev)
			}
		}
	}
	return reported, waitReported
}

// TestStagedLoadWaitingForABufferLetsWritersPass: a staged load whose consumer holds
// every buffer (a remote reader that pulls slowly, or died) waits without its read pin:
// the ring's writers overwrite the entry instead of waiting BusyWait for it and failing
// ErrBusy, and the load then ends with ErrNotFound, not with bytes of another record.
func TestStagedLoadWaitingForABufferLetsWritersPass(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 4<<20, func(o *Options) {
			o.ShardsPerDevice = 1
			o.BusyWait = 300 * time.Millisecond
		})
		const chunk, n = 8192, 10 * 8192
		persist(t, s, "v", 3, pattern("v", n))
		stuck := newTestSlots(1, chunk) // its one buffer is never given back
		waiting := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- s.LoadStaged(context.Background(), "v", 3, n, chunk, 4, stuck, func(i int, _, _ int64, _ []byte) error {
				if i == 0 {
					close(waiting)
				}
				return nil
			})
		}()
		<-waiting
		for i := range 80 { // 5 MiB through a 4 MiB ring: over v's range
			pin, err := s.Persist(fmt.Sprintf("w%d", i), 1, pattern("w", 64<<10))
			if err != nil {
				t.Fatalf("persist %d while a staged load of an entry in its way waits for a buffer: %v", i, err)
			}
			pin.Release()
		}
		if s.Contains("v", 3) {
			t.Fatal("the ring did not pass over v")
		}
		stuck.give(0)
		if err := <-done; !errors.Is(err, ErrNotFound) {
			t.Fatalf("the load of the overwritten entry: %v, want ErrNotFound", err)
		}
	})
}

// TestStagedLoadAcrossARefresh: a staged load waiting for a buffer (without its read pin)
// while the master's refresh rewrites its record (same key and put id) goes on reading
// the superseded record, whose bytes are the version's until the tail passes them; it
// failed ErrNotFound, and the requester then dropped the version's only SSD copy. A
// forget of the version meanwhile still fails the load.
func TestStagedLoadAcrossARefresh(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		for _, forget := range []bool{false, true} {
			t.Run(fmt.Sprintf("forgotten=%t", forget), func(t *testing.T) {
				checkLeaks(t)
				s := openTest(t, kind, 4<<20, func(o *Options) { o.ShardsPerDevice = 1 })
				const chunk, n = 8192, 10 * 8192
				want := pattern("v", n)
				persist(t, s, "v", 3, want)
				slots := newTestSlots(1, chunk)
				waiting := make(chan struct{})
				done := make(chan error, 1)
				got := make([]byte, 0, n)
				go func() {
					done <- s.LoadStaged(context.Background(), "v", 3, n, chunk, 4, slots, func(i int, _, _ int64, buf []byte) error {
						got = append(got, buf...)
						if i == 0 {
							close(waiting)
						} else {
							slots.give(i)
						}
						return nil
					})
				}()
				<-waiting                   // chunk 0's buffer is out: the load waits without its pin
				persist(t, s, "v", 3, want) // the refresh
				if forget && !s.Forget("v", 3) {
					t.Fatal("nothing to forget")
				}
				slots.give(0)
				err := <-done
				if forget {
					if !errors.Is(err, ErrNotFound) {
						t.Fatalf("the load of a forgotten version: %v, want ErrNotFound", err)
					}
					return
				}
				if err != nil {
					t.Fatalf("the load across a refresh of its record: %v", err)
				}
				if !bytes.Equal(got, want) {
					t.Fatal("wrong bytes")
				}
			})
		}
	})
}

// passTail writes fillers of 8 KiB until the ring's tail passed e (key's record before a
// rewrite of its version) but not the rewrite: the version is still stored, elsewhere.
func passTail(t *testing.T, s *Storage, key string, putID int64, e *entry) {
	t.Helper()
	for i := 0; ; i++ {
		s.mu.Lock()
		passed := e.shard.ring.overtaken(e)
		s.mu.Unlock()
		if passed {
			break
		}
		if i == 10000 {
			t.Fatal("the tail never passed the record")
		}
		persist(t, s, fmt.Sprintf("filler/%d", i), 1, pattern("f", 8192))
	}
	if !s.Contains(key, putID) {
		t.Fatal("the tail passed the rewrite too")
	}
}

// stalledStagedLoad starts a staged load of key's putID (n bytes in chunks of chunk, one
// buffer) and returns once chunk 0 is delivered and its buffer kept: the load then waits
// for a buffer (slots.give(0) lets it go on) without its read pin. Its error comes on done.
func stalledStagedLoad(s *Storage, key string, putID, n, chunk int64) (slots *testSlots, done chan error) {
	slots = newTestSlots(1, chunk)
	waiting := make(chan struct{})
	done = make(chan error, 1)
	go func() {
		done <- s.LoadStaged(context.Background(), key, putID, n, chunk, 4, slots, func(i int, _, _ int64, _ []byte) error {
			if i == 0 {
				close(waiting)
			} else {
				slots.give(i)
			}
			return nil
		})
	}()
	<-waiting
	return slots, done
}

// TestStagedLoadOvertakenAcrossARefresh: a staged load waiting for a buffer while the
// refresh rewrites its record and the tail then passes the record it began fails
// ErrMoved, not ErrNotFound (its caller dropped the version's SSD replica, the rewrite
// in the index with it), and a load again reads the rewrite.
func TestStagedLoadOvertakenAcrossARefresh(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 4<<20, func(o *Options) { o.ShardsPerDevice = 1 })
		const chunk, n = 8192, 10 * 8192
		want := pattern("v", n)
		persist(t, s, "v", 3, want)
		s.mu.Lock()
		first := s.index["v"]
		s.mu.Unlock()
		// Chunk 0's buffer is out: the load waits without its pin while the refresh rewrites.
		slots, done := stalledStagedLoad(s, "v", 3, n, chunk)
		persist(t, s, "v", 3, want)
		passTail(t, s, "v", 3, first)
		slots.give(0)
		if err := <-done; !errors.Is(err, ErrMoved) {
			t.Fatalf("the staged load whose record the tail passed after a refresh: %v, want ErrMoved", err)
		}
		got := make([]byte, AlignedLen(n))
		if err := s.LoadInto("v", 3, got, n); err != nil || !bytes.Equal(got[:n], want) {
			t.Fatalf("the load again: %v (bytes equal %v)", err, err == nil && bytes.Equal(got[:n], want))
		}
	})
}

// TestQueuedLoadReadsTheRewrite: a load waiting for its device's reader queue while the
// refresh rewrites its record and the tail passes the one it found reads the rewrite
// (it failed ErrNotFound, and the owner dropped the replica).
func TestQueuedLoadReadsTheRewrite(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 4<<20, func(o *Options) { o.ShardsPerDevice = 1; o.ReadInflight = 1 })
		const chunk, n = 8192, 10 * 8192
		want, other := pattern("v", n), pattern("w", n)
		persist(t, s, "v", 3, want)
		persist(t, s, "w", 1, other)
		s.mu.Lock()
		first := s.index["v"]
		s.mu.Unlock()
		// A staged load of w holds the device's one reader place while it waits for a buffer.
		slots, staged := stalledStagedLoad(s, "w", 1, n, chunk)
		got := make([]byte, AlignedLen(n))
		queued := make(chan error, 1)
		go func() { queued <- s.LoadInto("v", 3, got, n) }()
		// The load of v found its record and waits for the reader place (if this sleep
		// is too short on a busy machine, it finds the rewrite and the test proves less).
		time.Sleep(200 * time.Millisecond)
		persist(t, s, "v", 3, want) // the refresh
		passTail(t, s, "v", 3, first)
		slots.give(0)
		if err := <-staged; err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatalf("the staged load of w: %v", err)
		}
		if err := <-queued; err != nil || !bytes.Equal(got[:n], want) {
			t.Fatalf("the queued load of v across a refresh: %v (bytes equal %v)", err, err == nil && bytes.Equal(got[:n], want))
		}
	})
}

// TestMaxValueBytes: the largest value the master is told a ring holds fits one under
// the longest key, and one byte more does not.
func TestMaxValueBytes(t *testing.T) {
	s := openTest(t, EnginePsync, 4<<20, func(o *Options) { o.ShardsPerDevice = 2 })
	most := s.MaxValueBytes()
	if most <= 0 || most >= s.Stats().CapacityBytes {
		t.Fatalf("MaxValueBytes %d of a %d-byte tier in two rings", most, s.Stats().CapacityBytes)
	}
	key := strings.Repeat("k", MaxRecordKey)
	persist(t, s, key, 1, pattern("m", most))
	if pin, err := s.Persist(key, 2, pattern("m", most+1)); err == nil {
		pin.Release()
		t.Fatalf("a value of MaxValueBytes+1 (%d) was persisted", most+1)
	}
}

// TestLoadWhileARefreshWrites: a load that comes while the master's refresh is writing
// its version again reads the record the rewrite replaces (its bytes are the
// version's); it failed ErrNotFound, and the requester dropped the version's SSD copy.
func TestLoadWhileARefreshWrites(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		s := openTest(t, kind, 4<<20, func(o *Options) { o.ShardsPerDevice = 1 })
		const n = 10 * 8192
		want := pattern("v", n)
		persist(t, s, "v", 3, want)
		rec := headerSize(1) + alignUp(n)
		d, err := s.pickDevice(rec)
		if err != nil {
			t.Fatal(err)
		}
		e, _, err := s.reserve(d, nil, "v", 3, n, rec) // the refresh, still writing
		if err != nil {
			t.Fatal(err)
		}
		s.mu.Unlock()
		got := make([]byte, n)
		lerr := s.LoadInto("v", 3, got, n)
		s.mu.Lock()
		s.dropLocked(e)
		e.shard.ring.abort(e)
		s.mu.Unlock()
		if lerr != nil {
			t.Fatalf("load while the refresh writes: %v", lerr)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("wrong bytes")
		}
	})
}

// TestRecordNumbers: every record gets a number of its own, a rewrite of the same
// version a higher one, and listings and evictions carry it.
func TestRecordNumbers(t *testing.T) {
	s := openTest(t, EnginePsync, 8192, nil) // two 4 KiB records fit
	first, err := s.Persist("k", 1, pattern("k", 3584))
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	again, err := s.Persist("k", 1, pattern("k", 3584)) // a refresh
	if err != nil {
		t.Fatal(err)
	}
	again.Release()
	if first.Seq() <= 0 || again.Seq() <= first.Seq() {
		t.Fatalf("record numbers %d, then %d for the rewrite: want increasing", first.Seq(), again.Seq())
	}
	if es := s.Committed(); len(es) != 1 || es[0].Seq != again.Seq() {
		t.Fatalf("Committed() = %+v, want the rewrite's number %d", es, again.Seq())
	}
	for i := range 3 { // overwrite k's record
		persist(t, s, fmt.Sprint(i), 1, pattern("x", 3584))
	}
	select {
	case b := <-s.Evictions():
		if b[0].Key != "k" || b[0].Seq != again.Seq() {
			t.Fatalf("eviction %+v, want k's record %d", b[0], again.Seq())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no eviction")
	}
}

// TestForgetRecord: forgetting a record by its number leaves a rewrite of the version
// since, and forgets the record itself.
func TestForgetRecord(t *testing.T) {
	s := openTest(t, EnginePsync, 1<<20, nil)
	old, err := s.Persist("k", 1, pattern("k", 3000))
	if err != nil {
		t.Fatal(err)
	}
	old.Release()
	persist(t, s, "k", 1, pattern("k", 3000)) // a rewrite
	if s.ForgetRecord("k", old.Seq()) || !s.Contains("k", 1) {
		t.Fatal("forgetting the replaced record dropped its rewrite")
	}
	es := s.Committed()
	if len(es) != 1 || !s.ForgetRecord("k", es[0].Seq) || s.Contains("k", 1) {
		t.Fatal("the rewrite's own number did not forget it")
	}
}
