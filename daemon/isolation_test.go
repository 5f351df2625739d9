package daemon_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// testArea is the put area the isolation tests run with: small, so values above it
// (streamed) stay small too.
const testArea = 64 << 10

func startIsolated(t *testing.T, extra ...string) *proc {
	t.Helper()
	return startUp(t, "64MiB", append([]string{"--client-isolation", "--put-area", "64KiB"}, extra...)...)
}

// TestIsolatedPutsRoundTrip: under client isolation values below, equal to and above the
// put area (streamed through it) round-trip byte-exact through Put, PutWithID (Fill)
// and BatchPut, and the client never maps the segment writable.
func TestIsolatedPutsRoundTrip(t *testing.T) {
	t.Parallel()
	p := startIsolated(t)
	c := connect(t, p.socket)
	if !c.Isolated() || c.PutAreaSize() != testArea {
		t.Fatalf("Isolated=%t PutAreaSize=%d, want true %d", c.Isolated(), c.PutAreaSize(), testArea)
	}
	sizes := []int{1, 4095, testArea - 1, testArea, testArea + 1, 3*testArea + 17, 1<<20 + 3}
	var keys []string
	check := func(key string, want []byte) {
		t.Helper()
		h, err := c.Get(key)
		if err != nil {
			t.Fatalf("get %s: %v", key, err)
		}
		defer h.Release()
		if !bytes.Equal(h.Bytes(), want) {
			t.Fatalf("%s: %d bytes differ from the %d put", key, len(h.Bytes()), len(want))
		}
	}
	for i, n := range sizes {
		key := fmt.Sprintf("put-%d", n)
		v := payload(int64(i), n)
		if err := c.Put(key, v); err != nil {
			t.Fatalf("put %d bytes: %v", n, err)
		}
		check(key, v)
		fkey := fmt.Sprintf("fill-%d", n)
		fills := 0
		id, err := c.PutWithID(fkey, int64(n), fluxkv.PutOptions{}, func(putID int64, dst []byte) error {
			fills++
			if len(dst) != n {
				return fmt.Errorf("fill got %d bytes, want %d", len(dst), n)
			}
			copy(dst, payload(putID, n))
			return nil
		})
		if err != nil || fills != 1 {
			t.Fatalf("PutWithID %d bytes: %v (fill ran %d times)", n, err, fills)
		}
		check(fkey, payload(id, n))
		keys = append(keys, key, fkey)
	}
	// A batch: small items share the area at distinct offsets, a large one streams alone.
	var items []fluxkv.PutItem
	for i := range 40 {
		n := 1000 + 997*i
		if i == 17 {
			n = 2*testArea + 5
		}
		items = append(items, fluxkv.PutItem{Key: fmt.Sprintf("batch-%d", i), Value: payload(int64(1000+i), n)})
	}
	items = append(items, fluxkv.PutItem{Key: "batch-fill", Len: testArea + 9, Fill: func(putID int64, dst []byte) error {
		copy(dst, payload(7, len(dst)))
		return nil
	}})
	errs, err := c.BatchPut(items, fluxkv.PutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, it := range items {
		if errs[i] != nil {
			t.Fatalf("batch item %d: %v", i, errs[i])
		}
		want := it.Value
		if it.Fill != nil {
			want = payload(7, int(it.Len))
		}
		check(it.Key, want)
		keys = append(keys, it.Key)
	}
	leakCheck(t, c, keys...)
}

// putStartRaw starts a put of n bytes with a raw call and returns its put_id.
func putStartRaw(t *testing.T, c *fluxkv.Client, key string, n int64) int64 {
	t.Helper()
	res := &external.ExternalServicePutStartResult{}
	if err := c.Call("PutStart", &external.ExternalServicePutStartArgs{Req: &external.PutStartRequest{
		Session: rawSession(c), Key: key, Len: n}}, res); err != nil || res.Success.Code != common.ErrorCode_OK {
		t.Fatalf("PutStart: %v %v", err, res.Success)
	}
	return res.Success.PutId
}

func rawSession(c *fluxkv.Client) *external.Session {
	return &external.Session{ClientId: c.ClientID(), SessionToken: c.SessionToken(), OwnerGeneration: c.Generation()}
}

func putWriteRaw(t *testing.T, c *fluxkv.Client, key string, putID int64, copies ...*external.AreaCopy) *external.PutWriteResponse {
	t.Helper()
	res := &external.ExternalServicePutWriteResult{}
	if err := c.Call("PutWrite", &external.ExternalServicePutWriteArgs{Req: &external.PutWriteRequest{
		Session: rawSession(c), Key: key, PutId: putID, Copies: copies}}, res); err != nil {
		t.Fatalf("PutWrite: %v", err)
	}
	return res.Success
}

func putEndRaw(t *testing.T, c *fluxkv.Client, key string, putID int64, copies ...*external.AreaCopy) *external.PutEndResponse {
	t.Helper()
	res := &external.ExternalServicePutEndResult{}
	if err := c.Call("PutEnd", &external.ExternalServicePutEndArgs{Req: &external.PutEndRequest{
		Session: rawSession(c), Key: key, PutId: putID, Copies: copies}}, res); err != nil {
		t.Fatalf("PutEnd: %v", err)
	}
	return res.Success
}

func putAbortRaw(t *testing.T, c *fluxkv.Client, key string, putID int64) *external.PutAbortResponse {
	t.Helper()
	res := &external.ExternalServicePutAbortResult{}
	if err := c.Call("PutAbort", &external.ExternalServicePutAbortArgs{Req: &external.PutAbortRequest{
		Session: rawSession(c), Key: key, PutId: putID}}, res); err != nil {
		t.Fatalf("PutAbort: %v", err)
	}
	return res.Success
}

func batchPutEndRaw(t *testing.T, c *fluxkv.Client, items ...*external.PutEndItem) *external.BatchPutEndResponse {
	t.Helper()
	res := &external.ExternalServiceBatchPutEndResult{}
	if err := c.Call("BatchPutEnd", &external.ExternalServiceBatchPutEndArgs{Req: &external.BatchPutEndRequest{
		Session: rawSession(c), Items: items}}, res); err != nil {
		t.Fatalf("BatchPutEnd: %v", err)
	}
	return res.Success
}

func area(valueOff, areaOff, n int64) *external.AreaCopy {
	return &external.AreaCopy{ValueOffset: valueOff, AreaOffset: areaOff, Len: n}
}

// TestIsolatedBadCopies: every malformed copy (empty, outside the value or the area,
// overflowing, too many, more bytes in all than the value, for an unknown or ending put) is INVALID_ARGUMENT and leaves a
// pending put pending; a repeated PutEnd answers its first outcome without copying again.
func TestIsolatedBadCopies(t *testing.T) {
	t.Parallel()
	p := startIsolated(t)
	c := connect(t, p.socket)
	const n = 1000
	id := putStartRaw(t, c, "bad", n)
	bigID := putStartRaw(t, c, "big", 2*testArea)
	tooMany := make([]*external.AreaCopy, wire.MaxBatch+1)
	for i := range tooMany {
		tooMany[i] = area(0, 0, 1)
	}
	for _, tc := range []struct {
		name   string
		key    string
		id     int64
		copies []*external.AreaCopy
		want   string
	}{
		{"empty copy", "bad", id, []*external.AreaCopy{area(0, 0, 0)}, "must be positive"},
		{"negative length", "bad", id, []*external.AreaCopy{area(0, 0, -5)}, "must be positive"},
		{"past the value", "bad", id, []*external.AreaCopy{area(n-10, 0, 11)}, "outside the 1000-byte value"},
		{"negative value offset", "bad", id, []*external.AreaCopy{area(-1, 0, 10)}, "outside the 1000-byte value"},
		{"past the area", "bad", id, []*external.AreaCopy{area(0, testArea-10, 11)}, "outside the 65536-byte put area"},
		{"negative area offset", "bad", id, []*external.AreaCopy{area(0, -4096, 10)}, "outside the 65536-byte put area"},
		{"value offset overflow", "bad", id, []*external.AreaCopy{area(math.MaxInt64, 0, 2)}, "outside the 1000-byte value"},
		{"area offset overflow", "bad", id, []*external.AreaCopy{area(0, math.MaxInt64-1, 10)}, "outside the 65536-byte put area"},
		{"length overflow", "bad", id, []*external.AreaCopy{area(10, 10, math.MaxInt64)}, "outside the 1000-byte value"},
		{"too many copies", "bad", id, tooMany, "exceed the limit"},
		// Copies of one call that together exceed the value or the area (overlapping: one
		// copy of the whole area sent 4,096 times would have the owner copy 4,096 area-fulls
		// for one small call).
		{"copies past the value in all", "bad", id, []*external.AreaCopy{area(0, 0, n), area(0, 0, n)}, "add up to more than 1000 bytes"},
		{"copies overflowing in all", "bad", id, []*external.AreaCopy{area(0, 0, n/2), area(0, 0, n/2), area(0, 0, 1)}, "add up to more than 1000 bytes"},
		{"copies past the area in all", "big", bigID, []*external.AreaCopy{area(0, 0, testArea), area(testArea, 0, testArea)}, "add up to more than 65536 bytes"},
		{"unknown put", "bad", id + 1000, []*external.AreaCopy{area(0, 0, 10)}, "unknown put"},
		{"other key", "other", id, []*external.AreaCopy{area(0, 0, 10)}, "unknown put"},
	} {
		w := putWriteRaw(t, c, tc.key, tc.id, tc.copies...)
		if w.Code != common.ErrorCode_INVALID_ARGUMENT || !strings.Contains(w.Message, tc.want) {
			t.Errorf("PutWrite %s: %v %q, want INVALID_ARGUMENT containing %q", tc.name, w.Code, w.Message, tc.want)
		}
		e := putEndRaw(t, c, tc.key, tc.id, tc.copies...)
		if e.Code != common.ErrorCode_INVALID_ARGUMENT || !strings.Contains(e.Message, tc.want) {
			t.Errorf("PutEnd %s: %v %q, want INVALID_ARGUMENT containing %q", tc.name, e.Code, e.Message, tc.want)
		}
	}
	// The bad BatchPutEnd items fail alone; too many copies in all fail the call.
	b := batchPutEndRaw(t, c, &external.PutEndItem{Key: "bad", PutId: id, Copies: tooMany[:wire.MaxBatch/2+1]},
		&external.PutEndItem{Key: "bad", PutId: id, Copies: tooMany[:wire.MaxBatch/2+1]})
	if b.Code != common.ErrorCode_INVALID_ARGUMENT || !strings.Contains(b.Message, "exceed the limit") {
		t.Errorf("BatchPutEnd with too many copies: %v %q", b.Code, b.Message)
	}
	b = batchPutEndRaw(t, c, &external.PutEndItem{Key: "bad", PutId: id, Copies: []*external.AreaCopy{area(0, testArea, 1)}})
	if b.Code != common.ErrorCode_OK || len(b.Results) != 1 || b.Results[0].Code != common.ErrorCode_INVALID_ARGUMENT {
		t.Errorf("BatchPutEnd with a bad copy: %v %q %v", b.Code, b.Message, b.Results)
	}

	// The put is still pending: stage a value in the area (a client Put leaves its bytes
	// at area offset 0), copy it with PutWrite + PutEnd, and end the put.
	first := payload(1, n)
	if err := c.Put("stager", first); err != nil {
		t.Fatal(err)
	}
	if w := putWriteRaw(t, c, "bad", id, area(0, 0, n/2)); w.Code != common.ErrorCode_OK {
		t.Fatalf("valid PutWrite: %v %q", w.Code, w.Message)
	}
	if e := putEndRaw(t, c, "bad", id, area(n/2, n/2, n/2)); e.Code != common.ErrorCode_OK {
		t.Fatalf("valid PutEnd: %v %q", e.Code, e.Message)
	}
	if err := c.Put("stager", payload(2, n)); err != nil { // the area now holds other bytes
		t.Fatal(err)
	}
	if e := putEndRaw(t, c, "bad", id, area(0, 0, n)); e.Code != common.ErrorCode_OK {
		t.Fatalf("repeated PutEnd: %v %q, want the first outcome (OK)", e.Code, e.Message)
	}
	if w := putWriteRaw(t, c, "bad", id, area(0, 0, n)); w.Code != common.ErrorCode_INVALID_ARGUMENT {
		t.Fatalf("PutWrite after PutEnd: %v %q, want INVALID_ARGUMENT", w.Code, w.Message)
	}
	h, err := c.Get("bad")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Bytes(), first) {
		t.Fatal("the value is not the bytes copied by the first PutWrite + PutEnd (copied again?)")
	}
	h.Release()
	if a := putAbortRaw(t, c, "big", bigID); a.Code != common.ErrorCode_OK {
		t.Fatalf("abort the big put: %v %q", a.Code, a.Message)
	}
	leakCheck(t, c, "bad", "stager")
}

