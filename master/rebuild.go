package master

import (
	"math"
	"time"

	gbtree "github.com/google/btree"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

// A restarted master is not a cache flush (README "Several owners": a master restart).
// Each owner keeps an index of the replicas in its segment and on its SSD; after it
// registers with a master that does not know it, it reports that index in batches
// (ReportReplicas) and the master rebuilds routes, allocations and eviction order from
// it. Reports are taken during the rebuild window only (Options.RebuildWindow from the
// master's start). While it is open the master remembers, per key, the highest version
// it dropped or deleted (a tombstone): a record reported later at or below it is
// refused, so a key deleted, overwritten or evicted after the restart never comes back
// from an owner that reports late. After the window an owner that registers again
// drops its index instead of reporting it.

// ReplicaRecord is one entry of an owner's report: key@PutID (Len bytes), a memory
// replica at Offset of its pool (Memory) or a committed entry on its SSD (SSD).
type ReplicaRecord struct {
	Key    string
	PutID  int64
	Len    int64
	Memory bool
	Offset int64
	SSD    bool
	Parent *string // a KV page's parent (nil: a plain key)
	Seq    int64   // an SSD record's number on its owner (0: not told)
}

// OpenRebuild opens the rebuild window at now (the master's start).
func (s *State) OpenRebuild(now time.Time) {
	if s.opts.RebuildWindow <= 0 {
		return
	}
	s.rebuildUntil = now.Add(s.opts.RebuildWindow)
	s.tombstones = make(map[string]int64)
}

// closeRebuildLocked ends the rebuild window once it is past.
func (s *State) closeRebuildLocked(now time.Time) {
	if s.tombstones != nil && now.After(s.rebuildUntil) {
		for _, n := range s.nodes {
			n.opened = nil
			n.reporting = false
		}
		s.log.Info().Int("tombstones", len(s.tombstones)).Int("keys", len(s.routes)).Msg("rebuild window closed; owners that register from now on start with an empty index")
		s.tombstones, s.nsTombstones = nil, nil
	}
}

// tombstoneLocked remembers, during the rebuild window, that versions of key up to
// putID are gone.
func (s *State) tombstoneLocked(key string, putID int64) {
	if s.tombstones != nil {
		s.tombstones[key] = max(s.tombstones[key], putID)
	}
}

// ExpectReport marks the owner ref, registered just now from a master of another
// epoch, as reporting its replica index: no other owner's put is placed on it until its
// last batch (ReportReplicas with last) or the end of the rebuild window.
func (s *State) ExpectReport(ref NodeRef) {
	if n, err := s.nodeLocked(ref); err == nil && s.tombstones != nil {
		n.reporting = true
	}
}

// RefuseReport marks the owner ref, registered just now, as one that missed the HA term
// before this master's (wire.SkippedTerm): its report is refused whole, as its own rule
// has it forget the records (daemon/registration.go), so that an owner of an earlier
// release cannot bring back what that term deleted.
func (s *State) RefuseReport(ref NodeRef) {
	if n, err := s.nodeLocked(ref); err == nil {
		n.skippedTerm = true
	}
}

// RefillHoldersAtDone marks the owner ref, registered just now, as one of an earlier
// release: its refills from another owner's SSD get their holder at GetDone, as a
// pull's, not at GetStart (it would not ack one recorded there when the get failed).
func (s *State) RefillHoldersAtDone(ref NodeRef) {
	if n, err := s.nodeLocked(ref); err == nil {
		n.refillHoldersAtDone = true
	}
}

// ReportReplicas adopts a batch of an owner's replica records; last ends the owner's
// report. It returns the indexes
// of the records it refused (the owner drops them) and the invalidations of older
// versions that a record displaced (other owners reported them earlier); those must
// reach their owners before the report is answered, as for an overwrite.
func (s *State) ReportReplicas(now time.Time, ref NodeRef, recs []ReplicaRecord, last bool) (rejected []int32, invs []Invalidation, err error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return nil, nil, err
	}
	if last {
		defer func() { n.reporting = false }()
	}
	n.lastSeen = now // a long report stands for the heartbeats it holds up
	s.closeRebuildLocked(now)
	if s.tombstones == nil || n.skippedTerm {
		rejected = make([]int32, len(recs))
		for i := range recs {
			rejected[i] = int32(i)
		}
		return rejected, nil, nil
	}
	adopted := 0
	for i, rec := range recs {
		ok, displaced := s.adoptLocked(n, rec)
		// A record refused after it displaced an older version (its range could not be
		// reserved) leaves the key without a route: the older version is dead all the
		// same, and its owners must hear so.
		invs = append(invs, displaced...)
		if !ok {
			rejected = append(rejected, int32(i))
			continue
		}
		adopted++
	}
	s.log.Debug().Str("node", n.id).Int("records", len(recs)).Int("adopted", adopted).Msg("replica report")
	return rejected, invs, nil
}

