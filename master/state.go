package master

import (
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
	opts     Options
	log      zerolog.Logger
	nodes    map[string]*node
	routes   map[string]*route
	puts     map[int64]*inflightPut
	gets     map[int64]*inflightGet
	persists map[int64]*pendingPersist // put id → replica waiting for its SSD persist
	nextID   int64                     // put, get and holder ids share one increasing counter
}

// NewState returns an empty master state.
func NewState(opts Options) *State {
	opts.setDefaults()
	return &State{
		opts:     opts,
		log:      *opts.Logger,
		nodes:    make(map[string]*node),
		routes:   make(map[string]*route),
		puts:     make(map[int64]*inflightPut),
		gets:     make(map[int64]*inflightGet),
		persists: make(map[int64]*pendingPersist),
		nextID:   opts.IDBase,
	}
}

func (s *State) newID() int64 {
	s.nextID++
	return s.nextID
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// allocateLocked finds length bytes in n's segment, evicting older memory replicas of
// n while the allocator has no fitting range. It returns nil when nothing is left to
// evict: the caller waits for holders to be released (bounded) or fails with NO_SPACE.
func (s *State) allocateLocked(n *node, length int64) *Allocation {
	for {
		if r, ok := n.alloc.Alloc(length); ok {
			return newAllocation(n, r, length)
		}
		key, ok := n.policy.Victim()
		if !ok {
			return nil
		}
		r := s.routes[key]
		rep := r.replicas[n]
		if r == nil || rep == nil || rep.memory == nil {
			panic("BUG: eviction policy names a key without a memory replica on its node")
		}
		rep.memory.Release()
		rep.memory = nil
		s.pruneLocked(key, r, n)
		s.log.Debug().Str("node", n.id).Str("key", key).Msg("evicted memory replica")
	}
}

// noSpace is the error for a full segment; Server retries it for a bounded time.
func noSpace(n *node, length int64) error {
	return wire.Errorf(common.ErrorCode_NO_SPACE, "no space for %d bytes in the segment of node %q: total %d, free %d, largest free range %d",
		length, n.id, n.alloc.Capacity(), n.alloc.FreeBytes(), n.alloc.LargestFree())
}

// PutPlan tells the requester where to write a value.
type PutPlan struct {
	PutID        int64
	TargetNode   string
	TargetAddr   string
	TargetOffset int64
	SourceOffset int64
	PersistToSSD bool
}

// PutStart plans a put: it allocates the target range and records the in-flight put.
// The target is the requester's own segment (remote placement comes with multi-owner
// transfers).
func (s *State) PutStart(now time.Time, ref NodeRef, key string, length int64, rejectIfExists bool) (PutPlan, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return PutPlan{}, err
	}
	if err := wire.ValidateKey(key); err != nil {
		return PutPlan{}, err
	}
	if err := wire.ValidateLen(length, n.alloc.Capacity()); err != nil {
		return PutPlan{}, err
	}
	if rejectIfExists {
		if r := s.routes[key]; r != nil && r.readable() {
			return PutPlan{}, wire.Errorf(common.ErrorCode_ALREADY_EXISTS, "key exists")
		}
	}
	target := s.allocateLocked(n, length)
	if target == nil {
		return PutPlan{}, noSpace(n, length)
	}
	id := s.newID()
	s.puts[id] = &inflightPut{
		key: key, node: n, target: target, deadline: now.Add(s.opts.InflightTTL),
		rejectIfExists: rejectIfExists, persistToSSD: n.ssd.Enabled,
	}
	return PutPlan{
		PutID: id, TargetNode: n.id, TargetAddr: n.dataAddr,
		TargetOffset: target.Offset(), SourceOffset: target.Offset(), PersistToSSD: n.ssd.Enabled,
	}, nil
}

// PutDone publishes the put's target as the key's memory replica under a new version;
// the old version's replicas are released (its holders keep their bytes). It returns
// the other live owners whose cached info of the key must be invalidated and, when the
// put was planned with persist_to_ssd, the persist to ask the target owner for: until
// PersistDone, the replica is kept alive and stays out of the eviction policy.
func (s *State) PutDone(now time.Time, ref NodeRef, key string, putID int64) ([]Invalidation, *PersistTask, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return nil, nil, err
	}
	p := s.puts[putID]
	if p == nil || p.key != key || p.node != n {
		return nil, nil, wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (expired, revoked or never started)", putID)
	}
	delete(s.puts, putID)
	old := s.routes[key]
	if p.rejectIfExists && old != nil && old.readable() {
		p.target.Release()
		return nil, nil, wire.Errorf(common.ErrorCode_ALREADY_EXISTS, "key exists")
	}
	if old != nil {
		s.dropRouteLocked(key, old)
	}
	r := &route{putID: putID, len: p.target.Len(), replicas: make(map[*node]*replica)}
	s.routes[key] = r
	var task *PersistTask
	if p.persistToSSD {
		s.persists[putID] = &pendingPersist{key: key, node: n, alloc: p.target.Retain()}
		task = &PersistTask{NodeID: n.id, PeerAddr: n.peerAddr, Generation: n.generation, Key: key, PutID: putID,
			Offset: p.target.Offset(), Len: p.target.Len()}
	}
	s.setMemoryLocked(key, r, n, p.target, task == nil)
	// Versions older than putID are dead everywhere; putID itself may already be
	// cached (or persisted) by another owner that read it: keep that.
	return s.invalidationsLocked(n, key, putID-1), task, nil
}

