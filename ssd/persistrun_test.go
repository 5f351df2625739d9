package ssd

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func manyItems(prefix string, n int, size int64, putID int64) []PersistItem {
	items := make([]PersistItem, n)
	for i := range items {
		key := fmt.Sprintf("%s-%d", prefix, i)
		items[i] = PersistItem{Key: key, PutID: putID, Src: pattern(key, size)}
	}
	return items
}

// checkPersisted releases the pins and checks each item's outcome: readable byte for
// byte where errs[i] is nil, absent where it is not.
func checkPersisted(t *testing.T, s *Storage, items []PersistItem, pins []CommitPin, errs []error) {
	t.Helper()
	for i, it := range items {
		pins[i].Release()
		got := make([]byte, len(it.Src))
		err := s.LoadInto(it.Key, it.PutID, got, int64(len(got)))
		if errs[i] != nil {
			if s.Contains(it.Key, it.PutID) || err == nil {
				t.Errorf("%s failed (%v) yet its entry is there (load: %v)", it.Key, errs[i], err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, it.Src) {
			t.Errorf("%s: load %v, bytes equal %v", it.Key, err, bytes.Equal(got, it.Src))
		}
	}
}

// KV pages persisted together go to disk as one write per run of at most
// PersistRunBytes, each record readable on its own, and count as used as single
// persists do.
func TestPersistManyWritesRuns(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		var wc ioLog
		s := openTest(t, kind, 16<<20, func(o *Options) { o.OpenFile = wc.OpenFile; o.ShardsPerDevice = 1 })
		const page = 60000
		span := recordSpan(s, "page-00", page)
		perRun := int(PersistRunBytes / span)
		items := manyItems("page", 2*perRun+3, page, 1) // two full runs and a short one
		pins, errs := s.PersistMany(items)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("item %d: %v", i, err)
			}
		}
		if w := wc.count(); w != 3 {
			t.Errorf("%d values (%d bytes on disk each) went in %d writes; want 3 runs of at most %d", len(items), span, w, perRun)
		}
		if got, want := s.Stats().UsedBytes, int64(len(items))*recordSize("page-00", page); got != want {
			t.Errorf("used %d bytes, want %d", got, want)
		}
		checkPersisted(t, s, items, pins, errs)
	})
}

// A run is cut where the ring wraps to the start of its file, where a newer version
// of a key is already stored (that item fails alone, ErrStale) and where a write fails
// (every item of that write fails; the others of the batch do not).
func TestPersistManyCutsRuns(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		var faults Faults
		wc := ioLog{open: faults.OpenFile}
		s := openTest(t, kind, 4<<20, func(o *Options) { o.OpenFile = wc.OpenFile; o.ShardsPerDevice = 1 })
		const page = 60000
		span := recordSpan(s, "fill-00", page)
		ringSize := s.devices[0].shardSize

		// Wrap: single persists leave room for two records before the end of the file.
		fill := int((ringSize - 2*span) / span)
		for i := range fill {
			persist(t, s, fmt.Sprintf("fill-%02d", i), 1, pattern("fill", page))
		}
		wc.reset()
		items := manyItems("wrap", 6, page, 1)
		pins, errs := s.PersistMany(items)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("wrap item %d: %v", i, err)
			}
		}
		if w := wc.count(); w != 2 {
			t.Errorf("6 values across the end of the ring went in %d writes; want 2 (2 before the end, 4 after)", w)
		}
		checkPersisted(t, s, items, pins, errs)

		// Stale: a newer version of stale-2 is stored; it fails, the others persist.
		persist(t, s, "stale-2", 9, pattern("stale-2", page))
		wc.reset()
		items = manyItems("stale", 5, page, 3)
		pins, errs = s.PersistMany(items)
		for i, err := range errs {
			if (i == 2) != errors.Is(err, ErrStale) || (i != 2 && err != nil) {
				t.Errorf("stale item %d: %v", i, err)
			}
		}
		if w := wc.count(); w != 2 {
			t.Errorf("5 values around a stale one went in %d writes; want 2", w)
		}
		items[2].PutID = 9 // the stored version stays readable
		errs[2] = nil
		checkPersisted(t, s, items, pins, errs)

		// A failed write fails its run's items only.
		span = recordSpan(s, "fault-00", page)
		perRun := int(PersistRunBytes / span)
		faults.Fail(OpWrite, unix.EIO, 1)
		items = manyItems("fault", perRun+2, page, 1)
		pins, errs = s.PersistMany(items)
		for i, err := range errs {
			if (i < perRun) != errors.Is(err, unix.EIO) || (i >= perRun && err != nil) {
				t.Errorf("fault item %d: %v", i, err)
			}
		}
		checkPersisted(t, s, items, pins, errs)
	})
}

