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
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// BenchOptions configures RunBench. Zero fields take the defaults beside them.
type BenchOptions struct {
	// Dir is where the benchmark's cache root goes; it must support O_DIRECT. The
	// root is removed afterwards. Required.
	Dir string
	// Size is the value size in bytes. Default 1 MiB.
	Size int64
	// Seconds is the length of each phase (write, then read). Default 10.
	Seconds float64
	// Engine is EngineUring (default) or EnginePsync.
	Engine string
	// Depth is the engine's io depth: the IOs kept in flight on the device. Default 8.
	Depth int
	// Callers is the number of concurrent callers. Default 2 × Depth, so that a
	// caller's copy into its aligned buffer overlaps the others' IO and the device
	// really sees Depth IOs in flight (fio's iodepth has no such copy).
	Callers int
	// Limit is the ring space (one device). Default 2 GiB.
	Limit int64
	// Progress receives a line per second; default os.Stderr, io.Discard for none.
	Progress io.Writer
}

// checkValue compares a loaded value with its source: fully when full is set (one
// load in 16), else its first and last 512 bytes, to keep the CPU on the IO path.
func checkValue(got, want []byte, full bool) bool {
	if full || len(got) <= 1024 {
		return bytes.Equal(got, want)
	}
	return bytes.Equal(got[:512], want[:512]) && bytes.Equal(got[len(got)-512:], want[len(want)-512:])
}

// BenchResult is what RunBench measured. Bandwidths count real value bytes.
type BenchResult struct {
	Engine      string  `json:"engine"`
	Depth       int     `json:"depth"`
	Callers     int     `json:"callers"`
	ODirect     bool    `json:"o_direct"`
	Dir         string  `json:"dir"`
	ValueBytes  int64   `json:"value_bytes"`
	LimitBytes  int64   `json:"limit_bytes"`
	Seconds     float64 `json:"seconds"`
	Writes      int64   `json:"writes"`
	WriteGiBs   float64 `json:"write_gib_s"`
	WriteP50us  float64 `json:"write_p50_us"`
	WriteP99us  float64 `json:"write_p99_us"`
	Evictions   int64   `json:"evictions"`
	ReadSetKeys int     `json:"read_set_keys"`
	Reads       int64   `json:"reads"`
	ReadMisses  int64   `json:"read_misses"`
	ReadGiBs    float64 `json:"read_gib_s"`
	ReadP50us   float64 `json:"read_p50_us"`
	ReadP99us   float64 `json:"read_p99_us"`
}

func (o *BenchOptions) setDefaults() {
	if o.Size == 0 {
		o.Size = 1 << 20
	}
	if o.Seconds == 0 {
		o.Seconds = 10
	}
	if o.Engine == "" {
		o.Engine = EngineUring
	}
	if o.Depth == 0 {
		o.Depth = 8
	}
	if o.Callers == 0 {
		o.Callers = 2 * o.Depth
	}
	if o.Limit == 0 {
		o.Limit = 2 << 30
	}
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
}

