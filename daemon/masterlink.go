package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/klog"
	"github.com/cloudwego/kitex/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// masterLink is the owner's connection to the master: registration, heartbeats and
// re-registration after a master restart. With masters on etcd (Options.MasterEtcd)
// it follows the leader published there and registers with each new one.
type masterLink struct {
	o      *Owner
	client atomic.Pointer[masterClient] // nil: no leader known yet (etcd)
	ref    *mp.NodeRef
	etcd   *clientv3.Client // nil without MasterEtcd
	// follow runs the leader watch; cancelled by close, joined by release.
	followCtx    context.Context
	followCancel context.CancelFunc
	followWG     sync.WaitGroup
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

	// settling is closed once the registration in progress (and its replica report) is
	// over; allocating calls wait for it (settled).
	settling atomic.Pointer[chan struct{}]

	mu     sync.Mutex // protects closed, rereg
	closed bool       // no background re-registration starts once set
	rereg  bool       // a background re-registration is running
}

// masterClient is a Kitex client of one master address. ctx is cancelled when another
// master becomes the current one: calls still waiting on this one (a leader cut off
// the network answers nothing) fail at once instead of at their timeout.
type masterClient struct {
	masterservice.Client
	addr   string
	ctx    context.Context
	cancel context.CancelFunc
}

func newMasterLink(o *Owner) (*masterLink, error) {
	m := &masterLink{o: o, stop: make(chan struct{}), peerAddr: o.peerAddr, dataAddr: o.dataAddr,
		ref: &mp.NodeRef{NodeId: o.opts.NodeID, Generation: o.generation}}
	m.period.Store(int64(time.Second))
	m.base = time.Now()
	m.acked.Store(&evictAck{})
	m.followCtx, m.followCancel = context.WithCancel(context.Background())
	if o.opts.MasterEtcd == nil {
		if err := m.dial(o.opts.MasterAddr); err != nil {
			return nil, err
		}
		return m, nil
	}
	cli, err := o.opts.MasterEtcd.Client()
	if err != nil {
		return nil, fmt.Errorf("master on etcd: %w", err)
	}
	m.etcd = cli
	m.followWG.Add(1)
	go m.follow()
	return m, nil
}

