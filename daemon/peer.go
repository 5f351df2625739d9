package daemon

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/server"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// peerServer serves PeerService (master → owner, owner ↔ owner control calls) over TCP.
type peerServer struct {
	ln    net.Listener
	svr   server.Server
	check *auth.MasterCheck // nil: no master keys
	once  sync.Once
	ran   chan struct{} // closed when Run returned
}

func startPeerServer(o *Owner, addr string) (*peerServer, error) {
	raw, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer listen %s: %w", addr, err)
	}
	check := auth.NewMasterCheck(o.opts.MasterKeys, o.opts.NodeID)
	// Every connection authenticates before Kitex reads a call from it (docs/architecture.md §11).
	// A master's connection also proves it is one (masteronly.go).
	ln := auth.Listener(raw, o.opts.Secrets, auth.PurposePeer,
		auth.ListenerOptions{Logger: o.opts.Logger, Metrics: o.opts.Metrics, MasterCheck: check, MaxPending: peerPendingHandshakes(nofileLimit())})
	// and every frame is checked before Kitex decodes a byte of it (wire.GuardListener).
	ln = wire.GuardListener(ln, wire.GuardOptions{Socket: auth.PurposePeer, FrameTimeout: o.opts.FrameTimeout,
		Budget: o.peerFrames, Logger: o.opts.Logger, Metrics: o.opts.Metrics})
	opts, started := auth.ServerOptionsStarted(ln)
	svr := peerservice.NewServer(newPeerHandler(o), append(append(opts,
		server.WithServerBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "fluxkv-owner"}),
		server.WithExitWaitTime(500*time.Millisecond),
	), o.opts.testPeerServerOpts...)...)
	errc, ran := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(ran)
		errc <- svr.Run()
	}()
	select {
	case err := <-errc:
		return nil, fmt.Errorf("peer serve: %w", err)
	case <-started:
	}
	return &peerServer{ln: ln, svr: svr, check: check, ran: ran}, nil
}

func (p *peerServer) addr() string { return p.ln.Addr().String() }

// stop stops serving and waits for the server's goroutine; later calls do nothing.
func (p *peerServer) stop() {
	p.once.Do(func() {
		p.svr.Stop()
		p.ln.Close() // Kitex closed it; this also drains connections if it did not
		<-p.ran
	})
}

type peerHandler struct {
	o       *Owner
	refused zerolog.Logger // master-only calls refused: at most one line a second
}

func newPeerHandler(o *Owner) *peerHandler {
	return &peerHandler{o: o, refused: o.log.Sample(&zerolog.BurstSampler{Burst: 1, Period: time.Second})}
}

var _ peer.PeerService = (*peerHandler)(nil)

