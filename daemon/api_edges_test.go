package daemon

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/cloudwego/kitex/client/callopt"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// batchCallsLost is the owner's master client with every BatchExists and BatchDelete
// lost on the way (the master never sees them).
type batchCallsLost struct {
	masterservice.Client
	lost atomic.Int64
}

func (b *batchCallsLost) BatchExists(ctx context.Context, req *mp.BatchExistsRequest, opts ...callopt.Option) (*mp.BatchExistsResponse, error) {
	b.lost.Add(1)
	return nil, errors.New("injected: connection reset before the master read the request")
}

func (b *batchCallsLost) BatchDelete(ctx context.Context, req *mp.BatchDeleteRequest, opts ...callopt.Option) (*mp.BatchDeleteResponse, error) {
	b.lost.Add(1)
	return nil, errors.New("injected: connection reset before the master read the request")
}

// TestClientBatchPerKeyErrors: a batch whose keys the owner could not evaluate (its
// master call failed: UNAVAILABLE, retry) is an error of the Go client's BatchExists and
// BatchDelete, as it is of Exists and Delete, never "absent" or "not deleted" with no
// error: a BatchDelete that deleted nothing must not look like one that found nothing
// to delete, and the keys are still there.
func TestClientBatchPerKeyErrors(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	keys := []string{"pk/0", "pk/1"}
	for i, k := range keys {
		if err := n.c.Put(k, value(i, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	lost := &batchCallsLost{}
	n.wrapMaster(func(c masterservice.Client) masterservice.Client { lost.Client = c; return lost })
	if ex, err := n.c.BatchExists([]string{"absent/0", "absent/1"}); !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Errorf("BatchExists with its master call lost = %v, %v; want ErrUnavailable", ex, err)
	}
	if del, err := n.c.BatchDelete(keys); !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Errorf("BatchDelete with its master call lost = %v, %v; want ErrUnavailable", del, err)
	}
	if lost.lost.Load() == 0 {
		t.Fatal("no master call was lost: the test tested nothing")
	}
	n.wrapMaster(func(masterservice.Client) masterservice.Client { return lost.Client })
	for _, k := range keys {
		if ok, err := n.c.Exists(k); err != nil || !ok {
			t.Errorf("exists %s after the failed delete: %v, %v", k, ok, err)
		}
	}
	n.drain(t, keys)
}
