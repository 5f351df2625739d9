package master

import (
	"math"
	"sort"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// State is the master's deterministic core: routes, allocators, eviction, in-flight
// operations, holders and membership. It is not safe for concurrent use; Server wraps
// it with one mutex. Time comes in as an argument so scenarios replay exactly.
type State struct {
	// syncPending counts, per owner incarnation and key, the Sync invalidations handed
	// out and not yet confirmed (SyncDoneLocked): that owner may still serve the dropped
	// version from its hot set, so a later delete or overwrite of the key must wait for it
	// too, though the version it holds is no longer the route's.
	syncPending map[syncTarget]int
	opts        Options
	log         zerolog.Logger
	nodes       map[string]*node
	routes      map[string]*route
	// memoryValues counts the routes with a live memory replica, duplicateBytes the bytes
	// of their other memory replicas (countCopyLocked): what MemoryValues reports
	// without a walk of every route under the lock.
	memoryValues, duplicateBytes int64
	puts                         map[int64]*inflightPut
	// putsOfKey counts the puts in flight of each key; droppedPutID is, for those keys,
	// the highest put_id whose route was dropped meanwhile (putorder.go).
	putsOfKey    map[string]int32
	droppedPutID map[string]int64
	gets         map[int64]*inflightGet
	persists     map[int64]*pendingPersist // put id → replica waiting for its SSD persist
	persistSeq   int64                     // numbers the persist tasks (PersistTask.ID)
	// writeBacks are the write-back persists started under the lock, for the server to
	// submit after it (writeback.go).
	writeBacks []*PersistTask
	// writingBack counts the write-backs started and not ended (writeback.go).
	writingBack int
	// namespaces indexes the routed keys by namespace (namespace.go); only
	// setRouteLocked and unsetRouteLocked change routes, and they keep it in step.
	namespaces map[string]*namespace
	// persistStats counts persists per owner id (Members).
	persistStats map[string]*persistCounts
	// quarantine holds the targets of pulls whose answer never came (the call failed
	// in transport): the target owner may still be writing them until its transfer
	// deadline, so they are freed only after the pull timeout, or at its tomb.
	quarantine []quarantined
	nextID     int64 // put, get and holder ids share one increasing counter
	carriedID  int64 // the highest id owners brought from earlier masters (pins, reported records): carryID
	// noticeSeq is the highest eviction-notice sequence number any tombed incarnation
	// used: a new incarnation numbers its notices after it, so an owner's heartbeat
	// that acks a previous incarnation's numbering (sent before it registered again
	// with this master, same epoch) acks none of the new one's (evictnotice.go).
	noticeSeq int64
	// tombstones, while the rebuild window is open (until rebuildUntil), map each key
	// whose versions were dropped or deleted to the highest such version (rebuild.go);
	// nil once the window closed, or when none was opened.
	tombstones map[string]int64
	// nsTombstones: the namespaces deleted while the rebuild window is open; a reported
	// key of one is refused, as a key's tombstone refuses its versions (rebuild.go).
	nsTombstones map[string]bool
	rebuildUntil time.Time
	// spareHeld, set by the server for an allocation's first attempt, keeps eviction
	// from taking a sole copy while a held duplicate could go instead once its holder is
	// released: the attempt fails with NO_SPACE, the server asks the owners for their
	// idle hot sets (whose holdings are most such holders) and retries without it.
	spareHeld bool
	// short is the last allocation that failed with NO_SPACE.
	short shortage
	// releasesDue: an eviction asked an owner for hot-set pages (Server.withState sends).
	releasesDue bool
	// children maps a KV page's key to the routed keys put with it as their parent
	// (chain.go); kept in step with routes by setRouteLocked and unsetRouteLocked.
	children map[string]childKeys
	// clock ticks once per insert or hit in any node's eviction order (evictOrder), so
	// the orders of different nodes rank on one scale.
	clock int64
	// ghosts remembers the KV pages evicted on any node (pageghost.go).
	ghosts *pageGhosts
}

// shortage names an allocation that found no space: length bytes for a request of
// nodeID (placed there, or, with pooled placement, anywhere, unless local: a get's
// target, which only nodeID's segment can take).
type shortage struct {
	nodeID string
	bytes  int64
	local  bool
}

// NewState returns an empty master state.
func NewState(opts Options) *State {
	opts.setDefaults()
	return &State{
		opts:         opts,
		log:          *opts.Logger,
		nodes:        make(map[string]*node),
		routes:       make(map[string]*route),
		namespaces:   make(map[string]*namespace),
		puts:         make(map[int64]*inflightPut),
		putsOfKey:    make(map[string]int32),
		droppedPutID: make(map[string]int64),
		gets:         make(map[int64]*inflightGet),
		persists:     make(map[int64]*pendingPersist),
		persistStats: make(map[string]*persistCounts),
		children:     make(map[string]childKeys),
		ghosts:       newPageGhosts(),
		nextID:       opts.IDBase,
		persistSeq:   opts.IDBase, // each term's apart, as its ids: an old term's commit never names a new term's persist
	}
}

// maxCarriedID bounds the ids an owner may report (a pin, a record): above it the
// counter would leave the master less than a term's range of ids to issue (a review: one
// pin of MaxInt64 wrapped it, every later put id was negative, and each overwrite was
// taken for an older version and dropped). A pin or record past it is refused.
const maxCarriedID = math.MaxInt64 - 1<<idEpochShift

// carryID raises the id counter past id, one an owner reported (a pin, a record): ids
// issued from now on exceed it. One above the counter came from an earlier master
// (carriedID); one at most the counter may be this master's own (an owner that
// registered again pins a holder it issued), which counts as issued.
func (s *State) carryID(id int64) {
	if id > s.nextID {
		s.nextID = id
		s.carriedID = max(s.carriedID, id)
	}
}

func (s *State) newID() int64 {
	s.nextID++
	return s.nextID
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// allocateLocked finds length bytes in n's pool, evicting older memory replicas of n
// while the allocator has no fitting range: duplicates first (a replica whose key has
// another live memory replica), then the transfer area's idle room is borrowed
// (borrowLocked), and a sole copy is evicted only when neither made room. It returns
// nil when nothing is left to evict: the caller waits for holders to be released
// (bounded) or fails with NO_SPACE.
func (s *State) allocateLocked(n *node, length int64) *Allocation {
	return s.allocateEvictingLocked(n, length, evictSoleCopies)
}

// evictDepth says how far an allocation goes to make room in a full pool.
type evictDepth int

const (
	evictDuplicates evictDepth = iota // evict duplicates only
	evictBorrowing                    // then borrow the idle transfer area
	evictSoleCopies                   // then evict sole copies
)

// allocateEvictingLocked is allocateLocked, going no further than depth; it fails when
// that does not make room.
func (s *State) allocateEvictingLocked(n *node, length int64, depth evictDepth) *Allocation {
	soleCopies := depth >= evictSoleCopies
	// Evicting never creates a duplicate: once none is found, stop looking. A node with
	// none (n.dups) is not searched at all, and one whose search found none is searched
	// again after dupRescan more evictions here, or as soon as a replica report brings
	// one (countCopyLocked, adoptLocked): a search that finds nothing costs victimScanLimit draws from
	// the order, and a full pool allocates with evictions all the time.
	dups := n.dups > 0 && n.dupQuiet == 0
	fitChecked := false
	passRounds := 0
	// The held replicas met so far: each is asked about or passed once an allocation,
	// though the duplicate search and the sole copies' both meet it, and the draws after
	// an eviction or a pass meet it again.
	var heldSeen map[string]bool
	for {
		if r, ok := n.alloc.Alloc(length); ok {
			return newAllocation(n, r, length)
		}
		var key string
		var ok bool
		// A replica a holder keeps (an external's, or an owner's hot set) is passed
		// over: evicting it would free nothing until the holder goes. It is passed (Pass) so
		// the policy moves it on instead of drawing it first again; when only held
		// replicas are left the caller waits for holders (and the server asks the
		// owners to give back idle ones). A KV page is first left in its place and
		// its owner asked to let an idle hot-set holding of it go (releaseAsk), so the
		// hot set does not overrule the page order; it is passed only when it is still
		// held after the owner answered.
		var held []string
		// A dirty page (writeback.go) is skipped, not passed, once its write-back started
		// (evicted only when no owner can persist it), and so is one being written back
		// (its range is free once written) and one whose refresh started; a dirty
		// duplicate goes, and the other copy takes its write-back over.
		check := func(k string, dup bool) bool {
			r := s.routes[k]
			switch {
			case r.replicas[n].dirty && !dup && s.writeBackNowLocked(k, n):
				return false
			case r.replicas[n].refresh && !dup && s.refreshNowLocked(k, r, n):
				return false
			case s.writingBackLocked(r, n):
				return false
			case s.heldReplicaLocked(r, n):
				if !heldSeen[k] {
					if heldSeen == nil {
						heldSeen = make(map[string]bool)
					}
					heldSeen[k] = true
					held = append(held, k)
				}
				return false
			}
			return true
		}
		free := func(k string) bool { return check(k, false) }
		if dups {
			heldDup := false
			key, ok = n.policy.VictimWhereStill(func(k string) bool { // reads only
				if !s.duplicateLocked(k, n) {
					return false
				}
				if !check(k, true) {
					heldDup = true
					return false
				}
				return true
			}, victimScanLimit)
			switch dups = ok; {
			case ok:
				n.dupRest = 0
			case !heldDup:
				// (A held duplicate may be released any time: it keeps the search on.)
				restFromDupSearch(n)
			}
		}
		if !ok && depth >= evictBorrowing {
			if a := s.borrowLocked(n, length); a != nil {
				s.passHeldLocked(n, held)
				return a
			}
		}
		if !ok && s.spareHeld && len(held) > 0 {
			soleCopies = false // held duplicates were passed over: wait for them instead
		}
		if !ok && soleCopies && !fitChecked && (length > n.alloc.Capacity()/largeAlloc || n.alloc.FreeBytes() >= roundUp(length, AllocGranule)) {
			// A large value, or one whose bytes are free but in ranges too small (held
			// ranges between them): evict sole copies only when that can make its room.
			fitChecked = true
			if !s.poolFitsLocked(n, length) {
				s.passHeldLocked(n, held)
				return nil
			}
		}
		if !ok && soleCopies {
			key, ok = n.policy.VictimWhere(free, victimScanLimit)
		}
		passed := s.passHeldLocked(n, held)
		if !ok {
			if passed > 0 && soleCopies && passRounds < maxPassRounds {
				// The held replicas drawn moved on: the next draw reaches past them.
				passRounds++
				continue
			}
			return nil
		}
		s.evictMemoryLocked(n, key, dups)
		if !dups && n.dupQuiet > 0 {
			n.dupQuiet--
		}
	}
}

// largeAlloc: an allocation of more than 1/largeAlloc of a pool checks that evicting can
// make its room before it evicts a sole copy (poolFitsLocked, O(replicas of the node)).
// A smaller one is checked only once the pool has its bytes free, in ranges too small
// for it (else held ranges between the ranges evictions free could make it evict every
// replica for nothing): checking every one would cost every put into a full pool. It
// may evict about its own bytes for nothing before the check (they come free in
// ranges too small); a pool of values of one size (KV pages) never checks, since any
// free range there holds one.
const largeAlloc = 8

// poolFitsLocked reports whether evicting every memory replica of n's pool that an
// eviction could free (referenced by the replica alone: not held, not the source of a
// transfer; not being written back) would leave a free range of length bytes. Held
// ranges, in-flight puts and gets and pins can split the pool so that no eviction
// makes the room: evicting its sole copies would then lose them for nothing. It stops
// at the first replica whose range, freed, makes a free range that long: a walk of
// every replica of the pool per put cost a fragmented pool of 400,000 values of mixed
// sizes 0.65 s a put under the lock.
func (s *State) poolFitsLocked(n *node, length int64) bool {
	need := roundUp(length, AllocGranule)
	if n.alloc.Fits(need) {
		return true
	}
	fits := false
	var freed []Range
	n.policy.each(func(k string) bool {
		r := s.routes[k]
		rep := r.replicas[n]
		if rep == nil || rep.memory == nil {
			return true
		}
		a := rep.memory
		if a.area != n.alloc || a.refs != 1 || s.writingBackLocked(r, n) {
			return true
		}
		rg := Range{Offset: a.r.Offset - a.base, Size: a.r.Size}
		n.alloc.Free(rg)
		freed = append(freed, rg)
		fits = n.alloc.FreeAround(rg.Offset) >= need // only the range it joined grew
		return !fits
	})
	for _, rg := range freed {
		if !n.alloc.Reserve(rg) {
			panic("BUG: a pool range freed for a fit check cannot be reserved again")
		}
	}
	return fits
}

// passHeldLocked lets the eviction order move on past the held replicas an eviction
// drew (see allocateEvictingLocked); a KV page's owner is asked to release it first.
// It returns how many it passed (the others wait for their owner's answer).
func (s *State) passHeldLocked(n *node, held []string) (passed int) {
	for _, k := range held {
		keep := false
		if n.policy.IsPage(k) {
			var queued bool
			keep, queued = n.release.ask(k)
			s.releasesDue = s.releasesDue || queued
		}
		if !keep {
			n.policy.Pass(k)
			passed++
		}
	}
	return passed
}

// maxPassRounds bounds the draws again of one allocation after a draw found only held
// replicas and passed them (each draw takes at most victimScanLimit): past it, the
// allocation fails for its caller to retry, as when every replica is held.
const maxPassRounds = 4

// evictMemoryLocked drops n's memory replica of key, which the eviction order has just
// handed out as its victim.
func (s *State) evictMemoryLocked(n *node, key string, duplicate bool) {
	r := s.routes[key]
	if r == nil || r.replicas[n] == nil || r.replicas[n].memory == nil {
		panic("BUG: eviction policy names a key without a memory replica on its node")
	}
	rep := r.replicas[n]
	dirty := rep.dirty
	rep.dirty = false
	s.copyChangedLocked(key, r, n, -1)
	rep.memory.Release()
	rep.memory = nil
	n.release.forget(key)
	n.evicted.push(key, r.putID, false)
	s.pruneLocked(key, r, n)
	if dirty {
		s.unwrittenLocked(key, r, n)
	}
	s.writeAheadLocked(n)
	s.log.Debug().Str("node", n.id).Str("key", key).Bool("duplicate", duplicate).Msg("evicted memory replica")
}

// victimScanLimit bounds how many of a node's eviction candidates (in the policy's
// order) are examined for a duplicate before a sole copy is evicted instead: a node
// whose oldest victimScanLimit candidates are all sole copies is treated as having no
// evictable duplicate. It keeps an eviction O(victimScanLimit), not O(replicas).
const victimScanLimit = 256

// dupRescan is how many sole copies a node evicts without searching for a duplicate,
// the one after a search of its oldest victimScanLimit candidates that found none
// included (unless a duplicate appears there first), after a search that found one;
// each search in a row that finds none doubles that rest, up to maxDupRest. A
// duplicate enters the window at its end (a copy is new in both orders: countCopyLocked)
// and moves up one place per eviction, so any rest shorter than the window finds it
// before it is the oldest. (On the 3-owner trace replay 1,500 searches a run found 4
// duplicates, and the searches took an eighth of the master's CPU.)
const (
	dupRescan  = 32
	maxDupRest = victimScanLimit - dupRescan
)

// restFromDupSearch starts n's rest after a search that found no duplicate: twice the
// last one, within dupRescan..maxDupRest.
func restFromDupSearch(n *node) {
	n.dupRest = min(max(2*n.dupRest, dupRescan), maxDupRest)
	n.dupQuiet = n.dupRest
}

// endDupRest makes n's next eviction search for a duplicate, and its next rest the
// shortest: one may be among its oldest candidates now.
func endDupRest(n *node) {
	n.dupQuiet, n.dupRest = 0, 0
}

// heldLocked reports whether n's memory replica of key is kept by a holder too.
func (s *State) heldLocked(key string, n *node) bool {
	r := s.routes[key]
	return r != nil && s.heldReplicaLocked(r, n)
}

// heldReplicaLocked is heldLocked of route r.
func (s *State) heldReplicaLocked(r *route, n *node) bool {
	a := r.memoryReplica(n)
	if a == nil {
		return false
	}
	refs := a.refs
	if s.writingBackLocked(r, n) {
		refs-- // the write-back's own
	}
	return refs > 1
}

// noSpaceLocked is the error for a full segment; Server retries it for a bounded time.
// It remembers the request (short) for the server's ReleaseHotSet.
func (s *State) noSpaceLocked(n *node, length int64) error {
	s.short = shortage{nodeID: n.id, bytes: length}
	return wire.Errorf(common.ErrorCode_NO_SPACE, "no space for %d bytes in the segment of node %q: total %d, free %d, largest free range %d",
		length, n.id, n.alloc.Capacity(), n.alloc.FreeBytes(), n.alloc.LargestFree())
}

// Delete removes a key. It returns whether the key existed, the put id of the version
// it removed (0: no route), and the owners whose cached info must be invalidated.
func (s *State) Delete(ref NodeRef, key string) (existed bool, putID int64, invs []Invalidation, err error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return false, 0, nil, err
	}
	if err := wire.ValidateKey(key); err != nil {
		return false, 0, nil, err
	}
	existed, putID, invs = s.deleteLocked(n, key)
	return existed, putID, invs, nil
}

// deleteLocked is Delete of a valid key for the requester n.
func (s *State) deleteLocked(n *node, key string) (existed bool, putID int64, invs []Invalidation) {
	r := s.routes[key]
	if r == nil {
		// Nothing known; an owner may still hold an evicted version (an unacked
		// eviction notice), or, while the rebuild window is open, report one later:
		// whatever it reports is older than this delete.
		s.tombstoneLocked(key, math.MaxInt64)
		for _, iv := range s.invalidationsLocked(n, key, s.nextID, nil) {
			if iv.Sync {
				invs = append(invs, iv)
			}
		}
		return false, 0, invs
	}
	existed = r.readable()
	holders := s.holdersLocked(key, r)
	s.dropRouteLocked(key, r)
	upTo := r.putID
	if s.tombstones != nil {
		// While the rebuild window is open, an owner may still report a version newer
		// than the route's (one it copied before the old master died): whatever it
		// reports is older than this delete.
		s.tombstoneLocked(key, math.MaxInt64)
		upTo = s.nextID
	}
	return existed, r.putID, s.invalidationsLocked(n, key, upTo, holders)
}

// Exists reports whether a key has a readable replica.
func (s *State) Exists(ref NodeRef, key string) (bool, error) {
	if _, err := s.nodeLocked(ref); err != nil {
		return false, err
	}
	if err := wire.ValidateKey(key); err != nil {
		return false, err
	}
	r := s.routes[key]
	return r != nil && r.readable(), nil
}

// Invalidation asks an owner to drop its cached info, replica records and SSD entries
// of key (any version ≤ PutID). Sync marks an owner that may hold such a version in
// its replica index: the delete or overwrite is answered only once it confirmed (or,
// unreachable, was tombed), so a master restart right after cannot bring the version
// back from its report. The others are told in the background.
type Invalidation struct {
	NodeID     string
	PeerAddr   string
	Generation int64
	Key        string
	PutID      int64
	Sync       bool
}

// invalidationsLocked lists the live owners other than the requester (it drops its own
// records before it replies, and answers the key from none of them while its write is
// out: daemon ownerState.writing); holders (holdersLocked of the dropped route) and owners
// with an unacked eviction notice of key are Sync.
func (s *State) invalidationsLocked(requester *node, key string, putID int64, holders map[*node]bool) []Invalidation {
	var out []Invalidation
	for _, n := range s.nodes {
		if n != requester && n.peerAddr != "" {
			iv := Invalidation{NodeID: n.id, PeerAddr: n.peerAddr, Generation: n.generation, Key: key, PutID: putID,
				Sync: holders[n] || n.evicted.has(key) || s.syncPending[syncTarget{n.id, n.generation, key}] > 0}
			s.pendSyncLocked(iv)
			out = append(out, iv)
		}
	}
	return out
}

// syncTarget names one owner incarnation's pending Sync invalidation of a key.
type syncTarget struct {
	nodeID string
	gen    int64
	key    string
}

// pendSyncLocked records a Sync invalidation handed out (no-op for others); the server
// ends it with SyncDoneLocked once the owner confirmed it or was given up on.
func (s *State) pendSyncLocked(iv Invalidation) {
	if !iv.Sync {
		return
	}
	if s.syncPending == nil {
		s.syncPending = make(map[syncTarget]int)
	}
	s.syncPending[syncTarget{iv.NodeID, iv.Generation, iv.Key}]++
}

// SyncDoneLocked ends a Sync invalidation of key recorded by pendSyncLocked.
func (s *State) SyncDoneLocked(nodeID string, gen int64, key string) {
	k := syncTarget{nodeID, gen, key}
	if s.syncPending[k] <= 1 {
		delete(s.syncPending, k)
		return
	}
	s.syncPending[k]--
}

// holdersLocked is the set of owners whose replica index may hold a version of key
// that route r (about to be dropped) describes: its replicas' owners and the owner of a
// pending SSD persist of it.
func (s *State) holdersLocked(key string, r *route) map[*node]bool {
	h := make(map[*node]bool, len(r.replicas)+1)
	for n := range r.replicas {
		h[n] = true
	}
	if pp := s.persists[r.putID]; pp != nil && pp.key == key {
		h[pp.ssdNode] = true
	}
	return h
}

// BatchDeleteAck releases holders the owner no longer needs and refreshes the keys it
// served from its hot set (touched) in its eviction order. It returns how many ids were
// unknown (already released, or never issued to this owner).
func (s *State) BatchDeleteAck(ref NodeRef, holderIDs []int64, touched []string) (int, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return 0, err
	}
	live := touched[:0:0]
	for _, k := range touched {
		if r := s.routes[k]; r != nil && r.memoryReplica(n) != nil {
			live = append(live, k)
		}
	}
	n.policy.TouchAll(live)
	unknown := 0
	for _, id := range holderIDs {
		if !n.unhold(id) {
			unknown++
		}
	}
	return unknown, nil
}

