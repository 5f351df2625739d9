package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// Settings come from three places, in this order of precedence: a flag given on the
// command line (or its environment variable), the --config file, the flag's default.

func configFlag() cli.Flag {
	return &cli.StringFlag{Name: "config", Aliases: []string{"c"},
		Usage: "YAML config file (owner settings under fluxkv_spec:, master settings under master:); flags given on the command line override it"}
}

func metricsAddrFlag() cli.Flag {
	return &cli.StringFlag{Name: "metrics-addr",
		Usage: "serve Prometheus /metrics on HOST:PORT (port 0 picks a free one; empty: no metrics server); it is up before the socket appears"}
}

func masterFlags(listenDefault string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "listen", Aliases: []string{"master-listen"}, Value: listenDefault,
			Usage: "master TCP address owners register on (host:port; port 0 picks a free one) [master.listen]"},
		&cli.DurationFlag{Name: "node-ttl", Value: 5 * time.Second, Usage: "tomb an owner silent for this long [master.node_ttl]"},
		&cli.DurationFlag{Name: "heartbeat-interval", DefaultText: "1s", Usage: "how often owners heartbeat; must be below --node-ttl [master.heartbeat_interval]"},
		&cli.DurationFlag{Name: "inflight-ttl", DefaultText: "1m0s", Usage: "revoke an in-flight put or get older than this [master.inflight_ttl]"},
		&cli.BoolFlag{Name: "no-promotion", Usage: "never promote SSD refills to memory replicas (for measuring SSD-hit gets) [master.no_promotion]"},
		&cli.DurationFlag{Name: "alloc-wait", DefaultText: "5s", Usage: "how long a put waits for space (eviction, releases) before NO_SPACE [master.alloc_wait]"},
	}
}

func ownerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dir", Aliases: []string{"socket-dir"}, Value: wire.DefaultDir(),
			Usage: "directory for the sockets (DIR/fluxkv.sock); its group decides who may attach [fluxkv_spec.socket_dir]"},
		&cli.StringFlag{Name: "dram", Value: "1GiB", Usage: "DRAM segment size: 512MiB, 1.5GiB, 4GB (binary units) or bytes [fluxkv_spec.dram]"},
		&cli.StringFlag{Name: "node-id", DefaultText: "host name", Usage: "this owner's id in the cluster [fluxkv_spec.node_id]"},
		&cli.DurationFlag{Name: "cache-grace", DefaultText: "20ms", Usage: "keep a released holding cached this long so repeated gets skip the master (0 disables)"},
		&cli.StringFlag{Name: "peer-listen", Value: "127.0.0.1:0", Usage: "TCP address of the owner's peer service; other owners and the master connect to it [fluxkv_spec.peer_listen]"},
		&cli.StringFlag{Name: "cluster-name", Value: "fluxkv", Usage: "cluster name; names the SSD cache root <path>/<cluster>_cluster_kv_ssd_storage [fluxkv_spec.cluster_name]"},
		&cli.StringFlag{Name: "instance-key", DefaultText: "the node id", Usage: "names this owner's SSD cache root under each path [fluxkv_spec.instance_key]"},
		&cli.StringSliceFlag{Name: "large-file-paths", Aliases: []string{"ssd-path"}, Usage: "SSD cache directories, comma-separated or repeated [fluxkv_spec.large_file_paths]"},
		&cli.StringSliceFlag{Name: "large-limit-size", Aliases: []string{"ssd-limit"}, Usage: "SSD ring space per --large-file-paths entry (same count; e.g. 4GiB,8GiB; each ≥ 512 bytes); unset = SSD off [fluxkv_spec.large_limit_size]"},
	}
}

// loadConfig reads --config for role; without --config it is an empty file.
func loadConfig(c *cli.Context, role config.Role) (*config.File, error) {
	path := c.String("config")
	if path == "" {
		return &config.File{}, nil
	}
	t0 := time.Now()
	f, err := config.Load(path, role)
	if err != nil {
		return nil, cli.Exit(err.Error(), 2)
	}
	logger.Info().Str("config", path).Dur("took", time.Since(t0)).Msg("config loaded")
	return f, nil
}

// str is the value of a string setting: the flag when given on the command line,
// else the file's value when it has one, else the flag's default.
func str(c *cli.Context, flag, fileVal string) string {
	if c.IsSet(flag) || fileVal == "" {
		return c.String(flag)
	}
	return fileVal
}

func dur(c *cli.Context, flag string, fileVal time.Duration) time.Duration {
	if c.IsSet(flag) || fileVal == 0 {
		return c.Duration(flag)
	}
	return fileVal
}

