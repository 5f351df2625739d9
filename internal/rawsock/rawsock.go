// Package rawsock reads and writes connected sockets with raw system calls, waiting for
// readiness (and honouring the connection's deadlines) through Go's poller as a net.Conn
// does.
//
// Why: a net.Conn read or write enters the runtime's system-call state, and when every
// P of the process was idle (a server between two small calls) that entry wakes the
// runtime's sysmon thread out of its deep sleep: a futex wake and a context switch on
// another CPU per call. In the owner's loop of 4 KiB gets that was 40 % of its CPU
// (docs/benchmarks.md, "Sockets without sysmon's wake-ups"). A read or write of a
// non-blocking socket never blocks, so it needs no system-call state; reads and writes
// are cut into pieces of at most MaxIO bytes so that no raw call holds its P for long.
//
// Under the race detector the calls are syscall.Read and syscall.Write, whose
// annotations tell the detector that a write on a socket happens before the read of it
// (sys_race.go).
package rawsock

import (
	"io"
	"net"
	"os"
	"syscall"
)

// MaxIO is the most one raw read(2) or write(2) is given: a larger write is several
// calls, a larger read returns at most this much.
const MaxIO = 256 << 10

// Conn is the raw read and write side of a socket; deadlines, Close and the addresses
// stay the net.Conn's. It is safe for one reader and one writer at a time, as a
// net.Conn is.
type Conn struct {
	c  net.Conn
	rc syscall.RawConn
}

// New returns the raw side of c when c is a socket (a syscall.Conn), or c itself.
func New(c net.Conn) io.ReadWriter {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{c: c, rc: rc}
}

// Read reads at most len(p) bytes once some are there; io.EOF at the peer's end.
func (s *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	p = p[:min(len(p), MaxIO)]
	err := s.rc.Read(func(fd uintptr) bool {
		for {
			r, e := read(fd, p)
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // wait for the poller (or the read deadline)
			}
			n, errno = r, e
			return true
		}
	})
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, s.opError("read", errno)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, waiting for room (within the write deadline) as needed; n is
// what was written.
func (s *Conn) Write(p []byte) (n int, err error) {
	var errno syscall.Errno
	err = s.rc.Write(func(fd uintptr) bool {
		for n < len(p) {
			r, e := write(fd, p[n:min(len(p), n+MaxIO)])
			switch e {
			case 0:
				if r == 0 { // (not from a socket; a loop otherwise)
					errno = syscall.EIO
					return true
				}
				n += r
			case syscall.EINTR:
			case syscall.EAGAIN:
				return false // wait for room
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err != nil {
		return n, err
	}
	if errno != 0 {
		return n, s.opError("write", errno)
	}
	return n, nil
}

// opError is the error a net.Conn returns for a failed system call.
func (s *Conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: s.c.LocalAddr().Network(), Source: s.c.LocalAddr(), Addr: s.c.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}
