package ssd

import (
	"fmt"
	"hash/crc32"
	"time"
)

// PersistRunBytes bounds the bytes PersistMany writes with one IO: on a disk that
// takes 64 KiB writes at a fraction of its bandwidth, fifteen 64 KiB KV pages go as
// one write just under 1 MiB. Each record counts at its RecordSpan (header and value
// padded to the device's block: fifteen pages on blocks of up to 4 KiB, fourteen on
// 8 KiB ones), so a run fits one write however the ring packs it. Callers that
// persist runs concurrently split their items by it, counting the same way.
const PersistRunBytes = 1 << 20

// PersistItem is one value of PersistMany: src is copied, not retained.
type PersistItem struct {
	Key   string
	PutID int64
	Src   []byte
	// ReadBy, when set, is the last moment Src may be read: a caller whose source range
	// may be reused after it gets an error for an item not copied by then, unread.
	ReadBy time.Time
}

// PersistMany persists each item as Persist does, with fewer and larger writes: items
// whose RecordSpans add up to at most PersistRunBytes are filled into one buffer, and
// those the ring then places back to back on one shard file go to disk as one write.
// An item that cannot join a run (the ring wrapped, another writer allocated between,
// a newer version is stored) starts the next one, so the outcome of each item is its
// own. It returns each item's pin (to release once the commit to the master returned;
// valid where its error is nil) and error, as Persist.
func (s *Storage) PersistMany(items []PersistItem) ([]CommitPin, []error) {
	recs := make([]*record, len(items))
	call := new(persistCall) // the pins of its records are held until it returns
	for i, it := range items {
		recs[i] = &record{key: it.Key, putID: it.PutID, length: int64(len(it.Src)), fill: readBy(it.ReadBy, copyFrom(it.Src)), call: call}
	}
	for lo := 0; lo < len(recs); {
		hi, bytes := lo+1, s.RecordSpan(recs[lo].key, recs[lo].length)
		for hi < len(recs) {
			n := s.RecordSpan(recs[hi].key, recs[hi].length)
			if bytes+n > PersistRunBytes {
				break
			}
			bytes += n
			hi++
		}
		s.persistRecords(recs[lo:hi])
		lo = hi
	}
	pins, errs := make([]CommitPin, len(recs)), make([]error, len(recs))
	for i, r := range recs {
		pins[i], errs[i] = r.pin, r.err
	}
	return pins, errs
}

// readBy is fill, failing instead once by (zero: never) has passed.
func readBy(by time.Time, fill func(dst []byte) error) func(dst []byte) error {
	if by.IsZero() {
		return fill
	}
	return func(dst []byte) error {
		if late := time.Since(by); late > 0 {
			return fmt.Errorf("its source was not read by its deadline (%v late)", late)
		}
		return fill(dst)
	}
}

// copyFrom is the fill of a value held in memory.
func copyFrom(src []byte) func(dst []byte) error {
	return func(dst []byte) error {
		copy(dst, src)
		return nil
	}
}

// record is one value on its way to the ring: what a persist was asked, then its
// place in the run's buffer and on disk, then its outcome.
type record struct {
	key    string
	putID  int64
	length int64
	fill   func(dst []byte) error
	call   *persistCall // PersistMany's call, nil for a single persist

	hdr  int64  // header bytes
	size int64  // the record's span on its device: header, value, padding
	at   int64  // offset in the run's buffer
	e    *entry // its ring entry once reserved
	crc  uint32

	pin CommitPin
	err error
}

// persistRecords persists recs (one run: PersistMany's grouping, or one value) with as
// few writes as the ring allows, setting each record's pin or err. The run goes to the
// device picked for its first record; a record too large for that device's files
// goes on with the records after it to a device of their own.
func (s *Storage) persistRecords(recs []*record) {
	for len(recs) > 0 {
		recs = s.persistRun(recs)
	}
}

// persistRun persists a prefix of recs on one device and returns the records after it
// (from the first one too large for that device's files), not yet tried. Each record
// of the prefix is filled (and checksummed) before any writer's turn is taken, by the
// caller on its own goroutine: a slow fill (a pull) holds up no other persist.
func (s *Storage) persistRun(recs []*record) (rest []*record) {
	fail := func(rs []*record, err error) {
		for _, r := range rs {
			if r.err == nil {
				r.err = err
			}
		}
	}
	for _, r := range recs {
		if r.key == "" || r.length <= 0 || len(r.key) > MaxRecordKey {
			r.err = fmt.Errorf("ssd persist %.64q: key of %d bytes (1..%d), value of %d bytes: empty or too long", r.key, len(r.key), MaxRecordKey, r.length)
		}
	}
	if !s.enter() {
		fail(recs, ErrClosed)
		return nil
	}
	defer s.leave()
	// The records follow each other at 512-byte granules and a pad entry takes each
	// write to the next block of the device (reserveRun), so that it starts and ends
	// on file system blocks: an unaligned direct write is serialized by the file
	// system (see placementAlign).
	var d *device
	var total int64
	for i, r := range recs {
		if r.err != nil {
			continue
		}
		r.hdr = headerSize(len(r.key))
		rec := r.hdr + alignUp(r.length)
		if d == nil {
			var err error
			if d, err = s.pickDevice(rec); err != nil {
				r.err = fmt.Errorf("ssd persist %q put %d: %d aligned bytes: %w", r.key, r.putID, rec, err)
				d = nil
				continue
			}
		} else if d.span(rec) > d.shardSize {
			recs, rest = recs[:i], recs[i:]
			break
		}
		r.size = rec
		r.at = total
		total += r.size
	}
	if d == nil {
		return rest // every record of the prefix failed
	}
	// Room behind the last record for the pad to the next block (writeRun zeroes it),
	// from a larger buffer only where the size class of total has none to spare.
	room, size := total+d.align-Align, total
	if int64(bufCapacity(int(total))) < room {
		size = room
	}
	w, err := s.acquireBuffer(int(size))
	if err != nil {
		fail(recs, err)
		return rest
	}
	defer s.bufBudget.Release(w)
	buf := getBuf(int(size))[:room]
	defer putBuf(buf) // every write below completed (or never started) by then
	for _, r := range recs {
		if r.err != nil {
			continue
		}
		value := buf[r.at+r.hdr : r.at+r.hdr+r.length]
		if err := r.fill(value); err != nil {
			r.err = fmt.Errorf("ssd persist %q put %d: %w", r.key, r.putID, err)
			continue
		}
		clear(buf[r.at+r.hdr+r.length : r.at+r.size]) // the value's padding: zero, it stays in the owner
		r.crc = crc32.Checksum(value, castagnoli)
		r.err = s.checkNewer(r.key, r.putID)
	}
	select { // the device's writer queue
	case d.writeSlots <- struct{}{}:
	case <-s.closing:
		fail(recs, ErrClosed)
		return rest
	}
	defer func() { <-d.writeSlots }()
	for todo := recs; len(todo) > 0; {
		if todo[0].err != nil {
			todo = todo[1:]
			continue
		}
		n, pad := s.reserveRun(d, todo)
		if n == 0 {
			todo = todo[1:] // reserveRun set its err
			continue
		}
		s.writeRun(buf, todo[:n], pad)
		todo = todo[n:]
	}
	return rest
}