// SsdReplicaCommit publishes an SSD replica only if the key still has that put_id and
// the node is live and either still holds the memory replica or is the owner the SSD
// pool chose for this put's persist (which is pending); a late or stale commit is
// ignored, and so is one of a version n was told to forget (an unacked SSD-drop
// notice). A commit that names its persist (persistID, not 0) is published only while
// that persist is the version's pending one, memory copy or not: a persist ended at its
// source's tomb read a range that source, alive and registered again, may have given to
// another value (a review). It reports whether the commit was published.
func (s *State) SsdReplicaCommit(ref NodeRef, key string, putID, length, seq, persistID int64) (bool, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return false, err
	}
	r := s.routes[key]
	if r == nil || r.putID != putID || length != r.len {
		return false, nil
	}
	if persistID != 0 {
		if pp := s.persists[putID]; pp == nil || pp.task == nil || pp.task.ID != persistID || pp.ssdNode != n || pp.key != key {
			return false, nil
		}
	} else if r.memoryReplica(n) == nil {
		if pp := s.persists[putID]; pp == nil || pp.ssdNode != n || pp.key != key {
			return false, nil
		}
	}
	if n.evicted.names(key, putID, true) {
		// n is told to forget its entry of this version (a failed read dropped it while
		// a refresh rewrote it there): applied after this commit, the notice drops the
		// new record too. Unpublished, n forgets it now.
		return false, nil
	}
	rep := replicaOn(key, r, n)
	setSSD(n, rep, true)
	rep.ssdLen, rep.ssdSeq = length, seq
	if pp := s.persists[putID]; pp != nil && pp.ssdNode == n && pp.key == key && (persistID == 0 || pp.task != nil && pp.task.ID == persistID) {
		pp.committed = true
	}
	s.cleanLocked(key, r)
	return true, nil
}

