package daemon

import (
	"github.com/google/btree"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/ssd"
)

// replicaRecord is one memory replica in this owner's pool: key@putID, len bytes at
// offset. It occupies [offset, offset+AlignedLen(len)), the master's range for it.
type replicaRecord struct {
	key    string
	putID  int64
	offset int64
	len    int64
	// page: a KV page this owner put under parent ("" for a chain's first page);
	// reported so a new master ranks it as a page again.
	page   bool
	parent string
	// notices: eviction notices up to this bound are older than the replica (learned
	// from a local hit or a promotion; zero: every notice of its version applies).
	notices noticeBound
	// seq: an SSD record's number on the ring (ssd.Entry.Seq), in a report.
	seq int64
}

func (r *replicaRecord) end() int64 { return r.offset + ssd.AlignedLen(r.len) }

// noticeBound is an eviction notice's number (HeartbeatResponse.evicted_seqs), or the
// last one the master had numbered when it answered that this owner holds a replica
// (GetStartResponse and GetDoneResponse notices_seq), counted from this owner's
// registration reg (registration.epoch: each registration's master numbers its own).
type noticeBound struct {
	reg uint64
	seq int64
}

// older reports whether notice n is older than a replica learned with bound b, so it
// does not apply to it: a notice of the version's earlier replica here, evicted before
// this one was placed, and applied only after the owner learned this one.
func (b noticeBound) older(n noticeBound) bool {
	return b.seq > 0 && b.reg == n.reg && n.seq <= b.seq
}

// indexNote is one recent change of the replica index: a drop (key set: versions of
// key up to upTo are dead; notice: the eviction notice that dropped them, zero for an
// invalidation) or an open (key empty: [offset, end) was handed out for a new value).
type indexNote struct {
	key         string
	upTo        int64
	notice      noticeBound
	offset, end int64
}

// indexNotes is how many recent notes the index keeps for learn: a master call during
// which more changes happened learns nothing (a missing record only costs a hot-set entry
// after a master restart; a stale one could serve a dead version). Twice a batch: the
// keys of one batch open their own targets during the batch's call.
const indexNotes = 2 * external.MAX_BATCH

// replicaIndex is the owner's record of which key version each range of its memory
// pool holds (README "Several owners": owners know their replicas). It learns a record
// from the master's answers — PutDone of a put placed here, a local GetStart hit, a
// promotion at GetDone — and forgets it at an invalidation (delete or overwrite), an
// eviction notice, or when the master hands out a range overlapping it for a new value
// (open, before any byte of it is written). After a master restart the owner reports
// it (ReportReplicas) and the new master rebuilds its routes from the reports.
//
// A record learned from an answer is kept only if no drop of its key (at or above its
// version) and no open overlapping its range happened since the call started (learn's
// since, from mark): the answer may predate them. Eviction notices name key@putID only,
// so one of the version's earlier replica here could drop the one learned since: a
// notice older than the record's bound neither drops it nor stops its learn. It is a
// plain type under Owner.mu.
type replicaIndex struct {
	byKey map[string]*replicaRecord
	byOff *btree.BTreeG[*replicaRecord]
	seq   uint64 // notes so far; notes[seq%indexNotes] is the latest
	notes [indexNotes]indexNote
}

func newReplicaIndex() *replicaIndex {
	return &replicaIndex{
		byKey: make(map[string]*replicaRecord),
		byOff: btree.NewG(32, func(a, b *replicaRecord) bool { return a.offset < b.offset }),
	}
}

// mark is the position to pass to learn for an answer to a call starting now.
func (x *replicaIndex) mark() uint64 { return x.seq }

func (x *replicaIndex) note(n indexNote) {
	x.seq++
	x.notes[x.seq%indexNotes] = n
}

