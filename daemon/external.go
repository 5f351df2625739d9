package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// externalHandler implements ExternalService for the framed Unix-socket server.
type externalHandler struct{ o *Owner }

var _ external.ExternalService = (*externalHandler)(nil)

// serve validates the session, processes the releases piggybacked on the request
// (first: they may free the space a put needs; a released key stays in the hot set for
// CacheGrace, so a get + release loop still hits the hot set), then runs f. More than
// wire.MaxReleasesPerCall releases fail the call with INVALID_ARGUMENT, none processed.
// A valid session is recorded on the call's connection (it may then idle while the
// session lives).
func (o *Owner) serve(ctx context.Context, s *external.Session, f func(c *session) error) (common.ErrorCode, string) {
	st := o.lock()
	c, err := st.session(s)
	if err == nil {
		setConnClient(ctx, c.id)
		if len(s.Releases) > wire.MaxReleasesPerCall {
			err = errCode(common.ErrorCode_INVALID_ARGUMENT, "%d piggybacked releases exceed the limit of %d per call: none released", len(s.Releases), wire.MaxReleasesPerCall)
		}
	}
	if err == nil {
		now := time.Now()
		for _, id := range s.Releases {
			st.release(c, id, now)
		}
	}
	o.unlock()
	if err == nil {
		err = f(c)
	}
	setResult(ctx, err)
	return wire.ToResponse(err)
}

func (h *externalHandler) PutStart(ctx context.Context, req *external.PutStartRequest) (*external.PutStartResponse, error) {
	resp := &external.PutStartResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) (err error) {
		resp.PutId, resp.Offset, err = h.o.putStart(c, req.Key, req.Len, req.Opts, req.Parent)
		if err == nil {
			grantPut(ctx, c.id, req.Key, resp.PutId)
		}
		if errors.Is(err, wire.ErrAlreadyExists) {
			setSkipped(ctx) // a key already cached (reject_if_exists), as in a BatchPutStart
		}
		return err
	})
	return resp, nil
}

func (h *externalHandler) PutEnd(ctx context.Context, req *external.PutEndRequest) (*external.PutEndResponse, error) {
	resp := &external.PutEndResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		err := h.o.putEnd(c, req.Key, req.PutId, req.Copies)
		if errors.Is(err, wire.ErrAlreadyExists) {
			setSkipped(ctx) // reject_if_exists: another put published the key meanwhile
		}
		return err
	})
	return resp, nil
}

func (h *externalHandler) PutWrite(ctx context.Context, req *external.PutWriteRequest) (*external.PutWriteResponse, error) {
	resp := &external.PutWriteResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error { return h.o.putWrite(c, req.Key, req.PutId, req.Copies) })
	return resp, nil
}

func (h *externalHandler) PutAbort(ctx context.Context, req *external.PutAbortRequest) (*external.PutAbortResponse, error) {
	resp := &external.PutAbortResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error { return h.o.putAbort(c, req.Key, req.PutId) })
	return resp, nil
}

func (h *externalHandler) Get(ctx context.Context, req *external.GetRequest) (*external.GetResponse, error) {
	var resp *external.GetResponse
	code, msg := h.o.serve(ctx, req.Session, func(c *session) (err error) {
		resp, err = h.o.get(c, req.Key)
		if err == nil {
			setHit(ctx, resp.Source)
			grantHolder(ctx, c.id, resp.HolderId)
		}
		return err
	})
	if resp == nil {
		resp = &external.GetResponse{}
	}
	resp.Code, resp.Message = code, msg
	return resp, nil
}