// PersistMany batches racing single persists and Forgets of the same keys: every
// entry left readable holds the bytes of its version.
func TestPersistManyConcurrent(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 8<<20, nil)
		const keys, page = 24, 20000
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for round := range 6 {
					putID := int64(round*4 + g + 1)
					if g == 3 {
						for k := range keys {
							key := fmt.Sprintf("c-%d", k)
							if pin, err := s.Persist(key, putID, pattern(fmt.Sprint(key, putID), page)); err == nil {
								pin.Release()
							}
							s.Forget(key, putID-2)
						}
						continue
					}
					items := make([]PersistItem, keys)
					for k := range items {
						key := fmt.Sprintf("c-%d", k)
						items[k] = PersistItem{Key: key, PutID: putID, Src: pattern(fmt.Sprint(key, putID), page)}
					}
					pins, _ := s.PersistMany(items)
					for _, p := range pins {
						p.Release()
					}
				}
			})
		}
		wg.Wait()
		for _, e := range s.Committed() {
			got := make([]byte, page)
			if err := s.LoadInto(e.Key, e.PutID, got, page); err != nil {
				t.Errorf("%s@%d listed committed: %v", e.Key, e.PutID, err)
			} else if !bytes.Equal(got, pattern(fmt.Sprint(e.Key, e.PutID), page)) {
				t.Errorf("%s@%d: wrong bytes", e.Key, e.PutID)
			}
		}
	})
}

// A run whose records reach the end of the file exactly is cut there: the records
// after it go to offset 0 with a write of their own, not past the file's end.
func TestPersistManyRunEndsAtFileEnd(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		s := openTest(t, kind, 64<<10, func(o *Options) { o.ShardsPerDevice = 1 })
		const size = 3000
		span := recordSpan(s, "a0", size)
		ringSize := s.devices[0].shardSize
		if ringSize%span != 0 {
			t.Skipf("ring of %d bytes is not a whole number of %d-byte records here", ringSize, span)
		}
		for i := range int(ringSize/span) - 4 {
			persist(t, s, fmt.Sprintf("f%d", i), 1, pattern("f", size))
		}
		items := manyItems("a", 8, size, 1)
		pins, errs := s.PersistMany(items)
		checkPersisted(t, s, items, pins, errs)
		for i, err := range errs {
			if err != nil {
				t.Errorf("item %d: %v", i, err)
			}
		}
	})
}

