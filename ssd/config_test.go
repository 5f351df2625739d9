package ssd

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"0", 0},
		{"4096", 4096},
		{"512B", 512},
		{"512.9B", 512},
		{"4GB", 4 << 30},
		{"4 GB", 4 << 30},
		{"4gb", 4 << 30},
		{"1.5GiB", 3 << 29},
		{"1.5GB", 3 << 29},
		{"512MiB", 512 << 20},
		{"512MB", 512 << 20},
		{"512M", 512 << 20},
		{"64KiB", 64 << 10},
		{"1TiB", 1 << 40},
		{"0.5KiB", 512},
		{"1.1KiB", 1126}, // 1126.4 truncated
		{"1.", 1},
		{".5KiB", 512},
		{" 16GiB ", 16 << 30},
		{"8191PiB", 8191 << 50},
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", " ", "GB", "-1", "-1GB", "1e9", "1..5GB", "4XB", "4 G B", "8192PiB", "1.5.5", "0x10", "."} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, got)
		}
	}
}

// Both refusals of a bad size ("-1": not a number, "4XB": not a unit) list every
// unit ParseSize accepts, so neither leaves one out.
func TestParseSizeErrorsListEveryUnit(t *testing.T) {
	for _, in := range []string{"-1", "4XB"} {
		_, err := ParseSize(in)
		if err == nil {
			t.Fatalf("ParseSize(%q) accepted", in)
		}
		for _, unit := range []string{"B,", "KiB", "MiB", "GiB", "TiB", "PiB", "KB", "MB", "GB", "TB", "PB"} {
			if !strings.Contains(err.Error(), unit) {
				t.Errorf("ParseSize(%q): %q does not list %s", in, err, strings.TrimSuffix(unit, ","))
			}
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{0: "0B", 511: "511B", 1024: "1KiB", 3 << 29: "1.5GiB", 4<<20 - 128: "4MiB", 1<<20 + 1<<18: "1.25MiB"} {
		if got := FormatSize(in); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestParseLimits(t *testing.T) {
	got, err := ParseLimits([]any{"4GB", 17179869184, int64(512), uint64(1024), 1536.9, json.Number("2KiB"), "512.9B"})
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{4 << 30, 16 << 30, 512, 1024, 1536, 2048, 512}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("limits %v, want %v", got, want)
		}
	}
	for _, tc := range []struct {
		vals []any
		want string
	}{
		{[]any{"4GB", 511}, "large_limit_size[1]: 511 bytes is below the minimum of 512"},
		{[]any{"4GB", "1KB", "511.9B"}, "large_limit_size[2]"},
		{[]any{nil}, "large_limit_size[0]: null"},
		{[]any{"lots"}, "large_limit_size[0]"},
		{[]any{true}, "large_limit_size[0]: true (bool)"},
		{[]any{-4096}, "large_limit_size[0]"},
		{[]any{uint64(1 << 63)}, "too large"},
		{[]any{[]any{1}}, "large_limit_size[0]"},
	} {
		if _, err := ParseLimits(tc.vals); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseLimits(%v) = %v, want error containing %q", tc.vals, err, tc.want)
		}
	}
}

func TestConfig(t *testing.T) {
	decode := func(s string) Config {
		t.Helper()
		var c Config
		dec := json.NewDecoder(strings.NewReader(s))
		if err := dec.Decode(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, off := range []string{`{}`, `{"large_file_paths": ["/a"]}`, `{"large_file_paths": ["/a"], "large_limit_size": null}`} {
		c := decode(off)
		if c.Enabled() || c.Validate() != nil {
			t.Errorf("%s: enabled %v, validate %v", off, c.Enabled(), c.Validate())
		}
		if l, err := c.Limits(); l != nil || err != nil {
			t.Errorf("%s: limits %v %v", off, l, err)
		}
	}
	c := decode(`{"large_file_paths": ["/data/a", "/data/b"], "large_limit_size": ["4GB", 17179869184]}`)
	o, err := c.Options("prod", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	if o.Limits[0] != 4<<30 || o.Limits[1] != 16<<30 || o.Paths[1] != "/data/b" || o.Cluster != "prod" {
		t.Fatalf("options %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ cfg, want string }{
		{`{"large_file_paths": ["/a", "/b"], "large_limit_size": ["4GB"]}`, "same length"},
		{`{"large_file_paths": [], "large_limit_size": []}`, "large_file_paths is empty"},
		{`{"large_file_paths": ["/a", ""], "large_limit_size": [4096, 4096]}`, "large_file_paths[1]: empty path"},
		{`{"large_file_paths": ["/a", "/b"], "large_limit_size": [4096, "4QB"]}`, `large_limit_size[1]: size "4QB": unknown unit`},
	} {
		err := decode(tc.cfg).Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := decode(`{}`).Options("c", "i"); err == nil {
		t.Error("options from a disabled config")
	}
}

func TestSafeName(t *testing.T) {
	for in, exact := range map[string]bool{"node-1": true, "a.b_c": true, "host:1/gpu0": false, "..": false, "": false, strings.Repeat("x", 200): false} {
		got := safeName(in)
		if (got == in) != exact || strings.ContainsAny(got, "/:") || got == "" || got == "." || got == ".." || len(got) > 150 {
			t.Errorf("safeName(%q) = %q", in, got)
		}
	}
	if safeName("a/b") == safeName("a_b") || safeName("a/b") != safeName("a/b") {
		t.Error("safeName must keep distinct keys distinct and be stable")
	}
}

func TestAlignedBuffers(t *testing.T) {
	for _, n := range []int64{1, 511, 512, 513, 4 << 20} {
		b := AllocAligned(n)
		if int64(len(b)) != n || int64(cap(b)) != AlignedLen(n) || !isAligned(b) {
			t.Errorf("AllocAligned(%d): len %d cap %d aligned %v", n, len(b), cap(b), isAligned(b))
		}
	}
	for _, n := range []int{1, 4096, 4097, 1 << 20} {
		b := getBuf(n)
		if len(b) != n || !isAligned(b) {
			t.Fatalf("getBuf(%d): len %d aligned %v", n, len(b), isAligned(b))
		}
		copy(b, bytes.Repeat([]byte{1}, n))
		putBuf(b)
	}
}
