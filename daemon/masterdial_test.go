package daemon

import (
	"testing"
	"time"
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
