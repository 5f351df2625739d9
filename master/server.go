package master

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/kitex/pkg/endpoint"
	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/peerclient"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Server serves MasterService over TCP with Kitex. It wraps State once with a mutex;
// waits for space happen outside the lock.
type Server struct {
	opts  Options
	epoch int64
	// gate, when set (a term of an HA master), says whether the master may serve now:
	// every use of the state checks it and fails with its error (NOT_LEADER).
	gate func() error
	// gateShut: the gate was found shut and not open since; gateOpenSeen: the last look
	// that found it open; gateShutFirst, gateShutLast: the first and the last looks that
	// found it shut since (gateOpenLocked).
	gateShut                                  bool
	gateOpenSeen, gateShutFirst, gateShutLast time.Time
	// masters lists the masters for Stat; nil: this one alone, the leader.
	masters func(ctx context.Context) []*common.MasterInfo
	// quietUntil (Unix nanoseconds): deletes and publishes answer no earlier
	// (Options.WriteQuiet; raised by quietAtLeast).
	quietUntil atomic.Int64

	mu sync.Mutex // protects st
	st *State

	peers    *peerclient.Clients
	inval    *invalidator
	persist  *persister
	ln       net.Listener
	svr      server.Server
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup

	testServerOpts []server.Option // added to the Kitex server's options by tests
}

// NewServer returns a master that is not yet listening.
func NewServer(opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	now := time.Now()
	s := &Server{opts: opts, epoch: cmp.Or(opts.Epoch, now.UnixNano()), st: NewState(opts), stop: make(chan struct{})}
	s.quietUntil.Store(now.Add(opts.WriteQuiet).UnixNano())
	s.st.OpenRebuild(now)
	return s, nil
}

// Start listens on addr (host:port; port 0 picks one) and serves in the background.
func (s *Server) Start(addr string) error {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("master listen %s: %w", addr, err)
	}
	if err := s.serve(raw); err != nil {
		raw.Close()
		return err
	}
	return nil
}

// serve serves on raw in the background; Stop closes it.
func (s *Server) serve(raw net.Listener) error {
	// Every connection authenticates before Kitex reads a call from it (docs/architecture.md §11).
	ln := auth.Listener(raw, s.opts.Secrets, auth.PurposeMaster,
		auth.ListenerOptions{Logger: s.opts.Logger, Metrics: s.opts.Metrics})
	// and every frame is checked before Kitex decodes a byte of it (wire.GuardListener).
	ln = wire.GuardListener(ln, wire.GuardOptions{Socket: auth.PurposeMaster,
		Budget: wire.NewFrameBudget(s.opts.FrameMemory), Logger: s.opts.Logger, Metrics: s.opts.Metrics})
	s.ln = ln
	s.peers = peerclient.NewMaster(s.opts.Secrets, s.opts.MasterKey, s.opts.PeerConnectTimeout)
	s.inval = newInvalidator(*s.opts.Logger, s.peers, s.opts.InvalidateTimeout, s.opts.InvalidateQueue, s.epoch, s.liveOwner)
	s.persist = newPersister(s)
	opts, started := auth.ServerOptionsStarted(ln)
	opts = append(opts,
		server.WithServerBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "fluxkv-master"}),
		server.WithExitWaitTime(time.Second))
	if !s.opts.NoCallMetrics {
		opts = append(opts, server.WithMiddleware(s.metricsMiddleware))
	}
	s.svr = masterservice.NewServer(&handler{s: s}, append(opts, s.testServerOpts...)...)
	errc := make(chan error, 1)
	go func() { errc <- s.svr.Run() }()
	select {
	case err := <-errc:
		return fmt.Errorf("master serve: %w", err)
	case <-started:
	}
	s.wg.Add(1)
	go s.maintainLoop()
	s.opts.Logger.Debug().Str("addr", ln.Addr().String()).Int64("epoch", s.epoch).Msg("master serving")
	return nil
}

// Addr is the bound TCP address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Epoch numbers this master's state for the owners (its term's, under HA).
func (s *Server) Epoch() int64 { return s.epoch }

