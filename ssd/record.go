package ssd

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// On-disk record format. Every SSD entry is a record:
//
//	[header: headerSize(len(key)) bytes, a multiple of 512][value: AlignedLen(n) bytes, zero padded]
//
// A write run (PersistMany's, or one value) starts on a block of the file system
// (placementAlign: its block size, 4 KiB on ext4 and xfs), its records follow each
// other at 512-byte granules, and a zero pad (a keyless ring entry, dead once written)
// runs to the next block, so that the run's one write starts and ends on blocks: the
// file systems serialize unaligned direct writes per file, which held persists of
// 1 MiB values (1 MiB + 512-byte records) to 0.18-0.30× of fio. Padding each record to
// a block instead cost a 64 KiB KV page 4 KiB of its ring on 4 KiB blocks (6 %). A
// record's header names its ring position, so a scan can tell a record from stale
// bytes wherever it looks.
//
// The header (little endian) is
//
//	off  size
//	  0     4  magic "FXKV"
//	  4     2  format version (1)
//	  6     2  key length (1..MaxRecordKey)
//	  8     8  position: the entry's logical ring position (begin)
//	 16     8  put id
//	 24     8  value length n
//	 32     4  CRC32C (Castagnoli) of the n value bytes
//	 36     4  CRC32C of bytes [0,36) and the key
//	 40     k  key
//
// zero padded to a whole number of sectors.
//
// Why a header sector in front, read with READV. The owner reads a value straight
// into its memfd segment, into a 512-aligned range of exactly AlignedLen(n) bytes.
// A trailer fits in that read only when the value's last sector has room for it and
// the key (up to 4 KiB) is short, so it needs a second IO most of the time anyway, and
// a trailer cannot be found by a forward scan. A header sector in front keeps the
// value's read exactly as direct as before (same alignment, same length, same
// target), and lets a future recovery scan walk a shard from offset 0: each header
// names its size and the ring position it was written at, so stale records of an
// earlier lap are recognised. A load reads the header and the value's first chunk in
// one vectored IO (IORING_OP_READV, preadv for the psync engine): the header lands in
// a small buffer of the owner, the chunk in the caller's memory, and the device sees
// as many IOs as without verification. The alternative kept for measuring
// (Options.separateHeaderRead) submits the header read as an IO of its own together
// with the first chunk. `fluxkv bench ssd` runs the modes in alternating rounds over
// the same data; on the 2-core development VM (virtual disk, load ~10, 1 and 4 MiB
// values, both engines, 12 runs) the geometric mean of read GiB/s relative to
// unverified reads was 0.97 with READV and 0.82 with the separate header IO (READV
// ahead in 10 of 12 runs; single runs vary by ±30% there). CRC32C itself runs at
// ~20 GB/s on one core (BenchmarkCRC32C), about 50 µs per MiB: the floor any layout
// pays, a trailer included.
const (
	recordMagic   = "FXKV"
	recordVersion = 1
	// recordFixed is the header's fixed part before the key.
	recordFixed = 40
	// MaxRecordKey is the longest key a record holds (the wire limit, MAX_KEY_BYTES).
	MaxRecordKey = 4096
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// recordHeader is the decoded metadata of one record.
type recordHeader struct {
	pos      int64 // logical ring position of the record
	putID    int64
	length   int64 // value bytes
	valueCRC uint32
	key      string
}

// headerSize is the on-disk size of the header of a record whose key has keyLen
// bytes: the fixed part plus the key, rounded up to whole sectors.
func headerSize(keyLen int) int64 { return alignUp(int64(recordFixed + keyLen)) }

// encodeHeader writes h into dst[:headerSize(len(h.key))], padding zeroed. dst must be
// at least that long and the key 1..MaxRecordKey bytes (else it panics: callers
// check the key first).
func encodeHeader(dst []byte, h recordHeader) {
	if len(h.key) == 0 || len(h.key) > MaxRecordKey {
		panic(fmt.Sprintf("BUG: record key of %d bytes", len(h.key)))
	}
	n := headerSize(len(h.key))
	b := dst[:n]
	copy(b, recordMagic)
	binary.LittleEndian.PutUint16(b[4:], recordVersion)
	binary.LittleEndian.PutUint16(b[6:], uint16(len(h.key)))
	binary.LittleEndian.PutUint64(b[8:], uint64(h.pos))
	binary.LittleEndian.PutUint64(b[16:], uint64(h.putID))
	binary.LittleEndian.PutUint64(b[24:], uint64(h.length))
	binary.LittleEndian.PutUint32(b[32:], h.valueCRC)
	copy(b[recordFixed:], h.key)
	clear(b[recordFixed+len(h.key):])
	binary.LittleEndian.PutUint32(b[36:], headerCRC(b, len(h.key)))
}

// headerCRC is the metadata checksum: the fixed fields before it and the key.
func headerCRC(b []byte, keyLen int) uint32 {
	c := crc32.Update(0, castagnoli, b[:36])
	return crc32.Update(c, castagnoli, b[recordFixed:recordFixed+keyLen])
}

// decodeHeader parses and checks a header from b (which may hold more bytes after
// it): magic, version, key length, metadata checksum and a positive value length.
// It never panics, whatever b holds.
func decodeHeader(b []byte) (recordHeader, error) {
	if len(b) < recordFixed {
		return recordHeader{}, fmt.Errorf("record header: %d bytes, want at least %d", len(b), recordFixed)
	}
	if string(b[:4]) != recordMagic {
		return recordHeader{}, fmt.Errorf("record header: bad magic %q", b[:4])
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != recordVersion {
		return recordHeader{}, fmt.Errorf("record header: format version %d, want %d", v, recordVersion)
	}
	k := int(binary.LittleEndian.Uint16(b[6:]))
	if k == 0 || k > MaxRecordKey || recordFixed+k > len(b) {
		return recordHeader{}, fmt.Errorf("record header: key length %d out of range (%d header bytes)", k, len(b))
	}
	if want, got := binary.LittleEndian.Uint32(b[36:]), headerCRC(b, k); want != got {
		return recordHeader{}, fmt.Errorf("record header: metadata checksum %08x, computed %08x", want, got)
	}
	h := recordHeader{
		pos:      int64(binary.LittleEndian.Uint64(b[8:])),
		putID:    int64(binary.LittleEndian.Uint64(b[16:])),
		length:   int64(binary.LittleEndian.Uint64(b[24:])),
		valueCRC: binary.LittleEndian.Uint32(b[32:]),
		key:      string(b[recordFixed : recordFixed+k]),
	}
	if h.length <= 0 || h.pos < 0 {
		return recordHeader{}, fmt.Errorf("record header: value length %d, position %d", h.length, h.pos)
	}
	return h, nil
}
