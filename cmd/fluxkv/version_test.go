package main

import (
	"debug/buildinfo"

	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

// parseVersion reads what `fluxkv version` prints into version, commit, build date
// and go; a line of another form fails the test.
func parseVersion(t *testing.T, out string) map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	v, ok := strings.CutPrefix(lines[0], "fluxkv version ")
	if !ok {
		t.Fatalf("first line %q, want \"fluxkv version V\":\n%s", lines[0], out)
	}
	fields := map[string]string{"version": v}
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ": ")
		if !ok || v == "" {
			t.Fatalf("line %q is not \"key: value\":\n%s", l, out)
		}
		fields[k] = v
	}
	for _, k := range []string{"version", "commit", "build date", "go"} {
		if fields[k] == "" {
			t.Errorf("no %s in the output:\n%s", k, out)
		}
	}
	return fields
}

// runVersion runs bin with args and returns its stdout, which must be the version.
func runVersion(t *testing.T, bin string, args ...string) map[string]string {
	t.Helper()
	out, err := exec.Command(bin, args...).Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return parseVersion(t, string(out))
}

func buildSetting(info *debug.BuildInfo, key string) string {
	for _, s := range info.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// The fields from the go tool's record: vcs.revision with -dirty, vcs.time, the main
// module's version; -ldflags -X values win over them; nothing recorded reads "unknown".
func TestVersionFromBuildInfo(t *testing.T) {
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260102030405-0123456789ab+dirty"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	clean := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef"}, {Key: "vcs.modified", Value: "false"},
	}}
	over := buildInfo{Version: "v1.2.3", Commit: "feedbeef", Date: "2030-01-01T00:00:00Z"}
	platform := runtime.GOOS + "/" + runtime.GOARCH
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		over buildInfo
		want buildInfo
	}{
		{"no record", nil, buildInfo{}, buildInfo{Version: "(devel)", Commit: "unknown", Date: "unknown"}},
		{"no vcs", &debug.BuildInfo{}, buildInfo{}, buildInfo{Version: "(devel)", Commit: "unknown", Date: "unknown"}},
		{"dirty tree", vcs, buildInfo{}, buildInfo{Version: vcs.Main.Version, Commit: "0123456789abcdef-dirty", Date: "2026-01-02T03:04:05Z"}},
		{"clean tree", clean, buildInfo{}, buildInfo{Version: "(devel)", Commit: "0123456789abcdef", Date: "unknown"}},
		{"ldflags over vcs", vcs, over, over},
		{"ldflags commit only", nil, buildInfo{Commit: "feedbeef"}, buildInfo{Version: "(devel)", Commit: "feedbeef", Date: "unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.want.GoVersion, tc.want.Platform = runtime.Version(), platform
			if got := newBuildInfo(tc.bi, tc.over); got != tc.want {
				t.Errorf("newBuildInfo = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// `fluxkv version`, `fluxkv --version` and `-v` print the same, and what they print
// is what the go tool recorded in the binary (unless -ldflags -X replaced it).
func TestVersionCommand(t *testing.T) {
	bin := fluxkvBin(t)
	got := runVersion(t, bin, "version")
	for _, flag := range []string{"--version", "-v"} {
		if other := runVersion(t, bin, flag); !maps.Equal(other, got) {
			t.Errorf("fluxkv %s = %v, fluxkv version = %v: want the same", flag, other, got)
		}
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if want := info.GoVersion + " " + buildSetting(info, "GOOS") + "/" + buildSetting(info, "GOARCH"); got["go"] != want {
		t.Errorf("go: %q, want %q", got["go"], want)
	}
	if ld := buildSetting(info, "-ldflags"); strings.Contains(ld, "-X") {
		t.Logf("%s was linked with -ldflags %q: its version fields are not compared with the build record", bin, ld)
		return
	}
	want := newBuildInfo(info, buildInfo{})
	if got["version"] != want.Version || got["commit"] != want.Commit || got["build date"] != want.Date {
		t.Errorf("version %q commit %q build date %q, want %q %q %q (the binary's build record)",
			got["version"], got["commit"], got["build date"], want.Version, want.Commit, want.Date)
	}
	if want.Commit == unknown {
		t.Logf("%s records no VCS information (built outside a git checkout, or with -buildvcs=false, e.g. in GOFLAGS): commit and build date read %q",
			bin, unknown)
	}
}

// A build as deploy/Containerfile makes it (static, -trimpath, stripped, the version
// fields set with -ldflags -X because the image's build context has no .git) prints
// the values it was given, and is a static executable.
func TestVersionLdflags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds fluxkv (tens of seconds)")
	}
	bin := filepath.Join(t.TempDir(), "fluxkv")
	const (
		v = "v9.8.7-test"
		c = "0123456789abcdef0123456789abcdef01234567"
		d = "2030-01-02T03:04:05Z"
	)
	// Only the link differs from the test binaries' build (no -trimpath, cgo as it
	// is): the packages come from the build cache, and make test stays fast. That the
	// module builds without cgo, as the Containerfile builds it, is checked below with
	// go list; deploy's image test builds the image itself where a builder exists.
	ldflags := "-s -w -X main.version=" + v + " -X main.commit=" + c + " -X main.date=" + d
	cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", bin, "github.com/fluxkv/fluxkv/cmd/fluxkv")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	got := runVersion(t, bin, "--version")
	if got["version"] != v || got["commit"] != c || got["build date"] != d {
		t.Errorf("version %q commit %q build date %q, want %q %q %q", got["version"], got["commit"], got["build date"], v, c, d)
	}
	if other := runVersion(t, bin, "version"); !maps.Equal(other, got) {
		t.Errorf("fluxkv version = %v, fluxkv --version = %v: want the same", other, got)
	}
	list := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "github.com/fluxkv/fluxkv/cmd/fluxkv")
	list.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := list.CombinedOutput()
	if err != nil {
		t.Fatalf("CGO_ENABLED=0 go list: %v\n%s", err, out)
	}
	if slices.Contains(strings.Fields(string(out)), "runtime/cgo") {
		t.Errorf("with CGO_ENABLED=0 fluxkv still links runtime/cgo: not static (a distroless/static image could not run it)")
	}
}

// `fluxkv up` (master and owner in one process) logs the version fields that `fluxkv
// version` prints on both start lines.
func TestVersionInStartLog(t *testing.T) {
	bin := fluxkvBin(t)
	want := runVersion(t, bin, "version")
	dir := t.TempDir()
	s := startService(t, "up", "--dir", dir, "--dram", "8MiB", "--max-connections", "32")
	socket := filepath.Join(dir, "fluxkv.sock")
	waitSocket(t, s, socket)
	for _, msg := range []string{"master started", "owner started"} {
		l, _ := s.waitLog(msg)
		for field, key := range map[string]string{"version": "version", "commit": "commit", "build_date": "build date"} {
			if l[field] != want[key] {
				t.Errorf("%q log line: %s = %v, want %q (fluxkv version)", msg, field, l[field], want[key])
			}
		}
	}
	s.stop(socket)
}
