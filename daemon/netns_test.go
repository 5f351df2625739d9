package daemon_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
)

// netns is a topology of network namespaces, one per owner, each with a veth pair on a
// bridge in the test's own namespace (where the master runs): owners are separate
// hosts with addresses of their own.
type netns struct {
	t      *testing.T
	bridge string
	prefix string   // the /24 as "10.A.B."
	names  []string // namespaces
	veths  []string // host ends of the veth pairs
}

// newNetns builds n namespaces, or skips the test with the reason when this process
// cannot (not root, no `ip netns`).
func newNetns(t *testing.T, n int) *netns {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("iproute2 (ip) not installed")
	}
	id := os.Getpid() % 40000
	ns := &netns{t: t, bridge: fmt.Sprintf("fkb%d", id), prefix: fmt.Sprintf("10.%d.%d.", 100+id/250%100, id%250)}
	t.Cleanup(ns.close)
	ns.ip("link", "add", ns.bridge, "type", "bridge")
	ns.ip("addr", "add", ns.prefix+"1/24", "dev", ns.bridge)
	ns.ip("link", "set", ns.bridge, "up")
	for i := 0; i < n; i++ {
		name, host, peer := fmt.Sprintf("fkv%d-%d", id, i), fmt.Sprintf("fkh%d-%d", id, i), fmt.Sprintf("fkp%d-%d", id, i)
		ns.ip("netns", "add", name)
		ns.names = append(ns.names, name)
		ns.ip("link", "add", host, "type", "veth", "peer", "name", peer)
		ns.veths = append(ns.veths, host)
		ns.ip("link", "set", peer, "netns", name)
		ns.ip("link", "set", host, "master", ns.bridge)
		ns.ip("link", "set", host, "up")
		ns.ip("-n", name, "addr", "add", ns.addr(i)+"/24", "dev", peer)
		ns.ip("-n", name, "link", "set", peer, "up")
		ns.ip("-n", name, "link", "set", "lo", "up")
	}
	return ns
}

// addr is the address of namespace i.
func (ns *netns) addr(i int) string { return fmt.Sprintf("%s%d", ns.prefix, i+2) }

func (ns *netns) ip(args ...string) {
	ns.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		ns.t.Skipf("ip %s: %v: %s (network namespaces unavailable here)", strings.Join(args, " "), err, out)
	}
}

func (ns *netns) close() {
	for _, name := range ns.names {
		exec.Command("ip", "netns", "del", name).Run()
	}
	exec.Command("ip", "link", "del", ns.bridge).Run()
}

// startOwnerIn runs an owner inside namespace i, listening on every address there and
// advertising what the route to the master says.
func (ns *netns) startOwnerIn(t *testing.T, i int, masterAddr, dram string) *proc {
	t.Helper()
	dir := filepath.Join(t.TempDir(), fmt.Sprintf("ns%d", i))
	p := startWrapped(t, []string{"ip", "netns", "exec", ns.names[i]}, append([]string{"owner", "--dir", dir, "--dram", dram,
		"--master", masterAddr, "--node-id", fmt.Sprintf("h%d", i), "--peer-listen", "0.0.0.0:0"}, ownerAuth()...)...)
	p.socket = filepath.Join(dir, "fluxkv.sock")
	p.waitSocket()
	return p
}

