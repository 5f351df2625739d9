package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// A persist batch larger than the owner's SSD ring is written and committed in groups
// within half the ring (persistpins.go): no item waits for ring space its own batch holds
// pinned until its commit. Before, the items past the ring's end waited BusyWait each and
// failed ("ring space busy"). The items name no published key, so the master publishes
// none of them and the owner forgets the entries: what is checked is every item's write.
func TestPersistBatchLargerThanRing(t *testing.T) {
	so := ssdOptions(t, 1<<20)
	so.ShardsPerDevice = 1
	so.BusyWait = 3 * time.Second
	n := startNode(t, 8<<20, so, master.Options{})
	if ring := n.o.store.RingBytes(); ring > 1<<20 {
		t.Fatalf("ring of %d bytes, want at most 1 MiB", ring)
	}
	const items, size = 24, 60000 // 1.4 MiB of values
	reqs := make([]*peer.SsdReplicaPersistRequest, items)
	for i := range reqs {
		reqs[i] = &peer.SsdReplicaPersistRequest{Key: fmt.Sprintf("unpublished-%d", i), PutId: int64(i + 1),
			Generation: n.o.generation, Offset: int64(i) * 64 << 10, Len: size}
	}
	errs, err := n.o.persistMany(reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("item %d: %v", i, err)
		}
	}
	if used := n.o.store.Stats().UsedBytes; used != 0 {
		t.Errorf("%d bytes of SSD used by entries the master never published", used)
	}
}
