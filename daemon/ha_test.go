package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/internal/etcdtest"
	"github.com/fluxkv/fluxkv/master/ha"
)

// leaderTTL is the masters' --leader-ttl in the HA tests (the default).
const leaderTTL = 2 * time.Second

// haCluster is masters campaigning on a real etcd and owners following the leader
// there, each a real process on loopback.
type haCluster struct {
	t       *testing.T
	etcd    *etcdtest.Cluster
	cfg     ha.Config
	masters []*proc
	owners  []*proc
	clients []*fluxkv.Client
	// masterMetrics and ownerMetrics are the /metrics addresses.
	masterMetrics, ownerMetrics []string
}

func startHACluster(t *testing.T, etcd *etcdtest.Cluster, masters, owners int) *haCluster {
	t.Helper()
	c := &haCluster{t: t, etcd: etcd, cfg: ha.Config{Endpoints: etcd.Endpoints(), Prefix: ha.DefaultPrefix("hatest")}}
	for i := 0; i < masters; i++ {
		m := freePort(t)
		c.masters = append(c.masters, startMaster(t, "", append(c.masterFlags(), "--metrics-addr", m)...))
		c.masterMetrics = append(c.masterMetrics, m)
	}
	url := ha.Scheme + strings.Join(c.cfg.Endpoints, ",") + c.cfg.Prefix
	for i := 0; i < owners; i++ {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("o%d", i))
		m := freePort(t)
		o := startOwnerWith(t, dir, url, "64MiB", fmt.Sprintf("n%d", i), "--metrics-addr", m)
		c.owners = append(c.owners, o)
		c.ownerMetrics = append(c.ownerMetrics, m)
		c.clients = append(c.clients, connect(t, o.socket))
	}
	return c
}

func (c *haCluster) masterFlags() []string {
	return []string{"--etcd-endpoints", strings.Join(c.cfg.Endpoints, ","), "--etcd-prefix", c.cfg.Prefix,
		"--leader-ttl", leaderTTL.String()}
}

// leader is the index of the master leading on etcd with a published epoch, waiting
// up to timeout for one.
func (c *haCluster) leader(timeout time.Duration) (int, int64) {
	c.t.Helper()
	cli := c.etcd.Client(c.t)
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		cs, err := ha.Candidates(ctx, cli, c.cfg)
		cancel()
		if err == nil && len(cs) > 0 && cs[0].Epoch > 0 {
			for i, m := range c.masters {
				if m.addr == cs[0].Addr && !m.exited {
					return i, cs[0].Epoch
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.t.Fatalf("no master leads within %v", timeout)
	return -1, 0
}

// failoverLoad puts new keys and reads earlier ones through every owner until stop:
// a put that succeeds is recorded with its time; a read of any key must give its
// exact bytes or fail (UNAVAILABLE or a miss), never other bytes.
type failoverLoad struct {
	mu       sync.Mutex
	putAt    []time.Time // when each successful put started
	putEnd   []time.Time // and ended
	wrong    string
	puts     atomic.Int64
	putFails atomic.Int64
	gets     atomic.Int64
	getFails atomic.Int64
}

func (l *failoverLoad) run(c *haCluster, base []string, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w, cl := range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("load-%d-%d", w, i)
				val := clusterValue(1000*w+i, 512+rng.IntN(32<<10))
				started := time.Now()
				if err := cl.Put(key, val); err == nil {
					l.puts.Add(1)
					l.mu.Lock()
					l.putAt = append(l.putAt, started)
					l.putEnd = append(l.putEnd, time.Now())
					l.mu.Unlock()
				} else {
					l.putFails.Add(1)
					time.Sleep(20 * time.Millisecond)
				}
				j := rng.IntN(len(base))
				got, _, err := getBytes(cl, base[j])
				if err != nil {
					l.getFails.Add(1)
					continue
				}
				l.gets.Add(1)
				if want := baseValue(j); string(got) != string(want) {
					l.mu.Lock()
					if l.wrong == "" {
						l.wrong = fmt.Sprintf("%s through owner %d: %d bytes, want %d (wrong bytes)", base[j], w, len(got), len(want))
					}
					l.mu.Unlock()
				}
			}
		}()
	}
	return &wg
}

