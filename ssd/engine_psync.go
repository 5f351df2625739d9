package ssd

import (
	"sync"

	"golang.org/x/sys/unix"
)

// psyncEngine runs each IO as one blocking pread/pwrite on a pool of depth
// goroutines. It is the fallback where io_uring cannot be set up and the baseline
// every engine test compares against.
type psyncEngine struct {
	q  queues
	wg sync.WaitGroup

	mu            sync.Mutex // protects readInflight, writeInflight
	readInflight  int
	writeInflight int
}

func newPsyncEngine(depth int) *psyncEngine {
	e := &psyncEngine{q: newQueues(depth)}
	e.wg.Add(depth)
	for range depth {
		go e.worker()
	}
	return e
}

func (e *psyncEngine) Kind() string              { return EnginePsync }
func (e *psyncEngine) Submit(req *Request) error { return e.q.submit(req, nil) }
func (e *psyncEngine) Close() error              { e.q.close(); e.wg.Wait(); return nil }

func (e *psyncEngine) worker() {
	defer e.wg.Done()
	rc, wc := e.q.readCh, e.q.writeCh
	for {
		e.mu.Lock()
		r, w := e.readInflight, e.writeInflight
		e.mu.Unlock()
		req := tryNext(&rc, &wc, r, w)
		if req == nil {
			req = waitNext(&rc, &wc)
		}
		if req == nil {
			return // both channels closed and drained
		}
		e.track(req.Op, 1)
		n, err := psyncIO(req)
		e.track(req.Op, -1)
		req.complete(n, err)
	}
}

func (e *psyncEngine) track(op Op, d int) {
	e.mu.Lock()
	if op == OpWrite {
		e.writeInflight += d
	} else {
		e.readInflight += d
	}
	e.mu.Unlock()
}

// psyncIO performs one pread or pwrite; like an io_uring CQE it reports what one
// call transferred, short or not.
func psyncIO(req *Request) (int, error) {
	buf, err := req.File.Shape(req.Op, req.Buf, req.Off)
	if err != nil {
		return 0, err
	}
	for {
		var n int
		if req.Op == OpWrite {
			n, err = unix.Pwrite(req.File.Fd(), buf, req.Off)
		} else if req.Head != nil {
			n, err = unix.Preadv(req.File.Fd(), [][]byte{req.Head, buf}, req.Off)
		} else {
			n, err = unix.Pread(req.File.Fd(), buf, req.Off)
		}
		if err == unix.EINTR {
			continue
		}
		if n < 0 {
			n = 0
		}
		return n, err
	}
}
