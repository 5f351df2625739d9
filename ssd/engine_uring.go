package ssd

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The small io_uring binding this package needs, written against the kernel ABI
// (include/uapi/linux/io_uring.h): setup, mmap of the SQ/CQ rings and the SQE array,
// enter, the READ/WRITE opcodes (single buffer) and READV for the two-buffer read of a
// record header and a value's first chunk.
const (
	uringOffSQRing = 0
	uringOffCQRing = 0x8000000
	uringOffSQEs   = 0x10000000

	uringFeatSingleMmap = 1 << 0
	uringEnterGetEvents = 1 << 0
	uringRegisterProbe  = 8
	uringOpSupported    = 1 << 0

	uringOpReadv = 1
	uringOpRead  = 22
	uringOpWrite = 23

	// maxIOSize bounds one SQE (its length is 32 bits; Linux caps a read or write
	// near 2 GiB anyway). Callers split larger transfers.
	maxIOSize = 1 << 30

	wakeTag = ^uint64(0) // user_data of the eventfd read that wakes the ring
)

type uringSQOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type uringCQOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  uringSQOffsets
	cqOff                                                                  uringCQOffsets
}

type uringSQE struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	pad         uint64
}

type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// Compile-time checks of the ABI sizes: each array length is negative (a compile
// error) unless the size is exact.
var (
	_ [64 - unsafe.Sizeof(uringSQE{})]byte
	_ [unsafe.Sizeof(uringSQE{}) - 64]byte
	_ [16 - unsafe.Sizeof(uringCQE{})]byte
	_ [unsafe.Sizeof(uringCQE{}) - 16]byte
	_ [120 - unsafe.Sizeof(uringParams{})]byte
	_ [unsafe.Sizeof(uringParams{}) - 120]byte
)

func uringSetup(entries uint32, p *uringParams) (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(p)), 0)
	if errno != 0 {
		return -1, fmt.Errorf("io_uring_setup: %w", errno)
	}
	return int(fd), nil
}

// probeUring checks that io_uring can be set up and supports IORING_OP_READ and
// IORING_OP_WRITE.
func probeUring() error {
	var p uringParams
	fd, err := uringSetup(4, &p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	const nOps = 256
	probe := make([]byte, 16+nOps*8)
	_, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(fd), uringRegisterProbe,
		uintptr(unsafe.Pointer(&probe[0])), nOps, 0, 0)
	if errno != 0 {
		return fmt.Errorf("io_uring_register(PROBE): %w (kernel older than 5.6?)", errno)
	}
	for _, op := range []int{uringOpReadv, uringOpRead, uringOpWrite} {
		if int(probe[0]) < op || binary.LittleEndian.Uint16(probe[16+op*8+2:])&uringOpSupported == 0 {
			return fmt.Errorf("io_uring: opcode %d not supported by this kernel", op)
		}
	}
	return nil
}

// uringEngine drives one io_uring from one goroutine locked to its OS thread. The
// goroutine takes requests from the read and write channels while fewer than depth
// IOs are in flight, submits them as single-buffer READ/WRITE SQEs (READV for a
// request with a Head) and completes them from the CQ. While it waits in
// io_uring_enter with free slots, an eventfd read in the ring lets Submit wake it
// when new work arrives.
type uringEngine struct {
	q     queues
	fd    int
	efd   int
	depth int

	sqMem, cqMem, sqeMem []byte
	sqHead, sqTail       *uint32
	sqMask               uint32
	sqArray              unsafe.Pointer
	sqes                 unsafe.Pointer
	cqHead, cqTail       *uint32
	cqMask               uint32
	cqes                 unsafe.Pointer

	sleeping atomic.Bool // the loop may block in io_uring_enter with free slots
	done     chan struct{}

	// Owned by the loop goroutine.
	sqTailLocal   uint32
	slots         []*Request // in flight, indexed by user_data: keeps buffers referenced
	free          []uint32
	readInflight  int
	writeInflight int
	wakeArmed     bool
	wakeBuf       []byte // the eventfd read's target, alive while armed
}

