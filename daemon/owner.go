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
	"time"
)

// Owner is one node's sidecar.
type Owner struct {
	opts       Options
	log        zerolog.Logger
	generation int64 // this incarnation; externals must name it in every call
	seg        *shm.Segment
	store      *ssd.Storage // nil: no SSD tier
	stager     *stager      // other owners' refills from store; nil without it

	master *masterLink
	peer   *peerServer
	acks   *acker
	data   *transfer.Server    // serves other owners' pulls from the segment
	puller *transfer.Client    // pulls from other owners into the segment
	peers  *peerclient.Clients // other owners' peer services (remote SSD staging)
	// peerAddr and dataAddr are the advertised addresses registered with the master.
	peerAddr, dataAddr string

	attachLn *net.UnixListener
	rpc      *framedServer
	frames   *wire.FrameBudget // the memory of request frames in progress, RPC and peer ports

	mu       sync.Mutex // protects sessions, cache, nextID, stopping, areas, and holdings' refs and replica
	sessions map[int64]*session
	areas    putAreaBudget // client isolation: the live sessions' put areas
	copied   *sync.Cond    // on mu: broadcast when a copy from a put area ends
	stopping bool          // Stop began: no new sessions
	// regEpoch counts registrations with a master; bumped while register collects the
	// pins under mu, so a put whose PutStart straddles it is known to be unpinned.
	regEpoch uint64
	// gets are the get targets being written (getpins.go), pinned at a registration.
	gets getTargets
	// pulls are the PullPut targets being written (put_remote.go); registering is set
	// while a registration is out, from collecting its pins to its answer.
	pulls       map[*pullTarget]bool
	registering bool
	cache       *holderCache  // key → holding of its current version (cached info)
	replicas    *replicaIndex // which key version each range of the pool holds
	// cachedGets counts gets answered from a cached holding (nil without metrics).
	cachedGets prometheus.Counter
	nextID     int64 // client ids and external holder ids
	idleStop   chan struct{}

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
		generation: randomID(), sessions: make(map[int64]*session), cache: newHolderCache(opts.CacheGrace, opts.hotSetBudget()),
		replicas: newReplicaIndex(),
		areas:    putAreaBudget{per: opts.PutArea, total: opts.PutAreaTotal},
		idleStop: make(chan struct{}),
		frames:   wire.NewFrameBudget(opts.FrameMemory),
	}
	o.copied = sync.NewCond(&o.mu)
	o.cachedGets = opts.Metrics.Replicas(func() metrics.ReplicaState {
		o.mu.Lock()
		defer o.mu.Unlock()
		return metrics.ReplicaState{HotSetHoldings: int64(o.cache.idleLen()), HotSetBytes: o.cache.idleBytes, Records: int64(o.replicas.len())}
	})
	return o, nil
}

// randomID is a random positive int64 (generations, session tokens).
func randomID() int64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("BUG: crypto/rand: %v", err))
	}
	return int64(binary.LittleEndian.Uint64(b[:])>>1) | 1
}

// Start creates the segment, serves the peer API, registers with the master, and only
// then opens the sockets: a client that finds the socket finds a ready node.
func (o *Owner) Start(ctx context.Context) error {
	t0 := time.Now()
	if err := os.MkdirAll(o.opts.Dir, 0o755); err != nil {
		return fmt.Errorf("socket dir: %w", err)
	}
	seg, err := shm.CreateSegment("fluxkv-"+o.opts.NodeID, o.opts.DRAM, shm.SegmentOptions{SealWrites: o.opts.ClientIsolation})
	if err != nil {
		return fmt.Errorf("create segment: %w", err)
	}
	o.seg = seg
	ev := o.log.Info().Int64("bytes", o.opts.DRAM).Bool("client_isolation", o.opts.ClientIsolation)
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
		o.closeResources()
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
		connLimits{MaxConns: o.opts.MaxConnections, FrameTimeout: o.opts.FrameTimeout, IdleTimeout: o.opts.IdleTimeout, Live: o.sessionLive, Budget: o.frames})
	if err != nil {
		o.closeResources()
		return err
	}
	// The attach socket comes last: its appearance means "ready".
	o.attachLn, err = shm.ListenUnix(o.opts.SocketPath(), o.opts.SocketMode)
	if err != nil {
		o.rpc.close()
		o.closeResources()
		return err
	}
	o.wg.Add(1)
	go o.acceptAttach(o.newAttachAcceptor())
	o.log.Info().Str("socket", o.opts.SocketPath()).Int64("generation", o.generation).Dur("took", time.Since(t0)).Msg("owner ready")
	return nil
}

