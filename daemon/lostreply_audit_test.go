package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// TestLostGetStartReplyOfLocalSSDRefill: a GetStart planning a refill from the
// requester's own SSD records the get's holder at once (the owner hands the bytes out
// before its GetDone). The master chose that holder's id, so when the reply was lost
// the owner acked the id it had named (GetStartRequest.holder_id), which the master
// never used; the in-flight get then expired (InflightTTL), which keeps the holder, and
// the target range stayed held for good.
func TestLostGetStartReplyOfLocalSSDRefill(t *testing.T) {
	so := ssdOptions(t, 64<<20)
	n := startNode(t, 4<<20, so, master.Options{InsecureCluster: true, InflightTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond})
	var keys []string
	for i := range 12 {
		k := fmt.Sprintf("ls-%d", i)
		keys = append(keys, k)
		if err := n.c.Put(k, value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	// ls-0 is out of memory by now: its get refills from this owner's SSD.
	waitNoHolders(t, n.o, n.m, "before the fault")
	lost := &lostStart{Client: n.o.master.cl()}
	useMasterClient(n.o, lost)
	lost.n.Store(1)
	if h, err := n.c.Get(keys[0]); err == nil {
		h.Release()
		t.Fatal("a get whose GetStart reply was lost succeeded")
	}
	time.Sleep(time.Second) // the in-flight get expires
	waitNoHolders(t, n.o, n.m, "the holder of a lost GetStart reply that planned a local SSD refill")
}

// lostCommit loses the replies of the next n BatchSsdReplicaCommit calls after the
// master answered them.
type lostCommit struct {
	masterservice.Client
	n atomic.Int32
}

func (l *lostCommit) BatchSsdReplicaCommit(ctx context.Context, req *mp.BatchSsdReplicaCommitRequest, o ...callopt.Option) (*mp.BatchSsdReplicaCommitResponse, error) {
	resp, err := l.Client.BatchSsdReplicaCommit(ctx, req, o...)
	if err == nil && l.n.Add(-1) >= 0 {
		return nil, errReplyLost
	}
	return resp, err
}

// TestLostSsdCommitReplyLeavesNoPhantomRecord: the master publishes an SSD replica at
// BatchSsdReplicaCommit; an owner whose commit failed in transport forgets the record
// (the master may not know it), and answers the persist failed. When the commit had
// landed and only its reply was lost, the master kept routing (and counting) an SSD
// replica the owner no longer has, and took the value for clean: once its memory copy
// left, the key was routed to a record nowhere. Every master SSD record of n1 must be
// one its store holds.
func TestLostSsdCommitReplyLeavesNoPhantomRecord(t *testing.T) {
	so := ssdOptions(t, 64<<20)
	n := startNode(t, 4<<20, so, master.Options{InsecureCluster: true})
	lost := &lostCommit{Client: n.o.master.cl()}
	useMasterClient(n.o, lost)
	lost.n.Store(1)
	for i := range 12 { // 3× DRAM: pages are written back to SSD as they are evicted
		if err := n.c.Put(fmt.Sprintf("lc-%d", i), value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	if lost.n.Load() >= 0 {
		t.Fatal("no SSD commit was made")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		atMaster, inStore := n.ssdReplicasOf(t, "n1"), int64(len(n.o.store.Committed()))
		if atMaster == inStore {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the master records %d SSD replica(s) of n1, its store holds %d: a commit whose reply was lost", atMaster, inStore)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