// masterSettings merges the file's master section under the flags.
func masterSettings(c *cli.Context, f *config.File) (config.Master, error) {
	var fm config.Master
	if f.Master != nil {
		fm = *f.Master
	}
	s := config.Master{
		Listen:            str(c, "listen", fm.Listen),
		NodeTTL:           dur(c, "node-ttl", fm.NodeTTL),
		HeartbeatInterval: dur(c, "heartbeat-interval", fm.HeartbeatInterval),
		InflightTTL:       dur(c, "inflight-ttl", fm.InflightTTL),
		AllocWait:         dur(c, "alloc-wait", fm.AllocWait),
		NoPromotion:       fm.NoPromotion || c.Bool("no-promotion"),
		MetricsAddr:       str(c, "metrics-addr", fm.MetricsAddr),
		LogLevel:          fm.LogLevel,
		LogFormat:         fm.LogFormat,
	}
	if err := config.CheckAddr(s.Listen); err != nil {
		return s, cli.Exit("--listen: "+err.Error(), 2)
	}
	if s.MetricsAddr != "" {
		if err := config.CheckAddr(s.MetricsAddr); err != nil {
			return s, cli.Exit("--metrics-addr: "+err.Error(), 2)
		}
	}
	return s, nil
}

// ownerSettings merges the file's fluxkv_spec section under the flags. The master
// address is not required here: `up` supplies its embedded master's.
func ownerSettings(c *cli.Context, f *config.File) (config.Owner, error) {
	var fo config.Owner
	if f.Owner != nil {
		fo = *f.Owner
	}
	s := config.Owner{
		SocketDir:      str(c, "dir", fo.SocketDir),
		NodeID:         str(c, "node-id", fo.NodeID),
		PeerListen:     str(c, "peer-listen", fo.PeerListen),
		ClusterName:    str(c, "cluster-name", fo.ClusterName),
		InstanceKey:    str(c, "instance-key", fo.InstanceKey),
		MetricsAddr:    str(c, "metrics-addr", fo.MetricsAddr),
		LogLevel:       fo.LogLevel,
		LogFormat:      fo.LogFormat,
		DRAM:           fo.DRAM,
		LargeFilePaths: fo.LargeFilePaths,
		LargeLimitSize: fo.LargeLimitSize,
	}
	if c.IsSet("cache-grace") {
		g := c.Duration("cache-grace")
		s.CacheGrace = &g
	}
	// `up` has no --master flag (its owner registers with the embedded master):
	// there this is the file's value, which up ignores with a warning.
	s.Master = str(c, "master", fo.Master)
	if c.IsSet("dram") || s.DRAM == 0 {
		n, err := ssd.ParseSize(c.String("dram"))
		if err != nil {
			return s, cli.Exit(fmt.Sprintf("--dram: %v", err), 2)
		}
		if n <= 0 {
			return s, cli.Exit("--dram: must be positive", 2)
		}
		s.DRAM = n
	}
	if err := ownerSSDFlags(c, &s); err != nil {
		return s, err
	}
	dir, err := filepath.Abs(s.SocketDir)
	if err != nil {
		return s, cli.Exit(fmt.Sprintf("socket directory %q: %v", s.SocketDir, err), 2)
	}
	s.SocketDir = dir
	for _, a := range []struct{ flag, v string }{{"peer-listen", s.PeerListen}, {"metrics-addr", s.MetricsAddr}, {"master", s.Master}} {
		if a.v == "" {
			continue
		}
		if err := config.CheckAddr(a.v); err != nil {
			return s, cli.Exit("--"+a.flag+": "+err.Error(), 2)
		}
	}
	if s.NodeID != "" {
		if err := wire.ValidateNodeID(s.NodeID); err != nil {
			return s, cli.Exit("--node-id: "+err.Error(), 2)
		}
	}
	if s.InstanceKey == "" {
		// The SSD cache root of an owner is named after the owner unless told otherwise.
		s.InstanceKey = s.NodeID
		if s.InstanceKey == "" {
			h, err := os.Hostname()
			if err != nil || h == "" {
				h = "owner"
			}
			s.InstanceKey = h
		}
	}
	return s, nil
}

// ownerSSDFlags applies --large-file-paths and --large-limit-size. Each replaces the
// file's list; the pair is then checked together by the seed's rules (ssd.Config).
func ownerSSDFlags(c *cli.Context, s *config.Owner) error {
	paths, limitsSet := c.IsSet("large-file-paths"), c.IsSet("large-limit-size")
	if !paths && !limitsSet {
		return nil
	}
	if paths {
		s.LargeFilePaths = c.StringSlice("large-file-paths")
	}
	cfg := ssd.Config{LargeFilePaths: s.LargeFilePaths}
	switch {
	case limitsSet:
		for _, l := range c.StringSlice("large-limit-size") {
			cfg.LargeLimitSize = append(cfg.LargeLimitSize, l)
		}
		if cfg.LargeLimitSize == nil {
			cfg.LargeLimitSize = []any{}
		}
	case s.LargeLimitSize != nil:
		for _, l := range s.LargeLimitSize {
			cfg.LargeLimitSize = append(cfg.LargeLimitSize, l)
		}
	}
	limits, err := cfg.Limits()
	if err != nil {
		return cli.Exit(fmt.Sprintf("--large-file-paths/--large-limit-size (over the config file): %v", err), 2)
	}
	s.LargeLimitSize = limits
	return nil
}
