package master

import (
	"context"
	"sync"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// peerClients caches one PeerService client per owner address; their connections
// authenticate with the cluster secrets.
type peerClients struct {
	secrets *auth.Secrets // nil: insecure

	mu      sync.Mutex // protects clients
	clients map[string]peerservice.Client
}

func newPeerClients(s *auth.Secrets) *peerClients {
	return &peerClients{secrets: s, clients: make(map[string]peerservice.Client)}
}

func (p *peerClients) get(addr string) (peerservice.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[addr]; c != nil {
		return c, nil
	}
	c, err := peerservice.NewClient("fluxkv-owner", append(auth.ClientOptions(p.secrets, auth.PurposePeer),
		client.WithHostPorts(addr))...)
	if err != nil {
		return nil, err
	}
	p.clients[addr] = c
	return c, nil
}

// persister runs SsdReplicaPersist calls after PutDone on a bounded pool of workers;
// every task ends with State.PersistDone, whatever the outcome.
type persister struct {
	s     *Server
	log   zerolog.Logger
	tasks chan *PersistTask
	wg    sync.WaitGroup
}

func newPersister(s *Server) *persister {
	p := &persister{s: s, log: *s.opts.Logger, tasks: make(chan *PersistTask, s.opts.PersistQueue)}
	for i := 0; i < s.opts.PersistWorkers; i++ {
		p.wg.Add(1)
		go p.worker()
	}
	return p
}

// submit queues a persist; when the queue is full the replica is admitted to the
// eviction policy without reaching SSD (puts never wait on the SSD tier).
func (p *persister) submit(t *PersistTask) {
	if t == nil {
		return
	}
	select {
	case p.tasks <- t:
	default:
		p.log.Warn().Str("key", t.Key).Str("node", t.NodeID).Msg("SSD persist queue full; value stays memory-only")
		p.s.withState(func(st *State) error { st.PersistDone(t.PutID); return nil })
	}
}

func (p *persister) worker() {
	defer p.wg.Done()
	for t := range p.tasks {
		err := p.persist(t)
		if err != nil {
			p.log.Warn().Err(err).Str("key", t.Key).Int64("put_id", t.PutID).Str("node", t.NodeID).Msg("SSD persist failed; the put stays memory-only")
		}
		p.s.withState(func(st *State) error { st.PersistDone(t.PutID); return nil })
	}
}

func (p *persister) persist(t *PersistTask) error {
	c, err := p.s.peers.get(t.PeerAddr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.s.opts.PersistTimeout)
	defer cancel()
	resp, err := c.SsdReplicaPersist(ctx, &peer.SsdReplicaPersistRequest{Key: t.Key, PutId: t.PutID,
		Offset: t.Offset, Len: t.Len, Generation: t.Generation})
	if err != nil {
		return err
	}
	return wire.FromResponse(resp.Code, resp.Message)
}

// close waits for queued persists to finish (bounded by their timeouts).
func (p *persister) close(wait time.Duration) {
	close(p.tasks)
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		p.log.Warn().Msg("master stop: SSD persists still running")
	}
}
