package master

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// HAOptions turn a master into one of several campaigning on etcd (docs/architecture.md §12).
type HAOptions struct {
	// Etcd names the etcd cluster and the key prefix of this fluxkv cluster.
	Etcd ha.Config
	// AdvertiseAddr is the host:port owners reach this master at, published while it
	// leads. Default: the bound listen address, which must not be a wildcard then.
	AdvertiseAddr string
	// LeaderTTL is the etcd lease TTL of the leadership (etcd may grant more). Default 2s.
	LeaderTTL time.Duration
}

// idEpochShift places a term's epoch in the high bits of its put, get and holder ids:
// 2^40 ids per term, 2^23 terms. A leader whose next id comes within idMargin of the
// next epoch's base resigns (checked every idCheck; at 300,000 ids a second a term runs
// for 42 days): the next term, of a higher epoch, numbers above every id it issued, so
// no id of a new put falls below an older version's, and no new holder takes the id of
// one an owner still acks. A term whose ids went past its range without running out
// (ids its owners carried from a master numbered otherwise: a standalone master's, by
// time) raises the epoch counter on etcd past them instead (idMark), within idCheck.
const (
	idEpochShift = 40
	idMargin     = 1 << 36
	idCheck      = time.Second
)

// idMark is the epoch counter that makes the next term number above next and idMargin
// more ids: its epoch, the counter plus one, has its base above them.
func idMark(next int64) int64 { return (next + idMargin) >> idEpochShift }

// idsRunOut reports whether a term of epoch whose next id is next, and whose owners
// brought ids up to carried from earlier masters, must end. Only ids the term issued
// count: ones carried past the next epoch's base (a standalone master's, numbered by
// time, or an epoch counter reset on etcd) would make every later term end too, and
// the term numbers above them anyway.
func idsRunOut(next, carried, epoch int64) bool {
	limit := (epoch+1)<<idEpochShift - idMargin
	return next >= limit && carried < limit
}

// HA is a master that serves only while it leads: it campaigns on etcd, answers every
// call NOT_LEADER while another master leads, and starts each leadership (a term, with
// its own epoch) from an empty state that the owners' reports rebuild.
//
// One listener serves every period: each term, and each stretch as a follower, is a
// Server of its own on a listener handed the connections the shared one accepts; a
// Server's stop closes its connections (owners reconnect to the next) and nothing of
// a term outlives it.
type HA struct {
	opts Options
	ha   HAOptions

	raw    net.Listener
	conns  chan net.Conn // accepted, waiting for the current Server's listener
	cli    *clientv3.Client
	el     *ha.Elector
	leader atomic.Pointer[ha.Record] // the leader as last seen on etcd (nil: none)

	mu  sync.Mutex // protects cur
	cur *Server

	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// NewHA returns a campaigning master that is not yet listening.
func NewHA(opts Options, h HAOptions) (*HA, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := h.Etcd.Validate(); err != nil {
		return nil, fmt.Errorf("master HA: %w", err)
	}
	if h.LeaderTTL < 0 {
		return nil, errors.New("master HA: leader TTL must not be negative")
	}
	if h.LeaderTTL == 0 {
		h.LeaderTTL = 2 * time.Second
	}
	opts.setDefaults()
	return &HA{opts: opts, ha: h, conns: make(chan net.Conn)}, nil
}

// Start listens on addr, connects to etcd and campaigns in the background; it serves
// as a follower until it leads.
func (h *HA) Start(addr string) error {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("master listen %s: %w", addr, err)
	}
	if h.ha.AdvertiseAddr == "" {
		host, _, _ := net.SplitHostPort(raw.Addr().String())
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			raw.Close()
			return fmt.Errorf("master HA: listening on %s (a wildcard): set the address owners reach this master at (--advertise-addr)", raw.Addr())
		}
		h.ha.AdvertiseAddr = raw.Addr().String()
	}
	cli, err := h.ha.Etcd.Client()
	if err != nil {
		raw.Close()
		return fmt.Errorf("master HA: %w", err)
	}
	h.raw, h.cli = raw, cli
	h.el = ha.NewElector(cli, h.ha.Etcd, ha.ElectorOptions{Addr: h.ha.AdvertiseAddr, TTL: h.ha.LeaderTTL, Logger: h.opts.Logger})
	h.ctx, h.cancel = context.WithCancel(context.Background())
	if err := h.swap(h.follower()); err != nil {
		h.cancel()
		raw.Close()
		cli.Close()
		return err
	}
	h.wg.Add(3)
	h.opts.Metrics.Leading(false) // before run: a campaign won at once sets it true
	go h.accept()
	go h.watch()
	go h.run()
	h.opts.Logger.Info().Str("addr", raw.Addr().String()).Str("advertise", h.ha.AdvertiseAddr).
		Strs("etcd", h.ha.Etcd.Endpoints).Str("prefix", h.ha.Etcd.Prefix).Msg("master campaigning on etcd")
	return nil
}

