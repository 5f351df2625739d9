package daemon

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"
	"github.com/cloudwego/kitex/pkg/endpoint"
	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// TestUnpublishedPutNotInReplicaIndex: a put through n2 whose PutDone comes after a
// later-started put of the key through n1 was published is not published by the master
// (its target goes back) though it answers OK. n2 must not record it in its replica
// index: the record would make n2 answer exists (and prefix lookups) of the key from
// a range the master freed, and a delete through n1 (which invalidates n2 only in the
// background, n2 holding no replica of the current version) would then still be seen
// as present through n2 after it returned.
func TestUnpublishedPutNotInReplicaIndex(t *testing.T) {
	t.Parallel()
	n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Placement: master.PlacementLocal})
	o2, c2 := n.addOwner(t, "n2", 32<<20, nil)
	for round := range 5 {
		key := "k" + string(rune('a'+round))
		err := c2.PutWith(key, 4096, fluxkv.PutOptions{}, func(dst []byte) error {
			copy(dst, value(round, 4096))
			// A later put of the key through n1 is published first.
			if err := n.c.Put(key, value(100+round, 4096)); err != nil {
				return err
			}
			// Let n1's put's (background) invalidation reach n2 before n2's PutDone.
			time.Sleep(50 * time.Millisecond)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		st := o2.lock()
		rec := st.replicas.lookup(key)
		o2.unlock()
		if rec != nil {
			t.Errorf("round %d: n2's replica index records %s@%d, a put the master did not publish", round, key, rec.putID)
		}
		if _, err := n.c.Delete(key); err != nil {
			t.Fatal(err)
		}
		if ok, err := c2.Exists(key); err != nil || ok {
			t.Errorf("round %d: exists %s through n2 after its delete returned: %v %v", round, key, ok, err)
		}
	}
}

// invalGate returns a peer-service option that holds InvalidateCachedInfo calls while
// closed is set.
func invalGate(closed *atomic.Bool, held *atomic.Int64) []server.Option {
	return []server.Option{server.WithMiddleware(func(next endpoint.Endpoint) endpoint.Endpoint {
		return func(ctx context.Context, req, resp any) error {
			if ri := rpcinfo.GetRPCInfo(ctx); ri != nil && ri.Invocation().MethodName() == "InvalidateCachedInfo" {
				for closed.Load() {
					held.Add(1)
					time.Sleep(time.Millisecond)
				}
			}
			return next(ctx, req, resp)
		}
	})}
}

// TestOverwriteWaitsForPendingInvalidation: n2 holds v1 of a key as a promoted replica
// in its hot set. A put v2 through n3 drops v1's route and invalidates n2 synchronously,
// but n2 is slow to confirm, so v2's put is still out. Meanwhile a put v3 (or a
// delete) through n1 drops v2's route, whose only replica is n3's: it must not return
// before n2 has dropped v1 either, or a get through n2 that begins after it returned
// reads v1, two versions back.
func TestOverwriteWaitsForPendingInvalidation(t *testing.T) {
	t.Parallel()
	for _, del := range []bool{false, true} {
		t.Run(map[bool]string{false: "put", true: "delete"}[del], func(t *testing.T) {
			n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Placement: master.PlacementLocal})
			var closed atomic.Bool
			var held atomic.Int64
			_, c2 := n.addOwner(t, "n2", 32<<20, nil, func(o *Options) { o.testPeerServerOpts = invalGate(&closed, &held) })
			_, c3 := n.addOwner(t, "n3", 32<<20, nil)
			const key = "k"
			if err := n.c.Put(key, value(1, 8192)); err != nil {
				t.Fatal(err)
			}
			h, err := c2.Get(key)
			if err != nil || !bytes.Equal(h.Bytes(), value(1, 8192)) || !h.Remote() {
				t.Fatalf("n2's first get: %v", err)
			}
			h.Release() // idle in n2's hot set: a promoted replica
			h, err = c2.Get(key)
			if err != nil || h.Remote() {
				t.Fatalf("n2's second get: %v (want it from its hot set)", err)
			}
			h.Release()

			closed.Store(true) // n2 is slow to confirm invalidations from now on
			v2 := make(chan error, 1)
			go func() { v2 <- c3.Put(key, value(2, 8192)) }()
			waitUntil(t, func() bool { return held.Load() > 0 }) // v2 published, n2's invalidation out
			what := map[bool]string{false: "overwrite v3", true: "delete"}[del]
			v3 := make(chan error, 1)
			go func() {
				if del {
					_, err := n.c.Delete(key)
					v3 <- err
				} else {
					v3 <- n.c.Put(key, value(3, 8192))
				}
			}()
			check := func() {
				t.Helper()
				// The overwrite (or delete) returned: no get may read v1 any more.
				h, err := c2.Get(key)
				switch {
				case err == nil && bytes.Equal(h.Bytes(), value(1, 8192)):
					t.Errorf("a get through n2 after the %s returned read v1 (put %d), two versions back", what, h.PutID())
				case err == nil && del:
					t.Errorf("a get through n2 after the delete returned read put %d", h.PutID())
				}
				if err == nil {
					h.Release()
				}
			}
			select {
			case err := <-v3:
				if err != nil {
					t.Fatal(err)
				}
				check() // it did not wait for n2
				closed.Store(false)
			case <-time.After(time.Second):
				closed.Store(false) // it waits for n2's confirmation: let it come
				if err := <-v3; err != nil {
					t.Fatal(err)
				}
				check()
			}
			if err := <-v2; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// heldAnswers is a master client whose PutDone and Delete answers wait, once the master
// has answered, while hold is set (answered counts those waiting).
type heldAnswers struct {
	masterservice.Client
	hold     atomic.Bool
	answered atomic.Int64
}

func (c *heldAnswers) wait() {
	if c.hold.Load() {
		c.answered.Add(1)
		for c.hold.Load() {
			time.Sleep(time.Millisecond)
		}
	}
}

func (c *heldAnswers) PutDone(ctx context.Context, req *mp.PutDoneRequest, opts ...callopt.Option) (*mp.PutDoneResponse, error) {
	resp, err := c.Client.PutDone(ctx, req, opts...)
	c.wait()
	return resp, err
}

func (c *heldAnswers) Delete(ctx context.Context, req *mp.DeleteRequest, opts ...callopt.Option) (*mp.DeleteResponse, error) {
	resp, err := c.Client.Delete(ctx, req, opts...)
	c.wait()
	return resp, err
}

// TestRequesterServesNoDeadVersionWhileItsWriteIsOut: n2 holds v1 of a key as a
// promoted replica in its hot set and writes the key (a put v2, or a delete). The
// master does not invalidate a write's requester, which drops its own records once
// answered; but before n2 has its answer, a concurrent write of the key through n1,
// ordered after n2's, returns: a put n1 began before n2's (its PutDone finds n2's
// published: it is answered as overwritten), or a delete (it finds no route). A get
// through n2 that begins after it returned must not read v1 from n2's hot set
// (rw_stress_test.go, TestReadYourWritesConcurrentWriters).
func TestRequesterServesNoDeadVersionWhileItsWriteIsOut(t *testing.T) {
	t.Parallel()
	for _, del := range []bool{false, true} {
		t.Run(map[bool]string{false: "put", true: "delete"}[del], func(t *testing.T) {
			n := startNode(t, 32<<20, nil, master.Options{InsecureCluster: true, Placement: master.PlacementLocal})
			mc := &heldAnswers{Client: n.m.LocalClient()}
			o2, c2 := n.addOwner(t, "n2", 32<<20, nil, func(o *Options) { o.LocalMaster = mc })
			r2, err := fluxkv.Connect(fluxkv.Options{Socket: o2.SocketPath(), Name: t.Name() + "-reader"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r2.Close() })
			const key = "k"
			if err := n.c.Put(key, value(1, 8192)); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				h, err := r2.Get(key)
				if err != nil || !bytes.Equal(h.Bytes(), value(1, 8192)) || h.Remote() != (i == 0) {
					t.Fatalf("n2's get %d: %v (want v1, the second from its hot set)", i, err)
				}
				h.Release() // idle in n2's hot set: a promoted replica
			}

			// n2's write: the master answers it, the answer waits.
			mc.hold.Store(true)
			write2 := make(chan error, 1)
			n2write := func() {
				if del {
					_, err := c2.Delete(key)
					write2 <- err
				} else {
					write2 <- c2.Put(key, value(2, 8192))
				}
			}
			answered := func() bool { return mc.answered.Load() > 0 }
			// n1's write, ordered after n2's, returns.
			var err1 error
			if del {
				go n2write()
				waitUntil(t, answered)
				_, err1 = n.c.Delete(key)
			} else {
				err1 = n.c.PutWith(key, 8192, fluxkv.PutOptions{}, func(dst []byte) error {
					copy(dst, value(3, 8192)) // its put id is below n2's put's
					go n2write()
					waitUntil(t, answered)
					return nil
				})
			}
			if err1 != nil {
				t.Fatal(err1)
			}
			h, err := r2.Get(key)
			switch {
			case err == nil && bytes.Equal(h.Bytes(), value(1, 8192)):
				t.Errorf("a get through n2 after n1's write returned read v1 (put %d) from n2's hot set", h.PutID())
			case err == nil && del:
				t.Errorf("a get through n2 after the delete returned read put %d", h.PutID())
			case err != nil && !(del && errors.Is(err, fluxkv.ErrKeyNotFound)):
				t.Errorf("a get through n2 after n1's write returned: %v", err)
			}
			if err == nil {
				h.Release()
			}
			ok, err := r2.Exists(key)
			if err != nil || ok == del {
				t.Errorf("exists through n2 after n1's write returned: %v %v", ok, err)
			}
			mc.hold.Store(false)
			if err := <-write2; err != nil {
				t.Fatal(err)
			}
		})
	}
}
