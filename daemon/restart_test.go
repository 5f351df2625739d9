package daemon_test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/ssd"
)

// recoveryWindow is how long after a restarted master listens the owners' values must
// be readable again (re-registration and the replica reports included). Its bound is
// mostly the test's own reads (each client gets its ~330 keys one after another, under
// -race): the last key came back 0.7-0.9 s after the restart alone, 4.0 s beside another
// test process (a review of flaky tests); the recovery itself is in the log line.
const recoveryWindow = 10 * time.Second

// restartSize is the size of value i in the master restart tests: 1 B to 48 KiB,
// deterministic, both ends included.
func restartSize(i int) int {
	switch i % 97 {
	case 0:
		return 1
	case 1:
		return 48 << 10
	}
	return 1 + (i*7919)%(48<<10)
}

// pollKey is one key a recovery poll reads: want is its current value, old the value
// it had before an overwrite (nil when it was not overwritten), for the message.
type pollKey struct {
	key       string
	want, old []byte
}

// pollSpec is what a recovery poll reads through one client: live keys until each
// reads byte-exact once, cross keys (read through an owner other than their writer:
// the current value or a miss, every pass) and deleted keys (never any bytes).
type pollSpec struct {
	live, cross []pollKey
	dead        []string
}

// recovery is what a recovery poll saw. Safe for concurrent use.
type recovery struct {
	mu       sync.Mutex
	verified map[string]time.Duration // live key -> when it first read byte-exact, since t0
	deadMiss map[string]map[int]bool  // deleted key -> the clients it read KEY_NOT_FOUND through
	gets     map[string]int           // outcome -> count
	failure  string                   // the first read that broke a rule
}

func (r *recovery) count(what string) {
	r.mu.Lock()
	r.gets[what]++
	r.mu.Unlock()
}

func (r *recovery) fail(format string, args ...any) {
	r.mu.Lock()
	if r.failure == "" {
		r.failure = fmt.Sprintf(format, args...)
	}
	r.mu.Unlock()
}

func (r *recovery) failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failure != ""
}

// retryable says whether err is one a get may return while the owners re-register:
// a miss (the route not rebuilt yet) or UNAVAILABLE (master unreachable, or it does not
// know the owner yet).
func retryable(err error) bool {
	return errors.Is(err, fluxkv.ErrKeyNotFound) || errors.Is(err, fluxkv.ErrUnavailable)
}

