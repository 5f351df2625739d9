package wire

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// SocketName is the one path users and configs name: DIR/fluxkv.sock, the attach socket.
const SocketName = "fluxkv.sock"

// RPCSocketPath derives the RPC socket's path from the attach socket's path. The attach
// reply announces it too, so clients never configure it.
func RPCSocketPath(attach string) string { return attach + ".rpc" }

// DefaultDir is where a node's sockets live by default: $XDG_RUNTIME_DIR/fluxkv, else /run/fluxkv.
func DefaultDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "fluxkv")
	}
	return "/run/fluxkv"
}

// DefaultSocket is the socket clients attach to by default: $FLUXKV_SOCKET, else
// $XDG_RUNTIME_DIR/fluxkv/fluxkv.sock when it exists (a node this user runs), else
// /run/fluxkv/fluxkv.sock (the system's node: a login sets XDG_RUNTIME_DIR, and the
// systemd owner listens in /run/fluxkv).
func DefaultSocket() string {
	if s := os.Getenv("FLUXKV_SOCKET"); s != "" {
		return s
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		if p := filepath.Join(d, "fluxkv", SocketName); exists(p) {
			return p
		}
	}
	return filepath.Join("/run/fluxkv", SocketName)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// CheckDir refuses dir as a node's directory (its sockets, and for `up` its cluster
// secret and master key) when it is owned by another user than this process's or root
// (a directory under /tmp another user made first), who could replace what is in it.
// shared reports a directory others may write (/tmp, a Kubernetes emptyDir): they
// could replace its sockets too, which the caller warns about.
func CheckDir(dir string) (shared bool, err error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return false, err
	}
	if !fi.IsDir() {
		return false, fmt.Errorf("%s is not a directory", dir)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false, fmt.Errorf("directory %s: cannot read its owner", dir)
	}
	if uid := int(st.Uid); uid != 0 && uid != os.Geteuid() {
		return false, fmt.Errorf("directory %s is owned by uid %d, neither root nor this process's user (uid %d), who could replace its sockets and files: use a directory of this user's",
			dir, uid, os.Geteuid())
	}
	return fi.Mode().Perm()&0o002 != 0, nil
}
