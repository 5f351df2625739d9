package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// Settings come from three places, in this order of precedence: a flag given on the
// command line (or its environment variable), the --config file, the flag's default.
// A value that cannot mean what it says (a negative duration, a DRAM size beyond the
// machine's memory, SSD paths without limits) is refused at start with exit status 2
// and a message naming the flag, and the YAML key when the value came from the file:
// a service must not run quietly with something other than what it was told.

// Master defaults the merged settings are checked with (master.Options' defaults).
const (
	defaultNodeTTL           = 5 * time.Second
	defaultHeartbeatInterval = time.Second
)

// settingName names a setting in a refusal: the flag when it was given on the command
// line or nothing set it, else the YAML key with its flag.
func settingName(c *cli.Context, flag, key string, fromFile bool) string {
	if c.IsSet(flag) || !fromFile {
		return "--" + flag
	}
	return key + " (--" + flag + ")"
}

// refuse is a start-up refusal: exit status 2 with the message.
// certPair refuses an etcd client certificate without its key, or the reverse; sec is
// the YAML section ("master."), name names a setting as the user gave it.
func certPair(cert, key string, certFromFile, keyFromFile bool, sec string, name func(flag, key string, fromFile bool) string) error {
	if (cert == "") == (key == "") {
		return nil
	}
	have, lack := name("etcd-cert", "etcd_cert", certFromFile), "--etcd-key ("+sec+"etcd_key)"
	if cert == "" {
		have, lack = name("etcd-key", "etcd_key", keyFromFile), "--etcd-cert ("+sec+"etcd_cert)"
	}
	return refuse("%s without %s: give both the client certificate and its key, or neither", have, lack)
}

func refuse(format string, args ...any) error {
	return cli.Exit(fmt.Sprintf(format, args...), 2)
}

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
		&cli.DurationFlag{Name: "node-ttl", Value: defaultNodeTTL, Usage: "tomb an owner silent for this long; > 0 [master.node_ttl]"},
		&cli.DurationFlag{Name: "heartbeat-interval", DefaultText: "1s", Usage: "how often owners heartbeat; > 0 and below --node-ttl [master.heartbeat_interval]"},
		&cli.DurationFlag{Name: "inflight-ttl", DefaultText: "1m0s", Usage: "revoke an in-flight put or get older than this; > 0 [master.inflight_ttl]"},
		&cli.BoolFlag{Name: "no-promotion", Usage: "never promote SSD refills to memory replicas (for measuring SSD-hit gets) [master.no_promotion]"},
		&cli.DurationFlag{Name: "alloc-wait", DefaultText: "5s", Usage: "how long a put waits for space (eviction, releases) before NO_SPACE; > 0 [master.alloc_wait]"},
		&cli.StringFlag{Name: "placement", Value: "pool",
			Usage: "where puts go: pool = the requester while it has room, else the owner with the most free bytes, else evict across the pool (duplicate copies first) and place where room was made; the target owner pulls the value from the requester's transfer area (--transfer-reserve); local = always the requester [master.placement]"},
	}
}

// haFlags are the master's flags for high availability on etcd: `fluxkv master` only
// (`fluxkv up` is one node with its own master).
func haFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringSliceFlag{Name: "etcd-endpoints",
			Usage: "etcd client endpoints (host:port or http(s)://host:port), comma-separated or repeated: the masters campaign there and only the leader serves; unset = this master runs alone [master.etcd_endpoints]"},
		&cli.StringFlag{Name: "advertise-addr", DefaultText: "the --listen address",
			Usage: "host:port owners reach this master at, published on etcd while it leads; required with --etcd-endpoints when --listen is a wildcard or port 0 [master.advertise_addr]"},
		&cli.StringFlag{Name: "etcd-prefix", DefaultText: "/fluxkv/<cluster-name>/",
			Usage: "key prefix of this cluster on etcd, starting and ending with /; owners name the same one [master.etcd_prefix]"},
		&cli.StringFlag{Name: "cluster-name", Value: "fluxkv", Usage: "cluster name; names the default --etcd-prefix [master.cluster_name]"},
		&cli.StringFlag{Name: "etcd-cacert", Usage: "CA certificate (PEM) that verifies etcd's certificate (TLS towards etcd) [master.etcd_cacert]"},
		&cli.StringFlag{Name: "etcd-cert", Usage: "client certificate (PEM) this master presents to etcd; needs --etcd-key [master.etcd_cert]"},
		&cli.StringFlag{Name: "etcd-key", Usage: "private key (PEM) of --etcd-cert [master.etcd_key]"},
		&cli.DurationFlag{Name: "leader-ttl", DefaultText: "2s",
			Usage: "etcd lease TTL of the leadership (etcd grants whole seconds): a crashed leader is replaced within about this; > 0 [master.leader_ttl]"},
	}
}

