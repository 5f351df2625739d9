package ssd

import (
	"errors"
	"fmt"
)

// errBlocked is the ring's BlockedByBusyIo: making room would overwrite an entry that
// is being written, read or committed. The writer waits and retries.
var errBlocked = errors.New("ring space held by busy io")

// entryState is the life of a ring entry.
type entryState uint8

const (
	// stateWriting: the range is allocated, its bytes are not (all) on disk yet.
	stateWriting entryState = iota
	// stateCommitted: the full aligned length was written; the entry may be read.
	stateCommitted
	// stateDead: aborted, removed or superseded; the range waits for the tail.
	stateDead
)

func (s entryState) String() string {
	switch s {
	case stateWriting:
		return "writing"
	case stateCommitted:
		return "committed"
	case stateDead:
		return "dead"
	}
	return fmt.Sprintf("state(%d)", s)
}

// entry is one value's range in a ring. Positions are logical: they grow forever,
// and the file offset is begin mod ring size. An entry never straddles the end of
// the file.
type entry struct {
	key    string
	putID  int64
	seq    int64 // the Storage's number of this record: a rewrite of the version is another
	length int64 // real payload bytes
	size   int64 // aligned bytes on disk
	begin  int64 // logical position

	state      entryState
	readPins   int32
	commitPins int32
	evicted    bool // the tail passed it: its range may hold other bytes now
	// superseded: dropped from the index for a rewrite of its own version (a refresh);
	// its bytes are still the version's until the tail passes it (Storage.pinReading).
	// supersedes is that entry, on the rewrite, while the rewrite is being written: a
	// load then reads it (Storage.load).
	superseded bool
	supersedes *entry
	removed    bool // dropped from the index while writing; abort on completion

	shard *shard       // owner bookkeeping, unused by the ring
	call  *persistCall // the PersistMany call that wrote it (nil: a single persist)
}

// persistCall identifies one PersistMany call: it holds the commit pins of the
// entries it wrote until it returns, so a record of the same call that would have to
// overwrite one of them cannot get room before then.
type persistCall struct{ _ byte }

func (e *entry) busy() bool {
	return e.state == stateWriting || e.readPins > 0 || e.commitPins > 0
}

// ring allocates contiguous aligned ranges of one shard file in write order: head
// allocates, wrapping to offset 0 when the rest of the file is too short, and the
// tail advances over the oldest entries to make room, reporting the committed ones
// it overwrote. It never overtakes an entry that is writing or pinned.
//
// ring is a plain deterministic type, not safe for concurrent use; Storage guards
// all rings with its mutex.
type ring struct {
	size    int64
	head    int64    // logical position of the next allocation
	tail    int64    // logical position of the oldest byte that may be live
	entries []*entry // allocation order; entries[first:] are live
	first   int
	blocker *entry // the busy entry the last errBlocked of alloc stopped at
}

func newRing(size int64) *ring {
	if size <= 0 || size%Align != 0 {
		panic(fmt.Sprintf("BUG: ring size %d is not a positive multiple of %d", size, Align))
	}
	return &ring{size: size}
}

// used is the span between tail and head: live, dead and skipped bytes the ring
// cannot hand out without evicting.
func (r *ring) used() int64 { return r.head - r.tail }

// live returns the entries not yet passed by the tail, oldest first. The slice is
// the ring's own; callers must not keep it across calls that change the ring.
func (r *ring) live() []*entry { return r.entries[r.first:] }

// offset is the file offset of e.
func (r *ring) offset(e *entry) int64 { return e.begin % r.size }

