package master

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// pendingPersist keeps a fresh memory replica alive, out of the eviction policy, while
// an owner writes it to SSD (docs/architecture.md §4 put step 3): it cannot be evicted before it
// reaches SSD, and its capacity stays reserved. ssdNode writes it: node itself when it
// has SSD, else the SSD pool's choice, which pulls the bytes from node's segment.
type pendingPersist struct {
	key     string
	node    *node
	alloc   *Allocation
	ssdNode *node
}

// PersistTask is an SsdReplicaPersist call for the server to make after PutDone: node
// NodeID persists the value whose memory replica is at Offset of SourceNodeID's
// segment (empty: its own).
type PersistTask struct {
	NodeID           string
	PeerAddr         string
	Generation       int64
	Key              string
	PutID            int64
	Offset           int64
	Len              int64
	SourceNodeID     string
	SourceGeneration int64
	SourceDataAddr   string
}

// persistCounts are the SSD persists the master asked one owner for (by node id, over
// its incarnations) and those that ended without an SSD replica.
type persistCounts struct{ asked, dropped int64 }

// PersistDone ends a persist (whatever its outcome: a failed persist never undoes the
// put): the replica, if it is still the key's current memory replica on that node,
// enters the eviction policy. ok reports whether the owner persisted it.
func (s *State) PersistDone(putID int64, ok bool) {
	pp := s.persists[putID]
	if pp == nil {
		return
	}
	s.endPersistLocked(putID, pp, ok)
	if r := s.routes[pp.key]; r != nil && r.putID == putID && r.memoryReplica(pp.node) == pp.alloc && !pp.node.tombed {
		s.enterPolicyLocked(pp.key, r, pp.node, pp.alloc.Size())
	}
	pp.alloc.Release()
}

// endPersistLocked forgets a pending persist and counts its outcome.
func (s *State) endPersistLocked(putID int64, pp *pendingPersist, ok bool) {
	delete(s.persists, putID)
	pp.ssdNode.ssdPending -= pp.alloc.Len()
	if !ok {
		s.persistCount(pp.ssdNode.id).dropped++
	}
}

func (s *State) persistCount(id string) *persistCounts {
	c := s.persistStats[id]
	if c == nil {
		c = &persistCounts{}
		s.persistStats[id] = c
	}
	return c
}

// persistNodeLocked chooses the owner that writes the SSD replica of a value whose
// memory replica is on t (docs/architecture.md §10 "SSD pool"): t itself when it has SSD, else the
// live SSD-capable owner with the most free ring space (as its heartbeat reported it,
// less the persists assigned to it since), ties by node id; nil when no owner has SSD
// room for length bytes.
func (s *State) persistNodeLocked(t *node, length int64) *node {
	if t.ssd.Enabled {
		return t
	}
	var best *node
	var bestFree int64
	for _, n := range s.nodes {
		if n.tombed || !n.ssd.Enabled || n.ssd.CapacityBytes < length {
			continue
		}
		free := n.ssd.CapacityBytes - n.ssd.UsedBytes - n.ssdPending
		if best == nil || free > bestFree || (free == bestFree && n.id < best.id) {
			best, bestFree = n, free
		}
	}
	return best
}

// persistTaskLocked records a persist of key@putID, whose memory replica is a on t,
// and returns the call for the server to make; nil when no owner can persist it.
func (s *State) persistTaskLocked(key string, putID int64, t *node, a *Allocation) *PersistTask {
	sn := s.persistNodeLocked(t, a.Len())
	if sn == nil {
		return nil
	}
	s.persists[putID] = &pendingPersist{key: key, node: t, alloc: a.Retain(), ssdNode: sn}
	sn.ssdPending += a.Len()
	s.persistCount(sn.id).asked++
	task := &PersistTask{NodeID: sn.id, PeerAddr: sn.peerAddr, Generation: sn.generation, Key: key, PutID: putID,
		Offset: a.Offset(), Len: a.Len()}
	if sn != t {
		task.SourceNodeID, task.SourceGeneration, task.SourceDataAddr = t.id, t.generation, t.dataAddr
	}
	return task
}

// PendingPersists counts replicas waiting for their SSD persist.
func (s *State) PendingPersists() int { return len(s.persists) }

var (
	// errNodeGone ends a persist whose owner incarnation was tombed (or re-registered)
	// before or while it ran.
	errNodeGone = errors.New("owner tombed or re-registered: SSD persist skipped")
	// errPersistQueueFull ends a persist that found the queue full.
	errPersistQueueFull = errors.New("SSD persist queue full")
	// errMasterStopping ends the persists still queued or running when the master stops.
	errMasterStopping = errors.New("master stopping: SSD persist skipped")
)