// TestCopiesWithoutIsolation: an owner without isolation refuses PutWrite and copies.
func TestCopiesWithoutIsolation(t *testing.T) {
	t.Parallel()
	p := startUp(t, "16MiB")
	c := connect(t, p.socket)
	if c.Isolated() || c.PutAreaSize() != 0 {
		t.Fatalf("Isolated=%t PutAreaSize=%d without --client-isolation", c.Isolated(), c.PutAreaSize())
	}
	id := putStartRaw(t, c, "k", 100)
	if w := putWriteRaw(t, c, "k", id, area(0, 0, 10)); w.Code != common.ErrorCode_INVALID_ARGUMENT || !strings.Contains(w.Message, "does not isolate") {
		t.Errorf("PutWrite: %v %q", w.Code, w.Message)
	}
	if e := putEndRaw(t, c, "k", id, area(0, 0, 10)); e.Code != common.ErrorCode_INVALID_ARGUMENT || !strings.Contains(e.Message, "does not isolate") {
		t.Errorf("PutEnd with copies: %v %q", e.Code, e.Message)
	}
	if e := putEndRaw(t, c, "k", id); e.Code != common.ErrorCode_OK {
		t.Errorf("PutEnd without copies: %v %q", e.Code, e.Message)
	}
	leakCheck(t, c, "k")
}