// accept hands every accepted connection to the current Server's listener.
func (h *HA) accept() {
	defer h.wg.Done()
	for {
		c, err := h.raw.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || h.ctx.Err() != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case h.conns <- c:
		case <-h.ctx.Done():
			c.Close()
			return
		}
	}
}

// watch keeps the leader's address for followers' answers.
func (h *HA) watch() {
	defer h.wg.Done()
	ha.Watch(h.ctx, h.cli, h.ha.Etcd, *h.opts.Logger, func(r ha.Record, ok bool) {
		if ok {
			h.leader.Store(&r)
		} else {
			h.leader.Store(nil)
		}
	})
}

// run campaigns, serves each term while it lasts, and serves as a follower between.
func (h *HA) run() {
	defer h.wg.Done()
	for {
		t, err := h.el.Campaign(h.ctx)
		if err != nil {
			return // stopping
		}
		var quiet time.Duration
		last, _, err := t.MarkServing(h.ctx, func(last ha.Served) ha.Served {
			now := time.Now()
			quiet = termQuiet(h.opts.HeartbeatInterval, h.ha.LeaderTTL, last, now)
			return ha.Served{Heartbeat: h.opts.HeartbeatInterval, TTL: h.ha.LeaderTTL, QuietUntil: now.Add(quiet).UnixNano(), Quiet: quiet}
		})
		var srv *Server
		if err == nil {
			srv, err = h.term(t, last, quiet)
		}
		if err == nil {
			err = h.swap(srv)
		}
		if err == nil {
			err = t.Publish(h.ctx)
		}
		if err != nil {
			h.opts.Logger.Error().Err(err).Int64("epoch", t.Epoch).Msg("cannot serve the term; resigning")
			t.Resign(context.Background())
			if err := h.swap(h.follower()); err != nil {
				h.opts.Logger.Error().Err(err).Msg("cannot serve as a follower")
			}
			select { // let another master lead
			case <-h.ctx.Done():
				return
			case <-time.After(h.ha.LeaderTTL):
			}
			continue
		}
		h.opts.Metrics.LeadershipChange(metrics.LeadershipWon, t.Epoch)
		h.opts.Metrics.Leading(true)
		h.lead(t, srv)
		h.opts.Metrics.Leading(false)
		h.opts.Metrics.LeadershipChange(metrics.LeadershipLost, t.Epoch)
		if h.ctx.Err() != nil {
			return
		}
		if err := h.swap(h.follower()); err != nil {
			h.opts.Logger.Error().Err(err).Msg("cannot serve as a follower")
		}
	}
}

