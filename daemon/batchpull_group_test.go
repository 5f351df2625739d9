package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// addrRecorder records each PullMany's address and item count, and fails every item.
type addrRecorder struct {
	pullClient
	mu    sync.Mutex
	calls []string
}

func (r *addrRecorder) PullMany(_ context.Context, addr string, items []transfer.PullItem) []error {
	r.mu.Lock()
	r.calls = append(r.calls, fmt.Sprintf("%s×%d", addr, len(items)))
	r.mu.Unlock()
	errs := make([]error, len(items))
	for i := range errs {
		errs[i] = errors.New("recorded, not pulled")
	}
	return errs
}

// TestBatchPullGroupsBySourceAddress: a batch's plans naming one source node at two
// registrations and addresses (it registered again elsewhere between the batch's
// planning calls) are pulled from each address apart (a review: all of them went to the
// first plan's address, and the new registration's values failed as unreachable).
func TestBatchPullGroupsBySourceAddress(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	rec := &addrRecorder{}
	o2, _ := n.addOwner(t, "n2", 16<<20, nil, func(o *Options) {
		o.testPuller = func(inner pullClient) pullClient { rec.pullClient = inner; return rec }
	})
	plan := func(i int, gen int64, addr string) startedGet {
		return startedGet{at: time.Now(), plan: &mp.GetStartResponse{Source: common.Source_MEMORY, SourceNodeId: "n1",
			SourceGeneration: gen, SourceDataAddr: addr, SourcePeerAddr: addr, GetId: int64(100 + i),
			TargetOffset: int64(i) * 4096, Len: 4096}}
	}
	starts := []startedGet{plan(0, 1, "old:1"), plan(1, 2, "new:1"), plan(2, 1, "old:1"), plan(3, 2, "new:1")}
	pre := o2.pullBatch([]string{"a", "b", "c", "d"}, starts, []int{0, 1, 2, 3})
	for j, p := range pre {
		if p == nil || p.err == nil {
			t.Fatalf("plan %d: %+v, want the recorder's failure", j, p)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	slices.Sort(rec.calls)
	if want := []string{"new:1×2", "old:1×2"}; !slices.Equal(rec.calls, want) {
		t.Fatalf("pulls %v, want %v", rec.calls, want)
	}
}
