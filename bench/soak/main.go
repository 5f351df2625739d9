// Command soak is fluxkv's long, verified, hostile workload against real processes
// (`make soak`, `make chaos`; README.md here). The driver starts a master and owners
// from FLUXKV_BIN with SSD on and 4× less DRAM than the data, runs Go and Python client
// processes that put, overwrite, delete, batch and get values of 1 B … 16 MiB whose
// bytes derive from (key, put_id, len) — so every read is verified — kills them with -9
// at random and restarts them; with -chaos it also kills and restarts the owners and the
// master. At the end it deletes the key space and checks from the outside that the node
// is back to its baseline. `soak worker ...` is the Go client process.
package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cloudwego/kitex/pkg/klog"
	"github.com/rs/zerolog"
	"github.com/rs/zerolog/log"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
)

func main() {
	// Kitex logs through klog; keep it to warnings, in the workers too. Set before any
	// Kitex goroutine can read the level.
	klog.SetLevel(klog.LevelWarn)
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		os.Exit(workerMain(os.Args[2:]))
	}
	log.Logger = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: "15:04:05.000", NoColor: !isTerminal(os.Stderr)}).With().Timestamp().Logger()
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	os.Exit(run(cfg))
}

// config is the driver's flags.
type config struct {
	Duration       time.Duration
	Chaos          bool
	Bin            string
	Python         string
	PyWorker       string
	PyPath         string
	Owners         int
	SSDOwners      int
	DRAM           int64
	Data           int64
	SSDLimit       int64
	MinSize        int64
	MaxSize        int64
	GoWorkers      int
	PyWorkers      int
	KillEvery      time.Duration
	ChaosEvery     time.Duration
	Seed           uint64
	Settle         time.Duration
	GoroutineSlack int
	FDSlack        int
	CheckSSD       bool
	Keep           bool
}

