package fluxkv

import (
	"sync/atomic"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
)

// MemHolder is a zero-copy view of a value in the shared segment, valid until Release.
// The owner keeps the bytes for as long as the holder is held, even if the key is
// overwritten, deleted or evicted meanwhile.
type MemHolder struct {
	c        *Client
	a        *attachment // the owner incarnation that issued it
	id       int64
	off, n   int64
	source   common.Source
	remote   bool
	putID    int64
	released atomic.Bool
}

// Bytes is the value, read-only (writing faults): a view of the read-only mapping, not
// a copy. It must not be used after Release (the mapping of an owner incarnation that
// has since restarted is unmapped with its last holder). Nil once released.
func (h *MemHolder) Bytes() []byte {
	if h.released.Load() {
		return nil
	}
	return h.a.ro.Bytes()[h.off : h.off+h.n : h.off+h.n]
}

// Len is the value's length.
func (h *MemHolder) Len() int64 { return h.n }

// Offset is where the value lies in the segment.
func (h *MemHolder) Offset() int64 { return h.off }

// ID is the owner's holder id.
func (h *MemHolder) ID() int64 { return h.id }

// PutID is the version of the value.
func (h *MemHolder) PutID() int64 { return h.putID }

// Source says where the bytes came from: "memory" or "ssd". A get after a pinned
// prefix lookup (BatchExistsPrefix) reports where the lookup found them, and so does
// Remote.
func (h *MemHolder) Source() string {
	if h.source == common.Source_SSD {
		return "ssd"
	}
	return "memory"
}

// Remote reports whether the bytes crossed the network: the owner pulled them from
// another owner's replica (Source says which tier they came from there).
func (h *MemHolder) Remote() bool { return h.remote }

// Release gives the bytes back; the release is batched onto the next call. A second
// Release returns ErrClosed.
func (h *MemHolder) Release() error {
	if h.released.Swap(true) {
		return ErrClosed
	}
	h.c.queueRelease(h.a, h.id)
	h.c.unuse(h.a) // the last holder of a retired attachment unmaps it
	return nil
}
