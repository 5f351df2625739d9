package daemon_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/ssd"
)

// scrape reads one sample (a metric without labels) from a node's /metrics.
func scrape(t *testing.T, addr, name string) float64 {
	t.Helper()
	v, ok := scrapeIf(t, addr, name)
	if !ok {
		t.Fatalf("metric %s not found at %s", name, addr)
	}
	return v
}

// scrapeIf is scrape for a metric a node registers when it first counts: ok is false
// while it is not there.
func scrapeIf(t *testing.T, addr, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}

// member is one owner's line of a Stat.
func member(t *testing.T, c *fluxkv.Client, id string) *common.MemberStat {
	t.Helper()
	st, err := c.Stat()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.NodeId == id {
			return m
		}
	}
	t.Fatalf("node %q is not a member", id)
	return nil
}

// poolOwner is one owner of TestClusterSSDPool with its metrics address.
type poolOwner struct {
	*proc
	id      string
	metrics string
	c       *fluxkv.Client
}

// TestClusterSSDPool is issue 14's SSD pool: three owners, only s has SSD. Values put
// through the others are persisted on s (pulled from their memory replicas) and, once
// evicted from memory, refill from s's SSD byte-exact through every owner, in 4 MiB
// chunks with at most 4 reads and 4 pulls in flight. A corrupt record is a clean miss;
// a requester killed mid-refill gives s's staging back; s killed mid-refill is a miss
// within 2 s, never a half-filled holder, and the requester's target is freed. s's
// data and peer ports sit behind a proxy that can slow the bytes down, so a kill lands
// in the middle of a transfer.
//
// Not parallel: the answers after the cut and the kill are bounded at 3 s and 2 s and
// take about 1.5 s with the cores to itself; other tests sharing them push the answer
// past its bound.
func TestClusterSSDPool(t *testing.T) {
	ssdDir := t.TempDir()
	if err := ssd.ProbeDirectIO(ssdDir); err != nil {
		t.Skipf("no O_DIRECT under %s: %v", ssdDir, err)
	}
	m := startMaster(t, "", "--placement", "local", "--no-promotion")
	startPool := func(id string, extra ...string) *poolOwner {
		dir := filepath.Join(t.TempDir(), id)
		o := &poolOwner{id: id, metrics: freePort(t)}
		o.proc = start(t, append([]string{"owner", "--dir", dir, "--dram", "64MiB", "--master", m.addr, "--node-id", id,
			"--cache-grace", "0", "--metrics-addr", o.metrics}, append(ownerAuth(), extra...)...)...)
		o.socket = filepath.Join(dir, "fluxkv.sock")
		o.waitSocket()
		o.c = connect(t, o.socket)
		return o
	}
	// s listens on 127.0.0.1 and advertises 127.0.0.2, where the proxies are.
	peerPort, dataPort := freePort(t), freePort(t)
	_, pp, _ := net.SplitHostPort(peerPort)
	_, dp, _ := net.SplitHostPort(dataPort)
	peerProxy := startProxy(t, "127.0.0.2:"+pp, peerPort)
	dataProxy := startProxy(t, "127.0.0.2:"+dp, dataPort)
	s := startPool("s", "--ssd-path", ssdDir, "--ssd-limit", "256MiB", "--peer-listen", peerPort, "--data-listen", dataPort,
		"--advertise-host", "127.0.0.2")
	a, b := startPool("a"), startPool("b")

	// Sizes 1 B … 16 MiB + 1 through a, 40 MiB (10 chunks) through b.
	type kv struct {
		key  string
		i    int
		size int
		via  *poolOwner
	}
	var kvs []kv
	for i, size := range []int{1, 4095, 4097, 1 << 20, 4<<20 - 1, 4 << 20, 4<<20 + 1, 16<<20 + 1} {
		kvs = append(kvs, kv{fmt.Sprintf("pool-%d", size), i, size, a})
	}
	kvs = append(kvs, kv{"pool-40m", 40, 40 << 20, b})
	for _, e := range kvs {
		if err := e.via.c.Put(e.key, clusterValue(e.i, e.size)); err != nil {
			t.Fatalf("put %s through %s: %v", e.key, e.via.id, err)
		}
	}
	corruptVal := bytes.Repeat([]byte("corrupt-me-"), 100000) // 1.1 MB, unique on the disk
	if err := a.c.Put("pool-corrupt", corruptVal); err != nil {
		t.Fatal(err)
	}
	persisted := int64(len(kvs) + 1)
	waitFor(t, 30*time.Second, "s persists every value", func() bool { return member(t, a.c, "s").SsdReplicas == persisted })
	if ms := member(t, a.c, "s"); ms.SsdPersists != persisted || ms.SsdPersistsDropped != 0 {
		t.Fatalf("s: %d persists, %d dropped; want %d, 0", ms.SsdPersists, ms.SsdPersistsDropped, persisted)
	}
	for _, id := range []string{"a", "b"} {
		if ma := member(t, a.c, id); ma.SsdPersists != 0 || ma.SsdReplicas != 0 {
			t.Fatalf("%s has no SSD, yet %d persists and %d SSD replicas", id, ma.SsdPersists, ma.SsdReplicas)
		}
	}
	// Evict every memory replica: 60 MiB of other values through a and b (56 MiB pools).
	for i := 0; i < 15; i++ {
		for _, o := range []*poolOwner{a, b} {
			if err := o.c.Put(fmt.Sprintf("filler-%s-%d", o.id, i), clusterValue(100+i, 4<<20)); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("RefillThroughEveryOwner", func(t *testing.T) {
		for _, e := range kvs {
			for _, o := range []*poolOwner{a, b, s} {
				h, err := o.c.Get(e.key)
				if err != nil {
					t.Fatalf("get %s through %s: %v", e.key, o.id, err)
				}
				if !bytes.Equal(h.Bytes(), clusterValue(e.i, e.size)) {
					t.Fatalf("get %s through %s: wrong bytes (source %s)", e.key, o.id, h.Source())
				}
				if h.Source() != "ssd" || h.Remote() != (o != s) {
					t.Errorf("get %s through %s: source %s remote %v, want an SSD refill, remote unless through s", e.key, o.id, h.Source(), h.Remote())
				}
				h.Release()
			}
		}
		reads := scrape(t, s.metrics, "fluxkv_stage_reads_in_flight_peak")
		pulls := max(scrape(t, a.metrics, "fluxkv_stage_pulls_in_flight_peak"), scrape(t, b.metrics, "fluxkv_stage_pulls_in_flight_peak"))
		t.Logf("peaks in one refill: %v SSD reads on s, %v pulls on a requester", reads, pulls)
		if reads < 1 || reads > 4 || pulls < 1 || pulls > 4 {
			t.Fatalf("peaks in one refill: %v reads, %v pulls; want 1..4 each", reads, pulls)
		}
		if used := scrape(t, s.metrics, "fluxkv_stage_slots_in_use"); used != 0 {
			t.Fatalf("%v staging slots still in use after every refill ended", used)
		}
	})

	t.Run("CorruptRecordMisses", func(t *testing.T) {
		if !flipOnDisk(t, ssdDir, corruptVal[:4096], 700000) {
			t.Fatal("the record was not found in s's shard files")
		}
		corrupt := scrape(t, s.metrics, "fluxkv_ssd_corrupt_total")
		_, err := b.c.Get("pool-corrupt")
		if !errors.Is(err, fluxkv.ErrKeyNotFound) {
			t.Fatalf("get of a corrupt remote record: %v, want a miss", err)
		}
		if after := scrape(t, s.metrics, "fluxkv_ssd_corrupt_total"); after != corrupt+1 {
			t.Fatalf("fluxkv_ssd_corrupt_total %v -> %v, want +1", corrupt, after)
		}
		if _, err := a.c.Get("pool-corrupt"); !errors.Is(err, fluxkv.ErrKeyNotFound) {
			t.Fatalf("second get: %v, want a miss (the SSD replica was dropped)", err)
		}
	})

	big := kvs[len(kvs)-2] // 16 MiB + 1: 5 chunks, 2 s through the slowed proxy
	dataProxy.rate.Store(2 << 20)

	t.Run("RequesterKilled", func(t *testing.T) {
		got := make(chan error, 1)
		go func() {
			h, err := a.c.Get(big.key)
			if err == nil {
				h.Release()
			}
			got <- err
		}()
		waitFor(t, 10*time.Second, "a refill staged on s", func() bool { return scrape(t, s.metrics, "fluxkv_stage_slots_in_use") > 0 })
		time.Sleep(300 * time.Millisecond)
		a.kill()
		if err := <-got; err == nil {
			t.Log("the get completed before the kill landed")
		}
		waitFor(t, 15*time.Second, "s gives its staging back", func() bool { return scrape(t, s.metrics, "fluxkv_stage_slots_in_use") == 0 })
		dataProxy.rate.Store(0)
		h, err := b.c.Get(big.key) // the SSD replica is intact
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(h.Bytes(), clusterValue(big.i, big.size)) {
			t.Fatal("wrong bytes after the requester's death")
		}
		h.Release()
		dataProxy.rate.Store(2 << 20)
	})

	// s becomes unreachable mid-refill (its proxies freeze: s alive, nothing moves): the
	// reader's staged pull fails by its 1 s progress deadline, the SSD owner's verdict
	// is given 0.5 s, and the get re-plans without s: a miss (s holds the only copy),
	// within docs/architecture.md §9's 2 s. Once the link is back, s's abandoned refill frees its
	// staging.
	t.Run("SSDOwnerUnreachable", func(t *testing.T) {
		forty := kvs[len(kvs)-1]
		got := make(chan error, 1)
		go func() {
			h, err := b.c.Get(forty.key)
			if err == nil {
				if !bytes.Equal(h.Bytes(), clusterValue(forty.i, forty.size)) {
					err = errors.New("a holder with wrong bytes")
				}
				h.Release()
			}
			got <- err
		}()
		waitFor(t, 10*time.Second, "a refill staged on s", func() bool { return scrape(t, s.metrics, "fluxkv_stage_slots_in_use") > 0 })
		time.Sleep(300 * time.Millisecond)
		peerProxy.frozen.Store(true)
		dataProxy.frozen.Store(true)
		cut := time.Now()
		err := <-got
		took := time.Since(cut)
		peerProxy.frozen.Store(false)
		dataProxy.frozen.Store(false)
		switch {
		case err == nil:
			t.Log("the get completed before the link was cut")
		case errors.Is(err, fluxkv.ErrKeyNotFound), errors.Is(err, fluxkv.ErrUnavailable):
			t.Logf("answered %v after the SSD owner became unreachable: %v", took, err)
			// 1.5 s by design (1 s progress deadline + 0.5 s verdict; 1.4 s seen with
			// -race); the bound is slack for 2 busy cores, not the property: the 1 s
			// progress timer and 0.5 s verdict only fire late on a loaded machine,
			// while a get without them waits for the frozen link (unfrozen only after
			// it answers) until some much longer call timeout.
			if took > 4500*time.Millisecond {
				t.Fatalf("the get answered %v after the SSD owner became unreachable: %v", took, err)
			}
		default:
			t.Fatalf("get while the SSD owner was unreachable: %v", err)
		}
		waitFor(t, 15*time.Second, "s's abandoned refill gives its staging back", func() bool {
			return scrape(t, s.metrics, "fluxkv_stage_slots_in_use") == 0
		})
	})

	t.Run("SSDOwnerKilled", func(t *testing.T) {
		b.c.Flush()
		baseline := member(t, b.c, "b").MemorySegment.UsedBytes
		type result struct {
			err error
			at  time.Time
		}
		got := make(chan result, 1)
		go func() {
			h, err := b.c.Get(big.key)
			if err == nil {
				if !bytes.Equal(h.Bytes(), clusterValue(big.i, big.size)) {
					err = errors.New("a holder with wrong bytes")
				}
				h.Release()
			}
			got <- result{err, time.Now()}
		}()
		waitFor(t, 10*time.Second, "a refill staged on s", func() bool { return scrape(t, s.metrics, "fluxkv_stage_slots_in_use") > 0 })
		time.Sleep(300 * time.Millisecond)
		killed := time.Now()
		s.kill()
		r := <-got
		switch {
		case r.err == nil:
			t.Log("the get completed before the kill landed")
		case errors.Is(r.err, fluxkv.ErrKeyNotFound), errors.Is(r.err, fluxkv.ErrUnavailable):
			if d := r.at.Sub(killed); d > 2*time.Second {
				t.Fatalf("the get answered %v after the SSD owner died, want < 2s: %v", d, r.err)
			}
		default:
			t.Fatalf("get while the SSD owner died: %v", r.err)
		}
		// b's target went back with the revoke; nothing stays allocated once s is tombed.
		waitFor(t, 15*time.Second, "s tombed", func() bool {
			st, err := b.c.Stat()
			return err == nil && len(st.Members) == 1
		})
		b.c.Flush()
		if m := member(t, b.c, "b"); m.MemorySegment.UsedBytes != baseline || m.Holders != 0 {
			t.Fatalf("b after s's tomb: used %d (was %d), holders %d", m.MemorySegment.UsedBytes, baseline, m.Holders)
		}
		if _, err := b.c.Get(big.key); !errors.Is(err, fluxkv.ErrKeyNotFound) {
			t.Fatalf("get after the only replica's owner died: %v, want a miss", err)
		}
	})
}

// flipOnDisk finds needle in the files under dir and flips the byte at offset past its
// start, as a failing disk would; it reports whether it found it.
func flipOnDisk(t *testing.T, dir string, needle []byte, offset int64) bool {
	t.Helper()
	found := false
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || found {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(data, needle)
		if i < 0 {
			return nil
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte{data[int64(i)+offset] ^ 0xff}, int64(i)+offset); err != nil {
			t.Fatal(err)
		}
		found = true
		return nil
	})
	return found
}
