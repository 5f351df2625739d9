package main

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/urfave/cli/v2"
)

// profileFlag: a Go CPU profile of the whole process, for finding where a daemon's time goes
// (go tool pprof bin/fluxkv FILE). The profile is written when the command returns, as a
// daemon does after SIGTERM or SIGINT; a process killed with SIGKILL leaves an empty file.
var profileFlag = &cli.StringFlag{Name: "cpu-profile", EnvVars: []string{"FLUXKV_CPU_PROFILE"},
	Usage: "write a Go CPU profile of this process to `FILE` (written when the command ends)"}

// startProfile starts the CPU profile --cpu-profile names, if any; the returned function
// stops it and closes the file.
func startProfile(c *cli.Context) (func(), error) {
	path := c.String(profileFlag.Name)
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, cli.Exit(fmt.Sprintf("--cpu-profile: %v", err), 2)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, cli.Exit(fmt.Sprintf("--cpu-profile: %v", err), 2)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			logger.Error().Err(err).Str("file", path).Msg("cpu profile not written")
		}
	}, nil
}
