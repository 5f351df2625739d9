package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// workerConfig is what the driver tells a worker process (the same flags as worker.py).
type workerConfig struct {
	Socket        string
	Name          string
	Seed          uint64
	Keys          int
	KeyPrefix     string
	MinSize       int64
	MaxSize       int64
	HoldCap       int64
	BatchMaxBytes int64
	ReportEvery   time.Duration
	Threads       int
}

// args renders the config as the worker flags both worker implementations take.
func (w workerConfig) args() []string {
	return []string{
		"--socket", w.Socket, "--name", w.Name, "--seed", fmt.Sprint(w.Seed), "--keys", fmt.Sprint(w.Keys),
		"--key-prefix", w.KeyPrefix, "--min-size", fmt.Sprint(w.MinSize), "--max-size", fmt.Sprint(w.MaxSize),
		"--hold-cap", fmt.Sprint(w.HoldCap), "--batch-max-bytes", fmt.Sprint(w.BatchMaxBytes),
		"--report-every", fmt.Sprint(w.ReportEvery.Seconds()),
	}
}

// key names key i of the shared key space.
func (w workerConfig) key(i int) string { return fmt.Sprintf("%s%06d", w.KeyPrefix, i) }

// workerMain is `soak worker ...`: the Go client process. It loops until SIGTERM.
func workerMain(argv []string) int {
	var w workerConfig
	var reportEvery float64
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	fs.StringVar(&w.Socket, "socket", "", "the owner's socket")
	fs.StringVar(&w.Name, "name", "go", "client name")
	fs.Uint64Var(&w.Seed, "seed", 1, "random seed")
	fs.IntVar(&w.Keys, "keys", 256, "key space")
	fs.StringVar(&w.KeyPrefix, "key-prefix", "soak/", "key prefix")
	fs.Int64Var(&w.MinSize, "min-size", 1, "smallest value")
	fs.Int64Var(&w.MaxSize, "max-size", 16<<20, "largest value")
	fs.Int64Var(&w.HoldCap, "hold-cap", 4<<20, "bytes of holders kept at once")
	fs.Int64Var(&w.BatchMaxBytes, "batch-max-bytes", 16<<20, "bytes of one batch put")
	fs.Float64Var(&reportEvery, "report-every", 0.5, "seconds between counter lines")
	fs.IntVar(&w.Threads, "threads", 2, "goroutines sharing the client")
	fs.Parse(argv)
	w.ReportEvery = time.Duration(reportEvery * float64(time.Second))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	rep := &reporter{w: os.Stdout, c: Counters{Worker: w.Name, Lang: "go", Errors: map[string]int64{}, ErrorSamples: map[string]string{}}}
	c, err := connectRetry(ctx, w.Socket, w.Name)
	if err != nil {
		rep.update(func(c *Counters) { c.Failures = append(c.Failures, err.Error()) })
		rep.emit(true)
		if ctx.Err() != nil {
			return 0
		}
		return 1
	}
	rep.emit(false) // running: the driver waits for this line before a SIGTERM
	session := c.ClientID()
	var wg sync.WaitGroup
	var held atomic.Int64
	var gs []*goWorker
	for t := 0; t < w.Threads; t++ {
		g := &goWorker{cfg: w, c: c, rep: rep, held: &held, rng: rand.New(rand.NewPCG(w.Seed, uint64(t))), floor: map[string]int64{}}
		gs = append(gs, g)
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.loop(ctx)
		}()
	}
	tick := time.NewTicker(w.ReportEvery)
	for done := false; !done; {
		select {
		case <-tick.C:
			rep.emit(false)
		case <-ctx.Done():
			done = true
		}
	}
	tick.Stop()
	wg.Wait()
	checkHolders(c, session, gs, rep)
	c.Close()
	rep.emit(true)
	return 0
}

