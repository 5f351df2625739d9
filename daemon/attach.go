package daemon

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
)

// logNameBytes is how much of a refused hello name a log line shows.
const logNameBytes = 32

// newAttachAcceptor runs the attach socket's connections through the shared accept
// loop: capped, refusals told with an AttachReply.
func (o *Owner) newAttachAcceptor() *acceptor {
	var a *acceptor
	a = newAcceptor(o.attachLn, socketAttach, o.opts.MaxConnections, o.opts.UIDShare, o.log, o.opts.Metrics,
		func(conn *net.UnixConn, _ uint32) { o.serveAttach(a, conn) },
		func(conn *net.UnixConn, msg string) { o.attachReject(conn, common.ErrorCode_UNAVAILABLE, msg) })
	return a
}

// acceptAttach accepts attach connections until the attach listener is closed.
func (o *Owner) acceptAttach(a *acceptor) {
	defer o.wg.Done()
	a.run()
}

// serveAttach runs one attach connection: versioned hello (within HelloTimeout),
// credentials, memfd hand-over, then it waits for the connection to close and ends the
// session.
func (o *Owner) serveAttach(a *acceptor, conn *net.UnixConn) {
	cred, err := shm.PeerCred(conn)
	if err != nil {
		o.log.Warn().Err(err).Msg("attach: no peer credentials")
		return
	}
	conn.SetDeadline(time.Now().Add(o.opts.HelloTimeout))
	body, err := shm.ReadFrame(conn, shm.MaxFrame)
	switch {
	case errors.Is(err, io.EOF):
		o.log.Debug().Int32("pid", cred.Pid).Msg("attach: closed before hello (a liveness probe)")
		return
	case errors.Is(err, os.ErrDeadlineExceeded):
		a.timedOut(metrics.TimeoutHello)
		return
	case errors.Is(err, shm.ErrFrameTooLarge):
		o.refuseHello(a, conn, cred, err.Error(), "")
		return
	case err != nil:
		a.refused(metrics.RefuseHello, "attach: bad hello frame", func(e *zerolog.Event) { e.Err(err).Int32("pid", cred.Pid) })
		return
	}
	var hello external.AttachHello
	if err := safeRead(&hello, body); err != nil {
		o.refuseHello(a, conn, cred, "cannot parse AttachHello: "+err.Error(), "")
		return
	}
	if len(hello.Name) > wire.MaxHelloNameBytes {
		o.refuseHello(a, conn, cred, fmt.Sprintf("hello name of %d bytes exceeds the limit of %d", len(hello.Name), wire.MaxHelloNameBytes), hello.Name)
		return
	}
	if hello.ProtocolVersion != external.PROTOCOL_VERSION {
		o.refuseHello(a, conn, cred, fmt.Sprintf("unsupported protocol version %d (this owner speaks %d)", hello.ProtocolVersion, external.PROTOCOL_VERSION), hello.Name)
		return
	}
	if err := o.permitAttach(cred); err != nil {
		a.refused(metrics.RefusePerm, "attach: permission denied", func(e *zerolog.Event) {
			e.Int32("pid", cred.Pid).Uint32("uid", cred.Uid).Uint32("gid", cred.Gid).Str("name", truncate(hello.Name, logNameBytes))
		})
		o.attachReject(conn, common.ErrorCode_PERMISSION_DENIED, err.Error())
		return
	}
	st := o.lock()
	if st.stopping {
		o.unlock()
		o.attachReject(conn, common.ErrorCode_UNAVAILABLE, "owner shutting down")
		return
	}
	id, size, err := st.reserveSession(cred.Uid)
	var area *shm.Segment
	if err == nil {
		area, err = o.newPutAreaLocked(st, id, cred.Uid, size)
	}
	if err != nil {
		o.unlock()
		a.refused(metrics.RefusePutArea, "attach: no put area", func(e *zerolog.Event) {
			e.Err(err).Int32("pid", cred.Pid).Uint32("uid", cred.Uid).Str("name", truncate(hello.Name, logNameBytes))
		})
		code, msg := wire.ToResponse(err)
		o.attachReject(conn, code, msg)
		return
	}
	c := newSession(id, randomID(), hello.Name, cred, conn, area)
	st.sessions[c.id] = c
	o.unlock()
	reply := &external.AttachReply{
		Code: common.ErrorCode_OK, ProtocolVersion: external.PROTOCOL_VERSION,
		ClientId: c.id, SessionToken: c.token, OwnerGeneration: o.generation,
		SegmentSize: o.seg.Size(), RpcSocket: wire.RPCSocketPath(o.opts.SocketPath()), NodeId: o.opts.NodeID,
	}
	fds := []int{o.seg.Fd()} // the segment first, then the put area
	if area != nil {
		reply.Isolated, reply.PutAreaSize = true, area.Size()
		fds = append(fds, area.Fd())
	}
	if err := shm.SendFrameWithFds(conn, thrift.FastMarshal(reply), fds...); err != nil {
		o.endSession(c, "attach reply failed: "+err.Error())
		return
	}
	conn.SetDeadline(time.Time{})
	o.log.Info().Int64("client", c.id).Str("name", hello.Name).Int32("pid", cred.Pid).Uint32("uid", cred.Uid).
		Int64("put_area", reply.PutAreaSize).Msg("client attached")
	// The connection carries nothing more; any byte or EOF ends the session.
	var b [1]byte
	_, err = conn.Read(b[:])
	why := "client closed the attach connection"
	if err == nil {
		why = "unexpected bytes on the attach connection"
	}
	o.endSession(c, why)
}

// refuseHello answers a hello with INVALID_ARGUMENT and counts and logs it
// (rate-limited, the name cut to logNameBytes).
func (o *Owner) refuseHello(a *acceptor, conn *net.UnixConn, cred shm.Cred, msg, name string) {
	a.refused(metrics.RefuseHello, "attach: hello refused", func(e *zerolog.Event) {
		e.Str("why", msg).Int32("pid", cred.Pid).Uint32("uid", cred.Uid)
		if name != "" {
			e.Str("name", truncate(name, logNameBytes)).Int("name_bytes", len(name))
		}
	})
	o.attachReject(conn, common.ErrorCode_INVALID_ARGUMENT, msg)
}

// truncate cuts s to at most n bytes for a log line.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func (o *Owner) attachReject(conn *net.UnixConn, code common.ErrorCode, msg string) {
	reply := &external.AttachReply{Code: code, Message: msg, ProtocolVersion: external.PROTOCOL_VERSION}
	shm.WriteFrame(conn, thrift.FastMarshal(reply))
}
