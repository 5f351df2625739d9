package daemon_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/auth"
)

// The outside report's flood: per port, floodConns connections that connect, never send
// a byte, and are dialled again when the server closes them.
const (
	floodConns = 1000
	// floodMax stops a flood by itself if the test that started it does not.
	floodMax = 60 * time.Second
	// honestDials is the authenticated dials counted per port under the flood, and
	// honestGoal the share of them that must succeed.
	honestDials = 40
	honestGoal  = 0.95
	// rejoinSlack is how much longer than its normal time an owner's restart may take
	// under the flood. The goal is 2 s; the flood's 3,000 connections and the re-dials
	// share the two cores with the processes under test, so the deadline is that goal,
	// plus the normal time once more (a race-built process starts several times slower
	// when the cores are busy).
	rejoinSlack = 2 * time.Second
	// stallBudget bounds an overwrite under the flood. What the test holds is counted:
	// the owner is not tombed (the master keeps its replicas, it registers no second
	// time); this is only a deadline
	// against a hang, with room for a race-built master and owner on two busy cores
	// (3.4 s seen there, 0.3 s alone, 10 ms in a quiet run: 10 s left under 3× the
	// busy figure, so 20 s; what the report saw is caught by the counts, not this).
	stallBudget = 20 * time.Second
)

// floodEnv, in the environment of this test binary, makes it the flood process instead
// (see init): the addresses to flood, comma-separated. A process of its own, like the
// report's outside flood: its 3,000 goroutines do not share a Go scheduler with the
// members' dials the test counts.
const floodEnv = "FLUXKV_TEST_FLOOD"

func init() {
	if addrs := os.Getenv(floodEnv); addrs != "" {
		os.Exit(runFlood(strings.Split(addrs, ",")))
	}
}

// runFlood is the flood process: floodConns goroutines per address, each dialling from
// the loopback, reading until the server closes, and dialling again (after a short
// pause when the dial itself failed: a port that is down). It prints its counters every
// 200 ms ("dials D closed C dial_errors E open O") and stops when its stdin closes or
// after floodMax.
func runFlood(addrs []string) int {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	f := &flood{stopped: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	for _, addr := range addrs {
		for range floodConns {
			f.wg.Add(1)
			go f.run(addr)
		}
	}
	go func() {
		io.Copy(io.Discard, os.Stdin)
		f.stop()
	}()
	timer := time.AfterFunc(floodMax, f.stop)
	defer timer.Stop()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-f.stopped:
			f.wg.Wait()
			fmt.Println(f.counters())
			return 0
		case <-tick.C:
			fmt.Println(f.counters())
		}
	}
}

// flood is the flood process's state.
type flood struct {
	stopOnce sync.Once
	stopped  chan struct{}
	wg       sync.WaitGroup

	mu    sync.Mutex // protects conns
	conns map[net.Conn]struct{}

	dials, dialErrs, closed atomic.Int64
}

func (f *flood) run(addr string) {
	defer f.wg.Done()
	d := net.Dialer{Timeout: time.Second}
	buf := make([]byte, 64)
	for {
		select {
		case <-f.stopped:
			return
		default:
		}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			f.dialErrs.Add(1)
			select {
			case <-f.stopped:
				return
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		f.dials.Add(1)
		f.mu.Lock()
		select {
		case <-f.stopped:
			f.mu.Unlock()
			c.Close()
			return
		default:
		}
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		for {
			if _, err := c.Read(buf); err != nil {
				break
			}
		}
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		c.Close()
		f.closed.Add(1)
	}
}

// stop ends the dialling and closes every connection held; run's goroutines then end.
func (f *flood) stop() {
	f.stopOnce.Do(func() {
		f.mu.Lock()
		close(f.stopped)
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
	})
}

func (f *flood) counters() string {
	f.mu.Lock()
	open := len(f.conns)
	f.mu.Unlock()
	return fmt.Sprintf("dials %d closed %d dial_errors %d open %d", f.dials.Load(), f.closed.Load(), f.dialErrs.Load(), open)
}

// floodCounters is what the flood process last printed.
type floodCounters struct{ dials, closed, dialErrs, open int64 }

// floodProc is a running flood process.
type floodProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}

	mu   sync.Mutex // protects last
	last floodCounters
}

