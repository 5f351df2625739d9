package master

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/internal/etcdtest"
	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// TestIDMark: the counter idMark gives numbers the next term above next and idMargin
// more ids; a term's own ids short of its margin ask for no raise.
func TestIDMark(t *testing.T) {
	const epoch = 7
	base, next := int64(epoch)<<idEpochShift, int64(epoch+1)<<idEpochShift
	for _, c := range []struct{ id, want int64 }{
		{base, epoch},
		{next - idMargin - 1, epoch},
		{next - idMargin, epoch + 1},
	} {
		if got := idMark(c.id); got != c.want {
			t.Errorf("idMark(%d) = %d, want %d", c.id, got, c.want)
		}
	}
	old := time.Now().UnixNano() // an id a standalone master issued
	if (idMark(old)+1)<<idEpochShift <= old+idMargin {
		t.Errorf("the term after counter %d numbers from %d, not above %d", idMark(old), (idMark(old)+1)<<idEpochShift, old)
	}
}

// TestHATermRecordsCarriedIDs: after a standalone→HA migration the owners bring ids a
// standalone master numbered by time, far past any term's epoch range; the term numbers
// above them, and raises the epoch counter on etcd past them, so the next term numbers
// above every id this one issued too, whether or not an owner reports it (without,
// the next term started at its own epoch's base, and could hand a new holder the id of
// one an owner still acked, or a new put an id below an older version's: a review).
func TestHATermRecordsCarriedIDs(t *testing.T) {
	etcd := etcdtest.Start(t, etcdtest.Options{})
	cfg := ha.Config{Endpoints: etcd.Endpoints(), Prefix: ha.DefaultPrefix("ids")}
	log := zerolog.Nop()
	start := func() *HA {
		h, err := NewHA(Options{InsecureCluster: true, Logger: &log}, HAOptions{Etcd: cfg})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Start("127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Stop() })
		return h
	}
	leading := func(h *HA) *Server {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; {
			h.mu.Lock()
			srv := h.cur
			h.mu.Unlock()
			if srv != nil && srv.gate != nil && srv.gate() == nil {
				return srv
			}
			if time.Now().After(deadline) {
				t.Fatal("the master does not lead")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	h1 := start()
	srv := leading(h1)
	carried := time.Now().UnixNano()
	reg, err := srv.LocalClient().Register(context.Background(), &mp.RegisterRequest{
		Node: &mp.NodeRef{NodeId: "n1", Generation: 1}, SegmentSize: 1 << 20, PeerAddr: "127.0.0.1:1", DataAddr: "127.0.0.1:2",
		Pinned: []*mp.PinnedRange{{PinId: carried, Offset: 0, Len: 4096}},
	})
	if err != nil || reg.Code != common.ErrorCode_OK {
		t.Fatalf("register: %v %v", reg, err)
	}
	cli := etcd.Client(t)
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := cli.Get(context.Background(), cfg.Prefix+"epoch")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) > 0 {
			if v, _ := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64); v >= idMark(carried) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the epoch counter %v is not raised past id %d (counter %d) 10 s after a registration brought it", resp.Kvs, carried, idMark(carried))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := h1.Stop(); err != nil {
		t.Fatal(err)
	}
	srv2 := leading(start())
	if base := srv2.Epoch() << idEpochShift; base <= carried+idMargin {
		t.Errorf("the next term (epoch %d) numbers from %d, not above the ids %d and on the term before issued", srv2.Epoch(), base, carried)
	}
}

// A new term's write quiet period outlasts the hot-set leases of the term before, on
// that term's timing when it is known: a group whose masters disagree on
// --heartbeat-interval or --leader-ttl waits for the longer; and it outlasts what is
// left of the last term's own quiet period, which covered the terms before it.
func TestTermQuiet(t *testing.T) {
	now := time.Unix(1000, 0)
	q := func(hb, ttl time.Duration, last ha.Served) time.Duration { return termQuiet(hb, ttl, last, now) }
	own := q(time.Second, 2*time.Second, ha.Served{})
	if want := 2*time.Second - time.Second/4 - ha.Margin(2*time.Second); own != want {
		t.Fatalf("quiet with no term before: %v, want %v", own, want)
	}
	if got := q(time.Second, 2*time.Second, ha.Served{Epoch: 3, Heartbeat: time.Second, TTL: 2 * time.Second}); got != own {
		t.Fatalf("quiet after a term of the same timing: %v, want %v", got, own)
	}
	longer := ha.Served{Epoch: 3, Heartbeat: 4 * time.Second, TTL: 2 * time.Second}
	if got, want := q(time.Second, 2*time.Second, longer), 8*time.Second-time.Second-ha.Margin(2*time.Second); got != want {
		t.Fatalf("quiet after a term of a longer heartbeat: %v, want %v", got, want)
	}
	shorterTTL := ha.Served{Epoch: 3, Heartbeat: time.Second, TTL: 400 * time.Millisecond}
	if got, want := q(time.Second, 2*time.Second, shorterTTL), 2*time.Second-time.Second/4-ha.Margin(400*time.Millisecond); got != want {
		t.Fatalf("quiet after a term of a shorter TTL: %v, want %v", got, want)
	}
	if got := q(time.Millisecond, time.Second, ha.Served{}); got != time.Millisecond {
		t.Fatalf("quiet of a term whose margin passes its leases: %v, want the 1 ms floor", got)
	}
	// Its own timing longer than the last term's: its own.
	if got, want := q(4*time.Second, 2*time.Second, ha.Served{Epoch: 3, Heartbeat: time.Second, TTL: 2 * time.Second}), 8*time.Second-time.Second-ha.Margin(2*time.Second); got != want {
		t.Fatalf("quiet longer on its own timing: %v, want %v", got, want)
	}
	// The last term ended within its quiet period, which runs 10 s more (it covered a
	// term before it of a long heartbeat): those leases may still run.
	within := ha.Served{Epoch: 4, Heartbeat: time.Second, TTL: 2 * time.Second, QuietUntil: now.Add(10 * time.Second).UnixNano()}
	if got := q(time.Second, 2*time.Second, within); got != 10*time.Second {
		t.Fatalf("quiet after a term that ended within its quiet period: %v, want the 10 s left of it", got)
	}
	// One long over adds nothing: a long heartbeat once in the group is not waited forever.
	over := ha.Served{Epoch: 4, Heartbeat: time.Second, TTL: 2 * time.Second, QuietUntil: now.Add(-time.Hour).UnixNano()}
	if got := q(time.Second, 2*time.Second, over); got != own {
		t.Fatalf("quiet after a term whose quiet period ended long ago: %v, want %v", got, own)
	}
	// A term whose master's clock ran an hour ahead recorded an end an hour ahead: no
	// more than its whole quiet period (10 s) is waited of it (an hour held every delete
	// and publish, at this failover and every one after it in that hour; a review).
	within.Quiet = 10 * time.Second
	ahead := within
	ahead.QuietUntil = now.Add(time.Hour + 10*time.Second).UnixNano()
	if got := q(time.Second, 2*time.Second, ahead); got != 10*time.Second {
		t.Fatalf("quiet after a term whose clock ran an hour ahead: %v, want its 10 s", got)
	}
	if got := q(time.Second, 2*time.Second, within); got != 10*time.Second {
		t.Fatalf("quiet after a term that recorded its length and ended within its quiet period: %v, want the 10 s left", got)
	}
}

// An owner registered last with a master before the HA term that served last (not that
// term's) missed it: the master refuses its report whole, whatever the owner does (one
// of an earlier release reports anyway). An owner that came from that term, or
// registers with this master again, reports as before.
func TestReportAfterASkippedTermRefused(t *testing.T) {
	srv, err := NewServer(Options{InsecureCluster: true, Epoch: 30, LastTermEpoch: 20, WriteQuiet: -1})
	if err != nil {
		t.Fatal(err)
	}
	h := &handler{s: srv}
	ctx := context.Background()
	port := 0
	report := func(id string, prev int64) []int32 {
		t.Helper()
		node := &mp.NodeRef{NodeId: id, Generation: 1}
		port += 2
		peer, data := fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.1:%d", port+1)
		rr, err := h.Register(ctx, &mp.RegisterRequest{Node: node, SegmentSize: 1 << 20, PeerAddr: peer, DataAddr: data, PrevEpoch: prev})
		if err != nil || rr.Code != common.ErrorCode_OK || rr.LastTermEpoch != 20 {
			t.Fatalf("register %s: %v %+v; want OK and last_term_epoch 20", id, err, rr)
		}
		recs := []*mp.ReplicaRecord{{Key: id + "/a", PutId: 5, Len: 4096, Memory: true, Offset: 0}, {Key: id + "/b", PutId: 6, Len: 4096, Memory: true, Offset: 4096}}
		resp, err := h.ReportReplicas(ctx, &mp.ReportReplicasRequest{Node: node, Records: recs, Last: true})
		if err != nil || resp.Code != common.ErrorCode_OK {
			t.Fatalf("report of %s: %v %+v", id, err, resp)
		}
		return resp.Rejected
	}
	if rej := report("skipped", 10); len(rej) != 2 {
		t.Fatalf("the report of an owner that skipped the last term: %d of 2 records refused, want all", len(rej))
	}
	if rej := report("followed", 20); len(rej) != 0 {
		t.Fatalf("the report of an owner that followed the last term: %v refused, want none", rej)
	}
}