// A run's write stays within PersistRunBytes whatever the device's block (the review
// of stop 45: runs were grouped by 512-byte spans): on 8 KiB blocks a 64 KiB KV page's
// record spans 72 KiB, fourteen to a write.
func TestPersistManyRunOfPages(t *testing.T) {
	checkLeaks(t)
	var wc ioLog
	s := openTest(t, EngineAuto, 8<<20, func(o *Options) { o.OpenFile = wc.OpenFile; o.ShardsPerDevice = 1; o.blockAlign = 8192 })
	const page = 64 << 10
	span := recordSpan(s, "page-00", page)
	items := manyItems("page", 32, page, 1)
	pins, errs := s.PersistMany(items)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	wc.mu.Lock()
	writes := append([]loggedIO(nil), wc.writes...)
	wc.mu.Unlock()
	perRun := PersistRunBytes / span // 14
	if want := (32 + perRun - 1) / perRun; int64(len(writes)) != want {
		t.Errorf("32 pages of 64 KiB went in %d writes, want %d of at most %d records", len(writes), want, perRun)
	}
	for _, w := range writes {
		if w.len > PersistRunBytes || w.off%8192 != 0 || w.len%8192 != 0 {
			t.Errorf("a write of %d bytes at %d, want whole 8 KiB blocks within %d", w.len, w.off, PersistRunBytes)
		}
	}
	checkPersisted(t, s, items, pins, errs)
}

// A run goes to the device picked for its first record; a record too large for that
// device's files goes, with the records after it, to a device that takes it instead
// of failing.
func TestPersistManyRecordTooLargeForRunDevice(t *testing.T) {
	checkLeaks(t)
	a, buffered := storageDir(t)
	b := t.TempDir()
	ids := map[string]uint64{}
	s, err := Open(Options{Cluster: "c", InstanceKey: "i", Paths: []string{a, b}, Limits: []int64{256 << 10, 4 << 20},
		ShardsPerDevice: 1, BufferedIO: buffered, devOf: func(root string) (uint64, error) {
			if _, ok := ids[root]; !ok {
				ids[root] = uint64(len(ids) + 1)
			}
			return ids[root], nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if s.devices[0].shardSize >= 512<<10 || s.devices[1].shardSize < 1<<20 {
		t.Fatalf("shards of %d and %d bytes", s.devices[0].shardSize, s.devices[1].shardSize)
	}
	items := []PersistItem{
		{Key: "small-0", PutID: 1, Src: pattern("small-0", 4000)}, // the run's first: device 0 (round robin starts there)
		{Key: "big", PutID: 1, Src: pattern("big", 512<<10)},      // only device 1's files take it
		{Key: "small-1", PutID: 1, Src: pattern("small-1", 4000)},
	}
	pins, errs := s.PersistMany(items)
	for i, err := range errs {
		if err != nil {
			t.Errorf("item %d (%s): %v", i, items[i].Key, err)
		}
	}
	s.mu.Lock()
	for _, it := range items {
		if e := s.index[it.Key]; e != nil {
			t.Logf("%s on device %d", it.Key, e.shard.dev.id)
		}
	}
	if e := s.index["small-0"]; e == nil || e.shard.dev.id != 0 {
		t.Errorf("small-0 not on device 0")
	}
	if e := s.index["big"]; e == nil || e.shard.dev.id != 1 {
		t.Errorf("big not on device 1")
	}
	if e := s.index["small-1"]; e == nil || e.shard.dev.id != 1 {
		t.Errorf("small-1 not on device 1 with big, the record before it")
	}
	s.mu.Unlock()
	checkPersisted(t, s, items, pins, errs)
}

// The records of a write run follow each other at 512-byte granules, and one pad entry
// takes the run to the device's next block: on 8 KiB blocks a 64 KiB KV page's record
// is 64.5 KiB, not the 72 KiB it took padded alone. Every write still starts and ends
// on a block, the pad is zero on disk, nothing of it counts as used, and the ring
// holds that many more pages once it has wrapped.
func TestPersistManyPacksRecords(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		var wc ioLog
		s := openTest(t, kind, 8<<20, func(o *Options) { o.OpenFile = wc.OpenFile; o.ShardsPerDevice = 1; o.blockAlign = 8192 })
		go func() {
			for range s.Evictions() {
			}
		}()
		const page = 64 << 10
		rec := recordSize("page-000", page)
		items := manyItems("page", 14, page, 1) // one run
		pins, errs := s.PersistMany(items)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("item %d: %v", i, err)
			}
		}
		var prev *entry
		for _, it := range items {
			s.mu.Lock()
			e := s.index[it.Key]
			s.mu.Unlock()
			if e.size != rec || (prev != nil && e.begin != prev.begin+prev.size) {
				t.Fatalf("%s: %d bytes at %d, want %d right behind the record before", it.Key, e.size, e.begin, rec)
			}
			prev = e
		}
		end := prev.shard.fileOffset(prev) + prev.size
		if pad := readAt(t, prev.shard.file.Name(), 8192-end%8192, end); end%8192 == 0 || !bytes.Equal(pad, make([]byte, len(pad))) {
			t.Fatalf("the run ends at %d; its pad is not zero", end)
		}
		if u := s.Stats().UsedBytes; u != 14*rec {
			t.Errorf("used %d bytes, want 14 records of %d", u, rec)
		}
		checkPersisted(t, s, items, pins, errs)
		// Lap the 8 MiB ring with runs: it ends up holding more pages than records padded
		// one by one would fit.
		for round := range 12 {
			items := manyItems(fmt.Sprintf("lap%d", round), 14, page, 1)
			pins, errs := s.PersistMany(items)
			checkPersisted(t, s, items, pins, errs)
		}
		if padded := s.devices[0].shardSize / recordSpan(s, "lap0-00", page); int64(s.Stats().Entries) <= padded {
			t.Errorf("%d pages held, no more than the %d records padded one by one fit", s.Stats().Entries, padded)
		}
		wc.mu.Lock()
		defer wc.mu.Unlock()
		for _, w := range wc.writes {
			if w.off%8192 != 0 || w.len%8192 != 0 || w.len > PersistRunBytes {
				t.Errorf("a write of %d bytes at %d: not whole 8 KiB blocks within %d", w.len, w.off, PersistRunBytes)
			}
		}
	})
}

