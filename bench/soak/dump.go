package main

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"
)

// goroutineDump is an owner's goroutines at the end, read from the dump the Go runtime
// writes on SIGQUIT. The owner serves no pprof, so the count on /metrics cannot tell a
// leak from Kitex's RPC-timeout worker pool: a process-wide pool of up to 128 goroutines
// (kitex client.workerPool) that park for a minute after the load stops, and longer while
// heartbeats keep waking them. The dump tells them apart.
type goroutineDump struct {
	Total  int
	Pooled int // Kitex timeout-pool workers (bounded; not a leak)
	// ConnServers serve one cluster TCP connection each (Kitex's gonet transport and
	// the data plane read every connection in a goroutine of its own): bounded by the
	// pooled connections, which the TCP fd check bounds.
	ConnServers int
	Groups      map[string]int // the others by their first fluxkv or library frame
}

// kitexPoolFrame marks a goroutine of Kitex's RPC-timeout worker pool; connFrames
// one that serves a master or peer connection, or a data-plane connection.
const kitexPoolFrame = "kitex/client.(*timeoutPool).createWorker"

var connFrames = []string{
	"kitex/pkg/remote/trans/gonet.(*transServer).serveConn",
	"fluxkv/daemon/transfer.(*Server).serve(",
}

// unexplained is the number of goroutines neither pooled nor serving a connection.
func (d goroutineDump) unexplained() int { return d.Total - d.Pooled - d.ConnServers }

// dumpGoroutines stops owner o with SIGQUIT and parses the dump from its log.
func (c *cluster) dumpGoroutines(o *ownerProc) (goroutineDump, error) {
	var d goroutineDump
	o.p.killed.Store(true)
	o.p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-o.p.done:
	case <-time.After(10 * time.Second):
		o.p.kill()
		return d, fmt.Errorf("owner did not exit on SIGQUIT")
	}
	b, err := os.ReadFile(o.p.logPath)
	if err != nil {
		return d, fmt.Errorf("read the goroutine dump: %w", err)
	}
	text := string(b)
	i := strings.Index(text, "SIGQUIT")
	if i < 0 {
		return d, fmt.Errorf("no goroutine dump in %s", o.p.logPath)
	}
	d.Groups = map[string]int{}
	for _, block := range strings.Split(text[i:], "\n\n") {
		block = strings.TrimSpace(block)
		if !strings.HasPrefix(block, "goroutine ") {
			continue
		}
		d.Total++
		if strings.Contains(block, kitexPoolFrame) {
			d.Pooled++
			continue
		}
		if slices.ContainsFunc(connFrames, func(f string) bool { return strings.Contains(block, f) }) {
			d.ConnServers++
			continue
		}
		d.Groups[firstFrame(block)]++
	}
	if d.Total == 0 {
		return d, fmt.Errorf("empty goroutine dump in %s", o.p.logPath)
	}
	return d, nil
}

// firstFrame names a goroutine by its first frame outside the runtime and the standard
// library's sync and internal packages.
func firstFrame(block string) string {
	lines := strings.Split(block, "\n")
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "runtime.") || strings.HasPrefix(l, "sync.") ||
			strings.HasPrefix(l, "internal/") || strings.HasPrefix(l, "created by") {
			continue
		}
		if j := strings.LastIndex(l, "("); j > 0 {
			l = l[:j]
		}
		return l
	}
	return strings.TrimSuffix(lines[0], ":")
}

// summary lists the largest groups: "5×netpoll.(*x).y, 2×…".
func (d goroutineDump) summary(n int) string {
	keys := slices.Collect(maps.Keys(d.Groups))
	slices.SortFunc(keys, func(a, b string) int {
		if d.Groups[a] != d.Groups[b] {
			return d.Groups[b] - d.Groups[a]
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys[:min(n, len(keys))] {
		parts = append(parts, fmt.Sprintf("%d×%s", d.Groups[k], k))
	}
	return strings.Join(parts, ", ")
}