// persistWatchInterval is how often the persister looks for tombed owners among those
// it has work for: their queued persists end at once, running ones are cancelled.
const persistWatchInterval = 100 * time.Millisecond

// persister runs SsdReplicaPersist calls after PutDone (docs/architecture.md §4 put step 3) on
// PersistWorkers workers; at most PersistWorkersPerNode of them work for one owner
// incarnation at once, and owners with work are served round robin, so one slow or
// dead owner never occupies every worker (docs/architecture.md §10 "Death and fencing"). A call to
// a dead owner fails within PeerConnectTimeout (twice it with authentication); a live
// owner's call may take up to PersistTimeout. Every task ends with State.PersistDone,
// whatever the outcome: done, failed, skipped (owner tombed), queue full or master
// stopping.
type persister struct {
	s        *Server
	log      zerolog.Logger
	timeout  time.Duration
	perNode  int
	queueCap int

	mu     sync.Mutex // protects nodes, order, rr, queued, closed
	cond   *sync.Cond // on mu: a task was queued, a worker slot freed, or close
	nodes  map[persistNodeKey]*persistNode
	order  []persistNodeKey // nodes with queued or running persists, round robin from rr
	rr     int
	queued int
	closed bool

	stop chan struct{}  // closed by close: the watcher exits
	wg   sync.WaitGroup // workers and the watcher

	// testDone, when set (before the first submit), sees every task end.
	testDone func(t *PersistTask, err error)
}

type persistNodeKey struct {
	id  string
	gen int64
}

// persistNode is one owner incarnation's queued and running persists.
type persistNode struct {
	tasks   []*PersistTask
	running map[*PersistTask]*persistCall
}

type persistCall struct {
	cancel        context.CancelCauseFunc
	cancelTimeout context.CancelFunc
}

// newPersister starts the workers.
func newPersister(s *Server) *persister {
	p := &persister{s: s, log: *s.opts.Logger, timeout: s.opts.PersistTimeout, perNode: s.opts.PersistWorkersPerNode,
		queueCap: s.opts.PersistQueue, nodes: make(map[persistNodeKey]*persistNode), stop: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	for i := 0; i < s.opts.PersistWorkers; i++ {
		p.wg.Add(1)
		go p.worker()
	}
	p.wg.Add(1)
	go p.watch()
	return p
}

// submit queues a persist; when the queue is full the replica is admitted to the
// eviction policy without reaching SSD (puts never wait on the SSD tier).
func (p *persister) submit(t *PersistTask) {
	if t == nil {
		return
	}
	p.mu.Lock()
	if p.closed || p.queued >= p.queueCap {
		err := errMasterStopping
		if !p.closed {
			err = errPersistQueueFull
		}
		p.mu.Unlock()
		p.end([]*PersistTask{t}, err)
		return
	}
	k := persistNodeKey{id: t.NodeID, gen: t.Generation}
	n := p.nodes[k]
	if n == nil {
		n = &persistNode{running: make(map[*PersistTask]*persistCall)}
		p.nodes[k] = n
		p.order = append(p.order, k)
	}
	n.tasks = append(n.tasks, t)
	p.queued++
	p.cond.Signal()
	p.mu.Unlock()
}

func (p *persister) worker() {
	defer p.wg.Done()
	for {
		t, k, ctx, ok := p.next()
		if !ok {
			return
		}
		err := p.run(ctx, t)
		p.end([]*PersistTask{t}, err)
		p.mu.Lock()
		if n := p.nodes[k]; n != nil {
			if c := n.running[t]; c != nil {
				c.cancelTimeout()
				c.cancel(nil)
				delete(n.running, t)
			}
			p.dropIfIdleLocked(k)
		}
		p.cond.Broadcast() // a slot of node k is free
		p.mu.Unlock()
	}
}

// next waits for a task whose owner has a free slot, round robin over owners, and
// marks it running. It returns false once the persister is closed.
func (p *persister) next() (*PersistTask, persistNodeKey, context.Context, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for !p.closed {
		for i := range p.order {
			j := (p.rr + i) % len(p.order)
			k := p.order[j]
			n := p.nodes[k]
			if len(n.tasks) == 0 || len(n.running) >= p.perNode {
				continue
			}
			t := n.tasks[0]
			n.tasks[0] = nil
			n.tasks = n.tasks[1:]
			p.queued--
			base, cancel := context.WithCancelCause(context.Background())
			ctx, cancelTimeout := context.WithTimeout(base, p.timeout)
			n.running[t] = &persistCall{cancel: cancel, cancelTimeout: cancelTimeout}
			p.rr = j + 1
			return t, k, ctx, true
		}
		p.cond.Wait()
	}
	return nil, persistNodeKey{}, nil, false
}

// dropIfIdleLocked forgets node k once it has nothing queued or running.
func (p *persister) dropIfIdleLocked(k persistNodeKey) {
	n := p.nodes[k]
	if n == nil || len(n.tasks) > 0 || len(n.running) > 0 {
		return
	}
	delete(p.nodes, k)
	i := slices.Index(p.order, k)
	p.order = slices.Delete(p.order, i, i+1)
	if i < p.rr {
		p.rr--
	}
}

// run makes one SsdReplicaPersist call, unless its owner incarnation is gone.
func (p *persister) run(ctx context.Context, t *PersistTask) error {
	live := false
	p.s.locked(func(st *State) error { live = liveOwnerLocked(st, t.NodeID, t.Generation, ""); return nil })
	if !live {
		return errNodeGone
	}
	c, callOpts, err := p.s.peers.GetNode(t.NodeID, t.PeerAddr)
	if err != nil {
		return err
	}
	resp, err := c.SsdReplicaPersist(ctx, &peer.SsdReplicaPersistRequest{Key: t.Key, PutId: t.PutID,
		Offset: t.Offset, Len: t.Len, Generation: t.Generation, SourceNodeId: t.SourceNodeID,
		SourceGeneration: t.SourceGeneration, SourceDataAddr: t.SourceDataAddr, MasterEpoch: p.s.epoch}, callOpts...)
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, errNodeGone) || errors.Is(cause, errMasterStopping) {
			return cause
		}
		return err
	}
	return wire.FromResponse(resp.Code, resp.Message)
}

