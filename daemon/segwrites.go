package daemon

import (
	"sort"

	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// A master that this owner registers with (after a master restart, an HA failover)
// knows only the ranges of the segment reported to it as pins in RegisterRequest.Pinned:
// a range it was not told of may go to a new put while something still writes or reads
// it. segmentWrites is the one registry of those ranges — every range of the segment
// that is being written or is still held — and register reports all of it.
//
//	writeHolder  a holding externals reference (id: its master holder id); reads
//	writePut     a client's put from PutStart until its end (id: put id); the client writes
//	writeGet     a get's target being filled by a pull or refill (id: get id)
//	writePull    a PullPut target being pulled into (id: put id)
//
// Each entry reported is marked pinned: the new master holds the range as a holder of
// that id until the owner acks it, and whatever the entry stands for cannot complete
// with the master that began it (a pinned put fails, a pinned get fails, a pinned pull
// answers an error). It is a plain type inside ownerState.
type segmentWrites struct {
	m    map[writeKey]*segmentWrite
	dups uint64 // entries added under an id another entry of the kind has (writeKey.dup)
}

type writeKind uint8

const (
	writeHolder writeKind = iota
	writePut
	writeGet
	writePull
)

var writeKindNames = [...]string{writeHolder: "holder", writePut: "put", writeGet: "get", writePull: "pull"}

func (k writeKind) String() string { return writeKindNames[k] }

type writeKey struct {
	kind writeKind
	id   int64
	dup  uint64 // 0, or a second range under the same id (never expected: a master bug)
}

// segmentWrite is one registered range.
type segmentWrite struct {
	kind        writeKind
	id          int64
	offset, len int64
	// pinned: reported to a master registered with after the entry was added.
	pinned bool
	n      int      // add calls not yet matched by remove
	key    writeKey // its key in segmentWrites.m
}

// add registers [offset, offset+length) under (kind, id). Adding the same range again
// returns its entry (remove must then be called as often); another range under an id
// already registered gets an entry of its own, so that every range is reported.
func (w *segmentWrites) add(kind writeKind, id, offset, length int64) *segmentWrite {
	k := writeKey{kind: kind, id: id}
	if sw := w.m[k]; sw != nil {
		if sw.offset == offset && sw.len == length {
			sw.n++
			return sw
		}
		w.dups++
		k.dup = w.dups
	}
	if w.m == nil {
		w.m = make(map[writeKey]*segmentWrite)
	}
	sw := &segmentWrite{kind: kind, id: id, offset: offset, len: length, n: 1, key: k}
	w.m[k] = sw
	return sw
}

// remove ends one add of sw (nil: nothing); it reports whether sw is gone now.
func (w *segmentWrites) remove(sw *segmentWrite) bool {
	if sw == nil || w.m[sw.key] != sw {
		return false
	}
	if sw.n--; sw.n > 0 {
		return false
	}
	delete(w.m, sw.key)
	return true
}

// lookup returns the first entry added under (kind, id), or nil.
func (w *segmentWrites) lookup(kind writeKind, id int64) *segmentWrite {
	return w.m[writeKey{kind: kind, id: id}]
}

// count is the number of entries of kind.
func (w *segmentWrites) count(kind writeKind) int {
	n := 0
	for k := range w.m {
		if k.kind == kind {
			n++
		}
	}
	return n
}

// entries returns every entry ordered by id, then kind, then the order ranges were added.
func (w *segmentWrites) entries() []*segmentWrite {
	out := make([]*segmentWrite, 0, len(w.m))
	for _, sw := range w.m {
		out = append(out, sw)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].key, out[j].key
		if a.id != b.id {
			return a.id < b.id
		}
		if a.kind != b.kind {
			return a.kind < b.kind
		}
		return a.dup < b.dup
	})
	return out
}

// pinAll marks every entry pinned and returns them as pins (PinId = the entry's id).
func (w *segmentWrites) pinAll() []*mp.PinnedRange {
	es := w.entries()
	pins := make([]*mp.PinnedRange, 0, len(es))
	for _, sw := range es {
		sw.pinned = true
		pins = append(pins, &mp.PinnedRange{PinId: sw.id, Offset: sw.offset, Len: sw.len})
	}
	return pins
}
