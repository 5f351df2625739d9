package proctest

import (
	"io"
	"os"
	"path/filepath"
)

// TB is the part of testing.TB this package uses; *testing.T and *testing.B have it.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// SelfCopy copies the running test binary into a fresh directory that every uid may
// read and search (the go tool's build directories are private), and returns the
// copy's path: for tests that run part of themselves as another uid (setpriv). The
// directory is removed when the test ends.
func SelfCopy(t TB) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "fluxkv-selfcopy-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	exe := filepath.Join(dir, filepath.Base(self))
	dst, err := os.OpenFile(exe, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return exe
}