// learn records r unless a change since mark makes it doubtful, or a newer version of
// its key is recorded; own is the note of the caller's own open of r's range (its
// target; 0: none), which does not count. It reports whether r is recorded now.
func (x *replicaIndex) learn(r replicaRecord, since, own uint64) bool {
	if x.seq-since >= indexNotes {
		return false
	}
	for s := since + 1; s <= x.seq; s++ {
		if s == own {
			continue
		}
		n := &x.notes[s%indexNotes]
		if n.key == "" && n.offset < r.end() && r.offset < n.end {
			return false
		}
		if n.key == r.key && n.upTo >= r.putID && !r.notices.older(n.notice) {
			return false
		}
	}
	if cur := x.byKey[r.key]; cur != nil {
		if cur.putID > r.putID || (cur.putID == r.putID && cur.offset == r.offset) {
			if cur.putID == r.putID && (cur.notices.reg != r.notices.reg || cur.notices.seq < r.notices.seq) {
				cur.notices = r.notices // the same replica: any answer's bound holds for it
			}
			return cur.putID == r.putID
		}
		x.remove(cur)
	}
	x.removeOverlapping(r.offset, r.end())
	rec := r
	x.byKey[r.key] = &rec
	x.byOff.ReplaceOrInsert(&rec)
	return true
}

// drop forgets the record of key if its version is at most upTo.
func (x *replicaIndex) drop(key string, upTo int64) {
	x.note(indexNote{key: key, upTo: upTo})
	if cur := x.byKey[key]; cur != nil && cur.putID <= upTo {
		x.remove(cur)
	}
}

// evicted applies eviction notice n of key@putID: it forgets the record of key if its
// version is at most putID, unless the notice is older than the record.
func (x *replicaIndex) evicted(key string, putID int64, n noticeBound) {
	x.note(indexNote{key: key, upTo: putID, notice: n})
	if cur := x.byKey[key]; cur != nil && cur.putID <= putID && !cur.notices.older(n) {
		x.remove(cur)
	}
}

// open forgets every record overlapping [offset, offset+length): the master handed the
// range out for a new value. It returns its note, for learn's own.
func (x *replicaIndex) open(offset, length int64) uint64 {
	end := offset + ssd.AlignedLen(length)
	x.note(indexNote{offset: offset, end: end})
	x.removeOverlapping(offset, end)
	return x.seq
}

// forget removes r (the master refused it), if that replica is still recorded.
func (x *replicaIndex) forget(r replicaRecord) {
	if cur := x.byKey[r.key]; cur != nil && cur.putID == r.putID && cur.offset == r.offset && cur.len == r.len {
		x.remove(cur) // the same replica, whatever bound an answer since gave it
	}
}

func (x *replicaIndex) remove(r *replicaRecord) {
	delete(x.byKey, r.key)
	x.byOff.Delete(r)
}

// removeOverlapping removes the records that overlap [offset, end).
func (x *replicaIndex) removeOverlapping(offset, end int64) {
	var gone []*replicaRecord
	// The record starting at or before offset may reach into the range; records are
	// disjoint, so only the last such one can.
	x.byOff.DescendLessOrEqual(&replicaRecord{offset: offset}, func(r *replicaRecord) bool {
		if r.end() > offset {
			gone = append(gone, r)
		}
		return false
	})
	x.byOff.AscendRange(&replicaRecord{offset: offset + 1}, &replicaRecord{offset: end}, func(r *replicaRecord) bool {
		gone = append(gone, r)
		return true
	})
	for _, r := range gone {
		x.remove(r)
	}
}

// lookup returns the record of key, or nil.
func (x *replicaIndex) lookup(key string) *replicaRecord { return x.byKey[key] }

// records returns a copy of every record, in offset order.
func (x *replicaIndex) records() []replicaRecord {
	out := make([]replicaRecord, 0, len(x.byKey))
	x.byOff.Ascend(func(r *replicaRecord) bool {
		out = append(out, *r)
		return true
	})
	return out
}

// reset forgets every record (the master dropped this owner's replicas); answers to
// calls that started before learn nothing.
func (x *replicaIndex) reset() {
	clear(x.byKey)
	x.byOff.Clear(false)
	x.seq += indexNotes
}

// len is the number of records.
func (x *replicaIndex) len() int { return len(x.byKey) }
