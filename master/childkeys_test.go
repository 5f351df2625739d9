package master

import (
	"slices"
	"testing"
)

// A parent's child set keeps each key once, inline or in its map, and is empty only when
// every key added was removed.
func TestChildKeys(t *testing.T) {
	members := func(c childKeys) []string {
		var out []string
		if c.one != "" {
			out = append(out, c.one)
		}
		for k := range c.more {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	var c childKeys
	for _, k := range []string{"a", "a", "b", "c", "b"} {
		c.add(k)
	}
	if got := members(c); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("members %v, want [a b c]", got)
	}
	if c.remove("a") {
		t.Fatal("empty after removing a of three")
	}
	c.add("b") // the inline slot is free, but b is in the map: not a second copy
	c.add("d")
	if got := members(c); !slices.Equal(got, []string{"b", "c", "d"}) {
		t.Fatalf("members %v, want [b c d]", got)
	}
	for i, k := range []string{"x", "b", "c"} {
		if c.remove(k) {
			t.Fatalf("empty after removing %q (step %d)", k, i)
		}
	}
	if !c.remove("d") {
		t.Fatalf("not empty after removing every key: %v", members(c))
	}
}
