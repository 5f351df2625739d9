package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
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
