package transfer

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Pipelined pulls: a get batch brings many values from one owner at once. Each pull
// on its own costs a round trip and a wake-up of both owners per value; PullMany
// writes the requests of a run of values ahead on one connection and reads their
// answers in order, so the source streams one value after the other. The wire is
// version 1's: a server reads a request, answers it, reads the next.

// PullItem is one value of a PullMany: Len(Dst) bytes at Offset of the source's
// segment, retained there for Fence; or, for a staged fence, of the value the source
// stages for it (the source answers each in order once its chunk is read).
type PullItem struct {
	Fence  Fence
	Offset int64
	Dst    []byte
}

// pipelineDepth bounds the requests a connection has unanswered: the next half is
// written once half of them are answered. Their headers (at most 296 bytes each) fit
// a socket's send buffer, so writing them never waits for the server to read.
const pipelineDepth = 32

// pipelineRunBytes is the least a PullMany gives one connection: a batch of more is
// split into runs of at least this many bytes (in item order), at most
// MaxPullsPerPeer of them, each on a connection of its own.
const pipelineRunBytes = 8 << 20

// PullMany pulls every item from the source at addr and returns each one's outcome
// (errs[i] nil: items[i].Dst holds the bytes), wrapping ErrFenced or ErrUnreachable
// as Pull's do. One refused item fails alone; a connection that breaks fails the
// items it had not delivered. Each run of items holds one of the peer's
// MaxPullsPerPeer slots for its duration (a run of staged pulls only does not, as a
// staged Pull does not), and runs go concurrently. Staged items go on one run, in
// order, whatever their bytes.
func (c *Client) PullMany(ctx context.Context, addr string, items []PullItem) []error {
	errs := make([]error, len(items))
	for i, it := range items {
		switch {
		case len(it.Dst) == 0 || it.Offset < 0:
			errs[i] = fmt.Errorf("transfer: pull of %d bytes at offset %d from %s: want at least one byte at a non-negative offset", len(it.Dst), it.Offset, addr)
		default:
			if err := wire.ValidateNodeID(it.Fence.SourceNode); err != nil {
				errs[i] = fmt.Errorf("transfer: pull from %s: %w", addr, err)
			}
		}
	}
	// Staged pulls stay on one pipeline, in order: the source reads their chunks in
	// list order and a staged pull waits a bounded time for its chunk, so a run started
	// further down the list would wait for every chunk before it (refillGroup). Memory
	// pulls are split into runs across connections.
	var plain, staged []int
	var total int64
	for i, err := range errs {
		switch {
		case err != nil:
		case items[i].Fence.Staged:
			staged = append(staged, i)
		default:
			plain = append(plain, i)
			total += int64(len(items[i].Dst))
		}
	}
	runs := splitRuns(items, plain, total, c.opts.MaxPullsPerPeer)
	if len(staged) > 0 {
		runs = append(runs, staged)
	}
	if len(runs) == 0 {
		return errs // every item refused
	}
	done := make(chan struct{}, len(runs))
	for _, run := range runs[1:] {
		go func() {
			c.pullRun(ctx, addr, items, run, errs)
			done <- struct{}{}
		}()
	}
	c.pullRun(ctx, addr, items, runs[0], errs)
	for range len(runs) - 1 {
		<-done
	}
	return errs
}

// splitRuns splits the indexes idx of items into at most maxRuns runs in order, each of
// at least pipelineRunBytes (but the last), of about equal bytes.
func splitRuns(items []PullItem, idx []int, total int64, maxRuns int) [][]int {
	if len(idx) == 0 {
		return nil
	}
	n := int(min(int64(maxRuns), max(1, total/pipelineRunBytes)))
	per := (total + int64(n) - 1) / int64(n)
	var runs [][]int
	start, bytes := 0, int64(0)
	for k, i := range idx {
		bytes += int64(len(items[i].Dst))
		if bytes >= per && len(runs) < n-1 {
			runs = append(runs, idx[start:k+1])
			start, bytes = k+1, 0
		}
	}
	if start < len(idx) {
		runs = append(runs, idx[start:])
	}
	return runs
}

