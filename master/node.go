package master

import (
	"math"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// SSDInfo is what an owner declares about its local SSD cache.
type SSDInfo struct {
	Enabled       bool
	CapacityBytes int64
	UsedBytes     int64
	// MaxValueBytes is the largest value one of its rings holds (0: not reported).
	MaxValueBytes int64
}

// holds reports whether an SSD of i has room for a value of length bytes in one ring.
// checkPullsIntoLocked refuses a registration under the generation of a registration a
// pull is writing into. Owners of earlier releases keep their generation when they
// register again, so a PullPut sent to the previous registration still passes the
// owner's fence: its new pool would give the target range to another value, whose bytes
// the pull then overwrote (a review). The owner registers again once the pull ended, at
// most the pull timeout later. Owners of this release register with a new generation.
func (s *State) checkPullsIntoLocked(ref NodeRef) error {
	for _, p := range s.puts {
		if t := p.pull; t != nil && t.TargetNode == ref.ID && t.TargetGeneration == ref.Generation {
			return wire.Errorf(common.ErrorCode_UNAVAILABLE, "node %q registers again under generation %d while the master's pull of %q into its previous registration runs; register again once it ended",
				ref.ID, ref.Generation, t.Key)
		}
	}
	return nil
}

// rebaseRingsLocked takes laps whole laps off every live ring's persists assigned
// (laps: at most the fewest any ring made), so that their counts stay small; ringLaps
// differences, all that placement compares, are unchanged.
func (s *State) rebaseRingsLocked(laps float64) {
	if laps < 1 {
		return
	}
	for _, m := range s.nodes {
		if !m.tombed && m.ssd.Enabled && m.ssd.CapacityBytes > 0 {
			m.ssdAssigned -= int64(laps) * m.ssd.CapacityBytes
		}
	}
}

func (i SSDInfo) holds(length int64) bool {
	return i.CapacityBytes >= length && (i.MaxValueBytes <= 0 || i.MaxValueBytes >= length)
}

// Pin is a range an owner still has in use when it registers again (after a master
// restart): a holder an external views or an in-flight put an external writes. The
// master keeps it allocated as a holder with id PinID until the owner acks it.
type Pin struct {
	PinID  int64
	Offset int64
	Len    int64
}

// node is one owner incarnation: (id, generation). A restarted owner is a new node; the
// old one is tombed and nothing of it is reused.
type node struct {
	id          string
	generation  int64
	token       int64 // NodeRef.Token of its Register: every call naming it must carry it
	segmentSize int64
	dataAddr    string
	peerAddr    string
	ssd         SSDInfo
	lastSeen    time.Time
	tombed      bool
	// refillHoldersAtDone: an owner of an earlier release (RegisterRequest
	// remote_refill_holders false) does not ack a holder recorded at GetStart for a
	// refill from another owner's SSD: its refills get their holder at GetDone.
	refillHoldersAtDone bool

	alloc *Allocator // the memory pool: [0, xferBase)
	// xfer is the transfer area, [xferBase, landingBase or segmentSize), outside the
	// pool: source ranges of this owner's puts placed on other owners. nil when the owner
	// reserved none (every put of it is then placed on it).
	xfer     *Allocator
	xferBase int64
	// landing is the landing area, [landingBase, segmentSize), outside the pool and never
	// lent to it: the ranges of gets of values held elsewhere that are not promoted
	// (getTargetLocked). nil when the owner reserved none.
	landing     *Allocator
	landingBase int64
	policy      *evictOrder           // keys whose memory replica lives here, in eviction order
	holders     map[int64]*Allocation // holder id → the range it keeps alive (hold, unhold)
	// heldAt is the allocations holders keep, by segment offset (an allocation's range
	// is its own while it lives): a registration's pins and a report's records find the
	// pin holding their range without a walk of every holder.
	heldAt map[int64]*Allocation
	// soleHeld counts the allocations only holders keep (Allocation.soleHeld).
	soleHeld int
	allocs   int // live Allocations in this segment (leak checks)
	lent     int // live Allocations of the transfer area lent to the pool
	// borrowed is the keys whose memory replica here lies in the transfer area, in the
	// order they came (a take-back's candidates: takeBackVictimsLocked).
	borrowed keyOrder
	// sourcing counts in-flight gets that pull from this node for another one: the
	// planner prefers the replica whose owner sources the fewest.
	sourcing int
	// suspectUntil: a requester's pull from this node failed for the node's part
	// (GetRevoke source_failed) this recently; the planner prefers other replicas until
	// then (its data plane may be cut while its master link is healthy). blamed and
	// blamedAt: the last source this node, as a requester, said failed, and when.
	suspectUntil time.Time
	blamed       *node
	blamedAt     time.Time
	// dups counts the memory replicas here whose key has a memory replica on another
	// live node too (duplicates.go): an eviction looks for a duplicate to evict first
	// only while there is one; dupQuiet counts down the evictions before it looks
	// again after a search found none (allocateEvictingLocked), and dupRest is the
	// length of that rest (restFromDupSearch).
	dups     int
	dupQuiet int
	dupRest  int
	// ssdPending is the bytes of SSD persists assigned to this owner and not ended:
	// the SSD pool counts them as used until its next heartbeat catches up.
	ssdPending int64
	// ssdAssigned is the bytes of SSD persists assigned to this owner incarnation (from
	// a level start: Register), over its ring's capacity its laps: the SSD pool keeps
	// the rings of a cluster wrapping at one pace (persistNodeLocked). Failed persists
	// count too: a ring that fails every write would otherwise stay behind and draw
	// every persist of the pool.
	ssdAssigned int64
	// registrationSeq is the owner's number of the Register that made this incarnation
	// (RegisterRequest.registration_seq), answered in its heartbeats.
	registrationSeq int64
	// keys is the keys whose route has a replica here (replicaOn, dropReplica): what a
	// tomb walks instead of every route.
	keys map[string]struct{}
	// ssdReplicas counts the routes with an SSD replica here (setSSDLocked): what
	// Members reports without a walk of every route under the lock.
	ssdReplicas int64
	// evicted holds the eviction notices the owner has not acked (evictnotice.go).
	evicted evictOutbox
	// release holds the KV pages the eviction order reached while a holder kept them
	// (hotset.go): the owner is asked to let their idle hot-set holdings go.
	release releaseAsk
	// opened marks, while the rebuild window is open, every range of the pool handed
	// out since this incarnation registered: a reported record overlapping one may have
	// been written over, so it is never adopted (rebuild.go). nil otherwise.
	opened *rangeSet
	// reporting is set while the owner, registered from another master, has not sent
	// its report's last batch (during the rebuild window): no other owner's put is
	// placed on it, since any range of its pool may still hold an unreported replica.
	reporting bool
	// skippedTerm: this incarnation registered from a master before the last HA term
	// that served (Options.LastTermEpoch), which it never registered with: every record
	// it reports is refused, since that term may have deleted or overwritten it. (An
	// owner of this release reports none then; one of an earlier release does.)
	skippedTerm bool
}

// NodeRef names an owner incarnation in a request.
type NodeRef struct {
	ID         string
	Generation int64
	// Token is the owner's secret of the incarnation (mp.NodeRef.token): a call must
	// carry the one its Register carried (0 for an owner of an earlier release).
	Token int64
}

// samePin returns the holder of n (a pin registered just before) whose range in area
// is exactly r, or nil.
func samePin(n *node, area *Allocator, r Range) *Allocation {
	if h := n.heldAt[r.Offset]; h != nil && h.area == area && h.r == r {
		return h
	}
	return nil
}

// hold records holder id of n keeping a, taking over a reference the caller made.
func (n *node) hold(id int64, a *Allocation) {
	if n.holders[id] != nil {
		n.unhold(id) // (ids are never reused while held)
	}
	n.holders[id] = a
	was := a.soleHeld()
	if a.holds++; a.holds == 1 {
		n.heldAt[a.r.Offset] = a
	}
	n.soleChanged(was, a)
}

// unhold drops holder id of n and its reference; it reports whether n had it.
func (n *node) unhold(id int64) bool {
	a := n.holders[id]
	if a == nil {
		return false
	}
	delete(n.holders, id)
	was := a.soleHeld()
	if a.holds--; a.holds == 0 {
		delete(n.heldAt, a.r.Offset)
	}
	n.soleChanged(was, a)
	a.Release()
	return true
}

// soleChanged counts a in soleHeld as it became (or stopped being) held by holders
// alone; was is what it was before the change.
func (n *node) soleChanged(was bool, a *Allocation) {
	switch now := a.soleHeld(); {
	case now && !was:
		n.soleHeld++
	case was && !now:
		n.soleHeld--
	}
}

// Register admits an owner incarnation. A previous incarnation under the same id is
// tombed first (its replicas vanish). Pinned ranges are re-reserved as holders.
//
// The last landingReserve bytes of the segment (rounded down to AllocGranule) are the
// owner's landing area, the transferReserve bytes before them its transfer area, both
// outside its memory pool; the pool is the rest. The pool is what the owner's capacity
// and use report (Members, Stat, metrics): the areas only ever hold values on their way
// to another owner or a client (and the pool's borrowings of the transfer area).
func (s *State) Register(now time.Time, ref NodeRef, segmentSize, transferReserve, landingReserve int64, dataAddr, peerAddr string, ssd SSDInfo, pinned []Pin) error {
	if err := wire.ValidateNodeID(ref.ID); err != nil {
		return err
	}
	if ref.Generation == 0 {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "generation must be non-zero")
	}
	if segmentSize < AllocGranule {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "segment size %d is below %d bytes", segmentSize, AllocGranule)
	}
	// Every boundary on a granule: a segment size that is not a multiple of it loses its
	// tail once (owners size segments in pages).
	usable := segmentSize / AllocGranule * AllocGranule
	reserve := transferReserve / AllocGranule * AllocGranule
	landing := landingReserve / AllocGranule * AllocGranule
	if transferReserve < 0 || landingReserve < 0 || reserve > usable || landing > usable-reserve || usable-reserve-landing < AllocGranule {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "transfer reserve %d and landing reserve %d leave less than %d bytes of the %d-byte segment for the memory pool",
			transferReserve, landingReserve, AllocGranule, segmentSize)
	}
	end := usable - landing // the transfer area's end
	if err := s.checkAddrTakenLocked(now, ref.ID, dataAddr, peerAddr); err != nil {
		return err
	}
	if old := s.nodes[ref.ID]; old != nil {
		if err := s.checkIDTakenLocked(now, old, dataAddr, peerAddr); err != nil {
			return err
		}
	}
	if err := s.checkPullsIntoLocked(ref); err != nil {
		return err // (also after a tomb: its pull runs until the server's watch cancels it; a review)
	}
	if old := s.nodes[ref.ID]; old != nil {
		s.log.Info().Str("node", ref.ID).Int64("old_generation", old.generation).Int64("generation", ref.Generation).Msg("owner re-registered; tombing the previous incarnation")
		s.tombLocked(old)
	}
	n := &node{
		id: ref.ID, generation: ref.Generation, token: ref.Token, segmentSize: segmentSize,
		dataAddr: dataAddr, peerAddr: peerAddr, ssd: ssd, lastSeen: now,
		alloc:   NewAllocator(end - reserve),
		policy:  newEvictOrder(&s.clock, s.ghosts),
		holders: make(map[int64]*Allocation),
		heldAt:  make(map[int64]*Allocation),
		keys:    make(map[string]struct{}),
		// Numbered after every earlier incarnation's notices (State.noticeSeq).
		evicted: evictOutbox{lastSeq: s.noticeSeq},
	}
	if ssd.Enabled && ssd.CapacityBytes > 0 {
		// A new ring starts level with the ring furthest behind: it takes its share of
		// the persists from now on, not every persist until it has caught up. The rings'
		// whole laps they all made are taken off first, which keeps their order and
		// differences: rings far ahead and a large newcomer overflowed int64, and a
		// negative start drew every persist to the new ring (a review).
		if behind := s.ssdBehindLocked(0, ref.ID); behind != nil {
			s.rebaseRingsLocked(math.Floor(ringLaps(behind)))
			n.ssdAssigned = int64(ringLaps(behind) * float64(ssd.CapacityBytes))
		}
	}
	if landing > 0 {
		n.landingBase, n.landing = end, NewAllocator(landing)
	}
	if reserve > 0 {
		n.xferBase, n.xfer = end-reserve, NewAllocator(reserve)
	}
	s.nodes[ref.ID] = n
	for _, p := range pinned {
		if p.Len <= 0 || p.Offset < 0 || p.Offset%AllocGranule != 0 || p.PinID > maxCarriedID {
			s.log.Warn().Str("node", ref.ID).Int64("pin", p.PinID).Msg("ignoring malformed pinned range")
			continue
		}
		r := Range{Offset: p.Offset, Size: roundUp(p.Len, AllocGranule)}
		// Ids issued from now on exceed every pin's: a new holder never takes the id of
		// one the owner still holds and will ack.
		s.carryID(p.PinID)
		_, dup := n.holders[p.PinID]
		// A pin in the transfer area is the source range of a put an external was
		// writing (or a get's range), one in the landing area a get's range; any other is
		// in the pool.
		area, base := n.regionOf(p.Offset)
		switch rr := (Range{Offset: r.Offset - base, Size: r.Size}); {
		case dup:
			s.log.Warn().Str("node", ref.ID).Int64("pin", p.PinID).Int64("offset", p.Offset).Msg("pin id reported twice; ignored")
		case area.Reserve(rr):
			n.hold(p.PinID, newAreaAllocation(n, area, base, rr, p.Len))
		case samePin(n, area, r) != nil:
			// Exactly another pin's range: two holdings of one range (a holding kept
			// across an earlier registration, and a local hit of the same replica made
			// after it). Each id holds the range until it is acked.
			n.hold(p.PinID, samePin(n, area, r).Retain())
		default:
			s.log.Warn().Str("node", ref.ID).Int64("pin", p.PinID).Int64("offset", p.Offset).Msg("pinned range overlaps another; ignored")
		}
	}
	if s.tombstones != nil {
		// After the pins: a reported replica may share a pin's range.
		n.opened = newRangeSet()
	}
	s.log.Info().Str("node", ref.ID).Int64("generation", ref.Generation).Int64("segment", segmentSize).Int64("transfer_reserve", reserve).
		Int64("landing_reserve", landing).
		Bool("ssd", ssd.Enabled).Int("pinned", len(n.holders)).Msg("owner registered")
	return nil
}

