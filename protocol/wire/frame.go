package wire

import (
	"fmt"
	"io"
)

// growStep is how much a frame buffer may grow beyond the bytes already received: a
// length prefix is a claim, not a reason to allocate.
const growStep = 64 << 10

// ReadFrameBody reads exactly size bytes from r into dst's storage (dst[:0]) and returns
// them. The buffer grows as bytes arrive, never more than growStep (64 KiB) ahead of what
// was received, so a peer that announces a large frame and sends nothing costs nothing;
// a caller that passes its previous buffer back reuses it. A stream that ends early gives
// an error wrapping io.ErrUnexpectedEOF; the caller's limit on size is checked before.
func ReadFrameBody(r io.Reader, dst []byte, size int) ([]byte, error) {
	if size < 0 {
		return nil, fmt.Errorf("read frame body: negative size %d", size)
	}
	body := dst[:0]
	for len(body) < size {
		if len(body) == cap(body) {
			body = grow(body, min(size, len(body)+max(len(body), growStep)))
		}
		want := min(cap(body), size)
		n, err := io.ReadFull(r, body[len(body):want])
		body = body[:len(body)+n]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("read frame body (%d of %d bytes): %w", len(body), size, err)
		}
	}
	return body, nil
}

// grow returns b with capacity newCap and b's bytes.
func grow(b []byte, newCap int) []byte {
	nb := make([]byte, len(b), newCap)
	copy(nb, b)
	return nb
}
