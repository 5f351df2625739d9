package testbytes

import (
	"bytes"
	"testing"
)

func TestValue(t *testing.T) {
	for _, n := range []int{0, 1, chunk - 1, chunk, chunk + 1, 3<<20 + 5} {
		a, b := Value(7, n), Value(7, n)
		if len(a) != n || !bytes.Equal(a, b) {
			t.Fatalf("n=%d: %d bytes, equal %v: want n bytes, the same twice", n, len(a), bytes.Equal(a, b))
		}
	}
	// Another seed differs in every chunk; a longer value starts with the shorter.
	a, b := Value(1, 64*chunk), Value(2, 64*chunk)
	for off := 0; off < len(a); off += chunk {
		if bytes.Equal(a[off:off+chunk], b[off:off+chunk]) {
			t.Fatalf("seeds 1 and 2 share the chunk at %d", off)
		}
	}
	if !bytes.HasPrefix(Value(1, 64*chunk+9), a) {
		t.Fatal("a longer value of the same seed does not start with the shorter")
	}
	if bytes.Equal(a[:chunk], a[chunk:2*chunk]) {
		t.Fatal("a value repeats its first chunk")
	}
}
