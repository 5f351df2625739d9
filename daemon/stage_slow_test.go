package daemon

import (
	"bytes"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/ssd"
)

// slowReadFile delays, once armed, the SSD read whose buffer is exactly n bytes.
type slowReadFile struct {
	ssd.File
	n     int
	delay time.Duration
	armed *atomic.Bool
	hit   *atomic.Int32
}

func (f slowReadFile) Shape(op ssd.Op, buf []byte, off int64) ([]byte, error) {
	if op == ssd.OpRead && len(buf) == f.n && f.armed.CompareAndSwap(true, false) {
		f.hit.Add(1)
		time.Sleep(f.delay)
	}
	return f.File.Shape(op, buf, off)
}

// TestBatchRefillSlowItem: a batch get through n2 of 32 healthy pages on n1's SSD, one
// of whose reads is slow. The pages read in time must all be served, and n1 must keep
// every SSD replica (a slow read says nothing about the record); the slow page itself
// may fail (then as unreachable: re-planned, not dropped).
//   - first-item: page 0's read takes 3.85 s (under stageChunkWait, so its staged pull
//     waits for it). The pages behind it in the requester's pipeline were read at once
//     and wait unpulled meanwhile: the unpulled watchdog must not take that wait for a
//     requester that is gone (it did at 3 s, the batch abandoned the items not read yet
//     and answered them KEY_NOT_FOUND, which the requester took for failed reads and
//     revoked with drop_ssd_source).
//   - pull-gives-up: page 15's read takes 4.5 s: its pull gives up after
//     stageChunkWait. The source must learn it at once and answer, not keep the
//     session until the watchdog (the requester waited stageVerdictWait for the answer,
//     then failed the whole batch as unreachable and excluded n1: 31 healthy pages
//     missed).
func TestBatchRefillSlowItem(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slow  int
		delay time.Duration
	}{
		{"first-item", 0, 3850 * time.Millisecond},
		{"pull-gives-up", 15, 4500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			batchRefillSlowItem(t, tc.slow, tc.delay)
		})
	}
}

func batchRefillSlowItem(t *testing.T, slow int, delay time.Duration) {
	const pages = 32
	var armed atomic.Bool
	var hit atomic.Int32
	so := ssdOptions(t, 64<<20)
	so.Engine = ssd.EnginePsync
	so.OpenFile = func(path string, flag int, perm os.FileMode) (ssd.File, error) {
		f, err := ssd.OpenOSFile(path, flag, perm)
		if err != nil {
			return nil, err
		}
		return slowReadFile{File: f, n: 64<<10 + slow*1024, delay: delay, armed: &armed, hit: &hit}, nil
	}
	n := startNode(t, 4<<20, so, master.Options{Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true})
	_, c2 := n.addOwner(t, "n2", 16<<20, nil, func(o *Options) { o.CacheGrace = -1 })
	var keys []string
	want := map[string][]byte{}
	for i := range pages {
		k := fmt.Sprintf("page-%d", i)
		want[k] = value(i, 64<<10+i*1024) // distinct lengths: the slow page's read is the one delayed
		keys = append(keys, k)
		if err := n.c.Put(k, want[k]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 16 { // push the pages out of n1's memory
		if err := n.c.Put(fmt.Sprintf("filler-%d", i), value(100+i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	before := n.ssdReplicasOf(t, "n1")
	armed.Store(true)
	start := time.Now()
	hs, errs, err := c2.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("batch answered in %v; delayed reads %d", time.Since(start), hit.Load())
	if hit.Load() != 1 {
		t.Fatalf("%d reads delayed, want 1", hit.Load())
	}
	failed := 0
	for i, k := range keys {
		if hs[i] != nil && !bytes.Equal(hs[i].Bytes(), want[k]) {
			t.Errorf("%s: wrong bytes", k)
		}
		if (errs[i] != nil || hs[i] == nil) && i != slow {
			if failed++; failed <= 3 {
				t.Errorf("%s: %v (holder %v)", k, errs[i], hs[i] != nil)
			}
		}
		if hs[i] != nil {
			hs[i].Release()
		}
	}
	if failed > 0 {
		t.Errorf("%d of the %d pages read in time failed", failed, pages-1)
	}
	if after := n.ssdReplicasOf(t, "n1"); after != before {
		t.Errorf("n1's SSD replicas %d -> %d: healthy replicas dropped after one slow read", before, after)
	}
}
