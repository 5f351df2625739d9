package ssd

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Request is one IO on a shard file. The submitter fills Op, File, Buf, Off and Done;
// the engine fills N and Err and sends the request on Done.
//
// Ownership: from Submit until the request arrives on Done the engine (and the
// kernel) own Buf: the submitter must neither touch nor drop it. The engine keeps the
// request referenced while the IO is in flight, so the buffer stays alive for the GC.
type Request struct {
	Op   Op
	File File
	Buf  []byte // the IO length is len(Buf) (plus len(Head))
	Off  int64
	// Head, if not nil, makes a read vectored (READV, preadv): Head is filled from
	// Off, then Buf right after it, in one IO. A load uses it to read a record header
	// into a buffer of its own and the value's first chunk straight into the
	// caller's memory. Reads only.
	Head []byte
	// Done receives the request when it completes. It must have a free slot for every
	// request the submitter has in flight on it: engines never block on it.
	Done chan *Request

	N   int           // bytes transferred
	Err error         // the IO error, if any; a short transfer is not an error here
	tag any           // the submitter's bookkeeping
	iov [2]unix.Iovec // a vectored read's iovecs, referenced by the kernel while in flight
}

// complete hands a finished request back to its submitter.
func (r *Request) complete(n int, err error) {
	r.N, r.Err = n, err
	select {
	case r.Done <- r:
	default:
		panic("BUG: io completion channel full")
	}
}

// Engine executes IO requests. Reads and writes queue on separate bounded channels;
// the engine keeps at most its depth of IOs in flight and prefers a read while
// read_inflight <= readWeight*write_inflight, taking the other kind whenever the
// preferred one has nothing queued (a slot is never left idle).
type Engine interface {
	// Submit queues req; it blocks while the queue of req's kind is full and returns
	// ErrClosed (without taking req) once Close began.
	Submit(req *Request) error
	// Close lets queued and in-flight IOs finish, then stops the engine.
	Close() error
	// Kind is EngineUring or EnginePsync.
	Kind() string
}

// readWeight is the read bias of every engine (the seed's read_weight = 2).
const readWeight = 2

// preferRead is the engines' arbitration rule.
func preferRead(readInflight, writeInflight int) bool {
	return readInflight <= readWeight*writeInflight
}

// queues are the two bounded submission channels every engine reads from, plus the
// close protocol: Submit holds the read lock while it sends, Close takes the write
// lock before it closes the channels, so no send ever hits a closed channel.
type queues struct {
	mu      sync.RWMutex // protects closed; held for reading across channel sends
	closed  bool
	readCh  chan *Request
	writeCh chan *Request
}

func newQueues(depth int) queues {
	return queues{readCh: make(chan *Request, depth), writeCh: make(chan *Request, depth)}
}

// submit queues req. after, if not nil, runs once req is queued, still under the
// read lock: the engine cannot have shut down (and closed its descriptors) yet.
func (q *queues) submit(req *Request, after func()) error {
	if req.Done == nil || req.File == nil {
		panic("BUG: io request without Done or File")
	}
	if req.Head != nil && (req.Op != OpRead || len(req.Head) == 0 || len(req.Buf) == 0) {
		panic("BUG: vectored io request that is not a read of two non-empty buffers")
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed {
		return ErrClosed
	}
	if req.Op == OpWrite {
		q.writeCh <- req
	} else {
		q.readCh <- req
	}
	if after != nil {
		after()
	}
	return nil
}

// close closes both channels; it reports false if they were closed already.
func (q *queues) close() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.closed = true
	close(q.readCh)
	close(q.writeCh)
	return true
}

// tryNext takes a queued request without blocking, preferring reads per the bias. A
// channel found closed is set to nil in *rc / *wc.
func tryNext(rc, wc *chan *Request, readInflight, writeInflight int) *Request {
	first, second := rc, wc
	if !preferRead(readInflight, writeInflight) {
		first, second = wc, rc
	}
	for _, c := range [2]*chan *Request{first, second} {
		if *c == nil {
			continue
		}
		select {
		case req, ok := <-*c:
			if !ok {
				*c = nil
				continue
			}
			return req
		default:
		}
	}
	return nil
}

// waitNext blocks until a request is queued or both channels are closed (nil).
func waitNext(rc, wc *chan *Request) *Request {
	for *rc != nil || *wc != nil {
		select {
		case req, ok := <-*rc:
			if !ok {
				*rc = nil
				continue
			}
			return req
		case req, ok := <-*wc:
			if !ok {
				*wc = nil
				continue
			}
			return req
		}
	}
	return nil
}

var (
	uringProbeOnce sync.Once
	uringProbeErr  error
)

// UringAvailable reports whether io_uring with READ, WRITE and READV opcodes can be set up
// here (kernel ≥ 5.6, not disabled by sysctl or seccomp); the error says why not.
// The probe runs once per process.
func UringAvailable() error {
	uringProbeOnce.Do(func() { uringProbeErr = probeUring() })
	return uringProbeErr
}

// NewEngine starts an engine of the given kind (EngineUring or EnginePsync) that
// keeps at most depth IOs in flight.
func NewEngine(kind string, depth int) (Engine, error) {
	if depth <= 0 {
		return nil, fmt.Errorf("io engine: depth %d must be positive", depth)
	}
	switch kind {
	case EngineUring:
		if err := UringAvailable(); err != nil {
			return nil, err
		}
		return newUringEngine(depth)
	case EnginePsync:
		return newPsyncEngine(depth), nil
	}
	return nil, fmt.Errorf("io engine: unknown kind %q", kind)
}
