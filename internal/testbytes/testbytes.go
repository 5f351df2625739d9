// Package testbytes makes the deterministic values tests put and check: n bytes for a
// seed, cheap to make many MiB of also in a -race build.
package testbytes

import (
	"math/rand"
	"sync"
)

// chunk is how many bytes of a test value come from one place of pool: odd,
// so chunk edges fall on no granule, page or block boundary.
const chunk = 4093

// pool is 1 MiB of random bytes that test values are cut from, built once.
var pool = sync.OnceValue(func() []byte {
	b := make([]byte, 1<<20)
	rand.New(rand.NewSource(1)).Read(b)
	return b
})

// Value returns n bytes for seed, the same for the same arguments, and different from
// another seed's at every chunk (with overwhelming odds): each chunk is copied from
// a place of pool that a hash of (seed, chunk) picks. Copies instead of a random
// generator per byte keep the -race build's per-byte cost out of tests that write many
// MiB (math/rand's Read: 35 ms per MiB under -race).
func Value(seed, n int) []byte {
	p := pool()
	b := make([]byte, n)
	for j, off := 0, 0; off < n; j, off = j+1, off+chunk {
		h := mix64(uint64(seed)*0x9e3779b97f4a7c15 + uint64(j))
		at := int(h % uint64(len(p)-chunk))
		copy(b[off:], p[at:at+chunk])
	}
	return b
}

// mix64 is SplitMix64's finalizer: a bijection of uint64 that scatters nearby inputs.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
