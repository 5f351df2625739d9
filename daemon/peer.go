package daemon

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/cloudwego/kitex/pkg/rpcinfo"
	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

// peerServer serves PeerService (master → owner, owner ↔ owner control calls) over TCP.
type peerServer struct {
	ln  net.Listener
	svr server.Server
}

func startPeerServer(o *Owner, addr string) (*peerServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("peer listen %s: %w", addr, err)
	}
	svr := peerservice.NewServer(&peerHandler{o: o},
		server.WithListener(ln),
		server.WithServiceAddr(ln.Addr()),
		server.WithServerBasicInfo(&rpcinfo.EndpointBasicInfo{ServiceName: "fluxkv-owner"}),
		server.WithExitWaitTime(500*time.Millisecond),
	)
	errc := make(chan error, 1)
	go func() { errc <- svr.Run() }()
	select {
	case err := <-errc:
		return nil, fmt.Errorf("peer serve: %w", err)
	case <-time.After(20 * time.Millisecond):
	}
	return &peerServer{ln: ln, svr: svr}, nil
}

func (p *peerServer) addr() string { return p.ln.Addr().String() }

func (p *peerServer) stop() { p.svr.Stop() }

type peerHandler struct{ o *Owner }

var _ peer.PeerService = (*peerHandler)(nil)

// SsdReplicaPersist: this owner runs without an SSD tier; the master only plans SSD
// persists for owners that declared one, so this answers UNAVAILABLE.
func (h *peerHandler) SsdReplicaPersist(ctx context.Context, req *peer.SsdReplicaPersistRequest) (*peer.SsdReplicaPersistResponse, error) {
	return &peer.SsdReplicaPersistResponse{Code: common.ErrorCode_UNAVAILABLE, Message: "this owner has no SSD tier"}, nil
}

// SsdStageRead: no SSD tier on this owner (see SsdReplicaPersist).
func (h *peerHandler) SsdStageRead(ctx context.Context, req *peer.SsdStageReadRequest) (*peer.SsdStageReadResponse, error) {
	return &peer.SsdStageReadResponse{Code: common.ErrorCode_UNAVAILABLE, Message: "this owner has no SSD tier"}, nil
}

// InvalidateCachedInfo drops cached infos of keys another owner overwrote or deleted.
func (h *peerHandler) InvalidateCachedInfo(ctx context.Context, req *peer.InvalidateCachedInfoRequest) (*peer.InvalidateCachedInfoResponse, error) {
	o := h.o
	o.mu.Lock()
	for _, e := range req.Entries {
		if e != nil {
			o.dropCachedLocked(e.Key, e.PutId)
		}
	}
	o.mu.Unlock()
	return &peer.InvalidateCachedInfoResponse{Code: common.ErrorCode_OK}, nil
}
