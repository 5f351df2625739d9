package daemon_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// TestBatchGetOwnerKilled: a batch get through n1 of values held by n0 while n0 is
// killed answers every key on its own — byte-exact, a miss, or an error — never wrong
// bytes and never a failed call; once the master has tombed n0, n1 holds nothing the
// batch left behind (holders released, every key deletable, the segment back to empty).
func TestBatchGetOwnerKilled(t *testing.T) {
	t.Parallel()
	cl := startCluster(t, 2, "96MiB")
	const n, size = 48, 1 << 20
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("killed-%d", i)
		if err := cl.clients[0].Put(keys[i], clusterValue(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	type answer struct {
		ok, miss, failed int
		err              error
	}
	done := make(chan answer, 1)
	go func() {
		hs, errs, err := cl.clients[1].BatchGet(keys)
		var a answer
		a.err = err
		for i, h := range hs {
			switch {
			case errs[i] != nil:
				a.failed++
			case h == nil:
				a.miss++
			case !bytes.Equal(h.Bytes(), clusterValue(i, size)):
				a.err = fmt.Errorf("%s: wrong bytes", keys[i])
			default:
				a.ok++
			}
			if h != nil {
				h.Release()
			}
		}
		done <- a
	}()
	time.Sleep(20 * time.Millisecond)
	cl.owners[0].kill()
	a := <-done
	t.Logf("batch of %d through n1 while n0 died: %d byte-exact, %d misses, %d failed", n, a.ok, a.miss, a.failed)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.ok+a.miss+a.failed != n {
		t.Fatalf("%d answers for %d keys", a.ok+a.miss+a.failed, n)
	}
	c := cl.clients[1]
	waitFor(t, 20*time.Second, "the master tombs n0", func() bool {
		st, err := c.Stat()
		return err == nil && len(st.Members) == 1
	})
	// Afterwards every key either reads back byte-exact (a copy n1 kept) or misses.
	hs, errs, err := c.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if errs[i] != nil {
			t.Fatalf("after the tomb: %s: %v", keys[i], errs[i])
		}
		if h != nil {
			if !bytes.Equal(h.Bytes(), clusterValue(i, size)) {
				t.Fatalf("after the tomb: %s: wrong bytes", keys[i])
			}
			h.Release()
		}
	}
	leakCheck(t, c, keys...)
}