// Members counts the owners registered and not tombed (the /metrics gauge).
func (s *Server) Members() int {
	n := 0
	s.Inspect(func(st *State) { n = len(st.nodes) })
	return n
}

// Stop stops serving and the background loops; a second call does nothing.
func (s *Server) Stop() error {
	stopped := true
	s.stopOnce.Do(func() { stopped = false })
	if stopped {
		return nil
	}
	close(s.stop)
	s.wg.Wait()
	var err error
	if s.svr != nil {
		err = s.svr.Stop()
		s.ln.Close() // Kitex closed it; this also drains connections if it did not
	}
	if s.inval != nil {
		s.inval.close()
	}
	if s.persist != nil {
		s.persist.close(2 * time.Second)
	}
	return err
}

// maintainLoop tombs silent owners and reclaims expired in-flight work. While the gate
// is shut (an HA leader cut off from etcd) owners cannot heartbeat, so nothing is
// tombed, and their silence is forgiven when it opens again.
func (s *Server) maintainLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.HeartbeatInterval / 2)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			s.mu.Lock()
			if s.gateOpenLocked(now) {
				s.st.Maintain(now) // tombs: write-backs pass to other copies
			}
			s.unlock()
		}
	}
}

// gateOpenLocked reports whether the gate is open at now. The first look that finds it
// open after one found it shut forgives every owner the silence of the time the gate
// was shut (it could not heartbeat): whoever judges an owner silent (maintainLoop, an
// invalidation given up on) looks here first. That time is estimated from the looks: the
// shut began halfway between the last look that found the gate open and the first that
// found it shut, and ended halfway between the last that found it shut and now. Forgiven
// from scratch at each reopening, an owner that died was never judged silent while the
// gate of a leader with a slow path to etcd shut and opened again within two heartbeat
// intervals (a review), nor when forgiven all the time since the last open look.
func (s *Server) gateOpenLocked(now time.Time) bool {
	open := s.gate == nil || s.gate() == nil
	switch {
	case !open:
		if !s.gateShut {
			s.gateShut, s.gateShutFirst = true, now
		}
		s.gateShutLast = now
		return false
	case s.gateShut:
		s.gateShut = false
		shut := s.gateShutLast.Sub(s.gateShutFirst) + s.gateShutFirst.Sub(s.gateOpenSeen)/2 + now.Sub(s.gateShutLast)/2
		if s.gateOpenSeen.IsZero() {
			shut = now.Sub(s.gateShutFirst) // shut from the start: all of it
		}
		s.st.Forgive(max(shut, 0), now)
	}
	s.gateOpenSeen = now
	return true
}

// locked runs f under the lock whether or not the gate is open: the master's own
// bookkeeping (liveness checks of owners, ends of persists and pulls) must not take a
// shut gate (etcd slow for a moment) for a dead owner.
func (s *Server) locked(f func(st *State) error) error {
	s.mu.Lock()
	defer s.unlock()
	return f(s.st)
}

// unlock releases the lock taken to change the state, then submits the SSD write-backs
// started under it (writeback.go: the persister's full queue ends a task under the
// lock, so submit must not run with it held). Deferred, it runs on a panic too, so no
// task is lost with the call.
func (s *Server) unlock() {
	writeBacks := s.st.takeWriteBacksLocked()
	s.mu.Unlock()
	for _, t := range writeBacks {
		s.persist.submit(t)
	}
}

// withState runs f under the lock, unless the gate is shut (calls from owners). The
// hot-set releases f's evictions asked for are sent after it (hotset.go), and the
// write-backs they started are submitted once the lock is released (writeback.go).
func (s *Server) withState(f func(st *State) error) error {
	s.mu.Lock()
	defer s.unlock()
	if s.gate != nil {
		if err := s.gate(); err != nil {
			return err
		}
	}
	err := f(s.st)
	if s.st.releasesDue {
		s.st.releasesDue = false
		s.sendReleases(s.st.takeReleasesLocked())
	}
	return err
}

