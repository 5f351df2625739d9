package fluxkv

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

// rpcConn is one framed-thrift connection to the owner's RPC socket; one call at a time.
type rpcConn struct {
	c   *net.UnixConn
	r   *bufio.Reader
	out []byte
	in  []byte
	seq int32
}

func dialRPC(path string, timeout time.Duration) (*rpcConn, error) {
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return nil, err
	}
	return &rpcConn{c: c.(*net.UnixConn), r: bufio.NewReaderSize(c, 64<<10)}, nil
}

// call sends one CALL message and decodes the REPLY into result. A transport or
// framing error leaves the connection unusable (the caller closes it); an error that
// wraps errNotSent means no byte of the request left. drop, when set (tests), may
// discard a reply once it was read: the owner acted on the call, its answer is lost
// as if the connection broke before it arrived.
func (rc *rpcConn) call(method string, args, result thrift.FastCodec, timeout time.Duration, drop func(method string) bool) error {
	rc.seq++
	n := thrift.Binary.MessageBeginLength(method) + args.BLength()
	if 4+n > wire.MaxFrameBytes {
		return fmt.Errorf("%w: request frame of %d bytes exceeds the limit of %d", errNotSent, 4+n, wire.MaxFrameBytes)
	}
	if cap(rc.out) < 4+n {
		rc.out = make([]byte, 4+n)
	}
	out := rc.out[:4+n]
	binary.BigEndian.PutUint32(out, uint32(n))
	i := thrift.Binary.WriteMessageBegin(out[4:], method, thrift.CALL, rc.seq)
	args.FastWriteNocopy(out[4+i:], nil)
	if timeout > 0 {
		rc.c.SetDeadline(time.Now().Add(timeout))
	}
	if w, err := rc.c.Write(out); err != nil {
		if w == 0 {
			return fmt.Errorf("%w: %v", errNotSent, err)
		}
		return err
	}
	var hdr [4]byte
	if _, err := io.ReadFull(rc.r, hdr[:]); err != nil {
		return err
	}
	m := binary.BigEndian.Uint32(hdr[:])
	if m == 0 || int64(m)+4 > int64(wire.MaxFrameBytes) {
		return fmt.Errorf("reply frame of %d bytes", m)
	}
	if cap(rc.in) < int(m) {
		rc.in = make([]byte, m)
	}
	in := rc.in[:m]
	if _, err := io.ReadFull(rc.r, in); err != nil {
		return err
	}
	if drop != nil && drop(method) {
		return fmt.Errorf("reply of %s dropped (fault injected by a test)", method)
	}
	name, seq, err := thrift.UnmarshalFastMsg(in, result)
	if err != nil {
		return err
	}
	if name != method || seq != rc.seq {
		return fmt.Errorf("reply to %s#%d while waiting for %s#%d", name, seq, method, rc.seq)
	}
	return nil
}

func (rc *rpcConn) close() { rc.c.Close() }
