package ha

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Record is what a candidate keeps under its election key: its address, and once it
// leads, the epoch of its leadership (0 while it waits).
type Record struct {
	Addr  string `json:"addr"`
	Epoch int64  `json:"epoch"`
}

// ElectorOptions configure an Elector.
type ElectorOptions struct {
	// Addr is the address published for owners (host:port).
	Addr string
	// TTL is the lease TTL asked of etcd (it may grant more). Default 2s.
	TTL time.Duration
	// Logger receives structured logs. Default: disabled.
	Logger *zerolog.Logger
}

// Elector campaigns for leadership of one fluxkv cluster on etcd.
type Elector struct {
	cfg  Config
	opts ElectorOptions
	cli  *clientv3.Client
	log  zerolog.Logger
}

// NewElector returns an elector on an open etcd client (the caller closes it after the
// elector's terms ended).
func NewElector(cli *clientv3.Client, cfg Config, opts ElectorOptions) *Elector {
	if opts.TTL <= 0 {
		opts.TTL = 2 * time.Second
	}
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = *opts.Logger
	}
	return &Elector{cfg: cfg, opts: opts, cli: cli, log: log}
}

// Term is one leadership: it begins when Campaign returns it and ends when its lease is
// lost (Done) or it resigns.
type Term struct {
	// Epoch numbers this leadership: every term of a cluster has a larger one than the
	// terms before it (while etcd keeps its data).
	Epoch int64

	e        *Elector
	election *concurrency.Election
	session  *concurrency.Session
	lease    clientv3.LeaseID
	ttl      time.Duration // as granted
	base     time.Time
	// validUntil (since base, monotonic): the send time of the last keepalive etcd
	// acknowledged + the granted TTL − the margin.
	validUntil atomic.Int64
	// lastLate (since base; 0: none): when the latest acknowledgement that came too late
	// to move the fence arrived: etcd is reachable, slowly (watchFence gives the lease up
	// on it).
	lastLate atomic.Int64
	done     chan struct{}
	stop     chan struct{}
	doneOnce sync.Once
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// Margin is how long before its lease could expire at etcd a leader stops serving: it
// covers clock rate differences and the time between a check and the answer it allows.
// The next leader's term starts at least this long after the last one stopped serving.
func Margin(ttl time.Duration) time.Duration { return ttl / 4 }

// Campaign waits until this master leads and returns the term (unpublished: see
// Publish), or ctx ends. A lease
// that lapses while waiting is replaced and the campaign goes on.
func (e *Elector) Campaign(ctx context.Context) (*Term, error) {
	for {
		t, err := e.campaignOnce(ctx)
		if err == nil {
			return t, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		e.log.Warn().Err(err).Msg("campaign failed; campaigning again")
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(e.opts.TTL / 4):
		}
	}
}

func (e *Elector) campaignOnce(ctx context.Context) (*Term, error) {
	secs := max(1, int64((e.opts.TTL+time.Second-1)/time.Second))
	// etcd starts the lease's TTL when it grants it, somewhere after this.
	base := time.Now()
	cctx, cancel := context.WithTimeout(ctx, e.opts.TTL)
	g, err := e.cli.Grant(cctx, secs)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("etcd lease: %w", err)
	}
	t := &Term{e: e, lease: g.ID, ttl: time.Duration(g.TTL) * time.Second, base: base,
		done: make(chan struct{}), stop: make(chan struct{})}
	t.extend(0)
	t.wg.Add(1)
	go t.keepAlive()
	ok := false
	defer func() {
		if !ok {
			t.end(context.Background())
		}
	}()
	t.session, err = concurrency.NewSession(e.cli, concurrency.WithLease(g.ID))
	if err != nil {
		return nil, fmt.Errorf("etcd session: %w", err)
	}
	t.election = concurrency.NewElection(t.session, e.cfg.electionPrefix())
	waiting, _ := json.Marshal(Record{Addr: e.opts.Addr})
	// Campaign returns once every earlier candidate's key is gone, or fails when the
	// lease lapsed; stop waiting when this term's lease is lost. Its watch requires the
	// member to have a leader: one cut off in a minority would not deliver the delete.
	cctx, cancel = context.WithCancel(clientv3.WithRequireLeader(ctx))
	go func() {
		select {
		case <-t.done:
			cancel()
		case <-cctx.Done():
		}
	}()
	// Election.Campaign, cancelled while waiting, resigns with the client's own context
	// (unbounded): with etcd unreachable it would not return until etcd answers, and a
	// master could not stop. Stop waiting for it when cctx ends; the lease is revoked
	// (bounded) by end, and its key goes with it.
	errc := make(chan error, 1)
	go func() { errc <- t.election.Campaign(cctx, string(waiting)) }()
	select {
	case err = <-errc:
	case <-cctx.Done():
		err = cctx.Err()
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("campaign: %w", err)
	}
	if t.Epoch, err = t.nextEpoch(ctx); err != nil {
		return nil, err
	}
	if !t.Leading() {
		return nil, errors.New("the lease lapsed while taking office")
	}
	ok = true
	e.log.Info().Int64("epoch", t.Epoch).Str("addr", e.opts.Addr).Dur("lease_ttl", t.ttl).Msg("leading")
	t.wg.Add(1)
	go t.watchFence() // from now on a fence stops a leader (a candidate serves nothing)
	return t, nil
}

