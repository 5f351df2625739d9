package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// shardFiles lists the SSD tier's files under the storage's paths.
func shardFiles(t *testing.T, n *node) []string {
	t.Helper()
	var files []string
	for _, p := range n.o.opts.SSD.Paths {
		filepath.WalkDir(p, func(path string, d os.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				files = append(files, path)
			}
			return nil
		})
	}
	if len(files) == 0 {
		t.Fatal("no shard files found")
	}
	return files
}

// truncateShards empties the SSD tier's files under the running owner.
func (n *node) truncateShards(t *testing.T) {
	t.Helper()
	for _, f := range shardFiles(t, n) {
		if err := os.Truncate(f, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// putValues puts count values of size bytes, prefix-i holding value(i, size), and
// waits for their SSD persists; it returns their keys.
func (n *node) putValues(t *testing.T, prefix string, count, size int) []string {
	t.Helper()
	keys := make([]string, count)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
		if err := n.c.Put(keys[i], value(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	return keys
}

// wrapMaster makes the owner's master calls go through wrap's client (a fault
// injector around the real one).
func (n *node) wrapMaster(wrap func(masterservice.Client) masterservice.Client) {
	cur := n.o.master.client.Load()
	n.o.master.client.Store(&masterClient{Client: wrap(cur.Client), addr: cur.addr, ctx: cur.ctx, cancel: cur.cancel})
}

// TestSSDCorruptRecordNeverServed is the outside test's finding: shard files
// truncated under a running owner, then more puts. Every get of an evicted key must
// answer its exact bytes or a clean miss/UNAVAILABLE, never other bytes; each corrupt
// record is dropped and counted.
func TestSSDCorruptRecordNeverServed(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 64<<20)
	n := startNode(t, 4<<20, so, master.Options{})
	const size = 1 << 20
	keys := n.putValues(t, "c", 12, size)
	n.truncateShards(t)
	// More puts: the ring writes past the truncation, leaving holes (zeros) behind.
	for i := 12; i < 14; i++ {
		k := fmt.Sprintf("c-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	var hitsMem, hitsSSD, misses int
	for i, k := range keys {
		h, err := n.c.Get(k)
		switch {
		case errors.Is(err, fluxkv.ErrKeyNotFound), errors.Is(err, fluxkv.ErrUnavailable):
			misses++
			continue
		case err != nil:
			t.Fatalf("get %s: %v", k, err)
		}
		if !bytes.Equal(h.Bytes(), value(i, size)) {
			t.Fatalf("get %s (%s): wrong bytes", k, h.Source())
		}
		if h.Source() == "ssd" {
			hitsSSD++
		} else {
			hitsMem++
		}
		h.Release()
	}
	st := n.o.store.Stats()
	t.Logf("memory hits %d, SSD hits %d, misses %d, corrupt reads %d", hitsMem, hitsSSD, misses, st.CorruptReads)
	if misses == 0 || st.CorruptReads == 0 {
		t.Fatalf("the truncated records were not detected: %d misses, %d corrupt reads", misses, st.CorruptReads)
	}
	n.drain(t, keys)
}

// revokeLost is the owner's master client with every GetRevoke lost on the way (the
// master never sees it): a fault the real connection gives only at random.
type revokeLost struct {
	masterservice.Client
	lost atomic.Int64
}

func (r *revokeLost) GetRevoke(ctx context.Context, req *mp.GetRevokeRequest, opts ...callopt.Option) (*mp.GetRevokeResponse, error) {
	r.lost.Add(1)
	return nil, errors.New("injected: connection reset before the master read the request")
}

// TestSSDCorruptReadRevokeLost: a refill from the owner's own SSD whose read fails
// revokes the get; when that revoke never reaches the master, the get expires with the
// in-flight TTL, and the holder the master recorded at GetStart (which an expiry keeps:
// the owner may have handed the bytes out) must still be released by the owner, or the
// target's memory stays held until the owner registers again.
func TestSSDCorruptReadRevokeLost(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 64<<20)
	n := startNode(t, 4<<20, so, master.Options{InflightTTL: 500 * time.Millisecond})
	const size = 256 << 10
	keys := n.putValues(t, "r", 24, size)
	n.truncateShards(t)
	lost := &revokeLost{}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { lost.Client = c; return lost })
	for i, k := range keys[:3] { // the oldest: evicted to SSD
		h, err := n.c.Get(k)
		switch {
		case errors.Is(err, fluxkv.ErrKeyNotFound), errors.Is(err, fluxkv.ErrUnavailable):
			continue
		case err != nil:
			t.Fatalf("get %s: %v", k, err)
		}
		if !bytes.Equal(h.Bytes(), value(i, size)) {
			t.Fatalf("get %s (%s): wrong bytes", k, h.Source())
		}
		h.Release()
	}
	if lost.lost.Load() == 0 {
		t.Fatal("no revoke was sent: the test made no failed refill")
	}
	t.Logf("%d revokes lost", lost.lost.Load())
	n.drain(t, keys) // holders 0 and memory empty: the expired gets' holders were released
}

// TestSSDDeleteForgetsEntries: deleted and overwritten keys leave the ring's index at
// once, and used bytes count live records only.
func TestSSDDeleteForgetsEntries(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 64<<20)
	n := startNode(t, 32<<20, so, master.Options{})
	for i := 0; i < 4; i++ {
		if err := n.c.Put(fmt.Sprintf("d-%d", i), value(i, 100<<10)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	if st := n.o.store.Stats(); st.Entries != 4 || st.UsedBytes == 0 {
		t.Fatalf("after 4 persisted puts: %d entries, %d used bytes", st.Entries, st.UsedBytes)
	}
	// Overwrite one: still one entry for it (the new version's).
	if err := n.c.Put("d-0", value(9, 50<<10)); err != nil {
		t.Fatal(err)
	}
	n.waitPersisted(t)
	if st := n.o.store.Stats(); st.Entries != 4 {
		t.Fatalf("after an overwrite: %d entries, want 4", st.Entries)
	}
	for i := 0; i < 4; i++ {
		if _, err := n.c.Delete(fmt.Sprintf("d-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if st := n.o.store.Stats(); st.Entries != 0 || st.UsedBytes != 0 {
		t.Fatalf("after deleting every key: %d entries, %d used bytes; want 0, 0", st.Entries, st.UsedBytes)
	}
	n.drain(t, nil)
}

// TestRefillStoreClosedKeepsSSDReplica: a local SSD refill the storage refuses because
// it is closing (the owner stopping) says nothing about the record: the get is
// UNAVAILABLE, tried once, and the master keeps the SSD replica (it dropped it, as for
// a failed read, and the value was lost from the cluster's SSD tier at every shutdown).
func TestRefillStoreClosedKeepsSSDReplica(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 64<<20)
	n := startNode(t, 4<<20, so, master.Options{})
	keys := n.putValues(t, "c", 12, 1<<20)
	before := n.ssdReplicasOf(t, "n1")
	if err := n.o.store.Close(); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, k := range keys {
		h, err := n.c.Get(k)
		switch {
		case err == nil:
			h.Release() // still in memory
		case errors.Is(err, fluxkv.ErrUnavailable):
			refused++
		default:
			t.Fatalf("get %s with the SSD tier closed: %v, want UNAVAILABLE", k, err)
		}
	}
	if refused == 0 {
		t.Fatal("no get needed an SSD refill: the test does not test")
	}
	if after := n.ssdReplicasOf(t, "n1"); after != before {
		t.Errorf("SSD replicas at the master: %d before, %d after %d refills refused by a closing storage", before, after, refused)
	}
}
