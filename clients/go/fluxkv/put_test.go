package fluxkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"sync/atomic"
	"testing"

	"github.com/fluxkv/fluxkv/internal/proctest"
)

// pattern writes the bytes of version putID of key: every value is checkable.
func pattern(key string, putID int64, dst []byte) {
	h := fnv.New64a()
	h.Write([]byte(key))
	x := h.Sum64() ^ uint64(putID)*0x9e3779b97f4a7c15
	var w [8]byte
	for i := 0; i < len(dst); i += 8 {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		binary.LittleEndian.PutUint64(w[:], z^z>>31)
		copy(dst[i:], w[:])
	}
}

// checkValue gets key and requires the bytes of pattern(key, its put_id), n long.
func checkValue(t *testing.T, c *Client, key string, n int64) int64 {
	t.Helper()
	h, err := c.Get(key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	defer h.Release()
	want := make([]byte, n)
	pattern(key, h.PutID(), want)
	if !bytes.Equal(h.Bytes(), want) {
		t.Fatalf("get %q: %d bytes of put_id %d differ from the pattern", key, h.Len(), h.PutID())
	}
	return h.PutID()
}

func TestPutWithID(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	var seen int64
	fill := func(id int64, dst []byte) error { seen = id; pattern("k", id, dst); return nil }
	id1, err := c.PutWithID("k", 100_000, PutOptions{}, fill)
	if err != nil || id1 != seen || id1 <= 0 {
		t.Fatalf("PutWithID: id %d, fill saw %d, err %v", id1, seen, err)
	}
	if got := checkValue(t, c, "k", 100_000); got != id1 {
		t.Fatalf("get reports put_id %d, PutWithID returned %d", got, id1)
	}
	id2, err := c.PutWithID("k", 1000, PutOptions{}, fill)
	if err != nil || id2 <= id1 {
		t.Fatalf("overwrite: id %d after %d, err %v", id2, id1, err)
	}
	checkValue(t, c, "k", 1000)
	if _, err := c.PutWithID("k", 10, PutOptions{RejectIfExists: true}, fill); !errors.Is(err, ErrAlreadyExists) {
		t.Fatalf("reject_if_exists on an existing key: %v, want ErrAlreadyExists", err)
	}
	fillErr := errors.New("fill failed")
	if _, err := c.PutWithID("k2", 10, PutOptions{}, func(int64, []byte) error { return fillErr }); !errors.Is(err, fillErr) {
		t.Fatalf("failing fill: %v", err)
	}
	if ok, err := c.Exists("k2"); ok || err != nil {
		t.Fatalf("an aborted put left a value: %v %v", ok, err)
	}
}

// dropOnce makes the client lose the reply of the next call to method: the request
// reaches the owner, the connection closes before the answer is read.
func dropOnce(c *Client, method string) *atomic.Int64 {
	var dropped atomic.Int64
	c.hooks.dropReply = func(m string) bool {
		return m == method && dropped.CompareAndSwap(0, 1)
	}
	return &dropped
}

// A lost PutEnd reply: the client sends PutEnd again on the same session (the owner
// answers the repeat with the first outcome) and never redoes the put; with
// reject_if_exists it never reports ALREADY_EXISTS for its own put.
func TestPutEndLostReplyRetriedOnSession(t *testing.T) {
	n := startNode(t, "64MiB")
	for _, reject := range []bool{false, true} {
		c := n.connect(t)
		dropped := dropOnce(c, "PutEnd")
		key := "lost-end"
		if reject {
			key = "lost-end-reject"
		}
		id, err := c.PutWithID(key, 50_000, PutOptions{RejectIfExists: reject}, func(id int64, dst []byte) error {
			pattern(key, id, dst)
			return nil
		})
		if dropped.Load() != 1 {
			t.Fatalf("reject=%v: the fault was not injected", reject)
		}
		if errors.Is(err, ErrAlreadyExists) {
			t.Fatalf("reject=%v: the client reported ALREADY_EXISTS for its own put: %v", reject, err)
		}
		if err != nil {
			t.Fatalf("reject=%v: put after a lost PutEnd reply: %v (the owner must answer a repeated PutEnd)", reject, err)
		}
		if got := c.stats.putEndRetries.Load(); got != 1 {
			t.Errorf("reject=%v: %d PutEnd retries, want 1", reject, got)
		}
		if got := c.stats.putRedos.Load(); got != 0 {
			t.Errorf("reject=%v: %d whole puts redone, want 0 (PutEnd is retried, never the put)", reject, got)
		}
		if got := checkValue(t, c, key, 50_000); got != id {
			t.Fatalf("reject=%v: value has put_id %d, the put returned %d", reject, got, id)
		}
	}
}

// The owner restarts between PutEnd and its answer: the session is gone, the outcome
// unknown. Without reject_if_exists the put is redone on the new session; with it the
// client reports UNAVAILABLE (outcome unknown), never ALREADY_EXISTS.
func TestPutEndSessionGone(t *testing.T) {
	n := startNode(t, "64MiB")
	for _, reject := range []bool{false, true} {
		c := n.connect(t)
		var crashed atomic.Int64
		c.hooks.dropReply = func(m string) bool {
			if m != "PutEnd" || !crashed.CompareAndSwap(0, 1) {
				return false
			}
			n.restart()
			return true
		}
		fills := 0
		_, err := c.PutWithID("gone", 20_000, PutOptions{RejectIfExists: reject}, func(id int64, dst []byte) error {
			fills++
			pattern("gone", id, dst)
			return nil
		})
		if crashed.Load() != 1 {
			t.Fatalf("reject=%v: the owner was not restarted", reject)
		}
		if reject {
			if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrAlreadyExists) {
				t.Fatalf("reject=%v: %v, want ErrUnavailable (outcome unknown)", reject, err)
			}
			if fills != 1 {
				t.Fatalf("reject=%v: fill ran %d times, want 1 (no redo)", reject, fills)
			}
			continue
		}
		if err != nil {
			t.Fatalf("reject=%v: put across an owner restart: %v", reject, err)
		}
		if fills != 2 || c.stats.putRedos.Load() != 1 {
			t.Fatalf("reject=%v: fill ran %d times, %d redos; want the put redone once", reject, fills, c.stats.putRedos.Load())
		}
		checkValue(t, c, "gone", 20_000)
		if _, err := c.Delete("gone"); err != nil {
			t.Fatal(err)
		}
	}
}

