package ssd

import (
	"fmt"
	"io"
)

// shard is one fixed-size file of a device and the ring that allocates its space.
// The ring is guarded by Storage.mu; file and size never change after open.
type shard struct {
	id   int // index in Storage.shards
	dev  *device
	file File
	ring *ring
}

// fileOffset is where e's bytes start in the shard file.
func (sh *shard) fileOffset(e *entry) int64 { return e.begin % sh.ring.size }

// write stores buf (aligned, the whole aligned value) at off, split into IOs of at
// most maxIOSize that are all in flight together. It fails unless every byte was
// written: a short write is an error.
func (sh *shard) write(buf []byte, off int64) error {
	n := (len(buf) + maxIOSize - 1) / maxIOSize
	done := make(chan *Request, n)
	submitted := 0
	var firstErr error
	for i := 0; i < n && firstErr == nil; i++ {
		part := buf[i*maxIOSize : min(len(buf), (i+1)*maxIOSize)]
		req := &Request{Op: OpWrite, File: sh.file, Buf: part, Off: off + int64(i*maxIOSize), Done: done}
		if err := sh.dev.engine.Submit(req); err != nil {
			firstErr = err
			break
		}
		submitted++
	}
	for range submitted {
		req := <-done
		if firstErr != nil {
			continue
		}
		if req.Err != nil {
			firstErr = fmt.Errorf("write %s at %d (%d bytes): %w", sh.file.Name(), req.Off, len(req.Buf), req.Err)
		} else if req.N != len(req.Buf) {
			firstErr = fmt.Errorf("write %s at %d: %d of %d bytes: %w", sh.file.Name(), req.Off, req.N, len(req.Buf), io.ErrShortWrite)
		}
	}
	return firstErr
}
