package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

func TestMeminfoField(t *testing.T) {
	const info = "MemTotal:       24590548 kB\nMemFree:          812340 kB\nMemAvailable:   20123456 kB\nBad:            12 MB\nHuge:  99999999999999999999 kB\n"
	for _, tt := range []struct {
		name    string
		want    int64
		wantErr string
	}{
		{"MemTotal", 24590548 << 10, ""},
		{"MemAvailable", 20123456 << 10, ""},
		{"Mem", 0, "read Mem: not in /proc/meminfo"}, // a prefix of a field is not that field
		{"Bad", 0, `unexpected /proc/meminfo line "Bad:            12 MB"`},
		{"Huge", 0, "not a size in kB"},
	} {
		got, err := meminfoField(strings.NewReader(info), tt.name)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %d, %v; want an error with %q", tt.name, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: %d, %v; want %d", tt.name, got, err, tt.want)
		}
	}
}

// A segment above the memory available now (MemAvailable) but within the machine's is
// taken, with a warning that names both sizes; one within it starts silently.
func TestDRAMAboveAvailableWarns(t *testing.T) {
	dir := t.TempDir()
	info := filepath.Join(dir, "meminfo")
	if err := os.WriteFile(info, []byte("MemTotal:        1048576 kB\nMemAvailable:      65536 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "proc"), []byte("0::/\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	savedInfo, savedCgroup, savedLogger := meminfoFile, cgroupFiles, logger
	t.Cleanup(func() { meminfoFile, cgroupFiles, logger = savedInfo, savedCgroup, savedLogger })
	meminfoFile = info
	cgroupFiles.proc, cgroupFiles.root = filepath.Join(dir, "proc"), dir
	for _, tt := range []struct {
		dram, want string
	}{
		{"128MiB", "--dram 128 MiB exceeds the memory available now (64 MiB, MemAvailable)"},
		{"32MiB", ""},
	} {
		var buf bytes.Buffer
		logger = zerolog.New(&buf)
		if _, _, err := runSettings(t, "owner", "", "--master", "127.0.0.1:1", "--dir", absentDir, "--dram", tt.dram); err != nil {
			t.Fatalf("--dram %s: %v", tt.dram, err)
		}
		got := buf.String()
		if tt.want == "" && strings.Contains(got, "MemAvailable") || tt.want != "" && !strings.Contains(got, tt.want) {
			t.Errorf("--dram %s: log %q, want %q", tt.dram, got, tt.want)
		}
	}
	// Above the machine's memory it is still refused.
	_, _, err := runSettings(t, "owner", "", "--master", "127.0.0.1:1", "--dir", absentDir, "--dram", "2GiB")
	wantRefusal(t, err, "--dram 2 GiB exceeds this machine's memory (1 GiB, MemTotal)")
}
