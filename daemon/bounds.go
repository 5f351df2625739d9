package daemon

import (
	"math"
	"time"

	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// masterTimes are the master's bounds an owner must keep its own inside: the master
// revokes an in-flight put or get and frees its range inflightTTL after it started,
// releases the ranges it kept for a BatchSsdReplicaPersist when the call times out
// (persistTimeout), and fails a PullPut's pooled puts when that call times out
// (pullTimeout). A range the master freed may hold another key's value at once, so an
// owner writing a get's target, copying a put's bytes or reading a persist's source
// after the bound would corrupt or record another value.
type masterTimes struct {
	inflightTTL, persistTimeout, pullTimeout time.Duration
}

// defaultMasterTimes are the master's defaults (master.Options): what the owner assumes
// before its first registration and from a master that does not send them.
var defaultMasterTimes = masterTimes{inflightTTL: 60 * time.Second, persistTimeout: 30 * time.Second, pullTimeout: 35 * time.Second}

// masterTimesOf reads the master's bounds from its registration answer; a field it
// does not send keeps the default.
func masterTimesOf(resp *mp.RegisterResponse) masterTimes {
	m := defaultMasterTimes
	ms := func(v int64, d *time.Duration) {
		if v > 0 {
			*d = time.Duration(v) * time.Millisecond
		}
	}
	ms(resp.InflightTtlMs, &m.inflightTTL)
	ms(resp.PersistTimeoutMs, &m.persistTimeout)
	ms(resp.PullTimeoutMs, &m.pullTimeout)
	return m
}

// bounds are the owner's time bounds in force: its options, lowered to fit inside the
// master's (masterTimes) it registered with last. With the master's defaults they are
// the options' defaults.
type bounds struct {
	// putCopy: no copy from a session's put area into a put's range starts later than
	// this after its PutStart was sent (Options.PutCopyDeadline; 5/6 of the TTL).
	putCopy time.Duration
	// persistRead: a persist's sources are read within this of the call's arrival
	// (Options.PersistReadWindow; 2/3 of the persist timeout).
	persistRead time.Duration
	// planAge: the oldest plan a batch's worker still carries out; a later one is
	// revoked and planned again (1/6 of the TTL, 10 s by default).
	planAge time.Duration
	// transfer bounds a get's pull from another owner's memory
	// (Options.TransferTimeout; half the TTL): planAge + transfer stays inside it.
	transfer time.Duration
	// stageMax caps a remote SSD refill's deadline (stageDeadline; 3/4 of the TTL):
	// planAge + stageMax stays inside it.
	stageMax time.Duration
	// pullPut bounds the pull of pooled puts this owner was told to pull (PullPut,
	// BatchPullPut; Options.TransferTimeout; 6/7 of the master's pull timeout).
	pullPut time.Duration
	// reack: the holder ids of a planning call that failed are acked at once and again
	// this long after (ackUnanswered; the TTL): a call the owner gave up on may reach
	// the master's state after the first ack, and record its holder then.
	reack time.Duration
}

// boundsFor returns the bounds in force under a master's times m.
func (o *Options) boundsFor(m masterTimes) *bounds {
	ttl := m.inflightTTL
	return &bounds{
		putCopy:     min(o.PutCopyDeadline, ttl*5/6),
		persistRead: min(o.PersistReadWindow, m.persistTimeout*2/3),
		planAge:     min(planMaxAge, ttl/6),
		transfer:    min(o.TransferTimeout, ttl/2),
		stageMax:    min(stageMaxDeadline, ttl*3/4),
		pullPut:     min(o.TransferTimeout, m.pullTimeout*6/7),
		reack:       ttl,
	}
}

// bounds returns the bounds in force now.
func (o *Owner) bounds() *bounds { return o.inForce.Load() }

// stageDeadline is how long a remote SSD refill of n bytes may take, end to end:
// proportional to its length, at most the bound's stageMax.
func (b *bounds) stageDeadline(n int64) time.Duration {
	return min(byLength(n), b.stageMax)
}

// byLength is stageBase and n bytes at stageRate, without overflow: n·1e9 passes int64
// from 9.2 GB (a value of 9 GiB got a negative deadline, and every refill of it failed).
func byLength(n int64) time.Duration {
	whole := n / stageRate
	if whole >= 1<<32 { // over a century: as good as none
		return time.Duration(math.MaxInt64)
	}
	return stageBase + time.Duration(whole)*time.Second + time.Duration(n%stageRate)*time.Second/stageRate
}

// pullDeadline is how long a get's pull of n bytes from another owner's memory may
// take once it holds one of the peer's slots (transfer.WithBudget; the wait for the
// slot counts in the bound's transfer): proportional to its length, as a refill's, at
// most the bound's transfer. A
// source that trickles (sends, so the data plane's progress timeout never fires) kept
// a small value's get for the whole TransferTimeout, the clients' own default call
// timeout, before the next replica was tried (a review: 30 s for 256 KiB).
func (b *bounds) pullDeadline(n int64) time.Duration {
	return min(byLength(n), b.transfer)
}

// adoptMasterTimes puts in force the bounds under the master's times m, and logs the
// options they lower.
func (o *Owner) adoptMasterTimes(m masterTimes) {
	b := o.opts.boundsFor(m)
	if old := o.inForce.Swap(b); *old == *b {
		return
	}
	lowered := func(name string, opt, got time.Duration) {
		if got < opt {
			o.log.Warn().Dur(name, opt).Dur("in_force", got).Dur("master_inflight_ttl", m.inflightTTL).
				Dur("master_persist_timeout", m.persistTimeout).Dur("master_pull_timeout", m.pullTimeout).
				Msgf("%s lowered to fit inside the master's bounds", name)
		}
	}
	lowered("put_copy_deadline", o.opts.PutCopyDeadline, b.putCopy)
	lowered("persist_read_window", o.opts.PersistReadWindow, b.persistRead)
	lowered("transfer_timeout", o.opts.TransferTimeout, min(b.transfer, b.pullPut))
}
