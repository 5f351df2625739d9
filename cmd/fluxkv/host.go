package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
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
func memTotal() (int64, error) { return meminfo("MemTotal") }

// memAvailable is the memory the kernel estimates it can give without swapping, in
// bytes (MemAvailable in /proc/meminfo).
func memAvailable() (int64, error) { return meminfo("MemAvailable") }

// meminfoFile is where the machine's memory figures are read.
var meminfoFile = "/proc/meminfo"

// meminfo is the field of /proc/meminfo called name, in bytes.
func meminfo(name string) (int64, error) {
	f, err := os.Open(meminfoFile)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	defer f.Close()
	return meminfoField(f, name)
}

// meminfoField reads the field called name from r, in /proc/meminfo's format
// ("MemTotal:       24590548 kB"), in bytes.
func meminfoField(r io.Reader, name string) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+":")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, fmt.Errorf("read %s: unexpected /proc/meminfo line %q", name, sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || kb < 0 || kb > math.MaxInt64>>10 {
			return 0, fmt.Errorf("read %s: /proc/meminfo line %q: not a size in kB", name, sc.Text())
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read %s: %w", name, err)
	}
	return 0, fmt.Errorf("read %s: not in /proc/meminfo", name)
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