func (h *externalHandler) Release(ctx context.Context, req *external.ReleaseRequest) (*external.ReleaseResponse, error) {
	resp := &external.ReleaseResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		if err := wire.ValidateBatch(len(req.HolderIds)); err != nil {
			return err
		}
		bad := 0
		st, now := h.o.lock(), time.Now()
		for _, id := range req.HolderIds {
			code := common.ErrorCode_OK
			if !st.release(c, id, now) {
				code = common.ErrorCode_INVALID_ARGUMENT
				bad++
			}
			resp.Results = append(resp.Results, code)
		}
		h.o.unlock()
		if bad > 0 {
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "%d of %d holders unknown or already released", bad, len(req.HolderIds))
		}
		return nil
	})
	return resp, nil
}

func (h *externalHandler) Delete(ctx context.Context, req *external.DeleteRequest) (*external.DeleteResponse, error) {
	resp := &external.DeleteResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) (err error) {
		r := h.o.deleteMany([]string{req.Key})[0]
		resp.Deleted = r.Deleted
		return wire.FromResponse(r.Code, r.Message)
	})
	return resp, nil
}

func (h *externalHandler) Exists(ctx context.Context, req *external.ExistsRequest) (*external.ExistsResponse, error) {
	resp := &external.ExistsResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) (err error) {
		resp.Exists, err = h.o.exists(req.Key)
		if err == nil && !resp.Exists {
			setMiss(ctx)
		}
		return err
	})
	return resp, nil
}

func (h *externalHandler) BatchPutStart(ctx context.Context, req *external.BatchPutStartRequest) (*external.BatchPutStartResponse, error) {
	resp := &external.BatchPutStartResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		if err := wire.ValidateBatch(len(req.Items)); err != nil {
			return err
		}
		resp.Results = h.o.putStartMany(c, req.Items)
		for i, r := range resp.Results {
			// A page already cached (reject_if_exists) is skipped, not failed: the KV
			// stores put every page of a prompt so.
			if r.Code != common.ErrorCode_OK && r.Code != common.ErrorCode_ALREADY_EXISTS {
				setItemFailed(ctx)
			}
			if r.Code == common.ErrorCode_OK {
				grantPut(ctx, c.id, req.Items[i].Key, r.PutId)
			}
		}
		return nil
	})
	return resp, nil
}

func (h *externalHandler) BatchPutEnd(ctx context.Context, req *external.BatchPutEndRequest) (*external.BatchPutEndResponse, error) {
	resp := &external.BatchPutEndResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		if err := wire.ValidateBatch(len(req.Items)); err != nil {
			return err
		}
		copies := 0
		for _, it := range req.Items {
			if it != nil {
				copies += len(it.Copies)
			}
		}
		if err := checkCopyCount(copies); err != nil {
			return err
		}
		for _, err := range h.o.putEndMany(c, req.Items) {
			if err != nil && !errors.Is(err, wire.ErrAlreadyExists) { // reject_if_exists: skipped
				setItemFailed(ctx)
			}
			r := &external.PutEndResponse{}
			r.Code, r.Message = wire.ToResponse(err)
			resp.Results = append(resp.Results, r)
		}
		return nil
	})
	return resp, nil
}

func (h *externalHandler) BatchPutAbort(ctx context.Context, req *external.BatchPutAbortRequest) (*external.BatchPutAbortResponse, error) {
	resp := &external.BatchPutAbortResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		if err := wire.ValidateBatch(len(req.Items)); err != nil {
			return err
		}
		for _, it := range req.Items {
			r := &external.PutAbortResponse{}
			r.Code, r.Message = wire.ToResponse(itemErr(it, func() error { return h.o.putAbort(c, it.Key, it.PutId) }))
			resp.Results = append(resp.Results, r)
		}
		return nil
	})
	return resp, nil
}

func itemErr(it *external.PutEndItem, f func() error) error {
	if it == nil {
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "null item")
	}
	return f()
}