// end ends tasks with PersistDone (one lock) and logs why they did not persist.
func (p *persister) end(tasks []*PersistTask, err error) {
	if len(tasks) == 0 {
		return
	}
	p.s.locked(func(st *State) error {
		for _, t := range tasks {
			st.PersistDone(t.PutID, err == nil)
		}
		return nil
	})
	for _, t := range tasks {
		switch {
		case err == nil:
		case errors.Is(err, errNodeGone) || errors.Is(err, errMasterStopping):
			p.log.Debug().Err(err).Str("key", t.Key).Int64("put_id", t.PutID).Str("node", t.NodeID).Msg("SSD persist skipped")
		case errors.Is(err, errPersistQueueFull):
			p.log.Warn().Str("key", t.Key).Str("node", t.NodeID).Msg("SSD persist queue full; value stays memory-only")
		default:
			p.log.Warn().Err(err).Str("key", t.Key).Int64("put_id", t.PutID).Str("node", t.NodeID).Msg("SSD persist failed; the put stays memory-only")
		}
		if p.testDone != nil {
			p.testDone(t, err)
		}
	}
}

// watch ends the queued persists of owners tombed meanwhile and cancels their running
// ones, so they wait neither for a worker nor for PersistTimeout.
func (p *persister) watch() {
	defer p.wg.Done()
	tick := time.NewTicker(persistWatchInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		keys := slices.Clone(p.order)
		p.mu.Unlock()
		if len(keys) == 0 {
			continue
		}
		var dead []persistNodeKey
		p.s.locked(func(st *State) error {
			for _, k := range keys {
				if !liveOwnerLocked(st, k.id, k.gen, "") {
					dead = append(dead, k)
				}
			}
			return nil
		})
		if len(dead) == 0 {
			continue
		}
		var skipped []*PersistTask
		p.mu.Lock()
		for _, k := range dead {
			n := p.nodes[k]
			if n == nil {
				continue
			}
			skipped = append(skipped, n.tasks...)
			p.queued -= len(n.tasks)
			n.tasks = nil
			for _, c := range n.running {
				c.cancel(errNodeGone)
			}
			p.dropIfIdleLocked(k)
		}
		p.mu.Unlock()
		p.end(skipped, errNodeGone)
	}
}

// close ends the queued persists, lets running ones finish for up to wait, then
// cancels them, and waits for every worker.
func (p *persister) close(wait time.Duration) {
	p.mu.Lock()
	p.closed = true
	var queued []*PersistTask
	for _, k := range p.order {
		n := p.nodes[k]
		queued = append(queued, n.tasks...)
		n.tasks = nil
	}
	p.queued = 0
	p.cond.Broadcast()
	p.mu.Unlock()
	close(p.stop)
	p.end(queued, errMasterStopping)

	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return
	case <-time.After(wait):
	}
	p.log.Warn().Msg("master stop: SSD persists still running; cancelling them")
	p.mu.Lock()
	for _, n := range p.nodes {
		for _, c := range n.running {
			c.cancel(errMasterStopping)
		}
	}
	p.mu.Unlock()
	<-done
}