// PutRevoke abandons an in-flight put and frees its target.
func (s *State) PutRevoke(ref NodeRef, key string, putID int64) error {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return err
	}
	p := s.puts[putID]
	if p == nil || p.key != key || p.node != n {
		return wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key", putID)
	}
	s.dropPutLocked(putID, p)
	return nil
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
	r := s.routes[key]
	if r == nil {
		return false, 0, nil, nil
	}
	existed = r.readable()
	s.dropRouteLocked(key, r)
	return existed, r.putID, s.invalidationsLocked(n, key, r.putID), nil
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

// Invalidation asks an owner to drop its cached info of key (any version ≤ PutID).
type Invalidation struct {
	NodeID   string
	PeerAddr string
	Key      string
	PutID    int64
}

// invalidationsLocked lists the live owners other than the requester: the requester
// drops its own cached info before it replies.
func (s *State) invalidationsLocked(requester *node, key string, putID int64) []Invalidation {
	var out []Invalidation
	for _, n := range s.nodes {
		if n != requester && n.peerAddr != "" {
			out = append(out, Invalidation{NodeID: n.id, PeerAddr: n.peerAddr, Key: key, PutID: putID})
		}
	}
	return out
}

// BatchDeleteAck releases holders the owner no longer needs. It returns how many ids
// were unknown (already released, or never issued to this owner).
func (s *State) BatchDeleteAck(ref NodeRef, holderIDs []int64) (int, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return 0, err
	}
	unknown := 0
	for _, id := range holderIDs {
		a := n.holders[id]
		if a == nil {
			unknown++
			continue
		}
		delete(n.holders, id)
		a.Release()
	}
	return unknown, nil
}

// SsdReplicaCommit publishes an SSD replica only if the key still has that put_id, the
// node still holds the memory replica and is live; a late or stale commit is ignored.
// It reports whether the commit was published.
func (s *State) SsdReplicaCommit(ref NodeRef, key string, putID, length int64) (bool, error) {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return false, err
	}
	r := s.routes[key]
	if r == nil || r.putID != putID || r.memoryReplica(n) == nil || length != r.len {
		return false, nil
	}
	rep := r.replicas[n]
	rep.ssd = true
	rep.ssdLen = length
	return true, nil
}

// BatchSsdReplicaEvict clears SSD replicas the owner's rings overwrote.
func (s *State) BatchSsdReplicaEvict(ref NodeRef, entries []*common.KeyVersion) error {
	n, err := s.nodeLocked(ref)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e == nil {
			continue
		}
		if r := s.routes[e.Key]; r != nil && r.putID == e.PutId {
			s.clearSSDLocked(e.Key, r, n)
		}
	}
	return nil
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
		if now.After(p.deadline) {
			s.log.Warn().Str("key", p.key).Int64("put_id", id).Msg("in-flight put expired; revoked")
			s.dropPutLocked(id, p)
		}
	}
	for id, g := range s.gets {
		if now.After(g.deadline) {
			s.log.Warn().Str("key", g.key).Int64("get_id", id).Msg("in-flight get expired; revoked")
			s.dropGetLocked(id, g, false)
		}
	}
	return tombed
}

// Members describes every live owner.
func (s *State) Members() []*common.MemberStat {
	out := make([]*common.MemberStat, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, &common.MemberStat{
			NodeId:         n.id,
			Generation:     n.generation,
			MemorySegment:  &common.CapacityStat{CapacityBytes: n.alloc.Capacity(), UsedBytes: n.alloc.Used()},
			KvSsd:          &common.CapacityStat{CapacityBytes: n.ssd.CapacityBytes, UsedBytes: n.ssd.UsedBytes},
			Alive:          true,
			DataAddr:       n.dataAddr,
			PeerAddr:       n.peerAddr,
			MemoryReplicas: int64(n.policy.Len()),
			SsdReplicas:    s.ssdReplicasLocked(n),
			Holders:        int64(len(n.holders)),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NodeId < out[j].NodeId })
	return out
}

func (s *State) ssdReplicasLocked(n *node) int64 {
	if !n.ssd.Enabled {
		return 0
	}
	var c int64
	for _, r := range s.routes {
		if rep := r.replicas[n]; rep != nil && rep.ssd {
			c++
		}
	}
	return c
}

// Keys is the number of routes.
func (s *State) Keys() int { return len(s.routes) }
