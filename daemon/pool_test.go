package daemon_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// TestClusterPool: three owners of 64 MiB are one memory pool. 150 values of
// 1 MiB − 128 B (more than any one segment holds) put through one owner are placed
// across the pool (the requester first, then the owner with the most free bytes, the
// target pulling each value from the requester's transfer area); every key then reads
// back twice through another owner with no miss and no wrong byte: promoted copies
// take the reader's free room only while headroom of its transfer area's size stays,
// the other gets land in free room or the reader's transfer area, so no value is lost.
func TestClusterPool(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "64MiB")
	const n, size = 150, 1<<20 - 128
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("pool-%d", i)
		if err := cl.clients[0].Put(keys[i], clusterValue(i, size)); err != nil {
			t.Fatalf("put %s: %v", keys[i], err)
		}
	}
	placed := memoryReplicas(t, cl.clients[0])
	t.Logf("memory replicas after the puts: %v", placed)
	if placed["n1"] == 0 || placed["n2"] == 0 {
		t.Errorf("puts were not spread over the pool: %v", placed)
	}
	remote := 0
	for round := 0; round < 2; round++ {
		for i, k := range keys {
			got, r, err := getBytes(cl.clients[1], k)
			if err != nil {
				t.Fatalf("round %d: get %s through n1: %v", round, k, err)
			}
			if !bytes.Equal(got, clusterValue(i, size)) {
				t.Fatalf("round %d: get %s through n1: wrong bytes", round, k)
			}
			if r {
				remote++
			}
		}
	}
	t.Logf("%d of %d gets pulled from another owner", remote, 2*n)
	// Reading through n1 copies no value out of the pool: promoted copies take free room
	// only, and gets that are not promoted leave nothing behind.
	st, err := cl.clients[2].Stat()
	if err != nil {
		t.Fatal(err)
	}
	var replicas int64
	for _, m := range st.Members {
		replicas += m.MemoryReplicas
	}
	const granule = 512
	t.Logf("after the reads: %d distinct values, %d replicas, %d duplicate bytes", st.MemoryValues, replicas, st.MemoryDuplicateBytes)
	if st.MemoryValues != n || st.MemoryDuplicateBytes != (replicas-n)*((size+granule-1)/granule*granule) {
		t.Errorf("status: %d distinct values and %d duplicate bytes in %d replicas, want %d values and the rest duplicates",
			st.MemoryValues, st.MemoryDuplicateBytes, replicas, n)
	}
	leakCheck(t, cl.clients[0], keys...)
}

// TestClusterPoolBatch: batch puts that outgrow their owner's segment are placed on the
// other owner, which pulls its items of a batch in one BatchPullPut (one pipelined
// transfer from the requester's transfer area); with no third owner to place a failed
// pull on again, every put succeeds only through it. Every value reads back right
// through the other owner, and nothing leaks.
func TestClusterPoolBatch(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 2, "64MiB")
	const n, batch, size = 92, 4, 1<<20 - 128
	keys := make([]string, n)
	for lo := 0; lo < n; lo += batch {
		items := make([]fluxkv.PutItem, batch)
		for j := range items {
			keys[lo+j] = fmt.Sprintf("pool-batch-%d", lo+j)
			items[j] = fluxkv.PutItem{Key: keys[lo+j], Value: clusterValue(lo+j, size)}
		}
		errs, err := cl.clients[0].BatchPut(items, fluxkv.PutOptions{})
		if err != nil {
			t.Fatalf("batch put at %d: %v", lo, err)
		}
		for j, e := range errs {
			if e != nil {
				t.Fatalf("batch put of %s: %v", keys[lo+j], e)
			}
		}
	}
	placed := memoryReplicas(t, cl.clients[0])
	t.Logf("memory replicas after the batch puts: %v", placed)
	if placed["n1"] < n/4 {
		t.Errorf("batch puts were not spread over the pool: %v", placed)
	}
	for i, k := range keys {
		got, _, err := getBytes(cl.clients[1], k)
		if err != nil {
			t.Fatalf("get %s through n1: %v", k, err)
		}
		if !bytes.Equal(got, clusterValue(i, size)) {
			t.Fatalf("get %s through n1: wrong bytes", k)
		}
	}
	leakCheck(t, cl.clients[0], keys...)
}

