package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/internal/testbytes"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/ssd"
)

// node is an in-process master + owner pair (they still meet over TCP and the owner
// serves real Unix sockets and a real memfd). In-process so a test can hand the SSD
// tier an error-injecting file (ssd.Faults): the one kind of fake the
// tests allow: a fault the real thing cannot produce on demand.
type node struct {
	m    *master.Server
	o    *Owner
	c    *fluxkv.Client
	opts Options // the owner's; addOwner starts more owners from it
}

func startNode(t testing.TB, dram int64, so *ssd.Options, mo master.Options, tweaks ...func(*Options)) *node {
	t.Helper()
	log := zerolog.Nop()
	if testing.Verbose() {
		log = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	}
	mo.Logger = &log
	secrets := authtest.Secrets(t)
	masterKey, masterKeys := authtest.MasterKeys(t)
	if !mo.InsecureCluster {
		mo.Secrets, mo.MasterKey = secrets, masterKey
	} else {
		masterKeys = nil
	}
	m, err := master.NewServer(mo)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	opts := Options{Dir: t.TempDir(), DRAM: dram, MasterAddr: m.Addr().String(), NodeID: "n1", SSD: so, Logger: &log,
		Secrets: mo.Secrets, InsecureCluster: mo.InsecureCluster, MasterKeys: masterKeys}
	for _, f := range tweaks {
		f(&opts)
	}
	t.Cleanup(func() { m.Stop() }) // after the owner's (cleanups run last first)
	o, c := startOwnerClient(t, opts, t.Name())
	return &node{m: m, o: o, c: c, opts: opts}
}

// startOwnerClient starts an in-process owner with opts and attaches a client named
// name; both are stopped when the test ends.
func startOwnerClient(t testing.TB, opts Options, name string) (*Owner, *fluxkv.Client) {
	t.Helper()
	o, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := fluxkv.Connect(fluxkv.Options{Socket: o.SocketPath(), Name: name})
	if err != nil {
		o.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		o.Stop()
	})
	return o, c
}

// value is the test value of seed: n bytes.
func value(seed, n int) []byte { return testbytes.Value(seed, n) }

func ssdOptions(t testing.TB, limit int64) *ssd.Options {
	dir := t.TempDir()
	if err := ssd.ProbeDirectIO(dir); err != nil {
		t.Skipf("no O_DIRECT under %s: %v", dir, err)
	}
	return &ssd.Options{Cluster: "test", InstanceKey: "n1", Paths: []string{dir}, Limits: []int64{limit}}
}

// waitPersisted waits until no put is waiting for its SSD persist.
func (n *node) waitPersisted(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		pending := 0
		n.m.Inspect(func(st *master.State) { pending = st.PendingPersists() })
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d persists still pending", pending)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ssdReplicasOf is the count of SSD replicas the master records on owner id.
func (n *node) ssdReplicasOf(t testing.TB, id string) int64 {
	t.Helper()
	st, err := n.c.Stat()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.NodeId == id {
			return m.SsdReplicas
		}
	}
	t.Fatalf("node %q is not a member", id)
	return 0
}

func (n *node) usage(t testing.TB) (memUsed, holders, ssdReplicas int64) {
	t.Helper()
	n.c.Flush()
	st, err := n.c.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m := st.Members[0]
	return m.MemorySegment.UsedBytes, m.Holders, m.SsdReplicas
}

