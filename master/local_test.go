package master

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// TestLocalClient: the in-process client (fluxkv up's owner) runs the handlers: a
// registration, a put and a get answer as over the network; a wait for space ends at
// the caller's deadline with the answer; a handler's panic (a nil request) is an error to the caller,
// and the master goes on serving; once stopped, it answers nothing.
func TestLocalClient(t *testing.T) {
	srv := startPeerFailMaster(t, Options{Secrets: authtest.Secrets(t), AllocWait: 20 * time.Second, WriteQuiet: -1})
	c := srv.LocalClient()
	ctx := context.Background()
	node := &mp.NodeRef{NodeId: "n1", Generation: 1}
	reg, err := c.Register(ctx, &mp.RegisterRequest{Node: node, SegmentSize: 4096, DataAddr: "127.0.0.1:1", PeerAddr: "127.0.0.1:2"})
	if err != nil || reg.Code != common.ErrorCode_OK || reg.MasterEpoch != srv.Epoch() {
		t.Fatalf("register: %+v, %v", reg, err)
	}
	ps, err := c.PutStart(ctx, &mp.PutStartRequest{Node: node, Key: "k", Len: 4096})
	if err != nil || ps.Code != common.ErrorCode_OK {
		t.Fatalf("put start: %+v, %v", ps, err)
	}
	if pd, err := c.PutDone(ctx, &mp.PutDoneRequest{Node: node, Key: "k", PutId: ps.PutId}); err != nil || pd.Code != common.ErrorCode_OK {
		t.Fatalf("put done: %+v, %v", pd, err)
	}
	gs, err := c.GetStart(ctx, &mp.GetStartRequest{Node: node, Key: "k"})
	if err != nil || gs.Code != common.ErrorCode_OK || gs.TargetOffset != ps.TargetOffset {
		t.Fatalf("get start: %+v, %v; want the put's range at %d", gs, err, ps.TargetOffset)
	}
	// The segment is full and k is held by the get: a second put waits for space (a
	// 20 s, AllocWait), only as long as its caller's context lasts, and then answers
	// NO_SPACE (its last attempt cannot evict the held k).
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if ps2, err := c.PutStart(short, &mp.PutStartRequest{Node: node, Key: "k2", Len: 4096}); err != nil || ps2.Code != common.ErrorCode_NO_SPACE {
		t.Fatalf("put into a full segment: %+v, %v; want NO_SPACE at the caller's deadline", ps2, err)
	}
	if d := time.Since(t0); d < 200*time.Millisecond {
		t.Fatalf("the put into a full segment answered after %v: before its caller's deadline", d)
	}
	// A caller whose context has ended is refused before the handler runs.
	if _, err := c.PutStart(short, &mp.PutStartRequest{Node: node, Key: "k3", Len: 4096}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("put with an ended context: %v; want its deadline", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("the put into a full segment returned after %v: past its caller's deadline", d)
	}
	if _, err := c.Register(ctx, nil); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("a nil registration: %v; want the handler's panic as an error", err)
	}
	if st, err := c.Stat(ctx, &mp.StatRequest{}); err != nil || st.Code != common.ErrorCode_OK || st.Keys != 1 {
		t.Fatalf("stat after the panic: %+v, %v; want 1 key", st, err)
	}
	srv.Stop()
	if _, err := c.Stat(ctx, &mp.StatRequest{}); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Fatalf("stat after Stop: %v; want an error", err)
	}
}

// TestLocalBatchWaitsOneAllocWait: an in-process batch waits for space one AllocWait in
// all, as over the network: each key short of space waited its own (the batch's bound was
// on the handler's context, and the in-process waits end with the caller's), until the
// owner's call timed out (a review).
func TestLocalBatchWaitsOneAllocWait(t *testing.T) {
	wait := time.Second
	srv := startPeerFailMaster(t, Options{Secrets: authtest.Secrets(t), AllocWait: wait, WriteQuiet: -1})
	c, node := registerLocal(t, srv)
	ctx := context.Background()
	ps, err := c.PutStart(ctx, &mp.PutStartRequest{Node: node, Key: "k", Len: 4096})
	if err == nil && ps.Code == common.ErrorCode_OK {
		_, err = c.PutDone(ctx, &mp.PutDoneRequest{Node: node, Key: "k", PutId: ps.PutId})
	}
	if err != nil {
		t.Fatal(err)
	}
	if gs, err := c.GetStart(ctx, &mp.GetStartRequest{Node: node, Key: "k"}); err != nil || gs.Code != common.ErrorCode_OK {
		t.Fatalf("get start: %+v, %v", gs, err) // k is held: no key of the batch finds room
	}
	var items []*mp.PutStartItem
	for _, k := range []string{"a", "b", "c", "d"} {
		items = append(items, &mp.PutStartItem{Key: k, Len: 4096})
	}
	long, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	t0 := time.Now()
	r, err := c.BatchPutStart(long, &mp.BatchPutStartRequest{Node: node, Items: items})
	took := time.Since(t0)
	if err != nil || r.Code != common.ErrorCode_OK || len(r.Results) != len(items) {
		t.Fatalf("batch put start: %+v, %v", r, err)
	}
	for i, res := range r.Results {
		if res.Code != common.ErrorCode_NO_SPACE {
			t.Errorf("item %d: %v, want NO_SPACE", i, res.Code)
		}
	}
	if took > 3*wait {
		t.Fatalf("the batch waited %v for space, %d AllocWaits of %v: want one in all", took, took/wait, wait)
	}
}

// TestLocalWriteEndedWithinTheQuietIsUnknown: an in-process write whose caller gives up
// within the write quiet period answers UNAVAILABLE (its outcome unknown), as a caller
// over the network sees it: it answered OK before the quiet ended (a review).
func TestLocalWriteEndedWithinTheQuietIsUnknown(t *testing.T) {
	srv := startPeerFailMaster(t, Options{Secrets: authtest.Secrets(t), WriteQuiet: 2 * time.Second})
	c, node := registerLocal(t, srv)
	ctx := context.Background()
	ps, err := c.PutStart(ctx, &mp.PutStartRequest{Node: node, Key: "k", Len: 4096})
	if err != nil || ps.Code != common.ErrorCode_OK {
		t.Fatalf("put start: %+v, %v", ps, err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	pd, err := c.PutDone(short, &mp.PutDoneRequest{Node: node, Key: "k", PutId: ps.PutId})
	if err != nil || pd.Code != common.ErrorCode_UNAVAILABLE {
		t.Fatalf("put done ended within the quiet period: %+v, %v; want UNAVAILABLE", pd, err)
	}
}

// registerLocal registers owner n1 (a 4 KiB segment) through srv's in-process client.
func registerLocal(t *testing.T, srv *Server) (masterservice.Client, *mp.NodeRef) {
	t.Helper()
	c := srv.LocalClient()
	node := &mp.NodeRef{NodeId: "n1", Generation: 1}
	if reg, err := c.Register(context.Background(), &mp.RegisterRequest{Node: node, SegmentSize: 4096, DataAddr: "127.0.0.1:1", PeerAddr: "127.0.0.1:2"}); err != nil || reg.Code != common.ErrorCode_OK {
		t.Fatalf("register: %+v, %v", reg, err)
	}
	return c, node
}
