package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/klog"
	"github.com/cloudwego/kitex/transport"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// masterLink is the owner's connection to the master: registration, heartbeats and
// re-registration after a master restart.
type masterLink struct {
	o   *Owner
	c   masterservice.Client
	ref *mp.NodeRef
	// peerAddr and dataAddr are the advertised addresses, fixed for this incarnation.
	peerAddr, dataAddr string
	stop               chan struct{}
	regMu              sync.Mutex   // serialises (re-)registration
	period             atomic.Int64 // heartbeat period in ns, set by Register replies
	// epoch is the master epoch of the last registration (0: none yet).
	epoch atomic.Int64
	// acked is the last eviction notice applied to the replica index and the epoch of
	// the master that numbered it, acked with the next heartbeat (replaced at each
	// registration: a master's notices start at 1).
	acked atomic.Pointer[evictAck]
	// base and leaseUntil (since base, monotonic): the owner may answer gets from its
	// cached holdings only until leaseUntil, two heartbeat periods (less a margin) after
	// sending the last heartbeat or registration the master answered OK. A master that
	// stops hearing from the owner tombs it only after two periods of silence (and then
	// answers the delete that was waiting for it), by which time the owner has stopped
	// serving what may be a dead version.
	base       time.Time
	leaseUntil atomic.Int64

	mu     sync.Mutex // protects closed, rereg
	closed bool       // no background re-registration starts once set
	rereg  bool       // a background re-registration is running
}

func newMasterLink(o *Owner) (*masterLink, error) {
	c, err := masterservice.NewClient("fluxkv-master", append(auth.ClientOptions(o.opts.Secrets, auth.PurposeMaster),
		client.WithHostPorts(o.opts.MasterAddr),
		client.WithRPCTimeout(o.opts.MasterTimeout),
		client.WithConnectTimeout(time.Second),
		client.WithTransportProtocol(transport.Framed),
	)...)
	if err != nil {
		return nil, fmt.Errorf("master client: %w", err)
	}
	m := &masterLink{o: o, c: c, stop: make(chan struct{}), peerAddr: o.peerAddr, dataAddr: o.dataAddr,
		ref: &mp.NodeRef{NodeId: o.opts.NodeID, Generation: o.generation}}
	m.period.Store(int64(time.Second))
	m.base = time.Now()
	m.acked.Store(&evictAck{})
	return m, nil
}

// close stops the heartbeat loop; no background re-registration starts afterwards
// (running ones are joined by the owner's wait group).
func (m *masterLink) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		close(m.stop)
	}
}

