package master

import (
	"context"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// handler adapts Kitex requests to State calls. Errors travel as (code, message) in
// the response, never as transport errors.
type handler struct{ s *Server }

var _ mp.MasterService = (*handler)(nil)

func ref(n *mp.NodeRef) NodeRef {
	if n == nil {
		return NodeRef{}
	}
	return NodeRef{ID: n.NodeId, Generation: n.Generation, Token: n.Token}
}

func ssdInfo(i *mp.KvSsdStorageInfo) SSDInfo {
	if i == nil {
		return SSDInfo{}
	}
	return SSDInfo{Enabled: i.Enabled, CapacityBytes: i.CapacityBytes, UsedBytes: i.UsedBytes, MaxValueBytes: i.MaxValueBytes}
}

func (h *handler) Register(ctx context.Context, req *mp.RegisterRequest) (*mp.RegisterResponse, error) {
	pins := make([]Pin, 0, len(req.Pinned))
	for _, p := range req.Pinned {
		if p != nil {
			pins = append(pins, Pin{PinID: p.PinId, Offset: p.Offset, Len: p.Len})
		}
	}
	err := h.s.withState(func(st *State) error {
		now := time.Now()
		serving, servingOK := st.servingLeaseLocked(now, ref(req.Node))
		err := st.Register(now, ref(req.Node), req.SegmentSize, req.TransferReserve, req.LandingReserve, req.DataAddr, req.PeerAddr, ssdInfo(req.KvSsdStorage), pins)
		if err == nil && servingOK {
			// Under the lock: no write after this tomb is answered before it.
			h.s.quietAtLeast(serving)
		}
		if err == nil && req.PrevEpoch != 0 && req.PrevEpoch != h.s.epoch {
			st.ExpectReport(ref(req.Node))
			if wire.SkippedTerm(req.PrevEpoch, h.s.epoch, h.s.opts.LastTermEpoch) {
				st.RefuseReport(ref(req.Node))
			}
		}
		if err == nil && !req.RemoteRefillHolders {
			st.RefillHoldersAtDone(ref(req.Node))
		}
		if err == nil {
			st.SetRegistrationSeq(ref(req.Node), req.RegistrationSeq)
		}
		return err
	})
	o := &h.s.opts
	resp := &mp.RegisterResponse{MasterEpoch: h.s.epoch,
		HeartbeatIntervalMs: o.HeartbeatInterval.Milliseconds(), NodeTtlMs: o.NodeTTL.Milliseconds(),
		InflightTtlMs: o.InflightTTL.Milliseconds(), PersistTimeoutMs: o.PersistTimeout.Milliseconds(), PullTimeoutMs: o.PullTimeout.Milliseconds(),
		LastTermEpoch: o.LastTermEpoch}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest) (*mp.HeartbeatResponse, error) {
	resp := &mp.HeartbeatResponse{MasterEpoch: h.s.epoch}
	ack := req.EvictionsAck
	if req.EvictionsEpoch != h.s.epoch {
		ack = 0 // another master's sequence numbers
	}
	err := h.s.withState(func(st *State) error {
		ns, err := st.Heartbeat(time.Now(), ref(req.Node), ssdInfo(req.KvSsdStorage), ack)
		resp.Evicted, resp.EvictedSeqs, resp.SsdDropped, resp.EvictionsSeq, resp.EvictionsMore = ns.Evicted, ns.EvictedSeqs, ns.SSDDropped, ns.Seq, ns.More
		resp.RegistrationSeq, resp.MemorySegment = ns.RegistrationSeq, ns.Pool
		return err
	})
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) PutStart(ctx context.Context, req *mp.PutStartRequest) (*mp.PutStartResponse, error) {
	if err := h.applyAcks(req.Node, req.Acks); err != nil {
		return putStartResponse(PutPlan{}, err), nil
	}
	return h.putStart(ctx, req.Node, req.Key, req.Len, req.RejectIfExists, req.Parent), nil
}

func (h *handler) putStart(ctx context.Context, node *mp.NodeRef, key string, length int64, reject bool, parent *string) *mp.PutStartResponse {
	var plan PutPlan
	err := h.s.withSpace(ctx, func(st *State) (err error) {
		plan, err = st.PutStart(time.Now(), ref(node), key, length, reject, parent)
		return err
	})
	return putStartResponse(plan, err)
}

func putStartResponse(plan PutPlan, err error) *mp.PutStartResponse {
	resp := &mp.PutStartResponse{PutId: plan.PutID, TargetNodeId: plan.TargetNode, TargetDataAddr: plan.TargetAddr,
		TargetOffset: plan.TargetOffset, SourceOffset: plan.SourceOffset, PersistToSsd: plan.PersistToSSD}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp
}

// PutDone publishes a put; one placed on another owner is first pulled by that owner
// (Server.pull, outside the lock), and placed again on another one while pulls fail.
func (h *handler) PutDone(ctx context.Context, req *mp.PutDoneRequest) (*mp.PutDoneResponse, error) {
	resp := h.putDone(req.Node, req.Key, req.PutId)
	answerWrite(&resp.Code, &resp.Message, h.s.writeQuiet(ctx))
	return resp, nil
}

// putDone is PutDone without the write quiet period (a batch waits it out once).
func (h *handler) putDone(node *mp.NodeRef, key string, putID int64) *mp.PutDoneResponse {
	var res PutResult
	err := h.s.withState(func(st *State) (err error) {
		res, err = st.PutDone(time.Now(), ref(node), key, putID)
		return err
	})
	return h.finishPutDone(res, err)
}

// finishPutDone completes a State.PutDone's outcome: the pulls of a put placed on another
// owner (outside the lock; placed again while they fail), then the invalidations and the
// SSD persist it asks for.
func (h *handler) finishPutDone(res PutResult, err error) *mp.PutDoneResponse {
	for err == nil && res.Pull != nil {
		t := res.Pull
		pullErr, answered := h.s.pull(t)
		// The pull ended: its put ends too, whether or not the gate is open (a put left
		// marked as being pulled would hold its ranges for good; Server.locked).
		h.s.locked(func(st *State) error {
			res, err = st.PullDone(time.Now(), t.PutID, pullErr, answered)
			return nil
		})
	}
	if ierr := h.s.invalidate(res.Invalidations); err == nil {
		err = ierr
	}
	h.s.persist.submit(res.Persist)
	return putDoneResponse(err)
}

func putDoneResponse(err error) *mp.PutDoneResponse {
	resp := &mp.PutDoneResponse{}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp
}

func (h *handler) PutRevoke(ctx context.Context, req *mp.PutRevokeRequest) (*mp.PutRevokeResponse, error) {
	err := h.s.withState(func(st *State) error { return st.PutRevoke(ref(req.Node), req.Key, req.PutId) })
	resp := &mp.PutRevokeResponse{}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) GetStart(ctx context.Context, req *mp.GetStartRequest) (*mp.GetStartResponse, error) {
	if err := h.applyAcks(req.Node, req.Acks); err != nil {
		return getStartResponse(GetPlan{}, err), nil
	}
	return h.getStart(ctx, req.Node, req.Key, req.ExcludeNodes, req.HolderId), nil
}

func (h *handler) getStart(ctx context.Context, node *mp.NodeRef, key string, exclude []string, holderID int64) *mp.GetStartResponse {
	var p GetPlan
	err := h.s.withSpace(ctx, func(st *State) (err error) {
		p, err = st.GetStartAs(time.Now(), ref(node), key, exclude, holderID)
		return err
	})
	return getStartResponse(p, err)
}

// getStartResponse is GetStart's answer on the wire.
func getStartResponse(p GetPlan, err error) *mp.GetStartResponse {
	resp := &mp.GetStartResponse{GetId: p.GetID, PutId: p.PutID, Len: p.Len, Source: p.Source,
		SourceNodeId: p.SourceNode, SourceGeneration: p.SourceGeneration, SourceDataAddr: p.SourceDataAddr, SourcePeerAddr: p.SourcePeerAddr,
		SourceOffset: p.SourceOffset, TargetOffset: p.TargetOffset, Done: p.Done, HolderId: p.HolderID, NoticesSeq: p.NoticesSeq}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp
}

func (h *handler) GetDone(ctx context.Context, req *mp.GetDoneRequest) (*mp.GetDoneResponse, error) {
	return h.getDone(req.Node, req.Key, req.GetId), nil
}

func (h *handler) getDone(node *mp.NodeRef, key string, getID int64) *mp.GetDoneResponse {
	resp := &mp.GetDoneResponse{}
	err := h.s.withState(func(st *State) (err error) {
		res, err := st.GetDone(ref(node), key, getID)
		resp.HolderId, resp.Promoted, resp.NoticesSeq = res.HolderID, res.Promoted, res.NoticesSeq
		return err
	})
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp
}

func (h *handler) GetRevoke(ctx context.Context, req *mp.GetRevokeRequest) (*mp.GetRevokeResponse, error) {
	err := h.s.withState(func(st *State) error {
		return st.GetRevoke(time.Now(), ref(req.Node), req.Key, req.GetId, req.DropSsdSource, req.SourceFailed)
	})
	if req.Reason != "" && req.Node != nil {
		h.s.opts.Logger.Info().Str("node", req.Node.NodeId).Str("key", req.Key).Int64("get_id", req.GetId).
			Str("reason", req.Reason).Err(err).Msg("get revoked")
	}
	resp := &mp.GetRevokeResponse{}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) Delete(ctx context.Context, req *mp.DeleteRequest) (*mp.DeleteResponse, error) {
	resp := h.delete(req.Node, req.Key)
	answerWrite(&resp.Code, &resp.Message, h.s.writeQuiet(ctx))
	return resp, nil
}

// delete is Delete without the write quiet period (a batch waits it out once).
func (h *handler) delete(node *mp.NodeRef, key string) *mp.DeleteResponse {
	resp := &mp.DeleteResponse{}
	var invs []Invalidation
	err := h.s.withState(func(st *State) (err error) {
		resp.Deleted, resp.PutId, invs, err = st.Delete(ref(node), key)
		return err
	})
	if ierr := h.s.invalidate(invs); err == nil {
		err = ierr
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp
}

// NamespaceDelete deletes at most BATCH keys of a namespace under one hold of the lock
// (namespace.go) and answers once their synchronous invalidations, the requester's
// own included, are delivered; the owner calls again while more are left.
func (h *handler) NamespaceDelete(ctx context.Context, req *mp.NamespaceRequest) (*mp.NamespaceDeleteResponse, error) {
	resp := &mp.NamespaceDeleteResponse{}
	var invs []Invalidation
	err := h.s.withState(func(st *State) error {
		deleted, left, is, err := st.NamespaceDelete(ref(req.Node), req.Name, int(mp.BATCH))
		resp.Deleted, resp.Left, invs = int64(deleted), int64(left), is
		return err
	})
	if ierr := h.s.invalidate(invs); err == nil {
		err = ierr
	}
	if qerr := h.s.writeQuiet(ctx); err == nil {
		err = qerr
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) NamespaceStat(ctx context.Context, req *mp.NamespaceRequest) (*mp.NamespaceStatResponse, error) {
	resp := &mp.NamespaceStatResponse{}
	err := h.s.withState(func(st *State) (err error) {
		resp.Keys, resp.Bytes, err = st.NamespaceStat(ref(req.Node), req.Name)
		return err
	})
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) Exists(ctx context.Context, req *mp.ExistsRequest) (*mp.ExistsResponse, error) {
	resp := &mp.ExistsResponse{}
	err := h.s.withState(func(st *State) (err error) {
		resp.Exists, err = st.Exists(ref(req.Node), req.Key)
		return err
	})
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

// BatchSsdReplicaCommit publishes the SSD records of one BatchSsdReplicaPersist, under one
// hold of the State.
func (h *handler) BatchSsdReplicaCommit(ctx context.Context, req *mp.BatchSsdReplicaCommitRequest) (*mp.BatchSsdReplicaCommitResponse, error) {
	resp := &mp.BatchSsdReplicaCommitResponse{}
	if len(req.Items) > int(peer.PERSIST_BATCH_ITEMS) {
		resp.Code, resp.Message = wire.ToResponse(wire.Errorf(common.ErrorCode_INVALID_ARGUMENT,
			"%d SSD commits in one call; at most %d", len(req.Items), peer.PERSIST_BATCH_ITEMS))
		return resp, nil
	}
	err := h.s.withState(func(st *State) error {
		resp.Published = make([]bool, len(req.Items))
		for i, it := range req.Items {
			if it == nil {
				continue
			}
			ok, err := st.SsdReplicaCommit(ref(req.Node), it.Key, it.PutId, it.Len, it.RecordSeq, it.PersistId)
			if err != nil {
				resp.Published = nil
				return err
			}
			resp.Published[i] = ok
		}
		return nil
	})
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) BatchSsdReplicaEvict(ctx context.Context, req *mp.BatchSsdReplicaEvictRequest) (*mp.BatchSsdReplicaEvictResponse, error) {
	err := h.s.withState(func(st *State) error { return st.BatchSsdReplicaEvict(ref(req.Node), req.Entries, req.RecordSeqs) })
	resp := &mp.BatchSsdReplicaEvictResponse{}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) BatchDeleteAck(ctx context.Context, req *mp.BatchDeleteAckRequest) (*mp.BatchDeleteAckResponse, error) {
	resp := &mp.BatchDeleteAckResponse{}
	err := h.s.withState(func(st *State) error {
		u, err := st.BatchDeleteAck(ref(req.Node), req.HolderIds, req.Touched)
		resp.Unknown = int64(u)
		return err
	})
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

// applyAcks applies the holder acks a planning call carries. Its error (a shut gate, an
// unknown owner) answers the whole call: the owner gives acks back only on a call
// answered NOT_LEADER as a whole (a batch's items answered so, after a gate that shut
// for a moment between the acks and the items, left the acks applied by nobody).
func (h *handler) applyAcks(n *mp.NodeRef, acks []int64) error {
	if len(acks) == 0 {
		return nil
	}
	return h.s.withState(func(st *State) error {
		_, err := st.BatchDeleteAck(ref(n), acks, nil)
		return err
	})
}

// ReportReplicas adopts a batch of a re-registered owner's replica index (rebuild.go).
func (h *handler) ReportReplicas(ctx context.Context, req *mp.ReportReplicasRequest) (*mp.ReportReplicasResponse, error) {
	resp := &mp.ReportReplicasResponse{}
	if len(req.Records) > int(mp.REPORT_BATCH) {
		resp.Code, resp.Message = wire.ToResponse(wire.Errorf(common.ErrorCode_INVALID_ARGUMENT, "%d records in one report; at most %d", len(req.Records), mp.REPORT_BATCH))
		return resp, nil
	}
	recs := make([]ReplicaRecord, len(req.Records))
	for i, r := range req.Records {
		if r != nil {
			recs[i] = ReplicaRecord{Key: r.Key, PutID: r.PutId, Len: r.Len, Memory: r.Memory, Offset: r.Offset, SSD: r.Ssd, Parent: r.Parent, Seq: r.RecordSeq}
		}
	}
	var invs []Invalidation
	err := h.s.withState(func(st *State) (err error) {
		resp.Rejected, invs, err = st.ReportReplicas(time.Now(), ref(req.Node), recs, req.Last)
		return err
	})
	h.s.invalidate(invs) // (a report adopted what it adopted: a lapsed term's next leader asks again)
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}

func (h *handler) Stat(ctx context.Context, req *mp.StatRequest) (*mp.StatResponse, error) {
	resp := &mp.StatResponse{}
	err := h.s.withState(func(st *State) error {
		resp.Members = st.Members()
		resp.Keys = int64(st.Keys())
		resp.MemoryValues, resp.MemoryDuplicateBytes = st.MemoryValues()
		return nil
	})
	if err == nil {
		resp.Masters = h.s.listMasters(ctx)
	}
	resp.Code, resp.Message = wire.ToResponse(err)
	return resp, nil
}
