package fluxkv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// rpcConn is one framed-thrift connection to the owner's RPC socket; one call at a time.
//
// It is a blocking socket driven by plain sendmsg and read system calls, outside Go's
// network poller: a call is one write and, for a reply that fits the buffer, one read,
// which sleeps in the kernel until the owner answers. Through the poller the same reply
// costs a failed read, an epoll_wait and two goroutine switches more (the Unix-socket
// echo the get benchmark compares with pays them too). The price is one OS thread per
// call in flight, which Go's runtime adds and parks as it does for any blocking system
// call. SO_RCVTIMEO (set once, to the call timeout, and lowered for a read that must end
// sooner) bounds each read; a send never blocks in sendmsg but waits for room in poll,
// within the call's deadline; the call's deadline bounds the whole.
type rpcConn struct {
	fd      int
	timeout time.Duration // SO_RCVTIMEO / SO_SNDTIMEO as set at dial; 0: none
	short   bool          // a call lowered them to fit its deadline: restore before the next
	in      []byte        // the last reply frame, 4-byte length included
	out     []byte
	seq     int32
	// The Session of the call being sent and its releases (Client.session), reused.
	sess external.Session
	rel  []int64
	// carrying is closed when the call carrying rel ended (Client.carried); nil when rel
	// is empty.
	carrying chan struct{}
}

// rpcReadBuffer is the read buffer of a connection: a get's reply is under 100 bytes, a
// full BatchExists reply about 50 KiB; larger replies grow it for the call.
const rpcReadBuffer = 64 << 10

func dialRPC(path string, timeout time.Duration) (*rpcConn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	rc := &rpcConn{fd: fd}
	if err := rc.setTimeouts(timeout); err != nil {
		unix.Close(fd)
		return nil, err
	}
	rc.timeout = max(timeout, 0)
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("connect", err)
	}
	return rc, nil
}

// setTimeouts sets SO_RCVTIMEO and SO_SNDTIMEO to d (0: block without limit).
func (rc *rpcConn) setTimeouts(d time.Duration) error {
	d = max(d, 0)
	tv := unix.NsecToTimeval(d.Nanoseconds())
	if d > 0 && tv.Sec == 0 && tv.Usec == 0 {
		tv.Usec = 1 // under a microsecond: the smallest, not "no timeout"
	}
	for _, opt := range []int{unix.SO_RCVTIMEO, unix.SO_SNDTIMEO} {
		if err := unix.SetsockoptTimeval(rc.fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return os.NewSyscallError("setsockopt", err)
		}
	}
	return nil
}

// errCallTimeout: the call's deadline passed before its reply was complete.
var errCallTimeout = fmt.Errorf("call timed out: %w", os.ErrDeadlineExceeded)

// fit lowers the socket timeouts to what is left before deadline when that is less than
// they are (a slow reply in many pieces must not outlast the call's timeout).
func (rc *rpcConn) fit(deadline time.Time) error {
	if deadline.IsZero() {
		return nil
	}
	left := time.Until(deadline)
	if left <= 0 {
		return errCallTimeout
	}
	if left < rc.timeout {
		rc.short = true
		return rc.setTimeouts(left)
	}
	return nil
}

// write sends b whole, by the call's deadline (zero: within the connection's timeout
// per wait for room). sent is how many bytes left (a failure after any byte was sent
// means the owner may have read the request). It never blocks in sendmsg: a blocking
// send gets the whole SO_SNDTIMEO afresh for each buffer it waits for, so an owner
// draining a large request slowly held the call long past its deadline; it waits for
// room in poll, bounded by what is left.
func (rc *rpcConn) write(b []byte, deadline time.Time) (sent int, err error) {
	for sent < len(b) {
		n, err := unix.SendmsgN(rc.fd, b[sent:], nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT) // a closed peer: EPIPE, no SIGPIPE
		if n > 0 {
			sent += n
		}
		switch {
		case err == unix.EINTR:
		case err == unix.EAGAIN:
			if err := rc.waitRoom(deadline); err != nil {
				return sent, err
			}
		case err != nil:
			return sent, os.NewSyscallError("sendmsg", err)
		}
	}
	return sent, nil
}

