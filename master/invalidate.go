package master

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
)

// invalidator batches InvalidateCachedInfo broadcasts per owner: entries collect for
// up to a millisecond (or 256 of them) and go out in one call per owner.
type invalidator struct {
	log zerolog.Logger

	peers *peerClients

	mu      sync.Mutex // protects pending
	pending map[string][]*common.KeyVersion

	kick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
}

func newInvalidator(log zerolog.Logger, peers *peerClients) *invalidator {
	v := &invalidator{log: log, peers: peers, pending: make(map[string][]*common.KeyVersion),
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	v.wg.Add(1)
	go v.loop()
	return v
}

func (v *invalidator) add(invs []Invalidation) {
	if len(invs) == 0 {
		return
	}
	v.mu.Lock()
	for _, iv := range invs {
		v.pending[iv.PeerAddr] = append(v.pending[iv.PeerAddr], &common.KeyVersion{Key: iv.Key, PutId: iv.PutID})
	}
	v.mu.Unlock()
	select {
	case v.kick <- struct{}{}:
	default:
	}
}

func (v *invalidator) loop() {
	defer v.wg.Done()
	for {
		select {
		case <-v.done:
			return
		case <-v.kick:
		}
		time.Sleep(time.Millisecond)
		v.flush()
	}
}

func (v *invalidator) flush() {
	v.mu.Lock()
	batch := v.pending
	v.pending = make(map[string][]*common.KeyVersion)
	v.mu.Unlock()
	for addr, entries := range batch {
		c, err := v.peers.get(addr)
		if err != nil {
			v.log.Warn().Err(err).Str("peer", addr).Msg("invalidate: no client")
			continue
		}
		for len(entries) > 0 {
			n := min(len(entries), 256)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.InvalidateCachedInfo(ctx, &peer.InvalidateCachedInfoRequest{Entries: entries[:n]})
			cancel()
			if err != nil {
				v.log.Warn().Err(err).Str("peer", addr).Int("entries", n).Msg("invalidate cached info failed")
			}
			entries = entries[n:]
		}
	}
}

func (v *invalidator) close() {
	close(v.done)
	v.wg.Wait()
}