// alloc reserves size bytes (a multiple of Align, at most the ring size) for a new
// Writing entry. To make room it evicts the oldest entries; the committed ones among
// them are returned so their keys can be reported. If making room would need to
// evict a busy entry, alloc changes nothing and returns errBlocked.
func (r *ring) alloc(key string, putID, length, size int64) (e *entry, evicted []*entry, err error) {
	if size <= 0 || size%Align != 0 || length <= 0 || length > size {
		panic(fmt.Sprintf("BUG: ring alloc length %d size %d", length, size))
	}
	if size > r.size {
		return nil, nil, ErrTooLarge
	}
	start := r.head
	if phys := start % r.size; phys+size > r.size {
		start += r.size - phys // skip the short rest of the file, wrap to offset 0
	}
	end := start + size

	// Dry run: how many of the oldest entries must go, and may they?
	tail, k := r.tail, r.first
	for end-tail > r.size {
		if k == len(r.entries) {
			tail = start // only the skipped gap was left
			break
		}
		if r.entries[k].busy() {
			r.blocker = r.entries[k]
			return nil, nil, errBlocked
		}
		k++
		if k < len(r.entries) {
			tail = r.entries[k].begin
		} else {
			tail = start
		}
	}
	for _, old := range r.entries[r.first:k] {
		old.evicted = true
		if old.state == stateCommitted {
			evicted = append(evicted, old)
		}
		old.state = stateDead
	}
	clear(r.entries[r.first:k])
	r.first = k
	r.tail = tail
	if r.first == len(r.entries) {
		r.entries, r.first = r.entries[:0], 0
		r.tail = start
	} else if r.first >= 64 && r.first*2 >= len(r.entries) {
		n := copy(r.entries, r.entries[r.first:])
		clear(r.entries[n:])
		r.entries, r.first = r.entries[:n], 0
	}

	e = &entry{key: key, putID: putID, length: length, size: size, begin: start, state: stateWriting}
	r.entries = append(r.entries, e)
	r.head = end
	return e, evicted, nil
}

// fitsBeforeEnd reports whether size bytes allocated now would start at head, right
// after the entry before it in the file: not wrapped to the start of the file, nor at
// offset 0 because the entry before it ended exactly at the file's end.
func (r *ring) fitsBeforeEnd(size int64) bool {
	phys := r.head % r.size
	return phys != 0 && phys+size <= r.size
}

// commit turns a Writing entry Committed: all of its aligned bytes are on disk.
func (r *ring) commit(e *entry) {
	if e.state != stateWriting || e.evicted {
		panic(fmt.Sprintf("BUG: commit of %s entry (evicted %v)", e.state, e.evicted))
	}
	e.state = stateCommitted
	e.supersedes = nil
}

// abort turns a Writing entry Dead: its write failed or it lost its key meanwhile.
func (r *ring) abort(e *entry) {
	if e.state != stateWriting {
		panic(fmt.Sprintf("BUG: abort of %s entry", e.state))
	}
	e.state = stateDead
	e.supersedes = nil
}

// kill turns a Committed entry Dead (removed or superseded): it is no longer
// reported when the tail passes it. Pins still protect its range.
func (r *ring) kill(e *entry) {
	if e.state == stateCommitted {
		e.state = stateDead
	}
}

// pinRead protects a Committed, not yet overtaken entry from the tail while it is
// read. It reports false when the entry cannot be read.
func (r *ring) pinRead(e *entry) bool {
	if e.state != stateCommitted || r.overtaken(e) {
		return false
	}
	e.readPins++
	return true
}

func (r *ring) unpinRead(e *entry) {
	if e.readPins <= 0 {
		panic("BUG: read unpin without pin")
	}
	e.readPins--
}

// pinCommit protects a Committed entry while the owner commits it to the master.
func (r *ring) pinCommit(e *entry) {
	if e.state != stateCommitted || r.overtaken(e) {
		panic(fmt.Sprintf("BUG: commit pin of %s entry (evicted %v)", e.state, e.evicted))
	}
	e.commitPins++
}

func (r *ring) unpinCommit(e *entry) {
	if e.commitPins <= 0 {
		panic("BUG: commit unpin without pin")
	}
	e.commitPins--
}

// overtaken reports whether the tail passed e, so its range may hold other bytes.
// It is the re-check a read does after its IO completed.
func (r *ring) overtaken(e *entry) bool { return e.evicted || e.begin < r.tail }
