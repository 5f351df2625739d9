package main

import (
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
)

var logger zerolog.Logger

func logFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"FLUXKV_LOG_LEVEL"},
			Usage: "log level: debug, info, warn, error (overrides log_level in a --config file)"},
		&cli.StringFlag{Name: "log-format", Value: "json", EnvVars: []string{"FLUXKV_LOG_FORMAT"},
			Usage: "log format on stderr: json (structured, for journald and log shippers) or text (human); overrides log_format in a --config file"},
	}
}

// setupLogging configures the logger from the global flags (or their defaults).
func setupLogging(c *cli.Context) error {
	return configureLogging(c.String("log-level"), c.String("log-format"))
}

// applyLogSettings reconfigures the logger with a config file's log_level and
// log_format where the corresponding flag (or its environment variable) was not set.
func applyLogSettings(c *cli.Context, level, format string) error {
	if level == "" || c.IsSet("log-level") {
		level = c.String("log-level")
	}
	if format == "" || c.IsSet("log-format") {
		format = c.String("log-format")
	}
	return configureLogging(level, format)
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
