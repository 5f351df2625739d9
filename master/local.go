package master

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/cloudwego/kitex/client/callopt"

	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// LocalClient is a MasterService client for an owner in this process (fluxkv up): its
// calls run this server's handlers directly on the caller's goroutine, without a
// connection, framing, encoding or the authentication of one (the caller is this
// process). A handler runs as it does for a network call, without the caller's
// cancellation (what it sends to owners is not cut short), except that its waits (for
// space, the write quiet period) end when the caller's context does: then it makes its
// last attempt and answers, where a network caller would have stopped listening (a put
// start the master granted after that would be left to the in-flight TTL). No goroutine
// is started per call: on a few cores handing each call to one woke a second thread
// and cost more than the handler (fluxkv up: a third of the owner's CPU per put). Once
// the server is stopped calls fail. Call options are ignored: the context's deadline is
// the timeout. The master's calls count in no metrics (up's master records none).
// Requests must not be changed once sent, and answers belong to the caller (neither
// side keeps the other's objects). Valid once the server is started.
func (s *Server) LocalClient() masterservice.Client { return localClient{h: &handler{s: s}} }

// localClient is LocalClient's client: one method per MasterService call, each
// handing its request to the handler of the same name through local.
type localClient struct{ h *handler }

var _ masterservice.Client = localClient{}

// local runs one handler call for a caller in this process (LocalClient), on the
// caller's goroutine. A panic in the handler is logged and answered as an error, as
// the Kitex server does for a call over the network.
func local[Req, Resp any](h *handler, ctx context.Context, method string, req Req, f func(context.Context, Req) (Resp, error)) (resp Resp, err error) {
	var zero Resp
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("in-process master %s: %w", method, err)
	}
	select {
	case <-h.s.stop:
		return zero, fmt.Errorf("in-process master %s: the master is stopped", method)
	default:
	}
	defer func() {
		if p := recover(); p != nil {
			h.s.opts.Logger.Error().Str("method", method).Interface("panic", p).Str("stack", string(debug.Stack())).Msg("master handler panicked (in-process call)")
			resp, err = zero, fmt.Errorf("in-process master %s: handler panicked: %v", method, p)
		}
	}()
	return f(context.WithValue(context.WithoutCancel(ctx), callerKey{}, ctx), req)
}

// callerKey carries an in-process caller's context into its handler (local), whose
// own context has no cancellation.
type callerKey struct{}

// waitContext is what a handler's waits end with: the in-process caller's context
// when there is one (local), else the handler's.
func waitContext(ctx context.Context) context.Context {
	if c, ok := ctx.Value(callerKey{}).(context.Context); ok {
		return c
	}
	return ctx
}

func (c localClient) Register(ctx context.Context, req *mp.RegisterRequest, _ ...callopt.Option) (*mp.RegisterResponse, error) {
	return local(c.h, ctx, "Register", req, c.h.Register)
}

func (c localClient) Heartbeat(ctx context.Context, req *mp.HeartbeatRequest, _ ...callopt.Option) (*mp.HeartbeatResponse, error) {
	return local(c.h, ctx, "Heartbeat", req, c.h.Heartbeat)
}

func (c localClient) PutStart(ctx context.Context, req *mp.PutStartRequest, _ ...callopt.Option) (*mp.PutStartResponse, error) {
	return local(c.h, ctx, "PutStart", req, c.h.PutStart)
}

func (c localClient) PutDone(ctx context.Context, req *mp.PutDoneRequest, _ ...callopt.Option) (*mp.PutDoneResponse, error) {
	return local(c.h, ctx, "PutDone", req, c.h.PutDone)
}

func (c localClient) PutRevoke(ctx context.Context, req *mp.PutRevokeRequest, _ ...callopt.Option) (*mp.PutRevokeResponse, error) {
	return local(c.h, ctx, "PutRevoke", req, c.h.PutRevoke)
}

func (c localClient) GetStart(ctx context.Context, req *mp.GetStartRequest, _ ...callopt.Option) (*mp.GetStartResponse, error) {
	return local(c.h, ctx, "GetStart", req, c.h.GetStart)
}

func (c localClient) GetDone(ctx context.Context, req *mp.GetDoneRequest, _ ...callopt.Option) (*mp.GetDoneResponse, error) {
	return local(c.h, ctx, "GetDone", req, c.h.GetDone)
}

