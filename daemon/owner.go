package daemon

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"

	"github.com/fluxkv/fluxkv/daemon/transfer"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external/externalservice"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/peerclient"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
	"github.com/fluxkv/fluxkv/ssd"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Owner is one node's sidecar.
type Owner struct {
	opts       Options
	log        zerolog.Logger
	generation int64 // this incarnation; externals must name it in every call
	// regGen is the generation of this owner's registration with the master (nodeGen):
	// the one its master calls name, and the master's plans name for its peer calls and
	// the pulls from its segment. It starts at generation, and each Register after the
	// first names a new one (masterLink.registerAgain); stored under mu, read anywhere.
	regGen atomic.Int64
	// token rides with every master call (masterLink.ref): only this process and the
	// master know it, so no other member can act as this owner (NodeRef.token).
	token int64
	seg   *shm.Segment
	store *ssd.Storage // nil: no SSD tier
	// evictQ holds the reports of SSD records gone here until the master took them:
	// the ring's evictions and the records forgotten with the master possibly
	// routing to them (forwardEvictions sends them; nil without an SSD tier).
	evictQ *evictQueue
	// persistPins bounds the SSD entries written and not committed (persistpins.go).
	persistPins *pinBudget
	stager      *stager // other owners' refills from store; nil without it

	master *masterLink
	peer   *peerServer
	acks   *acker
	// holderIDs is the last holder id this owner chose for a planning call's local hits
	// (newHolderIDs: counting down from -1).
	holderIDs atomic.Int64
	// getDones coalesces the GetDones of concurrent gets (getdone.go).
	getDones getDoneQueue
	data     *transfer.Server    // serves other owners' pulls from the segment
	puller   pullClient          // pulls from other owners into the segment
	peers    *peerclient.Clients // other owners' peer services (remote SSD staging)
	// peerAddr and dataAddr are the advertised addresses registered with the master.
	peerAddr, dataAddr string

	attachLn *net.UnixListener
	rpc      *framedServer
	frames   *wire.FrameBudget // the memory of request frames in progress on the RPC socket
	// peerFrames is the peer port's (the master's and other owners' calls): local
	// clients that hold the RPC socket's budget must not stall the cluster's calls.
	peerFrames *wire.FrameBudget

	// mu guards the owner's bookkeeping (ownerState); methods that run with it held are
	// named ...Locked. No network call runs under it.
	mu struct {
		sync.Mutex
		st ownerState
		// afterWrite (tests only), when set, runs once a get's target has been written,
		// before the get completes; called without the lock.
		afterWrite func(getID int64)
	}
	copied *sync.Cond // on mu: broadcast when a copy from a put area or a segment user ends
	// cachedGets counts gets answered from the hot set (nil without metrics).
	cachedGets prometheus.Counter
	// segUse is the master's last answer about this owner's memory pool (Capacity):
	// what the gauges keep while the master does not answer. Nil before the first.
	// segBeat is when a heartbeat's answer last brought it (unix ns; 0: never).
	segUse   atomic.Pointer[common.CapacityStat]
	segBeat  atomic.Int64
	idleStop chan struct{}
	idleOnce sync.Once

	// inForce holds the time bounds in force (bounds.go), set from the options and the
	// master's times at each registration.
	inForce atomic.Pointer[bounds]

	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New validates the options; Start brings the owner up.
func New(opts Options) (*Owner, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := &Owner{
		opts: opts, log: opts.Logger.With().Str("node", opts.NodeID).Logger(),
		generation: randomID(),
		token:      randomID(),
		idleStop:   make(chan struct{}),
		frames:     wire.NewFrameBudget(opts.FrameMemory),
		peerFrames: wire.NewFrameBudget(opts.FrameMemory / 4),
	}
	o.regGen.Store(o.generation)
	o.mu.st = newOwnerState(stateOptions{nodeID: opts.NodeID, generation: o.generation, segSize: opts.DRAM + opts.LandingReserve,
		isolation: opts.ClientIsolation, grace: opts.CacheGrace, hotBudget: opts.hotSetBudget(), pinBudget: opts.pinBudget(),
		putArea: opts.PutArea, areaTotal: opts.PutAreaTotal, uidShare: opts.UIDShare})
	o.copied = sync.NewCond(&o.mu.Mutex)
	o.inForce.Store(opts.boundsFor(defaultMasterTimes))
	o.cachedGets = opts.Metrics.Replicas(func() metrics.ReplicaState {
		o.mu.Lock() // reads only: no effects to apply
		defer o.mu.Unlock()
		st := &o.mu.st
		return metrics.ReplicaState{HotSetHoldings: int64(st.hot.idleLen()), HotSetBytes: st.hot.idleBytes, Records: int64(st.replicas.len())}
	})
	return o, nil
}

// lock takes Owner.mu and returns the state it guards; unlock releases it.
func (o *Owner) lock() *ownerState {
	o.mu.Lock()
	return &o.mu.st
}

// unlock releases Owner.mu, then carries out the effects the state collected while it
// was held: acks and hot-set hits go to the acker, SSD entries of dead versions are
// forgotten.
func (o *Owner) unlock() {
	fx := o.mu.st.takeEffects()
	o.mu.Unlock()
	o.apply(fx)
}

func (o *Owner) apply(fx effects) {
	if len(fx.acks) == 0 && len(fx.touched) == 0 && len(fx.ssdForget) == 0 && len(fx.ssdForgetRecords) == 0 {
		return
	}
	if o.acks != nil {
		for _, id := range fx.acks {
			o.acks.add(id)
		}
		for _, k := range fx.touched {
			o.acks.touch(k)
		}
	}
	if o.store != nil {
		for _, e := range fx.ssdForget {
			o.store.Forget(e.Key, e.PutId)
		}
		for _, e := range fx.ssdForgetRecords {
			o.store.ForgetRecord(e.Key, e.Seq)
		}
	}
}

// randomID is a random positive int64 (generations, session tokens).
func randomID() int64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("BUG: crypto/rand: %v", err))
	}
	return int64(binary.LittleEndian.Uint64(b[:])>>1) | 1
}

