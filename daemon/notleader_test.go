package daemon

import (
	"bytes"
	"context"
	"testing"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// lapsedWrites forwards deletes and PutDones to the master, then answers what the master
// did NOT_LEADER: an HA leader whose fence lapsed while the write waited for its
// synchronous invalidations (it applied the write).
type lapsedWrites struct{ masterservice.Client }

func (l *lapsedWrites) Delete(ctx context.Context, req *mp.DeleteRequest, o ...callopt.Option) (*mp.DeleteResponse, error) {
	resp, err := l.Client.Delete(ctx, req, o...)
	if err == nil {
		resp.Code = common.ErrorCode_NOT_LEADER
	}
	return resp, err
}

func (l *lapsedWrites) BatchDelete(ctx context.Context, req *mp.BatchDeleteRequest, o ...callopt.Option) (*mp.BatchDeleteResponse, error) {
	resp, err := l.Client.BatchDelete(ctx, req, o...)
	if err == nil {
		for _, r := range resp.Results {
			r.Code = common.ErrorCode_NOT_LEADER
		}
	}
	return resp, err
}

func (l *lapsedWrites) PutDone(ctx context.Context, req *mp.PutDoneRequest, o ...callopt.Option) (*mp.PutDoneResponse, error) {
	resp, err := l.Client.PutDone(ctx, req, o...)
	if err == nil {
		resp.Code = common.ErrorCode_NOT_LEADER
	}
	return resp, err
}

func (l *lapsedWrites) BatchPutDone(ctx context.Context, req *mp.BatchPutDoneRequest, o ...callopt.Option) (*mp.BatchPutDoneResponse, error) {
	resp, err := l.Client.BatchPutDone(ctx, req, o...)
	if err == nil {
		for _, r := range resp.Results {
			r.Code = common.ErrorCode_NOT_LEADER
		}
	}
	return resp, err
}

// TestNotLeaderWriteDropsTheHotSet: a delete or put the master applied and answered
// NOT_LEADER (an HA leader's fence lapsed before its answer: the outcome is unknown) drops
// the requester's hot-set holding of the key, as a write whose reply was lost does. The
// master invalidates every owner but the requester, so gets through it went on serving the
// deleted value, or the version the put replaced, without the master (a review).
func TestNotLeaderWriteDropsTheHotSet(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, c := ackOwner(t, m, nil) // k holds value(1, 4096)
	old := value(1, 4096)
	for _, k := range []string{"d2", "p", "p2"} {
		if err := c.Put(k, old); err != nil {
			t.Fatal(err)
		}
	}
	keys := []string{"k", "d2", "p", "p2"}
	for _, k := range keys { // into the hot set
		h, err := c.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	c.Flush()
	useMasterClient(o, &lapsedWrites{Client: m.LocalClient()})
	if _, err := c.Delete("k"); err == nil {
		t.Fatal("a delete answered NOT_LEADER succeeded")
	}
	if _, err := c.BatchDelete([]string{"d2", "d3"}); err == nil {
		t.Fatal("a batch delete answered NOT_LEADER succeeded")
	}
	for _, k := range []string{"k", "d2"} {
		if h, err := c.Get(k); err == nil {
			h.Release()
			t.Errorf("%s: deleted at the master (answered NOT_LEADER), still served by the owner that deleted it", k)
		}
	}
	fresh := value(2, 4096)
	if err := c.Put("p", fresh); err == nil {
		t.Fatal("a put answered NOT_LEADER succeeded")
	}
	if errs, err := c.BatchPut([]fluxkv.PutItem{{Key: "p2", Value: fresh}, {Key: "p3", Value: fresh}}, fluxkv.PutOptions{}); err == nil && errs[0] == nil {
		t.Fatal("a batch put answered NOT_LEADER succeeded")
	}
	for _, k := range []string{"p", "p2"} {
		h, err := c.Get(k)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if bytes.Equal(h.Bytes(), old) {
			t.Errorf("%s: the owner that put the new version (answered NOT_LEADER) still serves the one it replaced", k)
		}
		h.Release()
	}
}
