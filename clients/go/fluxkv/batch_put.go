package fluxkv

import (
	"errors"
	"fmt"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// PutItem is one value of a BatchPut: Value, or (when Fill is set) Len bytes written by
// Fill straight into the segment, as PutWithID does (under client isolation into the put
// area, or a scratch buffer when Len exceeds the area; see PutWith). Parent, when set,
// makes it a KV page of a chain (see PutOptions.Parent); a batch may hold whole chains.
type PutItem struct {
	Key    string
	Value  []byte
	Len    int64
	Fill   func(putID int64, dst []byte) error
	Parent *string
}

func (it *PutItem) size() int64 {
	if it.Fill != nil {
		return it.Len
	}
	return int64(len(it.Value))
}

func (it *PutItem) fill(putID int64, dst []byte) error {
	if it.Fill != nil {
		return it.Fill(putID, dst)
	}
	copy(dst, it.Value)
	return nil
}

// whole is the whole value as one slice: Value, or a scratch buffer Fill wrote (a value
// streamed through the put area under isolation).
func (it *PutItem) whole(putID int64) ([]byte, error) {
	if it.Fill == nil {
		return it.Value, nil
	}
	b := make([]byte, it.Len)
	if err := it.Fill(putID, b); err != nil {
		return nil, err
	}
	return b, nil
}

// BatchPut stores many values. It checks every item first: a bad key or a length that
// is empty or larger than the segment fails the whole batch with ErrInvalidArgument
// before anything is started. Then it sends the items in waves (BatchPutStart, copy,
// BatchPutEnd), each of at most wire.MaxBatch items holding at most
// wire.PutWaveBytes(segment) bytes started and not yet ended (under client isolation
// also at most the put area; an item larger than the bound goes alone) and keys and
// parents of at most half a frame (waveNameBytes), so the batch never waits for space
// only it holds and each request fits a frame. errs[i] is item i's outcome (a parent the
// owner refuses fails its item); err is set only when nothing was attempted. The retry rules are Put's. Parents come from the items: opts.Parent set
// fails the batch with ErrInvalidArgument.
func (c *Client) BatchPut(items []PutItem, opts PutOptions) (errs []error, err error) {
	if opts.Parent != nil {
		return nil, fmt.Errorf("%w: BatchPut takes each item's parent from PutItem.Parent, not PutOptions", ErrInvalidArgument)
	}
	seg := c.SegmentSize()
	for i := range items {
		if err := wire.ValidateKey(items[i].Key); err != nil {
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		if err := wire.ValidateLen(items[i].size(), seg); err != nil {
			return nil, fmt.Errorf("item %d (%q): %w", i, items[i].Key, err)
		}
	}
	errs = make([]error, len(items))
	for lo := 0; lo < len(items); {
		budget := wire.PutWaveBytes(c.SegmentSize())
		if area := c.PutAreaSize(); area > 0 {
			budget = min(budget, area) // isolation: a wave's values fit the area together
		}
		hi := lo + waveLen(items[lo:], budget)
		c.putWave(items, lo, hi, opts, errs)
		lo = hi
	}
	return errs, nil
}

// waveNameBytes bounds the keys and parents of one wave, with waveItemBytes more per
// item for the rest of its request item: its BatchPutStart (and the owner's to the
// master, which also carries acks) stays well inside wire.MaxFrameBytes. wire.MaxBatch
// items of the longest key and parent (wire.MaxKeyBytes each) would not fit one frame.
const (
	waveNameBytes = int64(wire.MaxFrameBytes / 2)
	waveItemBytes = 64
)

// waveLen is how many leading items form the next wave: at least one, at most
// wire.MaxBatch, their bytes within budget unless the first alone exceeds it, their
// keys and parents within waveNameBytes.
func waveLen(items []PutItem, budget int64) int {
	var bytes, names int64
	n := 0
	for n < len(items) && n < wire.MaxBatch {
		b := items[n].size()
		m := int64(len(items[n].Key) + waveItemBytes)
		if items[n].Parent != nil {
			m += int64(len(*items[n].Parent))
		}
		if n > 0 && (bytes+b > budget || names+m > waveNameBytes) {
			break
		}
		bytes += b
		names += m
		n++
	}
	return n
}

// putWave puts items[lo:hi], filling errs; items whose outcome became unknown are redone
// once (without RejectIfExists) as a new wave on the current session, and so are items
// not ended because their session ended (errNotWritten, with RejectIfExists too).
func (c *Client) putWave(items []PutItem, lo, hi int, opts PutOptions, errs []error) {
	idx := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		idx = append(idx, i)
	}
	for redo := 0; len(idx) > 0; redo++ {
		unknown := c.putWaveOnce(items, idx, opts, errs)
		var again []int
		for _, i := range unknown {
			if redo > 0 || (opts.RejectIfExists && !errors.Is(errs[i], errNotWritten)) {
				errs[i] = fmt.Errorf("%w: put %q: %v", ErrUnavailable, items[i].Key, errs[i])
				continue
			}
			again = append(again, i)
		}
		c.stats.putRedos.Add(int64(len(again)))
		idx = again
	}
}

// putWaveOnce runs one BatchPutStart, the copies and one BatchPutEnd (sent again on the
// same session after a lost reply). It returns the items whose outcome is unknown, their
// errs set to why.
func (c *Client) putWaveOnce(items []PutItem, idx []int, opts PutOptions, errs []error) (unknown []int) {
	starts := make([]*external.PutStartItem, len(idx))
	var bytes int64
	for j, i := range idx {
		starts[j] = &external.PutStartItem{Key: items[i].Key, Len: items[i].size(),
			Opts: &external.PutOptions{RejectIfExists: opts.RejectIfExists}, Parent: items[i].Parent}
		bytes += items[i].size()
	}
	c.stats.noteWave(bytes)
	r, a, err := invoke(c, call{method: "BatchPutStart", retry: retryUnsent, args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceBatchPutStartArgs{Req: &external.BatchPutStartRequest{Session: s, Items: starts}}
	}}, &external.ExternalServiceBatchPutStartResult{})
	if err == nil && len(r.Results) != len(idx) {
		err = fmt.Errorf("%w: BatchPutStart: %d results for %d items", ErrUnavailable, len(r.Results), len(idx))
	}
	if err != nil {
		for _, i := range idx {
			errs[i] = err
		}
		return nil
	}
	var ok []int // positions in idx of the items started
	for j, i := range idx {
		res := r.Results[j]
		if errs[i] = wire.FromResponse(res.Code, res.Message); errs[i] != nil {
			errs[i] = fmt.Errorf("item %d (%q): %w", i, items[i].Key, errs[i])
			continue
		}
		if !inSegment(res.Offset, items[i].size(), a.reply.SegmentSize) {
			errs[i] = fmt.Errorf("%w: owner returned offset %d for %q outside the segment", ErrUnavailable, res.Offset, items[i].Key)
			c.abort(a, []*external.PutEndItem{{Key: items[i].Key, PutId: res.PutId}})
			continue
		}
		ok = append(ok, j)
	}
	if len(ok) > 0 && !c.useLive(a) { // a re-attach retired a meanwhile (its session, and the puts, are gone), or Close ran
		closed := c.isClosed()
		for _, j := range ok {
			if closed {
				errs[idx[j]] = ErrClosed
				continue
			}
			errs[idx[j]] = errNotWritten
			unknown = append(unknown, idx[j])
		}
		return unknown
	}
	if len(ok) > 0 {
		defer c.unuse(a)
	}
	copies := make([][]*external.AreaCopy, len(idx))
	werrs := make([]error, len(idx))
	if a.area != nil {
		a.areaMu.Lock()
		defer a.areaMu.Unlock() // held until BatchPutEnd is answered
		if err := settleArea(a); err != nil {
			for _, j := range ok {
				werrs[j] = err // each aborted below
			}
		} else {
			c.writeWaveToArea(a, items, idx, r.Results, ok, copies, werrs)
		}
	} else {
		for _, j := range ok {
			it, res := &items[idx[j]], r.Results[j]
			werrs[j] = it.fill(res.PutId, a.rw.Bytes()[res.Offset:res.Offset+it.size():res.Offset+it.size()])
		}
	}
	var ends []*external.PutEndItem
	var ended []int // item index of each ends entry
	for _, j := range ok {
		i, res := idx[j], r.Results[j]
		if errs[i] = werrs[j]; errs[i] != nil {
			c.abort(a, []*external.PutEndItem{{Key: items[i].Key, PutId: res.PutId}})
			if errors.Is(errs[i], errNotWritten) { // a streamed part's PutWrite found the session gone
				unknown = append(unknown, i)
			}
			continue
		}
		ends = append(ends, &external.PutEndItem{Key: items[i].Key, PutId: res.PutId, Copies: copies[j]})
		ended = append(ended, i)
	}
	if len(ends) == 0 {
		return unknown
	}
	er, retried, err := putEnd(c, a, call{method: "BatchPutEnd", args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServiceBatchPutEndArgs{Req: &external.BatchPutEndRequest{Session: s, Items: ends}}
	}}, &external.ExternalServiceBatchPutEndResult{})
	if err == nil && len(er.Results) != len(ends) {
		err = fmt.Errorf("%w: BatchPutEnd: %d results for %d items", ErrUnavailable, len(er.Results), len(ends))
	}
	if err != nil {
		for _, i := range ended {
			errs[i] = err
		}
		if errors.Is(err, errOutcomeUnknown) {
			return append(unknown, ended...)
		}
		return unknown
	}
	for j, i := range ended {
		res := er.Results[j]
		if retried && res.Code == common.ErrorCode_INVALID_ARGUMENT {
			errs[i] = fmt.Errorf("%w: the owner no longer knows put %d of %q (%s)", errOutcomeUnknown, ends[j].PutId, items[i].Key, res.Message)
			unknown = append(unknown, i)
			continue
		}
		if errs[i] = wire.FromResponse(res.Code, res.Message); errs[i] != nil {
			errs[i] = fmt.Errorf("item %d (%q): %w", i, items[i].Key, errs[i])
		}
	}
	return unknown
}
