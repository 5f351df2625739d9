package master

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// TestGetWaitsForUnansweredRelease: a get on a full owner, whose previous get's range
// its client released but the owner has not acked yet, waits for that ack instead of
// evicting a sole copy, also when the owner's answer to ReleaseHotSet comes after the
// master's timeout (a loaded machine: the ack and the answer are late together). The
// fault: the owner answers ReleaseHotSet 150 ms after a 20 ms timeout and acks the
// released holder just before it answers.
func TestGetWaitsForUnansweredRelease(t *testing.T) {
	s := authtest.Secrets(t)
	srv := startPeerFailMaster(t, Options{Secrets: s, InvalidateTimeout: 20 * time.Millisecond})
	b := NodeRef{ID: "b", Generation: 1}
	var held atomic.Int64 // the holder the owner's client released, not acked yet
	var asked atomic.Int64
	owner := &fakePeer{hotSet: func(ctx context.Context, req *peer.ReleaseHotSetRequest) *peer.ReleaseHotSetResponse {
		asked.Add(1)
		time.Sleep(150 * time.Millisecond)
		if id := held.Swap(0); id != 0 {
			srv.withState(func(st *State) error {
				_, err := st.BatchDeleteAck(b, []int64{id}, nil)
				return err
			})
		}
		return &peer.ReleaseHotSetResponse{Code: common.ErrorCode_OK}
	}}
	addr := startFakePeer(t, s, owner)
	a := NodeRef{ID: "a", Generation: 1}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	put := func(ref NodeRef, key string) {
		t.Helper()
		must(srv.withState(func(st *State) error {
			plan, err := st.PutStart(time.Now(), ref, key, 1024, false, nil)
			if err != nil {
				return err
			}
			_, err = st.PutDone(time.Now(), ref, key, plan.PutID)
			return err
		}))
	}
	// a holds k1 and k2; b's pool (2 KiB, no transfer area) is full of q1 and q2.
	must(srv.withState(func(st *State) error {
		if err := st.Register(time.Now(), a, 4096, 0, 0, "", "", SSDInfo{}, nil); err != nil {
			return err
		}
		return st.Register(time.Now(), b, 2048, 0, 0, "", addr, SSDInfo{}, nil)
	}))
	put(a, "k1")
	put(a, "k2")
	put(b, "q1")
	put(b, "q2")
	get := func(key string, sole bool) {
		t.Helper()
		var plan GetPlan
		must(srv.withSpace(context.Background(), func(st *State) error {
			var err error
			plan, err = st.GetStart(time.Now(), b, key, nil)
			return err
		}))
		must(srv.withState(func(st *State) error {
			id, promoted, err := st.GetDone(b, key, plan.GetID)
			if promoted && sole {
				t.Errorf("get of %s promoted: the test needs its range to be a sole holding", key)
			}
			held.Store(id)
			return err
		}))
	}
	get("k1", true)  // b is full: the first get costs b a value (q1)
	get("k2", false) // k1's range is released by the client but not acked: no eviction
	var memory []string
	srv.Inspect(func(st *State) {
		for _, k := range []string{"k1", "k2", "q1", "q2"} {
			if r := st.routes[k]; r != nil && r.memoryReplica(st.nodes["b"]) != nil || r != nil && r.memoryReplica(st.nodes["a"]) != nil {
				memory = append(memory, k)
			}
		}
	})
	t.Logf("asked %d times; values in memory: %v", asked.Load(), memory)
	if asked.Load() == 0 {
		t.Fatal("the second get never asked the owner for its hot set: the test did not reach the fault")
	}
	if len(memory) != 3 {
		t.Fatalf("values in memory after two gets through full b: %v; want k1, k2 and one of b's (the first get's room)", memory)
	}
}
