package daemon

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
)

// TestWriteAnsweredUnavailableDropsTheOldVersion: a put or delete the in-process master
// applied but answered UNAVAILABLE (the owner's call gave up within the master's write
// quiet period: "the write's outcome is unknown") may have happened; the master
// invalidates every owner but the requester, so the requester drops the older version it
// holds in its hot set. It served that dead version once the quiet ended (a review).
func TestWriteAnsweredUnavailableDropsTheOldVersion(t *testing.T) {
	t.Parallel()
	const quiet = 5 * time.Second // past the writes below, each ended after the owner's 0.5 s bound
	log := zerolog.Nop()
	m, err := master.NewServer(master.Options{InsecureCluster: true, Logger: &log, WriteQuiet: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Stop() })
	start := time.Now()
	_, c := startOwnerClient(t, Options{Dir: t.TempDir(), DRAM: 4 << 20, MasterAddr: m.Addr().String(), NodeID: "n1", Logger: &log,
		InsecureCluster: true, LocalMaster: m.LocalClient(), MasterTimeout: 300 * time.Millisecond, TransferTimeout: 200 * time.Millisecond}, t.Name())
	hold := func(key string, want []byte) { // a local hit: its replica enters the hot set
		t.Helper()
		h, err := c.Get(key)
		if err != nil || !bytes.Equal(h.Bytes(), want) {
			t.Fatalf("get %s: %v", key, err)
		}
		h.Release()
		c.Flush()
	}
	v1, v2 := value(1, 4096), value(2, 4096)
	for _, kv := range []struct {
		key string
		v   []byte
	}{{"put", v1}, {"put", v2}, {"del", v1}} {
		err := c.Put(kv.key, kv.v)
		if !errors.Is(err, fluxkv.ErrUnavailable) {
			t.Fatalf("put %s within the quiet: %v, want UNAVAILABLE (the test's premise)", kv.key, err)
		}
		if kv.v[0] == v1[0] {
			hold(kv.key, v1)
		}
	}
	if _, err := c.Delete("del"); !errors.Is(err, fluxkv.ErrUnavailable) {
		t.Fatalf("delete within the quiet: %v, want UNAVAILABLE", err)
	}
	time.Sleep(time.Until(start.Add(quiet + 300*time.Millisecond)))
	h, err := c.Get("put")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if !bytes.Equal(h.Bytes(), v2) {
		t.Errorf("get of the put's key after the quiet: put_id %d from %s, not the published v2", h.PutID(), h.Source())
	}
	if h, err := c.Get("del"); !errors.Is(err, fluxkv.ErrKeyNotFound) {
		if err == nil {
			h.Release()
		}
		t.Errorf("get of the deleted key after the quiet: %v, want not found", err)
	}
}