// RunBench measures the storage on one directory: Depth callers persist random
// values of Size bytes for Seconds (the ring wraps and evicts as in production),
// then Depth callers load random resident values into aligned memory for Seconds.
// Every load is checked against the value's source bytes (fully one in 16, else
// its ends). It refuses directories
// without O_DIRECT.
func RunBench(ctx context.Context, o BenchOptions) (BenchResult, error) {
	o.setDefaults()
	if o.Dir == "" {
		return BenchResult{}, errors.New("ssd bench: no directory")
	}
	if o.Size <= 0 || o.Seconds <= 0 || o.Depth <= 0 || o.Limit < AlignedLen(o.Size) {
		return BenchResult{}, fmt.Errorf("ssd bench: bad options (size %d, seconds %v, depth %d, limit %d)", o.Size, o.Seconds, o.Depth, o.Limit)
	}
	if err := ProbeDirectIO(o.Dir); err != nil {
		return BenchResult{}, fmt.Errorf("ssd bench refuses to run without O_DIRECT: %w", err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(o.Dir, &fs); err == nil {
		if free := int64(fs.Bavail) * int64(fs.Bsize); free < o.Limit+(1<<30) {
			return BenchResult{}, fmt.Errorf("ssd bench: %s has %s free, the benchmark needs its limit %s plus 1GiB",
				o.Dir, FormatSize(free), FormatSize(o.Limit))
		}
	}
	instance := fmt.Sprintf("bench-%d", os.Getpid())
	s, err := Open(Options{
		Cluster:       "bench",
		InstanceKey:   instance,
		Paths:         []string{o.Dir},
		Limits:        []int64{o.Limit},
		Engine:        o.Engine,
		IODepth:       o.Depth,
		WriteInflight: o.Callers,
		ReadInflight:  o.Callers,
	})
	if err != nil {
		return BenchResult{}, err
	}
	clusterDir := filepath.Join(o.Dir, "bench_cluster_kv_ssd_storage")
	defer func() {
		s.Close()
		os.RemoveAll(filepath.Join(clusterDir, instance))
		os.Remove(clusterDir) // only if empty
	}()
	var evictions atomic.Int64
	go func() {
		for b := range s.Evictions() {
			evictions.Add(int64(len(b)))
		}
	}()

	res := BenchResult{Engine: s.Engine(), Depth: o.Depth, Callers: o.Callers, ODirect: true, Dir: o.Dir, ValueBytes: o.Size,
		LimitBytes: s.Stats().CapacityBytes, Seconds: o.Seconds}
	// Values are windows of one random source: value i starts at (i*4099) mod 64 KiB.
	src := make([]byte, o.Size+64<<10)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for i := 0; i+8 <= len(src); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			src[i+j] = byte(v >> (8 * j))
		}
	}
	value := func(i int64) []byte {
		off := (i * 4099) % (64 << 10)
		return src[off : off+o.Size]
	}
	dur := time.Duration(o.Seconds * float64(time.Second))

	// Write phase.
	var next atomic.Int64
	wlat, wdur, err := benchPhase(ctx, o, "write", dur, func(int) (bool, error) {
		i := next.Add(1) - 1
		pin, err := s.Persist(fmt.Sprint("k", i), 1, value(i))
		pin.Release()
		return true, err
	})
	if err != nil {
		return res, err
	}
	written := next.Load()
	res.Writes = int64(len(wlat))
	res.WriteGiBs = gibps(res.Writes*o.Size, wdur)
	res.WriteP50us, res.WriteP99us = percentileUs(wlat, 0.50), percentileUs(wlat, 0.99)

	// The resident set: the newest keys that are still committed.
	var live []int64
	maxLive := res.LimitBytes/AlignedLen(o.Size) + 1
	for i := written - 1; i >= 0 && i >= written-maxLive-int64(len(s.devices[0].shards)); i-- {
		if s.Contains(fmt.Sprint("k", i), 1) {
			live = append(live, i)
		}
	}
	res.ReadSetKeys = len(live)
	if len(live) == 0 {
		return res, errors.New("ssd bench: nothing resident after the write phase")
	}

	// Read phase.
	var misses atomic.Int64
	bufs := make([][]byte, o.Callers)
	for i := range bufs {
		bufs[i] = AllocAligned(o.Size)
	}
	rngs := make([]*rand.Rand, o.Callers)
	for i := range rngs {
		rngs[i] = rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
	}
	rlat, rdur, err := benchPhase(ctx, o, "read", dur, func(worker int) (bool, error) {
		i := live[rngs[worker].IntN(len(live))]
		dst := bufs[worker]
		err := s.LoadInto(fmt.Sprint("k", i), 1, dst, o.Size)
		if errors.Is(err, ErrNotFound) {
			misses.Add(1)
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !checkValue(dst, value(i), rngs[worker].IntN(16) == 0) {
			return false, fmt.Errorf("ssd bench: value k%d read back wrong bytes", i)
		}
		return true, nil
	})
	if err != nil {
		return res, err
	}
	res.Reads = int64(len(rlat))
	res.ReadMisses = misses.Load()
	res.ReadGiBs = gibps(res.Reads*o.Size, rdur)
	res.ReadP50us, res.ReadP99us = percentileUs(rlat, 0.50), percentileUs(rlat, 0.99)
	res.Evictions = evictions.Load()
	return res, nil
}

// benchPhase runs op from Callers workers for dur and returns the latencies of the
// operations that counted and the phase's wall time.
func benchPhase(parent context.Context, o BenchOptions, name string, dur time.Duration,
	op func(worker int) (bool, error)) ([]time.Duration, time.Duration, error) {
	ctx, cancel := context.WithTimeout(parent, dur)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex // protects lats, first
		lats  []time.Duration
		first error
		count atomic.Int64
	)
	start := time.Now()
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				el := time.Since(start)
				n := count.Load()
				fmt.Fprintf(o.Progress, "ssd bench %s: %5.1fs %8d ops %10s %6.2f GiB/s\n",
					name, el.Seconds(), n, FormatSize(n*o.Size), gibps(n*o.Size, el))
			}
		}
	}()
	for w := range o.Callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]time.Duration, 0, 1<<14)
			for ctx.Err() == nil {
				t0 := time.Now()
				ok, err := op(w)
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					cancel()
					break
				}
				if ok {
					mine = append(mine, time.Since(t0))
					count.Add(1)
				}
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cancel()
	<-progressDone
	if first != nil {
		return nil, 0, first
	}
	if err := parent.Err(); err != nil {
		return nil, 0, err
	}
	return lats, elapsed, nil
}

func gibps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / float64(1<<30) / d.Seconds()
}

func percentileUs(lats []time.Duration, p float64) float64 {
	if len(lats) == 0 {
		return 0
	}
	slices.Sort(lats)
	return float64(lats[int(p*float64(len(lats)-1))]) / float64(time.Microsecond)
}
