package ssd

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunBench(t *testing.T) {
	forEachEngine(t, func(t *testing.T, kind string) {
		checkLeaks(t)
		dir := directDir(t)
		res, err := RunBench(context.Background(), BenchOptions{Dir: dir, Size: 64<<10 + 100, Seconds: 0.3,
			Engine: kind, Depth: 4, Limit: 8 << 20, Progress: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		if res.Engine != kind || !res.ODirect || res.Writes == 0 || res.Reads == 0 || res.ReadGiBs <= 0 ||
			res.WriteGiBs <= 0 || res.ReadP99us < res.ReadP50us || res.ReadMisses != 0 || res.Evictions == 0 {
			t.Fatalf("result %+v", res)
		}
		js, _ := json.Marshal(res)
		for _, k := range []string{`"engine"`, `"depth"`, `"o_direct"`, `"write_gib_s"`, `"read_gib_s"`, `"read_p50_us"`, `"read_p99_us"`} {
			if !strings.Contains(string(js), k) {
				t.Fatalf("json %s lacks %s", js, k)
			}
		}
		if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
			t.Fatalf("bench left %v", left)
		}
	})
}

func TestRunBenchRefusesWithoutODirect(t *testing.T) {
	if _, err := RunBench(context.Background(), BenchOptions{Dir: filepath.Join(os.TempDir(), "does-not-exist-fluxkv"), Progress: io.Discard}); err == nil ||
		!strings.Contains(err.Error(), "O_DIRECT") {
		t.Fatalf("missing dir: %v", err)
	}
}