// TestClusterPoolLendsTransferAreas: a full cluster holds as many values as its DRAM.
// Three owners of 32 MiB (each a 28 MiB pool and a 4 MiB transfer area) take 96 values
// of 1 MiB − 128 B through every owner in turn: the last ones borrow the idle areas,
// nothing is evicted. Reading them all through one owner, whose segment is full, costs
// at most the value its one get in flight evicted, and leaves no duplicate.
func TestClusterPoolLendsTransferAreas(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "32MiB")
	const n, size = 96, 1<<20 - 128
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("lend-%d", i)
		if err := cl.clients[i%3].Put(keys[i], clusterValue(i, size)); err != nil {
			t.Fatalf("put %s: %v", keys[i], err)
		}
	}
	st, err := cl.clients[0].Stat()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.TransferArea == nil || m.TransferArea.CapacityBytes != 4<<20 || m.TransferArea.UsedBytes != 4<<20 || m.TransferAreaReplicas != 4 {
			t.Errorf("member %s: transfer area %+v with %d replicas, want 4 MiB, all of it lent to 4 replicas", m.NodeId, m.TransferArea, m.TransferAreaReplicas)
		}
	}
	if st.MemoryValues != n || st.MemoryDuplicateBytes != 0 {
		t.Fatalf("after the puts: %d values, %d duplicate bytes; want all %d, none", st.MemoryValues, st.MemoryDuplicateBytes, n)
	}
	misses := 0
	for i, k := range keys {
		got, _, err := getBytes(cl.clients[1], k)
		switch {
		case errors.Is(err, fluxkv.ErrKeyNotFound):
			misses++
		case err != nil:
			t.Fatalf("get %s through n1: %v", k, err)
		case !bytes.Equal(got, clusterValue(i, size)):
			t.Fatalf("get %s through n1: wrong bytes", k)
		}
	}
	if st, err = cl.clients[2].Stat(); err != nil {
		t.Fatal(err)
	}
	t.Logf("reads through n1: %d misses; then %d values, %d duplicate bytes", misses, st.MemoryValues, st.MemoryDuplicateBytes)
	if misses > 1 || st.MemoryValues < n-1 || st.MemoryDuplicateBytes != 0 {
		t.Errorf("reads through a full owner: %d misses, %d values, %d duplicate bytes; want ≤ 1 miss, ≥ %d values, no duplicate",
			misses, st.MemoryValues, st.MemoryDuplicateBytes, n-1)
	}
	leakCheck(t, cl.clients[0], keys...)
}