// withSpace runs f under the lock, retrying while it fails with NO_SPACE: every
// AllocRetryInterval (outside the lock, so holders can be released) up to AllocWait.
//
// A NO_SPACE asks the owners to give back idle holdings of their hot sets
// (ReleaseHotSet: replicas they serve without a master trip, which nothing can evict
// while held) and retries at once; while NO_SPACE persists it asks again at most every
// hotSetAskInterval. The first attempt spares sole copies where held duplicates could
// go instead, or where a get's released range may not be acked yet (State.spareHeld);
// so do the retries while an owner asked has not answered (its acks may still be on
// their way: evicting then loses a value for room that is about to be free), up to
// AllocWait or the end of ctx (an in-process caller's: waitContext), after which one last
// attempt may evict a sole copy.
func (s *Server) withSpace(ctx context.Context, f func(st *State) error) error {
	wait := waitContext(ctx)
	deadline := time.Now().Add(s.opts.AllocWait)
	var asked time.Time
	spare := true
	for {
		short, err := s.withSpare(spare, f)
		if !errors.Is(err, wire.ErrNoSpace) {
			return err
		}
		if wait.Err() != nil || time.Now().After(deadline) {
			if !spare {
				return err
			}
			spare = false // the last attempt may evict a sole copy
			continue
		}
		if time.Since(asked) >= hotSetAskInterval {
			asked = time.Now()
			spare = !s.releaseHotSets(ctx, short)
			continue
		}
		select {
		case <-wait.Done(): // the next round makes the last attempt
		case <-time.After(s.opts.AllocRetryInterval):
		}
	}
}

// withSpare runs f under the lock with State.spareHeld set to spare for its length. It
// returns the shortage f's NO_SPACE recorded, read in the same hold of the lock, and f's
// error: another allocation failing meanwhile records its own (its node may be another,
// whose owner would be asked in this one's stead).
func (s *Server) withSpare(spare bool, f func(st *State) error) (short shortage, err error) {
	err = s.withState(func(st *State) error {
		st.spareHeld, st.short = spare, shortage{}
		defer func() { st.spareHeld = false }()
		err := f(st)
		short = st.short
		return err
	})
	return short, err
}

// hotSetAskInterval spaces the ReleaseHotSet rounds of one allocation.
const hotSetAskInterval = 100 * time.Millisecond

// writeQuiet waits out the write quiet period (after the master's start, or after an
// owner tombed while its hot set may still serve: quietAtLeast) before a write answers,
// and then looks at the gate again: a term whose fence lapsed meanwhile answers the
// write NOT_LEADER, as one that lapsed during its synchronous invalidations does. It
// answered OK, and an owner that could not register with the lapsed term reported the
// deleted or replaced version to the next one, which adopted it (a review).
func (s *Server) writeQuiet(ctx context.Context) error {
	until := time.Unix(0, s.quietUntil.Load())
	if d := time.Until(until); d > 0 {
		select {
		case <-waitContext(ctx).Done():
			if time.Now().Before(until) {
				// The caller gave up first (an in-process call's context ends with the
				// owner's): the write stands, its answer may not come before the quiet
				// ends. It answered OK early, while an owner's hot set could still serve
				// the version it replaced (a review).
				return wire.Errorf(common.ErrorCode_UNAVAILABLE, "the call ended within the write quiet period: the write's outcome is unknown")
			}
		case <-time.After(d):
		}
	}
	if s.gate != nil {
		return s.gate()
	}
	return nil
}

// answerWrite sets a write's answer code to err (the gate's, after writeQuiet) unless
// the write failed already.
func answerWrite(code *common.ErrorCode, msg *string, err error) {
	if err != nil && *code == common.ErrorCode_OK {
		*code, *msg = wire.ToResponse(err)
	}
}

// quietAtLeast makes deletes and publishes answer no earlier than t.
func (s *Server) quietAtLeast(t time.Time) {
	for v := t.UnixNano(); ; {
		cur := s.quietUntil.Load()
		if cur >= v || s.quietUntil.CompareAndSwap(cur, v) {
			return
		}
	}
}