// reserveRun reserves ring entries for a prefix of recs (the first one waiting for space
// as reserve does; the others only while they fit right behind it on the same shard) and
// returns its length, and the pad: a keyless entry behind the prefix to the device's
// next block, so that the write ends on one (nil when it does already, or when the
// entry behind is busy, read or committed right now: that write then ends off a block,
// and the next one on the shard starts off one). All of it under one hold of s.mu from
// the first record's allocation, so no other writer's entry lands in between. n is 0
// with recs[0].err set when the first could not be reserved.
func (s *Storage) reserveRun(d *device, recs []*record) (n int, pad *entry) {
	first := recs[0]
	e, evs, err := s.reserve(d, first.call, first.key, first.putID, first.length, first.size)
	if err != nil {
		first.err = err
		return 0, nil
	}
	// s.mu held since the first record's allocation: no other writer's lands between.
	first.e = e
	n = 1
	ring := e.shard.ring
	prev := e
	for ; n < len(recs); n++ {
		r := recs[n]
		if r.err != nil || ring.head != prev.begin+prev.size || !ring.fitsBeforeEnd(r.size) || s.checkNewerLocked(r.key, r.putID) != nil {
			break
		}
		next, evicted, err := ring.alloc(r.key, r.putID, r.length, r.size)
		if err != nil {
			break // blocked by busy entries: it starts the next run, which waits
		}
		next.shard, next.call = e.shard, r.call
		evs = append(evs, s.evictedLocked(evicted, r.key, r.putID)...) // may include the key's previous version
		s.replaceLocked(r.key, r.putID, next)
		r.e, prev = next, next
	}
	if end := prev.begin + prev.size; ring.head == end && d.span(end) > end && ring.fitsBeforeEnd(d.span(end)-end) {
		gap := d.span(end) - end
		if p, evicted, err := ring.alloc("", 0, gap, gap); err == nil {
			p.shard = e.shard
			evs = append(evs, s.evictedLocked(evicted, "", 0)...) // a pad: no key
			pad = p
		}
	}
	s.mu.Unlock()
	s.report(evs)
	return n, pad
}

// writeRun writes the reserved, contiguous records recs (consecutive in buf too) and
// zeros for their pad entry (reserveRun; may be nil) with one write and commits each
// entry that is still the key's, pinned for its commit to the master; the others get an
// error. The pad's bytes in buf are those of the records after recs (or the zeros
// behind the last one): they are kept aside meanwhile.
func (s *Storage) writeRun(buf []byte, recs []*record, pad *entry) {
	first, last := recs[0], recs[len(recs)-1]
	for _, r := range recs {
		// The header names the ring position, known only now.
		encodeHeader(buf[r.at:], recordHeader{pos: r.e.begin, putID: r.putID, length: r.length, valueCRC: r.crc, key: r.key})
	}
	end := last.at + last.size
	var kept []byte
	if pad != nil {
		kept = append(kept, buf[end:end+pad.size]...)
		clear(buf[end : end+pad.size])
	}
	sh := first.e.shard
	werr := sh.write(buf[first.at:end+int64(len(kept))], sh.fileOffset(first.e))
	copy(buf[end:], kept)

	s.mu.Lock()
	defer s.mu.Unlock()
	if pad != nil {
		sh.ring.abort(pad) // dead at once: the tail passes it without a report
		s.signalLocked()
	}
	for _, r := range recs {
		e := r.e
		if werr != nil || e.removed {
			sh.ring.abort(e)
			if s.index[r.key] == e {
				delete(s.index, r.key)
			}
			s.signalLocked()
			if werr != nil {
				r.err = fmt.Errorf("ssd persist %q put %d: %w", r.key, r.putID, werr)
			} else {
				r.err = fmt.Errorf("ssd persist %q put %d: removed or superseded while writing: %w", r.key, r.putID, ErrStale)
			}
			continue
		}
		sh.ring.commit(e)
		sh.dev.used += e.size // committed and indexed
		sh.ring.pinCommit(e)
		r.pin = CommitPin{&commitPin{s: s, e: e}}
	}
}
