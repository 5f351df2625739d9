package master

import (
	"context"
	"testing"

	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// opsTotal is fluxkv_ops_total{op,result} in m (0 when never counted).
func opsTotal(t *testing.T, m *metrics.Metrics, op, result string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "fluxkv_ops_total" {
			continue
		}
	next:
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if (l.GetName() == "op" && l.GetValue() != op) || (l.GetName() == "result" && l.GetValue() != result) {
					continue next
				}
			}
			return s.GetCounter().GetValue()
		}
	}
	return 0
}

// TestFollowerNotLeaderIsNotError: an HA standby (follower) answers every call
// NOT_LEADER by design; fluxkv_ops_total counts those answers as result="not_leader",
// not as failed calls (the dashboard's failed calls, FluxkvPutErrors).
func TestFollowerNotLeaderIsNotError(t *testing.T) {
	s := authtest.Secrets(t)
	mm := metrics.New()
	h, err := NewHA(Options{Secrets: s, Metrics: mm}, HAOptions{Etcd: ha.Config{Endpoints: []string{"127.0.0.1:1"}, Prefix: ha.DefaultPrefix("notleader")}, AdvertiseAddr: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	srv := h.follower()
	if err := srv.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	c := masterClient(t, srv.Addr().String(), s)
	ref := &mp.NodeRef{NodeId: "n1", Generation: 1}
	reg, err := c.Register(context.Background(), &mp.RegisterRequest{Node: ref, SegmentSize: 1 << 20, PeerAddr: "127.0.0.1:1"})
	if err != nil || reg.Code != common.ErrorCode_NOT_LEADER {
		t.Fatalf("register with a follower: %v %v, want NOT_LEADER", err, reg)
	}
	put, err := c.PutStart(context.Background(), &mp.PutStartRequest{Node: ref, Key: "k", Len: 100})
	if err != nil || put.Code != common.ErrorCode_NOT_LEADER {
		t.Fatalf("PutStart with a follower: %v %v, want NOT_LEADER", err, put)
	}
	for _, op := range []string{"Register", "PutStart"} {
		if v := opsTotal(t, mm, op, metrics.ResultError); v != 0 {
			t.Errorf("follower: fluxkv_ops_total{op=%q,result=\"error\"} = %v after one call answered NOT_LEADER, want 0", op, v)
		}
		if v := opsTotal(t, mm, op, metrics.ResultNotLeader); v != 1 {
			t.Errorf("follower: fluxkv_ops_total{op=%q,result=\"not_leader\"} = %v after one call answered NOT_LEADER, want 1", op, v)
		}
	}
}