// pollRecovery reads specs[i] through clients[i] (one goroutine per client with work)
// in passes until deadline: a live key is verified by its first byte-exact read and
// retried on a miss or UNAVAILABLE; any bytes that are not a key's current value, any
// bytes of a deleted key and any other error is a failure (reported, not fatal: the
// caller checks r.failure).
func pollRecovery(clients []*fluxkv.Client, specs []pollSpec, t0, deadline time.Time) *recovery {
	r := &recovery{verified: map[string]time.Duration{}, deadMiss: map[string]map[int]bool{}, gets: map[string]int{}}
	var wg sync.WaitGroup
	for ci, spec := range specs {
		if len(spec.live)+len(spec.cross)+len(spec.dead) == 0 {
			continue
		}
		wg.Add(1)
		go func(ci int, c *fluxkv.Client, spec pollSpec) {
			defer wg.Done()
			pending := spec.live
			for !r.failed() && time.Now().Before(deadline) {
				var left []pollKey
				for _, k := range pending {
					got, _, err := getBytes(c, k.key)
					switch {
					case err == nil && bytes.Equal(got, k.want):
						r.mu.Lock()
						r.verified[k.key] = time.Since(t0)
						r.mu.Unlock()
						r.count("ok")
					case err == nil && k.old != nil && bytes.Equal(got, k.old):
						r.fail("get %s through n%d %v after the restart: the version before its overwrite", k.key, ci, time.Since(t0))
						return
					case err == nil:
						r.fail("get %s through n%d %v after the restart: wrong bytes (%d B, want %d B)", k.key, ci, time.Since(t0), len(got), len(k.want))
						return
					case retryable(err):
						r.count(outcomeName(err))
						left = append(left, k)
					default:
						r.fail("get %s through n%d %v after the restart: %v", k.key, ci, time.Since(t0), err)
						return
					}
				}
				pending = left
				for _, k := range spec.cross {
					got, _, err := getBytes(c, k.key)
					switch {
					case err == nil && bytes.Equal(got, k.want):
						r.count("cross ok")
					case err == nil && k.old != nil && bytes.Equal(got, k.old):
						r.fail("get %s through n%d (not its writer) %v after the restart: the version before its overwrite", k.key, ci, time.Since(t0))
						return
					case err == nil:
						r.fail("get %s through n%d (not its writer) %v after the restart: wrong bytes (%d B, want %d B)", k.key, ci, time.Since(t0), len(got), len(k.want))
						return
					case retryable(err):
						r.count("cross " + outcomeName(err))
					default:
						r.fail("get %s through n%d (not its writer) %v after the restart: %v", k.key, ci, time.Since(t0), err)
						return
					}
				}
				for _, k := range spec.dead {
					got, _, err := getBytes(c, k)
					switch {
					case err == nil:
						r.fail("get %s through n%d %v after the restart: %d B of a deleted key, want KEY_NOT_FOUND", k, ci, time.Since(t0), len(got))
						return
					case errors.Is(err, fluxkv.ErrKeyNotFound):
						r.mu.Lock()
						if r.deadMiss[k] == nil {
							r.deadMiss[k] = map[int]bool{}
						}
						r.deadMiss[k][ci] = true
						r.mu.Unlock()
						r.count("deleted miss")
					case errors.Is(err, fluxkv.ErrUnavailable):
						// The master is not reachable or does not know this owner yet:
						// no answer about the key either way.
						r.count("deleted unavailable")
					default:
						r.fail("get %s (deleted) through n%d %v after the restart: %v", k, ci, time.Since(t0), err)
						return
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
		}(ci, clients[ci], spec)
	}
	wg.Wait()
	return r
}

func outcomeName(err error) string {
	if errors.Is(err, fluxkv.ErrKeyNotFound) {
		return "miss"
	}
	return "unavailable"
}

// summary is the verified count, when the first and the last live key came back (since
// the new master listened) and the outcome counts, for the log.
func (r *recovery) summary() (n int, when, gets string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first, last := time.Duration(-1), time.Duration(0)
	for _, d := range r.verified {
		if first < 0 || d < first {
			first = d
		}
		last = max(last, d)
	}
	if first >= 0 {
		when = fmt.Sprintf(": first after %v, last after %v", first.Round(time.Millisecond), last.Round(time.Millisecond))
	}
	names := make([]string, 0, len(r.gets))
	for k := range r.gets {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		gets += fmt.Sprintf(" %s=%d", k, r.gets[k])
	}
	return len(r.verified), when, gets
}

// TestMasterRestartKeepsCache: a master killed with SIGKILL and restarted on the same
// address is not a cache flush. Within 5 s of the new master listening, ≥ 99% of the
// values in the owners' memory read back byte-exact through their writers; no read
// ever returns wrong bytes, and neither a version overwritten nor a key deleted just
// before the kill comes back; holders open across the restart keep their bytes; the
// new master never hands out a reported range again (every recovered value still reads
// byte-exact after 50 more puts); nothing leaks.
//
// Not parallel: the recovery window includes this test's own reads, which slow
// down several times over when other tests share the two cores.
func TestMasterRestartKeepsCache(t *testing.T) {
	cl := startCluster(t, 3, "64MiB")
	const n = 1000
	key := func(i int) string { return fmt.Sprintf("rs-%04d", i) }
	want := make([][]byte, n) // current value; nil once deleted
	old := make([][]byte, n)  // the value before an overwrite
	writer := make([]int, n)  // the client of the latest put
	var total int
	for i := range want {
		want[i] = clusterValue(i, restartSize(i))
		writer[i] = i % 3
		total += len(want[i])
	}
	// Key i through cl.clients[i%3], one goroutine per owner.
	var wg sync.WaitGroup
	putErrs := make([]error, 3)
	for w := range 3 {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 3 {
				// UNAVAILABLE says retry (an owner whose heartbeats a loaded machine
				// delayed past its TTL registers again meanwhile).
				err := cl.clients[w].Put(key(i), want[i])
				for try := 0; errors.Is(err, fluxkv.ErrUnavailable) && try < 3; try++ {
					time.Sleep(200 * time.Millisecond)
					err = cl.clients[w].Put(key(i), want[i])
				}
				if err != nil {
					putErrs[w] = fmt.Errorf("put %s (%d B) through n%d: %w", key(i), len(want[i]), w, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	if err := errors.Join(putErrs...); err != nil {
		t.Fatal(err)
	}

	// Holders open across the restart: a local one on every owner, of a key it put,
	// and one on n1 of bytes pulled from n0 (key 3 was put through n0).
	type held struct {
		h    *fluxkv.MemHolder
		i    int
		want []byte
	}
	var holders []held
	for o := range 3 {
		h, err := cl.clients[o].Get(key(o))
		if err != nil {
			t.Fatalf("local get %s through n%d: %v", key(o), o, err)
		}
		if h.Remote() {
			t.Fatalf("get %s through n%d, the owner that put it: Remote() = true, want a local holder", key(o), o)
		}
		holders = append(holders, held{h, o, bytes.Clone(want[o])})
	}
	h, err := cl.clients[1].Get(key(3))
	if err != nil {
		t.Fatalf("remote get %s through n1: %v", key(3), err)
	}
	if !h.Remote() {
		t.Fatalf("get %s (put through n0) through n1: Remote() = false, want a pull", key(3))
	}
	holders = append(holders, held{h, 3, bytes.Clone(want[3])})
	for _, hd := range holders {
		if !bytes.Equal(hd.h.Bytes(), hd.want) {
			t.Fatalf("holder of %s: wrong bytes before the restart", key(hd.i))
		}
	}

	// Just before the kill: 20 overwrites and 20 deletes, half through the owner that
	// put the key and half through another.
	var overwritten, deleted []int
	for j := range 20 {
		i := 100 + j
		w := i % 3
		if j%2 == 1 {
			w = (i + 1) % 3
		}
		v := clusterValue(i+7777, restartSize(i+500))
		if bytes.Equal(v, want[i]) {
			t.Fatalf("the overwrite of %s equals its first value", key(i))
		}
		if err := cl.clients[w].Put(key(i), v); err != nil {
			t.Fatalf("overwrite %s through n%d: %v", key(i), w, err)
		}
		old[i], want[i], writer[i] = want[i], v, w
		overwritten = append(overwritten, i)
	}
	for j := range 20 {
		i := 200 + j
		w := i % 3
		if j%2 == 1 {
			w = (i + 2) % 3
		}
		if existed, err := cl.clients[w].Delete(key(i)); err != nil || !existed {
			t.Fatalf("delete %s through n%d: existed=%v err=%v", key(i), w, existed, err)
		}
		want[i] = nil
		deleted = append(deleted, i)
	}

	addr := cl.master.addr
	cl.master.kill()
	cl.master = startMaster(t, addr)
	t0 := time.Now()

	// Every live key through its latest writer; every overwritten key also through the
	// owners that did not write it last; every deleted key through every owner.
	specs := make([]pollSpec, 3)
	var live []string
	for i := range n {
		if want[i] == nil {
			continue
		}
		live = append(live, key(i))
		specs[writer[i]].live = append(specs[writer[i]].live, pollKey{key(i), want[i], old[i]})
	}
	for _, i := range overwritten {
		for o := range 3 {
			if o != writer[i] {
				specs[o].cross = append(specs[o].cross, pollKey{key(i), want[i], old[i]})
			}
		}
	}
	for o := range 3 {
		for _, i := range deleted {
			specs[o].dead = append(specs[o].dead, key(i))
		}
	}
	r := pollRecovery(cl.clients, specs, t0, t0.Add(recoveryWindow))
	if r.failure != "" {
		t.Fatal(r.failure)
	}
	back, when, gets := r.summary()
	t.Logf("%d of %d live keys (%d MiB) read back byte-exact within %v of the new master%s; gets:%s",
		back, len(live), total>>20, recoveryWindow, when, gets)
	if back*100 < 99*len(live) {
		t.Fatalf("%d of %d live keys read back within %v of the master restart (%d missing), want >= 99%%",
			back, len(live), recoveryWindow, len(live)-back)
	}
	for _, i := range deleted {
		if len(r.deadMiss[key(i)]) < 2 {
			t.Errorf("deleted %s read KEY_NOT_FOUND through %d owners during the window, want >= 2 (the rest UNAVAILABLE)", key(i), len(r.deadMiss[key(i)]))
		}
	}

	for _, hd := range holders {
		if !bytes.Equal(hd.h.Bytes(), hd.want) {
			t.Fatalf("holder of %s opened before the restart: its bytes changed", key(hd.i))
		}
		if err := hd.h.Release(); err != nil {
			t.Fatalf("release the holder of %s: %v", key(hd.i), err)
		}
	}

	// The new master allocates: 50 puts, each read back through another owner and its
	// writer. None may land on a range an owner reported or a holder pinned.
	var extra []string
	for j := range 50 {
		k := fmt.Sprintf("rs-new-%02d", j)
		v := clusterValue(5000+j, restartSize(5000+j))
		if err := cl.clients[j%3].Put(k, v); err != nil {
			t.Fatalf("put %s through n%d after the restart: %v", k, j%3, err)
		}
		extra = append(extra, k)
		for _, o := range []int{(j + 1) % 3, j % 3} {
			got, _, err := getBytes(cl.clients[o], k)
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get %s through n%d after the restart: err=%v, byte-exact=%v", k, o, err, err == nil && bytes.Equal(got, v))
			}
		}
	}
	for i := range n {
		if _, ok := r.verified[key(i)]; !ok {
			continue
		}
		got, _, err := getBytes(cl.clients[writer[i]], key(i))
		if err != nil {
			t.Fatalf("get %s through n%d after the new master allocated: %v (it read back before)", key(i), writer[i], err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Fatalf("get %s through n%d after the new master allocated: wrong bytes (a reported range handed out again?)", key(i), writer[i])
		}
	}
	for _, i := range deleted {
		for o := range 3 {
			if got, _, err := getBytes(cl.clients[o], key(i)); !errors.Is(err, fluxkv.ErrKeyNotFound) {
				t.Fatalf("deleted %s through n%d after the window: %d B, err=%v, want KEY_NOT_FOUND", key(i), o, len(got), err)
			}
		}
	}
	for _, i := range overwritten {
		for o := range 3 {
			got, _, err := getBytes(cl.clients[o], key(i))
			if err != nil || !bytes.Equal(got, want[i]) {
				t.Fatalf("overwritten %s through n%d after the window: err=%v, current value=%v, old value=%v",
					key(i), o, err, err == nil && bytes.Equal(got, want[i]), err == nil && bytes.Equal(got, old[i]))
			}
		}
	}
	// Gets answered STALE_GENERATION ask for a registration while the heartbeat loop does
	// too: only one may happen (a second would make the master drop the first's report).
	for o, p := range cl.owners {
		if log := p.stderr.String(); strings.Contains(log, "replica index forgotten") || strings.Count(log, "replica index reported") != 1 {
			t.Errorf("n%d registered more than once after the restart, or forgot its index:\n%s", o, tail(log))
		}
	}
	leakCheck(t, cl.clients[0], append(live, extra...)...)
}

// TestMasterRestartWithOwner: when the master and one owner die together (SIGKILL) and
// both restart, the surviving owner's values read back byte-exact through it within 5 s
// of the new master listening (>= 99%); the restarted owner is a new, empty generation:
// its predecessor's keys read KEY_NOT_FOUND through every owner, and puts through it
// work and read back everywhere; nothing leaks.
//
// Not parallel: the recovery window includes this test's own reads, which slow
// down several times over when other tests share the two cores.
func TestMasterRestartWithOwner(t *testing.T) {
	cl := startCluster(t, 2, "32MiB")
	const n = 100
	aKey := func(i int) string { return fmt.Sprintf("a-%03d", i) }
	bKey := func(i int) string { return fmt.Sprintf("b-%03d", i) }
	aVal := func(i int) []byte { return clusterValue(i, restartSize(i)) }
	bVal := func(i int) []byte { return clusterValue(1000+i, restartSize(1000+i)) }
	for i := range n {
		if err := cl.clients[0].Put(aKey(i), aVal(i)); err != nil {
			t.Fatalf("put %s through n0: %v", aKey(i), err)
		}
		if err := cl.clients[1].Put(bKey(i), bVal(i)); err != nil {
			t.Fatalf("put %s through n1: %v", bKey(i), err)
		}
	}
	gen := cl.clients[1].Generation()
	dir1 := filepath.Dir(cl.owners[1].socket)

	addr := cl.master.addr
	cl.master.kill()
	cl.owners[1].kill()
	cl.master = startMaster(t, addr)
	t0 := time.Now()

	// n0's keys through n0, and n1's through n0 (never any bytes), while n1 restarts.
	specs := make([]pollSpec, 2)
	var aKeys, bKeys []string
	for i := range n {
		aKeys = append(aKeys, aKey(i))
		bKeys = append(bKeys, bKey(i))
		specs[0].live = append(specs[0].live, pollKey{key: aKey(i), want: aVal(i)})
	}
	specs[0].dead = bKeys
	done := make(chan *recovery, 1)
	go func() { done <- pollRecovery(cl.clients, specs, t0, t0.Add(recoveryWindow)) }()
	cl.owners[1] = startOwner(t, dir1, addr, "32MiB", "n1")
	restarted := time.Since(t0)
	r := <-done
	if r.failure != "" {
		t.Fatal(r.failure)
	}
	back, when, gets := r.summary()
	t.Logf("n1 restarted (socket up) %v after the new master; %d of %d of n0's keys read back byte-exact through n0 within %v%s; gets:%s",
		restarted.Round(time.Millisecond), back, n, recoveryWindow, when, gets)
	if back*100 < 99*n {
		t.Fatalf("%d of %d of n0's keys read back through n0 within %v of the master restart (%d missing), want >= 99%%",
			back, n, recoveryWindow, n-back)
	}

	// Puts through the restarted owner (its client attaches to the new incarnation).
	var cKeys []string
	first0 := clusterValue(3000, 4096)
	waitFor(t, 10*time.Second, "a put through the restarted n1", func() bool {
		return cl.clients[1].Put("c-000", first0) == nil
	})
	cKeys = append(cKeys, "c-000")
	if g := cl.clients[1].Generation(); g == gen {
		t.Fatalf("n1's client still sees generation %d after the owner restarted", g)
	}
	for j := 1; j < 20; j++ {
		k := fmt.Sprintf("c-%03d", j)
		if err := cl.clients[1].Put(k, clusterValue(3000+j, restartSize(3000+j))); err != nil {
			t.Fatalf("put %s through the restarted n1: %v", k, err)
		}
		cKeys = append(cKeys, k)
	}
	for j, k := range cKeys {
		v := first0
		if j > 0 {
			v = clusterValue(3000+j, restartSize(3000+j))
		}
		for o := range 2 {
			got, _, err := getBytes(cl.clients[o], k)
			if err != nil || !bytes.Equal(got, v) {
				t.Fatalf("get %s (put through the restarted n1) through n%d: err=%v, byte-exact=%v", k, o, err, err == nil && bytes.Equal(got, v))
			}
		}
	}
	// The killed incarnation's keys are gone everywhere.
	for _, k := range bKeys {
		for o := range 2 {
			if got, _, err := getBytes(cl.clients[o], k); !errors.Is(err, fluxkv.ErrKeyNotFound) {
				t.Fatalf("%s (put through the killed n1) through n%d: %d B, err=%v, want KEY_NOT_FOUND", k, o, len(got), err)
			}
		}
	}
	// n0's recovered values survived the new owner's puts and the new master's allocations.
	for i := range n {
		if _, ok := r.verified[aKey(i)]; !ok {
			continue
		}
		got, _, err := getBytes(cl.clients[0], aKey(i))
		if err != nil || !bytes.Equal(got, aVal(i)) {
			t.Fatalf("get %s through n0 after the restarts: err=%v, byte-exact=%v", aKey(i), err, err == nil && bytes.Equal(got, aVal(i)))
		}
	}
	leakCheck(t, cl.clients[0], append(aKeys, cKeys...)...)
}

// TestMasterRestartReportsInBatches: an index larger than one report (REPORT_BATCH,
// 4,096 records) goes in several calls, and every record is adopted within 5 s of the
// new master's start (the owner's log says so); then all 5,000 small values of the owner
// exist and read back byte-exact. The window does not include this test's own 5,000-key
// reads (each key one master call today: seconds under -race on a busy machine).
//
// Not parallel: the report must finish within the window while other tests share
// the two cores.
func TestMasterRestartReportsInBatches(t *testing.T) {
	cl := startCluster(t, 1, "16MiB")
	c := cl.clients[0]
	const n = 5000
	items := make([]fluxkv.PutItem, n)
	keys := make([]string, n)
	for i := range items {
		keys[i] = fmt.Sprintf("b-%05d", i)
		items[i] = fluxkv.PutItem{Key: keys[i], Value: clusterValue(i, 1+i%300)}
	}
	errs, err := c.BatchPut(items, fluxkv.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("put %s: %v", keys[i], e)
		}
	}
	cl.master.kill()
	cl.master = startMaster(t, cl.master.addr)
	t0 := time.Now()
	waitFor(t, recoveryWindow, "every record adopted after the restart", func() bool {
		return strings.Contains(cl.owners[0].stderr.String(), `"adopted":5000`)
	})
	t.Logf("%d records adopted %v after the new master started", n, time.Since(t0).Round(time.Millisecond))
	found, err := c.BatchExists(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, ok := range found {
		if !ok {
			t.Fatalf("%s does not exist after the report was adopted", keys[i])
		}
	}
	hs, errs, err := c.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if errs[i] != nil {
			t.Fatalf("get %s: %v", keys[i], errs[i])
		}
		if !bytes.Equal(h.Bytes(), clusterValue(i, 1+i%300)) {
			t.Fatalf("get %s: wrong bytes", keys[i])
		}
		h.Release()
	}
	leakCheck(t, c, keys...)
}

// TestMasterRestartKeepsSSD: values whose only copy is on an owner's SSD come back too:
// the owner reports its SSD ring's entries and the new master routes gets to them.
//
// Not parallel: the recovery window includes this test's own reads, which slow
// down several times over when other tests share the two cores.
func TestMasterRestartKeepsSSD(t *testing.T) {
	ssdDir := t.TempDir()
	if err := ssd.ProbeDirectIO(ssdDir); err != nil {
		t.Skipf("no O_DIRECT under %s: %v", ssdDir, err)
	}
	m := startMaster(t, "", "--placement", "local")
	o := startOwnerWith(t, filepath.Join(t.TempDir(), "o0"), m.addr, "16MiB", "n0", "--ssd-path", ssdDir, "--ssd-limit", "128MiB")
	c := connect(t, o.socket)
	const n, size = 30, 1<<20 + 77 // 30 MiB through a 14 MiB pool: most only on SSD
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("ssd-%d", i)
		if err := c.Put(keys[i], clusterValue(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "every value persisted", func() bool {
		st, err := c.Stat()
		return err == nil && len(st.Members) == 1 && st.Members[0].SsdReplicas == n
	})
	m.kill()
	m = startMaster(t, m.addr, "--placement", "local")
	t0 := time.Now()
	fromSSD := 0
	for i, k := range keys {
		var got []byte
		var source string
		waitFor(t, recoveryWindow-time.Since(t0), "key "+k+" back", func() bool {
			h, err := c.Get(k)
			if err != nil {
				return false
			}
			defer h.Release()
			got, source = bytes.Clone(h.Bytes()), h.Source()
			return true
		})
		if !bytes.Equal(got, clusterValue(i, size)) {
			t.Fatalf("get %s after the restart: wrong bytes (source %s)", k, source)
		}
		if source == "ssd" {
			fromSSD++
		}
	}
	t.Logf("%d keys back within %v of the new master, %d of them from SSD", n, time.Since(t0).Round(time.Millisecond), fromSSD)
	if fromSSD == 0 {
		t.Fatal("no key came back from SSD")
	}
	leakCheck(t, c, keys...)
}
