package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// The binaries process tests run. `make test` points FLUXKV_BIN at bin/fluxkv-race
// (functional tests) and FLUXKV_BIN_NORACE at bin/fluxkv (limits, soak, benchmarks).
const (
	BinEnv       = "FLUXKV_BIN"
	NoRaceBinEnv = "FLUXKV_BIN_NORACE"
)

const fluxkvPkg = "github.com/fluxkv/fluxkv/cmd/fluxkv"

var built struct {
	mu   sync.Mutex // protects dir, bins
	dir  string
	bins map[bool]string // by -race
}

// Binary is the fluxkv binary process tests run: $FLUXKV_BIN, else cmd/fluxkv built
// once into a temporary directory, with -race when race is set (pass the test binary's
// own mode, so its children are checked as it is). RemoveBuilt removes what it built.
func Binary(race bool) (string, error) {
	if p := os.Getenv(BinEnv); p != "" {
		return p, nil
	}
	built.mu.Lock()
	defer built.mu.Unlock()
	if p := built.bins[race]; p != "" {
		return p, nil
	}
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "fluxkv-bin-")
		if err != nil {
			return "", fmt.Errorf("build fluxkv: %w", err)
		}
		built.dir, built.bins = dir, map[bool]string{}
	}
	bin := filepath.Join(built.dir, "fluxkv")
	args := []string{"build", "-o", bin}
	if race {
		bin += "-race"
		args = []string{"build", "-race", "-o", bin}
	}
	if out, err := exec.Command("go", append(args, fluxkvPkg)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("build fluxkv: %v\n%s", err, out)
	}
	built.bins[race] = bin
	return bin, nil
}

// NoRaceBinary is the plain fluxkv binary for tests that measure limits or speed:
// $FLUXKV_BIN_NORACE, else Binary(race).
func NoRaceBinary(race bool) (string, error) {
	if p := os.Getenv(NoRaceBinEnv); p != "" {
		return p, nil
	}
	return Binary(race)
}

// RemoveBuilt removes the binaries Binary built (TestMain, after m.Run).
func RemoveBuilt() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
		built.dir, built.bins = "", nil
	}
}
