package fluxkv

import (
	"errors"
	"fmt"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// PutOptions tune a put.
type PutOptions struct {
	// RejectIfExists fails the put with ErrAlreadyExists when the key has a value.
	RejectIfExists bool
	// Parent makes the value a KV page of a prefix chain: it points to the key of the
	// page before it, or to "" for a chain's first page; nil (the default) puts a plain
	// key. Eviction keeps a chain's pages while the pages before them are cached,
	// evicting from the deep end first, and evicts first a page whose parent is gone. A
	// parent that is not a valid key, or is the key itself, fails the put with
	// ErrInvalidArgument. BatchPut reads each item's PutItem.Parent instead.
	Parent *string
}

// putEndTries bounds the PutEnd (BatchPutEnd) sends of one put on one session.
const putEndTries = 3

// errOutcomeUnknown: the session that started a put ended (or the owner forgot the put)
// before the answer to its PutEnd came back, so whether the value was published is unknown.
var errOutcomeUnknown = errors.New("the put's outcome is unknown")

// errNotWritten: the session that started a put ended (re-attached by another goroutine,
// or gone while a PutWrite of a streamed value was out) before the put was ended: the
// owner revoked it with the session, or the client aborted it, and nothing was
// published. It is redone once, RejectIfExists or not (a put of an item whose
// PutWrite failed otherwise, an answer, is not).
var errNotWritten = errors.New("the put was not ended: its session ended before the value was written")

// Put stores value under key: one copy, into the shared segment (under client
// isolation into the session's put area, which the owner copies from).
func (c *Client) Put(key string, value []byte) error {
	_, err := c.put(&PutItem{Key: key, Value: value}, PutOptions{})
	return err
}

// PutWith reserves n bytes for key, lets fill write them straight into the shared
// segment, then publishes the value. If fill fails the put is aborted. Under client
// isolation fill writes into the session's put area instead (into a scratch buffer of
// n bytes when n exceeds the area: the value is then streamed), and must not put
// through the same client (the area is held while fill runs).
func (c *Client) PutWith(key string, n int64, opts PutOptions, fill func(dst []byte) error) error {
	_, err := c.PutWithID(key, n, opts, func(_ int64, dst []byte) error { return fill(dst) })
	return err
}

// PutWithID is PutWith whose fill also learns the put_id the value will have (the
// version a later Get reports in MemHolder.PutID), so values can be derived from
// (key, put_id). It returns that put_id. fill may run twice: when the outcome became
// unknown (the session ended before the PutEnd answer arrived, the owner restarted; or
// PutEnd went unanswered three times) and RejectIfExists is not set, the whole put is
// redone on the new session, with a new put_id; with RejectIfExists the put fails with
// ErrUnavailable saying its outcome is unknown. A put whose session ended before it was
// ended (another goroutine re-attached first; a streamed value's PutWrite found the
// session gone) published nothing and is redone either way.
func (c *Client) PutWithID(key string, n int64, opts PutOptions, fill func(putID int64, dst []byte) error) (int64, error) {
	return c.put(&PutItem{Key: key, Len: n, Fill: fill, Parent: opts.Parent}, opts)
}

// put runs one put by the retry rules (see PutWithID).
func (c *Client) put(it *PutItem, opts PutOptions) (int64, error) {
	if err := wire.ValidateKey(it.Key); err != nil {
		return 0, err
	}
	if err := wire.ValidateLen(it.size(), c.SegmentSize()); err != nil {
		return 0, err
	}
	for redo := 0; ; redo++ {
		id, err := c.putOnce(it, opts)
		if !errors.Is(err, errOutcomeUnknown) && !errors.Is(err, errNotWritten) {
			return id, err
		}
		if redo > 0 || (opts.RejectIfExists && !errors.Is(err, errNotWritten)) {
			return 0, fmt.Errorf("%w: put %q (put_id %d): %v", ErrUnavailable, it.Key, id, err)
		}
		c.stats.putRedos.Add(1)
	}
}

// putOnce runs PutStart, the write and PutEnd on one session.
func (c *Client) putOnce(it *PutItem, opts PutOptions) (int64, error) {
	key, n := it.Key, it.size()
	start, a, err := invoke(c, call{method: "PutStart", retry: retryUnsent, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServicePutStartArgs{Req: &external.PutStartRequest{
			Session: s, Key: key, Len: n, Opts: &external.PutOptions{RejectIfExists: opts.RejectIfExists}, Parent: it.Parent}}
	}}, &external.ExternalServicePutStartResult{})
	if err != nil {
		return 0, err
	}
	if !inSegment(start.Offset, n, a.reply.SegmentSize) {
		c.abort(a, []*external.PutEndItem{{Key: key, PutId: start.PutId}})
		return 0, fmt.Errorf("%w: owner returned offset %d outside the segment", ErrUnavailable, start.Offset)
	}
	if !c.useLive(a) { // a re-attach retired a meanwhile (its session, and the put, are gone), or Close ran
		if c.isClosed() {
			return start.PutId, ErrClosed
		}
		return start.PutId, errNotWritten
	}
	defer c.unuse(a)
	var copies []*external.AreaCopy
	if a.area != nil {
		a.areaMu.Lock()
		defer a.areaMu.Unlock()
		if err := settleArea(a); err != nil {
			c.abort(a, []*external.PutEndItem{{Key: key, PutId: start.PutId}})
			return 0, err
		}
		var cp *external.AreaCopy
		if a.areaFits(0, n) {
			cp, err = stage(a, it, start.PutId, 0)
		} else {
			cp, err = c.stream(a, it, start.PutId, true)
		}
		copies = []*external.AreaCopy{cp}
	} else {
		err = it.fill(start.PutId, a.rw.Bytes()[start.Offset:start.Offset+n:start.Offset+n])
	}
	if err != nil {
		c.abort(a, []*external.PutEndItem{{Key: key, PutId: start.PutId}})
		return 0, err
	}
	_, _, err = putEnd(c, a, call{method: "PutEnd", args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServicePutEndArgs{Req: &external.PutEndRequest{Session: s, Key: key, PutId: start.PutId, Copies: copies}}
	}}, &external.ExternalServicePutEndResult{})
	return start.PutId, err
}

