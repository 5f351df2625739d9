package master

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudwego/kitex/pkg/kerrors"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// An owner serves gets of its own replicas without a master trip from its hot set:
// holdings it keeps after their externals released them, each a master holder, so the
// master never frees those ranges under it (eviction passes over held replicas). When
// the master needs space and finds nothing it may evict, it asks the owners to give
// idle holdings back (releaseHotSets); the allocation is retried once they answered.

// releaseHotSets asks owners with holders to release idle hot-set holdings for an
// allocation that found no space (short): the requester's owner when local placement
// or a get (its bytes land in the requester's segment) confines the value to it, else
// every owner with holders (pooled placement may place it anywhere); each also acks
// the holders its clients released since its last ack batch, and releases the least
// recently used holdings until twice the request is free again (allocations need
// contiguous ranges). The calls run in parallel, each bounded by InvalidateTimeout. It
// reports whether every owner asked answered in time. One that did not, though it
// heartbeated within the last two intervals (a loaded machine, not a dead owner), may
// still have acks of released holders on their way, and so has one that answered
// UNAVAILABLE (its acks did not reach the master: daemon releaseHotSet); another answer
// other than OK, a refused connection, or an owner not heard from for longer counts as
// answered: nothing is coming from it.
func (s *Server) releaseHotSets(ctx context.Context, short shortage) (answered bool) {
	type owner struct {
		id, addr string
		gen      int64
		alive    bool // heard from within two heartbeat intervals
	}
	var owners []owner
	now := time.Now()
	s.locked(func(st *State) error {
		for _, n := range st.nodes {
			if (s.opts.Placement == PlacementLocal || short.local) && n.id != short.nodeID {
				continue
			}
			if len(n.holders) > 0 && n.peerAddr != "" {
				owners = append(owners, owner{n.id, n.peerAddr, n.generation, now.Sub(n.lastSeen) <= 2*s.opts.HeartbeatInterval})
			}
		}
		return nil
	})
	var late atomic.Int64
	var wg sync.WaitGroup
	for _, o := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, callOpts, err := s.peers.GetNode(o.id, o.addr)
			if err != nil {
				return
			}
			cctx, cancel := context.WithTimeout(ctx, s.opts.InvalidateTimeout)
			defer cancel()
			resp, err := c.ReleaseHotSet(cctx, &peer.ReleaseHotSetRequest{Generation: o.gen, Bytes: 2 * short.bytes, MasterEpoch: s.epoch}, callOpts...)
			if err != nil || resp.Code != common.ErrorCode_OK {
				s.opts.Logger.Debug().Err(err).Str("peer", o.addr).Msg("release hot set failed")
			}
			timedOut := errors.Is(err, kerrors.ErrRPCTimeout) || (err != nil && cctx.Err() != nil)
			// UNAVAILABLE: the owner released, but the acks of what it released did not
			// reach this master yet (they are sent again).
			pending := err == nil && resp.Code == common.ErrorCode_UNAVAILABLE
			if (timedOut || pending) && ctx.Err() == nil && o.alive {
				late.Add(1) // no answer within the timeout, or acks still on their way
			}
		}()
	}
	wg.Wait()
	return late.Load() == 0
}

// releaseAsk is what the master asks one owner to let go of from its hot set: the KV
// pages its eviction order reached while a holder kept them (allocateEvictingLocked).
// Otherwise an owner's hot set, up to half its pool of idle holdings in the order the
// owner released them, would decide what stays in memory instead of the page order. A
// page is asked for once and keeps its place in the order until the owner has answered
// (the next allocations pass over it while it is still held); if it is still held
// then, an external uses it and it is passed on (Pass) like any held key.
type releaseAsk struct {
	want     []string        // asked for, not sent yet
	asked    map[string]bool // key → a call naming it was answered
	inFlight bool            // one call at a time per owner
}

const (
	// maxReleaseAsk bounds the pages one owner is asked for at once; past it, held pages
	// are passed on at once, as plain keys are.
	maxReleaseAsk = 4096
	// releaseBatch caps the keys of one ReleaseHotSet call.
	releaseBatch = 1024
)