// startFlood runs the flood process against addrs; stop (or the test's Cleanup) ends it.
func startFlood(t *testing.T, addrs []string) *floodProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), floodEnv+"="+strings.Join(addrs, ","))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	fp := &floodProc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(fp.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var c floodCounters
			if _, err := fmt.Sscanf(sc.Text(), "dials %d closed %d dial_errors %d open %d", &c.dials, &c.closed, &c.dialErrs, &c.open); err == nil {
				fp.mu.Lock()
				fp.last = c
				fp.mu.Unlock()
			}
		}
	}()
	t.Cleanup(fp.stop)
	return fp
}

func (fp *floodProc) counters() floodCounters {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return fp.last
}

// stop ends the flood process (closing its stdin) and waits for it; it is killed when
// it does not end within stopBudget.
func (fp *floodProc) stop() {
	fp.stdin.Close()
	select {
	case <-fp.done:
	case <-time.After(stopBudget):
		fp.cmd.Process.Kill()
		<-fp.done
	}
	fp.cmd.Wait()
}

// honestHandshakes dials addr n times, one after another, as a member does (the hello
// within the 1 s members dial with), and returns how many authenticated and the first
// error.
func honestHandshakes(s *auth.Secrets, addr, purpose string, n int) (ok int, firstErr error) {
	for range n {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			err = auth.ClientHandshake(c, s, purpose, addr, time.Second)
			c.Close()
		}
		if err == nil {
			ok++
		} else if firstErr == nil {
			firstErr = err
		}
	}
	return ok, firstErr
}

// raiseNoFile lifts this process's RLIMIT_NOFILE (which the processes it starts
// inherit) to its hard limit, and skips the test when that holds fewer than need.
func raiseNoFile(t *testing.T, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < need && lim.Max > lim.Cur {
		old := lim.Cur
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			lim.Cur = old
			syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		})
	}
	if lim.Cur < need {
		t.Skipf("RLIMIT_NOFILE %d, the flood needs %d", lim.Cur, need)
	}
}

