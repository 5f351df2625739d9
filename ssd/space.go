package ssd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// cacheRoot is this owner's cache root under a large_file_paths entry:
// <path>/<Cluster>_cluster_kv_ssd_storage/<safe InstanceKey>.
func cacheRoot(o *Options, path string) string {
	return filepath.Join(path, safeName(o.Cluster)+"_cluster_kv_ssd_storage", safeName(o.InstanceKey))
}

// CheckSpace reports, before anything is created, a limit the file system under its
// path cannot hold: more than its free space plus what this owner's shard files from
// an earlier run hold (Open truncates them). A path on the device of an earlier path
// is skipped, as Open skips it; a path whose file system cannot be asked (statfs
// failing, or a file system that reports no size) is left to Open. The error wraps
// ErrLimit and names the path, the limit and what fits. Open can still fail on what
// this cannot see (file system overhead, quotas, the largest file): those failures
// wrap ErrLimit too.
func CheckSpace(opts Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	opts.setDefaults()
	seen := make(map[uint64]bool)
	for i, p := range opts.Paths {
		root := cacheRoot(&opts, p)
		dir, err := existingAncestor(root)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(dir, &st); err != nil {
			continue
		}
		if seen[st.Dev] {
			continue
		}
		seen[st.Dev] = true
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil || fs.Blocks == 0 {
			continue
		}
		free := int64(fs.Bavail) * int64(fs.Bsize)
		held := shardBytes(root)
		limit := opts.Limits[i]
		n := shardCount(limit, opts.ShardsPerDevice, opts.minShardSize)
		want := alignDown(limit/int64(n)) * int64(n)
		if want <= free+held {
			continue
		}
		have := FormatSize(free) + " free"
		if held > 0 {
			have += fmt.Sprintf(" (and %s in this owner's shard files from an earlier run, given back at start)", FormatSize(held))
		}
		return limitError{fmt.Errorf("ssd: large_file_paths[%d] %s: cannot reserve %s (large_limit_size / --ssd-limit, %d bytes): "+
			"the file system there has %s: at most %s (%d bytes) fits: lower the limit",
			i, p, FormatSize(limit), limit, have, FormatSize(alignDown(free+held)), alignDown(free+held))}
	}
	return nil
}

// existingAncestor is path or its nearest ancestor that exists (Open creates the rest
// on the same file system, unless something is mounted there first).
func existingAncestor(path string) (string, error) {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		_, err := os.Stat(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, os.ErrNotExist) || p == filepath.Dir(p) {
			return "", err
		}
	}
}

// shardBytes is the space the shard files in root hold (allocated blocks, not their
// apparent size: a sparse file holds less).
func shardBytes(root string) int64 {
	paths, _ := filepath.Glob(filepath.Join(root, "shard-*.dat"))
	var n int64
	for _, p := range paths {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			n += st.Blocks * 512
		}
	}
	return n
}

// CheckDirectIO reports, before anything is created, a path whose file system cannot
// hold the tier: the nearest existing directory of its cache root must take a file
// written and read back with O_DIRECT (ProbeDirectIO; tmpfs on older kernels and ramfs
// refuse it). Found only when the tier opened, the owner exited 1 after the master
// started, and a service manager restarted it for good.
func CheckDirectIO(opts Options) error {
	for _, p := range opts.Paths {
		dir, err := existingAncestor(cacheRoot(&opts, p))
		if err != nil {
			return fmt.Errorf("ssd path %s: %w", p, err)
		}
		if err := ProbeDirectIO(dir); err != nil && !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) {
			// (A full disk is left to Open: the shard files of an earlier run it
			// truncates may be what fills it, and CheckSpace counted them.)
			return fmt.Errorf("ssd path %s: %w", p, err)
		}
	}
	return nil
}
