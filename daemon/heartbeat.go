package daemon

import (
	"context"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
)

// heartbeatLoop heartbeats every period until the link closes; it registers again when
// the master lost this owner or answers with another epoch.
func (m *masterLink) heartbeatLoop() {
	defer m.o.wg.Done()
	more := false // eviction notices wait at the master: heartbeat again at once
	// ack: the last periodic heartbeat's answer carried notices, which the owner applied:
	// the next heartbeat acks them at once rather than a period later. Until the ack the
	// master promotes no get of an evicted version on this owner (its notice could drop
	// the new replica's record: master GetDone), and counts this owner among the holders
	// of the keys named. One ack per period, so continuous evictions cost two heartbeats
	// a period, not a loop.
	ack := false
	for {
		wait := m.o.heartbeatPeriod()
		if more || ack {
			wait = 0
		}
		acking := ack && !more
		select {
		case <-m.stop:
			return
		case <-time.After(wait):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, reregister, err := m.heartbeat(ctx, false)
		cancel()
		more, ack = false, false
		if err != nil {
			m.o.log.Warn().Err(err).Msg("heartbeat failed")
			continue
		}
		// Only notices of the epoch registered with are applied (and acked): a master of
		// another epoch resends the same ones with More set until the owner registered
		// with it, so heartbeating again at once would loop meanwhile.
		more = resp.Code == common.ErrorCode_OK && resp.EvictionsMore && !reregister
		ack = resp.Code == common.ErrorCode_OK && !reregister && !acking && len(resp.Evicted)+len(resp.SsdDropped) > 0
		if reregister {
			// A master of another epoch knows this owner: a registration whose answer
			// was lost (it may wait for this owner's report). Register again.
			m.o.log.Warn().Int64("master_epoch", resp.MasterEpoch).Msg("the master's epoch is not the one this owner registered with; registering again")
			m.reregisterInBackground()
		}
		if resp.Code == common.ErrorCode_STALE_GENERATION {
			m.o.log.Warn().Str("why", resp.Message).Msg("master does not know this owner (master restarted?); registering again")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := m.registerAgain(ctx, true); err != nil {
				m.o.log.Warn().Err(err).Msg("re-register failed")
			}
			cancel()
		}
	}
}

// heartbeat makes one Heartbeat call: it acks the eviction notices applied so far,
// applies the new ones, and renews the lease when the master answers OK. reregister:
// the master answered OK with an epoch this owner did not register with. regHeld: the
// caller holds regMu (a registration's own check).
func (m *masterLink) heartbeat(ctx context.Context, regHeld bool) (resp *mp.HeartbeatResponse, reregister bool, err error) {
	o := m.o
	st := o.lock()
	a := st.reg.acked
	regs := st.reg.registered
	backs := st.reg.backs
	ref := m.ref()
	o.unlock()
	sent := time.Now()
	resp, err = m.cl().Heartbeat(ctx, &mp.HeartbeatRequest{Node: ref, KvSsdStorage: o.ssdInfo(),
		EvictionsAck: a.seq, EvictionsEpoch: a.epoch})
	if err == nil && resp.Code == common.ErrorCode_STALE_GENERATION {
		m.staleAnswer(resp, regs, ref.Generation, regHeld)
	}
	if err != nil || resp.Code != common.ErrorCode_OK {
		return resp, false, err
	}
	if resp.MemorySegment != nil {
		o.segUse.Store(resp.MemorySegment)
		o.segBeat.Store(time.Now().UnixNano())
	}
	st = o.lock()
	if ref.Generation == o.nodeGen() {
		st.reg.takenGen = ref.Generation
		if resp.MasterEpoch == st.reg.unsureIn && backs == st.reg.backs {
			st.reg.unsureIn = 0 // (an answer to a heartbeat sent before the owner went back says nothing of it)
		}
	}
	if !regHeld && st.namesLostRegistration(resp) {
		// Taken as in staleAnswer: a registration that began meanwhile would report the
		// SSD entries forgotten below, and the next master route gets to them.
		o.unlock()
		m.regMu.Lock()
		defer m.regMu.Unlock()
		st = o.lock()
	}
	lost := st.lostRegistration(resp, sent)
	if !lost {
		reregister = st.heartbeatAnswered(a, sent, resp)
	}
	o.unlock()
	if lost {
		o.log.Warn().Int64("registration_seq", resp.RegistrationSeq).Msg("the master took a registration whose answer was lost, dropping this owner's replicas; so does the owner")
		o.forgetSSD("the master took a registration whose answer was lost (it dropped this owner's replicas)")
	}
	return resp, reregister, nil
}

// staleAnswer takes a heartbeat's answer STALE_GENERATION (ownerState.tombedBy: the
// master registered with tombed this incarnation) unless a registration succeeded since
// the heartbeat was sent (regs: registration.registered then): a late such answer, to a
// heartbeat sent before a registration that succeeded since, wiped the index and SSD
// ring the master had just adopted (a review). One that failed changes nothing: it
// reported nothing, and a Register the tombing master took tombs this incarnation again
// (ignoring the answer across it let the next term adopt the index: a review). It runs
// under regMu (taken here unless regHeld): a registration in progress ends first, and
// none reports the SSD entries it forgets meanwhile.
//
// gen is the registration generation the heartbeat named. Only an answer under the last
// one a master took (registration.takenGen) says that master tombed this owner. One
// under a generation no master took says nothing of the registration that stands when
// the owner gave it up since (a Register the master refused); when it is still the
// owner's (its Register failed in transport and this master does not have it), the
// owner goes back to the last one a master took: a master that still has that one keeps
// it (registering again under the new one would have tombed it, every replica dropped,
// a review), and one that took the new one since answers the next heartbeat
// STALE_GENERATION under the old one, which drops the index.
func (m *masterLink) staleAnswer(resp *mp.HeartbeatResponse, regs uint64, gen int64, regHeld bool) {
	if !regHeld {
		m.regMu.Lock()
		defer m.regMu.Unlock()
	}
	o := m.o
	st := o.lock()
	tombed := false
	switch taken := st.reg.takenGen; {
	case gen == taken:
		tombed = st.reg.registered == regs && st.tombedBy(resp)
	case gen == o.nodeGen() && taken != 0:
		o.regGen.Store(taken)
		st.reg.backs++
		if resp.MasterEpoch == st.reg.masterEpoch {
			st.reg.unsureIn = resp.MasterEpoch
		}
		o.log.Warn().Int64("generation", gen).Int64("back_to", taken).Msg("the master does not have the registration whose Register failed in transport; going back to the last one a master took")
	}
	o.unlock()
	if tombed {
		o.forgetSSD("the master this owner registered with tombed it (it dropped this owner's replicas)")
	}
}

// heartbeatPeriod is the period the master asked for.
func (o *Owner) heartbeatPeriod() time.Duration {
	st := o.lock()
	defer o.unlock()
	return st.reg.period
}
