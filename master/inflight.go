package master

import (
	"slices"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// inflightPut keeps a put's target alive between PutStart and PutDone/PutRevoke. A put
// placed on another owner than its requester also keeps its source range (in the
// requester's transfer area) until the target owner has pulled it.
type inflightPut struct {
	key            string
	node           *node       // the requester
	target         *Allocation // in the target owner's pool (the requester's, for a local put)
	source         *Allocation // in the requester's transfer area; nil for a local put
	deadline       time.Time
	rejectIfExists bool
	page           bool   // a KV page of a chain (else a plain key)
	parent         string // the page before this one in its chain ("" for a first page)
	// pull is the PullPut the server is running for this put (between PutDone and
	// PullDone); nil otherwise. While it runs the target owner may write the target,
	// so nothing frees it: a revoke, an expiry or the requester's tomb only marks the
	// put revoked, and PullDone frees it.
	pull    *PullTask
	revoked bool
	failed  []string // target nodes whose pull of this put failed: not placed there again
}

// dropPutLocked forgets an in-flight put that is not being pulled and frees its ranges.
func (s *State) dropPutLocked(id int64, p *inflightPut) {
	s.forgetPutLocked(id, p)
	p.target.Release()
	if p.source != nil {
		p.source.Release()
	}
}

// revokePutLocked abandons an in-flight put: at once, unless its target owner is
// pulling it (then PullDone frees its ranges once the pull answered).
func (s *State) revokePutLocked(id int64, p *inflightPut) {
	if p.pull == nil {
		s.dropPutLocked(id, p)
		return
	}
	p.revoked = true
}

// inflightGet keeps a get's target (in the requester's segment) and its source (a
// memory replica elsewhere) alive between GetStart and GetDone/Revoke.
type inflightGet struct {
	key        string
	putID      int64
	node       *node // requester
	target     *Allocation
	source     *Allocation // the remote memory replica pulled from; nil for an SSD refill
	sourceNode *node
	kind       common.Source
	deadline   time.Time
	// holderID, for a refill from the requester's own SSD, is the holder recorded at
	// GetStart: the owner hands the bytes out as soon as its read completes and
	// confirms with GetDone in the background (one master round trip fewer on the SSD
	// path). The holder keeps its own reference to target; GetRevoke (a failed read)
	// drops it, an expired TTL does not (the owner may have handed it out).
	holderID int64
	// noPromotion: the target is for this get alone (the transfer area, or room a
	// duplicate may not take: getTargetLocked); GetDone does not promote it.
	noPromotion bool
	// sourceLost: the memory replica it pulls from went with its owner's tomb
	// (tombLocked). That owner may be alive and register again, its pull fence unchanged
	// (the same process), and its new pool may hand the range to another value: what
	// the pull copied cannot be trusted, and GetDone refuses it.
	sourceLost bool
}

// dropGetLocked ends an in-flight get, dropping its pre-recorded holder too when the
// get failed (revoke) rather than merely expired.
func (s *State) dropGetLocked(id int64, g *inflightGet, revoked bool) {
	delete(s.gets, id)
	g.target.Release()
	s.unsourceLocked(g)
	if revoked && g.holderID != 0 {
		g.node.unhold(g.holderID)
	}
}

// unsourceLocked lets go of a get's source: its range, and its count as a transfer
// the source node serves for another.
func (s *State) unsourceLocked(g *inflightGet) {
	if g.source != nil {
		g.source.Release()
		g.source = nil
	}
	if g.sourceNode != nil && g.sourceNode != g.node {
		g.sourceNode.sourcing--
	}
	g.sourceNode = nil
}

// pickSourceLocked chooses among the live, not excluded nodes that ok accepts the one
// not suspect at now (node.suspectUntil) serving the fewest transfers, ties broken by
// node id: a deterministic plan. A suspect node is chosen only when no other is.
func pickSourceLocked(now time.Time, r *route, exclude []string, ok func(*replica) bool) *node {
	var best *node
	bestSuspect := false
	for m, rep := range r.replicas {
		if m.tombed || !ok(rep) || slices.Contains(exclude, m.id) {
			continue
		}
		suspect := now.Before(m.suspectUntil)
		if best == nil || (!suspect && bestSuspect) || (suspect == bestSuspect &&
			(m.sourcing < best.sourcing || (m.sourcing == best.sourcing && m.id < best.id))) {
			best, bestSuspect = m, suspect
		}
	}
	return best
}

// GetPlan is the master's answer to GetStart.
type GetPlan struct {
	GetID, PutID, Len int64
	Source            common.Source
	SourceNode        string
	SourceDataAddr    string
	SourcePeerAddr    string
	SourceGeneration  int64 // the source incarnation a pull's fence names
	SourceOffset      int64
	TargetOffset      int64
	// Done: a local memory replica was reused; HolderID is recorded, no GetDone follows.
	// For a refill from SSD (the requester's own or another owner's), HolderID is
	// recorded too (Done stays false): the holder is usable once the value is read and
	// verified in the target; GetDone only confirms.
	Done     bool
	HolderID int64
	// NoticesSeq (Done): the requester's last eviction notice numbered so far; notices up
	// to it are older than the replica reused (evictnotice.go).
	NoticesSeq int64
}

// GetDoneResult is the master's answer to GetDone.
type GetDoneResult struct {
	HolderID int64
	// Promoted: the target became the requester's memory replica of the version;
	// NoticesSeq as GetPlan.NoticesSeq for it.
	Promoted   bool
	NoticesSeq int64
}

// fitsNodeLocked refuses a get target of length bytes that no range of n could ever
// hold (its pool, its transfer area, its landing area): allocating it would evict
// every replica of n to find no room, then wait for space that never comes. As a put of
// such a value through n, it is INVALID_ARGUMENT: the value is read through a larger
// owner.
func fitsNodeLocked(n *node, length int64) error {
	most := max(n.alloc.Capacity(), n.areaCapacity())
	if n.landing != nil {
		most = max(most, n.landing.Capacity())
	}
	if roundUp(length, AllocGranule) > most {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "the value's %d bytes exceed the largest range node %q can hold (%d bytes): it can be read only through a larger owner", length, n.id, most)
	}
	return nil
}

