package master

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Pooled placement (docs/architecture.md §10 "Placement (one pool)"). A put goes to its requester
// when the requester's pool has room; else to the live owner with the most free bytes
// that has room; else the master evicts across the pool, duplicates before sole
// copies, sole copies on the requester first unless another owner's keys are much
// colder, and places the put where it made room.
// A put placed on another owner is written by its client into a source range of the
// requester's transfer area; at PutDone the master has the target owner pull it
// (PullTask, run by the server outside the lock), and PullDone publishes it or places
// it again on another owner (the bytes are still in the source).

// PutPlan tells the requester where to write a value.
type PutPlan struct {
	PutID        int64
	TargetNode   string
	TargetAddr   string
	TargetOffset int64
	SourceOffset int64 // == TargetOffset when the target is the requester
	PersistToSSD bool
}

// PutStart plans a put: it places the target range (on the requester, or under
// PlacementPool possibly on another owner, with a source range in the requester's
// transfer area) and records the in-flight put.
//
// parent is set for a KV page: the page before it in its chain (a valid key, not key
// itself), "" for a chain's first page; nil for a plain key. The eviction order keeps
// a chain's pages while their prefix is cached (chain.go).
func (s *State) PutStart(now time.Time, ref NodeRef, key string, length int64, rejectIfExists bool, parent *string) (PutPlan, error) {
	n, err := s.reportedNodeLocked(ref)
	if err != nil {
		return PutPlan{}, err
	}
	if err := wire.ValidateKey(key); err != nil {
		return PutPlan{}, err
	}
	if err := validateParent(key, parent); err != nil {
		return PutPlan{}, err
	}
	// A value is limited by the requester's pool, wherever it is placed.
	if err := wire.ValidateLen(length, n.alloc.Capacity()); err != nil {
		return PutPlan{}, err
	}
	if rejectIfExists {
		if r := s.routes[key]; r != nil && r.readable() {
			return PutPlan{}, wire.Errorf(common.ErrorCode_ALREADY_EXISTS, "key exists")
		}
	}
	if parent != nil {
		s.refreshChainLocked(*parent)
	}
	target, source := s.placeLocked(now, n, length)
	if target == nil {
		return PutPlan{}, s.noSpaceLocked(n, length)
	}
	id := s.newID()
	t := target.node
	s.addPutLocked(id, &inflightPut{
		key: key, node: n, target: target, source: source, deadline: now.Add(s.opts.InflightTTL),
		rejectIfExists: rejectIfExists, page: parent != nil, parent: deref(parent),
	})
	plan := PutPlan{PutID: id, TargetNode: t.id, TargetAddr: t.dataAddr,
		TargetOffset: target.Offset(), SourceOffset: target.Offset(), PersistToSSD: s.persistNodeLocked(t, length) != nil}
	if source != nil {
		plan.SourceOffset = source.Offset()
	}
	return plan, nil
}

// placeLocked chooses a put's target: see the comment at the top of this file. The
// source is nil when the target is on the requester. A requester whose areas (transfer,
// else landing: allocSourceLocked) cannot take the value now, because it has neither or
// neither has room, places the put on itself (so a value larger than both is always
// local). Both are nil when no owner has room.
//
// With no free range anywhere, the order is: the requester's duplicates, other owners'
// duplicates (when the requester has idle area room for the source), the sole
// copies of an owner whose next victim is much older than the requester's
// (staleNodeLocked; idle area room again), the requester's idle transfer area, the
// requester's sole copies, other owners' sole copies. A transfer takes back area room
// the pool borrowed (allocSourceLocked) only to place on an owner with a free range,
// where it evicts nothing.
func (s *State) placeLocked(now time.Time, n *node, length int64) (target, source *Allocation) {
	if s.opts.Placement == PlacementLocal {
		return s.allocateLocked(n, length), nil
	}
	if r, ok := n.alloc.Alloc(length); ok {
		return newAllocation(n, r, length), nil
	}
	others := s.poolCandidatesLocked(now, n, length, nil)
	if slices.ContainsFunc(others, func(m *node) bool { return m.alloc.Fits(length) }) {
		if source = s.allocSourceLocked(n, length, true); source == nil {
			return s.allocateLocked(n, length), nil
		}
		return s.placeAmongLocked(others, length), source
	}
	if target = s.allocateEvictingLocked(n, length, evictDuplicates); target != nil {
		return target, nil
	}
	if source = s.allocSourceLocked(n, length, false); source != nil {
		for _, m := range others {
			if target = s.allocateEvictingLocked(m, length, evictDuplicates); target != nil {
				return target, source
			}
		}
		source.Release()
	}
	if m := s.staleNodeLocked(n, others); m != nil {
		if source = s.allocSourceLocked(n, length, false); source != nil {
			if target = s.allocateEvictingLocked(m, length, evictSoleCopies); target != nil {
				return target, source
			}
			source.Release()
		}
	}
	if target = s.allocateLocked(n, length); target != nil || len(others) == 0 {
		return target, nil
	}
	// (Not in the attempt that spares held duplicates, which the server makes first: a
	// take-back evicts a sole copy the pool borrowed, and the other owners may have no
	// room for it either: it was lost for a NO_SPACE. The attempt after it takes back.)
	if source = s.allocSourceLocked(n, length, !s.spareHeld); source == nil {
		return nil, nil
	}
	if target = s.placeAmongLocked(others, length); target == nil {
		source.Release()
		source = nil
	}
	return target, source
}