// ask records that the eviction order reached page k while it was held. keep reports
// whether k should keep its place (asked now, or asked and not answered yet); queued,
// whether it was asked for now (a call is due).
func (r *releaseAsk) ask(k string) (keep, queued bool) {
	answered, ok := r.asked[k]
	switch {
	case !ok:
		if len(r.asked) >= maxReleaseAsk {
			return false, false
		}
		if r.asked == nil {
			r.asked = make(map[string]bool)
		}
		r.asked[k] = false
		r.want = append(r.want, k)
		return true, true
	case !answered:
		return true, false
	default:
		delete(r.asked, k) // still held after the owner let go of what it could
		return false, false
	}
}

// forget drops k's entry: its replica on this node is gone (evicted, deleted,
// overwritten), so there is nothing left to ask about. Kept, an entry of a page let go
// and evicted or deleted since stayed until a later answer named nothing, and
// maxReleaseAsk of them ended every ask of the node for good.
func (r *releaseAsk) forget(k string) { delete(r.asked, k) }

// take hands out the keys for the next call (nil while one is in flight).
func (r *releaseAsk) take() []string {
	if r.inFlight || len(r.want) == 0 {
		return nil
	}
	n := min(len(r.want), releaseBatch)
	keys := r.want[:n:n]
	r.want = r.want[n:]
	if len(r.want) == 0 {
		r.want = nil
	}
	r.inFlight = true
	return keys
}

// answered ends the call that named keys (failed or not: a page still held is then
// passed on); entries of keys no longer held here (evicted, deleted, let go and
// re-held) are dropped.
func (r *releaseAsk) answered(keys []string, held func(string) bool) {
	r.inFlight = false
	for _, k := range keys {
		if _, ok := r.asked[k]; ok {
			r.asked[k] = true
		}
	}
	for k, done := range r.asked {
		if done && !held(k) {
			delete(r.asked, k)
		}
	}
}

// releaseCall is one ReleaseHotSet naming keys, taken under the lock; bytes is their
// size (what an owner of an earlier release, which does not know keys, releases).
type releaseCall struct {
	id, addr string
	gen      int64
	keys     []string
	bytes    int64
}

// takeReleasesLocked takes the calls due: one per owner with pages asked for and no
// call in flight.
func (s *State) takeReleasesLocked() []releaseCall {
	var calls []releaseCall
	for _, n := range s.nodes {
		if len(n.release.want) == 0 || n.tombed || n.peerAddr == "" {
			continue
		}
		if keys := n.release.take(); keys != nil {
			calls = append(calls, s.releaseCallLocked(n, keys))
		}
	}
	return calls
}

func (s *State) releaseCallLocked(n *node, keys []string) releaseCall {
	var bytes int64
	for _, k := range keys {
		if r := s.routes[k]; r != nil {
			bytes += r.len
		}
	}
	return releaseCall{n.id, n.peerAddr, n.generation, keys, max(bytes, 1)}
}

// sendReleases makes the calls (in the background: the allocation that asked already
// evicted the next page; the ones after it find the pages free).
func (s *Server) sendReleases(calls []releaseCall) {
	for _, rc := range calls {
		go s.sendRelease(rc)
	}
}

func (s *Server) sendRelease(rc releaseCall) {
	defer s.locked(func(st *State) error {
		if n := st.nodes[rc.id]; n != nil && n.generation == rc.gen {
			n.release.answered(rc.keys, func(k string) bool { return st.heldLocked(k, n) })
			if keys := n.release.take(); keys != nil { // asked for while this call was out
				go s.sendRelease(st.releaseCallLocked(n, keys))
			}
		}
		return nil
	})
	c, callOpts, err := s.peers.GetNode(rc.id, rc.addr)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.InvalidateTimeout)
	defer cancel()
	resp, err := c.ReleaseHotSet(ctx, &peer.ReleaseHotSetRequest{Generation: rc.gen, Bytes: rc.bytes, MasterEpoch: s.epoch, Keys: rc.keys}, callOpts...)
	if err != nil || resp.Code != common.ErrorCode_OK {
		s.opts.Logger.Debug().Err(err).Str("peer", rc.addr).Int("keys", len(rc.keys)).Msg("release of hot-set pages failed")
	}
}