// Publish puts the term's epoch beside the leader's address, which tells owners to
// register: call it once the term serves.
func (t *Term) Publish(ctx context.Context) error {
	rec, _ := json.Marshal(Record{Addr: t.e.opts.Addr, Epoch: t.Epoch})
	ctx, cancel := context.WithTimeout(ctx, t.ttl)
	defer cancel()
	if err := t.election.Proclaim(ctx, string(rec)); err != nil {
		return fmt.Errorf("publish the leader's epoch: %w", err)
	}
	return nil
}

// nextEpoch raises the cluster's epoch counter by one, in a transaction that holds only
// while this candidate's election key still leads, and returns the new value.
func (t *Term) nextEpoch(ctx context.Context) (int64, error) {
	return t.setEpoch(ctx, func(cur int64) int64 { return cur + 1 })
}

// RaiseEpoch raises the cluster's epoch counter to at least to, while this term leads:
// the next term's epoch is above it. A term whose ids went past its epoch's range (ids
// its owners carried from a master numbered otherwise, adopted from their reports)
// records so how far they went, and the next term numbers above them. A counter at or
// above to is left as it is.
func (t *Term) RaiseEpoch(ctx context.Context, to int64) error {
	_, err := t.setEpoch(ctx, func(cur int64) int64 { return max(cur, to) })
	return err
}

// Served is what a term records on etcd before it serves (MarkServing): its epoch, the
// timing its owners' hot-set leases follow (the master's --heartbeat-interval and
// --leader-ttl), and when the write quiet period it waits ends (wall clock, Unix
// nanoseconds: until then the leases of the terms before it may run); the next term's
// quiet period must outlast both.
type Served struct {
	Epoch      int64         `json:"epoch"`
	Heartbeat  time.Duration `json:"heartbeat_ns"`
	TTL        time.Duration `json:"leader_ttl_ns"`
	QuietUntil int64         `json:"quiet_until_unix_ns"`
	// Quiet is the length of the term's write quiet period (0 from an earlier build):
	// a later term waits at most that much of it, whatever QuietUntil says on a clock
	// that ran ahead.
	Quiet time.Duration `json:"quiet_ns,omitempty"`
}

// MarkServing records on etcd, before the term serves, that it served: the record
// mine(last) with the term's epoch, where last is the record of the last term that did
// so before it (zero: none), which it also returns. An owner registered last with
// another master missed a term that served: it may hold versions that term deleted, and
// reports none (RegisterResponse.last_term_epoch). The key carries no lease: a term
// whose leader died long ago still counts. (It is set, not raised: after the epoch
// counter was reset by hand, the next term's records go on from there.) A record that
// does not parse is logged and taken as none; a bare epoch (a record of a development
// build) as that epoch alone.
func (t *Term) MarkServing(ctx context.Context, mine func(last Served) Served) (last, rec Served, err error) {
	key := t.e.cfg.servedKey()
	_, err = t.swapValue(ctx, key, func(cur string) (string, error) {
		last = parseServed(cur, key, &t.e.log)
		rec = mine(last)
		rec.Epoch = t.Epoch
		b, _ := json.Marshal(rec)
		return string(b), nil
	})
	if err != nil {
		return Served{}, Served{}, err
	}
	return last, rec, nil
}

// parseServed reads a record of MarkServing ("": none).
func parseServed(v, key string, log *zerolog.Logger) Served {
	var s Served
	if v == "" {
		return s
	}
	if err := json.Unmarshal([]byte(v), &s); err == nil {
		return s
	} else if n, perr := strconv.ParseInt(v, 10, 64); perr == nil {
		return Served{Epoch: n}
	} else {
		log.Error().Err(err).Str("key", key).Str("value", v).
			Msg("the last serving term's record does not parse: taken as none (owners that missed a term may report it)")
		return Served{}
	}
}

