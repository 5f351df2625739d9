package wire

import (
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
)

// MaxKeyBytes is the longest key any server accepts.
const MaxKeyBytes = int(external.MAX_KEY_BYTES)

// The wire limits of protocol/external.thrift, re-exported: the IDL is their one source.
const (
	// MaxBatch bounds the items of one batch request and the ids of one Release.
	MaxBatch = int(external.MAX_BATCH)
	// MaxFrameBytes bounds one framed request or reply on the RPC socket.
	MaxFrameBytes = int(external.MAX_FRAME_BYTES)
	// MaxAttachFrameBytes bounds the attach hello and reply frames.
	MaxAttachFrameBytes = int(external.MAX_ATTACH_FRAME_BYTES)
	// MaxHelloNameBytes bounds AttachHello.name.
	MaxHelloNameBytes = int(external.MAX_HELLO_NAME_BYTES)
	// MaxReleasesPerCall bounds Session.releases on any call.
	MaxReleasesPerCall = int(external.MAX_RELEASES_PER_CALL)
)

// The retry rules of protocol/external.thrift, re-exported (the IDL comments state them).
const (
	// PutEndMemory is how many ended puts per session the owner remembers the outcome
	// of, to answer a repeated PutEnd with the first answer.
	PutEndMemory = int(external.PUT_END_MEMORY)
	// PutWaveSegmentDivisor: a batch put's wave holds at most segment/PutWaveSegmentDivisor
	// bytes started and not yet ended.
	PutWaveSegmentDivisor = int64(external.PUT_WAVE_SEGMENT_DIVISOR)
)

// PutWaveBytes is the most bytes one wave of a batch put may hold started and not yet
// ended on a segment of the given size (an item larger than it goes alone in its wave).
func PutWaveBytes(segment int64) int64 {
	return max(segment/PutWaveSegmentDivisor, 1)
}

// MaxNodeIDBytes bounds a node id.
const MaxNodeIDBytes = 256

// ValidateKey checks a key: 1..MaxKeyBytes bytes.
func ValidateKey(key string) error {
	switch {
	case len(key) == 0:
		return Errorf(common.ErrorCode_INVALID_ARGUMENT, "empty key")
	case len(key) > MaxKeyBytes:
		return Errorf(common.ErrorCode_INVALID_ARGUMENT, "key of %d bytes exceeds the limit of %d", len(key), MaxKeyBytes)
	}
	return nil
}

// ValidateLen checks a value length against the segment it must fit in.
func ValidateLen(n, segment int64) error {
	switch {
	case n <= 0:
		return Errorf(common.ErrorCode_INVALID_ARGUMENT, "value length %d: must be at least 1 byte", n)
	case n > segment:
		return Errorf(common.ErrorCode_INVALID_ARGUMENT, "value length %d exceeds the segment size %d", n, segment)
	}
	return nil
}

// ValidateBatch checks the item count of a batch request.
func ValidateBatch(n int) error {
	if n > MaxBatch {
		return Errorf(common.ErrorCode_INVALID_ARGUMENT, "batch of %d items exceeds the limit of %d", n, MaxBatch)
	}
	return nil
}

// ValidateNodeID checks a node id.
func ValidateNodeID(id string) error {
	if id == "" || len(id) > MaxNodeIDBytes {
		return Errorf(common.ErrorCode_INVALID_ARGUMENT, "node id must be 1..%d bytes, got %d", MaxNodeIDBytes, len(id))
	}
	return nil
}
