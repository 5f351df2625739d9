package shm

import (
	"os"
	"strings"
	"testing"
	"unsafe"
)

const smapsListing = `55d1c0000000-55d1c0200000 r-xp 00000000 fe:00 1234   /usr/bin/owner
Size:               2048 kB
ShmemPmdMapped:     2048 kB
FilePmdMapped:         0 kB
VmFlags: rd ex mr mw me
7f0000000000-7f0000a00000 rw-s 00000000 00:01 99     /memfd:fluxkv-n (deleted)
Size:              10240 kB
Rss:               10240 kB
ShmemPmdMapped:     8192 kB
FilePmdMapped:      2048 kB
Shared_Hugetlb:        0 kB
VmFlags: rd wr sh mr mw me ms hg
7f0000a00000-7f0000a01000 rw-p 00000000 00:00 0
ShmemPmdMapped:     4096 kB
`

func TestPmdMappedBytes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		listing string
		start   uint64
		want    int64
		err     string
	}{
		{"the mapping's own fields only", smapsListing, 0x7f0000000000, 10 << 20, ""},
		{"first mapping", smapsListing, 0x55d1c0000000, 2 << 20, ""},
		{"no huge pages", "7f00-7f10 rw-s 0 00:01 9 /memfd:x\nShmemPmdMapped: 0 kB\n", 0x7f00, 0, ""},
		{"a mapping without the fields", "7f00-7f10 rw-s 0 00:01 9 /memfd:x\nSize: 4 kB\n", 0x7f00, 0, ""},
		{"mapping absent", smapsListing, 0x1000, 0, "no mapping at 0x1000"},
		{"bad count", "7f00-7f10 rw-s\nShmemPmdMapped: x kB\n", 0x7f00, 0, "bad count"},
		{"negative count", "7f00-7f10 rw-s\nShmemPmdMapped: -4 kB\n", 0x7f00, 0, "bad count"},
		{"unit missing", "7f00-7f10 rw-s\nShmemPmdMapped: 4\n", 0x7f00, 0, "want a count of kB"},
	} {
		got, err := pmdMappedBytes(strings.NewReader(tc.listing), tc.start)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: err %v, want one containing %q", tc.name, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case got != tc.want:
			t.Errorf("%s: %d bytes, want %d", tc.name, got, tc.want)
		}
	}
}

func FuzzPmdMappedBytes(f *testing.F) {
	f.Add(smapsListing, uint64(0x7f0000000000))
	f.Add("7f00-7f10 rw-s\nShmemPmdMapped: 4294967296 kB\nFilePmdMapped: 4294967296 kB\n", uint64(0x7f00))
	f.Add("-\n:\n7f00-\n-7f10\n", uint64(0))
	f.Fuzz(func(t *testing.T, listing string, start uint64) {
		n, err := pmdMappedBytes(strings.NewReader(listing), start)
		if err != nil && n != 0 {
			t.Fatalf("error %v with %d bytes", err, n)
		}
		if n < 0 || n%1024 != 0 {
			t.Fatalf("%d bytes: want a non-negative count of kB", n)
		}
	})
}

func TestSelectedWord(t *testing.T) {
	for in, want := range map[string]string{
		"always within_size advise [never] deny force\n": "never",
		"[advise] never":  "advise",
		"always advise":   "",
		"[] [x":           "",
		"":                "",
		"a [within_size]": "within_size",
	} {
		if got := selectedWord(in); got != want {
			t.Errorf("selectedWord(%q) = %q, want %q", in, got, want)
		}
	}
}

// The segment and a client's mapping of it are on huge pages where the kernel's policy
// gives them to an advised mapping, on small pages where it does not and when the owner
// refuses them.
func TestSegmentHugePages(t *testing.T) {
	const size = 8 << 20
	policy := ShmemTHP()
	t.Logf("shmem_enabled: %q", policy)
	for _, huge := range []bool{true, false} {
		s, err := CreateSegment(t.Name(), size, SegmentOptions{Populate: true, HugePages: huge})
		if err != nil {
			t.Fatalf("CreateSegment: %v", err)
		}
		got, err := s.HugeBytes()
		if err != nil {
			t.Fatalf("HugeBytes: %v", err)
		}
		m, err := MapFd(s.Fd(), size, false)
		if err != nil {
			t.Fatalf("MapFd: %v", err)
		}
		b := m.Bytes()
		var sum byte
		for i := 0; i < len(b); i += int(page) {
			sum += b[i] // map the client's pages in
		}
		client, err := pmdMappedBytes(openSmaps(t), uint64(uintptr(unsafe.Pointer(&b[0]))))
		if err != nil {
			t.Fatalf("client mapping: %v", err)
		}
		t.Logf("huge pages %v: segment %d, client mapping %d of %d bytes on huge pages (sum %d)", huge, got, client, size, sum)
		switch {
		case got < 0 || got > size || client < 0 || client > size:
			t.Errorf("huge pages %v: %d and %d bytes on huge pages, outside 0..%d", huge, got, client, size)
		case huge && ShmemTHPAdvised(policy) && (got == 0 || client == 0):
			t.Errorf("policy %q, advised: segment %d and client %d bytes on huge pages, want some", policy, got, client)
		case (!huge && policy != "force" || !ShmemTHPAdvised(policy)) && (got != 0 || client != 0):
			t.Errorf("policy %q, huge pages %v: segment %d and client %d bytes on huge pages, want none", policy, huge, got, client)
		}
		m.Close()
		s.Close()
		if n, err := s.HugeBytes(); n != 0 || err != nil {
			t.Errorf("HugeBytes after Close = %d, %v; want 0, nil", n, err)
		}
	}
}

func openSmaps(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
