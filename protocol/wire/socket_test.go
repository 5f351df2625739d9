package wire

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// CheckDir takes a directory of this process's user (or root), says whether others
// may write it, and refuses one owned by another user.
func TestCheckDir(t *testing.T) {
	own := t.TempDir()
	if shared, err := CheckDir(own); err != nil || shared {
		t.Fatalf("the process's own directory: shared %v, %v", shared, err)
	}
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o1777); err != nil { // past the umask; sticky as /tmp
		t.Fatal(err)
	}
	if shared, err := CheckDir(open); err != nil || !shared {
		t.Fatalf("a directory anyone may write: shared %v, %v", shared, err)
	}
	file := filepath.Join(own, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckDir(file); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("a file: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("giving a directory to another user takes root")
	}
	theirs := filepath.Join(t.TempDir(), "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, -1); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckDir(theirs); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Fatalf("another user's directory: %v", err)
	}
}

// The default socket is $FLUXKV_SOCKET, else this user's node's under
// $XDG_RUNTIME_DIR when there is one, else the system's in /run/fluxkv (a login sets
// XDG_RUNTIME_DIR whether or not the user runs a node).
func TestDefaultSocket(t *testing.T) {
	runtime := t.TempDir()
	t.Setenv("FLUXKV_SOCKET", "")
	t.Setenv("XDG_RUNTIME_DIR", runtime)
	if got := DefaultSocket(); got != "/run/fluxkv/fluxkv.sock" {
		t.Errorf("no node under XDG_RUNTIME_DIR: %s", got)
	}
	own := filepath.Join(runtime, "fluxkv", SocketName)
	if err := os.MkdirAll(filepath.Dir(own), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(own, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := DefaultSocket(); got != own {
		t.Errorf("a node under XDG_RUNTIME_DIR: %s, want %s", got, own)
	}
	t.Setenv("FLUXKV_SOCKET", "/x/y.sock")
	if got := DefaultSocket(); got != "/x/y.sock" {
		t.Errorf("FLUXKV_SOCKET set: %s", got)
	}
}
