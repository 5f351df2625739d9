package ssd

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckSpace: a limit beyond the free space is refused before anything is created,
// naming the path, the limit and what fits; the space this owner's shard files from an
// earlier run hold counts as free (Open gives it back); a path not created yet is
// checked on the file system it will be created on.
func TestCheckSpace(t *testing.T) {
	checkLeaks(t)
	dir := smallFS(t, "8m")
	sub := filepath.Join(dir, "not", "yet")
	err := CheckSpace(reserveOptions(sub, 16<<20))
	if !errors.Is(err, ErrLimit) {
		t.Fatalf("16 MiB limit on an 8 MiB file system: %v, want ErrLimit", err)
	}
	for _, want := range []string{"large_file_paths[0] " + sub + ":", "cannot reserve 16MiB", "--ssd-limit", "MiB free", "at most", "fits"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q lacks %q", err, want)
		}
	}
	if err := CheckSpace(reserveOptions(sub, 4<<20)); err != nil {
		t.Fatalf("4 MiB limit on an 8 MiB file system: %v", err)
	}

	s, err := Open(reserveOptions(dir, 5<<20))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// ~3 MiB free now, but the 5 MiB the old shard files hold come back at start.
	if err := CheckSpace(reserveOptions(dir, 7<<20)); err != nil {
		t.Fatalf("7 MiB limit over 5 MiB of old shard files on 8 MiB: %v", err)
	}
	if err := CheckSpace(reserveOptions(sub, 7<<20)); !errors.Is(err, ErrLimit) {
		t.Fatalf("7 MiB limit under another cache root (old shard files not its own): %v, want ErrLimit", err)
	}
	s, err = Open(reserveOptions(dir, 7<<20))
	if err != nil {
		t.Fatalf("7 MiB limit over 5 MiB of old shard files: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