// drain deletes keys and requires memory back to empty and no SSD replica left.
func (n *node) drain(t testing.TB, keys []string) {
	t.Helper()
	if _, err := n.c.BatchDelete(keys); err != nil {
		t.Fatal(err)
	}
	n.waitPersisted(t)
	deadline := time.Now().Add(3 * time.Second)
	for {
		used, holders, ssdReps := n.usage(t)
		if used == 0 && holders == 0 && ssdReps == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("leak: used=%d holders=%d ssd replicas=%d", used, holders, ssdReps)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readAll gets every key and checks its bytes; it returns hits by source and misses.
func readAll(t *testing.T, c *fluxkv.Client, keys []string, want func(i int) []byte) (mem, fromSSD, misses int) {
	t.Helper()
	for i, k := range keys {
		h, err := c.Get(k)
		if errors.Is(err, fluxkv.ErrKeyNotFound) {
			misses++
			continue
		}
		if err != nil {
			t.Fatalf("get %s: %v", k, err)
		}
		if !bytes.Equal(h.Bytes(), want(i)) {
			t.Fatalf("get %s (%s): wrong bytes", k, h.Source())
		}
		if h.Source() == "ssd" {
			fromSSD++
		} else {
			mem++
		}
		h.Release()
	}
	return
}

// TestSSDTierReadBack: a dataset of 3× DRAM with unaligned sizes reads back completely
// and byte-exact with SSD on, part of it refilled from SSD (also into a segment sealed
// by client isolation: the owner's O_DIRECT reads still land); with SSD off the same
// workload misses.
func TestSSDTierReadBack(t *testing.T) {
	t.Parallel()
	const dram = 16 << 20
	sizeOf := func(i int) int { return 512<<10 + i*4099 + 1 } // unaligned, ~0.5–0.7 MiB
	var keys []string
	total := 0
	for i := 0; total < 3*dram; i++ {
		keys = append(keys, fmt.Sprintf("ds-%d", i))
		total += sizeOf(i)
	}
	want := func(i int) []byte { return value(i, sizeOf(i)) }
	for _, tc := range []struct{ on, isolated bool }{{true, false}, {true, true}, {false, false}} {
		on := tc.on
		t.Run(fmt.Sprintf("ssd=%v,isolated=%v", on, tc.isolated), func(t *testing.T) {
			var so *ssd.Options
			if on {
				so = ssdOptions(t, 256<<20)
			}
			n := startNode(t, dram, so, master.Options{}, func(o *Options) { o.ClientIsolation = tc.isolated })
			if n.c.Isolated() != tc.isolated {
				t.Fatalf("client isolated=%v, want %v", n.c.Isolated(), tc.isolated)
			}
			for i, k := range keys {
				if err := n.c.Put(k, want(i)); err != nil {
					t.Fatalf("put %s: %v", k, err)
				}
			}
			n.waitPersisted(t)
			mem, fromSSD, misses := readAll(t, n.c, keys, want)
			t.Logf("ssd=%v: %d keys (%d MiB, %d× DRAM): %d memory hits, %d SSD hits, %d misses", on, len(keys), total>>20, total/dram, mem, fromSSD, misses)
			if on && (misses != 0 || fromSSD == 0) {
				t.Fatalf("with SSD on every key must read back, part from SSD: %d misses, %d SSD hits", misses, fromSSD)
			}
			if !on && (misses == 0 || fromSSD != 0) {
				t.Fatalf("with SSD off the dataset cannot fit: %d misses, %d SSD hits", misses, fromSSD)
			}
			n.drain(t, keys)
		})
	}
}

// TestSSDOverwriteDeleteRace: overwrites and deletes racing in-flight persists never
// make an old version readable, from memory or from SSD.
func TestSSDOverwriteDeleteRace(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, ssdOptions(t, 256<<20), master.Options{})
	const keys, rounds = 4, 30
	var wg sync.WaitGroup
	errc := make(chan error, keys)
	for k := 0; k < keys; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			key := fmt.Sprintf("race-%d", k)
			for r := 0; r < rounds; r++ {
				v := value(k*1000+r, 300000+r)
				if err := n.c.Put(key, v); err != nil {
					errc <- err
					return
				}
				if r%7 == 3 {
					if _, err := n.c.Delete(key); err != nil {
						errc <- err
						return
					}
					if _, err := n.c.Get(key); !errors.Is(err, fluxkv.ErrKeyNotFound) {
						errc <- fmt.Errorf("%s: get after delete: %v", key, err)
						return
					}
					continue
				}
				// Push memory replicas out so the next read may come from SSD.
				if r%3 == 0 {
					for f := 0; f < 4; f++ {
						n.c.Put(fmt.Sprintf("filler-%d-%d", k, f), value(f, 1<<20))
					}
				}
				h, err := n.c.Get(key)
				if errors.Is(err, fluxkv.ErrKeyNotFound) {
					continue // evicted from memory before its persist: a miss, never old bytes
				}
				if err != nil {
					errc <- err
					return
				}
				if !bytes.Equal(h.Bytes(), v) {
					errc <- fmt.Errorf("%s round %d: read a stale version (source %s)", key, r, h.Source())
				}
				h.Release()
			}
		}(k)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	var all []string
	for k := 0; k < keys; k++ {
		all = append(all, fmt.Sprintf("race-%d", k))
		for f := 0; f < 4; f++ {
			all = append(all, fmt.Sprintf("filler-%d-%d", k, f))
		}
	}
	n.drain(t, all)
}

