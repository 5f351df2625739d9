package shm

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func dialOK(t *testing.T, path string) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	c.Close()
}

func TestListenUnixModeAndUnlinkOnClose(t *testing.T) {
	checkFds(t)
	for _, tc := range []struct {
		mode, want os.FileMode
	}{
		{0, 0o660},
		{0o600, 0o600},
		{0o666, 0o666},
	} {
		path := filepath.Join(t.TempDir(), "fluxkv.sock")
		l, err := ListenUnix(path, tc.mode)
		if err != nil {
			t.Fatalf("ListenUnix(%v): %v", tc.mode, err)
		}
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != tc.want {
			t.Errorf("ListenUnix(%v): file mode %v, want socket %v", tc.mode, fi.Mode(), tc.want)
		}
		dialOK(t, path)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("socket file after Close: %v, want it removed", err)
		}
	}
}

func TestListenUnixRemovesStaleSocket(t *testing.T) {
	checkFds(t)
	path := filepath.Join(t.TempDir(), "fluxkv.sock")
	old, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	old.SetUnlinkOnClose(false) // a daemon that died without cleaning up
	old.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("stale socket missing: %v", err)
	}
	l, err := ListenUnix(path, 0)
	if err != nil {
		t.Fatalf("ListenUnix over a stale socket: %v", err)
	}
	defer l.Close()
	dialOK(t, path)
}

func TestListenUnixRefusesLiveSocket(t *testing.T) {
	checkFds(t)
	path := filepath.Join(t.TempDir(), "fluxkv.sock")
	l, err := ListenUnix(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l2, err := ListenUnix(path, 0)
	if err == nil {
		l2.Close()
		t.Fatal("second ListenUnix on a live socket succeeded")
	}
	if !errors.Is(err, ErrSocketInUse) || !strings.Contains(err.Error(), "another daemon") {
		t.Errorf("second ListenUnix = %v, want ErrSocketInUse", err)
	}
	// The first daemon keeps serving.
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the first daemon: %v", err)
	}
	defer c.Close()
	// The probe's connection is in the backlog first; accept it and ours.
	for range 2 {
		a, err := l.Accept()
		if err != nil {
			t.Fatalf("accept: %v", err)
		}
		a.Close()
	}
}

func TestListenUnixRefusesNonSocket(t *testing.T) {
	checkFds(t)
	dir := t.TempDir()

	file := filepath.Join(dir, "regular")
	if err := os.WriteFile(file, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "dir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(dir, "live.sock")
	l, err := ListenUnix(live, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(live, link); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ path, want string }{
		{file, "regular file: not a socket"},
		{sub, "directory: not a socket"},
		{link, "symlink: not a socket"},
	} {
		l, err := ListenUnix(tc.path, 0)
		if err == nil {
			l.Close()
			t.Errorf("ListenUnix(%s) succeeded", tc.path)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ListenUnix(%s) = %v, want %q", tc.path, err, tc.want)
		}
		if _, err := os.Lstat(tc.path); err != nil {
			t.Errorf("%s after the refusal: %v", tc.path, err)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "precious" {
		t.Errorf("regular file after the refusal: %q, %v", b, err)
	}
}

func TestListenUnixBadPaths(t *testing.T) {
	checkFds(t)
	for _, tc := range []struct{ path, want string }{
		{"", "empty"},
		{"/tmp/" + strings.Repeat("x", 120), "at most 107"},
		{filepath.Join(t.TempDir(), "missing", "fluxkv.sock"), "no such file"},
	} {
		l, err := ListenUnix(tc.path, 0)
		if err == nil {
			l.Close()
			t.Errorf("ListenUnix(%q) succeeded", tc.path)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ListenUnix(%.30q) = %v, want %q", tc.path, err, tc.want)
		}
	}
}
