package transfer

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/metrics"
)

// replyReader reads the replies of one connection in order (pullOn: one, pipelineOn:
// a run of them). An OK reply's padding and data come in with one readv, which also
// takes in as much of the next reply's fixed header as has arrived behind them (never
// more: every reply starts with one, so nothing of the next reply's message or data is
// read ahead). A pipelined pull whose source streams ahead then costs one read
// syscall, not three (the header, its padding, the data), and fewer wake-ups.
type replyReader struct {
	c   *Client
	ctx context.Context // the pull's: once it ended, its forced deadline stays (setDeadline)
	tc  *net.TCPConn
	rc  syscall.RawConn
	// next holds the first have bytes of the next reply, read with the data before it.
	next [responseFixedLen]byte
	have int
	bufs [3][]byte                                // a readv's buffers
	rh   [responseFixedLen + maxMessageBytes]byte // the reply being read: its fixed header, its message
	// setAt is when the read deadline was last set (touch).
	setAt time.Time
}

// newReplyReader reads the replies on tc of pulls of ctx (whose end forces a past
// deadline on tc: pullOn, pipelineOn).
func (c *Client) newReplyReader(ctx context.Context, tc *net.TCPConn) (*replyReader, error) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &replyReader{c: c, ctx: ctx, tc: tc, rc: rc}, nil
}

// touch moves the read deadline to ProgressTimeout from now when it was set more than
// a quarter of that ago: data that streams in fails when no byte arrived for between
// 3/4 and 1 ProgressTimeout, and costs no deadline update per read.
func (rr *replyReader) touch(now time.Time) {
	if now.Sub(rr.setAt) > rr.c.opts.ProgressTimeout/4 {
		rr.setDeadline(now)
	}
}

// setDeadline moves the read deadline to ProgressTimeout from now, unless the pull's
// context ended: its cancellation forced a past deadline, which must not be moved (the
// context is checked after the move, as it may end in between).
func (rr *replyReader) setDeadline(now time.Time) {
	rr.setAt = now
	rr.tc.SetReadDeadline(now.Add(rr.c.opts.ProgressTimeout))
	if rr.ctx.Err() != nil {
		rr.tc.SetReadDeadline(time.Unix(1, 0))
	}
}

// inStep reports whether nothing was read ahead: once every request sent was
// answered, bytes read ahead came unasked and the connection is out of step.
func (rr *replyReader) inStep() bool { return rr.have == 0 }

// read reads the answer to the request of r and, for OK, its data straight from the
// socket into dst.
func (rr *replyReader) read(r pullRef, dst []byte) pullResult {
	c := rr.c
	rh := rr.rh[:]
	var status byte
	var length int64
	var msgLen int
	started := false
	for {
		n := copy(rh[:responseFixedLen], rr.next[:rr.have])
		rr.have = 0
		if n < responseFixedLen {
			// A wait for a header gets the whole ProgressTimeout: a staged pull's
			// source says statusWait every waitInterval while it reads the chunk, and
			// each one proves it alive, so the deadline starts again.
			rr.setDeadline(time.Now())
			if m, err := io.ReadFull(rr.tc, rh[n:responseFixedLen]); err != nil {
				return c.ioFail(r, "reading the reply", 0, started || n+m > 0, err)
			}
			rr.touch(time.Now()) // a header that came alone late leaves the rest a whole timeout
		}
		started = true
		var err error
		status, length, msgLen, err = parseResponseFixed(rh[:responseFixedLen])
		if err != nil {
			return pullResult{err: fmt.Errorf("%w: %s: %s", ErrUnreachable, r, err), kind: metrics.TransferErrBadRequest, started: true}
		}
		if status != statusWait || !r.f.Staged {
			break
		}
		if msgLen != 0 || length != 0 {
			return pullResult{err: fmt.Errorf("%w: %s: a WAIT status with %d bytes", ErrUnreachable, r, length+int64(msgLen)), kind: metrics.TransferErrBadRequest, started: true}
		}
	}
	msg := rh[responseFixedLen : responseFixedLen+msgLen] // %s prints it; an OK's padding is never copied
	if status == statusOK {
		if length != int64(len(dst)) {
			return pullResult{err: fmt.Errorf("%w: %s: the source announced %d bytes", ErrUnreachable, r, length), kind: metrics.TransferErrBadRequest, started: true}
		}
		if got, err := rr.readData(msg, dst); err != nil {
			return c.ioFail(r, "reading the data", got, true, err)
		}
		return pullResult{keep: true, started: true}
	}
	if _, err := io.ReadFull(rr.tc, msg); err != nil {
		return c.ioFail(r, "reading the reply", 0, true, err)
	}
	if length != 0 {
		// A refusal carries no data: bytes it announced would be read as the next
		// pull's reply. The stream is out of step.
		return pullResult{err: fmt.Errorf("%w: %s: a %s status announcing %d bytes: %s", ErrUnreachable, r, statusName(status), length, msg),
			kind: metrics.TransferErrBadRequest, started: true}
	}
	switch status {
	case statusFenced:
		return pullResult{err: fmt.Errorf("%w: %s: %s", ErrFenced, r, msg), kind: metrics.TransferErrFenced, keep: true, started: true}
	case statusUnavailable:
		return pullResult{err: fmt.Errorf("%w: %s: the source is unavailable: %s", ErrUnreachable, r, msg), kind: metrics.TransferErrUnavailable, keep: true, started: true}
	case statusBadRequest:
		return pullResult{err: fmt.Errorf("transfer: %s: the source refused a bad request: %s", r, msg), kind: metrics.TransferErrBadRequest, started: true}
	default:
		return pullResult{err: fmt.Errorf("%w: %s: unknown status %d: %s", ErrUnreachable, r, status, msg), kind: metrics.TransferErrBadRequest, started: true}
	}
}

// readData reads an OK reply's padding (pad) and data (dst) in full, at most
// maxReadChunk of dst per readv, the last readv also into next for whatever of the
// next reply's fixed header arrived with the data. got counts dst's bytes. The
// deadline moves with progress (touch).
func (rr *replyReader) readData(pad, dst []byte) (got int, err error) {
	padGot := 0
	for padGot < len(pad) || got < len(dst) {
		k := 0
		if padGot < len(pad) {
			rr.bufs[k] = pad[padGot:]
			k++
		}
		end := min(got+maxReadChunk, len(dst))
		rr.bufs[k] = dst[got:end]
		k++
		if end == len(dst) {
			rr.bufs[k] = rr.next[:]
			k++
		}
		n, err := rr.readv(k)
		if err != nil {
			return got, err
		}
		m := min(n, len(pad)-padGot)
		padGot, n = padGot+m, n-m
		m = min(n, len(dst)-got)
		got, n = got+m, n-m
		rr.have = n
		rr.touch(time.Now())
	}
	return got, nil
}

// readv reads into the first k of rr.bufs, waiting (within the read deadline) until
// some bytes arrived; 0 bytes is the end of the stream. unix.Readv tells the race
// detector which bytes it wrote.
func (rr *replyReader) readv(k int) (int, error) {
	var n int
	var errno error
	err := rr.rc.Read(func(fd uintptr) bool {
		for {
			n, errno = unix.Readv(int(fd), rr.bufs[:k])
			if errno != unix.EINTR {
				return errno != unix.EAGAIN
			}
		}
	})
	switch {
	case err != nil:
		return 0, err
	case errno != nil:
		return 0, os.NewSyscallError("readv", errno)
	case n == 0:
		return 0, io.ErrUnexpectedEOF
	}
	return n, nil
}
