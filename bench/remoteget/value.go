package main

import "encoding/binary"

// The value of a key is a pure function of the key and the length, so the harness
// (Python, numpy) puts it and this program verifies it: counter-based splitmix64 seeded
// with FNV-1a of the key, 8 little-endian bytes per word, the last word cut to the
// length. remote_get_bench.py's value() is the same function.

const golden = 0x9e3779b97f4a7c15

// mix is splitmix64's finalizer.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// fillValue writes the value of key of length len(dst) into dst.
func fillValue(key string, dst []byte) {
	seed := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		seed ^= uint64(key[i])
		seed *= 1099511628211
	}
	var last [8]byte
	for i, w := 0, uint64(1); i < len(dst); i, w = i+8, w+1 {
		v := mix(seed + w*golden)
		if i+8 <= len(dst) {
			binary.LittleEndian.PutUint64(dst[i:], v)
		} else {
			binary.LittleEndian.PutUint64(last[:], v)
			copy(dst[i:], last[:])
		}
	}
}
