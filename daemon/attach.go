package daemon

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
)

const attachHelloTimeout = 5 * time.Second

func (o *Owner) acceptAttach() {
	defer o.wg.Done()
	for {
		conn, err := o.attachLn.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				o.log.Error().Err(err).Msg("attach accept")
			}
			return
		}
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			o.serveAttach(conn)
		}()
	}
}

// serveAttach runs one attach connection: versioned hello, credentials, memfd hand-over,
// then it waits for the connection to close and ends the session.
func (o *Owner) serveAttach(conn *net.UnixConn) {
	defer conn.Close()
	cred, err := shm.PeerCred(conn)
	if err != nil {
		o.log.Warn().Err(err).Msg("attach: no peer credentials")
		return
	}
	conn.SetDeadline(time.Now().Add(attachHelloTimeout))
	body, err := shm.ReadFrame(conn, 64<<10)
	if errors.Is(err, io.EOF) {
		o.log.Debug().Int32("pid", cred.Pid).Msg("attach: closed before hello (a liveness probe)")
		return
	}
	if err != nil {
		o.log.Warn().Err(err).Int32("pid", cred.Pid).Msg("attach: bad hello frame")
		return
	}
	var hello external.AttachHello
	if err := safeRead(&hello, body); err != nil {
		o.log.Warn().Err(err).Int32("pid", cred.Pid).Msg("attach: garbage hello")
		o.attachReject(conn, common.ErrorCode_INVALID_ARGUMENT, "cannot parse AttachHello: "+err.Error())
		return
	}
	if hello.ProtocolVersion != external.PROTOCOL_VERSION {
		o.attachReject(conn, common.ErrorCode_INVALID_ARGUMENT, "unsupported protocol version")
		return
	}
	if !o.credAllowed(cred) {
		o.log.Warn().Uint32("uid", cred.Uid).Int32("pid", cred.Pid).Msg("attach: caller not allowed")
		o.attachReject(conn, common.ErrorCode_INVALID_ARGUMENT, "caller not allowed to attach")
		return
	}
	c := &session{token: randomID(), name: hello.Name, cred: cred, conn: conn,
		holders: make(map[int64]*holding), puts: make(map[int64]*pendingPut)}
	o.mu.Lock()
	o.nextID++
	c.id = o.nextID
	o.sessions[c.id] = c
	o.mu.Unlock()
	reply := &external.AttachReply{
		Code: common.ErrorCode_OK, ProtocolVersion: external.PROTOCOL_VERSION,
		ClientId: c.id, SessionToken: c.token, OwnerGeneration: o.generation,
		SegmentSize: o.seg.Size(), RpcSocket: wire.RPCSocketPath(o.opts.SocketPath()), NodeId: o.opts.NodeID,
	}
	if err := shm.SendFrameWithFd(conn, thrift.FastMarshal(reply), o.seg.Fd()); err != nil {
		o.endSession(c, "attach reply failed: "+err.Error())
		return
	}
	conn.SetDeadline(time.Time{})
	o.log.Info().Int64("client", c.id).Str("name", hello.Name).Int32("pid", cred.Pid).Uint32("uid", cred.Uid).Msg("client attached")
	// The connection carries nothing more; any byte or EOF ends the session.
	var b [1]byte
	_, err = conn.Read(b[:])
	why := "client closed the attach connection"
	if err == nil {
		why = "unexpected bytes on the attach connection"
	}
	o.endSession(c, why)
}

func (o *Owner) attachReject(conn *net.UnixConn, code common.ErrorCode, msg string) {
	reply := &external.AttachReply{Code: code, Message: msg, ProtocolVersion: external.PROTOCOL_VERSION}
	shm.WriteFrame(conn, thrift.FastMarshal(reply))
}

// credAllowed: root, our own uid, members of the socket's group, or listed uids.
func (o *Owner) credAllowed(c shm.Cred) bool {
	if c.Uid == 0 || c.Uid == uint32(os.Getuid()) {
		return true
	}
	for _, u := range o.opts.AllowedUIDs {
		if u == c.Uid {
			return true
		}
	}
	if fi, err := os.Stat(o.opts.SocketPath()); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Gid == c.Gid {
			return true
		}
	}
	return false
}