// prefaultLogEvery spaces the progress lines of a segment's prefault.
const prefaultLogEvery = 5 * time.Second

// prefaultProgress logs a prefault's progress every prefaultLogEvery (a large segment
// takes seconds: about 0.3 s per GiB and core here).
func (o *Owner) prefaultProgress(t0 time.Time) func(done, total int64) {
	last := t0
	return func(done, total int64) {
		if now := time.Now(); now.Sub(last) >= prefaultLogEvery && done < total {
			last = now
			o.log.Info().Int64("done", done).Int64("bytes", total).Dur("took", now.Sub(t0)).Msg("prefaulting the segment")
		}
	}
}

// Start creates the segment, serves the peer API, registers with the master, and only
// then opens the sockets: a client that finds the socket finds a ready node.
func (o *Owner) Start(ctx context.Context) error {
	t0 := time.Now()
	if err := os.MkdirAll(o.opts.Dir, 0o755); err != nil {
		return fmt.Errorf("socket dir: %w", err)
	}
	switch shared, err := wire.CheckDir(o.opts.Dir); {
	case err != nil:
		return fmt.Errorf("socket dir: %w", err)
	case shared:
		o.log.Warn().Str("dir", o.opts.Dir).Msg("the socket directory is writable by others, who could replace its sockets: give the node a directory of its own")
	}
	segOpts := shm.SegmentOptions{SealWrites: o.opts.ClientIsolation, Populate: o.opts.Prefault, HugePages: o.opts.HugePages}
	if o.opts.Prefault {
		segOpts.Progress = o.prefaultProgress(t0)
	}
	seg, err := shm.CreateSegment(shm.MemfdName("fluxkv-", o.opts.NodeID, ""), o.opts.DRAM+o.opts.LandingReserve, segOpts)
	if err != nil {
		return fmt.Errorf("create segment: %w", err)
	}
	o.seg = seg
	o.mu.st.segSize = seg.Size()
	ev := o.log.Info().Int64("bytes", o.opts.DRAM).Int64("landing_reserve", o.opts.LandingReserve).Bool("client_isolation", o.opts.ClientIsolation).
		Bool("prefault", o.opts.Prefault).Bool("huge_pages", o.opts.HugePages).Str("shmem_thp", shm.ShmemTHP())
	if n, err := seg.HugeBytes(); err != nil {
		ev = ev.AnErr("huge_bytes_error", err)
	} else {
		ev = ev.Int64("huge_bytes", n)
	}
	if o.opts.ClientIsolation {
		ev = ev.Int64("put_area", o.opts.PutArea).Int64("put_area_total", o.opts.PutAreaTotal)
	}
	ev.Dur("took", time.Since(t0)).Msg("segment created")

	if o.opts.SSD != nil {
		so := *o.opts.SSD
		if so.Logger == nil {
			l := o.log
			so.Logger = &l
		}
		t1 := time.Now()
		if o.store, err = ssd.Open(so); err != nil {
			o.closeResources()
			return fmt.Errorf("open SSD tier: %w", err)
		}
		o.stager = newStager(o, stageSessionSlots)
		o.persistPins = newPinBudget(o.store.RingBytes())
		o.evictQ = newEvictQueue(&o.log, o.store.DroppedEvictions)
		st := o.store.Stats()
		o.log.Info().Int64("capacity", st.CapacityBytes).Int("devices", len(st.Devices)).Str("engine", st.Engine).
			Dur("took", time.Since(t1)).Msg("SSD tier opened")
	}
	o.peer, err = startPeerServer(o, o.opts.PeerListen)
	if err != nil {
		o.closeResources()
		return err
	}
	if err := o.startDataPlane(); err != nil {
		o.closeResources()
		return err
	}
	o.master, err = newMasterLink(o)
	if err != nil {
		o.closeResources()
		return err
	}
	o.acks = newAcker(o)
	rctx, cancel := context.WithTimeout(ctx, o.opts.RegisterTimeout)
	err = o.master.registerUntil(rctx)
	cancel()
	if err != nil {
		o.failStart()
		return err
	}
	o.wg.Add(1)
	go o.master.heartbeatLoop()
	o.wg.Add(1)
	go o.idleLoop(o.idleStop)
	if o.store != nil {
		o.wg.Add(1)
		go o.forwardEvictions()
	}

	svc := externalservice.NewServiceInfo()
	o.rpc, err = listenFramed(wire.RPCSocketPath(o.opts.SocketPath()), o.opts.SocketMode, svc, &externalHandler{o: o}, o.log, o.opts.Metrics,
		connLimits{MaxConns: o.opts.MaxConnections, FrameTimeout: o.opts.FrameTimeout, IdleTimeout: o.opts.IdleTimeout, Live: o.sessionLive, Budget: o.frames,
			UIDShare: o.opts.UIDShare, Lost: o.lostReply})
	if err != nil {
		o.failStart()
		return err
	}
	// The uids admitted by uid alone (--allow-uid) are in no group of the sockets: an
	// ACL lets them connect (permitAttach still decides who attaches).
	if err := shm.GrantUsers(wire.RPCSocketPath(o.opts.SocketPath()), o.opts.AllowedUIDs); err != nil {
		o.rpc.close()
		o.failStart()
		return err
	}
	// The attach socket comes last: its appearance means "ready".
	o.attachLn, err = shm.ListenUnix(o.opts.SocketPath(), o.opts.SocketMode)
	if err == nil {
		if err = shm.GrantUsers(o.opts.SocketPath(), o.opts.AllowedUIDs); err != nil {
			o.attachLn.Close()
		}
	}
	if err != nil {
		o.rpc.close()
		o.failStart()
		return err
	}
	o.wg.Add(1)
	go o.acceptAttach(o.newAttachAcceptor())
	o.log.Info().Str("socket", o.opts.SocketPath()).Int64("generation", o.generation).Dur("took", time.Since(t0)).Msg("owner ready")
	return nil
}