// TestNetnsCluster: three owners as separate hosts (network namespaces on a bridge),
// the master on the bridge's address. Owners register their own addresses (never a
// wildcard, never loopback); remote gets are byte-exact across hosts; with one host's
// link cut under load, gets through the others never return wrong bytes and resolve
// (hit, miss or UNAVAILABLE) promptly, and once the master tombed it a get finds a
// promoted copy or misses; the healed host registers again (a new registration
// generation: the master makes a fresh record for it, and it forgets its replicas) and
// serves again.
func TestNetnsCluster(t *testing.T) {
	t.Parallel()
	ns := newNetns(t, 3)
	m := startMaster(t, ns.prefix+"1:"+strings.Split(freePort(t), ":")[1])
	var owners []*proc
	var clients []*fluxkv.Client
	for i := 0; i < 3; i++ {
		owners = append(owners, ns.startOwnerIn(t, i, m.addr, "48MiB"))
		clients = append(clients, connect(t, owners[i].socket))
	}
	st, err := clients[0].Stat()
	if err != nil {
		t.Fatal(err)
	}
	for _, mem := range st.Members {
		var i int
		fmt.Sscanf(mem.NodeId, "h%d", &i)
		if !strings.HasPrefix(mem.DataAddr, ns.addr(i)+":") || !strings.HasPrefix(mem.PeerAddr, ns.addr(i)+":") {
			t.Errorf("member %s registered peer %q data %q, want %s:PORT", mem.NodeId, mem.PeerAddr, mem.DataAddr, ns.addr(i))
		}
	}

	sizes := []int{1, 65537, 1 << 20, 8<<20 + 3}
	for i, n := range sizes {
		if err := clients[0].Put(fmt.Sprintf("x-%d", i), clusterValue(i, n)); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []int{1, 2} {
		for i, n := range sizes {
			got, remote, err := getBytes(clients[r], fmt.Sprintf("x-%d", i))
			if err != nil || !remote || !bytes.Equal(got, clusterValue(i, n)) {
				t.Fatalf("get x-%d through h%d across hosts: remote=%v err=%v equal=%v", i, r, remote, err, bytes.Equal(got, clusterValue(i, n)))
			}
		}
	}

	// Keys only h0 holds; cut h0's link while h1 and h2 read them.
	const cut = 8
	for i := 0; i < cut; i++ {
		if err := clients[0].Put(fmt.Sprintf("cut-%d", i), clusterValue(100+i, 1<<20)); err != nil {
			t.Fatal(err)
		}
	}
	var (
		wg      sync.WaitGroup
		stop    atomic.Bool
		outs    outcomes
		mu      sync.Mutex // protects slowest
		slowest time.Duration
	)
	for _, r := range []int{1, 2} {
		wg.Add(1)
		go func(c *fluxkv.Client) {
			defer wg.Done()
			for j := 0; !stop.Load(); j++ {
				i := j % cut
				t0 := time.Now()
				got, _, err := getBytes(c, fmt.Sprintf("cut-%d", i))
				took := time.Since(t0)
				outs.add(got, err, clusterValue(100+i, 1<<20))
				mu.Lock()
				slowest = max(slowest, took)
				mu.Unlock()
			}
		}(clients[r])
	}
	time.Sleep(300 * time.Millisecond)
	ns.ip("link", "set", ns.veths[0], "down")
	time.Sleep(5 * time.Second) // past the master's 2s TTL
	stop.Store(true)
	wg.Wait()
	t.Logf("gets around the cut: %v, slowest %v", &outs, slowest)
	outs.check(t)
	// Generous: a pull that stalls fails after its 1s progress deadline, a dial after 1s.
	if slowest > 8*time.Second {
		t.Errorf("a get took %v around the cut", slowest)
	}
	// Gets before the cut promoted copies on h1/h2; what h0 alone held is gone.
	for i := 0; i < cut; i++ {
		got, _, err := getBytes(clients[1], fmt.Sprintf("cut-%d", i))
		if !(err == nil && bytes.Equal(got, clusterValue(100+i, 1<<20))) && !errors.Is(err, fluxkv.ErrKeyNotFound) {
			t.Fatalf("cut-%d after h0 was tombed: %v, want the value (a promoted copy) or KEY_NOT_FOUND", i, err)
		}
	}
	// Heal: the master answers h0's next call STALE_GENERATION; h0 registers again under
	// a new registration generation (a fresh record at the master; h0 drops its replica
	// index) and serves again; its clients' generation stays.
	ns.ip("link", "set", ns.veths[0], "up")
	waitFor(t, 20*time.Second, "h0 serves again after the link came back", func() bool {
		return clients[0].Put("healed", []byte("v")) == nil
	})
	if got, _, err := getBytes(clients[2], "healed"); err != nil || string(got) != "v" {
		t.Fatalf("get of a key put after the heal through h2: %q %v", got, err)
	}
}
