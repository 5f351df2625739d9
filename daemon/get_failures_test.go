package daemon

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// badFirstSource is a master client whose first GetStart plan of a remote memory pull
// names an unreachable data address for the source: the pull fails as a transient
// network failure to that source would (ErrUnreachable), while the source and its
// replica stay alive and registered.
type badFirstSource struct {
	masterservice.Client
	spoiled atomic.Int64
}

func (b *badFirstSource) GetStart(ctx context.Context, req *mp.GetStartRequest, opts ...callopt.Option) (*mp.GetStartResponse, error) {
	resp, err := b.Client.GetStart(ctx, req, opts...)
	if err == nil && resp.Code == common.ErrorCode_OK && !resp.Done && resp.Source == common.Source_MEMORY &&
		b.spoiled.CompareAndSwap(0, 1) {
		resp.SourceDataAddr = "127.0.0.1:1" // connection refused
	}
	return resp, err
}

// TestFailedPullIsNotAMiss: the key's only replica lives on n1; n2's pull from it
// fails once (unreachable). The re-plan excludes n1 and the master finds no other
// source: the get must not answer KEY_NOT_FOUND, as the key exists (a second get
// reads it from n1 at once).
func TestFailedPullIsNotAMiss(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{})
	o2, c2 := n.addOwner(t, "n2", 8<<20, nil)
	val := value(7, 64<<10)
	if err := n.c.Put("k", val); err != nil {
		t.Fatal(err)
	}
	bad := &badFirstSource{}
	(&node{o: o2}).wrapMaster(func(c masterservice.Client) masterservice.Client { bad.Client = c; return bad })
	h, err := c2.Get("k")
	if bad.spoiled.Load() == 0 {
		t.Fatal("no remote pull was planned")
	}
	if errors.Is(err, fluxkv.ErrKeyNotFound) {
		h2, err2 := c2.Get("k")
		if err2 == nil {
			defer h2.Release()
		}
		t.Fatalf("get after one failed pull answered %v although the key exists (the next get: err=%v)", err, err2)
	}
	if err != nil {
		t.Logf("get: %v (a retryable error is acceptable)", err)
		return
	}
	defer h.Release()
	if !bytes.Equal(h.Bytes(), val) {
		t.Fatal("wrong bytes")
	}
}

// TestTimedOutPullReplans: a pull from another owner that runs out of its
// TransferTimeout (here: at once) fails with the context's error, which wraps neither
// ErrUnreachable nor ErrFenced: planGet must treat it as an unreachable source (it
// neither re-planned nor answered UNAVAILABLE, and the client saw INTERNAL).
func TestTimedOutPullReplans(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{})
	_, c2 := n.addOwner(t, "n2", 8<<20, nil, func(o *Options) { o.TransferTimeout = time.Nanosecond })
	if err := n.c.Put("k", value(7, 64<<10)); err != nil {
		t.Fatal(err)
	}
	h, err := c2.Get("k")
	if err == nil {
		h.Release()
		t.Skip("the pull beat its deadline")
	}
	if !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Fatalf("get whose pull timed out: %v, want UNAVAILABLE (retryable) after a re-plan", err)
	}
}

// TestExpiredGetNotInvalidArgument: a pull that completes just after the
// master's in-flight TTL (its GetDone finds the get expired) must fail retryably
// (or re-plan), not answer the client INVALID_ARGUMENT as if it had sent a bad request.
func TestExpiredGetNotInvalidArgument(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{InflightTTL: 200 * time.Millisecond})
	o2, c2 := n.addOwner(t, "n2", 8<<20, nil)
	if err := n.c.Put("k", value(7, 64<<10)); err != nil {
		t.Fatal(err)
	}
	var fired atomic.Int32
	o2.mu.Lock()
	o2.mu.afterWrite = func(int64) {
		if fired.Add(1) == 1 {
			time.Sleep(2 * time.Second) // the master expires the get meanwhile
		}
	}
	o2.mu.Unlock()
	h, err := c2.Get("k")
	if fired.Load() == 0 {
		t.Fatal("no pull ran")
	}
	if err == nil {
		h.Release()
		return
	}
	if errors.Is(err, fluxkv.ErrInvalidArgument) {
		t.Fatalf("get whose GetDone came after the TTL: %v, want a retryable error or a re-plan", err)
	}
	t.Logf("get: %v", err)
}
