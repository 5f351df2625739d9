package daemon

import (
	"bytes"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/metrics"
)

// TestHeldPullNotServedAfterOverwrite: a value n2 pulled from n1 and did not become n2's
// replica (promotion off here; past 2 promotions per version alike) is in n2's hot set
// while client A holds it, but an overwrite through n1 invalidates n2 only in the
// background: no other get may be answered from that holding. After the overwrite
// returned, client B's get and A's next get through n2 read the new version, while A's
// holder keeps the old bytes. A prefix lookup's pin is still served to its own session
// from the pinned holding, with no second pull, and to no other session.
func TestHeldPullNotServedAfterOverwrite(t *testing.T) {
	t.Parallel()
	n := startNode(t, 64<<20, nil, master.Options{Placement: master.PlacementLocal, InsecureCluster: true, NoPromotion: true})
	om := metrics.New()
	o2, cA := n.addOwner(t, "n2", 64<<20, nil, func(o *Options) { o.Metrics = om; o.LandingReserve = 8 << 20 })
	cB, err := fluxkv.Connect(fluxkv.Options{Socket: o2.SocketPath(), Name: t.Name() + "-B"})
	if err != nil {
		t.Fatal(err)
	}
	defer cB.Close()
	get := func(c *fluxkv.Client, who, key string, want []byte) *fluxkv.MemHolder {
		t.Helper()
		h, err := c.Get(key)
		if err != nil {
			t.Fatalf("%s: get %s: %v", who, key, err)
		}
		if !bytes.Equal(h.Bytes(), want) {
			t.Fatalf("%s: get %s read another version (put %d, remote %v)", who, key, h.PutID(), h.Remote())
		}
		return h
	}
	// Put first: its (background) invalidation of n2 lands long before the lookup, whose
	// holding an invalidation seen meanwhile would keep out of the hot set.
	page := value(7, 64<<10)
	if err := n.c.Put("page", page); err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		old, next := value(round, 8192+round), value(1000+round, 8192+round)
		if err := n.c.Put("k", old); err != nil {
			t.Fatal(err)
		}
		hA := get(cA, "A", "k", old)
		if err := n.c.Put("k", next); err != nil {
			t.Fatal(err)
		}
		get(cB, "B after the overwrite", "k", next).Release()
		get(cA, "A after the overwrite", "k", next).Release()
		if !bytes.Equal(hA.Bytes(), old) {
			t.Fatal("A's holder of the old version lost its bytes")
		}
		hA.Release()
	}

	if found, err := cB.BatchExistsPrefix([]string{"page"}, 5*time.Second); err != nil || found != 1 {
		t.Fatalf("prefix lookup through n2: found %d, %v", found, err)
	}
	pulled := counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"})
	h := get(cB, "B, the pin's session", "page", page)
	if !h.Remote() {
		t.Errorf("the get of a page B's lookup pulled: Remote() = false, want the lookup's pull reported")
	}
	if got := counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"}) - pulled; got != 0 {
		t.Errorf("the get of a pinned page pulled %v bytes again, want it served from the pin", got)
	}
	// Another session is not served from B's pin: its get goes to the master and pulls.
	get(cA, "A, not the pin's session", "page", page).Release()
	if got := counter(t, om, "fluxkv_transfer_bytes_total", map[string]string{"dir": "pull"}) - pulled; got != float64(len(page)) {
		t.Errorf("A's get of the page B pinned pulled %v bytes, want %d", got, len(page))
	}
	h.Release()
}

// TestStatKeepHotSet: a status poll with keep_hot_set (`fluxkv status`) leaves the
// owner's hot set alone, so its next gets of cached keys stay local; a plain Stat lets
// the idle holdings go first, so holder counts are exact. Every Stat emptied the hot
// set, and a monitor polling status sent every cached key's next get to the master.
func TestStatKeepHotSet(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{})
	for _, k := range []string{"a", "b", "c"} {
		if err := n.c.Put(k, bytes.Repeat([]byte(k), 4096)); err != nil {
			t.Fatal(err)
		}
		h, err := n.c.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
	}
	if err := n.c.Flush(); err != nil {
		t.Fatal(err)
	}
	cached := func() int {
		st := n.o.lock()
		defer n.o.unlock()
		return st.hot.len()
	}
	if got := cached(); got != 3 {
		t.Fatalf("%d keys in the hot set after 3 gets, want 3", got)
	}
	st, err := n.c.StatWith(fluxkv.StatOptions{KeepHotSet: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := cached(); got != 3 {
		t.Errorf("%d keys in the hot set after a status poll with keep_hot_set, want 3", got)
	}
	if h := st.Members[0].Holders; h != 3 {
		t.Errorf("holders %d with the hot set kept, want its 3 holdings", h)
	}
	if st, err = n.c.Stat(); err != nil {
		t.Fatal(err)
	}
	if got, h := cached(), st.Members[0].Holders; got != 0 || h != 0 {
		t.Errorf("after a plain Stat: %d keys in the hot set, %d holders; want 0 and 0", got, h)
	}
}
