package master

import (
	"time"

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
		}
		s.log.Info().Int("tombstones", len(s.tombstones)).Int("keys", len(s.routes)).Msg("rebuild window closed; owners that register from now on start with an empty index")
		s.tombstones = nil
	}
}

// tombstoneLocked remembers, during the rebuild window, that versions of key up to
// putID are gone.
func (s *State) tombstoneLocked(key string, putID int64) {
	if s.tombstones != nil {
		s.tombstones[key] = max(s.tombstones[key], putID)
	}
}

// ReportReplicas adopts a batch of an owner's replica records. It returns the indexes
// of the records it refused (the owner drops them) and the invalidations of older
// versions that a record displaced (other owners reported them earlier); those must
// reach their owners before the report is answered, as for an overwrite.
func (s *State) ReportReplicas(now time.Time, ref NodeRef, recs []ReplicaRecord) (rejected []int32, invs []Invalidation, err error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return nil, nil, err
	}
	s.closeRebuildLocked(now)
	if s.tombstones == nil {
		rejected = make([]int32, len(recs))
		for i := range recs {
			rejected[i] = int32(i)
		}
		return rejected, nil, nil
	}
	adopted := 0
	for i, rec := range recs {
		ok, displaced := s.adoptLocked(n, rec)
		if !ok {
			rejected = append(rejected, int32(i))
			continue
		}
		adopted++
		invs = append(invs, displaced...)
	}
	s.log.Debug().Str("node", n.id).Int("records", len(recs)).Int("adopted", adopted).Msg("replica report")
	return rejected, invs, nil
}

// adoptLocked adds one reported record to the routes, or refuses it.
func (s *State) adoptLocked(n *node, rec ReplicaRecord) (ok bool, displaced []Invalidation) {
	if wire.ValidateKey(rec.Key) != nil || rec.Len <= 0 || rec.PutID <= 0 || rec.Memory == rec.SSD ||
		rec.PutID <= s.tombstones[rec.Key] || (rec.SSD && !n.ssd.Enabled) {
		return false, nil
	}
	// Ids issued from now on exceed every reported one (they already do when the new
	// master's id base, its start time in ns, is later than the old master's last id).
	s.nextID = max(s.nextID, rec.PutID)
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
		r = &route{putID: rec.PutID, len: rec.Len, replicas: make(map[*node]*replica)}
		s.routes[rec.Key] = r
	}
	if a != nil {
		s.setMemoryLocked(rec.Key, r, n, a, true)
		return true, displaced
	}
	rep := r.replicas[n]
	if rep == nil {
		rep = &replica{}
		r.replicas[n] = rep
	}
	rep.ssd, rep.ssdLen = true, rec.Len
	return true, displaced
}

// granules is a bitmap of a pool's AllocGranule-sized units; the nil bitmap marks
// nothing and has nothing marked.
type granules []uint64

func newGranules(capacity int64) granules {
	return make(granules, (capacity/AllocGranule+63)/64)
}

// mark sets r's units.
func (g granules) mark(r Range) {
	if g == nil {
		return
	}
	for u := r.Offset / AllocGranule; u < (r.Offset+r.Size)/AllocGranule && int(u/64) < len(g); u++ {
		g[u/64] |= 1 << (u % 64)
	}
}

// any reports whether a unit of r is set.
func (g granules) any(r Range) bool {
	if g == nil {
		return false
	}
	for u := r.Offset / AllocGranule; u < (r.Offset+r.Size)/AllocGranule && int(u/64) < len(g); u++ {
		if g[u/64]&(1<<(u%64)) != 0 {
			return true
		}
	}
	return false
}

// reserveReportedLocked takes the reported range [offset, +length) of n's pool: free,
// or exactly the range of a pin (a holder the owner reported at Register), which the
// replica then shares. nil when it overlaps anything else or lies outside the pool.
func (s *State) reserveReportedLocked(n *node, offset, length int64) *Allocation {
	r := Range{Offset: offset, Size: roundUp(length, AllocGranule)}
	if offset < 0 || offset%AllocGranule != 0 || offset+r.Size > n.alloc.Capacity() || n.opened.any(r) {
		return nil
	}
	if n.alloc.Reserve(r) {
		return newAllocation(n, r, length)
	}
	for _, h := range n.holders {
		if h.area == n.alloc && h.r == r && h.len == length {
			return h.Retain()
		}
	}
	return nil
}
