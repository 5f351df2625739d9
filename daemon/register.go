package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

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
func (m *masterLink) register(ctx context.Context) error { return m.registerAgain(ctx, false) }

// registerAgain is register; hearsay: the caller only heard that the master may have
// lost this owner (a call or a heartbeat answered STALE_GENERATION, which one sent under
// a registration and answered after the next one is too, or one under a registration no
// master took; a heartbeat answered under another epoch). Then a check heartbeat that
// fails in transport leaves it to the heartbeat loop's next period: registering again
// would tomb a registration the master may still have (every replica there dropped).
// A check answered under a generation no master took, which the owner went back from
// (staleAnswer), is asked again under the one it went back to.
func (m *masterLink) registerAgain(ctx context.Context, hearsay bool) error {
	return m.registerTo(ctx, hearsay, 0)
}

// registerFollowing is the follow loop's register with the leader of epoch: nothing once
// this owner is registered with it. Another caller (the heartbeat loop, told
// STALE_GENERATION by that leader) may have registered while this one waited for regMu,
// and the check heartbeat failing in transport would lead to a second Register, which
// tombs what the first one's report rebuilt: every replica of the owner dropped.
func (m *masterLink) registerFollowing(ctx context.Context, epoch int64) error {
	return m.registerTo(ctx, false, epoch)
}

// registerTo is registerAgain, doing nothing when leader is not 0 and this owner is
// registered with the master of that epoch already.
func (m *masterLink) registerTo(ctx context.Context, hearsay bool, leader int64) error {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	o := m.o
	if m.client.Load() == nil {
		return errCode(common.ErrorCode_UNAVAILABLE, "no master leads on etcd yet")
	}
	if leader != 0 && o.masterEpoch() == leader {
		return nil
	}
	if epoch := o.masterEpoch(); epoch != 0 {
		for {
			gen := o.nodeGen()
			resp, _, err := m.heartbeat(ctx, true)
			if err != nil && hearsay {
				return errCode(common.ErrorCode_UNAVAILABLE, "master unreachable before registering again: %v", err)
			}
			if err == nil && resp.Code == common.ErrorCode_OK && resp.MasterEpoch == epoch {
				return nil
			}
			if hearsay && err == nil && resp.Code != common.ErrorCode_OK && resp.Code != common.ErrorCode_STALE_GENERATION {
				// NOT_LEADER (a leader whose gate is shut a moment, serving on under the
				// same term after it) or the like says nothing of this registration: a
				// Register now would tomb it if it is live (a review).
				return errCode(common.ErrorCode_UNAVAILABLE, "master answered %v before registering again: %s", resp.Code, resp.Message)
			}
			if err != nil || o.nodeGen() == gen {
				break
			}
		}
	}
	// Until the new master adopted this owner's report it does not know which ranges of
	// the pool hold replicas: a range it handed out for a new put or a get target now
	// would overwrite one (the replica lost). Allocating calls wait.
	settling := make(chan struct{})
	m.settling.Store(&settling)
	defer close(settling)
	sent := time.Now()
	st := o.lock()
	prevGen := o.nodeGen()
	if m.registers > 0 {
		// The master tombs the registration this owner had (if it still had it) when it
		// takes this one: what it planned under that one (pulls from this segment, peer
		// calls) is refused here from now on, not served from ranges the next
		// registration's pool may give to other values (an owner tombed while alive keeps
		// its process and segment). Switched under the lock with the pins collected: a
		// PullPut begun under the old one is among them (pullPuts checks under it). A
		// Register failed in transport keeps its generation: the master may have taken
		// it (settleLost asks under it; staleAnswer goes back if it did not).
		gen := randomID()
		for gen == prevGen {
			gen = randomID()
		}
		o.regGen.Store(gen)
	}
	m.registers++
	pins, prev := st.beginRegister(sent, o.bounds().putCopy)
	seq := int64(st.reg.epoch)
	acked := o.acks.mark() // under Owner.mu, as the releases that queue acks
	o.unlock()
	resp, err := m.cl().Register(ctx, &mp.RegisterRequest{
		Node: m.ref(), SegmentSize: o.seg.Size(), PeerAddr: m.peerAddr, DataAddr: m.dataAddr,
		TransferReserve: o.opts.TransferReserve,
		LandingReserve:  o.opts.LandingReserve,
		KvSsdStorage:    o.ssdInfo(), Pinned: pins, PrevEpoch: prev,
		RemoteRefillHolders: true, // get_remote.go and get_batch_pull.go ack it on every path
		RegistrationSeq:     seq,
	})
	st = o.lock()
	unsure := st.reg.unsureIn != 0
	skipped := false
	next, ok := st.endRegister(resp, sent, prev)
	switch {
	case ok:
		st.reg.takenGen = o.nodeGen()
		skipped = st.skippedTerm(prev, resp.MasterEpoch, resp.LastTermEpoch)
		if next == registeredReport && (unsure || skipped) {
			// The master before may have tombed this owner and answered deletes of
			// its keys since, or a term between them did (it led while this owner
			// could not register with it): the new one must not adopt them from the
			// report.
			st.replicas.reset()
		}
	case err == nil:
		// Refused: the master took nothing of it, and still knows the registration before
		// it if it knew it (staleAnswer passes over answers under the new generation).
		o.regGen.Store(prevGen)
	}
	o.unlock()
	if err != nil {
		m.settleLost()
		return err
	}
	if !ok {
		return wire.FromResponse(resp.Code, resp.Message)
	}
	// The master holds none of the ids released before the registration began (it
	// tombed that state, or never had it): acks a master out of reach left queued go.
	o.acks.dropBefore(acked)
	o.adoptMasterTimes(masterTimesOf(resp))
	link := "tcp"
	if o.opts.LocalMaster != nil {
		link = "in-process"
	}
	o.log.Info().Int64("master_epoch", resp.MasterEpoch).Int64("registration_generation", o.nodeGen()).Str("master", m.addr()).Str("master_link", link).Int("pinned", len(pins)).Msg("registered with master")
	if prev != 0 {
		o.opts.Metrics.Reregistered()
	}
	switch next {
	case registeredFirst:
		// Nothing was learned before it.
	case registeredTombed:
		o.forgetSSD("this master dropped this owner's replicas (tombed)")
	case registeredReport:
		switch {
		case unsure:
			o.forgetSSD("the master before this one may have tombed this owner (it answered under a registration it never took)")
		case skipped:
			// (The SSD ring's records too: they were reported, and the new master
			// served from SSD versions the skipped term had deleted.)
			o.forgetSSD("an HA term served between the master before and this one, and this owner never registered with it")
		}
		o.reportReplicas()
	}
	return nil
}

// settleLost ends a registration whose Register failed in transport (allocating calls
// and answers across it still wait): its outcome is unknown (registration.unknown; a
// Register still in flight may land after any answer), and one heartbeat learns at once
// whether the master took it already (lostRegistration: it answers that Register's
// registration_seq).
func (m *masterLink) settleLost() {
	o := m.o
	st := o.lock()
	st.reg.unknown++
	o.unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m.heartbeat(ctx, true)
}

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
		if err := m.registerAgain(ctx, true); err != nil {
			m.o.log.Warn().Err(err).Msg("re-register failed")
		}
	}()
}