// firstPutAfter is the time from t0 to the end of the first successful put that
// started after it.
func (l *failoverLoad) firstPutAfter(t0 time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, at := range l.putAt {
		if at.After(t0) {
			return l.putEnd[i].Sub(t0), true
		}
	}
	return 0, false
}

func baseValue(i int) []byte { return clusterValue(i, 1+(i*7919)%(48<<10)) }

// putBase puts n keys spread over the owners.
func putBase(t *testing.T, c *haCluster, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("base-%d", i)
		if err := c.clients[i%len(c.clients)].Put(keys[i], baseValue(i)); err != nil {
			t.Fatalf("put %s: %v", keys[i], err)
		}
	}
	return keys
}

// readable counts the base keys that read byte-exact through their writer, failing
// the test on wrong bytes.
func readable(t *testing.T, c *haCluster, keys []string) int {
	t.Helper()
	n := 0
	for i, k := range keys {
		got, _, err := getBytes(c.clients[i%len(c.clients)], k)
		switch {
		case err == nil && string(got) == string(baseValue(i)):
			n++
		case err == nil:
			t.Fatalf("%s: wrong bytes after the failover (%d bytes)", k, len(got))
		default:
			t.Logf("%s not readable through owner %d: %v", k, i%len(c.clients), err)
		case !errors.Is(err, fluxkv.ErrKeyNotFound) && !errors.Is(err, fluxkv.ErrUnavailable):
			t.Fatalf("%s: %v", k, err)
		}
	}
	return n
}

// TestMasterFailover: three owners follow two masters on etcd; kill -9 of the leader
// during concurrent puts and gets loses no byte and returns no wrong one; the other
// master takes over, owners register with it (reporting their replicas), the first put
// succeeds within the leader TTL + 2s, and ≥ 95% of the earlier keys stay readable.
// With one etcd member and with three.
func TestMasterFailover(t *testing.T) {
	t.Parallel()
	for _, members := range []int{1, 3} {
		t.Run(fmt.Sprintf("etcd%d", members), func(t *testing.T) {
			etcd := etcdtest.Start(t, etcdtest.Options{Members: members})
			c := startHACluster(t, etcd, 2, 3)
			lead, epoch := c.leader(10 * time.Second)
			c.checkStatus(lead, epoch, 2)
			base := putBase(t, c, 150)

			var load failoverLoad
			stop := make(chan struct{})
			wg := load.run(c, base, stop)
			time.Sleep(time.Second)
			killed := time.Now()
			c.masters[lead].kill()
			next, nextEpoch := c.leader(leaderTTL + 10*time.Second)
			elected := time.Since(killed)
			reregistered := c.waitRegistered(next)
			waitFor(t, 15*time.Second, "a put after the failover", func() bool {
				_, ok := load.firstPutAfter(killed)
				return ok
			})
			time.Sleep(2 * time.Second)
			close(stop)
			wg.Wait()
			firstPut, _ := load.firstPutAfter(killed)
			if load.wrong != "" {
				t.Fatal(load.wrong)
			}
			n := readable(t, c, base)
			t.Logf("leader %d (epoch %d) killed; master %d leads with epoch %d after %v; every owner registered with it %v later; first put after %v; puts %d (%d failed), gets %d (%d failed); %d/%d earlier keys readable",
				lead, epoch, next, nextEpoch, elected.Round(time.Millisecond), reregistered.Round(time.Millisecond), firstPut.Round(time.Millisecond),
				load.puts.Load(), load.putFails.Load(), load.gets.Load(), load.getFails.Load(), n, len(base))
			if next == lead || nextEpoch <= epoch {
				t.Fatalf("after the kill master %d leads with epoch %d (was %d, epoch %d)", next, nextEpoch, lead, epoch)
			}
			if budget := leaderTTL + 2*time.Second; firstPut > budget+time.Second {
				// One second of slack for a loaded CI machine running -race binaries.
				t.Fatalf("first put %v after the kill; want within the leader TTL + 2s (%v)", firstPut, budget)
			}
			if n*100 < 95*len(base) {
				t.Fatalf("%d of %d earlier keys readable after the failover; want ≥ 95%%", n, len(base))
			}
			if reregistered > 2*time.Second {
				// Within 1s of the election; a second of slack for -race binaries on 2 busy cores.
				t.Fatalf("owners registered with the new leader %v after it published its epoch; want within 1s", reregistered)
			}
			c.checkStatus(next, nextEpoch, 1) // the killed master's key went with its lease
			if won := scrape(t, c.masterMetrics[next], `fluxkv_master_leadership_changes_total{change="won"}`); won != 1 {
				t.Fatalf("the new leader counts %v leaderships won, want 1", won)
			}
			for i, m := range c.ownerMetrics {
				if n := scrape(t, m, "fluxkv_master_reregistrations_total"); n < 1 {
					t.Fatalf("owner %d counts %v re-registrations, want ≥ 1", i, n)
				}
			}

			// A graceful stop (SIGTERM) resigns: a new master takes over at once, not
			// after the lease.
			third := startMaster(t, "", c.masterFlags()...)
			c.masters = append(c.masters, third)
			stopped := time.Now()
			go c.masters[next].cmd.Process.Signal(syscall.SIGTERM)
			handover := c.waitLeader(third.addr, 10*time.Second)
			waitFor(t, 10*time.Second, "a put through the third master", func() bool {
				return c.clients[1].Put("after-handover", clusterValue(5, 1000)) == nil
			})
			t.Logf("SIGTERM to the leader: the third master leads %v later; first put after %v", handover.Round(time.Millisecond), time.Since(stopped).Round(time.Millisecond))
			if handover >= leaderTTL {
				t.Fatalf("handover after a graceful stop took %v, not shorter than the %v lease: the leader did not resign", handover, leaderTTL)
			}
		})
	}
}