// BatchSsdReplicaEvict clears SSD replicas the owner's rings overwrote; seqs[i] (0 or
// missing: unknown) numbers entries[i]'s record, and a replica recorded with a higher
// number (a rewrite of the version committed while the report was on its way) stays.
// It is refused (UNAVAILABLE: the owner sends it again) while the owner reports its
// replicas: an eviction of a record not adopted yet would be lost, and the record
// adopted after it.
func (s *State) BatchSsdReplicaEvict(ref NodeRef, entries []*common.KeyVersion, seqs []int64) error {
	n, err := s.reportedNodeLocked(ref)
	if err != nil {
		return err
	}
	for i, e := range entries {
		if e == nil {
			continue
		}
		var seq int64
		if i < len(seqs) {
			seq = seqs[i]
		}
		if r := s.routes[e.Key]; r != nil && r.putID == e.PutId {
			if rep := r.replicas[n]; rep != nil && seq != 0 && seq < rep.ssdSeq {
				// An older record than the one recorded: a rewrite's, committed while
				// this report was on its way, lives on. (A newer one evicted means the
				// recorded one died too: a rewrite replaces the record it rewrites.)
				continue
			}
			s.clearSSDLocked(e.Key, r, n)
			s.redirtyLocked(e.Key, r)
		}
	}
	return nil
}

