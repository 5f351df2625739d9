package main

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
)

var logger zerolog.Logger

// The log flags' defaults.
const (
	defaultLogLevel  = "info"
	defaultLogFormat = "json"
)

// logFlags are the global --log-level and --log-format, given before the subcommand
// (or by their environment variables).
func logFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: defaultLogLevel, EnvVars: []string{"FLUXKV_LOG_LEVEL"},
			Usage: "log level: debug, info, warn, error (overrides log_level in a --config file)"},
		&cli.StringFlag{Name: "log-format", Value: defaultLogFormat, EnvVars: []string{"FLUXKV_LOG_FORMAT"},
			Usage: "log format on stderr: json (structured, for journald and log shippers) or text (human); overrides log_format in a --config file"},
	}
}

// withLogFlags gives every command (and subcommand) --log-level and --log-format too,
// so that they work after the subcommand as well as before it (the one after wins),
// and applies them before the command's own Before.
func withLogFlags(cmds []*cli.Command) []*cli.Command {
	for _, cmd := range cmds {
		cmd.Flags = append(cmd.Flags,
			&cli.StringFlag{Name: "log-level", DefaultText: defaultLogLevel,
				Usage: "log level: debug, info, warn, error (also before the subcommand; overrides log_level in a --config file)"},
			&cli.StringFlag{Name: "log-format", DefaultText: defaultLogFormat,
				Usage: "log format on stderr: json or text (also before the subcommand; overrides log_format in a --config file)"})
		before := cmd.Before
		cmd.Before = func(c *cli.Context) error {
			if err := setupLogging(c); err != nil {
				return err
			}
			if before != nil {
				return before(c)
			}
			return nil
		}
		withLogFlags(cmd.Subcommands)
	}
	return cmds
}

// logFlag is --log-level or --log-format (name) as given: the innermost one on the
// command line (after the subcommand, else before it), else its environment variable;
// set is false when none was.
func logFlag(c *cli.Context, name string) (value string, set bool) {
	for _, x := range c.Lineage() {
		if x.Command != nil && slices.Contains(x.LocalFlagNames(), name) {
			return x.String(name), true
		}
	}
	return "", false
}

// setupLogging configures the logger from the log flags (or their defaults).
func setupLogging(c *cli.Context) error {
	return applyLogSettings(c, "", "")
}

// applyLogSettings reconfigures the logger with a config file's log_level and
// log_format where the corresponding flag (or its environment variable) was not set.
func applyLogSettings(c *cli.Context, level, format string) error {
	return configureLogging(logSetting(c, "log-level", level, defaultLogLevel), logSetting(c, "log-format", format, defaultLogFormat))
}

// logSetting is the log flag name's value when it was given, else the file's value,
// else def.
func logSetting(c *cli.Context, name, file, def string) string {
	if v, ok := logFlag(c, name); ok {
		return v
	}
	if file != "" {
		return file
	}
	return def
}

func configureLogging(level, format string) error {
	if err := config.CheckLogLevel(level); err != nil {
		return cli.Exit(fmt.Sprintf("--log-level: %v", err), 2)
	}
	lvl, _ := zerolog.ParseLevel(level)
	switch format {
	case "json":
		logger = zerolog.New(os.Stderr)
	case "text":
		logger = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly})
	default:
		return cli.Exit("--log-format must be json or text", 2)
	}
	logger = logger.Level(lvl).With().Timestamp().Logger()
	return nil
}