// lead serves term t with srv until it ends, or the master stops (it resigns), or its
// ids run out (it resigns: idsRunOut). Ids past its epoch's range are recorded on etcd
// (idMark) as they come.
func (h *HA) lead(t *ha.Term, srv *Server) {
	tick := time.NewTicker(idCheck)
	defer tick.Stop()
	marked := t.Epoch
	for {
		select {
		case <-t.Done():
			h.opts.Logger.Warn().Int64("epoch", t.Epoch).Msg("leadership lost; following")
			return
		case <-h.ctx.Done():
			t.Resign(context.Background())
			return
		case <-tick.C:
			next, carried := srv.ids()
			if mark := idMark(next); mark > marked {
				ctx, cancel := context.WithTimeout(h.ctx, h.ha.LeaderTTL)
				if err := t.RaiseEpoch(ctx, mark); err != nil {
					h.opts.Logger.Warn().Err(err).Int64("epoch", t.Epoch).Int64("next_id", next).Msg("cannot record on etcd how far this term's ids went; retrying")
				} else {
					h.opts.Logger.Info().Int64("epoch", t.Epoch).Int64("next_id", next).Int64("epoch_counter", mark).Msg("this term's ids went past its epoch's range: the epoch counter raised past them")
					marked = mark
				}
				cancel()
			}
			if idsRunOut(next, carried, t.Epoch) {
				h.opts.Logger.Error().Int64("epoch", t.Epoch).Int64("next_id", next).Msg("this term's ids are running out; resigning, so that a term of a higher epoch numbers above them")
				t.Resign(context.Background())
			}
		}
	}
}

// term is the Server of one leadership: its epoch numbers its state and ids, and it
// serves only while the term may (ha.Term.Leading); last is the record of the term that
// served before it, and quiet the write quiet period this term recorded
// (ha.Term.MarkServing, termQuiet).
func (h *HA) term(t *ha.Term, last ha.Served, quiet time.Duration) (*Server, error) {
	if t.Epoch >= 1<<(63-idEpochShift) {
		return nil, fmt.Errorf("epoch %d: past the %d epochs ids can carry; reset %s and delete %s on etcd with every master stopped", t.Epoch, int64(1)<<(63-idEpochShift), h.ha.Etcd.Prefix+"epoch", h.ha.Etcd.Prefix+"served")
	}
	opts := h.opts
	opts.Epoch, opts.IDBase, opts.LastTermEpoch = t.Epoch, t.Epoch<<idEpochShift, last.Epoch
	if opts.WriteQuiet > 0 {
		opts.WriteQuiet = quiet
		if last.Heartbeat > 0 && (last.Heartbeat != opts.HeartbeatInterval || last.TTL != h.ha.LeaderTTL) {
			h.opts.Logger.Warn().Int64("epoch", t.Epoch).Int64("last_epoch", last.Epoch).
				Dur("heartbeat_interval", opts.HeartbeatInterval).Dur("leader_ttl", h.ha.LeaderTTL).
				Dur("last_heartbeat_interval", last.Heartbeat).Dur("last_leader_ttl", last.TTL).Dur("write_quiet", opts.WriteQuiet).
				Msg("the term before ran with another --heartbeat-interval or --leader-ttl: the masters of one group should share them (the write quiet period covers both)")
		}
	}
	s, err := NewServer(opts)
	if err != nil {
		return nil, err
	}
	s.gate = func() error {
		if t.Leading() {
			return nil
		}
		return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: the leadership of epoch %d ended (resigned, its lease lost, or no renewal answered in time by etcd)", t.Epoch)
	}
	s.masters = h.masters
	return s, nil
}

// follower is a Server that answers every call NOT_LEADER, naming the leader.
func (h *HA) follower() *Server {
	s, _ := NewServer(h.opts) // options were validated by NewHA
	s.gate = func() error {
		if r := h.leader.Load(); r != nil && r.Addr != h.ha.AdvertiseAddr {
			return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader: %s", r.Addr)
		}
		return wire.Errorf(common.ErrorCode_NOT_LEADER, "not the leader; no leader elected yet")
	}
	return s
}