// localReplicaLocked reports whether the requester ref has a memory replica of key, of
// which GetStart makes a holder at once: no range is allocated, nothing is evicted.
func (s *State) localReplicaLocked(ref NodeRef, key string) bool {
	n, err := s.reportedNodeLocked(ref)
	if err != nil {
		return false
	}
	r := s.routes[key]
	return r != nil && r.memoryReplica(n) != nil
}

// GetStart plans a get: reuse of a local memory replica (done at once), a pull from a
// remote memory replica, or an SSD refill into a target in the requester's segment.
// SSD is chosen only when no memory replica of the current version is readable.
// Replicas on the exclude nodes are not used (a pull from them just failed). Among
// several remote replicas the one whose owner sources the fewest transfers is chosen,
// ties by node id.
func (s *State) GetStart(now time.Time, ref NodeRef, key string, exclude []string) (GetPlan, error) {
	return s.GetStartAs(now, ref, key, exclude, 0)
}

// GetStartAs is GetStart recording a local hit's holder, or a refill from the
// requester's own SSD's, under holderID, the requester's choice
// (GetStartRequest.holder_id; 0 or one it holds already: the master picks).
func (s *State) GetStartAs(now time.Time, ref NodeRef, key string, exclude []string, holderID int64) (GetPlan, error) {
	n, err := s.reportedNodeLocked(ref)
	if err != nil {
		return GetPlan{}, err
	}
	if err := wire.ValidateKey(key); err != nil {
		return GetPlan{}, err
	}
	r := s.routes[key]
	if r == nil {
		return GetPlan{}, wire.Errorf(common.ErrorCode_KEY_NOT_FOUND, "not found")
	}
	if a := r.memoryReplica(n); a != nil {
		id := s.requestedHolderIDLocked(n, holderID)
		n.hold(id, a.Retain())
		n.policy.Touch(key)
		return GetPlan{PutID: r.putID, Len: r.len, Source: common.Source_MEMORY, SourceNode: n.id,
			SourceOffset: a.Offset(), TargetOffset: a.Offset(), Done: true, HolderID: id, NoticesSeq: n.evicted.lastSeq}, nil
	}
	kind := common.Source_MEMORY
	src := pickSourceLocked(now, r, exclude, func(rep *replica) bool { return rep.memory != nil })
	if src == nil {
		kind = common.Source_SSD
		// Prefer the requester's own SSD, then any other.
		if rep := r.replicas[n]; rep != nil && rep.ssd && !slices.Contains(exclude, n.id) {
			src = n
		} else {
			src = pickSourceLocked(now, r, exclude, func(rep *replica) bool { return rep.ssd })
		}
	}
	if src == nil {
		for m, rep := range r.replicas {
			if !m.tombed && (rep.memory != nil || rep.ssd) && slices.Contains(exclude, m.id) {
				// The key exists, only on nodes a pull from just failed: not a miss.
				return GetPlan{}, wire.Errorf(common.ErrorCode_UNAVAILABLE, "every replica of the key is on an excluded node")
			}
		}
		return GetPlan{}, wire.Errorf(common.ErrorCode_KEY_NOT_FOUND, "not found")
	}
	if err := fitsNodeLocked(n, r.len); err != nil {
		return GetPlan{}, err
	}
	target, promotable := s.getTargetLocked(n, r, kind)
	if target == nil {
		err := s.noSpaceLocked(n, r.len)
		s.short.local = true
		return GetPlan{}, err
	}
	g := &inflightGet{key: key, putID: r.putID, node: n, target: target, sourceNode: src, kind: kind,
		deadline: now.Add(s.opts.InflightTTL), noPromotion: !promotable}
	plan := GetPlan{PutID: r.putID, Len: r.len, Source: kind, SourceNode: src.id, SourceGeneration: src.generation,
		SourceDataAddr: src.dataAddr, SourcePeerAddr: src.peerAddr, TargetOffset: target.Offset()}
	switch {
	case kind == common.Source_MEMORY:
		g.source = r.replicas[src].memory.Retain()
		src.policy.Touch(key)
		plan.SourceOffset = g.source.Offset()
	case src != n && n.refillHoldersAtDone:
		// A remote SSD refill for an owner of an earlier release: its holder comes at
		// GetDone, as a pull's.
	default:
		// A refill, from the requester's own SSD or from another owner's: that owner
		// stages the value's chunks in a bounded area of its own memory, outside its
		// pool (SsdStageRead), so nothing is allocated there and no late staging write
		// can land in a reused range. The holder is recorded now, under the requester's
		// id as a local hit's (a requester that lost this reply acks it; an expired get
		// keeps its holder, dropGetLocked): the requester hands the value out once it
		// is read and verified, and GetDone only confirms (and may promote it).
		g.holderID = s.requestedHolderIDLocked(n, holderID)
		n.hold(g.holderID, target.Retain())
		plan.HolderID = g.holderID
	}
	if src != n {
		src.sourcing++
	}
	plan.GetID = s.newID()
	s.gets[plan.GetID] = g
	return plan, nil
}

