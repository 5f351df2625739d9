// Command fluxkv is the single fluxkv binary: the master, the owner sidecar, the
// embedded single-node cache (up), operator commands and benchmarks. main only wires:
// flags → components → run → wait for a signal → stop in reverse order.
package main

import (
	"fmt"
	"os"

	"github.com/cloudwego/kitex/pkg/klog"
	"github.com/urfave/cli/v2"
)

// stopProfile ends the --cpu-profile the app's Before started.
var stopProfile = func() {}

func main() {
	// Kitex logs through klog, in plain text whatever --log-format says; keep it to
	// errors: its warnings repeat what the process logs itself (a master that does not
	// answer gave some 60 lines of "auto retry" a second). Set before any Kitex goroutine
	// can read the level.
	klog.SetLevel(klog.LevelError)
	app := &cli.App{
		Name:  "fluxkv",
		Usage: "distributed DRAM + SSD key-value cache for AI inference",
		Flags: append(logFlags(), profileFlag),
		Before: func(c *cli.Context) error {
			if err := setupLogging(c); err != nil {
				return err
			}
			stop, err := startProfile(c)
			if err != nil {
				return err
			}
			stopProfile = stop
			return nil
		},
		After: func(*cli.Context) error {
			stopProfile()
			return nil
		},
		// urfave/cli would print an exit-coded error itself and exit at once, in the
		// subcommand, before After has written the profile: the error comes back here.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands: withLogFlags([]*cli.Command{
			masterCommand(),
			ownerCommand(),
			upCommand(),
			putCommand(),
			getCommand(),
			delCommand(),
			existsCommand(),
			statusCommand(),
			genMasterKeyCommand(),
			versionCommand(),
			{
				Name:        "bench",
				Usage:       "benchmarks",
				Subcommands: []*cli.Command{benchSSDCommand()},
			},
		}),
	}
	setVersion(app)
	if err := app.Run(os.Args); err != nil {
		if ec, ok := err.(cli.ExitCoder); ok {
			if msg := ec.Error(); msg != "" {
				fmt.Fprintln(os.Stderr, "fluxkv:", msg)
			}
			os.Exit(ec.ExitCode())
		}
		fmt.Fprintln(os.Stderr, "fluxkv:", err)
		os.Exit(2)
	}
}