// putEnd sends a PutEnd (or BatchPutEnd, PutWrite) by the rule of protocol/external.thrift:
// after a lost reply it is sent again on the same session (the owner answers a repeated PutEnd
// with the first outcome), never elsewhere. When the session is gone (STALE_GENERATION,
// or the attach connection closed) the outcome is unknown: it re-attaches and returns an
// error wrapping errOutcomeUnknown. A repeated PutEnd answered INVALID_ARGUMENT (the
// owner no longer remembers the put) is unknown too; retried tells a batch caller to
// read its items' INVALID_ARGUMENT the same way.
func putEnd[R coded](c *Client, a *attachment, k call, res resultOf[R]) (r R, retried bool, err error) {
	for try := 0; ; try++ {
		r, err = invokeOn(c, a, k, res)
		retried = try > 0
		lost := errors.Is(err, errNotSent) || errors.Is(err, errNoReply)
		switch {
		case err == nil:
			return r, retried, nil
		case errors.Is(err, ErrStaleGeneration) || (lost && !a.alive()):
			c.reattach(a)
			return r, retried, fmt.Errorf("%w: the session ended before %s was answered (%v)", errOutcomeUnknown, k.method, err)
		case lost && try+1 < putEndTries:
			c.stats.putEndRetries.Add(1)
			continue
		case lost:
			if a.area != nil { // (areaMu held) the owner may still copy from the area
				a.areaOwed = func() error { _, err := invokeOn(c, a, k, res); return err }
			}
			return r, retried, fmt.Errorf("%w: %s sent %d times without an answer (%v)", errOutcomeUnknown, k.method, try+1, err)
		case retried && errors.Is(err, ErrInvalidArgument):
			return r, retried, fmt.Errorf("%w: the owner no longer knows the put (%v)", errOutcomeUnknown, err)
		default:
			return r, retried, err
		}
	}
}

// abort gives started puts back (PutAbort, BatchPutAbort), best effort: the owner also
// revokes them when the session ends. An unknown put answers INVALID_ARGUMENT: done.
func (c *Client) abort(a *attachment, items []*external.PutEndItem) {
	if len(items) == 0 {
		return
	}
	if len(items) == 1 {
		invokeOn(c, a, call{method: "PutAbort", args: func(s *external.Session) thrift.FastCodec {
			return &external.ExternalServicePutAbortArgs{Req: &external.PutAbortRequest{Session: s, Key: items[0].Key, PutId: items[0].PutId}}
		}}, &external.ExternalServicePutAbortResult{})
		return
	}
	invokeOn(c, a, call{method: "BatchPutAbort", args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceBatchPutAbortArgs{Req: &external.BatchPutAbortRequest{Session: s, Items: items}}
	}}, &external.ExternalServiceBatchPutAbortResult{})
}

// settleArea runs, under a.areaMu, before a put writes the area: an earlier call that
// named the area and went unanswered (areaOwed) is sent again; until it is answered, or
// the session ends, the area is not written (the owner may still copy from it into the
// earlier put's range: that put would be published with this one's bytes).
func settleArea(a *attachment) error {
	if a.areaOwed == nil {
		return nil
	}
	err := a.areaOwed()
	if (errors.Is(err, errNotSent) || errors.Is(err, errNoReply)) && a.alive() {
		return fmt.Errorf("%w: the put area waits for the owner's answer to an earlier put (%v)", ErrUnavailable, err)
	}
	a.areaOwed = nil // answered (any answer), or the session is gone with its area
	return nil
}
