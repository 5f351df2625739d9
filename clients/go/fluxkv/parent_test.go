package fluxkv

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Puts with a parent against a live 8 MiB node: a parent the owner refuses fails the
// put (or its batch item) with ErrInvalidArgument, BatchPut refuses PutOptions.Parent,
// and chains of 64 KiB pages put with their parents, nearly twice what fits, are evicted
// from the deep end of the oldest chains: what survives of each chain is its prefix.
func TestPutParent(t *testing.T) {
	n := startNode(t, "8MiB")
	c := n.connect(t)
	fill := func(dst []byte) error { copy(dst, "page"); return nil }
	for _, tc := range []struct {
		name   string
		parent string
	}{{"own key", "k"}, {"too long", strings.Repeat("p", 5000)}} {
		if err := c.PutWith("k", 4, PutOptions{Parent: &tc.parent}, fill); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("parent %s: %v, want ErrInvalidArgument", tc.name, err)
		}
	}
	first := ""
	if errs, err := c.BatchPut([]PutItem{{Key: "a", Value: []byte("1")}}, PutOptions{Parent: &first}); !errors.Is(err, ErrInvalidArgument) || errs != nil {
		t.Errorf("BatchPut with PutOptions.Parent: errs %v, err %v; want ErrInvalidArgument", errs, err)
	}
	own := "b"
	errs, err := c.BatchPut([]PutItem{{Key: "a", Value: []byte("1"), Parent: &first}, {Key: "b", Value: []byte("2"), Parent: &own}}, PutOptions{})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], ErrInvalidArgument) {
		t.Fatalf("batch with a page and a page of its own parent: errs %v, err %v", errs, err)
	}
	if err := c.PutWith("after-a", 4, PutOptions{Parent: strPtr("a")}, fill); err != nil {
		t.Fatal(err)
	}

	const chains, length, page = 40, 6, 64 << 10
	keys := make([][]string, chains)
	for i := range keys {
		items := make([]PutItem, length)
		parent := ""
		for j := range items {
			k := fmt.Sprintf("chain/%d/%d", i, j)
			keys[i] = append(keys[i], k)
			items[j] = PutItem{Key: k, Value: make([]byte, page), Parent: strPtr(parent)}
			parent = k
		}
		errs, err := c.BatchPut(items, PutOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for j, e := range errs {
			if e != nil {
				t.Fatalf("put %s: %v", keys[i][j], e)
			}
		}
	}
	total, last := 0, 0
	for i, ks := range keys {
		present, err := c.BatchExists(ks)
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for _, p := range present {
			if p {
				count++
			}
		}
		lead, err := c.BatchExistsPrefix(ks, 0)
		if err != nil {
			t.Fatal(err)
		}
		if lead != count || count < last {
			t.Fatalf("chain %d: %d pages present, %d leading (the chain before it kept %d): %v", i, count, lead, last, present)
		}
		total, last = total+count, count
	}
	if total == chains*length {
		t.Fatal("nothing was evicted")
	}
}

func strPtr(s string) *string { return &s }