// ownerEtcdFlags are the owner's flags for TLS towards etcd, used with --master
// etcd://...: `fluxkv owner` only.
func ownerEtcdFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "etcd-cacert", Usage: "with --master etcd://...: CA certificate (PEM) that verifies etcd's certificate [fluxkv_spec.etcd_cacert]"},
		&cli.StringFlag{Name: "etcd-cert", Usage: "with --master etcd://...: client certificate (PEM) this owner presents to etcd; needs --etcd-key [fluxkv_spec.etcd_cert]"},
		&cli.StringFlag{Name: "etcd-key", Usage: "with --master etcd://...: private key (PEM) of --etcd-cert [fluxkv_spec.etcd_key]"},
	}
}

// hasFlag reports whether the running command defines the flag name.
func hasFlag(c *cli.Context, name string) bool {
	if c.Command == nil {
		return false
	}
	for _, f := range c.Command.Flags {
		if slices.Contains(f.Names(), name) {
			return true
		}
	}
	return false
}

func ownerFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "dir", Aliases: []string{"socket-dir"}, Value: wire.DefaultDir(),
			Usage: "directory for the sockets (DIR/fluxkv.sock); its group decides who may attach [fluxkv_spec.socket_dir]"},
		&cli.StringFlag{Name: "dram", Value: "1GiB", Usage: "DRAM segment size: 512MiB, 1.5GiB, 4GB (binary units) or bytes; rounded up to the 4 KiB page, at most the machine's memory [fluxkv_spec.dram]"},
		&cli.StringFlag{Name: "node-id", DefaultText: "host name", Usage: "this owner's id in the cluster [fluxkv_spec.node_id]"},
		&cli.StringFlag{Name: "cache-grace", DefaultText: "30s", Usage: "keep a released holding of a local replica in the owner's hot set this long, so later gets of the key skip the master: a duration ≥ 0; 0 or off disables the hot set [fluxkv_spec.cache_grace]"},
		&cli.StringFlag{Name: "hot-set", DefaultText: "0.5", Usage: "the fraction of the memory pool (the segment less --transfer-reserve) that idle holdings in the hot set may keep pinned; past it the least recently released go: a number 0 < x ≤ 1; 0 or off disables the hot set [fluxkv_spec.hot_set]"},
		&cli.IntFlag{Name: "max-connections", DefaultText: "derived from RLIMIT_NOFILE",
			Usage: "cap on the open connections of each owner socket (attach and RPC); the next one is accepted and refused with a clear error; 0 = derived from the open-file limit [fluxkv_spec.max_connections]"},
		&cli.DurationFlag{Name: "hello-timeout", DefaultText: "5s", Usage: "close an attach connection whose hello has not arrived within this; > 0 [fluxkv_spec.hello_timeout]"},
		&cli.DurationFlag{Name: "frame-timeout", DefaultText: "10s", Usage: "close an RPC connection whose request (once begun) or reply does not complete within this; > 0 [fluxkv_spec.frame_timeout]"},
		&cli.DurationFlag{Name: "idle-timeout", DefaultText: "10s", Usage: "close an RPC connection idle this long unless its last call named a live session; > 0 [fluxkv_spec.idle_timeout]"},
		&cli.IntSliceFlag{Name: "allow-uid", Usage: "a uid that may attach besides root, the owner's uid and members of the socket's group (primary or supplementary); repeatable [fluxkv_spec.allowed_uids]"},
		&cli.StringFlag{Name: "transfer-reserve", DefaultText: "min(dram/8, 256MiB)",
			Usage: "transfer area at the end of the segment, outside the memory pool, for puts the master places on other owners (a larger value is placed here); 0 or off: none [fluxkv_spec.transfer_reserve]"},
		&cli.BoolFlag{Name: "client-isolation",
			Usage: "no client can change a byte it did not put: the segment is sealed against client writes and puts go through per-session put areas the owner copies from (reads are never isolated) [fluxkv_spec.client_isolation]"},
		&cli.StringFlag{Name: "put-area", DefaultText: "32MiB", Usage: "under --client-isolation, each session's put area (larger values stream through it); at most the segment [fluxkv_spec.put_area]"},
		&cli.StringFlag{Name: "frame-memory", DefaultText: "an eighth of the segment (at most of RAM), ≥ 64MiB", Usage: "bound on the bytes of request frames in progress across all RPC and peer connections; a frame that finds no room within --frame-timeout is refused; ≥ 64MiB [fluxkv_spec.frame_memory]"},
		&cli.StringFlag{Name: "put-area-total", DefaultText: "1GiB", Usage: "under --client-isolation, the cap on all sessions' put areas together; ≥ 1MiB [fluxkv_spec.put_area_total]"},
		&cli.StringFlag{Name: "peer-listen", Value: "127.0.0.1:0", Usage: "TCP address of the owner's peer service; other owners and the master connect to it [fluxkv_spec.peer_listen]"},
		&cli.StringFlag{Name: "data-listen", DefaultText: "the --peer-listen host, port 0", Usage: "TCP address of the owner's data plane (other owners pull values from it) [fluxkv_spec.data_listen]"},
		&cli.StringFlag{Name: "advertise-host", DefaultText: "the listener's address, or for a wildcard this host's address towards the master",
			Usage: "host other owners and the master reach this owner's peer and data listeners at [fluxkv_spec.advertise_host]"},
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
		Placement:         str(c, "placement", fm.Placement),
		MetricsAddr:       str(c, "metrics-addr", fm.MetricsAddr),
		LogLevel:          fm.LogLevel,
		LogFormat:         fm.LogFormat,
	}
	s.ClusterSecretFiles, s.InsecureCluster = clusterSettings(c, fm.ClusterSecretFiles, fm.InsecureCluster)
	if err := config.CheckAddr(s.Listen); err != nil {
		return s, refuse("%s: %v", settingName(c, "listen", "master.listen", fm.Listen != ""), err)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{
		{"node-ttl", s.NodeTTL}, {"heartbeat-interval", s.HeartbeatInterval},
		{"inflight-ttl", s.InflightTTL}, {"alloc-wait", s.AllocWait},
	} {
		// The file refuses ≤ 0 itself; a flag of 0 would silently mean the default.
		if c.IsSet(d.flag) && d.v <= 0 {
			return s, refuse("--%s must be positive, got %v (leave it out for the default)", d.flag, d.v)
		}
	}
	if err := config.CheckPlacement(s.Placement); err != nil {
		return s, refuse("%s: %v", settingName(c, "placement", "master.placement", fm.Placement != ""), err)
	}
	ttl, hb := s.NodeTTL, s.HeartbeatInterval
	if ttl == 0 {
		ttl = defaultNodeTTL
	}
	if hb == 0 {
		hb = defaultHeartbeatInterval
	}
	if ttl <= hb {
		return s, refuse("%s %v must exceed %s %v (an owner misses a few heartbeats before it is tombed)",
			settingName(c, "node-ttl", "master.node_ttl", fm.NodeTTL != 0), ttl,
			settingName(c, "heartbeat-interval", "master.heartbeat_interval", fm.HeartbeatInterval != 0), hb)
	}
	if s.MetricsAddr != "" {
		if err := config.CheckAddr(s.MetricsAddr); err != nil {
			return s, refuse("%s: %v", settingName(c, "metrics-addr", "master.metrics_addr", fm.MetricsAddr != ""), err)
		}
	}
	if hasFlag(c, "etcd-endpoints") {
		if err := haSettings(c, fm, &s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// haSettings merges the master's etcd settings (HA, DESIGN §12) over the file's and
// checks them together. Without endpoints the master runs alone and every other HA
// setting is refused (it would be silently ignored); with them the prefix is resolved
// (default /fluxkv/<cluster name>/) and the cluster name is kept.
func haSettings(c *cli.Context, fm config.Master, s *config.Master) error {
	const sec = config.MasterSection + "."
	name := func(flag, key string, fromFile bool) string { return settingName(c, flag, sec+key, fromFile) }
	s.EtcdEndpoints = fm.EtcdEndpoints
	if c.IsSet("etcd-endpoints") {
		s.EtcdEndpoints = nil
		for _, e := range c.StringSlice("etcd-endpoints") {
			if e = strings.TrimSpace(e); e != "" {
				s.EtcdEndpoints = append(s.EtcdEndpoints, e)
			}
		}
		if len(s.EtcdEndpoints) == 0 {
			return refuse("--etcd-endpoints: no endpoint given (leave it out to run the master alone)")
		}
	}
	s.AdvertiseAddr = str(c, "advertise-addr", fm.AdvertiseAddr)
	s.EtcdPrefix = str(c, "etcd-prefix", fm.EtcdPrefix)
	s.EtcdCACert = str(c, "etcd-cacert", fm.EtcdCACert)
	s.EtcdCert = str(c, "etcd-cert", fm.EtcdCert)
	s.EtcdKey = str(c, "etcd-key", fm.EtcdKey)
	s.LeaderTTL = dur(c, "leader-ttl", fm.LeaderTTL)
	if c.IsSet("leader-ttl") && s.LeaderTTL <= 0 {
		return refuse("--leader-ttl must be positive, got %v (leave it out for the default 2s)", s.LeaderTTL)
	}
	for _, e := range s.EtcdEndpoints {
		if err := config.CheckEtcdEndpoint(e); err != nil {
			return refuse("%s: %v", name("etcd-endpoints", "etcd_endpoints", !c.IsSet("etcd-endpoints")), err)
		}
	}
	haOnly := []struct {
		flag, key string
		set       bool
		fromFile  bool
	}{
		{"advertise-addr", "advertise_addr", s.AdvertiseAddr != "", fm.AdvertiseAddr != ""},
		{"etcd-prefix", "etcd_prefix", s.EtcdPrefix != "", fm.EtcdPrefix != ""},
		{"etcd-cacert", "etcd_cacert", s.EtcdCACert != "", fm.EtcdCACert != ""},
		{"etcd-cert", "etcd_cert", s.EtcdCert != "", fm.EtcdCert != ""},
		{"etcd-key", "etcd_key", s.EtcdKey != "", fm.EtcdKey != ""},
		{"leader-ttl", "leader_ttl", s.LeaderTTL != 0, fm.LeaderTTL != 0},
	}
	if len(s.EtcdEndpoints) == 0 {
		for _, h := range haOnly {
			if h.set {
				return refuse("%s needs --etcd-endpoints (master.etcd_endpoints): without etcd the master runs alone", name(h.flag, h.key, h.fromFile))
			}
		}
		return nil
	}
	s.ClusterName = str(c, "cluster-name", fm.ClusterName)
	if s.EtcdPrefix == "" {
		s.EtcdPrefix = ha.DefaultPrefix(s.ClusterName)
	}
	if err := config.CheckEtcdPrefix(s.EtcdPrefix); err != nil {
		return refuse("%s: %v", name("etcd-prefix", "etcd_prefix", fm.EtcdPrefix != ""), err)
	}
	if err := certPair(s.EtcdCert, s.EtcdKey, fm.EtcdCert != "", fm.EtcdKey != "", "master.", name); err != nil {
		return err
	}
	if s.AdvertiseAddr != "" {
		if err := config.CheckAdvertiseAddr(s.AdvertiseAddr); err != nil {
			return refuse("%s: %v", name("advertise-addr", "advertise_addr", fm.AdvertiseAddr != ""), err)
		}
	} else if config.IsWildcardAddr(s.Listen) {
		return refuse("--advertise-addr (master.advertise_addr) is required with etcd endpoints when %s %q is a wildcard or port 0: "+
			"the leader publishes the address owners reach it at", name("listen", "listen", fm.Listen != ""), s.Listen)
	}
	return nil
}

// ownerSettings merges the file's fluxkv_spec section under the flags. The master
// address is not required here: `up` supplies its embedded master's.
func ownerSettings(c *cli.Context, f *config.File) (config.Owner, error) {
	var fo config.Owner
	if f.Owner != nil {
		fo = *f.Owner
	}
	s := config.Owner{
		SocketDir:       str(c, "dir", fo.SocketDir),
		NodeID:          str(c, "node-id", fo.NodeID),
		PeerListen:      str(c, "peer-listen", fo.PeerListen),
		DataListen:      str(c, "data-listen", fo.DataListen),
		AdvertiseHost:   str(c, "advertise-host", fo.AdvertiseHost),
		ClusterName:     str(c, "cluster-name", fo.ClusterName),
		InstanceKey:     str(c, "instance-key", fo.InstanceKey),
		MetricsAddr:     str(c, "metrics-addr", fo.MetricsAddr),
		LogLevel:        fo.LogLevel,
		LogFormat:       fo.LogFormat,
		DRAM:            fo.DRAM,
		LargeFilePaths:  fo.LargeFilePaths,
		LargeLimitSize:  fo.LargeLimitSize,
		CacheGrace:      fo.CacheGrace,
		HotSet:          fo.HotSet,
		MaxConnections:  fo.MaxConnections,
		HelloTimeout:    dur(c, "hello-timeout", fo.HelloTimeout),
		FrameTimeout:    dur(c, "frame-timeout", fo.FrameTimeout),
		IdleTimeout:     dur(c, "idle-timeout", fo.IdleTimeout),
		AllowedUIDs:     fo.AllowedUIDs,
		TransferReserve: fo.TransferReserve,
		ClientIsolation: fo.ClientIsolation,
		PutArea:         fo.PutArea,
		PutAreaTotal:    fo.PutAreaTotal,
		FrameMemory:     fo.FrameMemory,
	}
	s.ClusterSecretFiles, s.InsecureCluster = clusterSettings(c, fo.ClusterSecretFiles, fo.InsecureCluster)
	for _, f := range []string{"hello-timeout", "frame-timeout", "idle-timeout"} {
		// The file refuses ≤ 0 itself; a flag of 0 would silently mean the default.
		if c.IsSet(f) && c.Duration(f) <= 0 {
			return s, refuse("--%s must be positive, got %v (leave it out for the default)", f, c.Duration(f))
		}
	}
	if c.IsSet("cache-grace") {
		g, err := config.ParseCacheGrace(c.String("cache-grace"))
		if err != nil {
			return s, refuse("--cache-grace: %v", err)
		}
		s.CacheGrace = &g
	}
	if c.IsSet("hot-set") {
		f, err := config.ParseHotSet(c.String("hot-set"))
		if err != nil {
			return s, refuse("--hot-set: %v", err)
		}
		s.HotSet = &f
	}
	if err := maxConnections(c, &s, fo.MaxConnections != 0); err != nil {
		return s, err
	}
	if err := isolationSettings(c, &s); err != nil {
		return s, err
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
			return s, refuse("--dram: must be positive")
		}
		s.DRAM = n
	}
	if err := checkDRAM(c, s.DRAM, fo.DRAM != 0); err != nil {
		return s, err
	}
	if s.TransferReserve != nil && *s.TransferReserve >= s.DRAM {
		return s, refuse("%s %s must be below the DRAM segment %s (the rest is the memory pool)",
			settingName(c, "transfer-reserve", "fluxkv_spec.transfer_reserve", fo.TransferReserve != nil), humanSize(*s.TransferReserve), humanSize(s.DRAM))
	}
	if err := ownerSSDFlags(c, &s); err != nil {
		return s, err
	}
	dir, err := filepath.Abs(s.SocketDir)
	if err != nil {
		return s, cli.Exit(fmt.Sprintf("socket directory %q: %v", s.SocketDir, err), 2)
	}
	s.SocketDir = dir
	if err := ownerEtcdSettings(c, fo, &s); err != nil {
		return s, err
	}
	for _, a := range []struct {
		flag, key, v string
		fromFile     bool
	}{
		{"peer-listen", "peer_listen", s.PeerListen, fo.PeerListen != ""},
		{"data-listen", "data_listen", s.DataListen, fo.DataListen != ""},
		{"metrics-addr", "metrics_addr", s.MetricsAddr, fo.MetricsAddr != ""},
		{"master", "master", s.Master, fo.Master != ""},
	} {
		if a.v == "" || a.flag == "master" && ha.IsURL(a.v) { // etcd://: ownerEtcdSettings checked it
			continue
		}
		if err := config.CheckAddr(a.v); err != nil {
			return s, refuse("%s: %v", settingName(c, a.flag, config.OwnerSection+"."+a.key, a.fromFile), err)
		}
	}
	if s.AdvertiseHost != "" {
		if err := config.CheckHost(s.AdvertiseHost); err != nil {
			return s, refuse("%s: %v", settingName(c, "advertise-host", "fluxkv_spec.advertise_host", fo.AdvertiseHost != ""), err)
		}
	}
	if s.NodeID != "" {
		if err := wire.ValidateNodeID(s.NodeID); err != nil {
			return s, refuse("%s: %v", settingName(c, "node-id", "fluxkv_spec.node_id", fo.NodeID != ""), err)
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

// ownerEtcdSettings checks an owner's --master etcd://... (HA, DESIGN §12: the owner
// follows the leader published there; without a prefix it is /fluxkv/<cluster name>/)
// and merges --etcd-cacert, --etcd-cert and --etcd-key over the file's, which only go
// with it.
func ownerEtcdSettings(c *cli.Context, fo config.Owner, s *config.Owner) error {
	const sec = config.OwnerSection + "."
	name := func(flag, key string, fromFile bool) string { return settingName(c, flag, sec+key, fromFile) }
	s.EtcdCACert = str(c, "etcd-cacert", fo.EtcdCACert)
	s.EtcdCert = str(c, "etcd-cert", fo.EtcdCert)
	s.EtcdKey = str(c, "etcd-key", fo.EtcdKey)
	if !ha.IsURL(s.Master) {
		for _, t := range []struct {
			flag, key, v string
			fromFile     bool
		}{
			{"etcd-cacert", "etcd_cacert", s.EtcdCACert, fo.EtcdCACert != ""},
			{"etcd-cert", "etcd_cert", s.EtcdCert, fo.EtcdCert != ""},
			{"etcd-key", "etcd_key", s.EtcdKey, fo.EtcdKey != ""},
		} {
			if t.v != "" {
				return refuse("%s needs --master %sHOST:PORT[,HOST:PORT...] (fluxkv_spec.master): it is for the connection to etcd", name(t.flag, t.key, t.fromFile), ha.Scheme)
			}
		}
		return nil
	}
	if _, err := ha.ParseURL(s.Master, s.ClusterName); err != nil {
		return refuse("%s: %v", name("master", "master", fo.Master != ""), err)
	}
	if err := certPair(s.EtcdCert, s.EtcdKey, fo.EtcdCert != "", fo.EtcdKey != "", "fluxkv_spec.", name); err != nil {
		return err
	}
	return nil
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
	if paths && !limitsSet && s.LargeLimitSize == nil {
		return refuse("--ssd-path (--large-file-paths) needs --ssd-limit (--large-limit-size; YAML fluxkv_spec.large_limit_size): " +
			"one SSD ring size per path, e.g. --ssd-limit 4GiB; without it the node would run without SSD")
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

// checkSSDSpace refuses, before anything starts, an SSD limit the file system under its
// path cannot hold (ssd.CheckSpace: the free space plus this owner's shard files from an
// earlier run). What only opening the SSD tier finds (file system overhead, quotas, the
// largest file) stack.owner refuses the same way: exit status 2, as every refused setting.
func checkSSDSpace(oc config.Owner) error {
	if !oc.SSDEnabled() {
		return nil
	}
	// The options the owner will open the tier with.
	if err := ssd.CheckSpace(*ownerOptions(oc, "", nil, nil).SSD); errors.Is(err, ssd.ErrLimit) {
		return refuse("%v", err)
	}
	return nil // any other error is the start's to report
}

// checkDRAM refuses a segment larger than the machine's memory: the memfd would be
// created, and the node would fail (or swap, or be OOM-killed) only once it fills.
func checkDRAM(c *cli.Context, dram int64, fromFile bool) error {
	total, err := memTotal()
	if err != nil {
		logger.Warn().Err(err).Msg("cannot check --dram against the machine's memory")
		return nil
	}
	if seg := segmentSize(dram); seg > total {
		return refuse("%s %s exceeds this machine's memory (%s, MemTotal)",
			settingName(c, "dram", "fluxkv_spec.dram", fromFile), humanSize(dram), approxSize(total))
	}
	return nil
}

// maxConnections applies --max-connections over the file's max_connections: ≥ 0, and
// the two sockets' caps together not above the open-file limit, which would make the
// cap one the node cannot reach.
func maxConnections(c *cli.Context, s *config.Owner, fromFile bool) error {
	if c.IsSet("max-connections") {
		s.MaxConnections = c.Int("max-connections")
	}
	name := settingName(c, "max-connections", "fluxkv_spec.max_connections", fromFile)
	if s.MaxConnections < 0 {
		return refuse("%s must be ≥ 0, got %d (0 = derived from the open-file limit)", name, s.MaxConnections)
	}
	if s.MaxConnections == 0 {
		return nil
	}
	limit, err := openFileLimit()
	if err != nil {
		logger.Warn().Err(err).Msg("cannot check --max-connections against the open-file limit")
		return nil
	}
	if 2*uint64(s.MaxConnections) > limit {
		return refuse("%s %d per socket (attach and RPC: %d) exceeds the open-file limit (RLIMIT_NOFILE %d): raise the limit (LimitNOFILE= in the unit) or lower the cap",
			name, s.MaxConnections, 2*s.MaxConnections, limit)
	}
	return nil
}

// isolationSettings applies --transfer-reserve, --allow-uid, --client-isolation,
// --put-area, --put-area-total and --frame-memory over the file's transfer_reserve,
// allowed_uids, client_isolation, put_area, put_area_total and frame_memory.
// minFrameMemory is the smallest --frame-memory: two frames of the largest size.
const minFrameMemory = 2 * int64(wire.MaxFrameBytes)

func isolationSettings(c *cli.Context, s *config.Owner) error {
	if c.IsSet("transfer-reserve") {
		var n int64
		if v := c.String("transfer-reserve"); v != "off" {
			var err error
			if n, err = ssd.ParseSize(v); err != nil || n < 0 {
				return refuse("--transfer-reserve %q: want a size such as 64MiB, 0 or off", v)
			}
		}
		s.TransferReserve = &n
	}
	if c.IsSet("allow-uid") {
		s.AllowedUIDs = []uint32{}
		for _, u := range c.IntSlice("allow-uid") {
			if u < 0 || u > math.MaxUint32-1 {
				return refuse("--allow-uid %d: not a uid", u)
			}
			s.AllowedUIDs = append(s.AllowedUIDs, uint32(u))
		}
	}
	if c.IsSet("client-isolation") {
		b := c.Bool("client-isolation")
		s.ClientIsolation = &b
	}
	for _, a := range []struct {
		flag string
		dst  *int64
		min  int64
	}{{"put-area", &s.PutArea, 4096}, {"put-area-total", &s.PutAreaTotal, 1 << 20}, {"frame-memory", &s.FrameMemory, minFrameMemory}} {
		if !c.IsSet(a.flag) {
			continue
		}
		n, err := ssd.ParseSize(c.String(a.flag))
		if err != nil {
			return refuse("--%s: %v", a.flag, err)
		}
		if n < a.min {
			return refuse("--%s %s: must be at least %s", a.flag, c.String(a.flag), humanSize(a.min))
		}
		*a.dst = n
	}
	if s.FrameMemory != 0 && s.FrameMemory < minFrameMemory { // from the file (the flag is checked above)
		return refuse("fluxkv_spec.frame_memory (--frame-memory) %s: must be at least %s", humanSize(s.FrameMemory), humanSize(minFrameMemory))
	}
	return nil
}
