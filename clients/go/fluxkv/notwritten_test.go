package fluxkv

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
)

// TestPutSessionReplacedBeforeWrite: another goroutine re-attached (the owner restarted)
// between a put's PutStart answer and its write: the session took the put with it and
// nothing was published, so the put is redone on the new session, RejectIfExists or not,
// a Put as a BatchPut's items (a review: with RejectIfExists it answered the outcome
// unknown).
func TestPutSessionReplacedBeforeWrite(t *testing.T) {
	n := startNode(t, "64MiB")
	for _, batch := range []bool{false, true} {
		for _, reject := range []bool{false, true} {
			c := n.connect(t)
			var restarted atomic.Int64
			c.hooks.onReply = func(m string, _ thrift.FastCodec) {
				if (m == "PutStart" || m == "BatchPutStart") && restarted.CompareAndSwap(0, 1) {
					n.restart()
					if err := c.reattach(c.current()); err != nil {
						t.Errorf("re-attach: %v", err)
					}
				}
			}
			key := fmt.Sprintf("sr-%v-%v", batch, reject)
			fills := 0
			fill := func(id int64, dst []byte) error { fills++; pattern(key, id, dst); return nil }
			var err error
			if batch {
				var errs []error
				errs, err = c.BatchPut([]PutItem{{Key: key, Len: 20_000, Fill: fill}, {Key: key + "-2", Len: 100, Fill: fill}}, PutOptions{RejectIfExists: reject})
				err = errors.Join(append(errs, err)...)
			} else {
				_, err = c.PutWithID(key, 20_000, PutOptions{RejectIfExists: reject}, fill)
			}
			if restarted.Load() != 1 {
				t.Fatalf("batch=%v reject=%v: the owner was not restarted", batch, reject)
			}
			if err != nil {
				t.Fatalf("batch=%v reject=%v: a put whose session ended before its write: %v", batch, reject, err)
			}
			if want := map[bool]int{false: 1, true: 2}[batch]; fills != want || c.stats.putRedos.Load() != int64(want) {
				t.Fatalf("batch=%v reject=%v: fill ran %d times, %d redos; want %d each (only the redo writes)", batch, reject, fills, c.stats.putRedos.Load(), want)
			}
			checkValue(t, c, key, 20_000)
			c.Close()
		}
	}
}

// TestBatchStreamedItemSessionGone: under client isolation, the owner restarts on a
// PutWrite of a BatchPut item larger than the put area (streamed): the put was never
// ended, so the item is redone, as a Put is (a review: it failed with an error that
// matched no sentinel).
func TestBatchStreamedItemSessionGone(t *testing.T) {
	n := startNode(t, "64MiB", "--client-isolation", "--put-area", "1MiB")
	c := n.connect(t)
	var restarted atomic.Int64
	c.hooks.dropReply = func(m string) bool {
		if m != "PutWrite" || !restarted.CompareAndSwap(0, 1) {
			return false
		}
		n.restart()
		return true
	}
	const size = 3 << 20
	fill := func(id int64, dst []byte) error { pattern("big", id, dst); return nil }
	if errs, err := c.BatchPut([]PutItem{{Key: "big", Len: size, Fill: fill}}, PutOptions{}); errors.Join(append(errs, err)...) != nil {
		err = errors.Join(append(errs, err)...)
		t.Fatalf("a streamed item whose owner restarted on a PutWrite: %v", err)
	}
	if restarted.Load() != 1 || c.stats.putRedos.Load() != 1 {
		t.Fatalf("restarted %d, redos %d; want 1 each", restarted.Load(), c.stats.putRedos.Load())
	}
	checkValue(t, c, "big", size)
}

