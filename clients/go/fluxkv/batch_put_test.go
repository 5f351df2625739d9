package fluxkv

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// methods records the calls a client sends.
type methods struct {
	mu   sync.Mutex
	seen map[string]int
}

func recordMethods(c *Client) *methods {
	m := &methods{seen: map[string]int{}}
	c.hooks.onSend = func(method string, _ thrift.FastCodec) {
		m.mu.Lock()
		m.seen[method]++
		m.mu.Unlock()
	}
	return m
}

func (m *methods) count(method string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seen[method]
}

func patternItems(prefix string, count int, size int64) []PutItem {
	items := make([]PutItem, count)
	for i := range items {
		key := fmt.Sprintf("%s/%d", prefix, i)
		items[i] = PutItem{Key: key, Len: size, Fill: func(id int64, dst []byte) error { pattern(key, id, dst); return nil }}
	}
	return items
}

// 40 × 8 MiB on a 256 MiB node: the batch goes in waves of at most half the segment and
// stores every item (the newest stay resident, the oldest are evicted by later waves).
func TestBatchPutWavesLargerThanSegment(t *testing.T) {
	n := startNode(t, "256MiB")
	c := n.connect(t)
	m := recordMethods(c)
	const count, size = 40, 8 << 20
	items := patternItems("wave", count, size)
	begin := time.Now()
	errs, err := c.BatchPut(items, PutOptions{})
	took := time.Since(begin)
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for i, e := range errs {
		if e != nil {
			t.Errorf("item %d: %v", i, e)
			continue
		}
		stored++
	}
	if stored != count {
		t.Fatalf("stored %d of %d items", stored, count)
	}
	if took > 60*time.Second {
		t.Fatalf("the batch took %v (deadline 60s)", took)
	}
	half := wire.PutWaveBytes(c.SegmentSize())
	if got := c.stats.maxWaveBytes.Load(); got > half || got == 0 {
		t.Fatalf("a wave held %d bytes uncommitted, the bound is %d", got, half)
	}
	if w := c.stats.waves.Load(); w < count*size/half || int(w) != m.count("BatchPutStart") || int(w) != m.count("BatchPutEnd") {
		t.Fatalf("%d waves, %d BatchPutStart, %d BatchPutEnd", w, m.count("BatchPutStart"), m.count("BatchPutEnd"))
	}
	checkValue(t, c, items[count-1].Key, size)
	t.Logf("batch of %d × %d MiB on a %d MiB segment: %v in %d waves", count, size>>20, c.SegmentSize()>>20, took, c.stats.waves.Load())
}

// An item larger than the segment fails the batch at once, nothing started.
func TestBatchPutOversizeItem(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	m := recordMethods(c)
	items := []PutItem{{Key: "small", Value: []byte("x")}, {Key: "huge", Len: c.SegmentSize() + 1, Fill: func(int64, []byte) error { return nil }}}
	errs, err := c.BatchPut(items, PutOptions{})
	if !errors.Is(err, ErrInvalidArgument) || errs != nil {
		t.Fatalf("oversize item: errs %v, err %v; want ErrInvalidArgument", errs, err)
	}
	if got := m.count("BatchPutStart") + m.count("PutStart"); got != 0 {
		t.Fatalf("%d puts started before the oversize item was refused", got)
	}
	if ok, _ := c.Exists("small"); ok {
		t.Fatal("an item of a refused batch was stored")
	}
}

// Per-item outcomes, reject_if_exists, and a lost BatchPutEnd reply retried on the same
// session (the owner answers the repeat with the first outcomes).
func TestBatchPutItemsAndLostEnd(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	if err := c.Put("b/1", []byte("old")); err != nil {
		t.Fatal(err)
	}
	errs, err := c.BatchPut([]PutItem{{Key: "b/0", Value: []byte("a")}, {Key: "b/1", Value: []byte("b")}}, PutOptions{RejectIfExists: true})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], ErrAlreadyExists) {
		t.Fatalf("reject_if_exists batch: %v %v", errs, err)
	}
	dropOnce(c, "BatchPutEnd")
	items := patternItems("lost", 100, 4096) // more than the 64 puts the owner remembered before
	errs, err = c.BatchPut(items, PutOptions{RejectIfExists: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if errors.Is(e, ErrAlreadyExists) {
			t.Fatalf("item %d: ALREADY_EXISTS reported for the client's own put: %v", i, e)
		}
		if e != nil {
			t.Fatalf("item %d after a lost BatchPutEnd reply: %v (the owner must answer a repeated PutEnd)", i, e)
		}
		checkValue(t, c, items[i].Key, 4096)
	}
	if c.stats.putEndRetries.Load() != 1 || c.stats.putRedos.Load() != 0 {
		t.Fatalf("%d PutEnd retries, %d redos; want 1 and 0", c.stats.putEndRetries.Load(), c.stats.putRedos.Load())
	}
}

// Batch calls of more than wire.MaxBatch keys go in several requests; more releases
// than one call may carry go out in several calls of at most wire.MaxReleasesPerCall
// ids, and every holder is released.
func TestReleasesChunked(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	if err := c.Put("r", []byte("value")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var most, carrying int
	c.hooks.onSend = func(_ string, args thrift.FastCodec) {
		var s *external.Session
		switch a := args.(type) {
		case *external.ExternalServiceReleaseArgs:
			s = a.Req.Session
		case *external.ExternalServiceBatchGetArgs:
			s = a.Req.Session
		case *external.ExternalServiceStatArgs:
			s = a.Req.Session
		}
		if s != nil && len(s.Releases) > 0 {
			mu.Lock()
			most = max(most, len(s.Releases))
			carrying++
			mu.Unlock()
		}
	}
	const total = wire.MaxReleasesPerCall + 1000 // also more keys than one BatchGet carries
	keys := make([]string, total)
	for i := range keys {
		keys[i] = "r"
	}
	hs, errs, err := c.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if h == nil || string(h.Bytes()) != "value" {
			t.Fatalf("holder %d: %v", i, errs[i])
		}
	}
	if ex, err := c.BatchExists(append(keys, "missing")); err != nil || len(ex) != total+1 || !ex[total-1] || ex[total] {
		t.Fatalf("BatchExists of %d keys: %v", total+1, err)
	}
	c.opts.ReleaseDelay = time.Hour // the test flushes by itself
	for _, h := range hs {
		h.Release()
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stat()
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if most > wire.MaxReleasesPerCall || carrying < 2 {
		t.Fatalf("releases went out on %d calls, at most %d on one (limit %d)", carrying, most, wire.MaxReleasesPerCall)
	}
	if st.ClientHolders != 0 {
		t.Fatalf("%d holders left after releasing all", st.ClientHolders)
	}
}
