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
	// Seconds is the length of each phase (write, verified read, unverified read).
	// Default 10.
	Seconds float64
	// Writes and Reads, when positive, make the write phase and each read phase run
	// that many operations instead of Seconds: tests count operations, never time.
	Writes int64
	Reads  int64
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
	Engine     string `json:"engine"`
	Depth      int    `json:"depth"`
	Callers    int    `json:"callers"`
	ODirect    bool   `json:"o_direct"`
	Dir        string `json:"dir"`
	ValueBytes int64  `json:"value_bytes"`
	LimitBytes int64  `json:"limit_bytes"`
	// AlignBytes is the unit write runs start and end on (the file system's block,
	// see placementAlign).
	AlignBytes  int64   `json:"align_bytes"`
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
	// The same reads over the same data with Options.SkipVerify: no record header
	// read, no CRC32C. 1 - ReadGiBs/ReadUnverifiedGiBs is the cost of verification.
	ReadsUnverified      int64   `json:"reads_unverified"`
	ReadUnverifiedGiBs   float64 `json:"read_unverified_gib_s"`
	ReadUnverifiedP50us  float64 `json:"read_unverified_p50_us"`
	ReadUnverifiedP99us  float64 `json:"read_unverified_p99_us"`
	ReadUnverifiedMisses int64   `json:"read_unverified_misses"`
	// ReadModes has every read mode measured: the two ways of reading the record
	// header (see record.go) and unverified. The first is what the owner uses
	// (the flat Read* fields above).
	ReadModes []BenchReadMode `json:"read_modes"`
}

// BenchReadMode is one read mode's share of RunBench. The modes run in alternating
// rounds over the same resident data, so drift of a loaded machine or device hits
// them alike.
type BenchReadMode struct {
	// Mode is "readv" (verified as the owner does: header and first chunk in one
	// vectored IO), "header-io" (verified; the header read is a separate IO
	// submitted with the first chunk) or "unverified" (Options.SkipVerify).
	Mode   string  `json:"mode"`
	Reads  int64   `json:"reads"`
	Misses int64   `json:"misses"`
	GiBs   float64 `json:"gib_s"`
	P50us  float64 `json:"p50_us"`
	P99us  float64 `json:"p99_us"`
}

// benchRounds is how many alternating rounds the read modes run in.
const benchRounds = 4

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