// heldWithSlowReleases connects to a new node with releases that wait 5 s for a call to
// ride on, and returns the client and its holder of key "k" (the owner counts it).
func heldWithSlowReleases(t *testing.T) (*Client, *MemHolder) {
	t.Helper()
	n := startNode(t, "64MiB")
	c, err := Connect(Options{Socket: n.socket(), Name: t.Name(), ReleaseDelay: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	waitHolders(t, c, 1)
	return c, h
}

// TestFlushWaitsForReleasesInFlight: a release riding on another goroutine's call still
// in flight reaches the owner before Flush returns (a review: Flush returned at once, and
// the Stat after it still counted the holder).
func TestFlushWaitsForReleasesInFlight(t *testing.T) {
	c, h := heldWithSlowReleases(t)
	var slowed atomic.Int64
	sending := make(chan struct{})
	c.hooks.onSend = func(m string, _ thrift.FastCodec) {
		if m == "Exists" && slowed.CompareAndSwap(0, 1) {
			close(sending)
			time.Sleep(time.Second) // the release rides on this call, slow to go out
		}
	}
	h.Release()
	done := make(chan error, 1)
	go func() { _, err := c.Exists("k"); done <- err }()
	<-sending
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	c.hooks.onSend = nil
	st, err := c.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.ClientHolders != 0 {
		t.Errorf("the owner counts %d holders after Flush returned, the release riding on another call", st.ClientHolders)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFlushWaitsForReleasesTakenWhileItSends: ids another call takes after Flush began
// reach the owner before Flush returns (CI: the release timer's Flush took the ids just
// after a test's Flush began, and the test's returned at once, finding the queue empty,
// while the owner had not yet seen those releases).
func TestFlushWaitsForReleasesTakenWhileItSends(t *testing.T) {
	c, h := heldWithSlowReleases(t)
	var answered atomic.Int64
	sending := make(chan struct{})
	c.hooks.onSend = func(m string, _ thrift.FastCodec) {
		if m == "Exists" {
			close(sending)
			time.Sleep(time.Second) // the release rides on this call, slow to go out
		}
	}
	c.hooks.onReply = func(m string, _ thrift.FastCodec) {
		if m == "Exists" {
			answered.Add(1)
		}
	}
	done := make(chan error, 1)
	c.hooks.flushing = func() {
		go func() { _, err := c.Exists("k"); done <- err }()
		<-sending // the Exists took the release
	}
	h.Release()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if answered.Load() != 1 {
		t.Errorf("Flush returned before the call that took the release was answered")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.hooks.onSend, c.hooks.onReply, c.hooks.flushing = nil, nil, nil
	waitHolders(t, c, 0)
}

// TestFlushReportsReleasesItCouldNotDeliver: Flush returns nil only once the releases it
// found queued or in flight reached the owner. A call carrying them that loses its reply
// gives them back, and its retry may take them again: Flush returned nil while they were
// queued or still riding on that retry (a review).
func TestFlushReportsReleasesItCouldNotDeliver(t *testing.T) {
	n := startNode(t, "64MiB")
	c, err := Connect(Options{Socket: n.socket(), Name: t.Name(), ReleaseDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	c.hooks.dropReply = func(m string) bool { return m == "Exists" }
	for i := range 30 {
		h, err := c.Get("k")
		if err != nil {
			t.Fatal(err)
		}
		sending := make(chan struct{})
		var once sync.Once
		c.hooks.onSend = func(m string, _ thrift.FastCodec) {
			if m == "Exists" {
				once.Do(func() { close(sending) })
			}
		}
		done := make(chan struct{})
		c.hooks.flushing = func() {
			go func() { c.Exists("k"); close(done) }() // every try loses its reply
			<-sending                                  // the Exists took the release
		}
		h.Release()
		err = c.Flush()
		c.mu.Lock()
		queued, carrying := len(c.releases), len(c.carrying)
		c.mu.Unlock()
		<-done
		c.hooks.flushing, c.hooks.onSend = nil, nil
		if err == nil && queued+carrying > 0 {
			t.Fatalf("round %d: Flush returned nil with %d releases queued and %d calls carrying some in flight", i, queued, carrying)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	waitHolders(t, c, 0)
}
