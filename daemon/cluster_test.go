package daemon_test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
)

// clusterValue is the value of key i of size n: distinct per key and size.
func clusterValue(i, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*131 + j*7 + j>>9)
	}
	return b
}

// cluster is a master and owners on loopback, each a real process, with a client
// attached to every owner.
type cluster struct {
	master  *proc
	owners  []*proc
	clients []*fluxkv.Client
}

func startCluster(t *testing.T, owners int, dram string) *cluster {
	t.Helper()
	cl := &cluster{master: startMaster(t, "")}
	for i := 0; i < owners; i++ {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("o%d", i))
		o := startOwner(t, dir, cl.master.addr, dram, fmt.Sprintf("n%d", i))
		cl.owners = append(cl.owners, o)
		cl.clients = append(cl.clients, connect(t, o.socket))
	}
	return cl
}

// getBytes reads key through c and returns a copy of its bytes and whether they were
// pulled from another owner.
func getBytes(c *fluxkv.Client, key string) ([]byte, bool, error) {
	h, err := c.Get(key)
	if err != nil {
		return nil, false, err
	}
	defer h.Release()
	return bytes.Clone(h.Bytes()), h.Remote(), nil
}

// TestClusterRemoteGet: values put through one owner read back byte-exact through the
// others, pulled over the data plane the first time (Remote) and local afterwards
// (promoted); an overwrite and a delete through one owner are seen through every
// other; a holder of the old version stays byte-stable meanwhile; nothing leaks.
func TestClusterRemoteGet(t *testing.T) {
	cl := startCluster(t, 3, "64MiB")
	sizes := []int{1, 511, 4096, 1<<20 - 128, 4<<20 + 7, 16<<20 + 1}
	var keys []string
	for i, n := range sizes {
		k := fmt.Sprintf("remote-%d", i)
		keys = append(keys, k)
		if err := cl.clients[0].Put(k, clusterValue(i, n)); err != nil {
			t.Fatalf("put %s (%d B): %v", k, n, err)
		}
	}
	for _, reader := range []int{1, 2} {
		for i, k := range keys {
			got, remote, err := getBytes(cl.clients[reader], k)
			if err != nil {
				t.Fatalf("get %s through n%d: %v", k, reader, err)
			}
			if !bytes.Equal(got, clusterValue(i, sizes[i])) {
				t.Fatalf("get %s (%d B) through n%d: wrong bytes", k, sizes[i], reader)
			}
			if !remote {
				t.Errorf("first get of %s through n%d: Remote() = false, want a pull", k, reader)
			}
			// The pulled copy was promoted: the second get is local.
			if _, remote, err := getBytes(cl.clients[reader], k); err != nil || remote {
				t.Errorf("second get of %s through n%d: remote=%v err=%v, want a local hit", k, reader, remote, err)
			}
		}
	}

	// An old-version holder on n1 stays byte-stable while n2 overwrites the key.
	old, err := cl.clients[1].Get(keys[3])
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(old.Bytes())
	newVal := clusterValue(99, 3<<20)
	if err := cl.clients[2].Put(keys[3], newVal); err != nil {
		t.Fatal(err)
	}
	for _, reader := range []int{0, 1} {
		waitFor(t, 2*time.Second, fmt.Sprintf("n%d sees the overwrite", reader), func() bool {
			got, _, err := getBytes(cl.clients[reader], keys[3])
			return err == nil && bytes.Equal(got, newVal)
		})
	}
	if !bytes.Equal(old.Bytes(), want) {
		t.Fatal("the old version's holder changed under its reader")
	}
	old.Release()

	// A delete through n0 is seen through every owner.
	if _, err := cl.clients[0].Delete(keys[4]); err != nil {
		t.Fatal(err)
	}
	for _, reader := range []int{1, 2} {
		waitFor(t, 2*time.Second, fmt.Sprintf("n%d sees the delete", reader), func() bool {
			_, _, err := getBytes(cl.clients[reader], keys[4])
			return errors.Is(err, fluxkv.ErrKeyNotFound)
		})
	}
	leakCheck(t, cl.clients[0], keys...)
}

// TestClusterSourceKilled: with the only replicas on an owner killed with SIGKILL,
// gets through the others never return wrong bytes; each either succeeds (a promoted
// copy), misses, or fails UNAVAILABLE, and once the master tombed the dead owner
// (TTL 2s) every get misses; the survivors' memory is back to empty.
func TestClusterSourceKilled(t *testing.T) {
	cl := startCluster(t, 3, "32MiB")
	const n = 12
	var keys []string
	for i := 0; i < n; i++ {
		k := fmt.Sprintf("victim-%d", i)
		keys = append(keys, k)
		if err := cl.clients[0].Put(k, clusterValue(i, 1<<20+i)); err != nil {
			t.Fatal(err)
		}
	}
	cl.owners[0].kill()
	killed := time.Now()
	outcomes := map[string]int{}
	for time.Since(killed) < 4*time.Second {
		for i, k := range keys {
			got, _, err := getBytes(cl.clients[1+i%2], k)
			switch {
			case err == nil:
				if !bytes.Equal(got, clusterValue(i, 1<<20+i)) {
					t.Fatalf("get %s after the source died: wrong bytes", k)
				}
				outcomes["ok"]++
			case errors.Is(err, fluxkv.ErrKeyNotFound):
				outcomes["miss"]++
			case errors.Is(err, fluxkv.ErrUnavailable):
				outcomes["unavailable"]++
			default:
				t.Fatalf("get %s after the source died: %v", k, err)
			}
		}
	}
	t.Logf("outcomes after SIGKILL of the source: %v", outcomes)
	for i, k := range keys {
		if _, _, err := getBytes(cl.clients[1+i%2], k); !errors.Is(err, fluxkv.ErrKeyNotFound) {
			t.Fatalf("get %s after the tomb: %v, want KEY_NOT_FOUND", k, err)
		}
	}
	waitUsage(t, cl.clients[1], 0, 0, 5*time.Second)
}

// TestClusterDuplicateNodeID: an owner started with the node id of a live one is
// refused with a message naming --node-id; the live one keeps serving.
func TestClusterDuplicateNodeID(t *testing.T) {
	cl := startCluster(t, 1, "16MiB")
	dup := start(t, "owner", "--dir", t.TempDir(), "--dram", "16MiB", "--master", cl.master.addr,
		"--node-id", "n0", "--cluster-secret-file", clusterSecret)
	waitFor(t, 20*time.Second, "the duplicate's refusal", func() bool {
		return strings.Contains(dup.stderr.String(), "give each owner its own --node-id")
	})
	dup.kill()
	if err := cl.clients[0].Put("still-here", []byte("v")); err != nil {
		t.Fatalf("the live owner stopped serving: %v", err)
	}
	leakCheck(t, cl.clients[0], "still-here")
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