// checkHolders compares, before the client closes (which frees everything), the owner's
// count of this session's holders with the holders the goroutines never released: a
// release lost on its way (a dropped queued release, a lost ack) shows only here. Skipped
// when the client attached again meanwhile (an owner restart: the holders of the session
// before are not counted).
func checkHolders(c *fluxkv.Client, session int64, gs []*goWorker, rep *reporter) {
	if c.ClientID() != session {
		return
	}
	var kept int64
	for _, g := range gs {
		for _, h := range g.mine {
			if h.until.IsZero() { // (the timed ones went at the loop's end)
				kept++
			}
		}
	}
	st, err := c.Stat() // (carries the queued releases first)
	if err != nil || c.ClientID() != session {
		return
	}
	if st.ClientHolders != kept {
		rep.update(func(ct *Counters) {
			ct.Failures = append(ct.Failures, fmt.Sprintf("the owner counts %d holders of this session at its end, %d never released: releases lost", st.ClientHolders, kept))
		})
	}
}

// connectRetry attaches, retrying while the owner is (re)starting, for up to 30 s.
func connectRetry(ctx context.Context, socket, name string) (*fluxkv.Client, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := fluxkv.Connect(fluxkv.Options{Socket: socket, Name: name})
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("attach %s: %w", socket, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// heldHolder is a holder kept for a while (or, with no deadline, until the kill).
type heldHolder struct {
	key   string
	h     *fluxkv.MemHolder
	until time.Time
}

// recheck reads a held holder's bytes again before it is released: a holder keeps its
// value's bytes however long it is held, through overwrites, deletes and evictions of
// the key (a range freed and reused under it shows another value's bytes). They were
// checked once, right after the get.
func (g *goWorker) recheck(h heldHolder) {
	if bad := wrongBytes(h.key, h.h.PutID(), h.h.Bytes()); bad > 0 {
		g.rep.update(func(c *Counters) {
			c.WrongBytes += bad
			if len(c.Failures) < 8 {
				c.Failures = append(c.Failures, fmt.Sprintf("%d wrong bytes in a held holder of %q put_id=%d len=%d", bad, h.key, h.h.PutID(), h.h.Len()))
			}
		})
		g.rep.emit(false)
	}
}

// goWorker is one goroutine's loop over random operations; the client and the hold
// budget are shared with the process's other goroutines.
type goWorker struct {
	cfg  workerConfig
	c    *fluxkv.Client
	rep  *reporter
	held *atomic.Int64 // bytes held by every goroutine of the process
	rng  *rand.Rand
	mine []heldHolder // holders this goroutine keeps
	// floor is, per key, the lowest put_id a get this goroutine starts may answer: its
	// last answered put of the key, or one more once it deleted the key since (an older
	// version is dead, and a holder of one is stale: its bytes are its own version's,
	// which the byte check alone passes).
	floor map[string]int64
}

// acked records this goroutine's answered put of key under putID.
func (g *goWorker) acked(key string, putID int64) { g.floor[key] = max(g.floor[key], putID) }

// deleted records this goroutine's answered delete of key: every version it knew is dead.
func (g *goWorker) deleted(key string) {
	if f, ok := g.floor[key]; ok {
		g.floor[key] = f + 1
	}
}

func (g *goWorker) loop(ctx context.Context) {
	type op struct {
		name   string
		weight float64
		run    func() error
	}
	ops := []op{{"put", 0.22, g.put}, {"get", 0.30, g.get}, {"delete", 0.10, g.del}, {"batch_put", 0.12, g.batchPut},
		{"batch_get", 0.18, g.batchGet}, {"batch_delete", 0.08, g.batchDelete}}
	var total float64
	for _, o := range ops {
		total += o.weight
	}
	for ctx.Err() == nil {
		r := g.rng.Float64() * total
		var pick op
		for _, o := range ops {
			pick = o
			if r -= o.weight; r <= 0 {
				break
			}
		}
		began := time.Now()
		err := pick.run()
		g.rep.slowest(pick.name, time.Since(began))
		if err != nil {
			g.countErr(err)
			if errors.Is(err, fluxkv.ErrUnavailable) || errors.Is(err, fluxkv.ErrStaleGeneration) {
				time.Sleep(50 * time.Millisecond) // the owner is restarting: do not spin
			}
		}
		g.expire(time.Now())
	}
	for _, h := range g.mine {
		g.recheck(h) // (those never released too: their bytes stay until the process ends)
		if !h.until.IsZero() {
			h.h.Release()
		}
	}
}

// countErr counts an error by its wire code; errors without one are client failures.
func (g *goWorker) countErr(err error) {
	var we *wire.Error
	name := "CLIENT"
	if errors.As(err, &we) {
		name = we.Code.String()
	}
	g.rep.update(func(c *Counters) {
		c.Errors[name]++
		if _, ok := c.ErrorSamples[name]; !ok {
			c.ErrorSamples[name] = err.Error()
		}
	})
}

func (g *goWorker) key() string { return g.cfg.key(g.rng.IntN(g.cfg.Keys)) }

// size is log-uniform over [MinSize, MaxSize]: tiny and huge values both occur.
func (g *goWorker) size() int64 {
	lo, hi := math.Log(float64(g.cfg.MinSize)), math.Log(float64(g.cfg.MaxSize+1))
	n := int64(math.Exp(lo + g.rng.Float64()*(hi-lo)))
	return max(g.cfg.MinSize, min(g.cfg.MaxSize, n))
}

func fillFor(key string) func(putID int64, dst []byte) error {
	return func(putID int64, dst []byte) error {
		fillValue(key, putID, dst)
		return nil
	}
}

func (g *goWorker) put() error {
	k, n := g.key(), g.size()
	id, err := g.c.PutWithID(k, n, fluxkv.PutOptions{RejectIfExists: g.rng.IntN(10) == 0}, fillFor(k))
	if err == nil {
		g.acked(k, id)
	}
	g.rep.update(func(c *Counters) {
		c.Puts++
		if err == nil {
			c.BytesWritten += n
		}
	})
	return err
}

func (g *goWorker) get() error {
	k := g.key()
	floor := g.floor[k]
	h, err := g.c.Get(k)
	g.rep.update(func(c *Counters) {
		c.Gets++
		if errors.Is(err, fluxkv.ErrKeyNotFound) {
			c.Misses++
		}
	})
	if errors.Is(err, fluxkv.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	g.got(k, h, floor)
	return nil
}

func (g *goWorker) del() error {
	k := g.key()
	_, err := g.c.Delete(k)
	if err == nil {
		g.deleted(k)
	}
	g.rep.update(func(c *Counters) { c.Deletes++ })
	return err
}

// distinctKeys picks n different keys.
func (g *goWorker) distinctKeys(n int) []string {
	n = min(n, g.cfg.Keys)
	seen := map[int]bool{}
	keys := make([]string, 0, n)
	for len(keys) < n {
		i := g.rng.IntN(g.cfg.Keys)
		if !seen[i] {
			seen[i] = true
			keys = append(keys, g.cfg.key(i))
		}
	}
	return keys
}

func (g *goWorker) batchPut() error {
	var items []fluxkv.PutItem
	var total int64
	ids := map[string]int64{} // key → the put_id its fill wrote
	for _, k := range g.distinctKeys(2 + g.rng.IntN(5)) {
		n := g.size()
		if total+n > g.cfg.BatchMaxBytes {
			continue
		}
		total += n
		fill := fillFor(k)
		items = append(items, fluxkv.PutItem{Key: k, Len: n, Fill: func(putID int64, dst []byte) error {
			ids[k] = putID // (a redo fills again, under its own put_id)
			return fill(putID, dst)
		}})
	}
	if len(items) == 0 {
		return nil
	}
	errs, err := g.c.BatchPut(items, fluxkv.PutOptions{})
	for i, it := range items {
		if err == nil && i < len(errs) && errs[i] == nil {
			g.acked(it.Key, ids[it.Key])
		}
	}
	g.rep.update(func(c *Counters) {
		c.BatchPuts++
		c.BatchItems += int64(len(items))
		for i, it := range items {
			if err == nil && i < len(errs) && errs[i] == nil {
				c.BytesWritten += it.Len
			}
		}
	})
	if err != nil {
		return err
	}
	for _, e := range errs {
		if e != nil {
			g.countErr(e)
		}
	}
	return nil
}

func (g *goWorker) batchGet() error {
	keys := g.distinctKeys(2 + g.rng.IntN(7))
	floors := make([]int64, len(keys))
	for i, k := range keys {
		floors[i] = g.floor[k]
	}
	hs, errs, err := g.c.BatchGet(keys)
	misses := 0
	for i := range hs {
		if hs[i] == nil && errs[i] == nil {
			misses++
		}
	}
	g.rep.update(func(c *Counters) {
		c.BatchGets++
		c.BatchItems += int64(len(keys))
		c.Misses += int64(misses)
	})
	if err != nil {
		return err
	}
	for i, h := range hs {
		if errs[i] != nil {
			g.countErr(errs[i])
		}
		if h != nil {
			g.got(keys[i], h, floors[i])
		}
	}
	return nil
}

func (g *goWorker) batchDelete() error {
	keys := g.distinctKeys(2 + g.rng.IntN(4))
	found, err := g.c.BatchDelete(keys)
	if err == nil && len(found) == len(keys) {
		for _, k := range keys {
			g.deleted(k)
		}
	}
	g.rep.update(func(c *Counters) {
		c.BatchDeletes++
		c.BatchItems += int64(len(keys))
	})
	return err
}

// got verifies a holder against its own put_id and length, and against floor (the
// lowest put_id the get could answer: stale below), then releases it at once, keeps it
// for a while, or keeps it until the process is killed, within the hold cap.
func (g *goWorker) got(key string, h *fluxkv.MemHolder, floor int64) {
	n := h.Len()
	if h.PutID() <= 0 || n <= 0 || h.PutID() < floor {
		g.rep.update(func(c *Counters) {
			c.BadHolders++
			if len(c.Failures) < 8 {
				c.Failures = append(c.Failures, fmt.Sprintf("holder of %q: put_id=%d len=%d (this worker's last answered write of it: put_id %d, or a delete after it)", key, h.PutID(), n, floor))
			}
		})
		g.rep.emit(false)
		h.Release()
		return
	}
	bad := wrongBytes(key, h.PutID(), h.Bytes())
	g.rep.update(func(c *Counters) {
		c.Hits++
		if h.Source() == "ssd" {
			c.SSDHits++
		}
		c.BytesVerified += n
		c.WrongBytes += bad
		if bad > 0 && len(c.Failures) < 8 {
			c.Failures = append(c.Failures, fmt.Sprintf("%d wrong bytes in %q put_id=%d len=%d source=%s", bad, key, h.PutID(), n, h.Source()))
		}
	})
	if bad > 0 {
		g.rep.emit(false)
	}
	r := g.rng.Float64()
	switch {
	case r < 0.5 || g.held.Load()+n > g.cfg.HoldCap:
		h.Release()
	case r < 0.9:
		g.held.Add(n)
		g.mine = append(g.mine, heldHolder{key: key, h: h, until: time.Now().Add(time.Duration(50+g.rng.IntN(1950)) * time.Millisecond)})
	default:
		g.held.Add(n)
		g.mine = append(g.mine, heldHolder{key: key, h: h})
		g.rep.update(func(c *Counters) { c.NeverReleased++ })
	}
}

// expire releases the held holders whose time has come.
func (g *goWorker) expire(now time.Time) {
	keep := g.mine[:0]
	for _, h := range g.mine {
		if !h.until.IsZero() && !now.Before(h.until) {
			g.recheck(h)
			h.h.Release()
			g.held.Add(-h.h.Len())
			continue
		}
		keep = append(keep, h)
	}
	g.mine = keep
}
