package daemon

import (
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// TestLeaseEndsBeforeNodeTTL: the master accepts any node TTL above the heartbeat
// interval, and tombs an owner silent for that long (Maintain): its replicas leave the
// routes, so a later delete of their keys invalidates it only in the background and
// answers at once. The owner's hot-set lease (two periods less a quarter from its last
// heartbeat's sending) must end before: with --node-ttl 1.5s and --heartbeat-interval 1s
// it ran past the tomb (RegisterResponse.node_ttl_ms was ignored).
func TestLeaseEndsBeforeNodeTTL(t *testing.T) {
	const hb, ttl = time.Second, 1500 * time.Millisecond
	opts := master.Options{IDBase: 100, HeartbeatInterval: hb, NodeTTL: ttl, InflightTTL: time.Minute, InsecureCluster: true}
	if err := opts.Validate(); err != nil {
		t.Skipf("the master refuses node TTL %v with heartbeats every %v: %v", ttl, hb, err)
	}
	ms := master.NewState(opts)
	t0 := time.Unix(1000, 0)
	ref := master.NodeRef{ID: "n1", Generation: 7}
	if err := ms.Register(t0, ref, 1<<20, 0, 0, "d1", "p1", master.SSDInfo{}, nil); err != nil {
		t.Fatal(err)
	}
	// The owner's side of the same registration, sent (and so answered) at t0.
	st := newOwnerState(stateOptions{nodeID: "n1", generation: 7, segSize: 1 << 20, grace: 10 * time.Second, hotBudget: 64 << 10})
	st.beginRegister(t0, time.Minute)
	st.endRegister(&mp.RegisterResponse{Code: common.ErrorCode_OK, MasterEpoch: 1,
		HeartbeatIntervalMs: hb.Milliseconds(), NodeTtlMs: ttl.Milliseconds()}, t0, 0)
	// The owner is cut off; the master's maintenance tombs it past the TTL.
	at := t0.Add(ttl + 100*time.Millisecond)
	if tombed := ms.Maintain(at); len(tombed) != 1 {
		t.Fatalf("not tombed at %v: %v", at.Sub(t0), tombed)
	}
	if st.leased(at) {
		t.Fatalf("the master tombed the owner %v after its last heartbeat, but the owner's lease runs until %v after it: it still answers gets from its hot set",
			at.Sub(t0), st.reg.leaseUntil.Sub(t0))
	}
}