// Forgive moves the silence clock of every registered owner on by shut, up to now: they
// could not reach a master whose gate was shut that long (an HA leader cut off from
// etcd).
func (s *State) Forgive(shut time.Duration, now time.Time) {
	for _, n := range s.nodes {
		if n.lastSeen = n.lastSeen.Add(shut); n.lastSeen.After(now) {
			n.lastSeen = now
		}
	}
}

// Maintain tombs owners silent for longer than the node TTL and revokes in-flight
// operations past their deadline. It returns the ids of the tombed owners.
func (s *State) Maintain(now time.Time) []string {
	var tombed []string
	for _, n := range s.nodes {
		if now.Sub(n.lastSeen) > s.opts.NodeTTL {
			tombed = append(tombed, n.id)
		}
	}
	sort.Strings(tombed)
	for _, id := range tombed {
		s.log.Warn().Str("node", id).Dur("ttl", s.opts.NodeTTL).Msg("owner missed its heartbeats; tombed")
		s.tombLocked(s.nodes[id])
	}
	for id, p := range s.puts {
		if now.After(p.deadline) && !p.revoked {
			s.log.Warn().Str("key", p.key).Int64("put_id", id).Bool("pulling", p.pull != nil).Msg("in-flight put expired; revoked")
			s.revokePutLocked(id, p)
		}
	}
	s.releaseQuarantineLocked(now)
	s.closeRebuildLocked(now)
	for id, g := range s.gets {
		if now.After(g.deadline) {
			s.log.Warn().Str("key", g.key).Int64("get_id", id).Msg("in-flight get expired; revoked")
			s.dropGetLocked(id, g, false)
		}
	}
	return tombed
}

