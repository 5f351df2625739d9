package shm

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Cred is a Unix socket peer's identity as the kernel recorded it when the connection
// was made (SO_PEERCRED): it cannot be forged by the peer.
type Cred struct {
	Pid      int32
	Uid, Gid uint32
}

// PeerCred returns the credentials of conn's peer.
func PeerCred(conn *net.UnixConn) (Cred, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer cred: %w", err)
	}
	var uc *unix.Ucred
	var uerr error
	if err := rc.Control(func(s uintptr) {
		uc, uerr = unix.GetsockoptUcred(int(s), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("peer cred: %w", err)
	}
	if uerr != nil {
		return Cred{}, fmt.Errorf("peer cred: getsockopt SO_PEERCRED: %w", uerr)
	}
	return Cred{Pid: uc.Pid, Uid: uc.Uid, Gid: uc.Gid}, nil
}