// swap stops the current Server and serves with next.
func (h *HA) swap(next *Server) error {
	h.mu.Lock()
	prev := h.cur
	h.cur = nil
	h.mu.Unlock()
	if prev != nil {
		prev.Stop() // outside the lock: Capacity (metrics scrapes) does not wait for it
	}
	if err := next.serve(&handoff{conns: h.conns, addr: h.raw.Addr(), done: make(chan struct{})}); err != nil {
		return err
	}
	h.mu.Lock()
	h.cur = next
	h.mu.Unlock()
	return nil
}

// masters lists the candidates on etcd for Stat.
func (h *HA) masters(ctx context.Context) []*common.MasterInfo {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	cs, err := ha.Candidates(ctx, h.cli, h.ha.Etcd)
	if err != nil {
		h.opts.Logger.Warn().Err(err).Msg("listing the masters on etcd failed")
		return nil
	}
	out := make([]*common.MasterInfo, len(cs))
	for i, c := range cs {
		out[i] = &common.MasterInfo{Addr: c.Addr, Leader: c.Leader, Epoch: c.Epoch}
	}
	return out
}

// Stop resigns (when leading) and stops serving; a second call does nothing.
func (h *HA) Stop() error {
	var err error
	h.stopOnce.Do(func() {
		if h.cancel == nil {
			return // never started
		}
		h.cancel()
		h.raw.Close()
		h.wg.Wait()
		h.mu.Lock()
		if h.cur != nil {
			err = h.cur.Stop()
			h.cur = nil
		}
		h.mu.Unlock()
		h.cli.Close()
	})
	return err
}

// Addr is the bound TCP address.
func (h *HA) Addr() net.Addr { return h.raw.Addr() }

// Members counts the members while leading (zero otherwise).
func (h *HA) Members() int {
	h.mu.Lock()
	s := h.cur
	h.mu.Unlock()
	if s == nil {
		return 0
	}
	return s.Members()
}

// Capacity sums the members' capacity while leading (zero otherwise).
func (h *HA) Capacity() metrics.Capacity {
	h.mu.Lock()
	s := h.cur
	h.mu.Unlock()
	if s == nil {
		return metrics.Capacity{}
	}
	return s.Capacity()
}

// handoff is one Server's listener: it takes the connections the shared listener
// accepted until its Server closes it.
type handoff struct {
	conns    <-chan net.Conn
	addr     net.Addr
	done     chan struct{}
	doneOnce sync.Once
}

func (l *handoff) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoff) Close() error {
	l.doneOnce.Do(func() { close(l.done) })
	return nil
}

func (l *handoff) Addr() net.Addr { return l.addr }

// termQuiet is the write quiet period of a term starting at now. Owners answer gets from
// their hot sets until their lease, 2 heartbeat intervals less a quarter after the last
// heartbeat the previous leader answered, and that leader answered none after it stopped
// serving, at least Margin of its TTL before this term: deletes and publishes wait out
// the rest. The leases are the previous term's, on its timing (last; none known: this
// master's own), and, when that term ended within its own quiet period, those of the
// terms before it, which that quiet period outlasted (until last.QuietUntil, on the
// masters' clocks: one running ahead of the last term's waits less by its lead, and
// none waits more than that term's whole quiet period). The longest is waited, so a
// group whose masters disagree stays safe.
func termQuiet(heartbeat, ttl time.Duration, last ha.Served, now time.Time) time.Duration {
	q := 2*heartbeat - heartbeat/4 - ha.Margin(ttl)
	if last.Heartbeat > 0 {
		q = max(q, 2*last.Heartbeat-last.Heartbeat/4-ha.Margin(last.TTL))
	}
	if last.QuietUntil != 0 {
		rest := time.Unix(0, last.QuietUntil).Sub(now)
		if last.Quiet > 0 {
			// A master whose clock ran ahead recorded a later end, and one whose clock
			// runs behind reads one: no more than the whole period is left of it (an
			// hour ahead held every delete and publish for an hour, at every failover).
			rest = min(rest, last.Quiet)
		}
		q = max(q, rest)
	}
	return max(time.Millisecond, q)
}
