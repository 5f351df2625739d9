package wire

import (
	"os"
	"path/filepath"
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

// DefaultSocket is DefaultDir()/fluxkv.sock, overridden by $FLUXKV_SOCKET.
func DefaultSocket() string {
	if s := os.Getenv("FLUXKV_SOCKET"); s != "" {
		return s
	}
	return filepath.Join(DefaultDir(), SocketName)
}