// Generation is this incarnation's id.
func (o *Owner) Generation() int64 { return o.generation }

// SocketPath is the attach socket.
func (o *Owner) SocketPath() string { return o.opts.SocketPath() }

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
		o.mu.Lock()
		o.stopping = true
		o.mu.Unlock()
		if o.rpc != nil {
			o.rpc.close()
		}
		o.mu.Lock()
		ss := make([]*session, 0, len(o.sessions))
		for _, s := range o.sessions {
			ss = append(ss, s)
		}
		o.mu.Unlock()
		done := make(chan struct{})
		go func() {
			for _, s := range ss {
				o.endSession(s, "owner shutting down")
			}
			if o.acks != nil {
				o.sweepIdle(true)
				o.acks.close()
			}
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(o.opts.ShutdownTimeout):
			o.log.Warn().Msg("shutdown: in-flight work did not finish in time")
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
			close(o.idleStop)
		}
		o.wg.Wait()
		o.closeResources()
		o.log.Info().Dur("took", time.Since(t0)).Msg("owner stopped")
	})
	return nil
}

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

// Capacity reports segment and SSD capacity and use for metrics; the segment's used
// bytes come from the master (it owns allocation), so this makes one master call.
func (o *Owner) Capacity() metrics.Capacity {
	c := metrics.Capacity{SegmentCapacity: o.opts.DRAM}
	if o.store != nil {
		st := o.store.Stats()
		c.SSDCapacity, c.SSDUsed = st.CapacityBytes, st.UsedBytes
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := o.master.cl().Stat(ctx, &mp.StatRequest{})
	if err == nil {
		for _, m := range r.Members {
			if m.NodeId == o.opts.NodeID && m.MemorySegment != nil {
				// The memory pool: the segment less the transfer area.
				c.SegmentCapacity, c.SegmentUsed = m.MemorySegment.CapacityBytes, m.MemorySegment.UsedBytes
			}
		}
	}
	return c
}

func errCode(code common.ErrorCode, format string, args ...any) error {
	return wire.Errorf(code, format, args...)
}

// startDataPlane serves pulls from the segment, makes the puller, and fixes the
// advertised peer and data addresses (refusing loopback ones in a cluster whose master
// is not on loopback).
func (o *Owner) startDataPlane() error {
	var err error
	o.peerAddr, err = advertise(o.peer.ln.Addr(), o.opts.AdvertiseHost, o.opts.MasterAddr)
	if err != nil {
		return err
	}
	// A master names the address it dials in its proof: this one, or the local address.
	o.peer.check.Advertise(o.peerAddr)
	if err := checkReachable("--peer-listen", o.opts.PeerListen, o.peerAddr, o.opts.MasterAddr); err != nil {
		return err
	}
	o.data, err = transfer.Listen(o.opts.DataListen, segmentSource{o}, transfer.ServerOptions{
		Secrets: o.opts.Secrets, Logger: &o.log, Metrics: o.opts.Metrics})
	if err != nil {
		return fmt.Errorf("data plane: %w", err)
	}
	o.dataAddr, err = advertise(o.data.Addr(), o.opts.AdvertiseHost, o.opts.MasterAddr)
	if err != nil {
		return err
	}
	if err := checkReachable("--data-listen", o.opts.DataListen, o.dataAddr, o.opts.MasterAddr); err != nil {
		return err
	}
	o.puller = transfer.NewClient(transfer.ClientOptions{Secrets: o.opts.Secrets, Logger: &o.log, Metrics: o.opts.Metrics})
	o.peers = peerclient.New(o.opts.Secrets, time.Second)
	o.log.Info().Str("peer", o.peerAddr).Str("data", o.dataAddr).Msg("peer service and data plane serving")
	return nil
}

// stopDataPlane stops serving and making pulls (a get pulling meanwhile fails and
// revokes); later calls do nothing more. The fields stay set: gets may still read them.
func (o *Owner) stopDataPlane() {
	if o.data != nil {
		o.data.Close()
	}
	if o.puller != nil {
		o.puller.Close()
	}
}
