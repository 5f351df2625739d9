package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

// The data-plane frames, version 1 (see the package doc). Integers are big-endian.
const (
	frameMagic   = "FXKD"
	frameVersion = 1

	opPull       = 1
	opPullStaged = 2 // Fence.Staged

	// requestFixedLen is the request header without the node id.
	requestFixedLen = len(frameMagic) + 1 + 1 + 2 + 4*8
	// maxRequestLen bounds a whole request header.
	maxRequestLen = requestFixedLen + wire.MaxNodeIDBytes
	// responseFixedLen is the status header without the message.
	responseFixedLen = len(frameMagic) + 1 + 1 + 2 + 8
	// maxMessageBytes bounds a status message.
	maxMessageBytes = 256
)

// The header of an OK response is padded (its message, which the puller skips) to
// okHeaderLen bytes, so that the kernel's copies of the data stay off a slow path of
// rep movsb (which the kernel copies with): on AMD EPYC (this machine) a copy whose
// destination lies 1 to 31 bytes past its source modulo 4096 runs at a tenth of the
// speed (64 KiB copies in user space: 1.6-2.8 GB/s instead of 20-26 GB/s). A send
// is copied into the sending thread's page fragment right after the header (at offset
// okHeaderLen when the fragment was recycled, as it is between the pulls of a
// request/response stream), and the puller's read copies it out of there. With the
// unpadded 16-byte header a page-aligned source was on the slow path: a 1 MiB pull
// between two processes took 0.9 ms where the same bytes without a header took 0.3 ms.
// With 64 bytes (128 when the source starts 33 to 63 bytes into a page) the send is
// off it from any source offset, and the read into any destination on a 512-byte
// granule (master.AllocGranule).
const (
	okHeaderLen    = 64
	okHeaderLenAlt = 128
)

// okPadding is the padding message of an OK response (zero bytes).
var okPadding = string(make([]byte, okHeaderLenAlt-responseFixedLen))

// okPad is the padding, in bytes, of the OK response that precedes data (see
// okHeaderLen).
func okPad(data []byte) int {
	s := int(uintptr(unsafe.Pointer(unsafe.SliceData(data))) & 4095)
	h := okHeaderLen
	if d := (h - s) & 4095; d >= 1 && d < 32 {
		h = okHeaderLenAlt
	}
	return h - responseFixedLen
}

// Status codes of a response.
const (
	statusOK          byte = 0 // exactly length bytes follow
	statusFenced      byte = 1 // the fence or range does not match what the source retains
	statusBadRequest  byte = 2 // malformed or out of bounds; the server closes the connection
	statusUnavailable byte = 3 // the source cannot serve now (closing, its Source failed)
	// statusWait answers a staged pull whose chunk is not read yet, every
	// waitInterval, with length 0: the source is alive; the real status follows.
	statusWait byte = 4
)

// waitInterval is how often a source waiting for a staged chunk says so (statusWait):
// well under any puller's ProgressTimeout, so a live source is never mistaken for a
// dead one and a stopped one is found within ProgressTimeout.
const waitInterval = 250 * time.Millisecond

func statusName(s byte) string {
	switch s {
	case statusOK:
		return "OK"
	case statusFenced:
		return "FENCED"
	case statusBadRequest:
		return "BAD_REQUEST"
	case statusUnavailable:
		return "UNAVAILABLE"
	case statusWait:
		return "WAIT"
	}
	return fmt.Sprintf("status %d", s)
}

// request is one parsed pull request.
type request struct {
	op     byte
	fence  Fence
	offset int64
	length int64
}

// errBadRequest is wrapped by every request parse error.
var errBadRequest = errors.New("bad data-plane request")

// appendRequest appends the encoding of r to b.
func appendRequest(b []byte, r request) []byte {
	b = append(b, frameMagic...)
	b = append(b, frameVersion, r.op)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.fence.SourceNode)))
	b = binary.BigEndian.AppendUint64(b, uint64(r.fence.TransferID))
	b = binary.BigEndian.AppendUint64(b, uint64(r.fence.SourceGeneration))
	b = binary.BigEndian.AppendUint64(b, uint64(r.offset))
	b = binary.BigEndian.AppendUint64(b, uint64(r.length))
	return append(b, r.fence.SourceNode...)
}