// pullRun pulls the items run names over one connection, pipelined, setting their
// errs. A pooled connection the server had closed fails before any reply byte: the
// run is tried once more on a fresh one.
func (c *Client) pullRun(ctx context.Context, addr string, items []PullItem, run []int, errs []error) {
	var g *gate
	var err error
	if !allStaged(items, run) {
		var kind string
		if g, kind, err = c.enter(ctx, addr, items[run[0]].Fence); err != nil {
			for k, i := range run {
				errs[i] = err
				if k > 0 && kind != "" { // enter counted the first: one error an item, as failRun
					c.tm.Error(metrics.TransferPull, kind)
				}
			}
			return
		}
	}
	var kind string
	defer func() {
		if g != nil {
			c.leave(addr, g, kind, err)
		}
	}()
	ctx, cancel := budgeted(ctx)
	defer cancel()
	for attempt := 0; ; attempt++ {
		if err = ctx.Err(); err != nil {
			kind, err = metrics.TransferErrCanceled, fmt.Errorf("pull from %s (node %q): %w", addr, items[run[0]].Fence.SourceNode, err)
			c.failRun(run, errs, kind, err)
			return
		}
		var tc *net.TCPConn
		var reused bool
		tc, reused, err = c.get(ctx, addr)
		if err != nil {
			kind = metrics.TransferErrUnreachable
			if ctx.Err() != nil {
				kind = metrics.TransferErrCanceled
			}
			c.warn.Warn().Str("peer", addr).Err(err).Msg("data-plane dial failed")
			c.failRun(run, errs, kind, err)
			return
		}
		res, answered := c.pipelineOn(ctx, tc, addr, items, run, errs)
		if res.keep {
			c.put(addr, tc)
		} else {
			c.discard(tc)
		}
		if res.err == nil {
			return
		}
		if reused && answered == 0 && !res.started && !res.timeout && ctx.Err() == nil && attempt == 0 {
			continue
		}
		kind, err = res.kind, res.err
		c.warn.Warn().Str("peer", addr).Err(res.err).Int("items", len(run)-answered).Msg("pipelined pull failed")
		c.failRun(run[answered:], errs, kind, err)
		return
	}
}

// allStaged reports whether every item run names is a staged pull.
func allStaged(items []PullItem, run []int) bool {
	for _, i := range run {
		if !items[i].Fence.Staged {
			return false
		}
	}
	return true
}

// failRun fails the items run names with err (of metrics kind kind).
func (c *Client) failRun(run []int, errs []error, kind string, err error) {
	for _, i := range run {
		errs[i] = err
		c.tm.Error(metrics.TransferPull, kind)
	}
}

// pipelineOn pulls the items run names on tc: requests up to pipelineDepth ahead,
// answers in order. answered counts the items whose outcome is in errs (a refused
// one among them: FENCED and UNAVAILABLE leave the connection in step); res.err is
// the connection's failure, which stops the run at item answered.
func (c *Client) pipelineOn(ctx context.Context, tc *net.TCPConn, addr string, items []PullItem, run []int, errs []error) (res pullResult, answered int) {
	first := items[run[0]].Fence
	stop := context.AfterFunc(ctx, func() { tc.SetDeadline(time.Unix(1, 0)) })
	defer func() { res = cancelled(stop, ctx, addr, first, res) }()
	rr, err := c.newReplyReader(ctx, tc)
	if err != nil {
		it := items[run[0]]
		return c.ioFail(pullRef{addr, it.Fence, it.Offset, len(it.Dst)}, "sending the requests", 0, false, err), 0
	}
	buf := make([]byte, 0, (pipelineDepth/2+1)*maxRequestLen)
	sent := 0
	send := func(upTo int) pullResult {
		buf = buf[:0]
		for ; sent < upTo; sent++ {
			it := items[run[sent]]
			op := byte(opPull)
			if it.Fence.Staged {
				op = opPullStaged
			}
			buf = appendRequest(buf, request{op: op, fence: it.Fence, offset: it.Offset, length: int64(len(it.Dst))})
		}
		tc.SetWriteDeadline(time.Now().Add(c.opts.ProgressTimeout))
		if _, err := tc.Write(buf); err != nil {
			it := items[run[answered]]
			return c.ioFail(pullRef{addr, it.Fence, it.Offset, len(it.Dst)}, "sending the requests", 0, answered > 0, err)
		}
		return pullResult{}
	}
	if r := send(min(len(run), pipelineDepth)); r.err != nil {
		return r, 0
	}
	for answered < len(run) {
		if sent < len(run) && sent-answered <= pipelineDepth/2 {
			if r := send(min(len(run), answered+pipelineDepth)); r.err != nil {
				return r, answered
			}
		}
		it := items[run[answered]]
		r := rr.read(pullRef{addr, it.Fence, it.Offset, len(it.Dst)}, it.Dst)
		if r.err != nil && !r.keep {
			r.started = r.started || answered > 0
			return r, answered
		}
		if errs[run[answered]] = r.err; r.err == nil {
			c.tm.Bytes(metrics.TransferPull, int64(len(it.Dst)))
		} else {
			c.tm.Error(metrics.TransferPull, r.kind)
		}
		answered++
	}
	return pullResult{keep: rr.inStep(), started: true}, answered
}
