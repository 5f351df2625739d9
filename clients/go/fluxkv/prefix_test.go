package fluxkv

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// prefixRequests records the BatchExists requests a client sends.
type prefixRequests struct {
	mu   sync.Mutex
	reqs []*external.BatchExistsRequest
}

func recordPrefix(c *Client) *prefixRequests {
	p := &prefixRequests{}
	c.hooks.onSend = func(method string, args thrift.FastCodec) {
		if a, ok := args.(*external.ExternalServiceBatchExistsArgs); ok {
			r := *a.Req // the request as sent (Keys is the caller's chunk)
			p.mu.Lock()
			p.reqs = append(p.reqs, &r)
			p.mu.Unlock()
		}
	}
	return p
}

func (p *prefixRequests) take() []*external.BatchExistsRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.reqs
	p.reqs = nil
	return r
}

// putKeys stores a 1-byte value under each key, in one batch.
func putKeys(t *testing.T, c *Client, keys []string) {
	t.Helper()
	items := make([]PutItem, len(keys))
	for i, k := range keys {
		items[i] = PutItem{Key: k, Value: []byte{byte(i)}}
	}
	errs, err := c.BatchPut(items, PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("put %s: %v", keys[i], e)
		}
	}
}

func names(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/%d", prefix, i)
	}
	return keys
}

