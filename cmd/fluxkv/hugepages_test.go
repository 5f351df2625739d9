package main

import (
	"path/filepath"
	"testing"

	"github.com/fluxkv/fluxkv/shm"
)

// `fluxkv up` advises huge pages for its segment by default and refuses them with
// --huge-pages=false; its start log says what the kernel gave (on huge pages where the
// machine's policy allows them for an advised mapping, on small pages otherwise).
func TestUpSegmentHugePages(t *testing.T) {
	policy := shm.ShmemTHP()
	for _, tt := range []struct {
		name string
		args []string
		huge bool
	}{
		{"default", nil, shm.ShmemTHPAdvised(policy)},
		{"refused", []string{"--huge-pages=false"}, policy == "force"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := startService(t, append([]string{"up", "--dir", dir, "--dram", "16MiB"}, tt.args...)...)
			line, _ := s.waitLog("segment created")
			if got, _ := line["shmem_thp"].(string); got != policy {
				t.Errorf("shmem_thp %q, want the kernel's %q", got, policy)
			}
			n, ok := line["huge_bytes"].(float64)
			if !ok {
				t.Fatalf("no huge_bytes in the start log: %v", line)
			}
			if (n > 0) != tt.huge || n > 16<<20 {
				t.Errorf("policy %q: %v bytes on huge pages, want some: %v (of 16 MiB at most)", policy, n, tt.huge)
			}
			if line["huge_pages"] != (tt.args == nil) {
				t.Errorf("huge_pages %v in the log, want %v", line["huge_pages"], tt.args == nil)
			}
			s.stop(filepath.Join(dir, "fluxkv.sock"))
		})
	}
}
