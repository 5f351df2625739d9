package daemon_test

import (
	"bytes"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestTricklingSourceLeftForAnotherReplica: a source owner that sends a value's bytes
// slowly but steadily (its data plane never stalls, so the progress timeout never
// fires) holds a get only as long as the value's pull deadline (5 s plus its bytes at
// 32 MiB/s); the get is then planned again from the other replica. The whole
// TransferTimeout, the clients' own default call timeout, was spent on it before (a
// review: 30 s for 256 KiB; here the get took the trickle's 16 s). The failed pull is
// reported (GetRevoke source_failed), and the next get, through another owner, goes to
// another replica first.
func TestTricklingSourceLeftForAnotherReplica(t *testing.T) {
	t.Parallel()
	m := startMaster(t, "")
	own := func(id string, extra ...string) *proc {
		dir := filepath.Join(t.TempDir(), id)
		o := start(t, append([]string{"owner", "--dir", dir, "--dram", "64MiB", "--master", m.addr, "--node-id", id,
			"--cache-grace", "0"}, append(ownerAuth(), extra...)...)...)
		o.socket = filepath.Join(dir, "fluxkv.sock")
		o.waitSocket()
		return o
	}
	// a (the first source by id) advertises 127.0.0.2, where its data plane's proxy is.
	dataPort := freePort(t)
	_, dp, _ := net.SplitHostPort(dataPort)
	proxy := startProxy(t, "127.0.0.2:"+dp, dataPort)
	bMetrics := freePort(t)
	a := own("a", "--data-listen", dataPort, "--advertise-host", "127.0.0.2")
	b := own("b", "--metrics-addr", bMetrics)
	c, d := own("c"), own("d")
	ca, cb, cc, cd := connect(t, a.socket), connect(t, b.socket), connect(t, c.socket), connect(t, d.socket)
	const size = 64 << 10 // within the kernel's socket buffers: a's send ends at once, no deadline of a's cuts it
	val := clusterValue(7, size)
	if err := ca.Put("trickle", val); err != nil {
		t.Fatal(err)
	}
	h, err := cb.Get("trickle") // pulled from a, kept on b: the second replica
	if err != nil || !bytes.Equal(h.Bytes(), val) {
		t.Fatalf("get through b: %v", err)
	}
	h.Release()
	served := scrape(t, bMetrics, `fluxkv_transfer_bytes_total{dir="serve"}`)
	// 256 B every 62.5 ms: 64 KiB in 16 s, a byte always on its way.
	proxy.chunk.Store(256)
	proxy.rate.Store(4 << 10)
	began := time.Now()
	h, err = cc.Get("trickle")
	took := time.Since(began)
	if err != nil {
		t.Fatalf("get through c with a's bytes trickling: %v (after %v)", err, took)
	}
	defer h.Release()
	if !bytes.Equal(h.Bytes(), val) {
		t.Fatal("get through c: wrong bytes")
	}
	t.Logf("get through c took %v", took)
	// b counts the bytes once its writes returned, which may be after c has them.
	var now float64
	deadline := time.Now().Add(10 * time.Second)
	for now = scrape(t, bMetrics, `fluxkv_transfer_bytes_total{dir="serve"}`); now-served < size && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		now = scrape(t, bMetrics, `fluxkv_transfer_bytes_total{dir="serve"}`)
	}
	if now-served < size {
		t.Errorf("b served %v bytes for c's get; want the value (%d) from b, not the whole trickle from a", now-served, size)
	}
	// c's revoke told the master a's pull failed: d's get goes to another replica first,
	// not through a's trickle again (a wins ties by id).
	began = time.Now()
	h2, err := cd.Get("trickle")
	took = time.Since(began)
	if err != nil {
		t.Fatalf("get through d: %v", err)
	}
	defer h2.Release()
	if !bytes.Equal(h2.Bytes(), val) {
		t.Fatal("get through d: wrong bytes")
	}
	if took > 3*time.Second {
		t.Errorf("get through d took %v: planned from a, whose pull had just failed, again", took)
	}
}
