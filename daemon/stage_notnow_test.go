package daemon

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cloudwego/kitex/pkg/endpoint"
	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// stageNotNow answers the next n stage reads (one or a batch) UNAVAILABLE, as an owner
// whose record a refresh moved answers, without reading.
func stageNotNow(n *atomic.Int64) []server.Option {
	return []server.Option{server.WithMiddleware(func(next endpoint.Endpoint) endpoint.Endpoint {
		return func(ctx context.Context, req, resp any) error {
			switch r := resp.(type) {
			case *peer.PeerServiceSsdStageReadResult:
				if n.Add(-1) >= 0 {
					r.Success = &peer.SsdStageReadResponse{Code: common.ErrorCode_UNAVAILABLE, Message: "rewritten while the load waited (moved)"}
					return nil
				}
			case *peer.PeerServiceBatchSsdStageReadResult:
				if n.Add(-1) >= 0 {
					items := req.(*peer.PeerServiceBatchSsdStageReadArgs).Req.Items
					out := &peer.BatchSsdStageReadResponse{Code: common.ErrorCode_OK}
					for range items {
						out.Results = append(out.Results, &peer.SsdStageReadResponse{Code: common.ErrorCode_UNAVAILABLE, Message: "moved"})
					}
					r.Success = out
					return nil
				}
			}
			return next(ctx, req, resp)
		}
	})}
}

// TestRemoteRefillNotNowPlansAgain: an owner whose SSD holds the only copy answers a
// stage read UNAVAILABLE (it could not read now: a refresh moved the record); the
// requester plans the get again, that owner not excluded nor reported failed, and
// serves the value from it (a review: the get failed, "every replica on an excluded
// node"). A lone get and a batch's.
func TestRemoteRefillNotNowPlansAgain(t *testing.T) {
	t.Parallel()
	var notNow atomic.Int64
	_, c2, keys := ssdOnlyPagesOn(t, 6, func(o *Options) { o.testPeerServerOpts = stageNotNow(&notNow) })
	notNow.Store(1)
	h, err := c2.Get(keys[0])
	if err != nil {
		t.Fatalf("a lone get whose stage read was answered UNAVAILABLE once: %v", err)
	}
	if !bytes.Equal(h.Bytes(), value(0, 64<<10)) || notNow.Load() >= 0 {
		t.Fatalf("lone get: bytes equal %v, answers left %d (want one taken)", bytes.Equal(h.Bytes(), value(0, 64<<10)), notNow.Load())
	}
	h.Release()
	notNow.Store(1)
	hs, errs, err := c2.BatchGet(keys[1:])
	if err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if errs[i] != nil || h == nil || !bytes.Equal(h.Bytes(), value(i+1, 64<<10+i+1)) {
			t.Fatalf("%s of a batch whose stage read was answered UNAVAILABLE once: %v", keys[i+1], errs[i])
		}
		h.Release()
	}
	if notNow.Load() >= 0 {
		t.Fatal("the batch made no stage read (the test's premise)")
	}
	// Twice in a row from the same source: it may be out itself (stopping, its tier
	// closed): the next plan excludes it, and with no other replica the get is
	// UNAVAILABLE, not planned on it a third time.
	notNow.Store(2)
	if h, err := c2.Get(keys[0]); err == nil {
		h.Release()
		t.Fatal("a get served after its only source answered UNAVAILABLE twice (the test's premise: 2 answers)")
	} else if !strings.Contains(err.Error(), "excluded") || notNow.Load() != 0 {
		t.Fatalf("a get whose only source answered UNAVAILABLE twice: %v (answers left %d), want it excluded after two", err, notNow.Load())
	}
}
