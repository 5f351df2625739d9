package ssd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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

// TestCheckDirectIOLeavesAFullDiskToOpen: the start's O_DIRECT probe writes a 4 KiB
// file; on a disk the last run's shard files filled (which Open truncates, and
// CheckSpace counts as free), its ENOSPC is not a refusal: refused (exit 2), the owner
// never started again (a review). A file system without O_DIRECT still is.
func TestCheckDirectIOLeavesAFullDiskToOpen(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Skipf("cannot mount a tmpfs (not root?): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	if err := ProbeDirectIO(dir); err != nil {
		t.Skipf("this kernel's tmpfs takes no O_DIRECT: %v", err)
	}
	fill, err := os.Create(filepath.Join(dir, "shard-0.dat"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := fill.Write(make([]byte, 4096)); err != nil {
			break // full
		}
	}
	fill.Close()
	opts := Options{Cluster: "c", InstanceKey: "n1", Paths: []string{filepath.Join(dir, "ssd")}, Limits: []int64{32 << 10}}
	if err := ProbeDirectIO(dir); !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("probe on the full disk: %v; want ENOSPC (the test did not fill it)", err)
	}
	if err := CheckDirectIO(opts); err != nil {
		t.Errorf("CheckDirectIO on a full disk: %v; want nil (left to Open)", err)
	}
}

// TestProbeDirectIORefusesFourKiBSectors: a device of 4 KiB logical sectors (reads off a
// 4 KiB granule fail EINVAL) is refused before the tier opens, with the reason: on kernels
// before 6.1, which do not report direct IO's alignment, the tier opened and then failed
// every read of a record at a 512-byte step (a review).
func TestProbeDirectIORefusesFourKiBSectors(t *testing.T) {
	dir := t.TempDir()
	if err := ProbeDirectIO(dir); err != nil {
		t.Skipf("no O_DIRECT under %s: %v", dir, err)
	}
	defer func(orig func(int, []byte, int64) (int, error)) { probePread = orig }(probePread)
	probePread = func(fd int, p []byte, off int64) (int, error) {
		if off%4096 != 0 || len(p)%4096 != 0 {
			return 0, unix.EINVAL
		}
		return unix.Pread(fd, p, off)
	}
	opts := Options{Cluster: "c", InstanceKey: "n1", Paths: []string{filepath.Join(dir, "ssd")}, Limits: []int64{1 << 20}}
	if err := CheckDirectIO(opts); err == nil || !strings.Contains(err.Error(), "4 KiB logical sectors") {
		t.Fatalf("CheckDirectIO on a device of 4 KiB sectors: %v", err)
	}
}