// registerUntil retries Register until it succeeds or ctx ends.
func (m *masterLink) registerUntil(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := m.register(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, auth.ErrAuthFailed) {
			// A secret that does not match will not match on the next try either.
			return fmt.Errorf("register with master %s: %w", m.o.opts.MasterAddr, err)
		}
		m.o.log.Warn().Err(err).Int("attempt", attempt).Str("master", m.o.opts.MasterAddr).Msg("register with master failed; retrying")
		select {
		case <-ctx.Done():
			return fmt.Errorf("register with master %s: %w", m.o.opts.MasterAddr, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// register announces this incarnation with every range externals still use, so a
// restarted master never hands them out again.
//
// Several callers may ask for it after one master restart (the heartbeat loop, any call
// answered STALE_GENERATION); one that finds this incarnation already registered with
// the master it last registered with does nothing: registering again would make the
// master drop what the first registration's report rebuilt.
func (m *masterLink) register(ctx context.Context) error {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	o := m.o
	if epoch := m.epoch.Load(); epoch != 0 {
		resp, err := m.heartbeat(ctx)
		if err == nil && resp.Code == common.ErrorCode_OK && resp.MasterEpoch == epoch {
			return nil
		}
	}
	sent := time.Since(m.base)
	o.mu.Lock()
	var pins []*mp.PinnedRange
	seen := make(map[*holding]bool)
	for _, s := range o.sessions {
		for _, h := range s.holders {
			if !seen[h] {
				seen[h] = true
				pins = append(pins, &mp.PinnedRange{PinId: h.masterID, Offset: h.offset, Len: h.len})
			}
		}
		for _, p := range s.puts {
			p.pinned = true
			pins = append(pins, &mp.PinnedRange{PinId: p.putID, Offset: p.offset, Len: p.len})
		}
	}
	// The new master knows no versions: forget cached infos (held ones stay pinned;
	// idle ones nobody holds, and the new master never knew them).
	o.cache.reset()
	o.regEpoch++
	o.mu.Unlock()
	resp, err := m.c.Register(ctx, &mp.RegisterRequest{
		Node: m.ref, SegmentSize: o.seg.Size(), PeerAddr: m.peerAddr, DataAddr: m.dataAddr,
		TransferReserve: o.opts.TransferReserve,
		KvSsdStorage:    o.ssdInfo(), Pinned: pins,
	})
	if err != nil {
		return err
	}
	if err := wire.FromResponse(resp.Code, resp.Message); err != nil {
		return err
	}
	if resp.HeartbeatIntervalMs > 0 {
		m.period.Store(int64(time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond))
	}
	o.log.Info().Int64("master_epoch", resp.MasterEpoch).Int("pinned", len(pins)).Msg("registered with master")
	prev := m.epoch.Swap(resp.MasterEpoch)
	m.acked.Store(&evictAck{epoch: resp.MasterEpoch})
	m.renewLease(sent)
	switch {
	case prev == 0:
		// The first registration: nothing was learned before it.
	case prev == resp.MasterEpoch:
		// The same master tombed this incarnation: it dropped every replica here.
		o.forgetReplicas("this master dropped this owner's replicas (tombed)")
	default:
		o.reportReplicas()
	}
	return nil
}

func (m *masterLink) heartbeatLoop() {
	defer m.o.wg.Done()
	more := false // eviction notices wait at the master: heartbeat again at once
	for {
		wait := time.Duration(m.period.Load())
		if more {
			wait = 0
		}
		select {
		case <-m.stop:
			return
		case <-time.After(wait):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := m.heartbeat(ctx)
		cancel()
		more = false
		if err != nil {
			m.o.log.Warn().Err(err).Msg("heartbeat failed")
			continue
		}
		more = resp.Code == common.ErrorCode_OK && resp.EvictionsMore
		if resp.Code == common.ErrorCode_STALE_GENERATION {
			m.o.log.Warn().Str("why", resp.Message).Msg("master does not know this owner (master restarted?); registering again")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := m.register(ctx); err != nil {
				m.o.log.Warn().Err(err).Msg("re-register failed")
			}
			cancel()
		}
	}
}

// evictAck is the last eviction notice applied, numbered by the master of epoch.
type evictAck struct {
	epoch, seq int64
}

// heartbeat makes one Heartbeat call: it acks the eviction notices applied so far,
// applies the new ones, and renews the lease when the master answers OK.
func (m *masterLink) heartbeat(ctx context.Context) (*mp.HeartbeatResponse, error) {
	a := m.acked.Load()
	sent := time.Since(m.base)
	resp, err := m.c.Heartbeat(ctx, &mp.HeartbeatRequest{Node: m.ref, KvSsdStorage: m.o.ssdInfo(),
		EvictionsAck: a.seq, EvictionsEpoch: a.epoch})
	if err != nil || resp.Code != common.ErrorCode_OK {
		return resp, err
	}
	m.renewLease(sent)
	// Sequence numbers are the registration's master's: a reply of an earlier master
	// (a registration raced this heartbeat) teaches nothing.
	if resp.MasterEpoch == a.epoch && resp.EvictionsSeq > a.seq {
		m.o.applyEvictions(resp.Evicted, resp.SsdDropped)
		m.acked.CompareAndSwap(a, &evictAck{epoch: a.epoch, seq: resp.EvictionsSeq})
	}
	return resp, nil
}

// renewLease extends the lease after a call sent at sent (since base) was answered OK.
func (m *masterLink) renewLease(sent time.Duration) {
	p := time.Duration(m.period.Load())
	until := int64(sent + 2*p - p/4)
	for {
		cur := m.leaseUntil.Load()
		if until <= cur || m.leaseUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// leased reports whether the owner may answer gets from its cached holdings now.
func (m *masterLink) leased() bool { return int64(time.Since(m.base)) < m.leaseUntil.Load() }

// reregisterInBackground registers again in a goroutine the owner's wait group joins;
// at most one runs at a time, and none starts once the link is closed.
func (m *masterLink) reregisterInBackground() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.rereg {
		return
	}
	m.rereg = true
	m.o.wg.Add(1)
	go func() {
		defer m.o.wg.Done()
		defer func() {
			m.mu.Lock()
			m.rereg = false
			m.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := m.register(ctx); err != nil {
			m.o.log.Warn().Err(err).Msg("re-register failed")
		}
	}()
}

// ctx bounds one master call.
func (m *masterLink) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), m.o.opts.MasterTimeout)
}

// check maps a master call's outcome to an error: transport failures are UNAVAILABLE;
// STALE_GENERATION (the master lost this owner) triggers re-registration in the background.
func (m *masterLink) check(code common.ErrorCode, msg string, err error) error {
	if err != nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "master unreachable: %v", err)
	}
	if code == common.ErrorCode_STALE_GENERATION {
		m.reregisterInBackground()
		return errCode(common.ErrorCode_UNAVAILABLE, "master lost this owner's registration (restarted); retry: %s", msg)
	}
	return wire.FromResponse(code, msg)
}

// Kitex logs through klog; keep it to warnings. Set once, before any Kitex goroutine
// can read the level.
func init() { klog.SetLevel(klog.LevelWarn) }