// maxRecordLen bounds a reported SSD record whose owner did not say its capacity: far
// beyond any value, far enough from MaxInt64 that rounding it to granules, or adding a
// few of them, cannot wrap (a wrapped length passed every size check of a get, which then
// evicted every sole copy of the requester for nothing).
const maxRecordLen = math.MaxInt64 / 4

// adoptLocked adds one reported record to the routes, or refuses it.
func (s *State) adoptLocked(n *node, rec ReplicaRecord) (ok bool, displaced []Invalidation) {
	if wire.ValidateKey(rec.Key) != nil || rec.Len <= 0 || rec.PutID <= 0 || rec.PutID > maxCarriedID || rec.Memory == rec.SSD ||
		rec.PutID <= s.tombstones[rec.Key] || (rec.SSD && (!n.ssd.Enabled || n.ssd.CapacityBytes > 0 && !n.ssd.holds(rec.Len) || rec.Len > maxRecordLen)) ||
		(rec.Memory && rec.Len > n.segmentSize) || validateParent(rec.Key, rec.Parent) != nil {
		return false, nil // (a length past what the owner holds would defeat every size check of a get)
	}
	if len(s.nsTombstones) > 0 {
		if ns, ok := wire.KeyNamespace(rec.Key); ok && s.nsTombstones[ns] {
			return false, nil // its namespace was deleted in this window: this is older
		}
	}
	// Ids issued from now on exceed every reported one (they already do when the new
	// master's id base, its start time in ns, is later than the old master's last id).
	s.carryID(rec.PutID)
	r := s.routes[rec.Key]
	if r != nil && (r.putID > rec.PutID || (r.putID == rec.PutID && r.len != rec.Len)) {
		return false, nil
	}
	if r != nil && r.putID < rec.PutID {
		// Another owner reported an older version first: this one wins, that one goes.
		displaced = s.invalidationsLocked(nil, rec.Key, r.putID, s.holdersLocked(rec.Key, r))
		s.dropRouteLocked(rec.Key, r)
		r = nil
	}
	if r != nil && r.replicas[n] != nil && ((rec.Memory && r.replicas[n].memory != nil) || (rec.SSD && r.replicas[n].ssd)) {
		return false, displaced // reported twice
	}
	var a *Allocation
	if rec.Memory {
		if a = s.reserveReportedLocked(n, rec.Offset, rec.Len); a == nil {
			return false, displaced
		}
	}
	if r == nil {
		// The first record of a version decides whether it is a KV page (a copy
		// reported by an owner that did not put it carries no parent)...
		r = &route{putID: rec.PutID, len: rec.Len, replicas: make(map[*node]*replica), page: rec.Parent != nil, parent: deref(rec.Parent)}
		s.setRouteLocked(rec.Key, r)
	} else if rec.Parent != nil && !r.page && !r.inMemory() {
		// ...unless only SSD records came before, which carry none either: the page's
		// memory record, reported after its SSD record by another owner, made it a plain
		// key, never dirty again, evicted unwritten once the ring overwrote the record
		// (a review).
		s.becomePageLocked(rec.Key, r, *rec.Parent)
	}
	if a != nil {
		s.setMemoryLocked(rec.Key, r, n, a, true)
		s.unwrittenPageLocked(rec.Key, r, n)
		if len(r.replicas) > 1 {
			// A duplicate learned from a report may be old in its other owner's order:
			// the owners holding it search for duplicates again at once (the copies a
			// get makes are new on both sides, and need not: countCopyLocked).
			for m := range r.replicas {
				endDupRest(m)
			}
		}
		return true, displaced
	}
	rep := replicaOn(rec.Key, r, n)
	setSSD(n, rep, true)
	rep.ssdLen, rep.ssdSeq = rec.Len, rec.Seq
	s.cleanLocked(rec.Key, r)
	return true, displaced
}