func nextPow2(n uint32) uint32 {
	p := uint32(1)
	for p < n {
		p <<= 1
	}
	return p
}

func newUringEngine(depth int) (_ *uringEngine, err error) {
	var p uringParams
	fd, err := uringSetup(nextPow2(uint32(depth)+1), &p)
	if err != nil {
		return nil, err
	}
	e := &uringEngine{q: newQueues(depth), fd: fd, efd: -1, depth: depth, done: make(chan struct{})}
	defer func() {
		if err != nil {
			e.release()
		}
	}()
	if p.sqEntries < uint32(depth)+1 || p.cqEntries < p.sqEntries {
		return nil, fmt.Errorf("io_uring: got %d SQ / %d CQ entries for depth %d", p.sqEntries, p.cqEntries, depth)
	}
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*uint32(unsafe.Sizeof(uringCQE{})))
	const prot, flags = unix.PROT_READ | unix.PROT_WRITE, unix.MAP_SHARED | unix.MAP_POPULATE
	if p.features&uringFeatSingleMmap != 0 {
		size := max(sqSize, cqSize)
		if e.sqMem, err = unix.Mmap(fd, uringOffSQRing, size, prot, flags); err != nil {
			return nil, fmt.Errorf("io_uring: mmap rings: %w", err)
		}
		e.cqMem = e.sqMem
	} else {
		if e.sqMem, err = unix.Mmap(fd, uringOffSQRing, sqSize, prot, flags); err != nil {
			return nil, fmt.Errorf("io_uring: mmap SQ ring: %w", err)
		}
		if e.cqMem, err = unix.Mmap(fd, uringOffCQRing, cqSize, prot, flags); err != nil {
			return nil, fmt.Errorf("io_uring: mmap CQ ring: %w", err)
		}
	}
	if e.sqeMem, err = unix.Mmap(fd, uringOffSQEs, int(p.sqEntries)*int(unsafe.Sizeof(uringSQE{})), prot, flags); err != nil {
		return nil, fmt.Errorf("io_uring: mmap SQEs: %w", err)
	}
	e.sqHead = (*uint32)(unsafe.Pointer(&e.sqMem[p.sqOff.head]))
	e.sqTail = (*uint32)(unsafe.Pointer(&e.sqMem[p.sqOff.tail]))
	e.sqMask = *(*uint32)(unsafe.Pointer(&e.sqMem[p.sqOff.ringMask]))
	e.sqArray = unsafe.Pointer(&e.sqMem[p.sqOff.array])
	e.sqes = unsafe.Pointer(&e.sqeMem[0])
	e.cqHead = (*uint32)(unsafe.Pointer(&e.cqMem[p.cqOff.head]))
	e.cqTail = (*uint32)(unsafe.Pointer(&e.cqMem[p.cqOff.tail]))
	e.cqMask = *(*uint32)(unsafe.Pointer(&e.cqMem[p.cqOff.ringMask]))
	e.cqes = unsafe.Pointer(&e.cqMem[p.cqOff.cqes])
	e.sqTailLocal = atomic.LoadUint32(e.sqTail)

	if e.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("io_uring: eventfd: %w", err)
	}
	e.wakeBuf = make([]byte, 8)
	e.slots = make([]*Request, depth)
	e.free = make([]uint32, depth)
	for i := range e.free {
		e.free[i] = uint32(depth - 1 - i)
	}
	go e.loop()
	return e, nil
}

func (e *uringEngine) Kind() string { return EngineUring }

func (e *uringEngine) Submit(req *Request) error {
	// The loop stores sleeping=true before its last look at the channels; if it
	// missed this request it will block in io_uring_enter, and the eventfd wakes it.
	// The wake runs under the queues' read lock, so the eventfd is still open.
	return e.q.submit(req, e.wakeIfSleeping)
}