func (h *externalHandler) BatchGet(ctx context.Context, req *external.BatchKeysRequest) (*external.BatchGetResponse, error) {
	resp := &external.BatchGetResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		if err := wire.ValidateBatch(len(req.Keys)); err != nil {
			return err
		}
		gets := h.o.getMany(c, req.Keys)
		h.o.countGets(gets)
		for _, g := range gets {
			r := g.resp
			if r == nil {
				r = &external.GetResponse{}
			}
			r.Code, r.Message = wire.ToResponse(g.err)
			if g.err == nil {
				grantHolder(ctx, c.id, r.HolderId)
			}
			resp.Results = append(resp.Results, r)
		}
		return nil
	})
	return resp, nil
}

func (h *externalHandler) BatchExists(ctx context.Context, req *external.BatchExistsRequest) (*external.BatchExistsResponse, error) {
	resp := &external.BatchExistsResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		if err := wire.ValidateBatch(len(req.Keys)); err != nil {
			return err
		}
		if req.PinMs < 0 || req.PinMs > int64(external.MAX_PIN_MS) || (req.PinMs > 0 && !req.Prefix) {
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "pin_ms %d: a prefix lookup pins for 0 to %d ms", req.PinMs, external.MAX_PIN_MS)
		}
		resp.Results, resp.Found = h.o.existsMany(c, req.Keys, req.Prefix, time.Duration(req.PinMs)*time.Millisecond)
		return nil
	})
	return resp, nil
}

func (h *externalHandler) BatchDelete(ctx context.Context, req *external.BatchKeysRequest) (*external.BatchDeleteResponse, error) {
	resp := &external.BatchDeleteResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		if err := wire.ValidateBatch(len(req.Keys)); err != nil {
			return err
		}
		resp.Results = h.o.deleteMany(req.Keys)
		return nil
	})
	return resp, nil
}

func (h *externalHandler) DeleteNamespace(ctx context.Context, req *external.NamespaceRequest) (*external.DeleteNamespaceResponse, error) {
	resp := &external.DeleteNamespaceResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) (err error) {
		resp.Deleted, err = h.o.deleteNamespace(req.Name)
		return err
	})
	return resp, nil
}

func (h *externalHandler) NamespaceStat(ctx context.Context, req *external.NamespaceRequest) (*external.NamespaceStatResponse, error) {
	resp := &external.NamespaceStatResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) (err error) {
		resp.Keys, resp.Bytes, err = h.o.namespaceStat(req.Name)
		return err
	})
	return resp, nil
}

func (h *externalHandler) Stat(ctx context.Context, req *external.StatRequest) (*external.StatResponse, error) {
	resp := &external.StatResponse{}
	resp.Code, resp.Message = h.o.serve(ctx, req.Session, func(c *session) error {
		st := h.o.lock()
		resp.ClientHolders = int64(len(c.holders))
		resp.Clients = int64(len(st.sessions))
		h.o.unlock()
		// Released holders must count as released: end their grace and ack them now,
		// unless the caller keeps the hot set.
		if !req.KeepHotSet {
			h.o.sweepIdle(true)
		}
		h.o.acks.sync()
		ctx, cancel := h.o.master.ctx()
		defer cancel()
		r, err := h.o.master.cl().Stat(ctx, &mp.StatRequest{})
		if err != nil {
			return errCode(common.ErrorCode_UNAVAILABLE, "master unreachable: %v", err)
		}
		resp.Members, resp.Keys, resp.NodeId, resp.Masters = r.Members, r.Keys, h.o.opts.NodeID, r.Masters
		resp.MemoryValues, resp.MemoryDuplicateBytes = r.MemoryValues, r.MemoryDuplicateBytes
		// The master's SSD figures are a heartbeat old; this owner's own are current.
		if h.o.store != nil {
			for _, m := range resp.Members {
				if m.NodeId == h.o.opts.NodeID {
					si := h.o.ssdInfo()
					m.KvSsd = &common.CapacityStat{CapacityBytes: si.CapacityBytes, UsedBytes: si.UsedBytes}
				}
			}
		}
		return wire.FromResponse(r.Code, r.Message)
	})
	return resp, nil
}