// rangeSet is a set of disjoint ranges (overlapping or touching ones are merged as
// they are added); the nil set holds nothing and takes nothing. Its size follows the
// allocations made during the rebuild window, not the pool's.
type rangeSet struct {
	t *gbtree.BTreeG[Range]
}

func newRangeSet() *rangeSet {
	return &rangeSet{t: gbtree.NewG(16, func(a, b Range) bool { return a.Offset < b.Offset })}
}

// add puts r in the set.
func (s *rangeSet) add(r Range) {
	if s == nil {
		return
	}
	lo, hi := r.Offset, r.Offset+r.Size
	var merged []Range
	s.t.DescendLessOrEqual(Range{Offset: lo}, func(m Range) bool {
		if m.Offset+m.Size >= lo {
			merged = append(merged, m)
		}
		return false
	})
	s.t.AscendRange(Range{Offset: lo + 1}, Range{Offset: hi + 1}, func(m Range) bool {
		merged = append(merged, m)
		return true
	})
	for _, m := range merged {
		s.t.Delete(m)
		lo, hi = min(lo, m.Offset), max(hi, m.Offset+m.Size)
	}
	s.t.ReplaceOrInsert(Range{Offset: lo, Size: hi - lo})
}

// overlaps reports whether r shares a byte with a range of the set.
func (s *rangeSet) overlaps(r Range) bool {
	if s == nil {
		return false
	}
	hit := false
	s.t.DescendLessOrEqual(Range{Offset: r.Offset}, func(m Range) bool {
		hit = m.Offset+m.Size > r.Offset
		return false
	})
	s.t.AscendRange(Range{Offset: r.Offset + 1}, Range{Offset: r.Offset + r.Size}, func(Range) bool {
		hit = true
		return false
	})
	return hit
}

// reserveReportedLocked takes the reported range [offset, +length) of n's pool, or of
// its transfer area (a replica the pool borrowed it for): free, or exactly the range
// of a pin (a holder the owner reported at Register), which the replica then shares
// unless another record took it already (references beyond its holders'). nil when it
// overlaps anything else or lies outside both.
func (s *State) reserveReportedLocked(n *node, offset, length int64) *Allocation {
	r := Range{Offset: offset, Size: roundUp(length, AllocGranule)}
	area, base := n.regionOf(offset)
	if offset < 0 || offset%AllocGranule != 0 || offset-base+r.Size > area.Capacity() || n.opened.overlaps(r) ||
		area == n.landing {
		return nil // (no replica lives in the landing area: it holds gets' ranges only)
	}
	if area.Reserve(Range{Offset: offset - base, Size: r.Size}) {
		if area == n.alloc {
			return newAllocation(n, r, length)
		}
		a := newXferAllocation(n, Range{Offset: offset - base, Size: r.Size}, length)
		lend(a)
		return a
	}
	if h := samePin(n, area, r); h != nil && h.len == length && h.refs == h.holds {
		if area == n.xfer && !h.lent {
			// The replica the pool borrowed the area for: lent like one reported on
			// its own, or a take-back would find nothing lent and never evict it.
			lend(h)
		}
		return h.Retain()
	}
	return nil
}