func (e *uringEngine) wakeIfSleeping() {
	if e.sleeping.Load() && e.sleeping.CompareAndSwap(true, false) {
		e.wake()
	}
}

func (e *uringEngine) wake() {
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	for {
		if _, err := unix.Write(e.efd, one[:]); err != unix.EINTR {
			return // EAGAIN means the counter is already non-zero: awake enough
		}
	}
}

func (e *uringEngine) Close() error {
	e.q.close()
	<-e.done
	return nil
}

func (e *uringEngine) inflight() int { return e.readInflight + e.writeInflight }

func (e *uringEngine) loop() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer close(e.done)
	defer e.release()

	rc, wc := e.q.readCh, e.q.writeCh
	for {
		open := rc != nil || wc != nil
		if open && !e.wakeArmed {
			e.armWake()
		}
		prepped := false
		for e.inflight() < e.depth {
			req := tryNext(&rc, &wc, e.readInflight, e.writeInflight)
			if req == nil {
				break
			}
			prepped = e.prep(req) || prepped
		}
		if e.inflight() == 0 && !prepped {
			if rc == nil && wc == nil {
				break
			}
			// Idle: park in Go until work or Close arrives (no syscall while idle).
			if req := waitNext(&rc, &wc); req != nil {
				e.prep(req)
			}
			continue
		}
		minComplete := uint32(0)
		if !prepped {
			// Nothing new to submit: wait for a completion, or for Submit to wake us
			// when a slot is free and the channels are open.
			if e.inflight() < e.depth && (rc != nil || wc != nil) {
				e.sleeping.Store(true)
				if req := tryNext(&rc, &wc, e.readInflight, e.writeInflight); req != nil {
					e.sleeping.Store(false)
					e.prep(req)
					continue
				}
			}
			minComplete = 1
		}
		e.enter(minComplete)
		e.sleeping.Store(false)
		e.reap()
	}

	// Channels closed and every IO completed: retire the eventfd read before the
	// rings and its buffer go away.
	if e.wakeArmed {
		e.wake()
		for e.wakeArmed {
			e.enter(1)
			e.reap()
		}
	}
}

// prep turns a request into an SQE; it reports false when the file's Shape failed
// the request without IO (completed here, no slot used).
func (e *uringEngine) prep(req *Request) bool {
	buf, err := req.File.Shape(req.Op, req.Buf, req.Off)
	if err == nil && len(buf) > maxIOSize {
		err = fmt.Errorf("io of %d bytes is above the %d-byte limit of one request", len(buf), maxIOSize)
	}
	if err != nil {
		req.complete(0, err)
		return false
	}
	slot := e.free[len(e.free)-1]
	e.free = e.free[:len(e.free)-1]
	e.slots[slot] = req // the request (and through it the buffer) stays referenced until its CQE
	op := uint8(uringOpRead)
	if req.Op == OpWrite {
		op = uringOpWrite
		e.writeInflight++
	} else {
		e.readInflight++
	}
	sqe := uringSQE{
		opcode:   op,
		fd:       int32(req.File.Fd()),
		off:      uint64(req.Off),
		addr:     uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf)))),
		len:      uint32(len(buf)),
		userData: uint64(slot),
	}
	if req.Head != nil {
		// The iovecs live in the request, which the slot keeps referenced (and with
		// it both buffers) until the CQE.
		req.iov[0] = unix.Iovec{Base: unsafe.SliceData(req.Head)}
		req.iov[0].SetLen(len(req.Head))
		req.iov[1] = unix.Iovec{Base: unsafe.SliceData(buf)}
		req.iov[1].SetLen(len(buf))
		sqe.opcode, sqe.addr, sqe.len = uringOpReadv, uint64(uintptr(unsafe.Pointer(&req.iov[0]))), 2
	}
	e.push(sqe)
	return true
}

