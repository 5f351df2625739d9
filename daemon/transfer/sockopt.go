package transfer

import (
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// tune sets the socket options of a data-plane connection: TCP_NODELAY (small status
// headers go out at once) and TCP_USER_TIMEOUT (a peer that stops acknowledging fails
// the connection after userTimeout instead of the kernel's ~15 minutes of
// retransmissions).
func tune(tc *net.TCPConn, userTimeout time.Duration, sockBuf int) error {
	if err := tc.SetNoDelay(true); err != nil {
		return fmt.Errorf("TCP_NODELAY: %w", err)
	}
	if sockBuf > 0 { // measured against autotuning in BenchmarkPull
		tc.SetReadBuffer(sockBuf)
		tc.SetWriteBuffer(sockBuf)
	}
	if userTimeout <= 0 {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout/time.Millisecond))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("TCP_USER_TIMEOUT: %w", err)
	}
	return nil
}

// tuningListener sets the socket options of every connection it accepts, before
// auth.Listener wraps it.
type tuningListener struct {
	*net.TCPListener
	userTimeout time.Duration
	sockBuf     int
}

func (l tuningListener) Accept() (net.Conn, error) {
	tc, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	tune(tc, l.userTimeout, l.sockBuf) // best effort: a connection without the options still works
	return tc, nil
}
