package transfer

import (
	"context"
	"errors"
)

// Fence names the source incarnation a pull expects and the transfer it belongs to.
type Fence struct {
	SourceNode       string
	SourceGeneration int64
	TransferID       int64 // the master's get id (or put id) the source range is retained for
	// Staged: the pull's offset is in the value the source is staging for TransferID
	// (a remote SSD refill, read from its SSD chunk by chunk), not in its segment; the
	// source answers once that chunk is read.
	Staged bool
}

// Source is the serving owner's side: it checks the fence and returns the bytes of its
// own mapping to send (no copy); release is called once they were written (or
// failed). An error wrapping ErrFenced answers FENCED (wrong node, generation or
// transfer, or a range outside what the transfer retains); any other error answers
// UNAVAILABLE. Its message goes to the puller (the first 256 bytes).
type Source interface {
	Open(f Fence, offset, length int64) (data []byte, release func(), err error)
}

// WaitingSource is a Source that can wait for a staged chunk (Fence.Staged) on the
// serving goroutine itself: while it waits it calls alive every WaitInterval (the
// server tells the puller so), and once alive fails it stops waiting and returns that
// error, lending nothing. alive is called only on the serving goroutine, before
// OpenWaiting returns; once it failed it keeps failing. A Source without it is waited
// for on a goroutine of its own.
type WaitingSource interface {
	Source
	OpenWaiting(f Fence, offset, length int64, alive func() error) (data []byte, release func(), err error)
}

// WaitInterval is how often a source waiting for a staged chunk says so to the puller.
const WaitInterval = waitInterval

// Puller pulls length bytes at offset of the source's segment into dst
// (len(dst) == length), reading from the socket straight into dst. The interface RDMA
// can implement later. dst is written only from the first byte of the source's data
// on: a refused pull leaves it untouched; a failed one may have written a prefix.
type Puller interface {
	Pull(ctx context.Context, addr string, f Fence, offset int64, dst []byte) error
}

// Errors a pull wraps (errors.Is); the message says what happened and with which peer.
var (
	// ErrFenced: the source refused the pull: it is another node or incarnation, or
	// no longer retains that transfer or range. Re-plan.
	ErrFenced = errors.New("transfer fenced by the source")
	// ErrUnreachable: the source could not be dialled or authenticated, the
	// connection broke or stalled past the progress deadline, or the source was
	// unavailable. Revoke with that reason and re-plan without the node.
	ErrUnreachable = errors.New("transfer source unreachable")
)