// waitRoom waits until the socket can take more of a request: until deadline, or for
// the connection's timeout when there is none (0: without limit).
func (rc *rpcConn) waitRoom(deadline time.Time) error {
	wait := rc.timeout
	if !deadline.IsZero() {
		wait = time.Until(deadline)
		if wait <= 0 {
			return errCallTimeout
		}
	}
	ms := -1
	if wait > 0 {
		ms = int(max(1, (wait+time.Millisecond-1)/time.Millisecond))
	}
	fds := []unix.PollFd{{Fd: int32(rc.fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(fds, ms)
		switch {
		case err == unix.EINTR:
			continue // (the wait starts over: a signal storm could stretch it, nothing else)
		case err != nil:
			return os.NewSyscallError("poll", err)
		case n == 0:
			return errCallTimeout
		}
		return nil // writable, or an error the next sendmsg reports
	}
}

// readReply reads one reply frame into rc.in and returns its body.
func (rc *rpcConn) readReply(deadline time.Time) ([]byte, error) {
	if cap(rc.in) < rpcReadBuffer {
		rc.in = make([]byte, rpcReadBuffer)
	}
	buf := rc.in[:cap(rc.in)]
	got, want := 0, 4
	for got < want {
		// Fitted before a read that follows a slow send, or a part of the reply: the
		// read gets what is left of the deadline, not SO_RCVTIMEO's whole (a call whose
		// send took most of its timeout waited that long again for its reply). A quick
		// send leaves the first read as it is: one setsockopt less per call.
		if got > 0 || !deadline.IsZero() && time.Until(deadline) < rc.timeout-time.Millisecond {
			if err := rc.fit(deadline); err != nil {
				return nil, err
			}
		}
		n, err := unix.Read(rc.fd, buf[got:])
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return nil, errCallTimeout
		case err != nil:
			return nil, os.NewSyscallError("read", err)
		case n == 0:
			if got == 0 {
				return nil, fmt.Errorf("connection closed by the owner: %w", errEOF)
			}
			return nil, fmt.Errorf("connection closed by the owner after %d bytes of a reply: %w", got, errEOF)
		}
		got += n
		if want == 4 && got >= 4 {
			m := binary.BigEndian.Uint32(buf)
			if m == 0 || int64(m)+4 > int64(wire.MaxFrameBytes) {
				return nil, fmt.Errorf("reply frame of %d bytes", m)
			}
			want = 4 + int(m)
			if want > len(buf) {
				grown := make([]byte, want)
				copy(grown, buf[:got])
				buf = grown
			}
		}
	}
	if got > want {
		return nil, fmt.Errorf("%d bytes after the reply frame", got-want)
	}
	if cap(buf) <= wire.MaxFrameBytes/8 {
		rc.in = buf // keep a grown buffer unless it is very large
	}
	return buf[4:want], nil
}

// errEOF marks a connection the owner closed.
var errEOF = errors.New("EOF")

// call sends one CALL message and decodes the REPLY into result. A transport or
// framing error leaves the connection unusable (the caller closes it); an error that
// wraps errNotSent means no byte of the request left (ErrInvalidArgument: a request
// larger than a frame, never sent). drop, when set (tests), may
// lose a reply as a call that timed out loses it: once the reply has arrived, the call
// fails without reading it (the caller closes the connection with the reply unread).
func (rc *rpcConn) call(method string, args, result thrift.FastCodec, timeout time.Duration, drop func(method string) bool) error {
	rc.seq++
	n := thrift.Binary.MessageBeginLength(method) + args.BLength()
	if 4+n > wire.MaxFrameBytes {
		return fmt.Errorf("%w: request frame of %d bytes exceeds the limit of %d", ErrInvalidArgument, 4+n, wire.MaxFrameBytes)
	}
	if cap(rc.out) < 4+n {
		rc.out = make([]byte, 4+n)
	}
	out := rc.out[:4+n]
	binary.BigEndian.PutUint32(out, uint32(n))
	i := thrift.Binary.WriteMessageBegin(out[4:], method, thrift.CALL, rc.seq)
	args.FastWriteNocopy(out[4+i:], nil)
	if cap(rc.out) > wire.MaxFrameBytes/8 {
		rc.out = nil // do not keep a very large request's buffer
	}
	if rc.short {
		if err := rc.setTimeouts(rc.timeout); err != nil {
			return fmt.Errorf("%w: %v", errNotSent, err)
		}
		rc.short = false
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	if w, err := rc.write(out, deadline); err != nil {
		if w == 0 {
			return fmt.Errorf("%w: %v", errNotSent, err)
		}
		return err
	}
	if drop != nil && drop(method) {
		fds := []unix.PollFd{{Fd: int32(rc.fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, 10_000); err != unix.EINTR {
				break
			}
		}
		return fmt.Errorf("reply of %s dropped (fault injected by a test)", method)
	}
	in, err := rc.readReply(deadline)
	if err != nil {
		return err
	}
	return decodeReply(in, method, rc.seq, result)
}

// decodeReply reads a REPLY (or EXCEPTION) message to method#seq into result, as
// thrift.UnmarshalFastMsg does, without allocating the method name.
func decodeReply(in []byte, method string, seq int32, result thrift.FastCodec) error {
	name, typ, got, off, ok := strictMessageBegin(in)
	if !ok { // not the strict form every fluxkv owner writes: the general decoder
		s, t, q, l, err := thrift.Binary.ReadMessageBegin(in)
		if err != nil {
			return err
		}
		name, typ, got, off = []byte(s), t, q, l
	}
	body := in[off:]
	if typ == thrift.EXCEPTION { // whatever it names: the owner refused the frame itself
		ex := thrift.NewApplicationException(thrift.UNKNOWN_APPLICATION_EXCEPTION, "")
		if _, err := ex.FastRead(body); err != nil {
			return err
		}
		return ex
	}
	if string(name) != method || got != seq {
		return fmt.Errorf("reply to %s#%d while waiting for %s#%d", name, got, method, seq)
	}
	if typ != thrift.REPLY {
		return fmt.Errorf("reply to %s#%d of message type %d", method, seq, typ)
	}
	_, err := result.FastRead(body)
	return err
}

// strictMessageBegin parses a strict TBinaryProtocol message header; ok is false when
// in does not start with one.
func strictMessageBegin(in []byte) (name []byte, typ thrift.TMessageType, seq int32, off int, ok bool) {
	if len(in) < 8 {
		return nil, 0, 0, 0, false
	}
	v := binary.BigEndian.Uint32(in)
	if v&0xffff0000 != 0x80010000 {
		return nil, 0, 0, 0, false
	}
	l := int(binary.BigEndian.Uint32(in[4:]))
	if l < 0 || len(in) < 8+l+4 {
		return nil, 0, 0, 0, false
	}
	return in[8 : 8+l], thrift.TMessageType(v & 0xff), int32(binary.BigEndian.Uint32(in[8+l:])), 8 + l + 4, true
}

func (rc *rpcConn) close() { unix.Close(rc.fd) }
