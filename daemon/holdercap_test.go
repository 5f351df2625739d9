package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestHolderCapPerBatch: a session at most keeps maxHolders holders also when one batch
// (or several calls at once) brings in keys that missed the hot set together: each
// passed the cap's check before any had its holder. Past the cap a key answers
// NO_SPACE.
func TestHolderCapPerBatch(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true},
		func(o *Options) { o.CacheGrace = -1 }) // no hot set: every key is planned with the master
	var keys []string
	for i := range 16 {
		k := fmt.Sprintf("cap-%d", i)
		if err := n.c.Put(k, value(i, 10_000)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	st := n.o.lock()
	st.maxHolders = 2
	n.o.unlock()
	hs, errs, err := n.c.BatchGet(keys)
	if err != nil {
		t.Fatal(err)
	}
	got, refused := 0, 0
	for i, h := range hs {
		switch {
		case errs[i] == nil:
			got++
			defer h.Release()
		case wire.CodeOf(errs[i]) == common.ErrorCode_NO_SPACE:
			refused++
		default:
			t.Fatalf("%s: %v", keys[i], errs[i])
		}
	}
	st = n.o.lock()
	c := st.sessions[n.c.ClientID()]
	held := len(c.holders)
	n.o.unlock()
	if got > 2 || held > 2 || got+refused != len(keys) {
		t.Fatalf("%d holders handed out, %d refused, the session keeps %d: the cap is 2", got, refused, held)
	}
}

// TestHolderCapNotSharedByAFlight: a flight whose leader's session is at its holder cap
// does not answer that session's NO_SPACE to the gets of other sessions that follow it:
// they plan on their own.
func TestHolderCapNotSharedByAFlight(t *testing.T) {
	t.Parallel()
	n := startNode(t, 16<<20, nil, master.Options{InsecureCluster: true})
	other, err := fluxkv.Connect(fluxkv.Options{Socket: n.o.SocketPath(), Name: t.Name() + "-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := n.c.Put("held", value(1, 1000)); err != nil {
		t.Fatal(err)
	}
	h, err := n.c.Get("held")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	st := n.o.lock()
	a, b := st.sessions[n.c.ClientID()], st.sessions[other.ClientID()]
	st.maxHolders = len(a.holders) // a is at its cap, b holds nothing
	seq := st.hot.invalSeq()
	f, lead := st.joinFlight("k", seq)
	g, gLead := st.joinFlight("k", seq)
	if !lead || gLead || g != f {
		n.o.unlock()
		t.Fatal("b's get did not follow a's flight")
	}
	_, _, capErr := st.cachedGet(a, "k", time.Now(), nil)
	if wire.CodeOf(capErr) != common.ErrorCode_NO_SPACE {
		n.o.unlock()
		t.Fatalf("a's get at its cap: %v, want NO_SPACE", capErr)
	}
	st.endFlight("k", f, capErr) // as leadLanded ends it
	n.o.unlock()
	r, _, ok := n.o.follow(b, getLeg{key: "k", f: g, joined: time.Now().Add(-2 * roomWaitShared)})
	if ok {
		t.Fatalf("b's get took an answer (%v, %v) from a flight whose leader's session was at its cap; want it planned on its own", r.resp, r.err)
	}
}
