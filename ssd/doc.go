// Package ssd is the owner's local SSD cache for values (the seed's KvSsdStorage):
// after a put is published in memory, the master may ask the owner to persist the
// value here, and a later get that finds no memory replica refills a segment from it.
//
// Layout. Every path of large_file_paths yields a cache root
// <path>/<cluster>_cluster_kv_ssd_storage/<instance>/; roots on the same device
// (st_dev) are de-duplicated, first wins, so the scheduler never mistakes two
// directories of one disk for two IO paths. Each device splits its large_limit_size
// over a few fixed shard files, opened with O_DIRECT and truncated at start: the SSD
// is a runtime cache, nothing is recovered after a restart.
//
// Space. Each shard is a ring (ring.go): the head hands out contiguous ranges (a write
// run's records at 512-byte granules, then a pad entry to the next file system block,
// 4 KiB on ext4 and xfs: every write starts and ends on one, as an unaligned direct
// write is serialized by the file system, see placementAlign) and wraps to offset 0, the
// tail overwrites the oldest entries and reports the committed ones as evictions
// (batched for the master). Writes stay sequential
// and no extent allocator or compaction is needed. The ring never overwrites an
// entry that is being written, read (read pin) or committed to the master (commit
// pin): the writer waits instead. An entry becomes readable (Committed) only after
// all of its aligned bytes were written, and a read re-checks after its IO that the
// tail did not pass the range. The ring is a plain deterministic type; Storage
// guards it, the index and the entries' state with one mutex and never holds it
// across IO.
//
// Records. Every entry is a self-describing record (record.go): a header sector with
// magic, format version, key, put id, length, ring position and the CRC32C of the
// value (itself checksummed), then the value. Every load checks the header and the
// value's CRC; a mismatch is ErrCorrupt and the entry leaves the index. Used bytes
// count committed, indexed records only, and Forget drops a deleted or overwritten
// key's entry at once. Shard files are fully reserved (fallocate) at start: a limit
// the disk cannot hold is a start-up error.
//
// IO. One engine per device executes single-buffer reads and writes (and the
// two-buffer read of a record header with a value's first chunk): io_uring
// (engine_uring.go, a small binding on golang.org/x/sys/unix, one goroutine locked to
// its thread per ring) or, where io_uring cannot be set up, pread/pwrite from a pool
// of goroutines (engine_psync.go). Engines keep at most io_depth IOs in flight and
// favour reads (read_weight = 2: a read goes first while read_inflight <=
// 2*write_inflight) without ever idling a slot, because refill reads sit on a get's
// synchronous path while persists are background work. Values are padded to 512
// bytes for O_DIRECT and write runs to the file system's block; padding is zero, stays
// in the owner and never reaches a caller. Loads read straight into the caller's memory when it is aligned (else
// through a scratch buffer) in 4 MiB chunks, at most 4 in flight, handing each chunk
// over in order so a remote push can overlap the disk.
package ssd