// TestSSDRingEvictionConverges: a small SSD ring overwrites old entries; the owner
// reports them and the master's routes converge: gets of overwritten keys miss
// cleanly, never error.
func TestSSDRingEvictionConverges(t *testing.T) {
	t.Parallel()
	n := startNode(t, 4<<20, ssdOptions(t, 8<<20), master.Options{})
	var keys []string
	for i := 0; i < 40; i++ { // 40 MiB through an 8 MiB ring and a 4 MiB segment
		k := fmt.Sprintf("ring-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, ssdReps := n.usage(t)
		if ssdReps <= 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("routes did not converge: %d SSD replicas for an 8 MiB ring", ssdReps)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mem, fromSSD, misses := readAll(t, n.c, keys, func(i int) []byte { return value(i, 1<<20) })
	t.Logf("after 40 MiB through an 8 MiB ring: %d memory hits, %d SSD hits, %d misses", mem, fromSSD, misses)
	if misses == 0 || mem+fromSSD == 0 {
		t.Fatalf("expected some hits and some clean misses")
	}
	n.drain(t, keys)
}

// TestSSDReadErrorReplans: an injected SSD read error drops that SSD replica and the
// get re-plans: the result is a clean miss, never wrong bytes, and the node serves on.
func TestSSDReadErrorReplans(t *testing.T) {
	t.Parallel()
	faults := &ssd.Faults{}
	so := ssdOptions(t, 64<<20)
	so.OpenFile = faults.OpenFile
	n := startNode(t, 4<<20, so, master.Options{})
	var keys []string
	for i := 0; i < 12; i++ {
		k := fmt.Sprintf("fe-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	// ring-0 .. are out of memory now; their reads come from SSD.
	faults.Fail(ssd.OpRead, syscall.EIO, 1)
	h, err := n.c.Get(keys[0])
	if !errors.Is(err, fluxkv.ErrKeyNotFound) {
		if err == nil {
			t.Fatalf("first SSD read was to fail; got a %s holder", h.Source())
		}
		t.Fatalf("want a clean miss after the failed SSD read, got %v", err)
	}
	if _, _, ssdReps := n.usage(t); ssdReps >= int64(len(keys)) {
		t.Fatalf("the failed SSD replica was not dropped: %d SSD replicas", ssdReps)
	}
	// Later reads succeed and are byte-exact.
	_, fromSSD, _ := readAll(t, n.c, keys[1:], func(i int) []byte { return value(i+1, 1<<20) })
	if fromSSD == 0 {
		t.Fatal("no SSD hit after the fault cleared")
	}
	n.drain(t, keys)
}

// BenchmarkSSDHitGet measures SSD-hit gets (memory replicas evicted, promotion off)
// from the Go client with 8 concurrent readers, and reports GiB/s and latency
// percentiles. Compare with fio at the same block size and iodepth 8 on the same disk:
//
//	go test ./daemon -run '^$' -bench SSDHitGet -benchtime 5s
//	fio --name=r --filename=$DIR/f --direct=1 --rw=randread --bs=1M --iodepth=8 --ioengine=io_uring --size=2G --runtime=10 --time_based
func BenchmarkSSDHitGet(b *testing.B) {
	for _, size := range []int{1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("size=%dMiB", size>>20), func(b *testing.B) {
			const dram = 64 << 20
			n := startNode(b, dram, ssdOptions(b, 2<<30), master.Options{NoPromotion: true})
			nkeys := 4 * dram / size // 4× DRAM: the early keys are out of memory
			for i := 0; i < nkeys; i++ {
				if err := n.c.Put(fmt.Sprintf("b%d", i), value(i%7, size)); err != nil {
					b.Fatal(err)
				}
			}
			n.waitPersisted(b)
			cold := nkeys / 2 // keys written first: evicted from memory, on SSD
			var mu sync.Mutex
			var lat []time.Duration
			var ssdHits, other int
			b.SetBytes(int64(size))
			b.ResetTimer()
			t0 := time.Now()
			var wg sync.WaitGroup
			per := (b.N + 7) / 8
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					r := rand.New(rand.NewSource(int64(w)))
					local := make([]time.Duration, 0, per)
					s, o := 0, 0
					for i := 0; i < per; i++ {
						st := time.Now()
						h, err := n.c.Get(fmt.Sprintf("b%d", r.Intn(cold)))
						if err != nil {
							o++
							continue
						}
						if h.Source() == "ssd" {
							s++
						} else {
							o++
						}
						h.Release()
						local = append(local, time.Since(st))
					}
					mu.Lock()
					lat = append(lat, local...)
					ssdHits += s
					other += o
					mu.Unlock()
				}(w)
			}
			wg.Wait()
			el := time.Since(t0)
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			if len(lat) > 0 {
				b.ReportMetric(float64(ssdHits)*float64(size)/el.Seconds()/(1<<30), "ssd-GiB/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
			b.ReportMetric(float64(ssdHits)/float64(ssdHits+other), "ssd-share")
			_ = filepath.Join
		})
	}
}

// TestSSDWriteErrorLeavesPutIntact: SSD write errors (EIO, ENOSPC, short writes) fail
// the persist but never the put: the value reads back from memory, and no SSD replica
// is published for it.
func TestSSDWriteErrorLeavesPutIntact(t *testing.T) {
	t.Parallel()
	faults := &ssd.Faults{}
	so := ssdOptions(t, 64<<20)
	so.OpenFile = faults.OpenFile
	n := startNode(t, 16<<20, so, master.Options{})
	faults.Fail(ssd.OpWrite, syscall.EIO, 1)
	faults.Fail(ssd.OpWrite, syscall.ENOSPC, 1)
	faults.Short(ssd.OpWrite, 1)
	var keys []string
	for i := 0; i < 3; i++ {
		k := fmt.Sprintf("we-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, 700001)); err != nil {
			t.Fatalf("put with a failing SSD: %v", err)
		}
	}
	n.waitPersisted(t)
	if _, _, ssdReps := n.usage(t); ssdReps != 0 {
		t.Fatalf("%d SSD replicas published for failed writes", ssdReps)
	}
	mem, fromSSD, misses := readAll(t, n.c, keys, func(i int) []byte { return value(i, 700001) })
	if mem != 3 || fromSSD != 0 || misses != 0 {
		t.Fatalf("memory %d, ssd %d, misses %d", mem, fromSSD, misses)
	}
	// The tier recovers: the next put persists.
	if err := n.c.Put("we-ok", value(9, 5000)); err != nil {
		t.Fatal(err)
	}
	n.waitPersisted(t)
	if _, _, ssdReps := n.usage(t); ssdReps != 1 {
		t.Fatalf("after the faults: %d SSD replicas, want 1", ssdReps)
	}
	n.drain(t, append(keys, "we-ok"))
}

// TestSSDRefillKeepsMemoryReplicas: with promotion off, SSD-hit gets use temporary
// targets whose space is reused by the next refill; they must not keep pushing memory
// replicas out (a get-only workload would otherwise drain DRAM).
func TestSSDRefillKeepsMemoryReplicas(t *testing.T) {
	t.Parallel()
	const dram, size = 16 << 20, 1<<20 - 128
	n := startNode(t, dram, ssdOptions(t, 256<<20), master.Options{NoPromotion: true})
	var keys []string
	for i := 0; i < 40; i++ {
		k := fmt.Sprintf("rf-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	replicas := func() int64 {
		st, err := n.c.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return st.Members[0].MemoryReplicas
	}
	before := replicas()
	for round := 0; round < 3; round++ {
		for i := 0; i < 20; i++ { // the first 20 keys live on SSD only
			h, err := n.c.Get(keys[i])
			if err != nil {
				t.Fatal(err)
			}
			if h.Source() != "ssd" {
				t.Fatalf("%s: source %s, want ssd", keys[i], h.Source())
			}
			h.Release()
			// The release reaches the owner before the next get (the client batches
			// releases), and the owner's ack of the target's holder reaches the master
			// (the owner batches acks for up to AckDelay): otherwise, on a busy machine,
			// the next refill can find the last one's range still held and evict a
			// replica for it (16 -> 12 in a full `make test`). A target the owner kept
			// instead of acking would still drain the replicas.
			n.c.Flush()
			n.o.acks.sync()
		}
	}
	after := replicas()
	t.Logf("memory replicas before %d, after 60 SSD-hit gets %d", before, after)
	// A refill may evict a replica or two for its range (14-15 of 16 left, measured on
	// an idle machine and beside three CPU hogs with the acks synced above); one per
	// refill would leave none.
	if after < before-3 {
		t.Fatalf("SSD refills drained memory replicas: %d → %d", before, after)
	}
	n.drain(t, keys)
}

// TestSSDRefreshKeepsReadPages: KV pages read back from SSD again and again outlive
// the ring's laps (the master's refresh rewrites a page's record at the ring's head
// when memory evicts it again; master/writeback.go refreshLocked), where first in,
// first out by the time of writing lost each of them a lap after its first write-back
// however often it was read. Six hot pages of 1 MiB, read in turn, take more than the
// 4 MiB of memory; between rounds fillers (written once, never read) wrap the 16 MiB
// ring. Without the refresh each hot page missed once (6 misses in 5 of 5 runs).
func TestSSDRefreshKeepsReadPages(t *testing.T) {
	t.Parallel()
	const page = 1 << 20
	// The heartbeats are the test's: a refill is promoted (and so refreshed) only once the
	// owner acked the notice of its eviction (master/testdata/evict_notice.txt).
	n := startNode(t, 4*page, ssdOptions(t, 16*page), master.Options{HeartbeatInterval: time.Minute, NodeTTL: 5 * time.Minute, WriteQuiet: -1})
	root := ""
	put := func(k string, seed int) {
		t.Helper()
		v := value(seed, page)
		if err := n.c.PutWith(k, page, fluxkv.PutOptions{Parent: &root}, func(dst []byte) error { copy(dst, v); return nil }); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	// Five rounds: a version is promoted from SSD at most twice (master
	// Options.MaxPromotions), and only a promoted page is refreshed.
	const hot, rounds, fills = 6, 5, 3
	var keys []string
	for i := range hot {
		keys = append(keys, fmt.Sprintf("hot-%d", i))
		put(keys[i], i)
	}
	misses, fromSSD := 0, 0
	for r := range rounds {
		for j := range fills {
			f := fmt.Sprintf("fill-%d-%d", r, j)
			put(f, 1000+fills*r+j)
			keys = append(keys, f)
		}
		for heartbeatNow(t, n.o).EvictionsMore {
		}
		heartbeatNow(t, n.o) // acks them
		for i := range hot {
			h, err := n.c.Get(keys[i])
			if errors.Is(err, fluxkv.ErrKeyNotFound) {
				misses++
				put(keys[i], i) // back, as an engine stores a page it missed
				continue
			}
			if err != nil {
				t.Fatalf("round %d: get %s: %v", r, keys[i], err)
			}
			if !bytes.Equal(h.Bytes(), value(i, page)) {
				t.Fatalf("round %d: get %s (%s): wrong bytes", r, keys[i], h.Source())
			}
			if h.Source() == "ssd" {
				fromSSD++
			}
			h.Release()
		}
	}
	t.Logf("%d reads of %d hot pages: %d from SSD, %d misses", rounds*hot, hot, fromSSD, misses)
	if fromSSD == 0 || misses > 0 {
		t.Fatalf("hot pages read back from SSD each round must stay: %d SSD hits, %d misses", fromSSD, misses)
	}
	n.drain(t, keys)
}