// servingLeaseLocked is, when a Register by ref would tomb an incarnation of the same
// owner process (its token; an owner of an earlier release sends none) heard from within
// two heartbeat intervals, when that incarnation's hot-set lease ends at the latest. Such
// a Register may have been sent before the owner went back to the registration it
// tombs and served from its hot set again (its first try failed in transport, and
// landed late): writes wait out that lease, as after an invalidation given up on
// (a review: an overwrite answered at once, and the owner answered the old bytes). A
// Register from another process (a restart on the same addresses) waits for nothing:
// the one before it is gone.
func (s *State) servingLeaseLocked(now time.Time, ref NodeRef) (until time.Time, ok bool) {
	old := s.nodes[ref.ID]
	if old == nil || old.tombed || old.token != ref.Token {
		return time.Time{}, false
	}
	until = old.lastSeen.Add(2 * s.opts.HeartbeatInterval)
	return until, until.After(now)
}

// checkIDTakenLocked refuses a registration under the id of an incarnation that still
// heartbeats (within two intervals) at other addresses: two owners given the same id
// (by default both are named after the host) would otherwise tomb each other on every
// registration. A restarted owner is admitted once its predecessor fell silent.
func (s *State) checkIDTakenLocked(now time.Time, old *node, dataAddr, peerAddr string) error {
	if old.dataAddr == dataAddr && old.peerAddr == peerAddr {
		return nil // the same owner registering again
	}
	if silent := now.Sub(old.lastSeen); silent <= 2*s.opts.HeartbeatInterval {
		return wire.Errorf(common.ErrorCode_ALREADY_EXISTS,
			"node id %q is held by a live owner (generation %d, peer %s, data %s, heard from %v ago): give each owner its own --node-id",
			old.id, old.generation, old.peerAddr, old.dataAddr, silent.Round(time.Millisecond))
	}
	return nil
}

