package daemon

import (
	"iter"

	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// A batch call to the master carries at most mp.BATCH items whose keys and parents,
// with masterItemBytes more per item for its other fields, stay within
// masterCallBytes, and at most masterCallAcks holder acks (acker.take): so it fits a
// frame (wire.MaxFrameBytes) whatever the client's request held. A client's request
// that just fits its own frame (items of the longest key and parent) does not fit one
// once the owner adds its node and queued acks.
const (
	masterCallBytes = wire.MaxFrameBytes / 2
	masterItemBytes = 64
	masterCallAcks  = 1 << 16
)

// masterParts splits s into the items of successive master calls, in order: at most
// mp.BATCH each, their names (name(x): the bytes of x's key and parent) within
// masterCallBytes.
func masterParts[T any](s []T, name func(T) int) iter.Seq[[]T] {
	return partsOf(s, int(mp.BATCH), name)
}

// partsOf is masterParts with at most most items per call; every part holds at least
// one item.
func partsOf[T any](s []T, most int, name func(T) int) iter.Seq[[]T] {
	return func(yield func([]T) bool) {
		for len(s) > 0 {
			n, bytes := 0, 0
			for n < len(s) && n < most {
				b := name(s[n]) + masterItemBytes
				if n > 0 && bytes+b > masterCallBytes {
					break
				}
				bytes += b
				n++
			}
			if !yield(s[:n:n]) {
				return
			}
			s = s[n:]
		}
	}
}