// parseRequestFixed checks the fixed part of a request header (requestFixedLen
// bytes) and returns the node id's length, so the caller reads exactly that many
// more bytes; nothing is allocated from the header.
func parseRequestFixed(h []byte) (nodeLen int, err error) {
	if len(h) < requestFixedLen {
		return 0, fmt.Errorf("%w: header of %d bytes, want %d", errBadRequest, len(h), requestFixedLen)
	}
	if string(h[:len(frameMagic)]) != frameMagic {
		return 0, fmt.Errorf("%w: not a fluxkv data-plane request (magic %q)", errBadRequest, h[:len(frameMagic)])
	}
	if v := h[len(frameMagic)]; v != frameVersion {
		return 0, fmt.Errorf("%w: data-plane version %d, this node speaks %d: run the same fluxkv release on both", errBadRequest, v, frameVersion)
	}
	if op := h[len(frameMagic)+1]; op != opPull && op != opPullStaged {
		return 0, fmt.Errorf("%w: unknown op %d", errBadRequest, op)
	}
	n := int(binary.BigEndian.Uint16(h[len(frameMagic)+2:]))
	if n == 0 || n > wire.MaxNodeIDBytes {
		return 0, fmt.Errorf("%w: source node id of %d bytes, want 1..%d", errBadRequest, n, wire.MaxNodeIDBytes)
	}
	return n, nil
}

// parseRequest parses a whole request header (fixed part and node id) and checks its
// range: offset ≥ 0, length ≥ 1, offset+length without overflow. Whether the range
// lies in the segment is the Source's call.
func parseRequest(h []byte) (request, error) {
	n, err := parseRequestFixed(h)
	if err != nil {
		return request{}, err
	}
	if len(h) != requestFixedLen+n {
		return request{}, fmt.Errorf("%w: header of %d bytes, want %d", errBadRequest, len(h), requestFixedLen+n)
	}
	p := h[len(frameMagic)+4:]
	r := request{
		op: h[len(frameMagic)+1],
		fence: Fence{
			TransferID:       int64(binary.BigEndian.Uint64(p[0:])),
			SourceGeneration: int64(binary.BigEndian.Uint64(p[8:])),
			SourceNode:       string(h[requestFixedLen:]),
			Staged:           h[len(frameMagic)+1] == opPullStaged,
		},
		offset: int64(binary.BigEndian.Uint64(p[16:])),
		length: int64(binary.BigEndian.Uint64(p[24:])),
	}
	if r.offset < 0 || r.length <= 0 || r.offset+r.length < r.offset {
		return request{}, fmt.Errorf("%w: range offset %d length %d", errBadRequest, r.offset, r.length)
	}
	return r, nil
}

// appendResponse appends a status header: status, the number of bytes that follow
// (length; 0 unless status is statusOK) and msg, truncated to maxMessageBytes.
func appendResponse(b []byte, status byte, length int64, msg string) []byte {
	if len(msg) > maxMessageBytes {
		msg = msg[:maxMessageBytes]
	}
	b = append(b, frameMagic...)
	b = append(b, frameVersion, status)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	b = binary.BigEndian.AppendUint64(b, uint64(length))
	return append(b, msg...)
}

// parseResponseFixed checks the fixed part of a status header.
func parseResponseFixed(h []byte) (status byte, length int64, msgLen int, err error) {
	if len(h) < responseFixedLen {
		return 0, 0, 0, fmt.Errorf("a reply header of %d bytes, want %d", len(h), responseFixedLen)
	}
	if string(h[:len(frameMagic)]) != frameMagic {
		if string(h[:len(frameMagic)]) == "FXKA" {
			return 0, 0, 0, errors.New("it requires cluster authentication and this node runs with --insecure-cluster: give it --cluster-secret-file")
		}
		return 0, 0, 0, fmt.Errorf("not a fluxkv data-plane reply (magic %q): check the address", h[:len(frameMagic)])
	}
	if v := h[len(frameMagic)]; v != frameVersion {
		return 0, 0, 0, fmt.Errorf("data-plane version %d, this node speaks %d: run the same fluxkv release on both", v, frameVersion)
	}
	status = h[len(frameMagic)+1]
	msgLen = int(binary.BigEndian.Uint16(h[len(frameMagic)+2:]))
	length = int64(binary.BigEndian.Uint64(h[len(frameMagic)+4:]))
	if msgLen > maxMessageBytes {
		return 0, 0, 0, fmt.Errorf("status message of %d bytes exceeds %d", msgLen, maxMessageBytes)
	}
	return status, length, msgLen, nil
}
