package master

import (
	"context"
	"errors"
	"fmt"
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
	// writeBack: the write-back of a page in the eviction order (writeback.go), not a
	// persist at its put.
	writeBack bool
	// lost: the version's last SSD copy went while this write-back ran (redirtyLocked):
	// its success does not leave the page clean. refresh: it rewrites a version on SSD
	// (refreshLocked).
	lost    bool
	refresh bool
	// committed: its SSD owner's commit was published (SsdReplicaCommit). The record
	// is then counted on though the persist ends failed (its source tombed before the
	// owner's batch call returned, the call's answer lost): an owner that forgets a
	// record whose commit it did not see answered reports it as an eviction.
	committed bool
	// task is the call made for it: a write-back passed to another copy (its owner
	// died) has the put id of the one it replaces, whose task still ends later.
	task *PersistTask
}

// PersistTask is a persist for the server to make after PutDone (an item of a
// BatchSsdReplicaPersist call): node
// NodeID persists the value whose memory replica is at Offset of SourceNodeID's
// segment (empty: its own).
type PersistTask struct {
	// ID numbers this persist (SsdReplicaPersistRequest.persist_id): its commit is
	// published only while it is the version's pending persist (SsdReplicaCommit).
	ID               int64
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
// its incarnations) and those that ended without an SSD replica; and the KV pages of
// its memory the write-back gave up on (unwrittenLocked, writeBackDoneLocked).
type persistCounts struct{ asked, dropped, unwritten int64 }

// PersistDone ends a persist (whatever its outcome: a failed persist never undoes the
// put): the replica, if it is still the key's current memory replica on that node,
// enters the eviction policy. ok reports whether the owner persisted it. It names the
// persist by put id alone, as the scenario scripts do; the persister ends its tasks
// with PersistTaskDone, which ignores a task a newer one of the same put id replaced.
func (s *State) PersistDone(putID int64, ok bool) {
	s.persistDoneLocked(putID, nil, ok)
}

// PersistTaskDone is PersistDone of task t: it ends the pending persist only if t is
// the task made for it (not an older task of the same put id, whose persist was
// ended already, at its owner's tomb, and passed to another copy).
func (s *State) PersistTaskDone(t *PersistTask, ok bool) {
	s.persistDoneLocked(t.PutID, t, ok)
}

func (s *State) persistDoneLocked(putID int64, t *PersistTask, ok bool) {
	pp := s.persists[putID]
	if pp == nil || (t != nil && pp.task != t) {
		return
	}
	s.endPersistLocked(putID, pp, ok)
	if pp.writeBack {
		s.writeBackDoneLocked(putID, pp, ok)
		return
	}
	if r := s.routes[pp.key]; r != nil && r.putID == putID && !ok {
		s.unpersistLocked(putID, pp, r)
	}
	if r := s.routes[pp.key]; r != nil && r.putID == putID && r.memoryReplica(pp.node) == pp.alloc && !pp.node.tombed {
		s.enterPolicyLocked(pp.key, r, pp.node, pp.alloc.Size())
	}
	pp.alloc.Release()
}

// endPersistLocked forgets a pending persist and counts its outcome.
func (s *State) endPersistLocked(putID int64, pp *pendingPersist, ok bool) {
	delete(s.persists, putID)
	pp.ssdNode.ssdPending -= pp.alloc.Len()
	if !ok && !pp.committed {
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

// ssdBalanceSlack: an owner with SSD persists the values of its own memory while its
// ring is less than 1/ssdBalanceSlack of a lap ahead of the ring furthest behind.
const ssdBalanceSlack = 4

// ringLaps is how many times n's SSD ring was filled by the persists assigned to it.
func ringLaps(n *node) float64 { return float64(n.ssdAssigned) / float64(n.ssd.CapacityBytes) }

// ssdBehindLocked is the live SSD-capable owner (other than except) whose ring holds
// length bytes and has made the fewest laps, ties by node id; nil when there is none.
func (s *State) ssdBehindLocked(length int64, except string) *node {
	var best *node
	for _, n := range s.nodes {
		if n.tombed || !n.ssd.Enabled || n.ssd.CapacityBytes <= 0 || !n.ssd.holds(length) || n.id == except {
			continue
		}
		if best == nil || ringLaps(n) < ringLaps(best) || (ringLaps(n) == ringLaps(best) && n.id < best.id) {
			best = n
		}
	}
	return best
}

// persistNodeLocked chooses the owner that writes the SSD replica of a value whose
// memory replica is on t (docs/architecture.md §10 "SSD pool"). An owner with SSD
// writes its own values while its ring is at most 1/ssdBalanceSlack of a lap ahead of
// the ring furthest behind, else that ring's owner does (pulling the bytes): where puts
// land unevenly (clients on some owners only), the rings still wrap at one pace and
// together hold the newest values, as one ring of their summed size would, instead of
// the busy owners' rings dropping values early while another's stays idle. An owner
// without SSD has the live SSD-capable owner with the most free ring space write them
// (as its heartbeat reported it, less the persists assigned to it since), ties by node
// id. nil when no owner has SSD room for length bytes (an owner whose capacity is not
// reported yet writes its own values).
func (s *State) persistNodeLocked(t *node, length int64) *node {
	if t.ssd.Enabled {
		behind := s.ssdBehindLocked(length, "")
		switch {
		case t.ssd.CapacityBytes <= 0:
			return t
		case !t.ssd.holds(length):
			return behind // a ring that holds it, or none
		case behind == nil || behind == t || ringLaps(t)-ringLaps(behind) <= 1.0/ssdBalanceSlack:
			return t
		}
		return behind
	}
	return s.mostFreeRingLocked(length, nil)
}

// mostFreeRingLocked is the live SSD-capable owner, but excepted, with the most free
// ring space for length bytes (as its heartbeat reported it, less the persists
// assigned to it since), ties by node id; nil when there is none.
func (s *State) mostFreeRingLocked(length int64, but *node) *node {
	var best *node
	var bestFree int64
	for _, n := range s.nodes {
		if n == but || n.tombed || !n.ssd.Enabled || !n.ssd.holds(length) {
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
// and returns the call for the server to make; nil when no owner can persist it (or
// those that can have yet to ack a notice to forget that version's SSD entry).
func (s *State) persistTaskLocked(key string, putID int64, t *node, a *Allocation) *PersistTask {
	sn := s.persistNodeLocked(t, a.Len())
	if sn != nil && sn.evicted.names(key, putID, true) {
		// Not there while a notice to forget the version's SSD entry waits for sn's ack
		// (a write-back after a failed read there): applied after this persist, it would
		// drop the new record while the master counts it. Another ring takes it (the
		// page waited, dirty, at the head of its owner's write-ahead, which stopped there:
		// a review found it evicted unwritten while another ring had room).
		if sn = s.mostFreeRingLocked(a.Len(), sn); sn != nil && sn.evicted.names(key, putID, true) {
			sn = nil
		}
	}
	if sn == nil {
		return nil
	}
	pp := &pendingPersist{key: key, node: t, alloc: a.Retain(), ssdNode: sn}
	s.persists[putID] = pp
	sn.ssdPending += a.Len()
	sn.ssdAssigned += a.Len()
	s.persistCount(sn.id).asked++
	s.persistSeq++
	task := &PersistTask{ID: s.persistSeq, NodeID: sn.id, PeerAddr: sn.peerAddr, Generation: sn.generation, Key: key, PutID: putID,
		Offset: a.Offset(), Len: a.Len()}
	if sn != t {
		task.SourceNodeID, task.SourceGeneration, task.SourceDataAddr = t.id, t.generation, t.dataAddr
	}
	pp.task = task
	return task
}

// PendingPersists counts replicas waiting for their SSD persist.
func (s *State) PendingPersists() int { return len(s.persists) }

var (
	// errNodeGone ends a persist whose owner incarnation was tombed (or re-registered)
	// before or while it ran.
	errNodeGone = errors.New("owner tombed or re-registered: SSD persist skipped")
	// errPersistGone ends a queued task whose pending persist ended meanwhile.
	errPersistGone = errors.New("the persist ended while queued (its source owner tombed, or the key overwritten): SSD persist skipped")
	// errPersistQueueFull ends a persist that found the queue full.
	errPersistQueueFull = errors.New("SSD persist queue full")
	// errMasterStopping ends the persists still queued or running when the master stops.
	errMasterStopping = errors.New("master stopping: SSD persist skipped")
)

// persistWatchInterval is how often the persister looks for tombed owners among those
// it has work for: their queued persists end at once, running ones are cancelled.
const persistWatchInterval = 100 * time.Millisecond

// persister runs the persists PutDone asks for (docs/architecture.md §4 put step 3) as
// BatchSsdReplicaPersist calls on PersistWorkers workers: a worker takes every task queued
// for one owner incarnation, up to PERSIST_BATCH_ITEMS and persistBatchBytes (at least
// one), so a put stream faster than single persists becomes fewer, larger calls, and a
// light one still persists each value at once. At most PersistWorkersPerNode calls run
// for one owner incarnation at once, and owners with work are served round robin, so one
// slow or dead owner never occupies every worker (docs/architecture.md §10 "Death and
// fencing"). A call to a dead owner fails within PeerConnectTimeout (twice it with
// authentication); a live owner's call may take up to PersistTimeout. Every task ends
// with State.PersistDone, whatever the outcome: done, failed, skipped (owner tombed),
// queue full or master stopping.
type persister struct {
	s        *Server
	log      zerolog.Logger
	fullLog  zerolog.Logger // queue-full drops: at most one line a second
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

// persistNode is one owner incarnation's queued persists and running calls.
type persistNode struct {
	tasks   []*PersistTask
	running map[*persistBatch]*persistCall
}

// persistBatch is the tasks of one BatchSsdReplicaPersist call.
type persistBatch struct{ tasks []*PersistTask }

// persistBatchBytes bounds the values of one call (a first value larger than it goes alone),
// so that a call of large values ends well within PersistTimeout.
const persistBatchBytes = 64 << 20

type persistCall struct {
	cancel        context.CancelCauseFunc
	cancelTimeout context.CancelFunc
}

// newPersister starts the workers.
func newPersister(s *Server) *persister {
	p := &persister{s: s, log: *s.opts.Logger, fullLog: s.opts.Logger.Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Second}), timeout: s.opts.PersistTimeout, perNode: s.opts.PersistWorkersPerNode,
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
		p.endAll([]*PersistTask{t}, err)
		return
	}
	k := persistNodeKey{id: t.NodeID, gen: t.Generation}
	n := p.nodes[k]
	if n == nil {
		n = &persistNode{running: make(map[*persistBatch]*persistCall)}
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
		b, k, ctx, ok := p.next()
		if !ok {
			return
		}
		p.end(b.tasks, p.run(ctx, b.tasks))
		p.mu.Lock()
		if n := p.nodes[k]; n != nil {
			if c := n.running[b]; c != nil {
				c.cancelTimeout()
				c.cancel(nil)
				delete(n.running, b)
			}
			p.dropIfIdleLocked(k)
		}
		p.cond.Broadcast() // a slot of node k is free
		p.mu.Unlock()
	}
}

// next waits for tasks of an owner with a free slot, round robin over owners, takes a
// batch of them (the queue's head, up to PERSIST_BATCH_ITEMS and persistBatchBytes) and
// marks it running. It returns false once the persister is closed.
func (p *persister) next() (*persistBatch, persistNodeKey, context.Context, bool) {
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
			take, bytes := 0, int64(0)
			for take < len(n.tasks) && take < int(peer.PERSIST_BATCH_ITEMS) && (take == 0 || bytes+n.tasks[take].Len <= persistBatchBytes) {
				bytes += n.tasks[take].Len
				take++
			}
			b := &persistBatch{tasks: slices.Clone(n.tasks[:take])}
			clear(n.tasks[:take])
			n.tasks = n.tasks[take:]
			p.queued -= take
			base, cancel := context.WithCancelCause(context.Background())
			ctx, cancelTimeout := context.WithTimeout(base, p.timeout)
			n.running[b] = &persistCall{cancel: cancel, cancelTimeout: cancelTimeout}
			p.rr = j + 1
			return b, k, ctx, true
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

// run makes one BatchSsdReplicaPersist call for tasks (all of one owner incarnation),
// unless that incarnation is gone; it returns each task's outcome. A task whose pending
// persist ended while it was queued (its source owner was tombed, the key overwritten)
// is not sent: an owner tombed while alive registers again (one of an earlier release
// with its generation unchanged, so its pull fence still matches), and its new pool may give the range the task names to another value,
// which the SSD owner would then have written under this key (a review).
func (p *persister) run(ctx context.Context, tasks []*PersistTask) []error {
	all := func(err error) []error { return sameErr(len(tasks), err) }
	t := tasks[0]
	live := false
	var current []int // the tasks still their pending persist's
	p.s.locked(func(st *State) error {
		live = liveOwnerLocked(st, t.NodeID, t.Generation, "")
		for i, t := range tasks {
			if pp := st.persists[t.PutID]; pp != nil && pp.task == t {
				current = append(current, i)
			}
		}
		return nil
	})
	if !live {
		return all(errNodeGone)
	}
	if len(current) < len(tasks) {
		errs := all(errPersistGone)
		if len(current) > 0 {
			sent := make([]*PersistTask, len(current))
			for k, i := range current {
				sent[k] = tasks[i]
			}
			for k, err := range p.run(ctx, sent) {
				errs[current[k]] = err
			}
		}
		return errs
	}
	c, callOpts, err := p.s.peers.GetNode(t.NodeID, t.PeerAddr)
	if err != nil {
		return all(err)
	}
	req := &peer.BatchSsdReplicaPersistRequest{Items: make([]*peer.SsdReplicaPersistRequest, len(tasks))}
	for i, t := range tasks {
		req.Items[i] = &peer.SsdReplicaPersistRequest{Key: t.Key, PutId: t.PutID, Offset: t.Offset, Len: t.Len,
			Generation: t.Generation, SourceNodeId: t.SourceNodeID, SourceGeneration: t.SourceGeneration,
			SourceDataAddr: t.SourceDataAddr, MasterEpoch: p.s.epoch, PersistId: t.ID}
	}
	resp, err := c.BatchSsdReplicaPersist(ctx, req, callOpts...)
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, errNodeGone) || errors.Is(cause, errMasterStopping) {
			return all(cause)
		}
		return all(err)
	}
	if err := wire.FromResponse(resp.Code, resp.Message); err != nil {
		return all(err)
	}
	if len(resp.Results) != len(tasks) {
		return all(fmt.Errorf("owner %s answered %d of %d SSD persists", t.NodeID, len(resp.Results), len(tasks)))
	}
	errs := make([]error, len(tasks))
	for i, r := range resp.Results {
		if r == nil {
			errs[i] = fmt.Errorf("owner %s sent no answer for the SSD persist of %q", t.NodeID, tasks[i].Key)
			continue
		}
		errs[i] = wire.FromResponse(r.Code, r.Message)
	}
	return errs
}

// end ends tasks with PersistDone (one lock) and logs why they did not persist: errs[i]
// is task i's outcome (nil: persisted).
func (p *persister) end(tasks []*PersistTask, errs []error) {
	if len(tasks) == 0 {
		return
	}
	p.s.locked(func(st *State) error {
		for i, t := range tasks {
			st.PersistTaskDone(t, errs[i] == nil)
		}
		return nil
	})
	full := 0
	for i, t := range tasks {
		switch err := errs[i]; {
		case err == nil:
		case errors.Is(err, errNodeGone) || errors.Is(err, errMasterStopping) || errors.Is(err, errPersistGone):
			p.log.Debug().Err(err).Str("key", t.Key).Int64("put_id", t.PutID).Str("node", t.NodeID).Msg("SSD persist skipped")
		case errors.Is(err, errPersistQueueFull):
			full++
		default:
			p.log.Warn().Err(err).Str("key", t.Key).Int64("put_id", t.PutID).Str("node", t.NodeID).Msg("SSD persist failed; the put stays memory-only")
		}
		if p.testDone != nil {
			p.testDone(t, errs[i])
		}
	}
	if full > 0 {
		p.fullLog.Warn().Int("values", full).Str("node", tasks[0].NodeID).
			Msg("SSD persist queue full; values stay memory-only (at most one line a second; ssd_persists_dropped counts them)")
	}
}

// endAll ends tasks that share one outcome.
func (p *persister) endAll(tasks []*PersistTask, err error) { p.end(tasks, sameErr(len(tasks), err)) }

// sameErr is n outcomes, each err.
func sameErr(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
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
		p.endAll(skipped, errNodeGone)
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
	p.endAll(queued, errMasterStopping)

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
