package daemon

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
)

// TestRegisterOnceAfterMasterRestart: after a master restart several callers ask for a
// registration at once (the heartbeat loop, and every call answered STALE_GENERATION);
// only the first registers and reports the replica index: a second would make the new
// master drop the incarnation the first rebuilt, and the owner its index.
func TestRegisterOnceAfterMasterRestart(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true})
	const keys = 10
	for i := range keys {
		if err := n.c.Put(fmt.Sprintf("k%d", i), value(i, 1000+i)); err != nil {
			t.Fatal(err)
		}
	}
	m2 := restartMaster(t, n)
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := n.o.master.register(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	routes := 0
	m2.Inspect(func(st *master.State) { routes = st.Keys() })
	if routes != keys {
		t.Fatalf("the new master routes %d keys after the registrations, want %d", routes, keys)
	}
	for i := range keys {
		h, err := n.c.Get(fmt.Sprintf("k%d", i))
		if err != nil {
			t.Fatalf("get k%d: %v", i, err)
		}
		if !bytes.Equal(h.Bytes(), value(i, 1000+i)) {
			t.Fatalf("get k%d: wrong bytes", i)
		}
		h.Release()
	}
}

// TestLeaseEndsCachedGets: an owner answers from its cached holdings only while its
// lease runs (two heartbeat periods after the last heartbeat the master answered): with
// the master gone, a hot key is still served at once, and once the lease ran out the
// get goes to the master (and fails: it is gone) instead of answering what another
// owner's delete may have killed meanwhile.
//
// Not parallel: the get right after the master stops must land within the lease left
// (two 1 s heartbeat periods after the last heartbeat, less a margin: about 1 s).
func TestLeaseEndsCachedGets(t *testing.T) {
	n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true, HeartbeatInterval: time.Second, NodeTTL: 5 * time.Second})
	if err := n.c.Put("hot", value(1, 5000)); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the first get is a master trip; the second a hot-set hit
		h, err := n.c.Get("hot")
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	n.m.Stop()
	stopped := time.Now()
	h, err := n.c.Get("hot")
	if err != nil {
		t.Fatalf("a hot-set get right after the master stopped (%v ago): %v", time.Since(stopped), err)
	}
	h.Release()
	time.Sleep(2 * time.Second) // the lease: at most 2 periods less a margin
	if h, err := n.c.Get("hot"); err == nil {
		h.Release()
		t.Fatal("a cached get was answered after the owner's lease ran out")
	}
}

// restartMaster stops n's master and starts a new one (empty, a new epoch) on its
// address, stopped when the test ends.
func restartMaster(t *testing.T, n *node) *master.Server {
	t.Helper()
	return restartMasterWith(t, n, master.Options{InsecureCluster: true})
}

// restartMasterWith is restartMaster with the new master's options.
func restartMasterWith(t *testing.T, n *node, opts master.Options) *master.Server {
	t.Helper()
	addr := n.m.Addr().String()
	n.m.Stop()
	m, err := master.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop() })
	return m
}