// waitLeader waits until the master at addr leads with a published epoch and returns
// how long that took.
func (c *haCluster) waitLeader(addr string, timeout time.Duration) time.Duration {
	c.t.Helper()
	cli := c.etcd.Client(c.t)
	t0 := time.Now()
	waitFor(c.t, timeout, "the leader at "+addr, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		cs, err := ha.Candidates(ctx, cli, c.cfg)
		return err == nil && len(cs) > 0 && cs[0].Addr == addr && cs[0].Epoch > 0
	})
	return time.Since(t0)
}

// waitRegistered waits until every owner logged its registration with master i and
// returns how long that took.
func (c *haCluster) waitRegistered(i int) time.Duration {
	c.t.Helper()
	t0 := time.Now()
	want := `"master":"` + c.masters[i].addr + `"`
	waitFor(c.t, 15*time.Second, "owners registered with the new leader", func() bool {
		for _, o := range c.owners {
			ok := false
			for _, line := range strings.Split(o.stderr.String(), "\n") {
				if strings.Contains(line, "registered with master") && strings.Contains(line, want) {
					ok = true
				}
			}
			if !ok {
				return false
			}
		}
		return true
	})
	return time.Since(t0)
}

// checkStatus checks the masters `fluxkv status` shows through every owner: n of them,
// the leader first with its epoch.
func (c *haCluster) checkStatus(lead int, epoch int64, n int) {
	c.t.Helper()
	for i, cl := range c.clients {
		st, err := cl.Stat()
		if err != nil {
			c.t.Fatalf("stat through owner %d: %v", i, err)
		}
		ms := st.Masters
		if len(ms) != n || ms[0].Addr != c.masters[lead].addr || !ms[0].Leader || ms[0].Epoch != epoch {
			c.t.Fatalf("stat through owner %d: masters %v; want %d, master %d (%s) leading with epoch %d", i, ms, n, lead, c.masters[lead].addr, epoch)
		}
		for _, m := range ms[1:] {
			if m.Leader || m.Epoch != 0 {
				c.t.Fatalf("stat through owner %d: a follower %v", i, m)
			}
		}
	}
	// The command line: `fluxkv status --json` and the table.
	out, err := exec.Command(bin, "status", "--json", "--socket", c.owners[0].socket).Output()
	var st struct {
		Masters []struct {
			Addr   string `json:"addr"`
			Leader bool   `json:"leader"`
			Epoch  int64  `json:"epoch"`
		} `json:"masters"`
	}
	if err != nil || json.Unmarshal(out, &st) != nil || len(st.Masters) != n ||
		st.Masters[0].Addr != c.masters[lead].addr || !st.Masters[0].Leader || st.Masters[0].Epoch != epoch {
		c.t.Fatalf("fluxkv status --json: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "status", "--socket", c.owners[0].socket).Output()
	if err != nil || !strings.Contains(string(out), "LEADER") || !strings.Contains(string(out), c.masters[lead].addr) {
		c.t.Fatalf("fluxkv status: %v\n%s", err, out)
	}
}

// TestMasterEtcdOutage: etcd killed under a leading master: the leader serves until its
// lease would have expired (never past the leader TTL after etcd's last answer), then
// the cluster stops taking puts; etcd restarted on the same data: a master leads again
// and the cluster serves, the earlier keys readable.
func TestMasterEtcdOutage(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t, etcdtest.Options{})
	c := startHACluster(t, etcd, 2, 2)
	_, epoch := c.leader(10 * time.Second)
	base := putBase(t, c, 60)

	killed := time.Now()
	etcd.Kill(0)
	// Since the kill: the start of the last put that succeeded, of the first refused.
	var served, refused time.Duration
	for i := 0; time.Since(killed) < leaderTTL+2*time.Second; i++ {
		started := time.Now()
		err := c.clients[0].Put(fmt.Sprintf("outage-%d", i), clusterValue(i, 1024))
		switch {
		case err == nil:
			served = started.Sub(killed)
		case errors.Is(err, fluxkv.ErrUnavailable):
			if refused == 0 {
				refused = started.Sub(killed)
			}
		default:
			t.Fatalf("put during the etcd outage: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("etcd killed: the leader served puts until %v, refused from %v", served.Round(time.Millisecond), refused.Round(time.Millisecond))
	if served == 0 || refused == 0 {
		t.Fatalf("want puts served right after the kill and refused after the lease: last served %v, first refused %v", served, refused)
	}
	if served >= leaderTTL {
		// The leader's fence is at most TTL − TTL/4 after etcd's last answer.
		t.Fatalf("a put started %v after etcd died succeeded: past the %v lease", served, leaderTTL)
	}

	etcd.Restart(0)
	restarted := time.Now()
	var ok bool
	waitFor(t, 30*time.Second, "a put after etcd returned", func() bool {
		ok = c.clients[1].Put("after-outage", clusterValue(7, 4096)) == nil
		return ok
	})
	_, epoch2 := c.leader(10 * time.Second)
	n := readable(t, c, base)
	t.Logf("etcd back: first put %v after its restart; epoch %d → %d; %d/%d earlier keys readable",
		time.Since(restarted).Round(time.Millisecond), epoch, epoch2, n, len(base))
	if n*100 < 95*len(base) {
		t.Fatalf("%d of %d earlier keys readable after the outage; want ≥ 95%%", n, len(base))
	}
}

// TestMasterCutOffFromEtcd: two masters as separate hosts (network namespaces on a
// bridge; etcd and the owners on the bridge's address); the leader's link goes down:
// it stops serving within the leader TTL (fenced: etcd no longer acknowledges its
// keepalives), the other master takes over and the owners serve through it; when the
// link comes back the old leader finds its lease gone and follows.
//
// Not parallel: the fence falls 1.5 s after the last acknowledged keepalive (the 2 s
// TTL less its margin) and is checked with 1.5 s of slack, and newNetns names its namespaces after the pid (as TestNetnsCluster's).
func TestMasterCutOffFromEtcd(t *testing.T) {
	ns := newNetns(t, 2)
	host := ns.prefix + "1"
	etcd := etcdtest.Start(t, etcdtest.Options{Host: host})
	c := &haCluster{t: t, etcd: etcd, cfg: ha.Config{Endpoints: etcd.Endpoints(), Prefix: ha.DefaultPrefix("cutoff")}}
	for i := range ns.names {
		port := strings.Split(freePort(t), ":")[1]
		mport := strings.Split(freePort(t), ":")[1]
		addr, metricsAddr := ns.addr(i)+":"+port, ns.addr(i)+":"+mport
		p := startWrapped(t, []string{"ip", "netns", "exec", ns.names[i]}, append([]string{"master", "--listen", addr,
			"--node-ttl", "2s", "--metrics-addr", metricsAddr}, append(masterAuth(), c.masterFlags()...)...)...)
		p.addr = addr
		c.masters = append(c.masters, p)
		c.masterMetrics = append(c.masterMetrics, metricsAddr)
	}
	url := ha.Scheme + strings.Join(c.cfg.Endpoints, ",") + c.cfg.Prefix
	for i := 0; i < 2; i++ {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("o%d", i))
		o := startOwnerWith(t, dir, url, "48MiB", fmt.Sprintf("n%d", i), "--peer-listen", host+":0")
		c.owners = append(c.owners, o)
		c.clients = append(c.clients, connect(t, o.socket))
	}
	lead, epoch := c.leader(15 * time.Second)
	base := putBase(t, c, 40)

	cut := time.Now()
	ns.ip("link", "set", ns.veths[lead], "down")
	waitFor(t, 3*leaderTTL, "the cut-off leader to fence itself", func() bool {
		return strings.Contains(c.masters[lead].stderr.String(), "fenced (not serving)")
	})
	fenced := time.Since(cut)
	c.masters[lead].exited = true // for leader(): not a candidate while cut off
	next, nextEpoch := c.leader(leaderTTL + 10*time.Second)
	elected := time.Since(cut)
	c.masters[lead].exited = false
	waitFor(t, 10*time.Second, "a put through the new leader", func() bool {
		return c.clients[0].Put("after-cut", clusterValue(3, 2048)) == nil
	})
	firstPut := time.Since(cut)
	n := readable(t, c, base)
	t.Logf("leader %d cut off: fenced after %v, master %d leads (epoch %d → %d) after %v, first put after %v; %d/%d keys readable",
		lead, fenced.Round(time.Millisecond), next, epoch, nextEpoch, elected.Round(time.Millisecond), firstPut.Round(time.Millisecond), n, len(base))
	// The fence falls at most TTL − TTL/4 after etcd's last acknowledgement (before the
	// cut), and the master logs it then; what the bound adds is slack for a busy
	// machine (the log line, this test's poll). That the fence precedes the lease's
	// expiry at etcd is master/ha's TestLeaderFencedWhenEtcdStops.
	if fenced > leaderTTL+time.Second {
		t.Fatalf("the cut-off leader fenced itself %v after the cut; want ≤ %v (its fence is %v after the last acknowledged keepalive)",
			fenced, leaderTTL+time.Second, leaderTTL-ha.Margin(leaderTTL))
	}
	if next == lead || nextEpoch <= epoch {
		t.Fatalf("master %d leads with epoch %d after the cut (was %d, epoch %d)", next, nextEpoch, lead, epoch)
	}
	if n*100 < 95*len(base) {
		t.Fatalf("%d of %d keys readable after the cut; want ≥ 95%%", n, len(base))
	}

	ns.ip("link", "set", ns.veths[lead], "up")
	waitFor(t, 10*time.Second, "the old leader to follow", func() bool {
		return strings.Contains(c.masters[lead].stderr.String(), "leadership lost; following")
	})
	if v := scrape(t, c.masterMetrics[lead], "fluxkv_master_leader"); v != 0 {
		t.Fatalf("the old leader's fluxkv_master_leader is %v after the heal", v)
	}
	if got, _, err := getBytes(c.clients[1], "after-cut"); err != nil || string(got) != string(clusterValue(3, 2048)) {
		t.Fatalf("get after the heal: %v", err)
	}
}