// Generation is this incarnation's id: the one its externals name.
func (o *Owner) Generation() int64 { return o.generation }

// nodeGen is the generation of this owner's registration with the master: the master
// plans the pulls from this owner, and its calls to it, under the registration they name,
// and each registration tombs the one before it at the master (its in-flight gets, puts
// and persists end there). A pull or a call naming an earlier one is refused
// (STALE_GENERATION, or the data plane's fence): an owner tombed while alive keeps its
// process and segment, and the range such a pull names may hold another value by now.
func (o *Owner) nodeGen() int64 { return o.regGen.Load() }

// masterTook reports whether gen is the last registration generation a master took
// (registration.takenGen).
func (o *Owner) masterTook(gen int64) bool {
	st := o.lock()
	defer o.unlock()
	return st.reg.takenGen == gen
}

// checkNodeGen refuses what, a call of the master or another owner naming the
// registration gen, unless gen is this owner's registration (nodeGen).
func (o *Owner) checkNodeGen(what string, gen int64) error {
	if cur := o.nodeGen(); gen != cur {
		return errCode(common.ErrorCode_STALE_GENERATION, "%s for generation %d reached generation %d of node %q", what, gen, cur, o.opts.NodeID)
	}
	return nil
}

// SocketPath is the attach socket.
func (o *Owner) SocketPath() string { return o.opts.SocketPath() }