// checkAddrTakenLocked refuses a registration naming the peer or data address of
// another live owner: the master would send that owner's calls (and its proofs, which
// name the node) to the wrong node, and a member could make another owner's master
// calls fail that way (docs/architecture.md §11). An owner silent for over two heartbeat intervals
// may have restarted on the same address under another id.
func (s *State) checkAddrTakenLocked(now time.Time, id, dataAddr, peerAddr string) error {
	for _, n := range s.nodes {
		if n.id == id || now.Sub(n.lastSeen) > 2*s.opts.HeartbeatInterval {
			continue
		}
		if (peerAddr != "" && n.peerAddr == peerAddr) || (dataAddr != "" && n.dataAddr == dataAddr) {
			return wire.Errorf(common.ErrorCode_ALREADY_EXISTS,
				"peer address %s / data address %s: live owner %q (peer %s, data %s) already registered it; each owner needs its own addresses",
				peerAddr, dataAddr, n.id, n.peerAddr, n.dataAddr)
		}
	}
	return nil
}

// Notices are the eviction notices a heartbeat reply carries (evictnotice.go).
type Notices struct {
	Evicted     []*common.KeyVersion // memory replicas evicted
	EvictedSeqs []int64              // the sequence number of each of Evicted
	SSDDropped  []*common.KeyVersion // SSD entries no longer routed to
	Seq         int64                // the last notice's sequence number
	More        bool                 // more wait: the owner heartbeats again at once
	// RegistrationSeq is the owner's number of the Register that made this incarnation.
	RegistrationSeq int64
	// Pool is the owner's memory pool (Members' MemorySegment), which Heartbeat sends
	// along so the owner's metrics need no call of their own.
	Pool *common.CapacityStat
}

