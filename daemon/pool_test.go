package daemon_test

import (
	"bytes"
	"fmt"
	"testing"
)

// TestClusterPool: three owners of 128 MiB are one memory pool. 300 values of
// 1 MiB − 128 B (more than any one segment holds) put through one owner are placed
// across the pool (the requester first, then the owner with the most free bytes, the
// target pulling each value from the requester's transfer area); every key then reads
// back twice through another owner with no miss and no wrong byte: the reader fills
// up with promoted copies, and eviction takes those duplicates before any sole copy.
func TestClusterPool(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 3, "128MiB")
	const n, size = 300, 1<<20 - 128
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("pool-%d", i)
		if err := cl.clients[0].Put(keys[i], clusterValue(i, size)); err != nil {
			t.Fatalf("put %s: %v", keys[i], err)
		}
	}
	st, err := cl.clients[0].Stat()
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string]int64{}
	for _, m := range st.Members {
		placed[m.NodeId] = m.MemoryReplicas
	}
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
	leakCheck(t, cl.clients[0], keys...)
}
