package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

// MaxFrame is the largest frame body the attach protocol sends, and the limit ReadFrame
// and RecvFrameWithFd apply when given max <= 0: wire.MaxAttachFrameBytes (the IDL's
// MAX_ATTACH_FRAME_BYTES) less the length prefix.
const MaxFrame = wire.MaxAttachFrameBytes - frameHeader

// frameHeader is the size of the big-endian uint32 length prefix.
const frameHeader = 4

// ErrFrameTooLarge means a frame's length prefix exceeds the reader's limit (or a body
// passed to a writer exceeds MaxFrame). The stream cannot be resynchronised after it:
// drop the connection.
var ErrFrameTooLarge = errors.New("shm: frame too large")

// WriteFrame writes body behind a 4-byte big-endian length prefix, in one Write.
// body may be empty; it must not exceed MaxFrame.
func WriteFrame(w io.Writer, body []byte) error {
	buf, err := encodeFrame(body)
	if err != nil {
		return err
	}
	n, err := w.Write(buf)
	if err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	if n != len(buf) {
		return fmt.Errorf("write frame: %w", io.ErrShortWrite)
	}
	return nil
}

// ReadFrame reads one frame and returns its body. max bounds the body length (max <= 0
// means MaxFrame); an empty body is valid. A clean end of stream before the frame gives
// io.EOF itself; a stream that ends inside a frame gives an error wrapping
// io.ErrUnexpectedEOF; a length over max gives an error wrapping ErrFrameTooLarge, read
// before any body byte is allocated or consumed.
func ReadFrame(r io.Reader, max int) ([]byte, error) {
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("read frame header: %w", err)
	}
	return readBody(r, hdr, max)
}

// SendFrameWithFd sends one frame (length prefix and body) carrying fd, in one sendmsg:
// the fd arrives with the frame's first bytes.
func SendFrameWithFd(conn *net.UnixConn, body []byte, fd int) error {
	return SendFrameWithFds(conn, body, fd)
}

// SendFrameWithFds is SendFrameWithFd for several fds (the attach reply of an isolating
// owner carries the segment and the session's put area), received in this order.
func SendFrameWithFds(conn *net.UnixConn, body []byte, fds ...int) error {
	buf, err := encodeFrame(body)
	if err != nil {
		return err
	}
	if err := SendFds(conn, buf, fds...); err != nil {
		return fmt.Errorf("send frame: %w", err)
	}
	return nil
}

// RecvFrameWithFd reads one frame and the fd that came with its first bytes. fd is -1
// when the frame carried none (the caller decides whether that is an error); fds beyond
// the first are closed. Otherwise as RecvFrameWithFds.
func RecvFrameWithFd(conn *net.UnixConn, max int) (body []byte, fd int, err error) {
	body, fds, err := RecvFrameWithFds(conn, max)
	if len(fds) == 0 {
		return body, -1, err
	}
	closeAll(fds[1:])
	return body, fds[0], err
}

// RecvFrameWithFds reads one frame and the fds that came with its first bytes (nil when
// none did; the caller owns them). It never reads past the frame: the first recvmsg asks
// for the prefix only, a short first read is completed with plain reads, and the body is
// read exactly. On error the received fds are closed and fds is nil. Errors are those of
// ReadFrame.
func RecvFrameWithFds(conn *net.UnixConn, max int) (body []byte, fds []int, err error) {
	var hdr [frameHeader]byte
	n, fds, err := RecvFds(conn, hdr[:])
	if err != nil {
		if err == io.EOF {
			return nil, nil, io.EOF
		}
		return nil, nil, fmt.Errorf("recv frame header: %w", err)
	}
	if n < frameHeader {
		if _, err := io.ReadFull(conn, hdr[n:]); err != nil {
			closeAll(fds)
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, nil, fmt.Errorf("recv frame header: %w", err)
		}
	}
	body, err = readBody(conn, hdr, max)
	if err != nil {
		closeAll(fds)
		return nil, nil, err
	}
	return body, fds, nil
}

func readBody(r io.Reader, hdr [frameHeader]byte, max int) ([]byte, error) {
	if max <= 0 {
		max = MaxFrame
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if uint64(size) > uint64(max) {
		return nil, fmt.Errorf("%w: length prefix says %d bytes, limit %d", ErrFrameTooLarge, size, max)
	}
	body, err := wire.ReadFrameBody(r, nil, int(size))
	if err != nil {
		return nil, err
	}
	return body, nil
}

func encodeFrame(body []byte) ([]byte, error) {
	if len(body) > MaxFrame {
		return nil, fmt.Errorf("%w: body is %d bytes, limit %d", ErrFrameTooLarge, len(body), MaxFrame)
	}
	buf := make([]byte, frameHeader+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[frameHeader:], body)
	return buf, nil
}
