package main

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The machine's limits that owner settings are checked against at start.

// memTotal is the machine's memory in bytes (MemTotal in /proc/meminfo).
func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read memory size: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("read memory size: unexpected /proc/meminfo line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read memory size: %q: %w", sc.Text(), err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read memory size: %w", err)
	}
	return 0, fmt.Errorf("read memory size: no MemTotal in /proc/meminfo")
}

// openFileLimit is this process's RLIMIT_NOFILE soft limit (the Go runtime raises it
// to the hard limit at start, so this is what the owner will have).
func openFileLimit() (uint64, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("getrlimit RLIMIT_NOFILE: %w", err)
	}
	return rl.Cur, nil
}

// cgroupFiles are where this process's memory cgroup is read: the list of its cgroups
// and the cgroup file system (a test points them at a fake tree).
var cgroupFiles = struct{ proc, root string }{"/proc/self/cgroup", "/sys/fs/cgroup"}

// cgroupMemoryLimit is the smallest memory limit of this process's memory cgroup and
// its ancestors: cgroup v2's memory.max, or v1's memory.limit_in_bytes in the memory
// hierarchy, with the file that sets it (its path in the hierarchy); 0 when none is set
// or none can be read (a container sees its own cgroup as the root).
func cgroupMemoryLimit() (int64, string) {
	data, err := os.ReadFile(cgroupFiles.proc)
	if err != nil {
		return 0, ""
	}
	var limit int64
	var where string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		var dir, file string
		switch {
		case parts[0] == "0" && parts[1] == "": // v2
			dir, file = cgroupFiles.root, "memory.max"
		case slices.Contains(strings.Split(parts[1], ","), "memory"): // v1
			dir, file = filepath.Join(cgroupFiles.root, "memory"), "memory.limit_in_bytes"
		default:
			continue
		}
		for p := path.Clean(parts[2]); ; p = path.Dir(p) {
			b, err := os.ReadFile(filepath.Join(dir, p, file))
			if err == nil {
				// "max" (v2) is none; v1's none is a huge number, never below a segment.
				n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				if err == nil && n > 0 && (limit == 0 || n < limit) {
					limit, where = n, path.Join(p, file)
				}
			}
			if p == "/" {
				break
			}
		}
	}
	return limit, where
}