// Writers persisting at once on one device still write whole blocks only: a run's
// records and its pad are allocated under one hold of the lock, so no other writer's
// entry lands between them.
func TestConcurrentWritesOnBlocks(t *testing.T) {
	checkLeaks(t)
	var wc ioLog
	s := openTest(t, EngineAuto, 16<<20, func(o *Options) { o.OpenFile = wc.OpenFile; o.ShardsPerDevice = 4; o.blockAlign = 8192 })
	go func() {
		for range s.Evictions() {
		}
	}()
	const page = 60000 // records of 60.5 KiB: off a block each
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 40 {
				if g%2 == 0 {
					key := fmt.Sprintf("lone-%d-%d", g, i)
					if pin, err := s.Persist(key, 1, pattern(key, page)); err == nil {
						pin.Release()
					}
					continue
				}
				pins, _ := s.PersistMany(manyItems(fmt.Sprintf("run-%d-%d", g, i), 5, page, 1))
				for _, p := range pins {
					p.Release()
				}
			}
		})
	}
	wg.Wait()
	wc.mu.Lock()
	defer wc.mu.Unlock()
	off := 0
	for _, w := range wc.writes {
		if w.off%8192 != 0 || w.len%8192 != 0 {
			off++
		}
	}
	if off != 0 {
		t.Errorf("%d of %d writes off 8 KiB blocks", off, len(wc.writes))
	}
}