// Registered reports whether this owner is registered with a master that answered
// its registration or a heartbeat within the lease (readiness and metrics).
func (o *Owner) Registered() bool {
	st := o.lock()
	defer o.unlock()
	return st.reg.masterEpoch != 0 && st.leased(time.Now())
}

// Stop stops accepting, ends every session (revoking in-flight puts, releasing
// holders), flushes acks to the master, and removes the sockets. Bounded by
// ShutdownTimeout.
func (o *Owner) Stop() error {
	o.stopOnce.Do(func() {
		t0 := time.Now()
		if o.attachLn != nil {
			o.attachLn.Close()
		}
		// A hello being handled now must not register a session after the list below
		// is taken: nobody would end it and the wait group would never drain.
		st := o.lock()
		st.stopping = true
		o.unlock()
		done := make(chan struct{})
		go func() {
			// The calls in progress (gets writing into the segment) are joined within
			// the bound too: a get pulling from a slow peer held Stop for its transfer
			// timeout before the bound began (a review); past the bound the puller is
			// closed below, and its pull fails at once.
			if o.rpc != nil {
				o.rpc.close()
			}
			st := o.lock()
			ss := make([]*session, 0, len(st.sessions))
			for _, s := range st.sessions {
				ss = append(ss, s)
			}
			o.unlock()
			for _, s := range ss {
				o.endSession(s, "owner shutting down")
			}
			if o.acks != nil {
				o.sweepIdle(true)
				o.acks.close()
			}
			close(done)
		}()
		timedOut := false
		select {
		case <-done:
		case <-time.After(o.opts.ShutdownTimeout):
			timedOut = true
			o.log.Warn().Msg("shutdown: in-flight work did not finish in time; cutting it short")
			if o.master != nil {
				o.master.cutShort() // master calls still waiting (revokes, acks, commits) fail now
			}
		}
		if o.stager != nil {
			o.stager.close() // refills being staged for others end now
		}
		if o.peer != nil {
			o.peer.stop() // no more persists; closeResources nils it after the joins
		}
		o.stopDataPlane() // no more pulls from or into the segment
		if o.store != nil {
			o.store.Close() // ends forwardEvictions after a last batch
		}
		if o.master != nil {
			o.master.close()
			o.stopIdle()
		}
		// Everything the ending goroutine waits on is shut now, and its master calls fail
		// at once after a timeout: it ends soon. Peer calls that read or write the segment are waited
		// for too; only then is the segment unmapped (closeResources).
		<-done
		o.closeSegmentUsers()
		if timedOut {
			o.log.Warn().Dur("took", time.Since(t0)).Msg("shutdown: the cut-short work has ended")
		}
		o.wg.Wait()
		o.closeResources()
		o.log.Info().Dur("took", time.Since(t0)).Msg("owner stopped")
	})
	return nil
}

