package ssd

import (
	"math/bits"
	"sync"
)

// Aligned IO buffers are pooled by power-of-two size class (4 KiB .. 1 GiB) so that
// persists and scratch reads of large values do not churn the GC.
const (
	minBufShift = 12
	maxBufShift = 30
)

var bufPools [maxBufShift - minBufShift + 1]sync.Pool // of *[]byte, full class capacity

func bufClass(n int) int {
	if n <= 1<<minBufShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBufShift
}

// getBuf returns an aligned buffer of len n with unspecified contents. Return it with
// putBuf once no IO uses it any more.
func getBuf(n int) []byte {
	c := bufClass(n)
	if c >= len(bufPools) {
		return alignedAlloc(n)
	}
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		return (*p)[:n]
	}
	return alignedAlloc(1 << (c + minBufShift))[:n]
}

// bufCapacity is the capacity getBuf(n) allocates: its size class, or n past the
// largest class.
func bufCapacity(n int) int {
	c := bufClass(n)
	if c >= len(bufPools) {
		return n
	}
	return 1 << (c + minBufShift)
}

func putBuf(b []byte) {
	c := bufClass(cap(b))
	if c >= len(bufPools) || cap(b) != 1<<(c+minBufShift) {
		return
	}
	b = b[:cap(b)]
	bufPools[c].Put(&b)
}