func (e *uringEngine) armWake() {
	e.push(uringSQE{
		opcode:   uringOpRead,
		fd:       int32(e.efd),
		addr:     uint64(uintptr(unsafe.Pointer(&e.wakeBuf[0]))),
		len:      uint32(len(e.wakeBuf)),
		userData: wakeTag,
	})
	e.wakeArmed = true
}

func (e *uringEngine) push(s uringSQE) {
	idx := e.sqTailLocal & e.sqMask
	*(*uringSQE)(unsafe.Add(e.sqes, uintptr(idx)*unsafe.Sizeof(uringSQE{}))) = s
	*(*uint32)(unsafe.Add(e.sqArray, uintptr(idx)*4)) = idx
	e.sqTailLocal++
	atomic.StoreUint32(e.sqTail, e.sqTailLocal) // publishes the SQE to the kernel
}

// enter submits every SQE the kernel has not consumed yet and, if minComplete > 0,
// waits for that many completions.
func (e *uringEngine) enter(minComplete uint32) {
	for {
		toSubmit := e.sqTailLocal - atomic.LoadUint32(e.sqHead)
		flags := uintptr(0)
		if minComplete > 0 {
			flags = uringEnterGetEvents
		}
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(e.fd), uintptr(toSubmit), uintptr(minComplete), flags, 0, 0)
		switch errno {
		case 0:
			if e.sqTailLocal == atomic.LoadUint32(e.sqHead) {
				return
			}
			// Not everything was consumed: try again (completions are reaped by the
			// caller; a short pause avoids spinning on a kernel out of resources).
			time.Sleep(50 * time.Microsecond)
		case unix.EINTR:
			// Submission may have happened; the SQ head tells. Retry the wait.
		case unix.EAGAIN, unix.EBUSY:
			if atomic.LoadUint32(e.cqTail) != atomic.LoadUint32(e.cqHead) {
				return // let the caller reap, then come back
			}
			time.Sleep(50 * time.Microsecond)
		default:
			panic(fmt.Sprintf("BUG: io_uring_enter: %v", errno))
		}
	}
}

func (e *uringEngine) reap() {
	head := atomic.LoadUint32(e.cqHead)
	tail := atomic.LoadUint32(e.cqTail) // acquire: CQEs up to tail are written
	for ; head != tail; head++ {
		c := *(*uringCQE)(unsafe.Add(e.cqes, uintptr(head&e.cqMask)*unsafe.Sizeof(uringCQE{})))
		if c.userData == wakeTag {
			e.wakeArmed = false
			continue
		}
		req := e.slots[c.userData]
		if req == nil {
			panic(fmt.Sprintf("BUG: io_uring completion for free slot %d", c.userData))
		}
		e.slots[c.userData] = nil
		e.free = append(e.free, uint32(c.userData))
		if req.Op == OpWrite {
			e.writeInflight--
		} else {
			e.readInflight--
		}
		if c.res < 0 {
			req.complete(0, syscall.Errno(-c.res))
		} else {
			req.complete(int(c.res), nil)
		}
	}
	atomic.StoreUint32(e.cqHead, head) // hands the CQ slots back to the kernel
}

// release unmaps the rings and closes the descriptors. Nothing is in flight: either
// setup failed or the loop retired every request.
func (e *uringEngine) release() {
	if e.sqeMem != nil {
		_ = unix.Munmap(e.sqeMem)
	}
	if e.cqMem != nil && !sameMem(e.cqMem, e.sqMem) {
		_ = unix.Munmap(e.cqMem)
	}
	if e.sqMem != nil {
		_ = unix.Munmap(e.sqMem)
	}
	e.sqeMem, e.cqMem, e.sqMem = nil, nil, nil
	if e.efd >= 0 {
		_ = unix.Close(e.efd)
		e.efd = -1
	}
	if e.fd >= 0 {
		_ = unix.Close(e.fd)
		e.fd = -1
	}
}

func sameMem(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}