// BatchSsdReplicaPersist writes fresh memory replicas to the local SSD ring and commits
// them (persist.go).
func (h *peerHandler) BatchSsdReplicaPersist(ctx context.Context, req *peer.BatchSsdReplicaPersistRequest) (*peer.BatchSsdReplicaPersistResponse, error) {
	resp := &peer.BatchSsdReplicaPersistResponse{}
	err := h.masterOnly(ctx, "BatchSsdReplicaPersist")
	admitted := int64(-1)
	for _, it := range req.Items { // one master's call: every item carries its epoch
		if err != nil {
			break
		}
		if it != nil && it.MasterEpoch != admitted {
			admitted, err = it.MasterEpoch, h.o.admit(it.MasterEpoch)
		}
	}
	var errs []error
	if err == nil {
		errs, err = h.o.persistMany(req.Items)
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	for _, e := range errs {
		r := &peer.SsdReplicaPersistResponse{}
		r.Code, r.Message = wire.ToResponse(e)
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

// SsdStageRead stages a value from this owner's SSD for another owner to pull.
func (h *peerHandler) SsdStageRead(ctx context.Context, req *peer.SsdStageReadRequest) (*peer.SsdStageReadResponse, error) {
	resp := &peer.SsdStageReadResponse{}
	resp.Code, resp.Message = wire.ToResponse(h.o.stageRead(req))
	return resp, nil
}

// BatchSsdStageRead stages a get batch's values from this owner's SSD for another owner
// to pull (stage_batch.go).
func (h *peerHandler) BatchSsdStageRead(ctx context.Context, req *peer.BatchSsdStageReadRequest) (*peer.BatchSsdStageReadResponse, error) {
	resp := &peer.BatchSsdStageReadResponse{}
	errs, err := h.o.batchStageRead(req)
	resp.Code, resp.Message = wire.ToResponse(err)
	for _, e := range errs {
		r := &peer.SsdStageReadResponse{}
		r.Code, r.Message = wire.ToResponse(e)
		resp.Results = append(resp.Results, r)
	}
	return resp, nil
}

// PullPut pulls a put the master placed here from its requester's transfer area.
func (h *peerHandler) PullPut(ctx context.Context, req *peer.PullPutRequest) (*peer.PullPutResponse, error) {
	resp := &peer.PullPutResponse{}
	err := h.masterOnly(ctx, "PullPut")
	if err == nil {
		err = h.o.admit(req.MasterEpoch)
	}
	if err == nil {
		err = h.o.pullPut(ctx, req)
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

// BatchPullPut pulls the puts of one master batch placed here (pullPuts): results[i]
// answers items[i] as PullPut would.
func (h *peerHandler) BatchPullPut(ctx context.Context, req *peer.BatchPullPutRequest) (*peer.BatchPullPutResponse, error) {
	resp := &peer.BatchPullPutResponse{}
	err := h.masterOnly(ctx, "BatchPullPut")
	if err == nil && len(req.Items) > int(peer.PULL_PUT_BATCH_ITEMS) {
		err = errCode(common.ErrorCode_INVALID_ARGUMENT, "%d items in one BatchPullPut; at most %d", len(req.Items), peer.PULL_PUT_BATCH_ITEMS)
	}
	if err == nil {
		for _, it := range req.Items {
			if it != nil {
				err = h.o.admit(it.MasterEpoch) // the same in every item
				break
			}
		}
	}
	if err == nil {
		for _, e := range h.o.pullPuts(ctx, req.Items) {
			r := &peer.PullPutResponse{}
			r.Code, r.Message = wire.ToResponse(e)
			resp.Results = append(resp.Results, r)
		}
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

// ReleaseHotSet gives the master back idle holdings of the hot set: it needs space
// and found no replica it may evict, or its eviction order reached keys this owner
// holds (req.Keys). The acks reach the master before the answer, so
// its retry finds the ranges free.
func (h *peerHandler) ReleaseHotSet(ctx context.Context, req *peer.ReleaseHotSetRequest) (*peer.ReleaseHotSetResponse, error) {
	o := h.o
	if err := h.masterOnly(ctx, "ReleaseHotSet"); err != nil {
		resp := &peer.ReleaseHotSetResponse{}
		resp.Code, resp.Message = wire.ToResponse(err)
		return resp, nil
	}
	if err := o.checkNodeGen("ReleaseHotSet", req.Generation); err != nil {
		resp := &peer.ReleaseHotSetResponse{}
		resp.Code, resp.Message = wire.ToResponse(err)
		return resp, nil
	}
	if err := o.admit(req.MasterEpoch); err != nil {
		resp := &peer.ReleaseHotSetResponse{}
		resp.Code, resp.Message = wire.ToResponse(err)
		return resp, nil
	}
	return o.releaseHotSet(req.Keys, req.Bytes), nil
}

// releaseHotSet gives the master back idle hot-set holdings (of keys, else bytes' worth)
// and acks them with every holder released since the last ack batch.
func (o *Owner) releaseHotSet(keys []string, bytes int64) *peer.ReleaseHotSetResponse {
	defer o.acks.holdForSync()()
	st := o.lock()
	n, released := st.releaseHotSet(keys, bytes)
	o.unlock()
	// The master asks because it is short of room: holders released since the last
	// ack batch are room too, so they are acked now, with the hot set's. Acks that did
	// not go out (the call failed; they wait for a retry) are no room the master has:
	// answered OK, it stopped sparing held duplicates and evicted a sole copy for room
	// still held (a review).
	sent := o.acks.sync()
	if n > 0 {
		o.log.Debug().Int("holdings", n).Int64("bytes", released).Bool("acked", sent).Msg("hot set given back to the master")
	}
	if !sent {
		return &peer.ReleaseHotSetResponse{Code: common.ErrorCode_UNAVAILABLE, Message: "the released holders' acks did not reach the master (sent again later)",
			ReleasedBytes: released}
	}
	return &peer.ReleaseHotSetResponse{Code: common.ErrorCode_OK, ReleasedBytes: released}
}

// InvalidateCachedInfo drops from the hot set the keys another owner overwrote or deleted.
func (h *peerHandler) InvalidateCachedInfo(ctx context.Context, req *peer.InvalidateCachedInfoRequest) (*peer.InvalidateCachedInfoResponse, error) {
	o := h.o
	if err := h.masterOnly(ctx, "InvalidateCachedInfo"); err != nil {
		resp := &peer.InvalidateCachedInfoResponse{}
		resp.Code, resp.Message = wire.ToResponse(err)
		return resp, nil
	}
	if err := o.admit(req.MasterEpoch); err != nil {
		resp := &peer.InvalidateCachedInfoResponse{}
		resp.Code, resp.Message = wire.ToResponse(err)
		return resp, nil
	}
	st := o.lock()
	for _, e := range req.Entries {
		if e != nil {
			st.invalidate(e.Key, e.PutId)
		}
	}
	o.unlock()
	return &peer.InvalidateCachedInfoResponse{Code: common.ErrorCode_OK}, nil
}
