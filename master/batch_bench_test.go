package master

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// The master's cost of a KV page put on a full node, as `fluxkv up` pays it in a trace
// replay: batches of chained 64 KiB pages (BatchPutStart, then BatchPutDone) through the
// in-process client into one owner's 32 MiB segment, which holds 500 of them, so from the
// second round on every put evicts. The master is past its rebuild window (no tombstones
// kept) and the owner acks its eviction notices with a heartbeat every 40 batches, as a
// steady node does about every second. Reported per page.
//
//	go test ./master/ -run '^$' -bench BatchPutFullNode -count 5
func BenchmarkBatchPutFullNode(b *testing.B) {
	const pages, pageBytes = 24, 64 << 10
	srv, err := NewServer(Options{Secrets: authtest.Secrets(b), NodeTTL: time.Hour, WriteQuiet: -1, RebuildWindow: time.Nanosecond})
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Stop() })
	c := srv.LocalClient()
	ctx := context.Background()
	node := &mp.NodeRef{NodeId: "n1", Generation: 1}
	// The peer address answers nothing: a single node has no one to invalidate.
	if r, err := c.Register(ctx, &mp.RegisterRequest{Node: node, SegmentSize: 32 << 20, DataAddr: "127.0.0.1:1", PeerAddr: "127.0.0.1:2"}); err != nil || r.Code != common.ErrorCode_OK {
		b.Fatalf("register: %+v, %v", r, err)
	}
	ns := "kv1/bench/tp0of1/pp0of1/uint8/-"
	seq, batches, ack := 0, 0, int64(0)
	heartbeat := func() {
		hb, err := c.Heartbeat(ctx, &mp.HeartbeatRequest{Node: node, EvictionsAck: ack, EvictionsEpoch: srv.Epoch()})
		if err != nil || hb.Code != common.ErrorCode_OK {
			b.Fatalf("heartbeat: %+v, %v", hb, err)
		}
		ack = hb.EvictionsSeq
	}
	batch := func() {
		if batches++; batches%40 == 0 {
			heartbeat()
		}
		starts := make([]*mp.PutStartItem, pages)
		for i := range starts {
			parent := ""
			if i > 0 {
				parent = fmt.Sprintf("%s/%x", ns, seq+i-1)
			}
			starts[i] = &mp.PutStartItem{Key: fmt.Sprintf("%s/%x", ns, seq+i), Len: pageBytes, RejectIfExists: true, Parent: &parent}
		}
		seq += pages
		ps, err := c.BatchPutStart(ctx, &mp.BatchPutStartRequest{Node: node, Items: starts})
		if err != nil || ps.Code != common.ErrorCode_OK {
			b.Fatalf("batch put start: %+v, %v", ps, err)
		}
		dones := make([]*mp.PutDoneItem, 0, pages)
		for i, r := range ps.Results {
			if r.Code != common.ErrorCode_OK {
				b.Fatalf("put start %d: %v %s", i, r.Code, r.Message)
			}
			dones = append(dones, &mp.PutDoneItem{Key: starts[i].Key, PutId: r.PutId})
		}
		pd, err := c.BatchPutDone(ctx, &mp.BatchPutDoneRequest{Node: node, Items: dones})
		if err != nil || pd.Code != common.ErrorCode_OK {
			b.Fatalf("batch put done: %+v, %v", pd, err)
		}
		for i, r := range pd.Results {
			if r.Code != common.ErrorCode_OK {
				b.Fatalf("put done %d: %v %s", i, r.Code, r.Message)
			}
		}
	}
	for range 2 * 500 / pages { // fill the segment twice over: every put evicts from here on
		batch()
	}
	b.ResetTimer()
	for range b.N {
		batch()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pages), "ns/page")
}
