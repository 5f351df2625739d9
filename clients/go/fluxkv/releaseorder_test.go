package fluxkv

import (
	"sync"
	"testing"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
)

// A call made while Flush's Release is in flight waits for it: on another connection it
// could reach the owner first and plan room (a get's target, a put) that those releases
// were about to free, and a full owner would evict a value for it.
func TestCallsWaitForReleasesInFlight(t *testing.T) {
	n := startNode(t, "64MiB")
	c := n.connect(t)
	c.opts.ReleaseDelay = time.Hour // this test flushes by itself
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	h, err := c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	h.Release()

	var mu sync.Mutex
	var order []string
	inRelease, gate := make(chan struct{}), make(chan struct{})
	var first, opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // a failed test does not leave the Release (and Close) blocked
	c.hooks.onSend = func(method string, _ thrift.FastCodec) {
		mu.Lock()
		order = append(order, method)
		mu.Unlock()
		if method == releaseMethod {
			first.Do(func() { close(inRelease) })
			<-gate // the first Release stays unsent until the gate opens
		}
	}
	flushed := make(chan error, 1)
	go func() { flushed <- c.Flush() }()
	<-inRelease
	got := make(chan error, 1)
	go func() {
		h, err := c.Get("k")
		if err == nil {
			h.Release()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Get answered (%v) while a Release was in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	open()
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) < 2 || order[0] != releaseMethod || order[1] != "Get" {
		t.Fatalf("calls sent in the order %v; want Release, then Get", order)
	}
}