// requestedHolderIDLocked is the id a holder GetStart records for requester n goes
// under: holderID, the requester's choice (negative, one it does not hold), else a new
// one.
func (s *State) requestedHolderIDLocked(n *node, holderID int64) int64 {
	if holderID >= 0 || n.holders[holderID] != nil {
		return s.newID()
	}
	return holderID
}

// GetDone turns the get's target into a holder of the requesting owner (its id is the
// get id) and, if the key still has that version, the requester has no memory replica,
// fewer than MaxPromotions promotions happened and GetStart planned the target as a
// replica (getTargetLocked), also into a new memory replica. An eviction notice of the
// version's earlier replica there may still wait for the requester's ack: the answer's
// NoticesSeq tells the owner that notice is older than this replica.
func (s *State) GetDone(ref NodeRef, key string, getID int64) (GetDoneResult, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return GetDoneResult{}, err
	}
	g := s.gets[getID]
	if g == nil || g.key != key || g.node != n {
		// (Only the requester ends its get: a source's GetDone would make the
		// requester's target, written or not, a replica there.)
		return GetDoneResult{}, wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "unknown get %d of this owner for this key (expired, revoked or never started)", getID)
	}
	if g.sourceLost {
		// Its pulls have ended (the requester calls GetDone after them): the target goes.
		s.dropGetLocked(getID, g, true)
		return GetDoneResult{}, wire.Errorf(common.ErrorCode_UNAVAILABLE, "the owner get %d pulled %q from was lost (tombed) before the get ended; retry", getID, key)
	}
	delete(s.gets, getID)
	s.unsourceLocked(g)
	res := GetDoneResult{HolderID: g.holderID}
	if res.HolderID == 0 {
		// holder_id == get_id: a requester that lost this reply still knows the id, and
		// releases it (BatchDeleteAck) instead of leaking the holder.
		res.HolderID = getID
		g.node.hold(res.HolderID, g.target.Retain())
	}
	if r := s.routes[key]; r != nil && !g.noPromotion && r.putID == g.putID && r.memoryReplica(g.node) == nil && r.promotions < s.opts.maxPromotions() {
		r.promotions++
		s.setMemoryLocked(key, r, g.node, g.target.Retain(), true)
		if g.kind == common.Source_SSD {
			s.refreshLocked(r, g.node)
		}
		res.Promoted, res.NoticesSeq = true, g.node.evicted.lastSeq
	}
	g.target.Release() // the in-flight get's own reference
	return res, nil
}

