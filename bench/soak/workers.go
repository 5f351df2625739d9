package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// workerSlot is one client process position: its incarnations are killed with -9 at
// random and replaced, each with its own seed, attached to the same owner.
type workerSlot struct {
	lang string // "go" or "python"
	cfg  workerConfig
	inc  int
	p    *proc
}

// workerPool runs the client processes and keeps the last counter line of every
// incarnation, so the totals survive kill -9.
type workerPool struct {
	wg     *sync.WaitGroup
	logDir string
	goArgv []string // the Go worker command (this binary + "worker")
	pyArgv []string // the Python worker command
	pyEnv  []string
	slots  []*workerSlot

	mu       sync.Mutex           // protects last, failures
	failures []string             // unexpected exits
	last     map[string]*Counters // incarnation name → its last line
}

// start starts an incarnation of slot s.
func (w *workerPool) start(s *workerSlot) error {
	s.inc++
	cfg := s.cfg
	cfg.Name = fmt.Sprintf("%s#%d", s.cfg.Name, s.inc)
	cfg.Seed = s.cfg.Seed*1000 + uint64(s.inc)
	argv, env := append(append([]string{}, w.goArgv...), cfg.args()...), []string(nil)
	if s.lang == "python" {
		argv, env = append(append([]string{}, w.pyArgv...), cfg.args()...), w.pyEnv
	}
	name := cfg.Name
	p, err := startProc(w.wg, name, argv, env, filepath.Join(w.logDir, fmt.Sprintf("%s.%d.log", s.cfg.Name, s.inc)), func(line []byte) {
		c := &Counters{}
		if json.Unmarshal(line, c) != nil {
			return // not a counter line
		}
		w.mu.Lock()
		w.last[name] = c
		w.mu.Unlock()
	})
	if err != nil {
		return err
	}
	s.p = p
	return nil
}

// kill kills slot s with SIGKILL and starts a new incarnation.
func (w *workerPool) kill(s *workerSlot) error {
	s.p.kill()
	return w.start(s)
}

// reap restarts workers that exited without being killed, recording why.
func (w *workerPool) reap() error {
	for _, s := range w.slots {
		if s.p.unexpected() {
			w.mu.Lock()
			w.failures = append(w.failures, "worker exited by itself: "+s.p.describe())
			w.mu.Unlock()
			if err := w.start(s); err != nil {
				return err
			}
		}
	}
	return nil
}

// stopAll asks every worker to stop (SIGTERM: it closes its client and writes a final
// line), killing those that do not within grace.
func (w *workerPool) stopAll(grace time.Duration) {
	// A worker catches SIGTERM once it runs: wait for its first line (a fresh incarnation
	// may still be importing numpy), else SIGTERM's default action would kill it.
	deadline := time.Now().Add(grace)
	for _, s := range w.slots {
		for !s.p.exited() && !w.reported(s.p.name) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	var wg sync.WaitGroup
	for _, s := range w.slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A worker stuck past grace writes its stacks before the kill: Python's
			// faulthandler on SIGUSR1 (worker.py), Go's runtime on SIGQUIT.
			dump := syscall.SIGQUIT
			if s.lang == "python" {
				dump = syscall.SIGUSR1
			}
			var failure string
			switch {
			case s.p.unexpected():
				// (The loop's last look at the workers came before: a crash since, the
				// last chaos restart's say, went unseen.)
				failure = "worker exited by itself before the end: " + s.p.describe()
			case !s.p.exited() && !s.p.stopOrDump(grace, dump):
				failure = "worker did not stop cleanly on SIGTERM: " + s.p.describe()
			}
			if failure != "" {
				w.mu.Lock()
				w.failures = append(w.failures, failure)
				w.mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// reported tells whether incarnation name has written a counter line.
func (w *workerPool) reported(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last[name] != nil
}

// totals sums the last line of every incarnation.
func (w *workerPool) totals() Counters {
	w.mu.Lock()
	defer w.mu.Unlock()
	var t Counters
	for _, c := range w.last {
		t.add(c)
	}
	return t
}

// byLang sums the last line of every incarnation per worker language.
func (w *workerPool) byLang() map[string]*Counters {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]*Counters{}
	for _, s := range w.slots {
		if out[s.lang] == nil {
			out[s.lang] = &Counters{}
		}
	}
	for _, c := range w.last {
		if t := out[c.Lang]; t != nil {
			t.add(c)
		}
	}
	return out
}
