package daemon_test

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
)

// TestHotSet: after its first get, a key whose replica is on this owner is served from
// the owner's hot set with no master trip — the gets go on while the master is frozen
// (SIGSTOP; heartbeats every 3 s, so the owner's lease, two periods after its last
// heartbeat, outlasts the gets). An overwrite through another owner is seen through the first at once (the
// replica's owner is invalidated before the put returns). A put that needs the space
// the hot set pins gets it: the master asks the owner to give its idle holdings back.
// Every read is byte-exact or a miss, and nothing leaks.
func TestHotSet(t *testing.T) {
	t.Parallel()
	m := startMaster(t, "", "--placement", "local", "--heartbeat-interval", "3s", "--node-ttl", "10s")
	metricsAddr := freePort(t)
	o0 := startOwnerWith(t, filepath.Join(t.TempDir(), "o0"), m.addr, "24MiB", "n0", "--metrics-addr", metricsAddr)
	o1 := startOwner(t, filepath.Join(t.TempDir(), "o1"), m.addr, "24MiB", "n1")
	c0, c1 := connect(t, o0.socket), connect(t, o1.socket)
	const n, size = 8, 1 << 20
	keys := make([]string, n)
	want := make(map[string][]byte)
	for i := range keys {
		keys[i] = fmt.Sprintf("hot-%d", i)
		want[keys[i]] = clusterValue(i, size)
		if err := c0.Put(keys[i], want[keys[i]]); err != nil {
			t.Fatal(err)
		}
		if _, _, err := getBytes(c0, keys[i]); err != nil { // the first get: a master trip
			t.Fatal(err)
		}
	}

	// No master: hot-set gets still answer, byte-exact.
	if err := m.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := 0
	for round := 0; round < 3; round++ {
		for _, k := range keys {
			got, remote, err := getBytes(c0, k)
			if err != nil || remote || !bytes.Equal(got, want[k]) {
				m.cmd.Process.Signal(syscall.SIGCONT)
				t.Fatalf("get %s with the master frozen: err=%v remote=%v exact=%v", k, err, remote, bytes.Equal(got, want[k]))
			}
			frozen++
		}
	}
	if err := m.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d hot-set gets answered with the master stopped", frozen)
	if hits := scrape(t, metricsAddr, "fluxkv_cached_gets_total"); hits < float64(frozen) {
		t.Errorf("fluxkv_cached_gets_total = %v after %d gets from the hot set", hits, frozen)
	}
	if held := scrape(t, metricsAddr, "fluxkv_hot_set_holdings"); held != n {
		t.Errorf("fluxkv_hot_set_holdings = %v, want %d", held, n)
	}
	if recs := scrape(t, metricsAddr, "fluxkv_replica_index_records"); recs != n {
		t.Errorf("fluxkv_replica_index_records = %v, want %d", recs, n)
	}

	// An overwrite through n1 of a key n0 serves from its hot set: n0 sees it as soon
	// as the put returns, every round.
	for round := 0; round < 10; round++ {
		v := clusterValue(1000+round, 4096+round)
		if err := c1.Put(keys[0], v); err != nil {
			t.Fatal(err)
		}
		want[keys[0]] = v
		got, _, err := getBytes(c0, keys[0])
		if err != nil || !bytes.Equal(got, v) {
			t.Fatalf("round %d: get through n0 right after the overwrite through n1: err=%v, new version=%v", round, err, bytes.Equal(got, v))
		}
	}

	// Pressure on n0 (its pool is 21 MiB, half of it may stay pinned by the hot set):
	// 1 MiB puts evict around the pinned replicas; a 16 MiB one needs them gone.
	var fills []string
	for i := 0; i < 24; i++ {
		k := fmt.Sprintf("fill-%d", i)
		fills = append(fills, k)
		want[k] = clusterValue(2000+i, size)
		if err := c0.Put(k, want[k]); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	big := clusterValue(3000, 16<<20)
	if err := c0.Put("big", big); err != nil {
		t.Fatalf("a put needing the hot set's space: %v", err)
	}
	want["big"] = big
	if !strings.Contains(o0.stderr.String(), "hot set given back to the master") {
		t.Error("the owner never gave its hot set back")
	}
	found := 0
	for k, v := range want {
		got, _, err := getBytes(c0, k)
		switch {
		case errors.Is(err, fluxkv.ErrKeyNotFound):
		case err != nil:
			t.Fatalf("get %s: %v", k, err)
		case !bytes.Equal(got, v):
			t.Fatalf("get %s: wrong bytes", k)
		default:
			found++
		}
	}
	if _, _, err := getBytes(c0, "big"); err != nil {
		t.Fatalf("get big: %v", err)
	}
	t.Logf("%d of %d keys still cached after the pressure", found, len(want))
	leakCheck(t, c0, append(append(keys, fills...), "big")...)
}
