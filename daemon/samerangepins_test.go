package daemon

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
)

// TestSameRangeHoldingsSurviveTwoMasterRestarts: a holding held across a master
// restart stays pinned, and the hot set is emptied, so a get of the same key after the
// restart is a local hit at the new master that makes a second holding of the very
// same range (the new master shares the pin's range with the reported replica). A
// second restart then gets two pins of one range: the master keeps one and ignores
// the other ("pinned range overlaps another"), so once the kept holder is released
// (and the key deleted) the range is free while the other holder still reads it, and a
// later put overwrites its bytes.
func TestSameRangeHoldingsSurviveTwoMasterRestarts(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{InsecureCluster: true})
	const size = 64 << 10
	want := value(1, size)
	if err := n.c.Put("k", want); err != nil {
		t.Fatal(err)
	}
	h1, err := n.c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Release()
	addr := n.m.Addr().String()
	restart := func(prev *master.Server) *master.Server {
		prev.Stop()
		m, err := master.NewServer(master.Options{InsecureCluster: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Stop() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.o.master.register(ctx); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m2 := restart(n.m)
	h2, err := n.c.Get("k")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h2.Bytes(), want) {
		t.Fatal("h2: wrong bytes")
	}
	st := n.o.lock()
	holders := st.writes.count(writeHolder)
	n.o.unlock()
	if holders != 2 {
		t.Fatalf("%d holdings registered, want 2 (the test needs a second holding of the range)", holders)
	}
	m3 := restart(m2)
	_ = m3
	h2.Release()
	if _, err := n.c.Delete("k"); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if !bytes.Equal(h1.Bytes(), want) {
			t.Fatalf("the held value was overwritten after %d puts: its range was freed while held", i)
		}
		if err := n.c.Put(fmt.Sprintf("f%d", i), value(100+i, size)); err != nil {
			break // full
		}
	}
	if !bytes.Equal(h1.Bytes(), want) {
		t.Fatal("the held value was overwritten: its range was freed while held")
	}
}