// Heartbeat refreshes an owner's liveness and SSD figures, takes its ack of the
// eviction notices up to evictAck (0: none) and returns those still unacked (at most
// evictNoticeBatch).
func (s *State) Heartbeat(now time.Time, ref NodeRef, ssd SSDInfo, evictAck int64) (Notices, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return Notices{}, err
	}
	n.lastSeen = now
	n.ssd = ssd
	n.evicted.ack(evictAck)
	ns := n.evicted.pending()
	ns.RegistrationSeq = n.registrationSeq
	ns.Pool = n.poolStat()
	return ns, nil
}

// SetRegistrationSeq records the owner's number of the Register that made the
// incarnation ref names (RegisterRequest.registration_seq), answered in its heartbeats
// (Notices.RegistrationSeq).
func (s *State) SetRegistrationSeq(ref NodeRef, seq int64) {
	if n, err := s.nodeLocked(ref); err == nil {
		n.registrationSeq = seq
	}
}

// nodeLocked finds the live incarnation ref names, or STALE_GENERATION.
func (s *State) nodeLocked(ref NodeRef) (*node, error) {
	n := s.nodes[ref.ID]
	// A wrong token is answered as an unknown generation: it tells the sender nothing.
	if n == nil || n.generation != ref.Generation || n.token != ref.Token {
		return nil, wire.Errorf(common.ErrorCode_STALE_GENERATION, "node %q generation %d is not registered with this master: register again", ref.ID, ref.Generation)
	}
	return n, nil
}

