package daemon

import (
	"math"
	"slices"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// registration is the owner's standing with the master, inside ownerState.
//
// The lease: the owner may answer gets from its hot set only until leaseUntil, two
// heartbeat periods (less a margin) after sending the last heartbeat or registration
// the master answered OK. A master that stops hearing from the owner tombs it only
// after two periods of silence (and then answers the delete that was waiting for it),
// by which time the owner has stopped serving what may be a dead version.
type registration struct {
	// epoch counts registrations begun; a call sent at one epoch and answered at
	// another straddled a registration (its ranges were not among the pins reported).
	epoch uint64
	// reports counts the replica reports and SSD forgets begun (reportReplicas,
	// forgetSSD): an SSD record whose commit was out across one is in the report, or
	// forgotten, by commitPersisted's look at it (a registration that reported nothing,
	// a retried Register to the same master, changes nothing a commit must undo).
	reports uint64
	// registered counts the registrations a master answered OK (endRegister): a call
	// answered across one was answered by a master the owner no longer stands with.
	registered uint64
	// seq is the registration_seq of the last Register a master answered OK, or took
	// without the answer arriving (lostRegistration).
	seq int64
	// idle holds, from beginRegister to endRegister, the master ids of the idle hot-set
	// holdings the registration let go unacked.
	idle []int64
	// unknown counts the Registers that failed in transport (settleLost): the master
	// may have taken one, or take it later, so a put answered across one cannot tell
	// whether the master that published it still has it.
	unknown uint64
	// masterEpoch is the master epoch of the last successful registration (0: none).
	masterEpoch int64
	// takenGen is the last registration generation (Owner.nodeGen) a master took: its
	// Register answered OK, or a heartbeat under it did (0: none yet).
	takenGen int64
	// unsureIn is the master epoch whose STALE_GENERATION answer under a generation no
	// master took made the owner go back to takenGen (masterLink.staleAnswer): whether
	// that master still has the registration gone back to (or tombed it, and may have
	// answered deletes of its keys since) is unknown until it answers under it (OK, or
	// tombedBy). A registration with another master meanwhile reports no replica (0:
	// none unsure).
	unsureIn int64
	// backs counts the owner's goings back to takenGen (staleAnswer).
	backs uint64
	// seenEpochs are the epochs of HA leaders seen on etcd that this owner has not
	// registered with (at most maxSeenEpochs, the newest): a registration with a later
	// one whose PrevEpoch is older than one of them skipped that term (sawLeaderEpoch).
	seenEpochs []int64
	// tombedIn is the master epoch whose STALE_GENERATION answer made the owner drop its
	// index since its last successful registration (tombedBy; 0: none).
	tombedIn int64
	// registering is set from collecting a registration's pins to its answer.
	registering bool
	period      time.Duration // heartbeat period, from Register replies
	nodeTTL     time.Duration // the master's node TTL, from Register replies (0: unknown)
	leaseUntil  time.Time
	// acked is the last eviction notice applied to the replica index and the epoch of
	// the master that numbered it, acked with the next heartbeat (replaced at each
	// registration: a master's notices start at 1).
	acked evictAck
}

// evictAck is the last eviction notice applied, numbered by the master of epoch since
// this owner's registration number reg (registration.epoch: a master that answers a
// registration again starts its numbering again, under the same epoch).
type evictAck struct {
	epoch, seq int64
	reg        uint64
}

// maxSeenEpochs bounds registration.seenEpochs.
const maxSeenEpochs = 16

// sawLeaderEpoch records an HA leader's epoch seen on etcd (the follow loop's watch).
func (st *ownerState) sawLeaderEpoch(e int64) {
	if e <= st.reg.masterEpoch || slices.Contains(st.reg.seenEpochs, e) {
		return
	}
	st.reg.seenEpochs = append(st.reg.seenEpochs, e)
	if len(st.reg.seenEpochs) > maxSeenEpochs {
		slices.Sort(st.reg.seenEpochs)
		st.reg.seenEpochs = st.reg.seenEpochs[len(st.reg.seenEpochs)-maxSeenEpochs:]
	}
}

// skippedTerm reports whether a registration with the master of epoch now, after the
// one of epoch prev, skipped a term in between: one this owner saw lead on etcd, or the
// term that served last before the new master if that is not prev's (lastTerm, its
// RegisterResponse.last_term_epoch, 0 when it knows none: a term this owner's watch may
// never have seen). It forgets the epochs up to now. That term's deletes and overwrites
// are in no report the new master gets from this owner, which would bring the versions
// they dropped back (a review).
func (st *ownerState) skippedTerm(prev, now, lastTerm int64) bool {
	skipped := wire.SkippedTerm(prev, now, lastTerm) ||
		prev != 0 && slices.ContainsFunc(st.reg.seenEpochs, func(e int64) bool { return prev < e && e < now })
	st.reg.seenEpochs = slices.DeleteFunc(st.reg.seenEpochs, func(e int64) bool { return e <= now })
	return skipped
}

// afterRegister is what follows a successful registration.
type afterRegister int

const (
	registeredFirst  afterRegister = iota // the first registration: nothing to report
	registeredReport                      // a master that did not know this owner: report the replica index
	registeredTombed                      // the same master tombed this incarnation: every replica is forgotten
)

// beginRegister collects the pins of a Register call sent at now — every range of
// segmentWrites, marked pinned, once the puts past their master's TTL went
// (sweepDeadPuts; putCopy names their deadline in a later PutEnd's answer) — and
// begins a registration: the hot set is emptied (the new master
// knows none of its versions; held holdings stay pinned, idle ones nobody holds and the
// new master never knew them), and calls sent before now are known to straddle it. prev
// is the master epoch registered with so far, for RegisterRequest.PrevEpoch.
func (st *ownerState) beginRegister(now time.Time, putCopy time.Duration) (pins []*mp.PinnedRange, prev int64) {
	st.sweepDeadPuts(now, putCopy) // no pin of a range another key may hold by now
	pins = st.writes.pinAll()
	st.reg.registering = true
	st.reg.idle = st.hot.reset()
	st.reg.epoch++
	return pins, st.reg.masterEpoch
}

// endRegister ends the registration begun by beginRegister with the master's answer
// (resp nil: the call failed) to a call sent at sent. On success it adopts the
// master's epoch and heartbeat period, renews the lease, and says what follows.
func (st *ownerState) endRegister(resp *mp.RegisterResponse, sent time.Time, prev int64) (afterRegister, bool) {
	st.reg.registering = false
	idle := st.reg.idle
	st.reg.idle = nil
	if resp == nil || resp.Code != common.ErrorCode_OK {
		// The master this owner had may still hold the idle holdings' holders: ack them
		// (one the master took this Register and dropped is unknown there: no harm).
		st.ack(idle...)
		return 0, false
	}
	st.reg.registered++
	st.reg.tombedIn, st.reg.unsureIn = 0, 0
	st.reg.seq = int64(st.reg.epoch)      // this one's: registrations run one at a time
	st.reg.masterEpoch = resp.MasterEpoch // admit judges peer calls by it from now on
	if resp.HeartbeatIntervalMs > 0 {
		st.reg.period = time.Duration(resp.HeartbeatIntervalMs) * time.Millisecond
	}
	if resp.NodeTtlMs > 0 {
		st.reg.nodeTTL = time.Duration(resp.NodeTtlMs) * time.Millisecond
	}
	st.reg.acked = evictAck{epoch: resp.MasterEpoch, reg: st.reg.epoch}
	// The lease is this master's, on its heartbeat period: one earned under the master
	// before, with a longer period, outlasted the new master's tomb and write timing, and
	// the hot set served a version it had deleted since (a review). (The hot set was
	// emptied when the registration began.)
	st.reg.leaseUntil = time.Time{}
	st.renewLease(sent)
	switch {
	case prev == 0:
		return registeredFirst, true
	case prev == resp.MasterEpoch:
		// It dropped every replica here: so does the index (the SSD ring's entries go
		// too, in Owner.forgetSSD).
		st.replicas.reset()
		return registeredTombed, true
	default:
		return registeredReport, true
	}
}

// lostRegistration takes the OK answer to a heartbeat sent at sent that names a
// registration this owner began after its last answered one and none is in progress:
// that Register's answer was lost, and the master took it, tombed the owner's earlier
// incarnation and dropped its replicas. So does the owner, as after such a Register
// answered (registeredTombed; the caller forgets the SSD ring's entries). Kept, its index
// named replicas the master no longer had: exists answered from them, and a later
// master rebuilt from its report. It reports whether it took one.
func (st *ownerState) lostRegistration(resp *mp.HeartbeatResponse, sent time.Time) bool {
	if !st.namesLostRegistration(resp) {
		return false
	}
	next, _ := st.endRegister(&mp.RegisterResponse{Code: common.ErrorCode_OK, MasterEpoch: resp.MasterEpoch}, sent, st.reg.masterEpoch)
	st.reg.seq = resp.RegistrationSeq
	return next == registeredTombed
}

// tombedBy takes a heartbeat answered STALE_GENERATION (by a heartbeat sent before no
// registration that succeeded since: masterLink.staleAnswer) by the master epoch this owner registered with:
// that master tombed this incarnation (silent past its TTL), dropped its
// replicas, and may have answered deletes and overwrites of their keys since. The index
// goes now, not at the next Register that master answers: if that master is deposed
// first, the Register reaches the next term with this epoch as PrevEpoch, a report, and
// that term adopted the versions the last one had deleted (a review). It reports whether
// it dropped the index (the caller forgets the SSD ring's entries too).
func (st *ownerState) tombedBy(resp *mp.HeartbeatResponse) bool {
	if resp.Code != common.ErrorCode_STALE_GENERATION || resp.MasterEpoch == 0 ||
		resp.MasterEpoch != st.reg.masterEpoch || st.reg.tombedIn == resp.MasterEpoch {
		return false
	}
	st.reg.tombedIn = resp.MasterEpoch
	st.reg.unsureIn = 0
	st.replicas.reset()
	return true
}

// namesLostRegistration reports whether resp, an OK heartbeat answer, names a
// registration whose answer was lost (lostRegistration takes it).
func (st *ownerState) namesLostRegistration(resp *mp.HeartbeatResponse) bool {
	return !st.reg.registering && resp.RegistrationSeq > st.reg.seq && resp.RegistrationSeq <= int64(st.reg.epoch) &&
		resp.MasterEpoch == st.reg.masterEpoch
}

// renewLease extends the lease after a call sent at sent was answered OK.
func (st *ownerState) renewLease(sent time.Time) {
	p := st.reg.period
	d := 2*p - p/4
	// The master tombs an owner silent for its node TTL (measured from receiving the
	// heartbeat, after sent): the lease must end before, or a delete answered after the
	// tomb could leave this owner serving the dead version.
	if ttl := st.reg.nodeTTL; ttl > 0 && ttl-p/4 < d {
		d = ttl - p/4
	}
	if until := sent.Add(d); until.After(st.reg.leaseUntil) {
		st.reg.leaseUntil = until
	}
}

// leased reports whether the owner may answer gets from its hot set at now.
func (st *ownerState) leased(now time.Time) bool { return now.Before(st.reg.leaseUntil) }

// heartbeatAnswered takes the master's OK answer to a heartbeat sent at sent that acked
// a: the lease is renewed, and the eviction notices it carries (when numbered by the
// master a names) are applied: the evicted replicas' records go, and so do the SSD
// entries it no longer routes to. The ack moves only if no registration happened since
// the heartbeat was sent (its numbering would be another's). It reports whether the
// master's epoch is not the one this owner registered with (register again: a
// registration whose answer was lost).
func (st *ownerState) heartbeatAnswered(a evictAck, sent time.Time, resp *mp.HeartbeatResponse) (reregister bool) {
	if resp.MasterEpoch == st.reg.masterEpoch {
		// (A master of another epoch, which this owner is not registered with, extends
		// nothing: its period is not the one the lease was earned under.)
		st.renewLease(sent)
	}
	if resp.MasterEpoch == a.epoch && resp.EvictionsSeq > a.seq {
		st.applyEvictions(resp.Evicted, resp.EvictedSeqs, a.reg)
		for _, e := range resp.SsdDropped {
			if e != nil {
				st.fx.ssdForget = append(st.fx.ssdForget, e)
			}
		}
		if st.reg.acked == a {
			st.reg.acked = evictAck{epoch: a.epoch, seq: resp.EvictionsSeq, reg: a.reg}
		}
	}
	return resp.MasterEpoch != st.reg.masterEpoch
}

// applyEvictions drops the records of memory replicas the master evicted: notices
// numbered seqs (none from an older master: each applies) by the master this owner
// registered with at registration reg.
func (st *ownerState) applyEvictions(evicted []*common.KeyVersion, seqs []int64, reg uint64) {
	for i, e := range evicted {
		if e == nil {
			continue
		}
		n := noticeBound{reg: reg, seq: math.MaxInt64}
		if len(seqs) == len(evicted) {
			n.seq = seqs[i]
		}
		st.replicas.evicted(e.Key, e.PutId, n)
	}
}

// admit refuses a peer call of a master older than the one this owner registered with
// last (a deposed leader, or a master before a restart): its ranges and versions may
// be stale. epoch 0 (no epoch sent) is admitted.
func (st *ownerState) admit(epoch int64) error {
	if cur := st.reg.masterEpoch; epoch != 0 && epoch < cur {
		return errCode(common.ErrorCode_UNAVAILABLE, "call from master epoch %d; this owner is registered with epoch %d", epoch, cur)
	}
	return nil
}
