//go:build race

package rawsock

import "syscall"

// read and write under the race detector: syscall's, whose annotations order a write on
// a socket before the read of it (and check the buffers), as with a net.Conn. The raw
// calls would make a test's "the handler set x, then replied" a reported race.
func read(fd uintptr, p []byte) (int, syscall.Errno) {
	return errnoOf(syscall.Read(int(fd), p))
}

func write(fd uintptr, p []byte) (int, syscall.Errno) {
	return errnoOf(syscall.Write(int(fd), p))
}

func errnoOf(n int, err error) (int, syscall.Errno) {
	if err != nil {
		return max(n, 0), err.(syscall.Errno)
	}
	return n, 0
}
