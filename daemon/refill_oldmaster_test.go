package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// earlierRefills makes a master answer SSD refills as one of an earlier release did:
// GetStart names no holder (HolderId 0) and GetDone records it under the get id. The
// master of this release records the refill's holder at GetStart; the client hides that
// id from the owner and takes the owner's acks of the get id as acks of it. With lose
// set, GetDone's reply is lost after the master applied it.
type earlierRefills struct {
	masterservice.Client
	mu      sync.Mutex
	holders map[int64]int64 // get id -> the holder the master recorded at GetStart
	lose    atomic.Bool     // the next GetDone's reply is lost
	lost    atomic.Int64
}

// planned counts the refills planned.
func (c *earlierRefills) planned() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.holders)
}

func (c *earlierRefills) acks(ids []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		if h, ok := c.holders[id]; ok {
			ids[i] = h
		}
	}
}

func (c *earlierRefills) GetStart(ctx context.Context, req *mp.GetStartRequest, opts ...callopt.Option) (*mp.GetStartResponse, error) {
	c.acks(req.Acks)
	resp, err := c.Client.GetStart(ctx, req, opts...)
	if err == nil && resp.Code == common.ErrorCode_OK && resp.Source == common.Source_SSD && resp.HolderId != 0 {
		c.mu.Lock()
		c.holders[resp.GetId] = resp.HolderId
		c.mu.Unlock()
		resp.HolderId = 0
	}
	return resp, err
}

func (c *earlierRefills) GetDone(ctx context.Context, req *mp.GetDoneRequest, opts ...callopt.Option) (*mp.GetDoneResponse, error) {
	resp, err := c.Client.GetDone(ctx, req, opts...)
	if c.lose.CompareAndSwap(true, false) {
		c.lost.Add(1)
		return nil, errors.New("connection reset by peer (the reply was lost)")
	}
	return resp, err
}

func (c *earlierRefills) BatchDeleteAck(ctx context.Context, req *mp.BatchDeleteAckRequest, opts ...callopt.Option) (*mp.BatchDeleteAckResponse, error) {
	c.acks(req.HolderIds)
	return c.Client.BatchDeleteAck(ctx, req, opts...)
}

// TestRefillLostGetDoneOfAnEarlierMaster: a refill from the owner's SSD, planned by a
// master that records its holder only at GetDone, whose GetDone reply is lost, fails
// (the get plans again) and the owner acks the holder that GetDone may have recorded
// (its id is the get id): the master holds none of the owner's once the client released
// its holder (a review: the lost one stayed until the owner's session ended).
func TestRefillLostGetDoneOfAnEarlierMaster(t *testing.T) {
	t.Parallel()
	log := zerolog.Nop()
	m, err := master.NewServer(master.Options{InsecureCluster: true, Logger: &log})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop() })
	mc := &earlierRefills{Client: m.LocalClient(), holders: map[int64]int64{}}
	opts := Options{Dir: t.TempDir(), DRAM: 4 << 20, MasterAddr: m.Addr().String(), NodeID: "n1", Logger: &log,
		InsecureCluster: true, LocalMaster: mc, SSD: ssdOptions(t, 32<<20), CacheGrace: -1, TransferReserve: -1}
	o, c := startOwnerClient(t, opts, t.Name())
	n := &node{m: m, o: o, c: c, opts: opts}
	want := value(1, 1<<20)
	if err := c.Put("k", want); err != nil {
		t.Fatal(err)
	}
	n.waitPersisted(t)
	for i := range 8 { // twice the DRAM: k is on SSD only
		if err := c.Put(fmt.Sprintf("filler-%d", i), value(10+i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	holders := func() int64 { return memberHolders(t, m, "n1") }
	// A refill whose GetDone is answered: the master's holder is the client's.
	h, err := c.Get("k")
	if err != nil || !bytes.Equal(h.Bytes(), want) || mc.planned() != 1 {
		t.Fatalf("refill of k: %v (refills planned: %d, want 1: the test's premise)", err, mc.planned())
	}
	h.Release()
	for i := range 8 { // k to SSD only again
		if err := c.Put(fmt.Sprintf("filler-%d", i), value(20+i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	n.waitPersisted(t)
	c.Flush()
	waitUntil(t, func() bool { return holders() == 0 })

	mc.lose.Store(true)
	// The refill fails UNAVAILABLE and the owner plans k again: the master promoted the
	// lost GetDone's target into a memory replica, which serves it.
	h, err = c.Get("k")
	if err != nil || !bytes.Equal(h.Bytes(), want) {
		t.Fatalf("get of k after a refill whose GetDone reply was lost: %v", err)
	}
	if mc.lost.Load() != 1 || mc.planned() != 2 {
		t.Fatalf("%d GetDone replies lost, %d refills planned; want 1 and 2 (the test's premise)", mc.lost.Load(), mc.planned())
	}
	h.Release()
	c.Flush()
	deadline := time.Now().Add(10 * time.Second)
	for h := holders(); h != 0; h = holders() {
		if time.Now().After(deadline) {
			t.Fatalf("the master keeps %d holder(s) of n1, whose client holds none (a refill's lost GetDone reply)", h)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
