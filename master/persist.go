package master

// pendingPersist keeps a fresh memory replica alive, out of the eviction policy, while
// its owner writes it to SSD (DESIGN §4 put step 3): it cannot be evicted before it
// reaches SSD, and its capacity stays reserved.
type pendingPersist struct {
	key   string
	node  *node
	alloc *Allocation
}

// PersistTask is an SsdReplicaPersist call for the server to make after PutDone.
type PersistTask struct {
	NodeID     string
	PeerAddr   string
	Generation int64
	Key        string
	PutID      int64
	Offset     int64
	Len        int64
}

// PersistDone ends a persist (whatever its outcome: a failed persist never undoes the
// put): the replica, if it is still the key's current memory replica on that node,
// enters the eviction policy.
func (s *State) PersistDone(putID int64) {
	pp := s.persists[putID]
	if pp == nil {
		return
	}
	delete(s.persists, putID)
	if r := s.routes[pp.key]; r != nil && r.putID == putID && r.memoryReplica(pp.node) == pp.alloc && !pp.node.tombed {
		pp.node.policy.Insert(pp.key, pp.alloc.Size())
	}
	pp.alloc.Release()
}

// PendingPersists counts replicas waiting for their SSD persist.
func (s *State) PendingPersists() int { return len(s.persists) }
