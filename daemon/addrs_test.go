package daemon

import (
	"context"
	"net"
	"strings"
	"testing"
)

// TestAdvertise: a listener bound to an address advertises it; a wildcard one
// advertises --advertise-host, else this host's address towards the master; never a
// wildcard.
func TestAdvertise(t *testing.T) {
	for _, tc := range []struct {
		bound         string
		host, master  string
		want, wantErr string
	}{
		{"127.0.0.1:7701", "", "127.0.0.1:7700", "127.0.0.1:7701", ""},
		{"10.1.2.3:7701", "", "127.0.0.1:7700", "10.1.2.3:7701", ""},
		{"0.0.0.0:7701", "node-a.example", "127.0.0.1:7700", "node-a.example:7701", ""},
		{"0.0.0.0:7701", "", "127.0.0.1:7700", "127.0.0.1:7701", ""}, // the route to a loopback master
		{"[::]:7701", "", "127.0.0.1:7700", "127.0.0.1:7701", ""},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tc.bound)
		if err != nil {
			t.Fatal(err)
		}
		got, err := advertise(addr, tc.host, tc.master)
		if err != nil || got != tc.want {
			t.Errorf("advertise(%s, %q, %s) = %q, %v; want %q", tc.bound, tc.host, tc.master, got, err, tc.want)
		}
	}
}

// TestLoopbackRefusedInCluster: an owner whose master is not on loopback refuses to
// start with a loopback peer or data listener, or one advertised as loopback, naming
// the flag; with a loopback master (one host) loopback is fine.
func TestLoopbackRefusedInCluster(t *testing.T) {
	for _, tc := range []struct {
		flag, listen, advertised, master string
		refused                          bool
	}{
		{"--peer-listen", "127.0.0.1:0", "127.0.0.1:1234", "192.0.2.1:7700", true},
		{"--data-listen", "localhost:0", "127.0.0.1:1234", "192.0.2.1:7700", true},
		{"--data-listen", "0.0.0.0:0", "127.0.0.1:1234", "192.0.2.1:7700", true},
		{"--data-listen", "0.0.0.0:0", "192.0.2.9:1234", "192.0.2.1:7700", false},
		{"--peer-listen", "127.0.0.1:0", "127.0.0.1:1234", "127.0.0.1:7700", false},
	} {
		err := checkReachable(tc.flag, tc.listen, tc.advertised, tc.master)
		if tc.refused != (err != nil) || (err != nil && !strings.Contains(err.Error(), tc.flag)) {
			t.Errorf("checkReachable(%s %s → %s, master %s) = %v, refused want %v", tc.flag, tc.listen, tc.advertised, tc.master, err, tc.refused)
		}
	}
	// End to end: the owner's start fails before it contacts the (unreachable) master.
	o, err := New(Options{Dir: t.TempDir(), DRAM: 1 << 20, MasterAddr: "192.0.2.1:7700", NodeID: "n1",
		PeerListen: "127.0.0.1:0", InsecureCluster: true})
	if err != nil {
		t.Fatal(err)
	}
	err = o.Start(context.Background())
	if err == nil {
		o.Stop()
		t.Fatal("an owner with a loopback peer listener and a non-loopback master started")
	}
	if !strings.Contains(err.Error(), "--peer-listen") || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("start error %q does not name --peer-listen and loopback", err)
	}
}