// ids is the state's last issued put, get or holder id, and the highest one owners
// brought from earlier masters.
func (s *Server) ids() (next, carried int64) {
	s.Inspect(func(st *State) { next, carried = st.nextID, st.carriedID })
	return next, carried
}

// Inspect runs f on the core under the lock: a consistent snapshot for tests, status
// and metrics.
func (s *Server) Inspect(f func(st *State)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.st)
}

// Capacity sums segment and SSD capacity and use over the live members (the
// standalone master's /metrics gauges).
func (s *Server) Capacity() metrics.Capacity {
	var c metrics.Capacity
	s.Inspect(func(st *State) {
		for _, m := range st.Members() {
			c.SegmentCapacity += m.MemorySegment.CapacityBytes
			c.SegmentUsed += m.MemorySegment.UsedBytes
			c.SSDCapacity += m.KvSsd.CapacityBytes
			c.SSDUsed += m.KvSsd.UsedBytes
		}
	})
	return c
}

// metricsMiddleware counts every call by method and result code.
func (s *Server) metricsMiddleware(next endpoint.Endpoint) endpoint.Endpoint {
	return func(ctx context.Context, req, resp any) error {
		ri := rpcinfo.GetRPCInfo(ctx)
		method := "unknown"
		if ri != nil && ri.To() != nil {
			method = ri.To().Method()
		}
		done := s.opts.Metrics.Inflight(method)
		start := time.Now()
		err := next(ctx, req, resp)
		done()
		result := metrics.ResultError
		if err == nil {
			if r, ok := resp.(interface{ GetResult() any }); ok {
				if c, ok := r.GetResult().(interface{ GetCode() common.ErrorCode }); ok {
					switch c.GetCode() {
					case common.ErrorCode_OK:
						result = metrics.ResultOK
						switch r := c.(type) {
						case interface{ GetExists() bool }:
							if !r.GetExists() {
								result = metrics.ResultMiss // an Exists of an absent key
							}
						case *mp.BatchPutStartResponse:
							if batchPutFailed(r.Results) {
								result = metrics.ResultError
							}
						case *mp.BatchPutDoneResponse:
							if batchPutFailed(r.Results) {
								result = metrics.ResultError
							}
						}
					case common.ErrorCode_KEY_NOT_FOUND:
						result = metrics.ResultMiss
					case common.ErrorCode_NOT_LEADER:
						result = metrics.ResultNotLeader // an HA standby redirecting, by design
					case common.ErrorCode_ALREADY_EXISTS:
						switch c.(type) {
						case *mp.PutStartResponse, *mp.PutDoneResponse:
							result = metrics.ResultOK // reject_if_exists: a key already cached, as in a BatchPutStart
						}
					}
				}
			}
		}
		s.opts.Metrics.Observe(method, result, time.Since(start))
		return err
	}
}

// batchPutFailed reports whether a put of a batch failed, as a PutStart or PutDone of
// it alone would count: an item refused ALREADY_EXISTS (reject_if_exists: a KV page
// already cached) is skipped, not failed.
func batchPutFailed[R interface{ GetCode() common.ErrorCode }](rs []R) bool {
	for _, r := range rs {
		if c := r.GetCode(); c != common.ErrorCode_OK && c != common.ErrorCode_ALREADY_EXISTS {
			return true
		}
	}
	return false
}

// listMasters is the masters for Stat: this one alone, or the HA candidates on etcd.
func (s *Server) listMasters(ctx context.Context) []*common.MasterInfo {
	if s.masters != nil {
		return s.masters(ctx)
	}
	return []*common.MasterInfo{{Addr: s.ln.Addr().String(), Leader: true, Epoch: s.epoch}}
}

// liveOwner reports whether the owner id at peer address addr is registered and not
// tombed: invalidations to any other are dropped.
func (s *Server) liveOwner(id, addr string) bool {
	live := false
	s.locked(func(st *State) error { live = liveOwnerLocked(st, id, 0, addr); return nil })
	return live
}
