package master

import (
	"context"
	"sync"
	"sync/atomic"

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
// confines the value to it, else every owner with holders (pooled placement may place
// it anywhere); each releases the least recently used holdings until twice the request
// is free again (allocations need contiguous ranges). The calls run in parallel, each
// bounded by InvalidateTimeout. It returns the bytes released in all.
func (s *Server) releaseHotSets(ctx context.Context, short shortage) int64 {
	type owner struct {
		id, addr string
		gen      int64
	}
	var owners []owner
	s.locked(func(st *State) error {
		for _, n := range st.nodes {
			if s.opts.Placement == PlacementLocal && n.id != short.nodeID {
				continue
			}
			if len(n.holders) > 0 && n.peerAddr != "" {
				owners = append(owners, owner{n.id, n.peerAddr, n.generation})
			}
		}
		return nil
	})
	var released atomic.Int64
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
				return
			}
			released.Add(resp.ReleasedBytes)
		}()
	}
	wg.Wait()
	return released.Load()
}