// staleVictimMargin is how much older, on the pool's clock, another owner's next victim
// must be than the requester's for a put to evict there instead (staleNodeLocked): the
// same as a page's bonus for one doubling of its hits, so owners whose keys age alike
// keep their own puts and pay no transfer for it.
const staleVictimMargin = pageFreqBonus

// staleNodeLocked is the owner among others whose next victim is older than the
// requester n's by more than staleVictimMargin, the oldest first (ties: others'
// order); nil when there is none. Eviction on the requester alone would leave an owner
// that receives no puts (its engine idle, or none attached) holding what it held when
// the pool filled, however cold: with one pool, the coldest keys go first wherever
// they are.
func (s *State) staleNodeLocked(n *node, others []*node) *node {
	pn, ok := n.policy.NextPriority()
	if !ok {
		return nil
	}
	var stale *node
	var oldest int64
	for _, m := range others {
		if pm, ok := m.policy.NextPriority(); ok && pm < pn-staleVictimMargin && (stale == nil || pm < oldest) {
			stale, oldest = m, pm
		}
	}
	return stale
}

// poolCandidatesLocked lists the owners other than the requester a put of length bytes
// may be placed on, most free bytes first, ties by node id: live (heard from within
// two heartbeat intervals, so a silent owner attracts no puts while it waits for its
// tomb), reachable (a peer address for PullPut), with a pool large enough, done
// reporting its replicas (rebuild.go) and not excluded (a pull from them failed).
func (s *State) poolCandidatesLocked(now time.Time, requester *node, length int64, exclude []string) []*node {
	var out []*node
	for _, m := range s.nodes {
		if m == requester || m.tombed || m.reporting || m.peerAddr == "" || m.alloc.Capacity() < length ||
			now.Sub(m.lastSeen) > 2*s.opts.HeartbeatInterval || slices.Contains(exclude, m.id) {
			continue
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool {
		fi, fj := out[i].alloc.FreeBytes(), out[j].alloc.FreeBytes()
		return fi > fj || (fi == fj && out[i].id < out[j].id)
	})
	return out
}

// placeAmongLocked allocates length bytes on the first of nodes that has room without
// evicting; else on the first where evicting duplicates makes room; else on the first
// where evicting sole copies too does. Duplicate-only attempts that fail still evict
// the duplicates they found (each has another live copy, so no value is lost).
func (s *State) placeAmongLocked(nodes []*node, length int64) *Allocation {
	for _, m := range nodes {
		if r, ok := m.alloc.Alloc(length); ok {
			return newAllocation(m, r, length)
		}
	}
	for _, depth := range []evictDepth{evictDuplicates, evictSoleCopies} {
		for _, m := range nodes {
			if a := s.allocateEvictingLocked(m, length, depth); a != nil {
				return a
			}
		}
	}
	return nil
}

// PullTask is a PullPut call for the server to make, outside the lock: the target
// owner pulls the put from the requester's transfer area into its target range. Its
// outcome goes to PullDone.
type PullTask struct {
	PutID            int64
	Key              string
	TargetNode       string
	TargetPeerAddr   string
	TargetGeneration int64
	TargetOffset     int64
	Len              int64
	SourceNode       string
	SourceGeneration int64
	SourceDataAddr   string
	SourceOffset     int64
}

// PutResult is what PutDone or PullDone leaves the server to do: with Pull set the put
// is not published yet (run the pull, then PullDone); otherwise it was published, and
// the other owners' cached infos are to be invalidated and, when the target owner has
// SSD, the persist to be asked for (until PersistDone the replica is kept alive and
// stays out of the eviction policy).
type PutResult struct {
	Invalidations []Invalidation
	Persist       *PersistTask
	Pull          *PullTask
}

// PutDone publishes the put's target as the key's memory replica under a new version;
// the old version's replicas are released (its holders keep their bytes). A put placed
// on another owner is published only once that owner has pulled it: PutDone then
// returns the pull to run. A second PutDone while the pull runs is refused
// (INVALID_ARGUMENT): a put is published at most once.
func (s *State) PutDone(now time.Time, ref NodeRef, key string, putID int64) (PutResult, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return PutResult{}, err
	}
	p := s.puts[putID]
	if p == nil || p.key != key || p.node != n || p.revoked {
		return PutResult{}, wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (expired, revoked or never started)", putID)
	}
	if p.pull != nil {
		return PutResult{}, wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "put %d is already being published (node %q is pulling it)", putID, p.pull.TargetNode)
	}
	if p.source == nil {
		return s.publishLocked(putID, p)
	}
	if r := s.routes[key]; p.rejectIfExists && r != nil && r.readable() {
		s.dropPutLocked(putID, p)
		return PutResult{}, wire.Errorf(common.ErrorCode_ALREADY_EXISTS, "key exists")
	}
	if t := p.target.node; t.tombed {
		return s.replaceLocked(now, putID, p, fmt.Errorf("node %q left the cluster", t.id), true)
	}
	return PutResult{Pull: s.pullTaskLocked(putID, p)}, nil
}

