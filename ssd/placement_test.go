package ssd

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func TestPlacementAlignOf(t *testing.T) {
	for _, tc := range []struct{ bsize, want int64 }{
		{-1, Align}, {0, Align}, {100, Align}, {512, 512}, {1000, 512}, {1024, 1024}, {4096, 4096},
		{6000, 4096}, {65536, 65536}, {1 << 20, maxPlacementAlign},
	} {
		if got := placementAlignOf(tc.bsize); got != tc.want {
			t.Errorf("placementAlignOf(%d) = %d, want %d", tc.bsize, got, tc.want)
		}
	}
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if got := placementAlign(dir); got != placementAlignOf(int64(fs.Bsize)) {
		t.Fatalf("placementAlign(%s) = %d, file system blocks of %d", dir, got, fs.Bsize)
	}
	if got := placementAlign("/does/not/exist/fluxkv"); got != Align {
		t.Fatalf("placementAlign of a missing root = %d", got)
	}
}

// ioLog is a shard file opener that records every write an engine submits; the files
// are opened with open (nil: OpenOSFile), e.g. a Faults' OpenFile.
type ioLog struct {
	open   func(path string, flag int, perm os.FileMode) (File, error)
	mu     sync.Mutex // protects writes
	writes []loggedIO
}

// count is how many writes were submitted so far; reset forgets them.
func (l *ioLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.writes)
}

func (l *ioLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes = nil
}

type loggedIO struct {
	path     string
	off, len int64
}

func (l *ioLog) OpenFile(path string, flag int, perm os.FileMode) (File, error) {
	open := l.open
	if open == nil {
		open = OpenOSFile
	}
	f, err := open(path, flag, perm)
	if err != nil {
		return nil, err
	}
	return loggedFile{File: f, log: l}, nil
}

type loggedFile struct {
	File
	log *ioLog
}

func (f loggedFile) Shape(op Op, buf []byte, off int64) ([]byte, error) {
	if op == OpWrite {
		f.log.mu.Lock()
		f.log.writes = append(f.log.writes, loggedIO{f.Name(), off, int64(len(buf))})
		f.log.mu.Unlock()
	}
	return f.File.Shape(op, buf, off)
}

// TestRecordsOnFileSystemBlocks: every lone record starts on a file system block and
// every write the engines submit starts and ends on one (an unaligned direct write is
// serialized by ext4 and xfs, see placementAlign), across ring wraps, with the pad
// after a record zero on disk and the record read back verified; a ring smaller
// than a block falls back to 512-byte placement.
func TestRecordsOnFileSystemBlocks(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		dir := directDir(t)
		var log ioLog
		s, err := Open(Options{Cluster: "c", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{4<<20 + 1000},
			Engine: kind, ShardsPerDevice: 2, minShardSize: 1 << 20, OpenFile: log.OpenFile})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		go func() {
			for range s.Evictions() {
			}
		}()
		d := s.devices[0]
		if d.align != placementAlign(d.root) || d.align < Align || d.shardSize%d.align != 0 ||
			s.Stats().Devices[0].AlignBytes != d.align {
			t.Fatalf("device align %d (file system %d), shard %d bytes", d.align, placementAlign(d.root), d.shardSize)
		}
		t.Logf("records placed on %d-byte blocks", d.align)
		// 1 MiB + 512 is the record of a 1 MiB value: unaligned on 4 KiB blocks before.
		sizes := []int64{1 << 20, 1, 511, 3584, 4095, 200000, 1<<20 + 3}
		const persists = 24 // about 3 MiB a lap of sizes: the two 2 MiB rings wrap
		for i := range persists {
			n := sizes[i%len(sizes)]
			key := fmt.Sprintf("k%d-%s", i, strings.Repeat("x", (i%3)*300)) // 1 or 2 header sectors
			want := pattern(key, n)
			persist(t, s, key, 1, want)
			s.mu.Lock()
			e := s.index[key]
			s.mu.Unlock()
			off, rec := e.shard.fileOffset(e), headerSize(len(key))+AlignedLen(n)
			if e.begin%d.align != 0 || off%d.align != 0 || e.size != rec {
				t.Fatalf("%s: record of %d bytes at position %d (file offset %d), size %d", key, rec, e.begin, off, e.size)
			}
			if gap := readAt(t, e.shard.file.Name(), d.span(rec)-rec, off+rec); !bytes.Equal(gap, make([]byte, len(gap))) {
				t.Fatalf("%s: the %d bytes after the record are not zero", key, len(gap))
			}
			h, err := decodeHeader(readAt(t, e.shard.file.Name(), headerSize(len(key)), off))
			if err != nil || h.key != key || h.pos != e.begin || h.length != n {
				t.Fatalf("%s: header %+v, %v", key, h, err)
			}
			got := AllocAligned(n)
			if err := s.LoadInto(key, 1, got, n); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s: load: %v", key, err)
			}
		}
		if st := s.Stats(); st.UsedBytes != committedBytes(s) || st.Entries >= persists {
			t.Fatalf("used %d, committed %d, %d of %d entries left (the rings must have wrapped)", st.UsedBytes, committedBytes(s), st.Entries, persists)
		}
		log.mu.Lock()
		defer log.mu.Unlock()
		if len(log.writes) < persists {
			t.Fatalf("%d writes logged for %d persists", len(log.writes), persists)
		}
		for _, w := range log.writes {
			if w.off%d.align != 0 || w.len%d.align != 0 || w.off+w.len > d.shardSize {
				t.Fatalf("write of %d bytes at %d in %s: not on %d-byte blocks of a %d-byte shard", w.len, w.off, w.path, d.align, d.shardSize)
			}
		}
	})
}

func TestPlacementFallsBackForTinyRings(t *testing.T) {
	checkLeaks(t)
	// A 4 KiB limit under 8 KiB blocks: one 512-placed ring, not an empty one.
	s := openTest(t, EngineAuto, 4096, func(o *Options) { o.blockAlign = 8192 })
	if d := s.devices[0]; d.align != Align || d.shardSize != 4096 {
		t.Fatalf("align %d, shard %d", d.align, d.shardSize)
	}
	persist(t, s, "k", 1, pattern("k", 3584)) // exactly the ring
	if got := make([]byte, 3584); s.LoadInto("k", 1, got, 3584) != nil || !bytes.Equal(got, pattern("k", 3584)) {
		t.Fatal("tiny ring round trip")
	}
	// A limit that is no multiple of the block: shards are cut down to whole blocks.
	s = openTest(t, EngineAuto, 64<<10+3000, func(o *Options) { o.blockAlign = 8192 })
	if d := s.devices[0]; d.align != 8192 || d.shardSize != 64<<10 || s.Stats().CapacityBytes != 64<<10 {
		t.Fatalf("align %d, shard %d", d.align, d.shardSize)
	}
	for _, bad := range []int64{256, 1000, 4097} {
		o := Options{Cluster: "c", InstanceKey: "i", Paths: []string{t.TempDir()}, Limits: []int64{1 << 20}, blockAlign: bad}
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "block alignment") {
			t.Errorf("block alignment %d: %v", bad, err)
		}
	}
}
