package daemon

import (
	"net"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// TestDialRefusesAnUnresolvedMaster: a master address whose host name does not resolve
// is an error at once; Kitex took it for a Unix socket path and every call of the client
// failed for its life, and the follow loop waited for the next leader record meanwhile
// (the owner stayed unregistered for as long as that leader led; a review).
func TestDialRefusesAnUnresolvedMaster(t *testing.T) {
	m := &masterLink{o: &Owner{opts: Options{MasterTimeout: time.Second, InsecureCluster: true}}}
	if err := m.dial("fluxkv-test-no-such-master.invalid:7700"); err == nil {
		t.Fatal("a client of a master whose name does not resolve was made")
	}
	if m.client.Load() != nil {
		t.Fatal("the unresolved master became the current one")
	}
	if err := m.dial("127.0.0.1:7700"); err != nil {
		t.Fatalf("a master at an IP address: %v", err)
	}
	m.client.Load().stop()
}

// TestLeaderChangeCutsCallsToTheDeposed: a call waiting on the current master (one cut
// off without a reset: it accepts and never answers) ends at once when etcd names a leader
// at another address. It waited out MasterTimeout, and the follow loop, inside a
// registration's report, turned to the new leader only about 30 s later (a review).
func TestLeaderChangeCutsCallsToTheDeposed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	authtest.Silent(t, ln) // a master that takes calls and never answers
	m := &masterLink{o: &Owner{opts: Options{MasterTimeout: time.Minute, InsecureCluster: true}}}
	if err := m.dial(ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	defer m.client.Load().stop()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := m.ctx()
		defer cancel()
		_, err := m.cl().Heartbeat(ctx, &mp.HeartbeatRequest{Node: &mp.NodeRef{NodeId: "n1", Generation: 1}})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the call to a master that never answers ended before the leader changed: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	m.cutDeposed(ln.Addr().String()) // the same leader: nothing is cut
	select {
	case err := <-done:
		t.Fatalf("a record of the current leader ended its call: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	m.cutDeposed("127.0.0.1:1") // another leader
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the cut call succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call to the deposed master still waits 10 s after the leader changed")
	}
}
