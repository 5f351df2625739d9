package fluxkv

import (
	"errors"
	"fmt"

	"github.com/cloudwego/gopkg/protocol/thrift"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// Puts through the session's put area, under client isolation (docs/architecture.md §11): the segment
// is write-sealed, so a value is written into the put area and the owner copies it into
// the put's range, as the AreaCopy ranges of PutWrite and PutEnd (BatchPutEnd) say. The
// caller holds attachment.areaMu from the first byte written until the call that copies
// it is answered: the goroutines sharing a client take turns on the area.
//
// A value that fits the area is written once, straight into it (Fill gets the area
// slice), and its one copy rides in PutEnd. A larger value is streamed: an area-full
// part at a time, each copied by a PutWrite; the last part rides in PutEnd (single puts)
// or in a PutWrite too (batch waves). Fill cannot write a streamed value in place: it is
// called once with a scratch buffer of the whole value, which is then streamed.

// areaFits reports whether n bytes fit a's put area at offset at.
func (a *attachment) areaFits(at, n int64) bool {
	return n <= int64(len(a.area.Bytes()))-at
}

// stage writes it (put putID) into the put area at offset at (areaFits) and returns the
// copy its PutEnd carries.
func stage(a *attachment, it *PutItem, putID, at int64) (*external.AreaCopy, error) {
	n := it.size()
	if err := it.fill(putID, a.area.Bytes()[at:at+n:at+n]); err != nil {
		return nil, err
	}
	return &external.AreaCopy{ValueOffset: 0, AreaOffset: at, Len: n}, nil
}

// stream sends a value larger than the put area through it, one area-full part at a
// time, each copied by a PutWrite. With keepLast the last part is not sent but returned
// for the PutEnd to carry.
func (c *Client) stream(a *attachment, it *PutItem, putID int64, keepLast bool) (*external.AreaCopy, error) {
	src, err := it.whole(putID)
	if err != nil {
		return nil, err
	}
	area := a.area.Bytes()
	n := int64(len(src))
	for off := int64(0); off < n; {
		k := min(int64(len(area)), n-off)
		copy(area[:k], src[off:off+k])
		cp := &external.AreaCopy{ValueOffset: off, AreaOffset: 0, Len: k}
		off += k
		if off == n && keepLast {
			return cp, nil
		}
		if err := c.putWrite(a, it.Key, putID, cp); errors.Is(err, errOutcomeUnknown) {
			// A part of a put never ended: the put is aborted, and nothing was published.
			return nil, fmt.Errorf("%w (%v)", errNotWritten, err)
		} else if err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// putWrite sends one PutWrite by its rule (again on the same session after a lost
// reply; putEnd runs that rule).
func (c *Client) putWrite(a *attachment, key string, putID int64, cp *external.AreaCopy) error {
	_, _, err := putEnd(c, a, call{method: "PutWrite", args: func(s *external.Session) thrift.FastCodec {
		return &external.ExternalServicePutWriteArgs{Req: &external.PutWriteRequest{Session: s, Key: key, PutId: putID,
			Copies: []*external.AreaCopy{cp}}}
	}}, &external.ExternalServicePutWriteResult{})
	return err
}

// writeWaveToArea writes the started items of a batch wave (positions ok in idx) into
// the put area: the ones that fit together get distinct offsets and are staged (copies[j]
// rides in BatchPutEnd); any other is streamed first, every part by PutWrite (a wave
// holds such an item alone, unless the area changed with a re-attach). errs[j] is the
// write's outcome.
func (c *Client) writeWaveToArea(a *attachment, items []PutItem, idx []int, starts []*external.PutStartResponse, ok []int, copies [][]*external.AreaCopy, errs []error) {
	at := make(map[int]int64, len(ok))
	var used int64
	for _, j := range ok {
		it := &items[idx[j]]
		if a.areaFits(used, it.size()) {
			at[j] = used
			used += it.size()
			continue
		}
		_, errs[j] = c.stream(a, it, starts[j].PutId, false)
	}
	for _, j := range ok {
		if off, fits := at[j]; fits {
			var cp *external.AreaCopy
			cp, errs[j] = stage(a, &items[idx[j]], starts[j].PutId, off)
			copies[j] = []*external.AreaCopy{cp}
		}
	}
}