// GetRevoke abandons an in-flight get. With dropSSDSource the SSD replica it tried to
// read is dropped from the route (a failed SSD read).
//
// sourceFailed (a requester's revoke): the pull from the source failed for the
// source's part; gets prefer other replicas over it for a node TTL, unless the same
// requester blamed another source within a node TTL.
func (s *State) GetRevoke(now time.Time, ref NodeRef, key string, getID int64, dropSSDSource, sourceFailed bool) error {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return err
	}
	g := s.gets[getID]
	if g == nil || g.key != key || (g.node != n && g.sourceNode != n) {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "unknown get %d for this key", getID)
	}
	src := g.sourceNode // nil once the source was tombed
	if g.node != n {
		// The source's revoke (an SSD owner of an earlier release whose stage read
		// failed): the requester may still be pulling into its target, which stays
		// until the requester's own revoke, its GetDone or the in-flight TTL (a review:
		// it went back to the requester's pool while a pull could write it). Only the
		// source's part applies: a failed read's SSD replica.
		if dropSSDSource {
			s.dropFailedSSDSourceLocked(key, g, src)
		}
		return nil
	}
	if sourceFailed && src != nil && src != n {
		// A requester that blames another source than the last within a node TTL may be
		// at fault itself (its own data plane cut, its own budgets blown): it marks none,
		// or it would steer every get away from healthy sources (a review).
		if n.blamed == nil || n.blamed == src || !now.Before(n.blamedAt.Add(s.opts.NodeTTL)) {
			src.suspectUntil = now.Add(s.opts.NodeTTL)
		}
		n.blamed, n.blamedAt = src, now
	}
	s.dropGetLocked(getID, g, true)
	if dropSSDSource {
		s.dropFailedSSDSourceLocked(key, g, src)
	}
	return nil
}

// dropFailedSSDSourceLocked drops the SSD replica on src that get g failed to read
// (GetRevoke's drop_ssd_source), if the route still has it.
func (s *State) dropFailedSSDSourceLocked(key string, g *inflightGet, src *node) {
	if g.kind != common.Source_SSD || src == nil {
		return
	}
	if r := s.routes[key]; r != nil && r.putID == g.putID && r.replicas[src] != nil && r.replicas[src].ssd {
		s.clearSSDLocked(key, r, src)
		// The entry may still be on src's ring (a read that failed for another reason
		// than the record): src must forget it, and counts as its holder until it has.
		// (Queued first: the write-back redirtyLocked may start does not go to src
		// before src acked it, persistTaskLocked.)
		src.evicted.push(key, g.putID, true)
		s.redirtyLocked(key, r) // memory may hold the version, now without an SSD copy
	}
}