// A pad is written as zeros whatever the buffer holds behind the records it follows
// (a cut run: the next record's bytes) and whatever the ring held there before (a
// second lap), and the committed entries its allocation overwrites are reported
// evicted like any others.
func TestPadsAreZeroAndEvict(t *testing.T) {
	checkLeaks(t)
	open := func() (*Storage, chan [][]Eviction) {
		dir, buffered := storageDir(t)
		s, err := Open(Options{Cluster: "c", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{64 << 10},
			ShardsPerDevice: 1, BufferedIO: buffered, EvictionDelay: time.Hour, blockAlign: 8192})
		if err != nil {
			t.Fatal(err)
		}
		return s, collect(s)
	}
	const rec = 3584 // a record: 512-byte header and a 3,072-byte value
	value := func(key string) int64 { return rec - headerSize(len(key)) }

	// A lap of 8 KiB records, then six more: the head at 48 KiB, the ring's last 16 KiB
	// still holding the first lap's bytes. A run of six records: four fit before the
	// file's end (ending at 63,488, off a block), the fifth wraps, so the first write's
	// pad covers the fifth record's bytes in the buffer.
	s, _ := open()
	sh := s.devices[0].shards[0]
	for i := range 14 {
		key := fmt.Sprintf("b%02d", i)
		persist(t, s, key, 1, pattern(key, 8192-headerSize(len(key))))
	}
	items := manyItems("r", 6, value("r-0"), 1)
	pins, errs := s.PersistMany(items)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	checkPersisted(t, s, items, pins, errs)
	const end = 6*8192 + 4*rec
	if pad := readAt(t, sh.file.Name(), 8*8192-end, end); !bytes.Equal(pad, make([]byte, len(pad))) {
		t.Fatalf("the pad at %d..%d is not zero", end, 8*8192)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// A packed lap (18 records and a 1 KiB pad fill the 64 KiB ring), then a lone
	// record at offset 0: it overwrites q00, and its pad to 8 KiB q01 and q02.
	s, got := open()
	items = manyItems("q", 18, value("q-00"), 1)
	pins, errs = s.PersistMany(items)
	checkPersisted(t, s, items, pins, errs)
	persist(t, s, "lone", 1, pattern("lone", value("lone")))
	if st := s.Stats(); st.Entries != 16 || st.UsedBytes != 16*rec {
		t.Errorf("%d entries, %d bytes used; want 16 and %d", st.Entries, st.UsedBytes, 16*rec)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var evicted []string
	for _, b := range <-got {
		for _, ev := range b {
			evicted = append(evicted, ev.Key)
		}
	}
	if want := []string{"q-0", "q-1", "q-2"}; !slices.Equal(evicted, want) {
		t.Errorf("evictions reported %v, want %v", evicted, want)
	}
}

// TestPersistManyOwnPinsFailFast: a PersistMany whose items take more than a ring
// must overwrite the call's own earlier records, which stay commit-pinned until it
// returns. Those items fail with ErrBusy at once: they waited the full BusyWait each
// (30 s by default), one after the other, for room that cannot come back during the
// call. The same items persisted one by one (Persist, then Release) all succeed.
func TestPersistManyOwnPinsFailFast(t *testing.T) {
	checkLeaks(t)
	const busyWait = 2 * time.Second // the call takes milliseconds; waiting once is the bug
	s := openTest(t, EnginePsync, 16<<10, func(o *Options) {
		o.ShardsPerDevice = 1
		o.blockAlign = Align
		o.BusyWait = busyWait
	})
	go func() {
		for range s.Evictions() {
		}
	}()
	items := manyItems("p", 10, 3000, 1) // 3.5 KiB records: 4 fit the 16 KiB ring
	start := time.Now()
	pins, errs := s.PersistMany(items)
	took := time.Since(start)
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if !errors.Is(err, ErrBusy) {
				t.Errorf("item %d: %v, want ErrBusy", i, err)
			}
		}
		pins[i].Release()
	}
	if failed != 6 {
		t.Errorf("%d of 10 items failed, want 6 (4 fit the ring)", failed)
	}
	if took > busyWait {
		t.Errorf("PersistMany of %d items into a ring of 4: %d failed, took %v (BusyWait %v)", len(items), failed, took, busyWait)
	}
	// The same items one by one all succeed at once.
	start = time.Now()
	for _, it := range manyItems("q", 10, 3000, 1) {
		pin, err := s.Persist(it.Key, it.PutID, it.Src)
		if err != nil {
			t.Errorf("Persist %s: %v", it.Key, err)
		}
		pin.Release()
	}
	t.Logf("one by one: %v", time.Since(start))
}