func (s *State) pullTaskLocked(putID int64, p *inflightPut) *PullTask {
	t, src := p.target.node, p.source.node
	p.pull = &PullTask{PutID: putID, Key: p.key, TargetNode: t.id, TargetPeerAddr: t.peerAddr, TargetGeneration: t.generation,
		TargetOffset: p.target.Offset(), Len: p.target.Len(), SourceNode: src.id, SourceGeneration: src.generation,
		SourceDataAddr: src.dataAddr, SourceOffset: p.source.Offset()}
	return p.pull
}

// PullDone ends the pull PutDone (or an earlier PullDone) returned. pullErr is its
// outcome; answered says the target owner answered (it never writes the range after
// answering), false when the call failed in transport, so the owner may still be
// writing: that target range is then quarantined until the pull timeout has passed
// (or its owner is tombed). On success the put is published; on failure, or when the
// target owner was tombed meanwhile, the put is placed on another owner (neither the
// failed ones nor the requester) and the next pull is returned, or, when none has
// room, the put ends with UNAVAILABLE. A put revoked or expired meanwhile ends here,
// its ranges freed.
func (s *State) PullDone(now time.Time, putID int64, pullErr error, answered bool) (PutResult, error) {
	p := s.puts[putID]
	if p == nil || p.pull == nil {
		return PutResult{}, wire.Errorf(common.ErrorCode_INTERNAL, "BUG: no pull of put %d is running", putID)
	}
	t := p.target.node
	p.pull = nil
	if t.tombed {
		answered = true // its allocator is gone: nothing to protect
		if pullErr == nil {
			pullErr = fmt.Errorf("node %q left the cluster", t.id)
		}
	}
	if p.revoked {
		s.forgetPutLocked(putID, p)
		s.releaseTargetLocked(now, p.target, answered)
		p.source.Release()
		return PutResult{}, wire.Errorf(common.ErrorCode_UNAVAILABLE, "put %d was revoked while node %q pulled it", putID, t.id)
	}
	if pullErr == nil {
		return s.publishLocked(putID, p)
	}
	s.log.Warn().Str("key", p.key).Int64("put_id", putID).Str("target", t.id).Bool("answered", answered).Err(pullErr).
		Msg("pull of a pooled put failed; placing it again")
	return s.replaceLocked(now, putID, p, pullErr, answered)
}

// replaceLocked places a put again after its target failed (cause): the failed target
// is freed (or quarantined when its owner may still write it) and excluded, as is the
// requester (its client wrote the value into the transfer area, not into its pool).
func (s *State) replaceLocked(now time.Time, putID int64, p *inflightPut, cause error, answered bool) (PutResult, error) {
	failed := p.target.node
	p.failed = append(p.failed, failed.id)
	s.releaseTargetLocked(now, p.target, answered)
	p.target = nil
	if t := s.placeAmongLocked(s.poolCandidatesLocked(now, p.node, p.source.Len(), p.failed), p.source.Len()); t != nil {
		p.target = t
		s.log.Info().Str("key", p.key).Int64("put_id", putID).Str("failed", failed.id).Str("target", t.node.id).Msg("pooled put placed again")
		return PutResult{Pull: s.pullTaskLocked(putID, p)}, nil
	}
	s.forgetPutLocked(putID, p)
	p.source.Release()
	return PutResult{}, wire.Errorf(common.ErrorCode_UNAVAILABLE, "target node %q failed: %v; no other owner has room", failed.id, cause)
}

// releaseTargetLocked frees a pulled target, or quarantines it when its owner may
// still be writing it.
func (s *State) releaseTargetLocked(now time.Time, a *Allocation, answered bool) {
	if answered || a.node.tombed {
		a.Release()
		return
	}
	s.quarantine = append(s.quarantine, quarantined{alloc: a, until: now.Add(s.opts.PullTimeout)})
}

