package daemon

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/fluxkv/fluxkv/master/ha"
)

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
			m.o.sawLeaderEpoch(r.Epoch)
			m.cutDeposed(r.Addr)
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
		for attempt := 1; latest.Load() == r && m.o.masterEpoch() != r.Epoch; attempt++ {
			var err error
			if c := m.client.Load(); c == nil || c.addr != r.Addr {
				// A failed dial (the leader's name does not resolve yet) is tried again
				// like a failed registration: waiting for the next leader record left the
				// owner unregistered for as long as this leader led.
				if err = m.dial(r.Addr); err == nil {
					m.o.log.Info().Str("master", r.Addr).Int64("epoch", r.Epoch).Msg("following the master leader")
				} else if attempt%10 == 1 {
					m.o.log.Error().Err(err).Str("master", r.Addr).Int("attempt", attempt).Msg("cannot make a client of the new leader; retrying")
				}
			}
			if err == nil {
				ctx, cancel := context.WithTimeout(m.followCtx, 5*time.Second)
				err = m.registerFollowing(ctx, r.Epoch)
				cancel()
				if err == nil && m.o.masterEpoch() == r.Epoch {
					continue // registered with this leader
				}
				if err != nil && attempt%10 == 1 {
					m.o.log.Warn().Err(err).Str("master", r.Addr).Int("attempt", attempt).Msg("registering with the new leader failed; retrying")
				}
			}
			select {
			case <-m.followCtx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// cutDeposed ends the calls waiting on the current master when the leader on etcd is
// now at another address: a registration's call to a leader cut off without a reset
// waits MasterTimeout (15 s) before it fails, and the follow loop, which turns to the new
// leader only after the registration returns, sat out a report batch and its end (about
// 30 s) while the new leader waited. Calls made on the cut client meanwhile fail at once.
func (m *masterLink) cutDeposed(addr string) {
	if c := m.client.Load(); c != nil && c.addr != addr {
		c.stop()
	}
}