// TestPutAreaTotal: sessions get --put-area while the total allows, then what is left
// (at least 1 MiB), then NO_SPACE naming --put-area-total; a session's end gives its
// area back.
func TestPutAreaTotal(t *testing.T) {
	t.Parallel()
	p := startUp(t, "64MiB", "--client-isolation", "--put-area", "2MiB", "--put-area-total", "5MiB")
	var cs []*fluxkv.Client
	for i, want := range []int64{2 << 20, 2 << 20, 1 << 20} {
		c := connect(t, p.socket)
		if c.PutAreaSize() != want {
			t.Fatalf("session %d: put area %d, want %d", i, c.PutAreaSize(), want)
		}
		cs = append(cs, c)
	}
	_, err := fluxkv.Connect(fluxkv.Options{Socket: p.socket, Name: t.Name()})
	if !errors.Is(err, fluxkv.ErrNoSpace) || !strings.Contains(err.Error(), "--put-area-total") {
		t.Fatalf("attach beyond the total: %v, want ErrNoSpace naming --put-area-total", err)
	}
	cs[0].Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := fluxkv.Connect(fluxkv.Options{Socket: p.socket, Name: t.Name()})
		if err == nil {
			if c.PutAreaSize() != 2<<20 {
				t.Errorf("after a detach: put area %d, want %d", c.PutAreaSize(), 2<<20)
			}
			c.Close()
			break
		}
		if !errors.Is(err, fluxkv.ErrNoSpace) || time.Now().After(deadline) {
			t.Fatalf("attach after a detach: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The puts of a session with the smallest area still work (streamed).
	v := payload(3, 3<<20+1)
	if err := cs[2].Put("big", v); err != nil {
		t.Fatal(err)
	}
	h, err := cs[1].Get("big")
	if err != nil || !bytes.Equal(h.Bytes(), v) {
		t.Fatalf("get big: %v", err)
	}
	h.Release()
	leakCheck(t, cs[1], "big")
}

// TestExpiredPutWriteAnsweredAgain: a PutWrite past its put's copy deadline answers
// UNAVAILABLE, and so does the same PutWrite sent again (its reply was lost) and the
// put's PutEnd: the put expired, it was not unknown (INVALID_ARGUMENT made a client redo
// the whole put as an outcome it could not know).
func TestExpiredPutWriteAnsweredAgain(t *testing.T) {
	t.Parallel()
	p := startIsolated(t, "--inflight-ttl", "600ms") // copies refused 500 ms after PutStart
	c := connect(t, p.socket)
	const n = 1000
	id := putStartRaw(t, c, "late", n)
	time.Sleep(700 * time.Millisecond)
	for i := range 2 {
		if w := putWriteRaw(t, c, "late", id, area(0, 0, n)); w.Code != common.ErrorCode_UNAVAILABLE {
			t.Errorf("PutWrite %d past the copy deadline: %v %q, want UNAVAILABLE", i+1, w.Code, w.Message)
		}
	}
	if e := putEndRaw(t, c, "late", id, area(0, 0, n)); e.Code != common.ErrorCode_UNAVAILABLE {
		t.Errorf("PutEnd of the expired put: %v %q, want UNAVAILABLE", e.Code, e.Message)
	}
}

// TestIsolatedOwnerWithTheLongestNodeID: an owner whose node id is as long as ids go
// (wire.MaxNodeIDBytes) starts and attaches isolated clients. The segment's and put
// areas' memfd names carried the whole id, over memfd_create's 249 bytes: the owner did
// not start, or (an id a few bytes shorter) every isolated attach failed NO_SPACE.
func TestIsolatedOwnerWithTheLongestNodeID(t *testing.T) {
	t.Parallel()
	p := startIsolated(t, "--node-id", strings.Repeat("n", wire.MaxNodeIDBytes))
	c := connect(t, p.socket)
	v := payload(7, 5000)
	if err := c.Put("long-node", v); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("long-node")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if !bytes.Equal(h.Bytes(), v) {
		t.Fatal("the value came back changed")
	}
}