// A lost reply of a retry-safe call (Get) is sent again on a fresh connection; a lost
// PutStart reply on a live session is not. The owner takes back what the lost replies
// handed out (the first Get's holder, the put's range) at once, not at the session's end.
func TestLostReplyRetryRules(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	if err := c.Put("a", []byte("value")); err != nil {
		t.Fatal(err)
	}
	dropOnce(c, "Get")
	h, err := c.Get("a")
	if err != nil {
		t.Fatalf("get after a lost reply: %v", err)
	}
	if got := c.stats.retries.Load(); got != 1 {
		t.Fatalf("%d retries, want 1", got)
	}
	holders := func() int64 {
		t.Helper()
		st, err := c.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return st.ClientHolders
	}
	proctest.WaitUntil(t, func() bool { return holders() == 1 }) // the retry's, not the lost reply's
	h.Release()
	c.Flush()
	proctest.WaitUntil(t, func() bool { return holders() == 0 })
	dropOnce(c, "PutStart")
	if err := c.Put("b", []byte("value")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("put after a lost PutStart reply: %v, want ErrUnavailable", err)
	}
	if got := c.stats.retries.Load(); got != 1 {
		t.Fatalf("PutStart was retried after a lost reply on a live session (%d retries)", got)
	}
	if ok, _ := c.Exists("b"); ok {
		t.Fatal("a put whose PutStart reply was lost was published")
	}
}

// TestRequestOverAFrameIsInvalid: a request larger than a frame (a put's 40 MiB parent)
// is refused before it is sent, ErrInvalidArgument, and not retried: it was taken for a
// connection lost before sending (Unavailable, "request not sent") and sent again.
func TestRequestOverAFrameIsInvalid(t *testing.T) {
	n := startNode(t, "16MiB")
	c := n.connect(t)
	parent := string(bytes.Repeat([]byte{'p'}, 40<<20))
	before := c.stats.retries.Load()
	err := c.PutWith("k", 10, PutOptions{Parent: &parent}, func(dst []byte) error { return nil })
	if !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a put whose request exceeds a frame: %v, want ErrInvalidArgument", err)
	}
	if n := c.stats.retries.Load() - before; n != 0 {
		t.Errorf("%d retries of a request that was never sent", n)
	}
	if err := c.Put("k", []byte("v")); err != nil {
		t.Fatalf("the client after it: %v", err)
	}
}