// RunBench measures the storage on one directory: Callers callers persist random
// values of Size bytes for Seconds (the ring wraps and evicts as in production),
// then load random resident values into aligned memory for Seconds, verified (as the
// owner reads), then the same again without verification (Options.SkipVerify), so
// that the cost of verification comes from one run over the same data. Every load
// is also checked against the value's source bytes (fully one in 16, else its ends).
// It refuses directories without O_DIRECT.
func RunBench(ctx context.Context, o BenchOptions) (BenchResult, error) {
	o.setDefaults()
	if o.Dir == "" {
		return BenchResult{}, errors.New("ssd bench: no directory")
	}
	if o.Size <= 0 || o.Seconds <= 0 || o.Depth <= 0 || o.Limit < AlignedLen(o.Size)+Align {
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
	// Consume eviction reports as the owner does; Close ends the consumer.
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for range s.Evictions() {
		}
	}()
	clusterDir := filepath.Join(o.Dir, "bench_cluster_kv_ssd_storage")
	defer func() {
		s.Close()
		<-consumed
		os.RemoveAll(filepath.Join(clusterDir, instance))
		os.Remove(clusterDir) // only if empty
	}()

	res := BenchResult{Engine: s.Engine(), Depth: o.Depth, Callers: o.Callers, ODirect: true, Dir: o.Dir, ValueBytes: o.Size,
		LimitBytes: s.Stats().CapacityBytes, AlignBytes: s.devices[0].align, Seconds: o.Seconds}
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
	wlat, wdur, err := benchPhase(ctx, o, "write", dur, o.Writes, func(int) (bool, error) {
		i := next.Add(1) - 1
		pin, err := s.Persist(fmt.Sprint("k", i), 1, value(i))
		pin.Release()
		return true, err
	})
	if err != nil {
		return res, err
	}
	written := next.Load()
	// Every key was persisted once and only the ring's tail takes entries out of the
	// index here: the evictions are the writes that are gone (exact, unlike counting
	// the asynchronous reports).
	res.Evictions = written - int64(s.Stats().Entries)
	res.Writes = int64(len(wlat))
	res.WriteGiBs = gibps(res.Writes*o.Size, wdur)
	res.WriteP50us, res.WriteP99us = percentileUs(wlat, 0.50), percentileUs(wlat, 0.99)

	// The resident set: every key still in the index (concurrent writers commit out
	// of key order, so it is not simply the newest keys). Nothing writes any more.
	var live []int64
	s.mu.Lock()
	for key, e := range s.index {
		var i int64
		if _, err := fmt.Sscanf(key, "k%d", &i); err == nil && e.state == stateCommitted {
			live = append(live, i)
		}
	}
	s.mu.Unlock()
	slices.Sort(live) // map order is random; keep the set in key order
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
	read := func(worker int) (bool, error) {
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
	}
	// The read modes alternate in rounds; no load runs between two phases
	// (benchPhase joined its callers), so switching the options is safe.
	modes := []struct {
		name        string
		skip, readv bool
	}{{"readv", false, true}, {"header-io", false, false}, {"unverified", true, false}}
	if s.opts.separateHeaderRead {
		modes[0], modes[1] = modes[1], modes[0]
	}
	keepSkip, keepSeparate := s.opts.SkipVerify, s.opts.separateHeaderRead
	lats := make([][]time.Duration, len(modes))
	durs := make([]time.Duration, len(modes))
	missed := make([]int64, len(modes))
	for round := range benchRounds {
		for m, mode := range modes {
			ops := o.Reads / benchRounds
			if int64(round) < o.Reads%benchRounds {
				ops++
			}
			if o.Reads > 0 && ops == 0 {
				continue
			}
			s.opts.SkipVerify, s.opts.separateHeaderRead = mode.skip, !mode.readv
			rlat, rdur, err := benchPhase(ctx, o, fmt.Sprintf("read %s %d/%d", mode.name, round+1, benchRounds),
				dur/benchRounds, ops, read)
			s.opts.SkipVerify, s.opts.separateHeaderRead = keepSkip, keepSeparate
			if err != nil {
				return res, err
			}
			lats[m] = append(lats[m], rlat...)
			durs[m] += rdur
			missed[m] += misses.Swap(0)
		}
	}
	for m, mode := range modes {
		n := int64(len(lats[m]))
		res.ReadModes = append(res.ReadModes, BenchReadMode{Mode: mode.name, Reads: n, Misses: missed[m],
			GiBs: gibps(n*o.Size, durs[m]), P50us: percentileUs(lats[m], 0.50), P99us: percentileUs(lats[m], 0.99)})
	}
	owner, unverified := res.ReadModes[0], res.ReadModes[2]
	res.Reads, res.ReadMisses, res.ReadGiBs, res.ReadP50us, res.ReadP99us = owner.Reads, owner.Misses, owner.GiBs, owner.P50us, owner.P99us
	res.ReadsUnverified, res.ReadUnverifiedMisses, res.ReadUnverifiedGiBs = unverified.Reads, unverified.Misses, unverified.GiBs
	res.ReadUnverifiedP50us, res.ReadUnverifiedP99us = unverified.P50us, unverified.P99us
	return res, nil
}

// benchPhase runs op from Callers workers for dur, or until ops operations ran when
// ops > 0, and returns the latencies of the operations that counted and the phase's
// wall time.
func benchPhase(parent context.Context, o BenchOptions, name string, dur time.Duration, ops int64,
	op func(worker int) (bool, error)) ([]time.Duration, time.Duration, error) {
	ctx, cancel := context.WithCancel(parent)
	if ops <= 0 {
		ctx, cancel = context.WithTimeout(parent, dur)
	}
	defer cancel()
	var started atomic.Int64 // operations taken, when counting
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
				if ops > 0 && started.Add(1) > ops {
					break
				}
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