func (c localClient) GetRevoke(ctx context.Context, req *mp.GetRevokeRequest, _ ...callopt.Option) (*mp.GetRevokeResponse, error) {
	return local(c.h, ctx, "GetRevoke", req, c.h.GetRevoke)
}

func (c localClient) Delete(ctx context.Context, req *mp.DeleteRequest, _ ...callopt.Option) (*mp.DeleteResponse, error) {
	return local(c.h, ctx, "Delete", req, c.h.Delete)
}

func (c localClient) Exists(ctx context.Context, req *mp.ExistsRequest, _ ...callopt.Option) (*mp.ExistsResponse, error) {
	return local(c.h, ctx, "Exists", req, c.h.Exists)
}

func (c localClient) BatchSsdReplicaCommit(ctx context.Context, req *mp.BatchSsdReplicaCommitRequest, _ ...callopt.Option) (*mp.BatchSsdReplicaCommitResponse, error) {
	return local(c.h, ctx, "BatchSsdReplicaCommit", req, c.h.BatchSsdReplicaCommit)
}

func (c localClient) BatchSsdReplicaEvict(ctx context.Context, req *mp.BatchSsdReplicaEvictRequest, _ ...callopt.Option) (*mp.BatchSsdReplicaEvictResponse, error) {
	return local(c.h, ctx, "BatchSsdReplicaEvict", req, c.h.BatchSsdReplicaEvict)
}

func (c localClient) BatchDeleteAck(ctx context.Context, req *mp.BatchDeleteAckRequest, _ ...callopt.Option) (*mp.BatchDeleteAckResponse, error) {
	return local(c.h, ctx, "BatchDeleteAck", req, c.h.BatchDeleteAck)
}

func (c localClient) Stat(ctx context.Context, req *mp.StatRequest, _ ...callopt.Option) (*mp.StatResponse, error) {
	return local(c.h, ctx, "Stat", req, c.h.Stat)
}

func (c localClient) ReportReplicas(ctx context.Context, req *mp.ReportReplicasRequest, _ ...callopt.Option) (*mp.ReportReplicasResponse, error) {
	return local(c.h, ctx, "ReportReplicas", req, c.h.ReportReplicas)
}

func (c localClient) BatchGetStart(ctx context.Context, req *mp.BatchGetStartRequest, _ ...callopt.Option) (*mp.BatchGetStartResponse, error) {
	return local(c.h, ctx, "BatchGetStart", req, c.h.BatchGetStart)
}

func (c localClient) BatchGetDone(ctx context.Context, req *mp.BatchGetDoneRequest, _ ...callopt.Option) (*mp.BatchGetDoneResponse, error) {
	return local(c.h, ctx, "BatchGetDone", req, c.h.BatchGetDone)
}

func (c localClient) BatchExists(ctx context.Context, req *mp.BatchExistsRequest, _ ...callopt.Option) (*mp.BatchExistsResponse, error) {
	return local(c.h, ctx, "BatchExists", req, c.h.BatchExists)
}

func (c localClient) BatchDelete(ctx context.Context, req *mp.BatchDeleteRequest, _ ...callopt.Option) (*mp.BatchDeleteResponse, error) {
	return local(c.h, ctx, "BatchDelete", req, c.h.BatchDelete)
}

func (c localClient) BatchPutStart(ctx context.Context, req *mp.BatchPutStartRequest, _ ...callopt.Option) (*mp.BatchPutStartResponse, error) {
	return local(c.h, ctx, "BatchPutStart", req, c.h.BatchPutStart)
}

func (c localClient) BatchPutDone(ctx context.Context, req *mp.BatchPutDoneRequest, _ ...callopt.Option) (*mp.BatchPutDoneResponse, error) {
	return local(c.h, ctx, "BatchPutDone", req, c.h.BatchPutDone)
}

func (c localClient) NamespaceDelete(ctx context.Context, req *mp.NamespaceRequest, _ ...callopt.Option) (*mp.NamespaceDeleteResponse, error) {
	return local(c.h, ctx, "NamespaceDelete", req, c.h.NamespaceDelete)
}

func (c localClient) NamespaceStat(ctx context.Context, req *mp.NamespaceRequest, _ ...callopt.Option) (*mp.NamespaceStatResponse, error) {
	return local(c.h, ctx, "NamespaceStat", req, c.h.NamespaceStat)
}
