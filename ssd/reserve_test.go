package ssd

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// smallFS mounts a tmpfs of the given size (mount(8) syntax, "8m") on a fresh
// directory and unmounts it at cleanup; it skips when mounting is not permitted.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root or CAP_SYS_ADMIN): %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func reserveOptions(dir string, limit int64) Options {
	return Options{Cluster: "c", InstanceKey: "i", Paths: []string{dir}, Limits: []int64{limit},
		Engine: EnginePsync, BufferedIO: ProbeDirectIO(dir) != nil}
}

// TestReserveFailsWithoutSpace: a limit larger than the file system is a start-up
// error that names the limit, the flag and the free space, and leaves that space
// free; a limit that fits works.
func TestReserveFailsWithoutSpace(t *testing.T) {
	checkLeaks(t)
	dir := smallFS(t, "8m")
	_, err := Open(reserveOptions(dir, 16<<20))
	if err == nil {
		t.Fatal("16 MiB limit on an 8 MiB file system opened")
	}
	t.Logf("start-up error: %v", err)
	for _, want := range []string{"large_file_paths[0] " + dir + ":", "cannot reserve 16MiB", "large_limit_size / --ssd-limit",
		"fallocate", "no space left on device", "MiB free"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("error %q lacks %q", err, want)
		}
	}
	if !errors.Is(err, unix.ENOSPC) || !errors.Is(err, ErrLimit) {
		t.Fatalf("error does not wrap ENOSPC and ErrLimit: %v", err)
	}
	if free, err := freeBytes(dir); err != nil || free < 7<<20 {
		t.Fatalf("after the failed start %d bytes free (%v): the partial reservation was not given back", free, err)
	}

	s, err := Open(reserveOptions(dir, 4<<20))
	if err != nil {
		t.Fatalf("4 MiB limit on an 8 MiB file system: %v", err)
	}
	if free, _ := freeBytes(dir); free > 4<<20+512<<10 {
		t.Fatalf("%d bytes still free: the shard files were not reserved", free)
	}
	persist(t, s, "k", 1, pattern("k", 1<<20))
	dst := make([]byte, 1<<20)
	if err := s.LoadInto("k", 1, dst, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReserveWithoutFallocate: where the file system cannot preallocate, the files
// stay sparse, but only if the free space covers the limit.
func TestReserveWithoutFallocate(t *testing.T) {
	checkLeaks(t)
	dir := smallFS(t, "8m")
	noFallocate := func(o *Options) Options {
		o.fallocate = func(int, int64) error { return unix.EOPNOTSUPP }
		return *o
	}
	o := reserveOptions(dir, 16<<20)
	_, err := Open(noFallocate(&o))
	if err == nil || !strings.Contains(err.Error(), "cannot reserve 16MiB (large_limit_size / --ssd-limit)") ||
		!strings.Contains(err.Error(), "cannot preallocate") || !strings.Contains(err.Error(), "MiB free") || !errors.Is(err, ErrLimit) {
		t.Fatalf("16 MiB sparse limit on 8 MiB: %v", err)
	}
	o = reserveOptions(dir, 4<<20)
	s, err := Open(noFallocate(&o))
	if err != nil {
		t.Fatalf("4 MiB sparse limit on 8 MiB: %v", err)
	}
	if free, _ := freeBytes(dir); free < 7<<20 {
		t.Fatalf("%d bytes free: sparse files took space", free)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