// dial makes the client of the master at addr the current one.
func (m *masterLink) dial(addr string) error {
	c, err := masterservice.NewClient("fluxkv-master", append(auth.ClientOptions(m.o.opts.Secrets, auth.PurposeMaster),
		client.WithHostPorts(addr),
		client.WithRPCTimeout(m.o.opts.MasterTimeout),
		client.WithConnectTimeout(time.Second),
		client.WithTransportProtocol(transport.Framed),
	)...)
	if err != nil {
		return fmt.Errorf("master client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if old := m.client.Swap(&masterClient{Client: c, addr: addr, ctx: ctx, cancel: cancel}); old != nil {
		old.cancel()
	}
	return nil
}

// cl is the client of the current master. Only register runs before the first
// registration, and it checks that a master (the leader on etcd) is known.
func (m *masterLink) cl() masterservice.Client { return m.client.Load() }

// follow watches the leader on etcd and registers with each new one (reporting the
// replica index, as after a master restart) until it is registered with its epoch.
func (m *masterLink) follow() {
	defer m.followWG.Done()
	var latest atomic.Pointer[ha.Record]
	wake := make(chan struct{}, 1)
	m.followWG.Add(1)
	go func() {
		defer m.followWG.Done()
		ha.Watch(m.followCtx, m.etcd, *m.o.opts.MasterEtcd, m.o.log, func(r ha.Record, ok bool) {
			if !ok {
				m.o.log.Info().Str("candidate", r.Addr).Msg("no master leads on etcd now")
				return
			}
			latest.Store(&r)
			select {
			case wake <- struct{}{}:
			default:
			}
		})
	}()
	for {
		select {
		case <-m.followCtx.Done():
			return
		case <-wake:
		}
		r := latest.Load()
		for attempt := 1; latest.Load() == r && m.epoch.Load() != r.Epoch; attempt++ {
			if c := m.client.Load(); c == nil || c.addr != r.Addr {
				if err := m.dial(r.Addr); err != nil {
					m.o.log.Error().Err(err).Str("master", r.Addr).Msg("cannot make a client of the new leader")
					break
				}
				m.o.log.Info().Str("master", r.Addr).Int64("epoch", r.Epoch).Msg("following the master leader")
			}
			ctx, cancel := context.WithTimeout(m.followCtx, 5*time.Second)
			err := m.register(ctx)
			cancel()
			if err == nil && m.epoch.Load() == r.Epoch {
				continue // registered with this leader
			}
			if err != nil && attempt%10 == 1 {
				m.o.log.Warn().Err(err).Str("master", r.Addr).Int("attempt", attempt).Msg("registering with the new leader failed; retrying")
			}
			select {
			case <-m.followCtx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// addr names the master for logs: its address, or the etcd endpoints it is followed on.
func (m *masterLink) addr() string {
	if c := m.client.Load(); c != nil {
		return c.addr
	}
	if e := m.o.opts.MasterEtcd; e != nil {
		return ha.Scheme + strings.Join(e.Endpoints, ",") + e.Prefix
	}
	return m.o.opts.MasterAddr
}

// close stops the heartbeat loop and the leader watch; no background re-registration
// starts afterwards (running ones are joined by the owner's wait group).
func (m *masterLink) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		close(m.stop)
		m.followCancel()
	}
}

// release closes the link and its etcd client once the leader watch has ended.
func (m *masterLink) release() {
	m.close()
	m.followWG.Wait()
	if m.etcd != nil {
		m.etcd.Close()
	}
}

// registerUntil retries Register until it succeeds or ctx ends.
func (m *masterLink) registerUntil(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := m.register(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, auth.ErrAuthFailed) && !errors.Is(err, auth.ErrHandshakeIncomplete) {
			// A secret that does not match will not match on the next try either; a
			// handshake cut short may (an overloaded master sheds connections in their
			// handshake, a restarting one closes them).
			return fmt.Errorf("register with master %s: %w", m.addr(), err)
		}
		m.o.log.Warn().Err(err).Int("attempt", attempt).Str("master", m.addr()).Msg("register with master failed; retrying")
		select {
		case <-ctx.Done():
			return fmt.Errorf("register with master %s: %w", m.addr(), err)
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
	if m.client.Load() == nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "no master leads on etcd yet")
	}
	if epoch := m.epoch.Load(); epoch != 0 {
		resp, err := m.heartbeat(ctx)
		if err == nil && resp.Code == common.ErrorCode_OK && resp.MasterEpoch == epoch {
			return nil
		}
	}
	// Until the new master adopted this owner's report it does not know which ranges of
	// the pool hold replicas: a range it handed out for a new put or a get target now
	// would overwrite one (the replica lost). Allocating calls wait.
	settling := make(chan struct{})
	m.settling.Store(&settling)
	defer close(settling)
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
	pins = append(pins, o.getPinsLocked()...)  // get targets being written
	pins = append(pins, o.pullPinsLocked()...) // pooled puts being pulled in
	o.registering = true
	// The new master knows no versions: forget cached infos (held ones stay pinned;
	// idle ones nobody holds, and the new master never knew them).
	o.cache.reset()
	o.regEpoch++
	o.mu.Unlock()
	prev := m.epoch.Load()
	resp, err := m.cl().Register(ctx, &mp.RegisterRequest{
		Node: m.ref, SegmentSize: o.seg.Size(), PeerAddr: m.peerAddr, DataAddr: m.dataAddr,
		TransferReserve: o.opts.TransferReserve,
		KvSsdStorage:    o.ssdInfo(), Pinned: pins, PrevEpoch: prev,
	})
	if err == nil && resp.Code == common.ErrorCode_OK {
		m.epoch.Store(resp.MasterEpoch) // admit() judges peer calls by it from now on
	}
	o.mu.Lock()
	o.registering = false
	o.mu.Unlock()
	if err != nil {
		return err
	}
	if err := wire.FromResponse(resp.Code, resp.Message); err != nil {
		return err
	}
	if resp.HeartbeatIntervalMs > 0 {
		m.period.Store(int64(time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond))
	}
	o.log.Info().Int64("master_epoch", resp.MasterEpoch).Str("master", m.addr()).Int("pinned", len(pins)).Msg("registered with master")
	if prev != 0 {
		o.opts.Metrics.Reregistered()
	}
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
		if resp.Code == common.ErrorCode_OK && resp.MasterEpoch != m.epoch.Load() {
			// A master of another epoch knows this owner: a registration whose answer
			// was lost (it may wait for this owner's report). Register again.
			m.o.log.Warn().Int64("master_epoch", resp.MasterEpoch).Msg("the master's epoch is not the one this owner registered with; registering again")
			m.reregisterInBackground()
		}
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
	resp, err := m.cl().Heartbeat(ctx, &mp.HeartbeatRequest{Node: m.ref, KvSsdStorage: m.o.ssdInfo(),
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

// ctx bounds one master call; it ends early when another master becomes the current one.
func (m *masterLink) ctx() (context.Context, context.CancelFunc) {
	base := context.Background()
	if c := m.client.Load(); c != nil {
		base = c.ctx
	}
	return context.WithTimeout(base, m.o.opts.MasterTimeout)
}

// check maps a master call's outcome to an error: transport failures are UNAVAILABLE;
// STALE_GENERATION (the master lost this owner) triggers re-registration in the background.
func (m *masterLink) check(code common.ErrorCode, msg string, err error) error {
	if err != nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "master unreachable: %v", err)
	}
	switch code {
	case common.ErrorCode_STALE_GENERATION:
		m.reregisterInBackground()
		return errCode(common.ErrorCode_UNAVAILABLE, "master lost this owner's registration (restarted); retry: %s", msg)
	case common.ErrorCode_NOT_LEADER:
		// A failover: the owner registers with the new leader when etcd names it.
		return errCode(common.ErrorCode_UNAVAILABLE, "master failover in progress; retry: %s", msg)
	}
	return wire.FromResponse(code, msg)
}

// settled waits until no registration is in progress, or ctx ends (UNAVAILABLE).
func (m *masterLink) settled(ctx context.Context) error {
	ch := m.settling.Load()
	if ch == nil {
		return nil
	}
	select {
	case <-*ch:
		return nil
	case <-ctx.Done():
		return errCode(common.ErrorCode_UNAVAILABLE, "registering with the master took too long; retry")
	}
}

// admit refuses a peer call of a master older than the one this owner registered with
// last (a deposed leader, or a master before a restart): its ranges and versions may
// be stale. epoch 0 (no epoch sent) is admitted.
func (m *masterLink) admit(epoch int64) error {
	if cur := m.epoch.Load(); epoch != 0 && epoch < cur {
		return errCode(common.ErrorCode_UNAVAILABLE, "call from master epoch %d; this owner is registered with epoch %d", epoch, cur)
	}
	return nil
}

// Kitex logs through klog; keep it to warnings. Set once, before any Kitex goroutine
// can read the level.
func init() { klog.SetLevel(klog.LevelWarn) }
