package ssd

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"
)

func TestRecordHeaderRoundTrip(t *testing.T) {
	for _, h := range []recordHeader{
		{pos: 0, putID: 1, length: 1, valueCRC: 0, key: "k"},
		{pos: 1 << 40, putID: 1<<62 + 3, length: 16 << 20, valueCRC: 0xdeadbeef, key: strings.Repeat("x", MaxRecordKey)},
		{pos: 512, putID: 7, length: 513, valueCRC: 1, key: strings.Repeat("k", 512-recordFixed)},
		{pos: 1024, putID: 8, length: 4 << 20, valueCRC: 2, key: strings.Repeat("k", 512-recordFixed+1)},
	} {
		n := headerSize(len(h.key))
		if n%Align != 0 || n < int64(recordFixed+len(h.key)) || n-int64(recordFixed+len(h.key)) >= Align {
			t.Fatalf("header size %d for a %d-byte key", n, len(h.key))
		}
		b := bytes.Repeat([]byte{0xee}, int(n)+100)
		encodeHeader(b, h)
		if !bytes.Equal(b[recordFixed+len(h.key):n], make([]byte, int(n)-recordFixed-len(h.key))) {
			t.Fatal("header padding not zeroed")
		}
		if b[n] != 0xee {
			t.Fatal("encode wrote past the header")
		}
		got, err := decodeHeader(b[:n])
		if err != nil || got != h {
			t.Fatalf("decode %+v: %+v, %v", h, got, err)
		}
		// Any single flipped bit of the fixed part or the key is caught.
		for i := 0; i < recordFixed+len(h.key); i += 1 + i/8 {
			b[i] ^= 0x10
			if got, err := decodeHeader(b[:n]); err == nil {
				t.Fatalf("byte %d flipped: decoded %+v", i, got)
			}
			b[i] ^= 0x10
		}
	}
	if headerSize(MaxRecordKey) != 4608 {
		t.Fatalf("largest header %d", headerSize(MaxRecordKey))
	}
}

// FuzzRecordHeader: decoding arbitrary bytes never panics, a decoded header
// re-encodes to the same metadata, and encode → decode round-trips.
func FuzzRecordHeader(f *testing.F) {
	seed := make([]byte, 512)
	encodeHeader(seed, recordHeader{pos: 4096, putID: 3, length: 100, valueCRC: 9, key: "seed"})
	f.Add(seed, int64(0), int64(1), int64(1), uint32(0), "k")
	f.Add(make([]byte, 40), int64(1<<40), int64(-1), int64(1<<20), uint32(7), strings.Repeat("z", 600))
	f.Add([]byte("FXKV\x01\x00\xff\xff"), int64(5), int64(5), int64(5), uint32(5), "")
	f.Fuzz(func(t *testing.T, raw []byte, pos, putID, length int64, crc uint32, key string) {
		if h, err := decodeHeader(raw); err == nil {
			out := make([]byte, headerSize(len(h.key)))
			encodeHeader(out, h)
			k := recordFixed + len(h.key)
			if !bytes.Equal(out[:k], raw[:k]) {
				t.Fatalf("decoded %+v re-encodes differently", h)
			}
		}
		if len(key) == 0 || len(key) > MaxRecordKey || pos < 0 || length <= 0 {
			return
		}
		h := recordHeader{pos: pos, putID: putID, length: length, valueCRC: crc, key: key}
		b := make([]byte, headerSize(len(key)))
		encodeHeader(b, h)
		got, err := decodeHeader(b)
		if err != nil || got != h {
			t.Fatalf("round trip %+v: %+v, %v", h, got, err)
		}
		if binary.LittleEndian.Uint16(b[4:]) != recordVersion {
			t.Fatal("version field")
		}
	})
}

// BenchmarkCRC32C is the CPU cost of verifying a value (per byte, one core): the
// part of verification a trailer layout would pay too.
func BenchmarkCRC32C(b *testing.B) {
	buf := pattern("crc", 4<<20)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		crc32.Update(0, castagnoli, buf)
	}
}