// Prefix lookups against a live owner: a gap stops the count, all present counts all,
// a first key absent counts 0; the requests carry prefix and the pin in milliseconds.
// (Until the owner serves prefix lookups the client's fallback answers the same.)
func TestBatchExistsPrefix(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	keys := names("prefix", 10)
	present := append(append([]string{}, keys[:5]...), keys[6:]...) // keys[5] is the gap
	putKeys(t, c, present)
	reqs := recordPrefix(c)
	for _, tc := range []struct {
		name  string
		keys  []string
		pin   time.Duration
		want  int
		pinMS int64
	}{
		{"gap in the middle", keys, 0, 5, 0},
		{"all present", keys[:5], 0, 5, 0},
		{"all present after the gap", keys[6:], 0, 4, 0},
		{"first absent", keys[5:], 0, 0, 0},
		{"only an absent key", keys[5:6], 0, 0, 0},
		{"gap, pinned for MaxPin", keys, MaxPin, 5, int64(external.MAX_PIN_MS)},
		{"all present, pinned for 1.5 ms", keys[:5], 1500 * time.Microsecond, 5, 2},
		{"pinned for 1 ns", keys[:3], time.Nanosecond, 3, 1},
	} {
		got, err := c.BatchExistsPrefix(tc.keys, tc.pin)
		if err != nil || got != tc.want {
			t.Errorf("%s: BatchExistsPrefix = %d, %v; want %d", tc.name, got, err, tc.want)
		}
		sent := reqs.take()
		if len(sent) != 1 || !sent[0].Prefix || sent[0].PinMs != tc.pinMS || len(sent[0].Keys) != len(tc.keys) {
			t.Errorf("%s: sent %d requests, first %+v; want one with prefix, pin_ms %d, %d keys", tc.name, len(sent), sent, tc.pinMS, len(tc.keys))
		}
	}
	// The keys pinned above are still there and readable, and a get takes a pin over.
	checkGet := func(k string, want byte) {
		h, err := c.Get(k)
		if err != nil || len(h.Bytes()) != 1 || h.Bytes()[0] != want {
			t.Fatalf("get %s after a pin: %v", k, err)
		}
		h.Release()
	}
	checkGet(keys[0], 0)
	checkGet(keys[4], 4)
	if got, err := c.BatchExistsPrefix(nil, 0); got != 0 || err != nil {
		t.Fatalf("no keys: %d, %v", got, err)
	}
	if sent := reqs.take(); len(sent) != 0 {
		t.Fatalf("no keys: %d requests sent", len(sent))
	}
	// A plain BatchExists is no prefix lookup: every key answered.
	ex, err := c.BatchExists(keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range ex {
		if e != (i != 5) {
			t.Fatalf("BatchExists[%d] = %t", i, e)
		}
	}
	if sent := reqs.take(); len(sent) != 1 || sent[0].Prefix || sent[0].PinMs != 0 {
		t.Fatalf("BatchExists sent %+v", sent)
	}
}

// The pin and the keys are checked before anything is sent.
func TestBatchExistsPrefixValidation(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	putKeys(t, c, []string{"v/0"})
	m := recordMethods(c)
	for _, pin := range []time.Duration{-time.Nanosecond, -time.Second, MaxPin + time.Nanosecond, MaxPin + time.Millisecond, time.Hour} {
		got, err := c.BatchExistsPrefix([]string{"v/0"}, pin)
		if !errors.Is(err, ErrInvalidArgument) || got != 0 {
			t.Errorf("pin %v: %d, %v; want ErrInvalidArgument", pin, got, err)
		}
	}
	for _, keys := range [][]string{{"v/0", ""}, {string(make([]byte, wire.MaxKeyBytes+1))}} {
		if got, err := c.BatchExistsPrefix(keys, 0); !errors.Is(err, ErrInvalidArgument) || got != 0 {
			t.Errorf("bad key: %d, %v; want ErrInvalidArgument", got, err)
		}
	}
	if k := m.count("BatchExists"); k != 0 {
		t.Fatalf("%d BatchExists calls sent for refused lookups", k)
	}
	for _, pin := range []time.Duration{0, time.Millisecond, MaxPin} {
		if got, err := c.BatchExistsPrefix([]string{"v/0"}, pin); got != 1 || err != nil {
			t.Errorf("pin %v: %d, %v; want 1", pin, got, err)
		}
	}
}

// Over MAX_BATCH keys: chunks of MAX_BATCH, a later chunk sent only when the whole
// previous one was present.
func TestBatchExistsPrefixChunks(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	const total, gap = wire.MaxBatch + 50, wire.MaxBatch + 10 // keys[gap] is absent: in the second chunk
	keys := names("chunk", total)
	putKeys(t, c, append(append([]string{}, keys[:gap]...), keys[gap+1:]...))
	missing := func(at int, ks []string) []string { // ks with an absent key inserted at index at
		return append(append(append([]string{}, ks[:at]...), "chunk/missing"), ks[at:]...)
	}
	reqs := recordPrefix(c)
	for _, tc := range []struct {
		name  string
		keys  []string
		want  int
		sizes []int // keys per request sent
	}{
		{"gap in the second chunk", keys, gap, []int{wire.MaxBatch, 50}},
		{"all present, two chunks", keys[:gap], gap, []int{wire.MaxBatch, 10}},
		{"exactly one chunk", keys[:wire.MaxBatch], wire.MaxBatch, []int{wire.MaxBatch}},
		{"gap first in the second chunk", keys[10:], wire.MaxBatch, []int{wire.MaxBatch, 40}},
		{"gap in the first chunk: one call", missing(1, keys), 1, []int{wire.MaxBatch}},
		{"first absent: one call", missing(0, keys), 0, []int{wire.MaxBatch}},
	} {
		got, err := c.BatchExistsPrefix(tc.keys, time.Second)
		if err != nil || got != tc.want {
			t.Errorf("%s: %d, %v; want %d", tc.name, got, err, tc.want)
		}
		var sizes []int
		for _, r := range reqs.take() {
			sizes = append(sizes, len(r.Keys))
		}
		if fmt.Sprint(sizes) != fmt.Sprint(tc.sizes) {
			t.Errorf("%s: requests of %v keys, want %v", tc.name, sizes, tc.sizes)
		}
	}
}

// The count a prefix answer gives, from a prefix-aware owner (results stop after the
// first absent key, found counts) and from one that predates prefix lookups (every key
// answered, found 0).
func TestPrefixCount(t *testing.T) {
	yes := &external.ExistsResponse{Exists: true}
	no := &external.ExistsResponse{}
	bad := &external.ExistsResponse{Code: common.ErrorCode_UNAVAILABLE, Exists: true}
	rs := func(r ...*external.ExistsResponse) []*external.ExistsResponse { return r }
	for _, tc := range []struct {
		name    string
		results []*external.ExistsResponse
		found   int32
		n, want int
	}{
		{"new owner: gap", rs(yes, yes, no), 2, 5, 2},
		{"new owner: all present", rs(yes, yes, yes), 3, 3, 3},
		{"new owner: first absent", rs(no), 0, 4, 0},
		{"new owner: first absent, one key", rs(no), 0, 1, 0},
		{"new owner: first key failed", rs(bad), 0, 3, 0},
		{"new owner: found beyond the keys", rs(yes), 9, 1, 1},
		{"new owner: negative found", rs(), -1, 2, 0},
		{"old owner: gap", rs(yes, yes, no, yes, yes), 0, 5, 2},
		{"old owner: all present", rs(yes, yes, yes), 0, 3, 3},
		{"old owner: first absent", rs(no, yes, yes), 0, 3, 0},
		{"old owner: a key failed", rs(yes, bad, yes), 0, 3, 1},
		{"old owner: a nil result", rs(yes, nil, yes), 0, 3, 1},
		{"old owner: more results than keys", rs(yes, yes, yes), 0, 2, 2},
		{"new owner, all present, found wins", rs(yes, no, yes), 3, 3, 3},
		{"no results", nil, 0, 2, 0},
	} {
		if got := prefixCount(tc.results, tc.found, tc.n); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