// Issue 24, item 2: with 1,000 silent connections re-dialled on each of the master's,
// an owner's peer and its data port, members still authenticate (≥ 95 % of 40 fresh
// dials per port), a remote get through the flooded data port answers, and the owner
// restarts and rejoins within 2 s of its normal time.
//
// Not parallel: it raises the process's RLIMIT_NOFILE, and its 3,000 connections and
// its restart and stall bounds need the cores to themselves.
func TestHandshakeFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a flood of 3,000 connections")
	}
	raiseNoFile(t, 3*floodConns+1024) // the flood process inherits it
	secrets, err := auth.LoadSecrets([]string{clusterSecret})
	if err != nil {
		t.Fatal(err)
	}
	masterMetrics, ownerMetrics := freePort(t), freePort(t)
	m := startMaster(t, "", "--metrics-addr", masterMetrics)
	peer, data := freePort(t), freePort(t)
	dir := filepath.Join(t.TempDir(), "n1")
	ownerArgs := []string{"--peer-listen", peer, "--data-listen", data, "--metrics-addr", ownerMetrics}
	startN1 := func() (*proc, time.Duration) {
		t0 := time.Now()
		p := startOwnerWith(t, dir, m.addr, "16MiB", "n1", ownerArgs...)
		return p, time.Since(t0)
	}
	n1, _ := startN1()
	n2 := startOwner(t, filepath.Join(t.TempDir(), "n2"), m.addr, "16MiB", "n2")
	c2 := connect(t, n2.socket)

	// The normal restart: stop n1, start it again until its socket is back (it opens it
	// only once registered). The slower of two.
	var normal time.Duration
	for range 2 {
		n1.stop()
		var d time.Duration
		n1, d = startN1()
		normal = max(normal, d)
	}
	c1 := connect(t, n1.socket)
	const keys = 20
	for i := range keys {
		if err := c1.Put(fmt.Sprintf("flood-%d", i), clusterValue(i, 4096)); err != nil {
			t.Fatal(err)
		}
	}

	ports := []struct{ name, addr, purpose, metrics string }{
		{"master", m.addr, auth.PurposeMaster, masterMetrics},
		{"peer", peer, auth.PurposePeer, ownerMetrics},
		{"data", data, auth.PurposeData, ownerMetrics},
	}
	shedCounts := func() []map[string]float64 {
		var out []map[string]float64
		for _, p := range ports {
			out = append(out, refusals(t, p.metrics, p.purpose))
		}
		return out
	}
	var addrs []string
	for _, p := range ports {
		addrs = append(addrs, p.addr)
	}
	shedBase := shedCounts()
	tFlood := time.Now()
	f := startFlood(t, addrs)
	// Let it reach its strength: as many dials as it has connections (the servers shed
	// as fast as it re-dials; what they have not accepted waits in the listen backlog,
	// and what does not fit there retries its SYN).
	waitFor(t, 30*time.Second, "the flood's connections", func() bool {
		return f.counters().dials >= int64(len(addrs))*floodConns
	})
	fc0 := f.counters()
	t.Logf("flood: %d dials, %d failed, %d open after %v", fc0.dials, fc0.dialErrs, fc0.open, time.Since(tFlood).Round(time.Millisecond))
	shed0 := shedCounts()
	tMeasure := time.Now()

	// Members dial every port at once, each port's dials one after another.
	type result struct {
		ok  int
		err error
		d   time.Duration
	}
	results := make([]result, len(ports))
	var wg sync.WaitGroup
	for i, p := range ports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			ok, err := honestHandshakes(secrets, p.addr, p.purpose, honestDials)
			results[i] = result{ok, err, time.Since(t0)}
		}()
	}
	// Remote gets through n2 pull from n1's flooded data plane.
	var getsOK int
	var getErr error
	for i := range keys {
		got, _, err := getBytes(c2, fmt.Sprintf("flood-%d", i))
		switch {
		case err == nil && bytes.Equal(got, clusterValue(i, 4096)):
			getsOK++
		case err == nil:
			t.Fatalf("remote get flood-%d under the flood: wrong bytes", i)
		case getErr == nil:
			getErr = err
		}
	}
	wg.Wait()
	elapsed := time.Since(tMeasure)
	shed1 := shedCounts()
	fc1 := f.counters()
	t.Logf("flood while measuring (%v): %d dials, %.0f connections closed by the servers a second (all ports), %d failed dials, %d open",
		elapsed.Round(time.Millisecond), fc1.dials-fc0.dials, float64(fc1.closed-fc0.closed)/elapsed.Seconds(), fc1.dialErrs-fc0.dialErrs, fc1.open)
	for i, p := range ports {
		r := results[i]
		var refused []string
		for _, reason := range []string{"shed", "source_cap", "auth", "cap"} {
			refused = append(refused, fmt.Sprintf("%s %.0f/s", reason, (shed1[i][reason]-shed0[i][reason])/elapsed.Seconds()))
		}
		t.Logf("%s port: %d/%d honest handshakes authenticated under the flood in %v (first error: %v); refused meanwhile: %s",
			p.name, r.ok, honestDials, r.d.Round(time.Millisecond), r.err, strings.Join(refused, ", "))
		if float64(r.ok) < honestGoal*honestDials {
			t.Errorf("%s port: %d/%d honest handshakes authenticated, want ≥ %.0f%%: %v", p.name, r.ok, honestDials, 100*honestGoal, r.err)
		}
	}
	// The flood holds each port at its bound: every port sheds a flood's worth while it
	// runs (counted, not timed: on a busy machine the flood dials more slowly, so this
	// may take longer than the measurement above).
	shedSince := func(now []map[string]float64, i int) float64 {
		return now[i]["shed"] + now[i]["source_cap"] - shedBase[i]["shed"] - shedBase[i]["source_cap"]
	}
	reached := func() bool {
		now := shedCounts()
		for i := range ports {
			if shedSince(now, i) < floodConns {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for !reached() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	shedEnd := shedCounts()
	for i, p := range ports {
		if n := shedSince(shedEnd, i); n < floodConns {
			t.Errorf("%s port shed %.0f connections in 30 s of flood, want ≥ %d: the flood did not reach the bound", p.name, n, floodConns)
		}
	}
	t.Logf("remote gets through the flooded data port: %d/%d (first error: %v)", getsOK, keys, getErr)
	if float64(getsOK) < honestGoal*keys {
		t.Errorf("remote gets under the flood: %d/%d answered, want ≥ %.0f%%: %v", getsOK, keys, 100*honestGoal, getErr)
	}

	// The restart under the flood: n1's own ports are flooded again as soon as it listens.
	n1.stop()
	n1, flooded := startN1()
	t.Logf("owner restart to rejoin: %v normally, %v under the flood (%d flood connections open)",
		normal.Round(time.Millisecond), flooded.Round(time.Millisecond), f.counters().open)
	if limit := normal + rejoinSlack + normal; flooded > limit {
		t.Errorf("owner restart under the flood took %v, normally %v: want at most %v (2 s goal plus the normal time as slack)",
			flooded, normal, limit)
	}
	// The restarted owner serves: a put through it and a remote get of it.
	c1 = connect(t, n1.socket)
	if err := c1.Put("flood-after", []byte("after")); err != nil {
		t.Fatalf("put through the restarted owner under the flood: %v", err)
	}
	if got, _, err := getBytes(c2, "flood-after"); err != nil || string(got) != "after" {
		t.Fatalf("remote get of a key of the restarted owner under the flood: %q %v", got, err)
	}
	// An overwrite through n2 of n1's key: the master reaches n1 on its flooded peer
	// port (the report: 6.4 s, and the owner tombed). A tomb drops n1's replicas on the
	// master at once (an anchor only n1 holds shows it) and makes n1 register again.
	if err := c1.Put("flood-anchor", []byte("anchor")); err != nil {
		t.Fatalf("put through the restarted owner under the flood: %v", err)
	}
	reregs := func() float64 {
		v, _ := scrapeIf(t, ownerMetrics, "fluxkv_master_reregistrations_total")
		return v
	}
	reregs0 := reregs()
	t0 := time.Now()
	if err := c2.Put("flood-after", []byte("again")); err != nil {
		t.Fatalf("overwrite under the flood: %v", err)
	}
	overwrite := time.Since(t0)
	got, _, err := getBytes(c1, "flood-after")
	t.Logf("overwrite of a key of the flooded owner: %v; read back through it: %q %v", overwrite.Round(time.Millisecond), got, err)
	if err != nil || string(got) != "again" {
		t.Fatalf("the flooded owner after an overwrite: %q %v, want %q", got, err, "again")
	}
	if m := member(t, c2, "n1"); !m.Alive || m.MemoryReplicas == 0 {
		t.Errorf("the flooded owner after the overwrite: alive %v, %d memory replicas (its anchor): the master tombed it", m.Alive, m.MemoryReplicas)
	}
	if n := reregs() - reregs0; n != 0 {
		t.Errorf("the flooded owner registered %.0f more times during the overwrite: the master tombed it", n)
	}
	if overwrite > stallBudget {
		t.Errorf("overwrite under the flood took %v, want under %v", overwrite, stallBudget)
	}
	f.stop()
}

// refusals reads fluxkv_conn_refused_total{socket} by reason from a node's /metrics
// (every reason is there from the start, at 0 until counted).
func refusals(t *testing.T, metricsAddr, socket string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "fluxkv_conn_refused_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(line, "} ")
		if !ok || !strings.Contains(labels, `socket="`+socket+`"`) {
			continue
		}
		_, reason, _ := strings.Cut(labels, `reason="`)
		reason, _, _ = strings.Cut(reason, `"`)
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatal(err)
		}
		out[reason] = v
	}
	return out
}
