package ssd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunBench(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		dir := directDir(t)
		// Operations are counted, not timed: 300 writes of 64 KiB records wrap an 8 MiB
		// ring more than twice however slow the machine; the deadline only bounds a
		// hang.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		const writes, reads = 300, 100
		res, err := RunBench(ctx, BenchOptions{Dir: dir, Size: 64<<10 + 100, Seconds: 600, Writes: writes, Reads: reads,
			Engine: kind, Depth: 4, Limit: 8 << 20, Progress: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		if res.Engine != kind || !res.ODirect || res.Writes != writes || res.Reads != reads || res.ReadsUnverified != reads ||
			res.ReadGiBs <= 0 || res.ReadUnverifiedGiBs <= 0 || res.WriteGiBs <= 0 || res.ReadP99us < res.ReadP50us ||
			res.ReadMisses != 0 || res.ReadUnverifiedMisses != 0 || res.Evictions < writes-int64(res.ReadSetKeys) ||
			res.ReadSetKeys == 0 || res.Evictions+int64(res.ReadSetKeys) != writes || len(res.ReadModes) != 3 {
			t.Fatalf("result %+v", res)
		}
		for _, m := range res.ReadModes {
			if m.Reads != reads || m.Misses != 0 || m.GiBs <= 0 || m.P99us < m.P50us {
				t.Fatalf("read mode %+v", m)
			}
		}
		js, _ := json.Marshal(res)
		for _, k := range []string{`"engine"`, `"depth"`, `"o_direct"`, `"write_gib_s"`, `"read_gib_s"`, `"read_p50_us"`, `"read_p99_us"`,
			`"read_unverified_gib_s"`} {
			if !strings.Contains(string(js), k) {
				t.Fatalf("json %s lacks %s", js, k)
			}
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
			t.Fatalf("bench left %v", left)
		}
	})
}

func TestRunBenchRefusesWithoutODirect(t *testing.T) {
	if _, err := RunBench(context.Background(), BenchOptions{Dir: filepath.Join(os.TempDir(), "does-not-exist-fluxkv"), Progress: io.Discard}); err == nil ||
		!strings.Contains(err.Error(), "O_DIRECT") {
		t.Fatalf("missing dir: %v", err)
	}
}

// BenchmarkLoad reads one resident value again and again into aligned memory in each
// read mode: the record header as a separate IO, in one READV with the first chunk,
// and unverified. Compare the modes' MB/s within one run.
func BenchmarkLoad(b *testing.B) {
	for _, size := range []int64{1 << 20, 4 << 20} {
		for _, mode := range []struct {
			name        string
			skip, readv bool
		}{{"header-io", false, false}, {"readv", false, true}, {"unverified", true, false}} {
			b.Run(fmt.Sprintf("%s/%s", FormatSize(size), mode.name), func(b *testing.B) {
				dir, buffered := storageDir(b)
				s, err := Open(Options{Cluster: "b", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{64 << 20},
					BufferedIO: buffered, SkipVerify: mode.skip, separateHeaderRead: !mode.readv})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				pin, err := s.Persist("key", 1, pattern("v", size))
				if err != nil {
					b.Fatal(err)
				}
				pin.Release()
				dst := AllocAligned(size)
				b.SetBytes(size)
				for b.Loop() {
					if err := s.LoadInto("key", 1, dst, size); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPersist persists 1 MiB values from 16 callers with the engine at depth 8
// (as `fluxkv bench ssd` does), with records placed on the file system's blocks (the
// default) and on 512-byte sectors: on ext4 and xfs the unaligned writes of the
// latter are serialized per shard file (see placementAlign). Compare the MB/s of the
// two within one run.
func BenchmarkPersist(b *testing.B) {
	const size, callers = 1 << 20, 16
	for _, mode := range []struct {
		name  string
		align int64
	}{{"fs-block", 0}, {"sector", Align}} {
		b.Run(mode.name, func(b *testing.B) {
			dir := directDir(b)
			s, err := Open(Options{Cluster: "b", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{1 << 30},
				IODepth: 8, WriteInflight: callers, blockAlign: mode.align})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			go func() {
				for range s.Evictions() {
				}
			}()
			src := pattern("v", size)
			var next atomic.Int64
			b.SetBytes(size)
			b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					pin, err := s.Persist(fmt.Sprint("k", next.Add(1)), 1, src)
					if err != nil {
						b.Error(err)
						return
					}
					pin.Release()
				}
			})
		})
	}
}
