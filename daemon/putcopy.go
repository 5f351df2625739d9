package daemon

import (
	"errors"
	"slices"
	"sort"
	"time"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
)

// errNotIsolated answers copies sent to an owner without client isolation.
var errNotIsolated = errCode(common.ErrorCode_INVALID_ARGUMENT,
	"this owner does not isolate clients: no put area to copy from (write the value at the put's offset and send no copies)")

// checkCopyCount bounds the copies of one call (over all its items) by wire.MaxBatch.
func checkCopyCount(n int) error {
	if n > wire.MaxBatch {
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "%d area copies exceed the limit of %d per call", n, wire.MaxBatch)
	}
	return nil
}

// checkCopies validates the copies into one put: each non-empty, inside the value
// (valueLen bytes) and inside the put area (areaLen bytes), and all of them together no
// more bytes than the smaller of the two: a call conveys at most an area of bytes, and
// overlapping copies would have the owner copy up to wire.MaxBatch area-fulls for one
// small request. Every comparison is overflow-safe (no sum of client numbers exceeds
// that bound).
func checkCopies(copies []*external.AreaCopy, valueLen, areaLen int64) error {
	limit := min(valueLen, areaLen)
	var total int64 // bytes of the copies before i, at most limit
	for i, cp := range copies {
		switch {
		case cp == nil:
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "area copy %d is null", i)
		case cp.Len <= 0:
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "area copy %d: length %d must be positive", i, cp.Len)
		case cp.ValueOffset < 0 || cp.Len > valueLen || cp.ValueOffset > valueLen-cp.Len:
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "area copy %d: value range [%d, +%d) is outside the %d-byte value", i, cp.ValueOffset, cp.Len, valueLen)
		case cp.AreaOffset < 0 || cp.Len > areaLen || cp.AreaOffset > areaLen-cp.Len:
			return errCode(common.ErrorCode_INVALID_ARGUMENT, "area copy %d: area range [%d, +%d) is outside the %d-byte put area", i, cp.AreaOffset, cp.Len, areaLen)
		case cp.Len > limit-total:
			return errCode(common.ErrorCode_INVALID_ARGUMENT,
				"area copies 0..%d add up to more than %d bytes, the smaller of the %d-byte value and the %d-byte put area (copies of one call must not overlap)",
				i, limit, valueLen, areaLen)
		}
		total += cp.Len
	}
	return nil
}

// checkPutCopies validates copies into the pending put p of session c: none without
// isolation; under it, ranges inside p's value and c's area, and p's target inside the
// segment (the master placed it; a bad range would be an owner crash).
func (st *ownerState) checkPutCopies(c *session, p *pendingPut, copies []*external.AreaCopy) error {
	if len(copies) == 0 {
		return nil
	}
	if c.area == nil {
		return errNotIsolated
	}
	if err := checkCopies(copies, p.len, c.area.Size()); err != nil {
		return err
	}
	if p.offset < 0 || p.len > st.segSize || p.offset > st.segSize-p.len {
		return errCode(common.ErrorCode_INTERNAL, "put %d: target [%d, +%d) is outside the %d-byte segment", p.putID, p.offset, p.len, st.segSize)
	}
	return nil
}

// copyChunk is how many bytes copyIn copies between two looks at the put's copy deadline.
const copyChunk = 1 << 20

// copyIn copies validated ranges of area into p's target range of the segment, a
// copyChunk at a time, and stops (false) before a chunk that would start past p.copyBy:
// the master frees the range of a put it expired about 10 s later (a copy that started
// in time but ran long, starved of CPU, or many at once, must not reach a range handed
// to another key). The caller holds a copy count (session.copying) so the area stays
// mapped, and p cannot be freed meanwhile (it is pending with pendingPut.copying held,
// or ending).
func (o *Owner) copyIn(area *shm.Segment, p *pendingPut, copies []*external.AreaCopy) bool {
	seg, src := o.seg.Bytes(), area.Bytes()
	chunk := 0
	for _, cp := range copies {
		for done := int64(0); done < cp.Len; done += copyChunk {
			if time.Now().After(p.copyBy) {
				return false
			}
			n := min(cp.Len-done, copyChunk)
			dst, from := p.offset+cp.ValueOffset+done, cp.AreaOffset+done
			copy(seg[dst:dst+n], src[from:from+n])
			if o.opts.testCopyChunk != nil {
				o.opts.testCopyChunk(p.key, chunk)
			}
			chunk++
		}
	}
	return true
}

