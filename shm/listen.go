package shm

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"
)

// DefaultSocketMode is the permission daemons give their sockets: the owner and its
// group may connect, nobody else.
const DefaultSocketMode os.FileMode = 0o660

// ErrSocketInUse means another process is accepting connections on the socket path.
var ErrSocketInUse = errors.New("shm: socket in use")

// MaxSocketPath is the longest path sockaddr_un holds (sun_path is 108 bytes,
// NUL-terminated).
const MaxSocketPath = 107

// probeTimeout bounds the connect that tells a live socket from a stale one.
const probeTimeout = time.Second

// CheckSocketPath refuses a socket path longer than sockaddr_un holds.
func CheckSocketPath(path string) error {
	if len(path) > MaxSocketPath {
		return fmt.Errorf("path is %d bytes, a Unix socket path holds at most %d", len(path), MaxSocketPath)
	}
	return nil
}

// ListenUnix listens on a Unix stream socket at path the way a daemon people trust
// does (tailscale safesocket):
//   - if a socket exists at path and a connect to it succeeds, another daemon is
//     serving there: it returns an error wrapping ErrSocketInUse and touches nothing;
//   - if a socket exists and connecting is refused, it is stale and is removed;
//   - any other file at path (regular file, directory, ...) is never removed: error;
//   - it listens, chmods the socket to mode (mode 0 means DefaultSocketMode) and sets
//     SetUnlinkOnClose(true) so Close removes the file.
//
// The parent directory must exist. The socket briefly has the permissions the process
// umask gives it before the chmod; with the usual umask (022 or stricter) that window is
// narrower than mode, never wider. Two daemons starting at the same instant on the same
// path are not arbitrated here (run one unit per path).
func ListenUnix(path string, mode os.FileMode) (*net.UnixListener, error) {
	if path == "" {
		return nil, errors.New("listen unix: empty socket path")
	}
	if err := CheckSocketPath(path); err != nil {
		return nil, fmt.Errorf("listen unix %q: %w", path, err)
	}
	if mode == 0 {
		mode = DefaultSocketMode
	}
	if err := clearStale(path); err != nil {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen unix %q: %w", path, err)
	}
	l.SetUnlinkOnClose(true)
	if err := os.Chmod(path, mode.Perm()); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen unix %q: chmod %v: %w", path, mode.Perm(), err)
	}
	return l, nil
}

// clearStale makes path free for a new socket: it removes a stale socket, and refuses
// a live socket or any file that is not a socket.
func clearStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listen unix %q: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("listen unix %q: refusing to remove existing %s: not a socket", path, describeType(fi.Mode()))
	}
	c, err := net.DialTimeout("unix", path, probeTimeout)
	if err == nil {
		c.Close()
		return fmt.Errorf("listen unix %q: %w: another daemon is serving there", path, ErrSocketInUse)
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		// Stale: nobody listens on it any more.
	case errors.Is(err, syscall.ENOENT):
		return nil // removed between Lstat and connect
	default:
		// EACCES, EAGAIN (a live but saturated backlog), a timeout: we cannot prove
		// the socket is dead, so we leave it alone.
		return fmt.Errorf("listen unix %q: cannot tell whether the existing socket is in use: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("listen unix %q: remove stale socket: %w", path, err)
	}
	return nil
}

func describeType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "regular file"
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeDevice != 0:
		return "device"
	default:
		return "file of type " + m.Type().String()
	}
}
