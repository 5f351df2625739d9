package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// localRecords counts what owner o keeps of namespace ns's keys: hot-set holdings,
// replica records and committed SSD entries.
func localRecords(o *Owner, ns string) (hot, replicas, ssdEntries int) {
	in := func(k string) bool { n, ok := wire.KeyNamespace(k); return ok && n == ns }
	st := o.lock()
	for k := range st.hot.byKey {
		if in(k) {
			hot++
		}
	}
	for k := range st.replicas.byKey {
		if in(k) {
			replicas++
		}
	}
	o.unlock()
	if o.store != nil {
		for _, e := range o.store.Committed() {
			if in(e.Key) {
				ssdEntries++
			}
		}
	}
	return hot, replicas, ssdEntries
}

// TestDeleteNamespace: keys of namespaces A and B, of a namespace nested in A and plain
// keys, put through two owners, some read across (pulled and promoted, in hot sets), some
// on n1's SSD only, one held by a client. DeleteNamespace(A) through n1 is one
// NamespaceDelete master call (4,097 keys of another namespace are two): afterwards no
// get of an A key succeeds through either owner and neither keeps a record of one (hot
// set, replica index, SSD), every other key reads back byte-exact, NamespaceStat is right
// before and after, and the held A value keeps its bytes.
func TestDeleteNamespace(t *testing.T) {
	t.Parallel()
	mm := metrics.New()
	const dram = 4 << 20
	n := startNode(t, dram, ssdOptions(t, 64<<20), master.Options{Metrics: mm, Placement: master.PlacementLocal, InsecureCluster: true})
	o1, c1 := n.o, n.c
	o2, c2 := n.addOwner(t, "n2", 16<<20, nil)

	const nsA, nsB, nsNested = "kv1/m/tp0of2", "kv1/m/tp1of2", "kv1/m/tp0of2/x"
	want := map[string][]byte{}
	var keysA, others []string
	size := map[string]int64{}
	put := func(c *fluxkv.Client, k string, i int) {
		want[k] = value(i, 64<<10+i)
		size[k] = int64(len(want[k]))
		if err := c.Put(k, want[k]); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		if ns, _ := wire.KeyNamespace(k); ns == nsA {
			keysA = append(keysA, k)
		} else {
			others = append(others, k)
		}
	}
	// About twice n1's DRAM through n1: the first values stay on its SSD only.
	for i := range 120 {
		switch i % 4 {
		case 0, 1:
			put(c1, fmt.Sprintf("%s/%d", nsA, i), i)
		case 2:
			put(c1, fmt.Sprintf("%s/%d", nsB, i), i)
		default:
			put(c1, fmt.Sprintf("plain-%d", i), i)
		}
	}
	for i := 120; i < 150; i++ {
		switch i % 3 {
		case 0:
			put(c2, fmt.Sprintf("%s/%d", nsA, i), i)
		case 1:
			put(c2, fmt.Sprintf("%s/%d", nsNested, i), i)
		default:
			put(c2, fmt.Sprintf("%s/%d", nsB, i), i)
		}
	}
	n.waitPersisted(t)
	// Cross reads: n2 pulls n1's newest A values (and one from n1's SSD), n1 pulls n2's;
	// each owner keeps what it read in its hot set.
	read := func(c *fluxkv.Client, keys ...string) {
		t.Helper()
		hs, errs, err := c.BatchGet(keys)
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range keys {
			if errs[i] != nil || hs[i] == nil || !bytes.Equal(hs[i].Bytes(), want[k]) {
				t.Fatalf("read %s: %v", k, errs[i])
			}
			hs[i].Release()
		}
	}
	read(c2, append([]string{keysA[0]}, keysA[50:60]...)...)
	read(c1, keysA[60:]...)
	read(c1, keysA[59], keysA[1])
	held, err := c2.Get(keysA[55])
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	h1, r1, s1 := localRecords(o1, nsA)
	h2, r2, _ := localRecords(o2, nsA)
	_, _, s1B := localRecords(o1, nsB)
	t.Logf("before: n1 keeps %d hot, %d replicas, %d SSD entries of A; n2 %d hot, %d replicas", h1, r1, s1, h2, r2)
	if h1 == 0 || r1 == 0 || s1 == 0 || h2 == 0 || r2 == 0 || s1B == 0 {
		t.Fatalf("the setup left no local records to drop: n1 %d/%d/%d, n2 %d/%d, B on n1's SSD %d", h1, r1, s1, h2, r2, s1B)
	}

	stat := func(c *fluxkv.Client, ns string, keys int, bytes int64) {
		t.Helper()
		k, b, err := c.NamespaceStat(ns)
		if err != nil || k != int64(keys) || b != bytes {
			t.Errorf("NamespaceStat(%s) = %d keys, %d bytes, %v; want %d, %d", ns, k, b, err, keys, bytes)
		}
	}
	sum := func(ns string) (keys int, total int64) {
		for k, n := range size {
			if got, _ := wire.KeyNamespace(k); got == ns {
				keys, total = keys+1, total+n
			}
		}
		return keys, total
	}
	for _, ns := range []string{nsA, nsB, nsNested} {
		k, b := sum(ns)
		stat(c1, ns, k, b)
		stat(c2, ns, k, b)
	}

	calls := []string{"NamespaceDelete", "NamespaceStat", "Delete", "BatchDelete"}
	before := masterCalls(t, mm, calls...)
	deleted, err := c1.DeleteNamespace(nsA)
	if err != nil || deleted != int64(len(keysA)) {
		t.Fatalf("DeleteNamespace = %d, %v; want %d", deleted, err, len(keysA))
	}
	if got := callsSince(t, mm, before); got["NamespaceDelete"] != 1 || got["Delete"]+got["BatchDelete"] != 0 {
		t.Errorf("DeleteNamespace of %d keys: master calls %v, want one NamespaceDelete", len(keysA), got)
	}

	for _, o := range []*Owner{o1, o2} {
		if h, r, s := localRecords(o, nsA); h+r+s != 0 {
			t.Errorf("%s still keeps %d hot, %d replicas, %d SSD entries of the deleted namespace", o.opts.NodeID, h, r, s)
		}
	}

	for via, c := range map[string]*fluxkv.Client{"n1": c1, "n2": c2} {
		hs, errs, err := c.BatchGet(keysA)
		if err != nil {
			t.Fatal(err)
		}
		for i, k := range keysA {
			if hs[i] != nil || errs[i] != nil {
				t.Errorf("%s: get %s after its namespace was deleted: %v, %v", via, k, hs[i] != nil, errs[i])
			}
			if hs[i] != nil {
				hs[i].Release()
			}
		}
		if _, err := c.Get(keysA[len(keysA)-1]); !errors.Is(err, fluxkv.ErrKeyNotFound) {
			t.Errorf("%s: get after the delete: %v, want not found", via, err)
		}
		for part := range slices.Chunk(others, 8) { // a batch's holders fit n1's small pool
			read(c, part...)
		}
		stat(c, nsA, 0, 0)
		for _, ns := range []string{nsB, nsNested} {
			k, b := sum(ns)
			stat(c, ns, k, b)
		}
	}
	if _, _, s := localRecords(o1, nsB); s != s1B {
		t.Errorf("n1's SSD entries of B: %d, %d before the delete of A", s, s1B)
	}
	if !bytes.Equal(held.Bytes(), want[keysA[55]]) {
		t.Error("the holder of a deleted key lost its bytes")
	}

	// A namespace larger than one master batch: one NamespaceDelete per 4,096 keys.
	var items []fluxkv.PutItem
	for i := range wire.MaxBatch + 1 {
		items = append(items, fluxkv.PutItem{Key: fmt.Sprintf("big/%d", i), Value: []byte{byte(i)}})
	}
	if errs, err := c2.BatchPut(items, fluxkv.PutOptions{}); err != nil || errors.Join(errs...) != nil {
		t.Fatalf("batch put: %v %v", err, errors.Join(errs...))
	}
	stat(c1, "big", len(items), int64(len(items)))
	before = masterCalls(t, mm, calls...)
	if deleted, err := c1.DeleteNamespace("big"); err != nil || deleted != int64(len(items)) {
		t.Fatalf("DeleteNamespace(big) = %d, %v; want %d", deleted, err, len(items))
	}
	if got := callsSince(t, mm, before); got["NamespaceDelete"] != 2 {
		t.Errorf("DeleteNamespace of %d keys: master calls %v, want two NamespaceDelete", len(items), got)
	}
	stat(c2, "big", 0, 0)

	// The owner checks the namespace itself (raw calls skip the client's checks).
	sess := &external.Session{ClientId: c1.ClientID(), SessionToken: c1.SessionToken(), OwnerGeneration: c1.Generation()}
	for _, bad := range []string{"", strings.Repeat("n", wire.MaxKeyBytes+1)} {
		req := &external.NamespaceRequest{Session: sess, Name: bad}
		del, st := &external.ExternalServiceDeleteNamespaceResult{}, &external.ExternalServiceNamespaceStatResult{}
		if err := c1.Call("DeleteNamespace", &external.ExternalServiceDeleteNamespaceArgs{Req: req}, del); err != nil || del.Success.Code != common.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("DeleteNamespace(%.10q): %v %v, want INVALID_ARGUMENT", bad, err, del.Success)
		}
		if err := c1.Call("NamespaceStat", &external.ExternalServiceNamespaceStatArgs{Req: req}, st); err != nil || st.Success.Code != common.ErrorCode_INVALID_ARGUMENT {
			t.Errorf("NamespaceStat(%.10q): %v %v, want INVALID_ARGUMENT", bad, err, st.Success)
		}
		if _, err := c1.DeleteNamespace(bad); !errors.Is(err, fluxkv.ErrInvalidArgument) {
			t.Errorf("client DeleteNamespace(%.10q): %v, want invalid argument", bad, err)
		}
	}
}