// TestClusterPoolLandingArea: owners with a landing area (--landing-reserve) read a full
// cluster without losing a value. Two owners of 32 MiB (a 28 MiB pool and a 4 MiB
// transfer area each, every byte of both holding values) and 4 MiB of landing area each
// read every value through n1: n0's land in n1's landing area, n1 evicts nothing, and
// all of them are still there afterwards, with no duplicate; the areas are empty again
// once the holders are gone.
func TestClusterPoolLandingArea(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 2, "32MiB", "--landing-reserve", "4MiB")
	const n, size = 64, 1<<20 - 128
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("land-%d", i)
		if err := cl.clients[i%2].Put(keys[i], clusterValue(i, size)); err != nil {
			t.Fatalf("put %s: %v", keys[i], err)
		}
	}
	for round := range 2 {
		for i, k := range keys {
			got, _, err := getBytes(cl.clients[1], k)
			if err != nil {
				t.Fatalf("round %d: get %s through n1: %v", round, k, err)
			}
			if !bytes.Equal(got, clusterValue(i, size)) {
				t.Fatalf("round %d: get %s through n1: wrong bytes", round, k)
			}
		}
	}
	cl.clients[1].Flush()
	var st *external.StatResponse
	waitFor(t, 30*time.Second, "the landing areas empty once the holders are gone", func() bool {
		var err error
		if st, err = cl.clients[0].Stat(); err != nil {
			t.Fatal(err)
		}
		for _, m := range st.Members {
			if m.LandingArea == nil || m.LandingArea.UsedBytes != 0 {
				return false
			}
		}
		return true
	})
	for _, m := range st.Members {
		if m.LandingArea.CapacityBytes != 4<<20 || m.MemorySegment.CapacityBytes != 28<<20 {
			t.Errorf("member %s: landing area %+v, pool %+v; want 4 MiB and 28 MiB", m.NodeId, m.LandingArea, m.MemorySegment)
		}
	}
	if st.MemoryValues != n || st.MemoryDuplicateBytes != 0 {
		t.Errorf("after two rounds of reads through n1: %d values, %d duplicate bytes; want all %d, none", st.MemoryValues, st.MemoryDuplicateBytes, n)
	}
	leakCheck(t, cl.clients[0], keys...)
}

// TestClusterPrefixPinsTakeNoPoolRoom: a prefix lookup's pins bring pages other owners
// hold in only as far as half the landing area takes, and count the rest unpinned (the
// load pulls them). A full cluster as in TestClusterPoolLandingArea; n1 looks up, pinned,
// the 32 MiB of values n0 holds beside its 4 MiB landing area: all 32 are found, no value
// is evicted for the pins (before, every pin past the landing area took a sole copy's
// room), then all load with their bytes.
func TestClusterPrefixPinsTakeNoPoolRoom(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 2, "32MiB", "--landing-reserve", "4MiB")
	const n, size = 64, 1<<20 - 128
	keys := make([]string, n)
	var far []string // put through n0: held there
	for i := range keys {
		keys[i] = fmt.Sprintf("pinland-%d", i)
		if err := cl.clients[i%2].Put(keys[i], clusterValue(i, size)); err != nil {
			t.Fatalf("put %s: %v", keys[i], err)
		}
		if i%2 == 0 {
			far = append(far, keys[i])
		}
	}
	found, err := cl.clients[1].BatchExistsPrefix(far, 5*time.Second)
	if err != nil || found != len(far) {
		t.Fatalf("pinned prefix lookup of n0's %d values through n1: found %d, %v", len(far), found, err)
	}
	st, err := cl.clients[0].Stat()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.NodeId == "n1" && (m.LandingArea == nil || m.LandingArea.UsedBytes > 2<<20) {
			t.Errorf("n1's landing area while the pins last: %+v; want at most half of its 4 MiB used", m.LandingArea)
		}
	}
	if st.MemoryValues != n || st.MemoryDuplicateBytes != 0 {
		t.Errorf("after the pinned lookup: %d values, %d duplicate bytes; want all %d, none", st.MemoryValues, st.MemoryDuplicateBytes, n)
	}
	for i, k := range keys {
		got, _, err := getBytes(cl.clients[1], k)
		if err != nil || !bytes.Equal(got, clusterValue(i, size)) {
			t.Fatalf("get %s through n1 after the lookup: err %v, right bytes %v", k, err, bytes.Equal(got, clusterValue(i, size)))
		}
	}
	cl.clients[1].Flush()
	leakCheck(t, cl.clients[0], keys...)
}

// memoryReplicas is each member's count of memory replicas, by node id, as c's Stat
// reports it.
func memoryReplicas(t *testing.T, c *fluxkv.Client) map[string]int64 {
	t.Helper()
	st, err := c.Stat()
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string]int64{}
	for _, m := range st.Members {
		placed[m.NodeId] = m.MemoryReplicas
	}
	return placed
}