// reportedNodeLocked is nodeLocked for a call that may allocate in the owner's pool or
// read its routes: refused (UNAVAILABLE, to retry) while the owner's replica report is
// incomplete, since any range of its pool may still hold a replica the master has not
// adopted, and its keys may not be routed yet (a get would miss).
func (s *State) reportedNodeLocked(ref NodeRef) (*node, error) {
	n, err := s.nodeLocked(ref)
	if err == nil && n.reporting {
		return nil, wire.Errorf(common.ErrorCode_UNAVAILABLE, "node %q is still reporting its replicas to this master; retry", ref.ID)
	}
	return n, err
}

// tombLocked removes an owner incarnation: its replicas vanish from routes, its
// holders and in-flight operations are dropped, and its allocator is discarded.
func (s *State) tombLocked(n *node) {
	n.tombed = true
	s.noticeSeq = max(s.noticeSeq, n.evicted.lastSeq)
	delete(s.nodes, n.id)
	n.policy.Detach()
	// The node's own keys, not every route: a master of millions of routes tombed an
	// owner (a re-registration, a missed TTL) in seconds under its lock, past the
	// owner's bound on Register, which then failed at every attempt.
	for key := range n.keys {
		r := s.routes[key]
		if r == nil {
			continue // never: keysDrift checks it
		}
		if rep := r.replicas[n]; rep != nil {
			writingBack := rep.memory != nil && s.writingBackLocked(r, n)
			if rep.memory != nil {
				s.copyChangedLocked(key, r, n, -1)
				rep.memory.Release()
			}
			dropReplica(key, r, n)
			if len(r.replicas) == 0 {
				s.unsetRouteLocked(key)
				s.tombstoneLocked(key, r.putID)
			}
			switch {
			case rep.dirty:
				s.unwrittenLocked(key, r, n)
			case writingBack && len(r.replicas) == 0:
				// The write-back in flight reads the copy that just went, and no other is
				// left to take it over (with one, writeBackDoneLocked hands it on).
				s.persistCount(n.id).unwritten++
			case rep.ssd && len(r.replicas) > 0:
				// The version's SSD copy went with n while memory elsewhere still holds
				// it: as when a ring overwrites the record, it is dirty again.
				s.redirtyLocked(key, r)
			}
		}
	}
	for id := range n.holders {
		n.unhold(id)
	}
	for id, p := range s.puts {
		if p.node == n {
			// A put whose target owner is pulling it keeps its ranges until the pull
			// answers (the target may still be writing); PullDone frees them.
			s.revokePutLocked(id, p)
		}
		// A put placed on n that is not being pulled is placed again at PutDone; one
		// being pulled is placed again when the server's pull call, cancelled by this
		// tomb, ends in PullDone.
	}
	s.unquarantineLocked(n)
	for id, g := range s.gets {
		switch {
		case g.node == n:
			s.dropGetLocked(id, g, true)
		case g.sourceNode == n:
			// The requester lives and may still be pulling into its target: the target
			// stays allocated until the requester revokes (its pull fails, the source
			// is gone) or completes the get. Only the dead source's range goes, and a
			// memory pull's bytes are not trusted any more (sourceLost).
			g.sourceLost = g.source != nil
			s.unsourceLocked(g)
		}
	}
	for id, pp := range s.persists {
		if pp.node == n {
			// The memory replica is gone: the persist (here or on the SSD pool's
			// owner, whose pull now fails) cannot complete. A write-back passes to
			// another memory copy of the page, if there is one.
			s.endPersistLocked(id, pp, false)
			if pp.writeBack {
				s.writeBackDoneLocked(id, pp, false)
			} else {
				pp.alloc.Release()
			}
		}
	}
}

// liveOwnerLocked reports whether owner id is registered and not tombed: at addr
// unless addr is "", in generation gen unless gen is 0.
func liveOwnerLocked(st *State, id string, gen int64, addr string) bool {
	n := st.nodes[id]
	return n != nil && !n.tombed && (gen == 0 || n.generation == gen) && (addr == "" || n.peerAddr == addr)
}

// regionOf is the allocator that segment offset off belongs to — the landing area, the
// transfer area or the pool — and the segment offset of its offset 0.
func (n *node) regionOf(off int64) (area *Allocator, base int64) {
	switch {
	case n.landing != nil && off >= n.landingBase:
		return n.landing, n.landingBase
	case n.xfer != nil && off >= n.xferBase:
		return n.xfer, n.xferBase
	}
	return n.alloc, 0
}
