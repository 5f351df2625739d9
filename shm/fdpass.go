package shm

import (
	"errors"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"
)

// maxRecvFds is how many fds one RecvFd (RecvFds) makes room for. RecvFd keeps only the
// first; the room for the rest lets us close what a confused or hostile peer sends
// instead of having the kernel truncate the control message.
const maxRecvFds = 16

// ErrControlTruncated means a received message carried more ancillary data than RecvFd
// makes room for; everything that did arrive was closed. The stream is still aligned
// but the message's fds are lost: treat it as a protocol error and drop the connection.
var ErrControlTruncated = errors.New("shm: control message truncated")

// SendFd sends payload and fd in one sendmsg (SCM_RIGHTS). The peer receives a
// duplicate of fd; the caller keeps its own. payload must not be empty: on a stream
// socket the fd rides with the payload's first byte. If the kernel takes only part of
// the payload (a large payload on a full socket), the rest is written with plain writes;
// the fd has already gone with the first part.
func SendFd(conn *net.UnixConn, payload []byte, fd int) error {
	return SendFds(conn, payload, fd)
}

// SendFds is SendFd for several fds (at most maxRecvFds), all in one SCM_RIGHTS message
// and received in this order.
func SendFds(conn *net.UnixConn, payload []byte, fds ...int) error {
	if len(payload) == 0 {
		return errors.New("send fd: payload must not be empty")
	}
	if len(fds) == 0 || len(fds) > maxRecvFds {
		return fmt.Errorf("send fd: %d fds, want 1 to %d", len(fds), maxRecvFds)
	}
	for _, fd := range fds {
		if fd < 0 {
			return fmt.Errorf("send fd: invalid fd %d", fd)
		}
	}
	n, _, err := conn.WriteMsgUnix(payload, unix.UnixRights(fds...), nil)
	if err != nil {
		return fmt.Errorf("send fd: sendmsg: %w", err)
	}
	if n < len(payload) {
		if _, err := conn.Write(payload[n:]); err != nil {
			return fmt.Errorf("send fd: write %d remaining bytes: %w", len(payload)-n, err)
		}
	}
	return nil
}

// RecvFd reads with one recvmsg into buf and returns the bytes read and the fd that came
// with them, or -1 when none did. Received fds are close-on-exec (MSG_CMSG_CLOEXEC);
// when several arrive, all but the first are closed. At end of stream it returns
// 0, -1, io.EOF. When err is not nil, fd is -1 and any received fds are closed; n still
// counts the bytes consumed from the socket. The read honours conn's read deadline.
func RecvFd(conn *net.UnixConn, buf []byte) (n int, fd int, err error) {
	n, fds, err := RecvFds(conn, buf)
	if len(fds) == 0 {
		return n, -1, err
	}
	closeAll(fds[1:])
	return n, fds[0], err
}

// RecvFds is RecvFd keeping every fd that came (up to maxRecvFds, in the order sent;
// nil when none did). The caller owns them.
func RecvFds(conn *net.UnixConn, buf []byte) (n int, fds []int, err error) {
	if len(buf) == 0 {
		return 0, nil, errors.New("recv fd: empty buffer")
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, nil, fmt.Errorf("recv fd: %w", err)
	}
	oob := make([]byte, unix.CmsgSpace(maxRecvFds*4))
	var oobn, flags int
	var rerr error
	err = rc.Read(func(s uintptr) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(s), buf, oob, unix.MSG_CMSG_CLOEXEC)
			if rerr != unix.EINTR {
				break
			}
		}
		return rerr != unix.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, nil, fmt.Errorf("recv fd: recvmsg: %w", err)
	}
	fds, perr := parseRights(oob[:oobn])
	if perr == nil && flags&unix.MSG_CTRUNC != 0 {
		perr = ErrControlTruncated
	}
	if perr != nil {
		closeAll(fds)
		return n, nil, fmt.Errorf("recv fd: %w", perr)
	}
	if n == 0 && len(fds) == 0 && isStream(rc) {
		return 0, nil, io.EOF
	}
	return n, fds, nil
}

// parseRights returns every fd carried by SCM_RIGHTS messages in oob. On a parse error
// it still returns the fds it found so the caller can close them.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			return fds, fmt.Errorf("parse SCM_RIGHTS: %w", err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// isStream reports whether the socket is SOCK_STREAM, where a zero-byte read means end
// of stream (a datagram or seqpacket socket can carry an empty message).
func isStream(rc interface {
	Control(func(uintptr)) error
}) bool {
	typ := unix.SOCK_STREAM
	_ = rc.Control(func(s uintptr) {
		if t, err := unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_TYPE); err == nil {
			typ = t
		}
	})
	return typ == unix.SOCK_STREAM
}
