package daemon

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/rs/zerolog"
)

// TestLostGetStartReplyOfLocalSSDRefill: a GetStart planning a refill from the
// requester's own SSD records the get's holder at once (the owner hands the bytes out
// before its GetDone). The master chose that holder's id, so when the reply was lost
// the owner acked the id it had named (GetStartRequest.holder_id), which the master
// never used; the in-flight get then expired (InflightTTL), which keeps the holder, and
// the target range stayed held for good.
func TestLostGetStartReplyOfLocalSSDRefill(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	if lost.n.Load() > 0 {
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

// lostReport loses the replies of the next n ReportReplicas calls that carry records,
// after the master answered them.
type lostReport struct {
	masterservice.Client
	n atomic.Int32
}

func (l *lostReport) ReportReplicas(ctx context.Context, req *mp.ReportReplicasRequest, o ...callopt.Option) (*mp.ReportReplicasResponse, error) {
	resp, err := l.Client.ReportReplicas(ctx, req, o...)
	if err == nil && len(req.Records) > 0 && l.n.Add(-1) >= 0 {
		return nil, errReplyLost
	}
	return resp, err
}

// ssdReplicasAt is the count of SSD replicas m records on n1.
func ssdReplicasAt(m *master.Server) (n int64) {
	m.Inspect(func(st *master.State) {
		for _, ms := range st.Members() {
			if ms.NodeId == "n1" {
				n = ms.SsdReplicas
			}
		}
	})
	return n
}

// TestLostReportReplyLeavesNoPhantomRecord: an owner registering with a restarted
// master reports its replica index and SSD entries; whatever the master may not have
// adopted (a call that failed) is forgotten here. When the call had landed and only its
// reply was lost, the master adopted SSD records the owner then dropped: it routed
// gets to them and counted them for good (until each key was read, deleted or
// overwritten).
func TestLostReportReplyLeavesNoPhantomRecord(t *testing.T) {
	t.Parallel()
	so := ssdOptions(t, 64<<20)
	n := startNode(t, 4<<20, so, master.Options{InsecureCluster: true})
	for i := range 12 {
		if err := n.c.Put(fmt.Sprintf("lr-%d", i), value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	if len(n.o.store.Committed()) == 0 {
		t.Fatal("nothing reached SSD")
	}
	lost := &lostReport{Client: n.o.master.cl()}
	useMasterClient(n.o, lost)
	lost.n.Store(1)

	log := zerolog.Nop()
	m2 := restartMasterWith(t, n, master.Options{InsecureCluster: true, Logger: &log})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.o.master.register(ctx); err != nil {
		t.Fatal(err)
	}
	if lost.n.Load() > 0 {
		t.Fatal("no replica report was made")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		atMaster, inStore := ssdReplicasAt(m2), int64(len(n.o.store.Committed()))
		if atMaster == inStore {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the new master records %d SSD replica(s) of n1, its store holds %d: a report whose reply was lost", atMaster, inStore)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lateStart makes the next n GetStart calls fail at once on the owner's side (a call
// that timed out) while the master gets to them only after the owner acked the holder
// id they name: a stalled master serving a queued call late.
type lateStart struct {
	masterservice.Client
	o    *Owner
	n    atomic.Int32
	done chan struct{}
}

func (l *lateStart) GetStart(ctx context.Context, req *mp.GetStartRequest, o ...callopt.Option) (*mp.GetStartResponse, error) {
	if l.n.Add(-1) < 0 {
		return l.Client.GetStart(ctx, req, o...)
	}
	go func() {
		defer close(l.done)
		time.Sleep(100 * time.Millisecond) // the owner gave up and queued its ack
		l.o.acks.sync()
		l.Client.GetStart(context.Background(), req)
	}()
	return nil, errReplyLost
}

// TestLateGetStartAfterItsAck: a GetStart the owner gave up on (it timed out) may
// reach the master's state only after the owner's ack of the holder id it named (the
// call waited for the lock, or for room: withSpace retries up to AllocWait). The
// master then recorded a holder under an id already acked, which nothing acks again:
// the local replica stayed held for good.
func TestLateGetStartAfterItsAck(t *testing.T) {
	t.Parallel()
	log := zerolog.Nop()
	m, err := master.NewServer(master.Options{InsecureCluster: true, Logger: &log, InflightTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop() })
	o, c := ackOwner(t, m, func(o *Options) { o.CacheGrace = -1 })
	late := &lateStart{Client: m.LocalClient(), o: o, done: make(chan struct{})}
	useMasterClient(o, late)
	late.n.Store(1)
	if _, err := c.Get("k"); err == nil {
		t.Fatal("a get whose GetStart failed succeeded")
	}
	<-late.done
	if nodeHolders(t, m) == 0 {
		t.Fatal("the late GetStart recorded no holder")
	}
	waitNoHolders(t, o, m, "the holder a GetStart recorded after the owner had acked its id")
}

// lostDelete loses the replies of the next n Delete and BatchDelete calls after the
// master answered them.
type lostDelete struct {
	masterservice.Client
	n atomic.Int32
}

func (l *lostDelete) Delete(ctx context.Context, req *mp.DeleteRequest, o ...callopt.Option) (*mp.DeleteResponse, error) {
	resp, err := l.Client.Delete(ctx, req, o...)
	if err == nil && l.n.Add(-1) >= 0 {
		return nil, errReplyLost
	}
	return resp, err
}

func (l *lostDelete) BatchDelete(ctx context.Context, req *mp.BatchDeleteRequest, o ...callopt.Option) (*mp.BatchDeleteResponse, error) {
	resp, err := l.Client.BatchDelete(ctx, req, o...)
	if err == nil && l.n.Add(-1) >= 0 {
		return nil, errReplyLost
	}
	return resp, err
}

// TestLostDeleteReplyDropsTheHotSet: the master does not invalidate the requester of a
// delete (it drops its own records once answered). A delete that happened and whose
// reply was lost left the requester's hot-set holding of the key: gets through that
// owner went on serving the deleted value without the master (and Exists said true).
func TestLostDeleteReplyDropsTheHotSet(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m, nil)
	if err := c.Put("k2", value(2, 4096)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k", "k2"} { // into the hot set
		h, err := c.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	c.Flush()
	lost := &lostDelete{Client: m.LocalClient()}
	useMasterClient(o, lost)

	lost.n.Store(1)
	if _, err := c.Delete("k"); err == nil {
		t.Fatal("a delete whose reply was lost succeeded")
	}
	lost.n.Store(1)
	if _, err := c.BatchDelete([]string{"k2", "k3"}); err == nil {
		t.Fatal("a batch delete whose reply was lost succeeded")
	}
	for _, k := range []string{"k", "k2"} {
		if h, err := c.Get(k); err == nil {
			h.Release()
			t.Fatalf("%s: a key deleted at the master (the reply lost) is still served by the owner that deleted it", k)
		}
	}
}

// lostEvict loses the next n BatchSsdReplicaEvict requests before they reach the
// master (a broken connection).
type lostEvict struct {
	masterservice.Client
	n               atomic.Int32
	lastUnavailable bool // the last of the n refused calls is answered UNAVAILABLE
}

func (l *lostEvict) BatchSsdReplicaEvict(ctx context.Context, req *mp.BatchSsdReplicaEvictRequest, o ...callopt.Option) (*mp.BatchSsdReplicaEvictResponse, error) {
	switch v := l.n.Add(-1); {
	case v == 0 && l.lastUnavailable: // a master that does not take it for now
		return &mp.BatchSsdReplicaEvictResponse{Code: common.ErrorCode_UNAVAILABLE, Message: "rebuilding"}, nil
	case v >= 0:
		return nil, errReplyLost
	}
	return l.Client.BatchSsdReplicaEvict(ctx, req, o...)
}

// TestLostEvictionReportIsSentAgain: a report of SSD ring evictions that never reached
// the master left it counting (and routing gets to) records the ring had overwritten,
// and taking their versions for written back, until a read of each failed. A batch
// whose call failed in transport is sent again, with what the ring evicted meanwhile,
// until the master takes it (two sends lost and one answered UNAVAILABLE here: the
// first form gave up after three sends, and at once on an answer).
func TestLostEvictionReportIsSentAgain(t *testing.T) {
	t.Parallel()
	n := startNode(t, 4<<20, ssdOptions(t, 16<<20), master.Options{InsecureCluster: true})
	lost := &lostEvict{Client: n.o.master.cl(), lastUnavailable: true}
	useMasterClient(n.o, lost)
	lost.n.Store(3)
	for i := range 40 { // the 16 MiB ring wraps twice
		if err := n.c.Put(fmt.Sprintf("ev-%d", i), value(i, 1<<20)); err != nil {
			t.Fatal(err)
		}
		n.waitPersisted(t)
	}
	if lost.n.Load() == 3 {
		t.Fatal("no eviction report was sent")
	}
	proctest.WaitUntil(t, func() bool { return lost.n.Load() < 0 && ssdReplicasAt(n.m) == int64(len(n.o.store.Committed())) })
}
