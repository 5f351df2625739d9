package main

import (
	"context"
	"fmt"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/daemon"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

func masterFlags(listenDefault string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "listen", Aliases: []string{"master-listen"}, Value: listenDefault, Usage: "master TCP address (host:port; port 0 picks a free one)"},
		&cli.DurationFlag{Name: "node-ttl", Value: 5 * time.Second, Usage: "tomb an owner silent for this long"},
	}
}

func ownerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dir", Value: wire.DefaultDir(), Usage: "directory for the sockets (DIR/fluxkv.sock)"},
		&cli.StringFlag{Name: "dram", Value: "1GiB", Usage: "DRAM segment size: 512MiB, 1.5GiB, 4GB (binary units) or bytes"},
		&cli.StringFlag{Name: "node-id", Usage: "this owner's id in the cluster (default: host name)"},
		&cli.StringFlag{Name: "peer-listen", Value: "127.0.0.1:0", Usage: "TCP address of the owner's peer service"},
	}
}

func masterOptions(c *cli.Context) master.Options {
	l := logger.With().Str("role", "master").Logger()
	return master.Options{NodeTTL: c.Duration("node-ttl"), Logger: &l}
}

func ownerOptions(c *cli.Context, masterAddr string) (daemon.Options, error) {
	dram, err := ssd.ParseSize(c.String("dram"))
	if err != nil {
		return daemon.Options{}, fmt.Errorf("--dram: %w", err)
	}
	dir, err := filepath.Abs(c.String("dir"))
	if err != nil {
		return daemon.Options{}, err
	}
	l := logger.With().Str("role", "owner").Logger()
	return daemon.Options{Dir: dir, DRAM: dram, MasterAddr: masterAddr, NodeID: c.String("node-id"),
		PeerListen: c.String("peer-listen"), Logger: &l}, nil
}

func masterCommand() *cli.Command {
	return &cli.Command{
		Name:  "master",
		Usage: "run the master (routes, allocation, membership) over TCP",
		Flags: masterFlags("127.0.0.1:7700"),
		Action: func(c *cli.Context) error {
			ctx, cancel := signalContext()
			defer cancel()
			m, err := startMaster(c)
			if err != nil {
				return cli.Exit(err.Error(), 1)
			}
			waitStop(ctx)
			return stopStep("master", m.Stop)
		},
	}
}

func ownerCommand() *cli.Command {
	return &cli.Command{
		Name:  "owner",
		Usage: "run the per-node owner sidecar; it registers with a master",
		Flags: append(ownerFlags(), &cli.StringFlag{Name: "master", Required: true, Usage: "master address host:port"}),
		Action: func(c *cli.Context) error {
			ctx, cancel := signalContext()
			defer cancel()
			o, err := startOwner(ctx, c, c.String("master"))
			if err != nil {
				return cli.Exit(err.Error(), 1)
			}
			waitStop(ctx)
			return stopStep("owner", o.Stop)
		},
	}
}

func upCommand() *cli.Command {
	return &cli.Command{
		Name:  "up",
		Usage: "run a single-node cache: an embedded master and an owner in one process (still meeting over TCP)",
		Flags: append(ownerFlags(), masterFlags("127.0.0.1:0")...),
		Action: func(c *cli.Context) error {
			ctx, cancel := signalContext()
			defer cancel()
			m, err := startMaster(c)
			if err != nil {
				return cli.Exit(err.Error(), 1)
			}
			o, err := startOwner(ctx, c, m.Addr().String())
			if err != nil {
				m.Stop()
				return cli.Exit(err.Error(), 1)
			}
			waitStop(ctx)
			if err := stopStep("owner", o.Stop); err != nil {
				return err
			}
			return stopStep("master", m.Stop)
		},
	}
}

func startMaster(c *cli.Context) (*master.Server, error) {
	t0 := time.Now()
	m, err := master.NewServer(masterOptions(c))
	if err != nil {
		return nil, err
	}
	if err := m.Start(c.String("listen")); err != nil {
		return nil, err
	}
	logger.Info().Str("addr", m.Addr().String()).Dur("took", time.Since(t0)).Msg("master started")
	return m, nil
}

func startOwner(ctx context.Context, c *cli.Context, masterAddr string) (*daemon.Owner, error) {
	t0 := time.Now()
	opts, err := ownerOptions(c, masterAddr)
	if err != nil {
		return nil, err
	}
	o, err := daemon.New(opts)
	if err != nil {
		return nil, err
	}
	if err := o.Start(ctx); err != nil {
		return nil, err
	}
	logger.Info().Str("socket", o.SocketPath()).Dur("took", time.Since(t0)).Msg("owner started")
	return o, nil
}

// signalContext is cancelled by SIGINT or SIGTERM. It is set up before anything starts,
// so a signal during start-up also stops the process cleanly.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// waitStop blocks until the signal context ends.
func waitStop(ctx context.Context) {
	<-ctx.Done()
	logger.Info().Msg("signal received; stopping")
}

func stopStep(what string, stop func() error) error {
	t0 := time.Now()
	err := stop()
	logger.Info().Str("component", what).Dur("took", time.Since(t0)).Err(err).Msg("stopped")
	if err != nil {
		return cli.Exit(fmt.Sprintf("stop %s: %v", what, err), 1)
	}
	return nil
}