// publishLocked makes the put's target the key's memory replica on the target owner.
func (s *State) publishLocked(putID int64, p *inflightPut) (PutResult, error) {
	newer := s.newerPutIDLocked(p.key, putID) // (before this put leaves the records)
	s.forgetPutLocked(putID, p)
	if p.source != nil {
		p.source.Release()
	}
	key := p.key
	old := s.routes[key]
	if p.rejectIfExists && old != nil && old.readable() {
		p.target.Release()
		return PutResult{}, wire.Errorf(common.ErrorCode_ALREADY_EXISTS, "key exists")
	}
	if newer != 0 {
		// A put of the key that started later was published first (its route may be
		// gone since: deleted, evicted; putorder.go): concurrent puts serialize in
		// put_id order, so this one is already overwritten. It is not
		// published (a key's put_id never moves backwards, docs/architecture.md §5: owners forget
		// cached and SSD versions "up to" a put_id) and its target goes back.
		// The requester records a put placed on it in its replica index when PutDone
		// answers OK: tell it first (Sync) that this version is dead, or it would keep a
		// record of a range freed here, answer exists of the key from it, and report it
		// to a new master.
		t := p.target.node
		p.target.Release()
		// Answered now, this put is ordered right before the newer one: an owner that
		// may still serve a version older than it (a Sync invalidation of the key it has
		// not confirmed yet: its own, or a delete's before it) must have dropped it
		// before this put returns, as before the newer one's; the requester too, which
		// drops only the versions up to this put's own once answered.
		var res PutResult
		for _, iv := range s.invalidationsLocked(nil, key, newer-1, nil) {
			if iv.Sync {
				res.Invalidations = append(res.Invalidations, iv)
			}
		}
		if t == p.node && t.peerAddr != "" && !slices.ContainsFunc(res.Invalidations, func(iv Invalidation) bool { return iv.NodeID == t.id }) {
			iv := Invalidation{NodeID: t.id, PeerAddr: t.peerAddr, Generation: t.generation, Key: key, PutID: putID, Sync: true}
			s.pendSyncLocked(iv)
			res.Invalidations = append(res.Invalidations, iv)
		}
		return res, nil
	}
	var holders map[*node]bool
	if old != nil {
		holders = s.holdersLocked(key, old)
		s.dropRouteLocked(key, old)
	}
	// A report is never of a version this master published: refuse every later one of
	// the key (it would win only if this master's ids were below the old one's).
	s.tombstoneLocked(key, math.MaxInt64)
	t := p.target.node
	r := &route{putID: putID, len: p.target.Len(), replicas: make(map[*node]*replica), page: p.page, parent: p.parent}
	s.setRouteLocked(key, r)
	var res PutResult
	if s.writeBackLocked(r) {
		s.setMemoryLocked(key, r, t, p.target, true)
		s.unwrittenPageLocked(key, r, t)
	} else {
		res.Persist = s.persistTaskLocked(key, putID, t, p.target)
		s.setMemoryLocked(key, r, t, p.target, res.Persist == nil)
	}
	// Versions older than putID are dead everywhere; putID itself may already be
	// cached (or persisted) by another owner that read it: keep that. The requester
	// drops its own cached info; a remote target is invalidated like any other owner.
	res.Invalidations = s.invalidationsLocked(p.node, key, putID-1, holders)
	return res, nil
}

// PutRevoke abandons an in-flight put and frees its ranges; while its target owner is
// pulling it, only once the pull has answered (PullDone).
func (s *State) PutRevoke(ref NodeRef, key string, putID int64) error {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return err
	}
	p := s.puts[putID]
	if p == nil || p.key != key || p.node != n || p.revoked {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key", putID)
	}
	s.revokePutLocked(putID, p)
	return nil
}

// quarantined is a pulled target whose owner never answered: it may write the range
// until its transfer deadline, so the range is freed only after until.
type quarantined struct {
	alloc *Allocation
	until time.Time
}

// releaseQuarantineLocked frees quarantined ranges past their time or of tombed owners.
func (s *State) releaseQuarantineLocked(now time.Time) {
	s.quarantine = slices.DeleteFunc(s.quarantine, func(q quarantined) bool {
		if now.After(q.until) || q.alloc.node.tombed {
			q.alloc.Release()
			return true
		}
		return false
	})
}

// unquarantineLocked frees the quarantined ranges of a tombed owner.
func (s *State) unquarantineLocked(n *node) {
	s.quarantine = slices.DeleteFunc(s.quarantine, func(q quarantined) bool {
		if q.alloc.node == n {
			q.alloc.Release()
			return true
		}
		return false
	})
}

// Pulling counts puts whose target owner is pulling them; Quarantined counts target
// ranges held after a pull that never answered.
func (s *State) Pulling() (pulling, quarantinedRanges int) {
	for _, p := range s.puts {
		if p.pull != nil {
			pulling++
		}
	}
	return pulling, len(s.quarantine)
}
