package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cred is a Unix socket peer's identity as the kernel recorded it when the connection
// was made (SO_PEERCRED): it cannot be forged by the peer.
type Cred struct {
	Pid      int32
	Uid, Gid uint32
	// Groups are the peer's supplementary groups when it connected (SO_PEERGROUPS);
	// empty when it has none.
	Groups []uint32
}

// InGroup reports whether gid is the peer's primary group or one of its
// supplementary groups.
func (c Cred) InGroup(gid uint32) bool {
	if c.Gid == gid {
		return true
	}
	for _, g := range c.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

// PeerCred returns the credentials of conn's peer.
func PeerCred(conn *net.UnixConn) (Cred, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer cred: %w", err)
	}
	uc, err := peerUcred(rc)
	if err != nil {
		return Cred{}, err
	}
	var uerr error
	var groups []uint32
	if err := rc.Control(func(s uintptr) { groups, uerr = peerGroups(int(s)) }); err != nil {
		return Cred{}, fmt.Errorf("peer groups: %w", err)
	}
	if uerr != nil {
		return Cred{}, fmt.Errorf("peer groups: getsockopt SO_PEERGROUPS: %w", uerr)
	}
	return Cred{Pid: uc.Pid, Uid: uc.Uid, Gid: uc.Gid, Groups: groups}, nil
}

// PeerUID returns the uid of conn's peer (SO_PEERCRED alone).
func PeerUID(conn *net.UnixConn) (uint32, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("peer cred: %w", err)
	}
	uc, err := peerUcred(rc)
	if err != nil {
		return 0, err
	}
	return uc.Uid, nil
}

func peerUcred(rc syscall.RawConn) (*unix.Ucred, error) {
	var uc *unix.Ucred
	var uerr error
	if err := rc.Control(func(s uintptr) {
		uc, uerr = unix.GetsockoptUcred(int(s), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("peer cred: %w", err)
	}
	if uerr != nil {
		return nil, fmt.Errorf("peer cred: getsockopt SO_PEERCRED: %w", uerr)
	}
	return uc, nil
}

// maxPeerGroups bounds SO_PEERGROUPS' answer (Linux's NGROUPS_MAX is 65536).
const maxPeerGroups = 65536

// peerGroups reads SO_PEERGROUPS, growing the buffer while the kernel answers ERANGE
// (it then reports the size it needs).
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]byte, 64*4)
	for {
		n := uint32(len(buf))
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch {
		case e == 0:
			out := make([]uint32, 0, n/4)
			for i := uint32(0); i+4 <= n; i += 4 {
				out = append(out, binary.NativeEndian.Uint32(buf[i:]))
			}
			return out, nil
		case errors.Is(e, unix.ERANGE) && n > uint32(len(buf)) && n <= maxPeerGroups*4:
			buf = make([]byte, n)
		default:
			return nil, e
		}
	}
}