// setEpoch sets the cluster's epoch counter to next(its value), in a transaction that
// holds only while this term's election key still leads, and returns the value set.
func (t *Term) setEpoch(ctx context.Context, next func(cur int64) int64) (int64, error) {
	key := t.e.cfg.epochKey()
	v, err := t.swapValue(ctx, key, func(cur string) (string, error) {
		var n int64
		if cur != "" {
			var err error
			if n, err = strconv.ParseInt(cur, 10, 64); err != nil {
				return "", fmt.Errorf("epoch key %s holds %q: %w", key, cur, err)
			}
		}
		return strconv.FormatInt(next(n), 10), nil
	})
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// swapValue sets the value at key to next(its value; "" when absent), in a transaction
// that holds only while this term's election key still leads, and returns the value
// set. next may run more than once (the key changed meanwhile).
func (t *Term) swapValue(ctx context.Context, key string, next func(cur string) (string, error)) (string, error) {
	for {
		cctx, cancel := context.WithTimeout(ctx, t.ttl)
		resp, err := t.e.cli.Get(cctx, key)
		cancel()
		if err != nil {
			return "", fmt.Errorf("read %s: %w", key, err)
		}
		var cur string
		var modRev int64
		if len(resp.Kvs) > 0 {
			cur, modRev = string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
		}
		value, err := next(cur)
		if err != nil {
			return "", err
		}
		if value == cur && modRev != 0 {
			return cur, nil
		}
		cctx, cancel = context.WithTimeout(ctx, t.ttl)
		tx, err := t.e.cli.Txn(cctx).If(
			clientv3.Compare(clientv3.CreateRevision(t.election.Key()), "=", t.election.Rev()),
			clientv3.Compare(clientv3.ModRevision(key), "=", modRev),
		).Then(clientv3.OpPut(key, value)).Else(clientv3.OpGet(t.election.Key())).Commit()
		cancel()
		if err != nil {
			return "", fmt.Errorf("set %s: %w", key, err)
		}
		if tx.Succeeded {
			return value, nil
		}
		if len(tx.Responses) == 0 || len(tx.Responses[0].GetResponseRange().Kvs) == 0 {
			return "", errors.New("the election key vanished before taking office (lease lapsed)")
		}
		// Someone changed the key meanwhile (a deposed leader cannot: its key is gone);
		// read it again.
	}
}

// Leading reports whether the term may serve now: its lease cannot have expired at etcd.
func (t *Term) Leading() bool {
	select {
	case <-t.done:
		return false
	default:
	}
	return int64(time.Since(t.base)) < t.validUntil.Load()
}

// Done is closed when the lease is lost for good (etcd does not know it any more) or
// the term was resigned: the term is over.
func (t *Term) Done() <-chan struct{} { return t.done }

// extend records an acknowledged keepalive sent at sent (since base).
func (t *Term) extend(sent time.Duration) {
	until := int64(sent + t.ttl - Margin(t.ttl))
	for {
		cur := t.validUntil.Load()
		if until <= cur || t.validUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// lateBound is how many TTLs a renewal waits for its answer (at most 4·lateBound calls
// in flight).
const lateBound = 8

// keepAlive renews the lease every TTL/4 and moves the fence; etcd answering that it
// does not know the lease ends the term. Each renewal is sent on schedule, whether the
// ones before it were answered or not: with each call bounded by TTL/4 and sent after
// the one before it ended, a leader whose round trip to etcd took longer than TTL/4
// fenced itself for good while those calls, reaching etcd, kept its lease alive, so no
// master served (a review). A renewal waits for its answer up to lateBound TTLs: one
// answered too late to move the fence (past TTL less the margin) is recorded
// (lastLate), the evidence on which watchFence gives the lease up. (Answers slower than
// that are not seen: a leader whose answers take longer still stalls the cluster while
// its renewals keep the lease alive.)
func (t *Term) keepAlive() {
	defer t.wg.Done()
	every, bound := t.ttl/4, lateBound*t.ttl
	ctx, cancel := context.WithCancel(context.Background())
	var calls sync.WaitGroup
	defer calls.Wait()
	defer cancel()
	var failing atomic.Bool
	for {
		select {
		case <-t.stop:
			return
		case <-t.done:
			return
		case <-time.After(every):
		}
		sent := time.Since(t.base)
		calls.Add(1)
		go func() {
			defer calls.Done()
			cctx, ccancel := context.WithTimeout(ctx, bound)
			_, err := t.e.cli.KeepAliveOnce(cctx, t.lease)
			ccancel()
			switch {
			case err == nil && time.Since(t.base) < sent+t.ttl-Margin(t.ttl):
				t.extend(sent)
				failing.Store(false)
			case err == nil:
				t.lastLate.Store(int64(time.Since(t.base)))
			case errors.Is(err, rpctypes.ErrLeaseNotFound):
				t.e.log.Warn().Int64("lease", int64(t.lease)).Msg("leadership lease expired at etcd; the term is over")
				t.close()
			case ctx.Err() != nil:
			case !failing.Swap(true):
				t.e.log.Warn().Err(err).Int64("lease", int64(t.lease)).Msg("etcd keepalive failed; retrying")
			}
		}()
	}
}

// watchFence logs the moment the term stops serving for want of an acknowledged
// keepalive (its fence: Leading turns false by itself then), and the moment a late
// acknowledgement lifts it; Leading is what fences. A term that etcd goes on answering,
// too late to move the fence, after it has been fenced for the lease's TTL (lastLate),
// with no answer in time for four renewal periods (a TTL), gives the lease up (end: the session
// stops renewing it, and it is revoked): those renewals, and the etcd session's own,
// would otherwise keep it alive, and no other master could lead while this one serves
// nothing. A term whose renewals get no answer by then (etcd
// down or paused, after a slow spell or not) keeps its lease: etcd restarted on its
// data keeps it too, and the term serves again at once.
func (t *Term) watchFence() {
	defer t.wg.Done()
	fenced := false
	var slowSince time.Duration // the first look that saw late answers after a TTL fenced
	for {
		now := time.Since(t.base)
		left := time.Duration(t.validUntil.Load()) - now
		lastLate := time.Duration(t.lastLate.Load())
		if left >= -t.ttl || lastLate <= now+left+t.ttl {
			slowSince = 0
		} else if slowSince == 0 {
			slowSince = now
		}
		switch {
		case slowSince > 0 && now-slowSince >= t.ttl && lastLate > slowSince:
			// Late answers still come, and none in time for four renewal periods (etcd
			// back after an outage answers the renewals queued meanwhile late, and the
			// next one in time; two periods were too few for an etcd restarting on a
			// busy machine: a CI run saw the term end after the outage).
			t.e.log.Error().Int64("lease", int64(t.lease)).Dur("fenced", -left).
				Msg("fenced for longer than the lease's TTL while etcd answers too late; giving the lease up so that another master can lead")
			t.close()
			go t.end(context.Background()) // (it waits for this goroutine)
			return
		case left <= 0 && !fenced:
			fenced = true
			t.e.log.Warn().Int64("lease", int64(t.lease)).Dur("unacked", t.ttl-Margin(t.ttl)-left).
				Msg("no keepalive acknowledged within the fence; fenced (not serving) until etcd answers")
		case left > 0 && fenced:
			fenced = false
			t.e.log.Info().Int64("lease", int64(t.lease)).Msg("etcd acknowledged a keepalive again; serving")
		}
		wait := left
		if left <= 0 {
			wait = t.ttl / 8 // fenced: look for an acknowledgement that lifts it
		}
		select {
		case <-t.stop:
			return
		case <-t.done:
			return
		case <-time.After(wait):
		}
	}
}

func (t *Term) close() { t.doneOnce.Do(func() { close(t.done) }) }

// end resigns (deletes the election key, so another candidate wins at once) and
// revokes the lease; the term is over. Safe to call more than once.
func (t *Term) end(ctx context.Context) {
	t.close()
	t.stopOnce.Do(func() { close(t.stop) })
	t.wg.Wait()
	ctx, cancel := context.WithTimeout(ctx, t.ttl)
	defer cancel()
	if t.session != nil {
		// Not Session.Close: it revokes with a 60 s bound of its own (the default session
		// TTL), so a stop while etcd is unreachable would hang that long.
		t.session.Orphan()
	}
	t.e.cli.Revoke(ctx, t.lease) // its keys go with it
}

// Resign ends the term: it stops serving at once and hands leadership to the next
// candidate Margin later (or when ctx ends). A term that loses its lease at etcd stops
// serving at least Margin before another can win (Leading); a resigning one keeps that
// promise by revoking its lease only then, so the next leader's quiet period
// (master.Options.WriteQuiet, which counts on it) covers the owners' leases.
func (t *Term) Resign(ctx context.Context) {
	t.close() // (first: a gate check between reading the time and closing would serve after it)
	stopped := min(time.Since(t.base), time.Duration(t.validUntil.Load()))
	if wait := stopped + Margin(t.ttl) - time.Since(t.base); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
	t.end(ctx)
}
