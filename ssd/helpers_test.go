package ssd

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain fails the run if any goroutine of this package outlives the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := waitNoPackageGoroutines(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines of package ssd leaked:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// packageGoroutines returns the stacks of goroutines running code of this package
// (engines, batchers, workers), excluding tests and the caller.
func packageGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "fluxkv/ssd.") && !strings.Contains(g, "_test.go") &&
			!strings.Contains(g, "ssd.packageGoroutines") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

func waitNoPackageGoroutines(d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		leaked := packageGoroutines()
		if leaked == "" || time.Now().After(deadline) {
			return leaked
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkLeaks fails t if, after its cleanups, more goroutines run than before it.
// Register it first so that it runs last.
func checkLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Errorf("goroutines: %d before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
}

var (
	directBaseOnce sync.Once
	directBase     string // a directory on a file system that supports O_DIRECT, or ""
	directWhy      []string
)

// findDirectBase picks where O_DIRECT tests put their files: $FLUXKV_SSD_TEST_DIR,
// the system temp dir (tmpfs on some machines: no O_DIRECT), else the package
// directory's file system.
func findDirectBase() string {
	directBaseOnce.Do(func() {
		wd, _ := os.Getwd()
		for _, c := range []string{os.Getenv("FLUXKV_SSD_TEST_DIR"), os.TempDir(), wd} {
			if c == "" {
				continue
			}
			if err := ProbeDirectIO(c); err != nil {
				directWhy = append(directWhy, err.Error())
				continue
			}
			directBase = c
			return
		}
	})
	return directBase
}

// directDir returns a fresh directory that supports O_DIRECT, or skips the test.
func directDir(t testing.TB) string {
	t.Helper()
	base := findDirectBase()
	if base == "" {
		t.Skipf("no directory supports O_DIRECT (set FLUXKV_SSD_TEST_DIR): %v", directWhy)
	}
	dir, err := os.MkdirTemp(base, "fluxkv-ssd-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// storageDir returns a directory for storage tests and whether it needs BufferedIO:
// an O_DIRECT directory when there is one, else t.TempDir() with buffered IO (the
// O_DIRECT-specific assertions skip themselves).
func storageDir(t testing.TB) (dir string, buffered bool) {
	t.Helper()
	if findDirectBase() != "" {
		return directDir(t), false
	}
	t.Logf("no O_DIRECT directory (%v): using buffered IO", directWhy)
	return t.TempDir(), true
}

// engineKinds is the table every engine test runs over.
var engineKinds = []string{EngineUring, EnginePsync}

// forEachEngine runs f once per engine kind; the uring case skips with the reason
// when io_uring cannot be set up here.
func forEachEngine(t *testing.T, f func(t *testing.T, kind string)) {
	for _, kind := range engineKinds {
		t.Run(kind, func(t *testing.T) {
			if kind == EngineUring {
				if err := UringAvailable(); err != nil {
					t.Skipf("io_uring unavailable here: %v", err)
				}
			}
			f(t, kind)
		})
	}
}

// openTest opens a storage with one root in a fresh directory; tweak may adjust the
// options. It is closed at cleanup.
func openTest(t *testing.T, kind string, limit int64, tweak func(*Options)) *Storage {
	t.Helper()
	dir, buffered := storageDir(t)
	opts := Options{
		Cluster:     "test",
		InstanceKey: "node/1",
		Paths:       []string{dir},
		Limits:      []int64{limit},
		Engine:      kind,
		BufferedIO:  buffered,
	}
	if tweak != nil {
		tweak(&opts)
	}
	s, err := Open(opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// recordSpan is the ring space a lone persist of key with an n-byte value takes on s's
// first device: its record (header and padded value) and the pad behind it to the
// device's placement unit (the file system's block).
func recordSpan(s *Storage, key string, n int64) int64 {
	return s.devices[0].span(recordSize(key, n))
}

// recordSize is the record of key with an n-byte value, its share of Stats.UsedBytes:
// header and value padded to Align (the pads behind runs are dead ring space).
func recordSize(key string, n int64) int64 {
	return headerSize(len(key)) + AlignedLen(n)
}

// pattern is a deterministic payload for (key, n) so reads can be checked byte for byte.
func pattern(seed string, n int64) []byte {
	b := make([]byte, n)
	var h uint32 = 2166136261
	for i := 0; i < len(seed); i++ {
		h = (h ^ uint32(seed[i])) * 16777619
	}
	for i := range b {
		h ^= h << 13
		h ^= h >> 17
		h ^= h << 5
		b[i] = byte(h)
	}
	return b
}

func shardFiles(t *testing.T, s *Storage) []string {
	t.Helper()
	var out []string
	for _, d := range s.devices {
		m, _ := filepath.Glob(filepath.Join(d.root, "shard-*.dat"))
		out = append(out, m...)
	}
	return out
}