// poolStat is the node's memory pool's capacity and use (MemberStat.MemorySegment).
func (n *node) poolStat() *common.CapacityStat {
	return &common.CapacityStat{CapacityBytes: n.alloc.Capacity(), UsedBytes: n.alloc.Used()}
}

// Members describes every live owner. MemorySegment is the owner's memory pool (its
// segment less the transfer and landing areas, which hold values on their way
// elsewhere, and what the pool borrows of the transfer area).
func (s *State) Members() []*common.MemberStat {
	out := make([]*common.MemberStat, 0, len(s.nodes))
	pending := make(map[*node]int64)
	for _, pp := range s.persists {
		pending[pp.ssdNode]++
	}
	for _, n := range s.nodes {
		out = append(out, &common.MemberStat{
			NodeId:             n.id,
			Generation:         n.generation,
			MemorySegment:      n.poolStat(),
			KvSsd:              &common.CapacityStat{CapacityBytes: n.ssd.CapacityBytes, UsedBytes: n.ssd.UsedBytes},
			Alive:              true,
			DataAddr:           n.dataAddr,
			PeerAddr:           n.peerAddr,
			MemoryReplicas:     int64(n.policy.Len()),
			SsdReplicas:        n.ssdReplicas,
			Holders:            int64(len(n.holders)),
			SsdPersists:        s.persistCount(n.id).asked,
			SsdPersistsDropped: s.persistCount(n.id).dropped,
			SsdPersistsPending: pending[n],
			SsdUnwritten:       s.persistCount(n.id).unwritten,
		})
		if n.xfer != nil {
			m := out[len(out)-1]
			m.TransferArea = &common.CapacityStat{CapacityBytes: n.xfer.Capacity(), UsedBytes: n.xfer.Used()}
			m.TransferAreaReplicas = int64(n.borrowed.len())
		}
		if n.landing != nil {
			out[len(out)-1].LandingArea = &common.CapacityStat{CapacityBytes: n.landing.Capacity(), UsedBytes: n.landing.Used()}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NodeId < out[j].NodeId })
	return out
}

// Keys is the number of routes.
func (s *State) Keys() int { return len(s.routes) }

// PutsInFlight is the number of puts between PutStart and PutDone/PutRevoke.
func (s *State) PutsInFlight() int { return len(s.puts) }

// GetsInFlight is the number of gets between GetStart and GetDone/GetRevoke.
func (s *State) GetsInFlight() int { return len(s.gets) }

// MemoryValues counts the keys with at least one live memory replica (the distinct
// values the pool holds) and the bytes of their other memory replicas (duplicates:
// promoted copies), by segment bytes.
func (s *State) MemoryValues() (values, duplicateBytes int64) {
	return s.memoryValues, s.duplicateBytes
}