// failStart undoes a Start that failed after the acker started: the background loops
// stop and are joined, then the resources close.
func (o *Owner) failStart() {
	o.master.close() // the heartbeat loop ends
	o.stopIdle()
	if o.store != nil {
		o.store.Close() // forwardEvictions ends
	}
	o.acks.close()
	o.wg.Wait()
	o.closeResources()
}

// stopIdle ends the idle loop (once).
func (o *Owner) stopIdle() { o.idleOnce.Do(func() { close(o.idleStop) }) }

func (o *Owner) closeResources() {
	if o.stager != nil {
		o.stager.close()
	}
	if o.peer != nil {
		o.peer.stop()
		o.peer = nil
	}
	o.stopDataPlane()
	if o.store != nil {
		o.store.Close()
		o.store = nil
	}
	if o.seg != nil {
		o.seg.Close()
		o.seg = nil
	}
	if o.master != nil {
		o.master.release()
	}
}

// Capacity reports segment and SSD capacity and use for metrics. The segment's used
// bytes come from the master (it owns allocation): its heartbeat answers carry them,
// at most two heartbeat periods old here; without such an answer that recent (an
// earlier master, or one that does not answer) this makes a Stat call. While the
// master does not answer (or does not list this owner) the segment figures are its
// last answer; before the first they are unknown (their gauges left out).
func (o *Owner) Capacity() metrics.Capacity {
	c := metrics.Capacity{SegmentUnknown: true}
	if o.store != nil {
		st := o.store.Stats()
		c.SSDCapacity, c.SSDUsed = st.CapacityBytes, st.UsedBytes
	}
	if time.Since(time.Unix(0, o.segBeat.Load())) > 2*o.heartbeatPeriod() {
		o.statPool()
	}
	if seg := o.segUse.Load(); seg != nil {
		c.SegmentCapacity, c.SegmentUsed, c.SegmentUnknown = seg.CapacityBytes, seg.UsedBytes, false
	}
	return c
}

// statPool asks the master's Stat for this owner's memory pool (the segment less the
// transfer and landing areas) and keeps it in segUse.
func (o *Owner) statPool() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := o.master.cl().Stat(ctx, &mp.StatRequest{})
	if err != nil || r.Code != common.ErrorCode_OK {
		return
	}
	for _, m := range r.Members {
		if m.NodeId == o.opts.NodeID && m.MemorySegment != nil {
			o.segUse.Store(m.MemorySegment)
		}
	}
}

func errCode(code common.ErrorCode, format string, args ...any) error {
	return wire.Errorf(code, format, args...)
}

// regEpoch is the registration epoch, read before a master call whose answer must not
// straddle a registration.
func (o *Owner) regEpoch() uint64 {
	st := o.lock()
	defer o.unlock()
	return st.reg.epoch
}

// replicaMark is the replica index's mark for an answer to a call starting now.
func (o *Owner) replicaMark() uint64 {
	st := o.lock()
	defer o.unlock()
	return st.replicas.mark()
}

// admit is ownerState.admit taking Owner.mu.
func (o *Owner) admit(epoch int64) error {
	st := o.lock()
	defer o.unlock()
	return st.admit(epoch)
}

// masterEpoch is the epoch of the master this owner last registered with (0: none).
// sawLeaderEpoch records an HA leader's epoch seen on etcd (registration.seenEpochs).
func (o *Owner) sawLeaderEpoch(e int64) {
	st := o.lock()
	defer o.unlock()
	st.sawLeaderEpoch(e)
}

func (o *Owner) masterEpoch() int64 {
	st := o.lock()
	defer o.unlock()
	return st.reg.masterEpoch
}
