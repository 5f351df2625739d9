package main

import (
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"
)

var logger zerolog.Logger

func logFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "log level: debug, info, warn, error", EnvVars: []string{"FLUXKV_LOG_LEVEL"}},
		&cli.StringFlag{Name: "log-format", Value: "json", Usage: "log format on stderr: json (structured) or text (human)", EnvVars: []string{"FLUXKV_LOG_FORMAT"}},
	}
}

func setupLogging(c *cli.Context) error {
	lvl, err := zerolog.ParseLevel(c.String("log-level"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("--log-level: %v", err), 2)
	}
	switch c.String("log-format") {
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