// putWrite copies parts of a pending put's value from the session's put area (client
// isolation streams a value larger than the area this way). Only a put this session
// started and has not begun to end qualifies.
//
// A PutWrite is sent again, on another connection, when its reply was lost; the first
// may still be copying then, or even come later (the owner had not read it from the
// connection the client gave up). Either would copy the area after the client refilled
// it with the next part: the wrong bytes, published by the PutEnd. So a PutWrite waits
// until no other copy into the put runs, and one whose value ranges an earlier PutWrite
// of the put already copied copies nothing (it is that one's repeat: the bytes are in
// place), answering OK. So each value range is named once per put (valueRanges.with):
// a PutWrite that names a copied range in part, or would leave the put's copied ranges
// in more than maxValueRanges pieces, is INVALID_ARGUMENT. The clients' parts are
// PutWrites of disjoint value ranges from offset 0 on, which make one piece.
func (o *Owner) putWrite(c *session, key string, putID int64, copies []*external.AreaCopy) error {
	if !o.opts.ClientIsolation {
		return errNotIsolated
	}
	if err := checkCopyCount(len(copies)); err != nil {
		return err
	}
	st := o.lock()
	// (Past the copy deadline it expires the put at once: copies into it stop there.)
	for p := c.puts[putID]; p != nil && !c.closed && p.ending == nil && p.copying > 0 && !time.Now().After(p.copyBy); p = c.puts[putID] {
		o.copied.Wait()
	}
	p := c.puts[putID]
	switch {
	case c.closed:
		o.unlock()
		return errSessionClosed()
	case p == nil || p.key != key || p.ending != nil:
		if p == nil { // (an ending put, or another key's, is nobody's ended outcome)
			if outcome, ok := c.ended.lookup(putID, key); ok && outcome != nil {
				o.unlock()
				return outcome // a PutWrite sent again after its reply was lost: the put expired meanwhile
			}
		}
		o.unlock()
		return errCode(common.ErrorCode_INVALID_ARGUMENT, "unknown put %d for this key (never started, ending, ended or aborted)", putID)
	}
	if err := st.checkPutCopies(c, p, copies); err != nil {
		o.unlock()
		return err
	}
	written, err := p.written.with(copies)
	switch {
	case errors.Is(err, errRepeat):
		o.unlock()
		return nil // a repeat of a PutWrite whose copy landed
	case err != nil:
		o.unlock()
		return err
	}
	if time.Now().After(p.copyBy) {
		err := o.expirePutLocked(st, c, p)
		o.unlock()
		o.abandonPut(p)
		return err
	}
	p.copying++
	c.copying++
	area := c.area
	o.unlock()
	copied := o.copyIn(area, p, copies)
	st = o.lock()
	p.copying--
	c.copying--
	o.copied.Broadcast()
	if copied {
		p.written = written // (PutWrites of p run one at a time: none changed it meanwhile)
		o.unlock()
		return nil
	}
	p.expired = true
	if c.puts[putID] != p || p.ending != nil {
		// Expired meanwhile, or its PutEnd (waiting for this copy) ends it (p.expired).
		o.unlock()
		return errPutExpired(p, o.bounds().putCopy)
	}
	err = o.expirePutLocked(st, c, p)
	o.unlock()
	o.abandonPut(p)
	return err
}

// waitCopiesLocked waits (releasing Owner.mu meanwhile) until no copy into p runs.
func (o *Owner) waitCopiesLocked(p *pendingPut) {
	for p.copying > 0 {
		o.copied.Wait()
	}
}

// valueRanges is the parts of a put's value that its PutWrites copied: sorted, disjoint
// [start, end) ranges, adjacent ones merged (a streamed value's parts make one).
type valueRanges []valueRange

type valueRange struct{ start, end int64 }

// maxValueRanges bounds the separate pieces of a put's copied ranges.
const maxValueRanges = 64

// errRepeat is with's answer for copies that all lie inside copied ranges.
var errRepeat = errors.New("every value range was copied already")

// with returns r with the copies' value ranges (validated: inside the value) added;
// errRepeat when every copy lies inside one copied range (a repeat: nothing to copy);
// INVALID_ARGUMENT when a copy overlaps a copied range only in part, or one lies inside
// while another does not, or the result would be more than maxValueRanges pieces.
func (r valueRanges) with(copies []*external.AreaCopy) (valueRanges, error) {
	inside := 0
	for _, cp := range copies {
		start, end := cp.ValueOffset, cp.ValueOffset+cp.Len
		i := sort.Search(len(r), func(i int) bool { return r[i].end > start })
		switch {
		case i < len(r) && r[i].start <= start && end <= r[i].end:
			inside++
		case i < len(r) && r[i].start < end:
			return nil, errCode(common.ErrorCode_INVALID_ARGUMENT,
				"value range [%d, %d) overlaps [%d, %d), which a PutWrite of this put copied: name each range once", start, end, r[i].start, r[i].end)
		}
	}
	switch {
	case len(copies) > 0 && inside == len(copies):
		return r, errRepeat
	case inside > 0:
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT,
			"%d of the %d value ranges were copied by a PutWrite of this put: name each range once", inside, len(copies))
	}
	out := slices.Clone(r)
	for _, cp := range copies {
		out = out.insert(valueRange{cp.ValueOffset, cp.ValueOffset + cp.Len})
	}
	if len(out) > maxValueRanges {
		return nil, errCode(common.ErrorCode_INVALID_ARGUMENT,
			"the value's copied ranges would be %d separate pieces, more than %d: copy its parts in order", len(out), maxValueRanges)
	}
	return out, nil
}

// insert merges v into r: the ranges that touch or overlap it join it.
func (r valueRanges) insert(v valueRange) valueRanges {
	lo := sort.Search(len(r), func(i int) bool { return r[i].end >= v.start })
	hi := lo
	for hi < len(r) && r[hi].start <= v.end {
		v.start, v.end = min(v.start, r[hi].start), max(v.end, r[hi].end)
		hi++
	}
	return slices.Replace(r, lo, hi, v)
}
