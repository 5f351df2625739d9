package main

import "encoding/binary"

// Every value the soak writes is a pure function of (key, put_id, len), so any reader —
// Go or Python, any worker — can verify every byte of any holder from the holder's own
// put_id and length. The stream is counter-based splitmix64 (a PRNG whose state is the
// word index), chosen over math/rand/v2 and numpy's Generator because both languages
// must produce the same bytes and numpy computes it vectorized: worker.py implements the
// same three functions and value_test.go checks they agree byte for byte.

const golden = 0x9e3779b97f4a7c15

// mix is splitmix64's finalizer: a bijection that spreads every input bit.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// valueSeed hashes (key, put_id, len): FNV-1a of the key, then mixed with the others.
func valueSeed(key string, putID, n int64) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return mix(mix(h^uint64(putID)) ^ uint64(n))
}

// fillValue writes the value of (key, putID, len(dst)) into dst.
func fillValue(key string, putID int64, dst []byte) {
	seed := valueSeed(key, putID, int64(len(dst)))
	i := 0
	w := uint64(1)
	for ; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], mix(seed+w*golden))
		w++
	}
	if i < len(dst) {
		var last [8]byte
		binary.LittleEndian.PutUint64(last[:], mix(seed+w*golden))
		copy(dst[i:], last[:])
	}
}

// wrongBytes counts the bytes of got that differ from the value of (key, putID, len(got)).
func wrongBytes(key string, putID int64, got []byte) int64 {
	seed := valueSeed(key, putID, int64(len(got)))
	var bad int64
	i := 0
	w := uint64(1)
	for ; i+8 <= len(got); i += 8 {
		want := mix(seed + w*golden)
		if x := binary.LittleEndian.Uint64(got[i:]) ^ want; x != 0 {
			bad += int64(differingBytes(x))
		}
		w++
	}
	if i < len(got) {
		var last [8]byte
		binary.LittleEndian.PutUint64(last[:], mix(seed+w*golden))
		for j := i; j < len(got); j++ {
			if got[j] != last[j-i] {
				bad++
			}
		}
	}
	return bad
}

// differingBytes counts the non-zero bytes of x.
func differingBytes(x uint64) int {
	n := 0
	for ; x != 0; x >>= 8 {
		if x&0xff != 0 {
			n++
		}
	}
	return n
}
