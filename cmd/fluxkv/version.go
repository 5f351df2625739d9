package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
)

// What `fluxkv version` and `fluxkv --version` print, and every long-running role's
// start log line carries: the module version, the commit, its date, the Go toolchain
// and the platform. The go tool records the first three in the binary when it builds
// from a git checkout (debug.ReadBuildInfo); a build without one (the container image:
// its build context has no .git) sets them at link time instead:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=0123abc -X main.date=2026-01-02T03:04:05Z" ./cmd/fluxkv
//
// A value set so wins over the recorded one.
var (
	version string // the module version (default: the main module's, "(devel)" from a checkout)
	commit  string // the commit (default: vcs.revision, "-dirty" appended when vcs.modified)
	date    string // the commit's date, RFC 3339 (default: vcs.time)
)

// unknown stands for a field neither the build nor -ldflags recorded.
const unknown = "unknown"

// buildInfo says which build of fluxkv is running.
type buildInfo struct {
	Version   string // module version: v1.2.3, a pseudo-version, or "(devel)"
	Commit    string // git revision, "-dirty" when built from a modified tree
	Date      string // the commit's date (vcs.time), RFC 3339
	GoVersion string // the toolchain that built it: go1.26.8
	Platform  string // GOOS/GOARCH
}

// currentBuild is the running binary's build: -ldflags -X values over what the go
// tool recorded.
func currentBuild() buildInfo {
	bi, _ := debug.ReadBuildInfo()
	return newBuildInfo(bi, buildInfo{Version: version, Commit: commit, Date: date})
}

// newBuildInfo fills a buildInfo from the go tool's record bi (nil: none) under the
// overrides' non-empty Version, Commit and Date; fields neither has are "unknown"
// ("(devel)" for the version, as the go tool says of a checkout).
func newBuildInfo(bi *debug.BuildInfo, overrides buildInfo) buildInfo {
	b := buildInfo{
		Version:   "(devel)",
		Commit:    unknown,
		Date:      unknown,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi != nil {
		if bi.Main.Version != "" {
			b.Version = bi.Main.Version
		}
		var dirty bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			case "vcs.time":
				b.Date = s.Value
			}
		}
		if dirty && b.Commit != unknown {
			b.Commit += "-dirty"
		}
	}
	if overrides.Version != "" {
		b.Version = overrides.Version
	}
	if overrides.Commit != "" {
		b.Commit = overrides.Commit
	}
	if overrides.Date != "" {
		b.Date = overrides.Date
	}
	return b
}

// write prints b: "fluxkv version V", then one `key: value` line for each other field.
func (b buildInfo) write(w io.Writer) error {
	_, err := fmt.Fprintf(w, "fluxkv version %s\ncommit: %s\nbuild date: %s\ngo: %s %s\n", b.Version, b.Commit, b.Date, b.GoVersion, b.Platform)
	return err
}

// MarshalZerologObject adds b's version, commit and date to a log line
// (Event.EmbedObject): the start lines of master and owner.
func (b buildInfo) MarshalZerologObject(e *zerolog.Event) {
	e.Str("version", b.Version).Str("commit", b.Commit).Str("build_date", b.Date)
}

// versionCommand is `fluxkv version`; the global --version prints the same
// (setVersion).
func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version, commit, build date, Go version and platform of this binary",
		Action: func(c *cli.Context) error {
			return currentBuild().write(c.App.Writer)
		},
	}
}

// setVersion gives app the global --version (-v) flag, which prints what `fluxkv
// version` does.
func setVersion(app *cli.App) {
	b := currentBuild()
	app.Version = b.Version
	cli.VersionPrinter = func(c *cli.Context) {
		b.write(c.App.Writer)
	}
}