func parseFlags(argv []string) (config, error) {
	var c config
	var dram, data, ssd, maxSize string
	bin := os.Getenv("FLUXKV_BIN")
	if bin == "" {
		bin = "bin/fluxkv"
	}
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.DurationVar(&c.Duration, "duration", 10*time.Minute, "how long the workload runs (start-up and end checks come on top)")
	fs.BoolVar(&c.Chaos, "chaos", false, "also kill -9 and restart the owners and the master at random")
	fs.StringVar(&c.Bin, "bin", bin, "the fluxkv binary (default $FLUXKV_BIN, else bin/fluxkv)")
	fs.StringVar(&c.Python, "python", "/usr/bin/python3", "Python for the Python workers (needs python3-numpy, python3-thrift)")
	fs.StringVar(&c.PyWorker, "py-worker", "bench/soak/worker.py", "the Python worker script")
	fs.StringVar(&c.PyPath, "py-path", "clients/python", "PYTHONPATH holding the fluxkv Python package")
	fs.IntVar(&c.Owners, "owners", 1, "owners under the one master; workers attach round-robin")
	fs.IntVar(&c.SSDOwners, "ssd-owners", 0, "how many owners have SSD (0: all); the others' values reach SSD through the SSD pool")
	fs.StringVar(&dram, "dram", "64MiB", "DRAM segment per owner")
	fs.StringVar(&data, "data", "256MiB", "expected bytes of the key space (sizes the key count from the mean value size)")
	fs.StringVar(&ssd, "ssd-limit", "512MiB", "SSD ring space per owner")
	fs.Int64Var(&c.MinSize, "min-size", 1, "smallest value in bytes")
	fs.StringVar(&maxSize, "max-size", "16MiB", "largest value (sizes are log-uniform between the two)")
	fs.IntVar(&c.GoWorkers, "go-workers", 2, "Go client processes")
	fs.IntVar(&c.PyWorkers, "py-workers", 2, "Python client processes")
	fs.DurationVar(&c.KillEvery, "kill-every", 5*time.Second, "mean interval between kill -9 of a random client process")
	fs.DurationVar(&c.ChaosEvery, "chaos-every", 15*time.Second, "with -chaos: mean interval between kill -9 of the master or an owner")
	fs.Uint64Var(&c.Seed, "seed", 0, "random seed (0: from the clock; printed)")
	fs.DurationVar(&c.Settle, "settle", 30*time.Second, "how long the end checks wait for the node to return to baseline")
	fs.IntVar(&c.GoroutineSlack, "goroutine-slack", 5, "allowed growth of the owner's goroutines")
	fs.IntVar(&c.FDSlack, "fd-slack", 4, "allowed growth of the owner's open fds")
	fs.BoolVar(&c.CheckSSD, "check-ssd", true, "require SSD used bytes back to 0 once the keys are deleted")
	fs.BoolVar(&c.Keep, "keep", false, "keep the temp dir (logs, sockets, SSD files)")
	if err := fs.Parse(argv); err != nil {
		return c, err
	}
	var err error
	for _, s := range []struct {
		name string
		src  string
		dst  *int64
	}{{"dram", dram, &c.DRAM}, {"data", data, &c.Data}, {"ssd-limit", ssd, &c.SSDLimit}, {"max-size", maxSize, &c.MaxSize}} {
		if *s.dst, err = parseSize(s.src); err != nil {
			return c, fmt.Errorf("--%s: %w", s.name, err)
		}
	}
	switch {
	case c.Duration <= 0:
		return c, errors.New("--duration must be positive")
	case c.Owners < 1:
		return c, errors.New("--owners must be at least 1")
	case c.SSDOwners < 0 || c.SSDOwners > c.Owners:
		return c, errors.New("--ssd-owners must be between 0 (all) and --owners")
	case c.GoWorkers+c.PyWorkers < 1:
		return c, errors.New("at least one worker (--go-workers, --py-workers)")
	case c.MinSize < 1 || c.MaxSize < c.MinSize:
		return c, errors.New("--min-size must be ≥ 1 and ≤ --max-size")
	case c.MaxSize > c.DRAM/2:
		return c, fmt.Errorf("--max-size %d must be at most half of --dram %d", c.MaxSize, c.DRAM)
	case c.KillEvery <= 0 || c.ChaosEvery <= 0:
		return c, errors.New("--kill-every and --chaos-every must be positive")
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.Bin, err = filepath.Abs(c.Bin); err != nil {
		return c, err
	}
	return c, nil
}

// keyCount sizes the key space so that one value per key is about Data bytes: the mean
// of a log-uniform size on [min, max] is (max−min)/ln(max/min).
func (c config) keyCount() int {
	mean := float64(c.MinSize)
	if c.MaxSize > c.MinSize {
		mean = float64(c.MaxSize+1-c.MinSize) / math.Log(float64(c.MaxSize+1)/float64(c.MinSize))
	}
	return max(1, int(math.Ceil(float64(c.Data)/mean)))
}

// jitter is a uniform duration in [d/2, 3d/2).
func jitter(rng *rand.Rand, d time.Duration) time.Duration {
	return d/2 + time.Duration(rng.Int64N(int64(d)))
}

// run is the whole soak; it returns the exit code.
func run(cfg config) int {
	mode := "soak"
	if cfg.Chaos {
		mode = "chaos"
	}
	dir, err := os.MkdirTemp("", "fluxkv-soak-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	if cfg.Keep {
		log.Info().Str("dir", dir).Msg("keeping the temp dir")
	} else {
		defer os.RemoveAll(dir)
	}
	keys := cfg.keyCount()
	log.Info().Str("mode", mode).Dur("duration", cfg.Duration).Uint64("seed", cfg.Seed).Int("keys", keys).
		Str("dram", humanBytes(cfg.DRAM)).Str("data", humanBytes(cfg.Data)).Str("ssd", humanBytes(cfg.SSDLimit)).
		Int("owners", cfg.Owners).Int("go_workers", cfg.GoWorkers).Int("py_workers", cfg.PyWorkers).Str("dir", dir).Msg("soak starting")

	var wg sync.WaitGroup // every child process's reader/reaper goroutine
	defer wg.Wait()
	var failures []string
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		log.Error().Msg(msg)
		failures = append(failures, msg)
	}

	t0 := time.Now()
	cl, err := startCluster(&wg, nodeConfig{Bin: cfg.Bin, Dir: dir, Owners: cfg.Owners, SSDOwners: cfg.SSDOwners, DRAM: cfg.DRAM, SSDLimit: cfg.SSDLimit})
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		if cl != nil {
			cl.stop()
		}
		return 1
	}
	bases := make([]ownerState, len(cl.owners))
	for i, o := range cl.owners {
		if bases[i], err = cl.baseline(o); err != nil {
			fail("baseline of %s: %v", o.nodeID, err)
		}
	}
	log.Info().Dur("took", time.Since(t0)).Int("goroutines", bases[0].Goroutines).Int("fds", bases[0].FDs).Msg("node ready")

	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		cl.stop()
		return 2
	}
	pool := &workerPool{wg: &wg, logDir: filepath.Join(dir, "logs"), goArgv: []string{self, "worker"},
		pyArgv: []string{cfg.Python, cfg.PyWorker}, pyEnv: []string{"PYTHONPATH=" + absPath(cfg.PyPath)},
		last: map[string]*Counters{}}
	nw := cfg.GoWorkers + cfg.PyWorkers
	for i := 0; i < nw; i++ {
		lang, name := "go", fmt.Sprintf("go%d", i)
		if i >= cfg.GoWorkers {
			lang, name = "python", fmt.Sprintf("py%d", i-cfg.GoWorkers)
		}
		o := cl.owners[i%len(cl.owners)]
		s := &workerSlot{lang: lang, cfg: workerConfig{Socket: o.socket(), Name: name, Seed: cfg.Seed + uint64(i), Keys: keys,
			KeyPrefix: "soak/", MinSize: cfg.MinSize, MaxSize: cfg.MaxSize, HoldCap: cfg.DRAM / 4 / int64(nw),
			BatchMaxBytes: cfg.DRAM / 4, ReportEvery: 500 * time.Millisecond}}
		pool.slots = append(pool.slots, s)
		if err := pool.start(s); err != nil {
			fail("%v", err)
		}
	}

	// The workload: kill workers, and with chaos the daemons, at random until the end.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x50a4))
	start := time.Now()
	end := start.Add(cfg.Duration)
	nextKill := start.Add(jitter(rng, cfg.KillEvery))
	nextChaos := start.Add(jitter(rng, cfg.ChaosEvery))
	nextProgress := start.Add(10 * time.Second)
	var kills, ownerRestarts, masterRestarts int
	for len(failures) == 0 {
		now := time.Now()
		if !now.Before(end) {
			break
		}
		if bad := cl.crashed(); len(bad) > 0 {
			for _, b := range bad {
				fail("daemon exited without being killed: %s", b)
			}
			break
		}
		if err := pool.reap(); err != nil {
			fail("%v", err)
			break
		}
		if !now.Before(nextKill) {
			s := pool.slots[rng.IntN(len(pool.slots))]
			if err := pool.kill(s); err != nil {
				fail("%v", err)
				break
			}
			kills++
			nextKill = now.Add(jitter(rng, cfg.KillEvery))
		}
		if cfg.Chaos && !now.Before(nextChaos) {
			pause := time.Duration(rng.Int64N(int64(time.Second)))
			if (ownerRestarts+masterRestarts)%3 == 1 { // owner, master, owner, owner, master, …
				err = cl.restartMaster(pause)
				masterRestarts++
			} else {
				err = cl.restartOwner(cl.owners[rng.IntN(len(cl.owners))], pause)
				ownerRestarts++
			}
			if err != nil {
				fail("restart: %v", err)
				break
			}
			nextChaos = time.Now().Add(jitter(rng, cfg.ChaosEvery))
		}
		if !now.Before(nextProgress) {
			t := pool.totals()
			fmt.Printf("%s: %3.0fs ops=%d written=%s verified=%s wrong_bytes=%d kills=%d restarts=%d errors: %s\n", mode,
				now.Sub(start).Seconds(), t.Ops(), humanBytes(t.BytesWritten), humanBytes(t.BytesVerified), t.WrongBytes,
				kills, ownerRestarts+masterRestarts, t.errorsString())
			nextProgress = nextProgress.Add(10 * time.Second)
		}
		time.Sleep(min(200*time.Millisecond, time.Until(nextKill)))
	}
	ran := time.Since(start)

	// The end: stop the workers, delete the key space, check the node from the outside.
	// A worker stops after the operation in progress, which may wait up to the master's
	// AllocWait (5 s) for space (the summary names the slowest operation): 20 s of grace.
	pool.stopAll(20 * time.Second)
	if bad := cl.crashed(); len(bad) > 0 {
		for _, b := range bad {
			fail("daemon exited without being killed: %s", b)
		}
	}
	var checks []endCheck
	if len(failures) == 0 {
		if err := deleteKeys(cl, keys, "soak/"); err != nil {
			fail("delete the key space: %v", err)
		}
		deadline := time.Now().Add(cfg.Settle)
		for i, o := range cl.owners {
			r := cl.settle(o, bases[i], cfg.GoroutineSlack, cfg.FDSlack, cfg.CheckSSD, deadline)
			for _, p := range r.problems {
				fail("%s after the end: %s (%s)", o.nodeID, p, r.last)
			}
			if r.goroutinesOver {
				// Tell a leak from Kitex's bounded worker pool: stop the owner with SIGQUIT
				// and read its goroutine dump (it then skips the SIGTERM check).
				d, err := cl.dumpGoroutines(o)
				switch {
				case err != nil:
					fail("%s: goroutines %d→%d and no dump: %v", o.nodeID, r.base.Goroutines, r.last.Goroutines, err)
				case d.unexplained() > r.base.Goroutines+cfg.GoroutineSlack:
					fail("%s: goroutines %d→%d, %d of them outside Kitex's timeout pool and connection servers: %s", o.nodeID,
						r.base.Goroutines, r.last.Goroutines, d.unexplained(), d.summary(8))
				default:
					log.Info().Str("node", o.nodeID).Int("dump", d.Total).Int("kitex_pool", d.Pooled).Int("conn_servers", d.ConnServers).
						Msg("goroutines above baseline are Kitex's RPC-timeout worker pool and pooled connections' servers only")
				}
				r.dump = &d
			}
			checks = append(checks, r)
		}
	}
	for _, b := range cl.stop() {
		fail("%s", b)
	}
	wg.Wait()

	t := pool.totals()
	pool.mu.Lock()
	for _, f := range pool.failures {
		fail("%s", f)
	}
	pool.mu.Unlock()
	allowed := []string{"KEY_NOT_FOUND", "NO_SPACE", "ALREADY_EXISTS"}
	if cfg.Chaos {
		// HOLDER_VOID: a Python holder read after its owner restarted raises (worker.py).
		allowed = append(allowed, "UNAVAILABLE", "STALE_GENERATION", "HOLDER_VOID")
	}
	for _, code := range slices.Sorted(maps.Keys(t.Errors)) {
		if !slices.Contains(allowed, code) {
			fail("%d unexpected %s errors, the first: %s", t.Errors[code], code, t.ErrorSamples[code])
		}
	}
	if t.WrongBytes != 0 || t.BadHolders != 0 {
		fail("%d wrong bytes, %d bad holders", t.WrongBytes, t.BadHolders)
	}
	for _, f := range t.Failures {
		fail("worker: %s", f)
	}
	if t.Ops() == 0 || t.BytesVerified == 0 {
		fail("the workload did nothing: ops=%d bytes_verified=%d", t.Ops(), t.BytesVerified)
	}
	// Every language's workers read values, and the run was mostly answered: allowed codes
	// in any number passed a run whose every call failed UNAVAILABLE (a client that never
	// attached again after a restart), or whose Python workers never read a byte.
	for lang, lt := range pool.byLang() {
		if lt.Ops() == 0 || lt.BytesVerified == 0 {
			fail("the %s workers did nothing: ops=%d bytes_verified=%d", lang, lt.Ops(), lt.BytesVerified)
		}
	}
	// With an SSD tier and data four times the DRAM, gets are served from SSD within
	// seconds: none in a run of 30 s or more means that path went untested, or lost
	// every value it held (every SSD read failed, the gets missed, and the soak passed;
	// a review).
	if cfg.SSDLimit > 0 && cfg.Duration >= 30*time.Second && t.SSDHits == 0 {
		fail("no get was served from SSD in %v with an SSD tier: the refill path went untested, or lost what it held", cfg.Duration)
	}
	if failed := failedOps(t); failed > t.Ops()/2 {
		fail("%d of %d operations failed (%s): the run tested little", failed, t.Ops(), t.errorsString())
	}

	fmt.Printf("%s: hits=%d ssd_hits=%d misses=%d batch_items=%d never_released=%d slowest=%s %.0fms errors: %s\n", mode,
		t.Hits, t.SSDHits, t.Misses, t.BatchItems, t.NeverReleased, t.SlowestOp, t.SlowestMs, t.errorsString())
	verdict := "PASS"
	if len(failures) > 0 {
		verdict = "FAIL"
		for _, f := range failures {
			fmt.Printf("%s: failure: %s\n", mode, f)
		}
	}
	line := fmt.Sprintf("%s: %s %.0fs ops=%d puts=%d gets=%d deletes=%d batches=%d bytes_written=%d bytes_verified=%d kills=%d",
		mode, verdict, ran.Seconds(), t.Ops(), t.Puts, t.Gets, t.Deletes, t.BatchPuts+t.BatchGets+t.BatchDeletes,
		t.BytesWritten, t.BytesVerified, kills)
	if cfg.Chaos {
		line += fmt.Sprintf(" owner_restarts=%d master_restarts=%d", ownerRestarts, masterRestarts)
	}
	line += fmt.Sprintf(" wrong_bytes=%d", t.WrongBytes)
	for i, r := range checks {
		prefix := ""
		if len(checks) > 1 {
			prefix = cl.owners[i].nodeID + ":"
		}
		line += fmt.Sprintf(" %sused=%d %sssd_used=%d %sholders=%d %sgoroutines=%d→%d", prefix, r.last.Used, prefix, r.last.SSDUsed,
			prefix, r.last.Holders, prefix, r.base.Goroutines, r.last.Goroutines)
		if r.dump != nil {
			line += fmt.Sprintf("(%d_kitex_pool,%d_conn_servers)", r.dump.Pooled, r.dump.ConnServers)
		}
		line += fmt.Sprintf(" %sfds=%d→%d", prefix, r.base.FDs, r.last.FDs)
		if r.last.TCP != r.base.TCP {
			line += fmt.Sprintf("(tcp_%d→%d)", r.base.TCP, r.last.TCP)
		}
	}
	fmt.Println(line)
	if verdict != "PASS" {
		if !cfg.Keep {
			fmt.Printf("%s: rerun with -keep to keep the logs\n", mode)
		}
		return 1
	}
	return 0
}

// deleteKeys deletes the whole key space through the first owner, retrying while the
// node settles after a restart.
func deleteKeys(cl *cluster, keys int, prefix string) error {
	c, err := connectRetryFor(cl.owners[0].socket(), 30*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	all := make([]string, keys)
	for i := range all {
		all[i] = fmt.Sprintf("%s%06d", prefix, i)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(all) > 0 {
		chunk := all[:min(len(all), 256)]
		if _, err := c.BatchDelete(chunk); err != nil {
			if time.Now().After(deadline) {
				return err
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		all = all[len(chunk):]
	}
	return nil
}

// connectRetryFor attaches, retrying for up to d.
func connectRetryFor(socket string, d time.Duration) (*fluxkv.Client, error) {
	deadline := time.Now().Add(d)
	for {
		c, err := fluxkv.Connect(fluxkv.Options{Socket: socket, Name: "soak-driver"})
		if err == nil || time.Now().After(deadline) {
			return c, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// isTerminal reports whether f is a character device (a terminal): colours only there.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
