package main

import (
	"errors"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/daemon"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// The owner and master settings that have a flag, each declared once (setting.go):
// flag, YAML key, kind, options field. The tables are built for each use: urfave/cli
// records in a flag whether it was set.

// ownerTable is the fluxkv_spec settings of `fluxkv owner` and `fluxkv up`, merged
// into config.Owner and set in daemon.Options.
func ownerTable() *table[config.Owner, daemon.Options] {
	return &table[config.Owner, daemon.Options]{section: config.OwnerSection, rows: []setting[config.Owner, daemon.Options]{
		{flag: &cli.StringFlag{Name: "dir", Aliases: []string{"socket-dir"}, Value: wire.DefaultDir(),
			Usage: "directory for the sockets (DIR/fluxkv.sock); its group decides who may attach"},
			key: "socket_dir", kind: text(func(s *config.Owner) *string { return &s.SocketDir }, nil), // made absolute by ownerSettings
			set: func(o *daemon.Options, s *config.Owner) { o.Dir = s.SocketDir }},
		{flag: &cli.StringFlag{Name: "dram", Value: "1GiB", Usage: "DRAM segment size: 512MiB, 1.5GiB, 4GB (binary units) or bytes; rounded up to the 4 KiB page, at most the machine's memory and its memory cgroup's limit"},
			key: "dram", kind: size(func(s *config.Owner) *int64 { return &s.DRAM }, 1), // checkDRAM: at most the machine's memory
			set: func(o *daemon.Options, s *config.Owner) { o.DRAM = s.DRAM }},
		{flag: &cli.StringFlag{Name: "node-id", DefaultText: "host name", Usage: "this owner's id in the cluster"},
			key: "node_id", kind: text(func(s *config.Owner) *string { return &s.NodeID }, ifGiven(wire.ValidateNodeID)),
			set: func(o *daemon.Options, s *config.Owner) { o.NodeID = s.NodeID }},
		{flag: &cli.StringFlag{Name: "cache-grace", DefaultText: "30s", Usage: "keep a released holding of a local replica in the owner's hot set this long, so later gets of the key skip the master: a duration ≥ 0; 0 or off disables the hot set"},
			key: "cache_grace", kind: replace(func(s *config.Owner) **time.Duration { return &s.CacheGrace }, parsedFlag(config.ParseCacheGrace)),
			set: func(o *daemon.Options, s *config.Owner) { o.CacheGrace = offNegative(s.CacheGrace) }},
		{flag: &cli.StringFlag{Name: "hot-set", DefaultText: "0.5", Usage: "the fraction of the memory pool (the segment less --transfer-reserve) that idle holdings in the hot set may keep pinned; past it the least recently released go: a number 0 < x ≤ 1; 0 or off disables the hot set"},
			key: "hot_set", kind: replace(func(s *config.Owner) **float64 { return &s.HotSet }, parsedFlag(config.ParseHotSet)),
			set: func(o *daemon.Options, s *config.Owner) { o.HotSet = offNegative(s.HotSet) }},
		{flag: &cli.IntFlag{Name: "max-connections", DefaultText: "derived from RLIMIT_NOFILE",
			Usage: "cap on the open connections of each owner socket (attach and RPC); the next one is accepted and refused with a clear error; 0 = derived from the open-file limit"},
			key: "max_connections", kind: replace(func(s *config.Owner) *int { return &s.MaxConnections }, intFlag), // checkMaxConnections
			set: func(o *daemon.Options, s *config.Owner) { o.MaxConnections = s.MaxConnections }},
		{flag: &cli.StringFlag{Name: "uid-share", DefaultText: "off", Usage: "the largest share of each socket's connection cap, of --put-area-total and of --frame-memory that the clients of one uid other than the owner's and root may take, for owners that admit several tenants: a fraction 0 < x ≤ 1 such as 0.5; off = 1 (no per-uid bound)"},
			key: "uid_share", kind: replace(func(s *config.Owner) **float64 { return &s.UIDShare }, parsedFlag(config.ParseUIDShare)),
			set: func(o *daemon.Options, s *config.Owner) {
				if s.UIDShare != nil {
					o.UIDShare = *s.UIDShare
				}
			}},
		{flag: &cli.DurationFlag{Name: "hello-timeout", DefaultText: "5s", Usage: "close an attach connection whose hello has not arrived within this; > 0"},
			key: "hello_timeout", kind: duration(func(s *config.Owner) *time.Duration { return &s.HelloTimeout }),
			set: func(o *daemon.Options, s *config.Owner) { o.HelloTimeout = s.HelloTimeout }},
		{flag: &cli.DurationFlag{Name: "frame-timeout", DefaultText: "10s", Usage: "close an RPC connection whose request (once begun) or reply does not complete within this; > 0"},
			key: "frame_timeout", kind: duration(func(s *config.Owner) *time.Duration { return &s.FrameTimeout }),
			set: func(o *daemon.Options, s *config.Owner) { o.FrameTimeout = s.FrameTimeout }},
		{flag: &cli.DurationFlag{Name: "idle-timeout", DefaultText: "10s", Usage: "close an RPC connection idle this long unless its last call named a live session; > 0"},
			key: "idle_timeout", kind: duration(func(s *config.Owner) *time.Duration { return &s.IdleTimeout }),
			set: func(o *daemon.Options, s *config.Owner) { o.IdleTimeout = s.IdleTimeout }},
		{flag: &cli.IntSliceFlag{Name: "allow-uid", Usage: "a uid that may attach besides root, the owner's uid and members of the socket's group (primary or supplementary); repeatable"},
			key: "allowed_uids", kind: replace(func(s *config.Owner) *[]uint32 { return &s.AllowedUIDs }, uidsFlag),
			set: func(o *daemon.Options, s *config.Owner) { o.AllowedUIDs = s.AllowedUIDs }},
		{flag: &cli.StringFlag{Name: "transfer-reserve", DefaultText: "min(dram/8, 256MiB)",
			Usage: "transfer area at the end of --dram, outside the memory pool, for puts the master places on other owners (a larger value is placed here) and remote gets that are not promoted; lent to the pool while no transfer needs it; 0 or off: none"},
			key: "transfer_reserve", kind: replace(func(s *config.Owner) **int64 { return &s.TransferReserve }, transferReserveFlag), // below dram: ownerSettings
			set: func(o *daemon.Options, s *config.Owner) { o.TransferReserve = offNegative(s.TransferReserve) }},
		{flag: &cli.StringFlag{Name: "landing-reserve", DefaultText: "0 (none)",
			Usage: "memory beyond --dram, outside the memory pool and never lent to it, where gets of values other owners hold land when they are not promoted: a full owner then evicts nothing for its reads from other owners (without it each such get in flight takes a value's room); the segment is dram + this"},
			key: "landing_reserve", kind: size(func(s *config.Owner) *int64 { return &s.LandingReserve }, 0),
			set: func(o *daemon.Options, s *config.Owner) { o.LandingReserve = s.LandingReserve }},
		{flag: &cli.BoolFlag{Name: "client-isolation",
			Usage: "no client can change a byte it did not put: the segment is sealed against client writes and puts go through per-session put areas the owner copies from (reads are never isolated)"},
			key: "client_isolation", kind: replace(func(s *config.Owner) **bool { return &s.ClientIsolation }, boolFlag),
			set: func(o *daemon.Options, s *config.Owner) {
				o.ClientIsolation = s.ClientIsolation != nil && *s.ClientIsolation
			}},
		{flag: &cli.BoolFlag{Name: "prefault", Value: true,
			Usage: "allocate the whole segment (--dram + --landing-reserve) at start, every page faulted in, so no put pays a page's first touch and a machine without the memory fails at start; --prefault=false takes pages as they are first written"},
			key: "prefault", kind: replace(func(s *config.Owner) **bool { return &s.Prefault }, boolFlag),
			set: func(o *daemon.Options, s *config.Owner) { o.Prefault = s.Prefault == nil || *s.Prefault }},
		{flag: &cli.BoolFlag{Name: "huge-pages", Value: true,
			Usage: "advise transparent huge pages for the segment: where the kernel allows them for shared memory (/sys/kernel/mm/transparent_hugepage/shmem_enabled advise, within_size or always) the prefault backs it with 2 MiB pages, which clients map with a 512th of the page-table entries; --huge-pages=false refuses them"},
			key: "huge_pages", kind: replace(func(s *config.Owner) **bool { return &s.HugePages }, boolFlag),
			set: func(o *daemon.Options, s *config.Owner) { o.HugePages = s.HugePages == nil || *s.HugePages }},
		{flag: &cli.StringFlag{Name: "put-area", DefaultText: "32MiB", Usage: "under --client-isolation, each session's put area (larger values stream through it); at most the segment"},
			key: "put_area", kind: size(func(s *config.Owner) *int64 { return &s.PutArea }, 4096),
			set: func(o *daemon.Options, s *config.Owner) { o.PutArea = s.PutArea }},
		{flag: &cli.StringFlag{Name: "frame-memory", DefaultText: "an eighth of --dram (at most of RAM), ≥ 64MiB", Usage: "bound on the bytes of request frames in progress across the RPC connections (the peer port has its own, a quarter of it, ≥ 64MiB); a frame that finds no room within --frame-timeout is refused; ≥ 64MiB"},
			key: "frame_memory", kind: size(func(s *config.Owner) *int64 { return &s.FrameMemory }, minFrameMemory),
			set: func(o *daemon.Options, s *config.Owner) { o.FrameMemory = s.FrameMemory }},
		{flag: &cli.StringFlag{Name: "put-area-total", DefaultText: "1GiB", Usage: "under --client-isolation, the cap on all sessions' put areas together; ≥ 1MiB"},
			key: "put_area_total", kind: size(func(s *config.Owner) *int64 { return &s.PutAreaTotal }, 1<<20),
			set: func(o *daemon.Options, s *config.Owner) { o.PutAreaTotal = s.PutAreaTotal }},
		{flag: &cli.StringFlag{Name: "peer-listen", Value: "127.0.0.1:0", Usage: "TCP address of the owner's peer service; other owners and the master connect to it"},
			key: "peer_listen", kind: text(func(s *config.Owner) *string { return &s.PeerListen }, ifGiven(config.CheckAddr)),
			set: func(o *daemon.Options, s *config.Owner) { o.PeerListen = s.PeerListen }},
		{flag: &cli.StringFlag{Name: "data-listen", DefaultText: "the --peer-listen host, port 0", Usage: "TCP address of the owner's data plane (other owners pull values from it)"},
			key: "data_listen", kind: text(func(s *config.Owner) *string { return &s.DataListen }, ifGiven(config.CheckAddr)),
			set: func(o *daemon.Options, s *config.Owner) { o.DataListen = s.DataListen }},
		{flag: &cli.StringFlag{Name: "advertise-host", DefaultText: "the listener's address, or for a wildcard this host's address towards the master",
			Usage: "host other owners and the master reach this owner's peer and data listeners at"},
			key: "advertise_host", kind: text(func(s *config.Owner) *string { return &s.AdvertiseHost }, ifGiven(config.CheckHost)),
			set: func(o *daemon.Options, s *config.Owner) { o.AdvertiseHost = s.AdvertiseHost }},
		// The SSD tier's options (ownerOptions), and the etcd prefix's default.
		{flag: &cli.StringFlag{Name: "cluster-name", Value: "fluxkv", Usage: "cluster name; names the SSD cache root <path>/<cluster>_cluster_kv_ssd_storage"},
			key: "cluster_name", kind: text(func(s *config.Owner) *string { return &s.ClusterName }, nonEmpty("it names the SSD cache root and the etcd prefix"))},
		{flag: &cli.StringFlag{Name: "instance-key", DefaultText: "the node id", Usage: "names this owner's SSD cache root under each path"},
			key: "instance_key", kind: text(func(s *config.Owner) *string { return &s.InstanceKey }, nil)}, // its default: ownerSettings
		{flag: &cli.StringSliceFlag{Name: "large-file-paths", Aliases: []string{"ssd-path"}, Usage: "SSD cache directories, comma-separated or repeated"},
			key: "large_file_paths", kind: replace(func(s *config.Owner) *[]string { return &s.LargeFilePaths }, stringsFlag)},
		{flag: &cli.StringSliceFlag{Name: "large-limit-size", Aliases: []string{"ssd-limit"}, Usage: "SSD ring space per --large-file-paths entry (same count; e.g. 4GiB,8GiB; each ≥ 512 bytes; a path on the device of an earlier one is skipped with its limit: one path per device); unset = SSD off"},
			key: "large_limit_size", kind: byHand(func(s *config.Owner) *[]int64 { return &s.LargeLimitSize })}, // ownerSSDFlags
		// The /metrics server's (stack.metrics).
		{flag: metricsAddrFlag(), common: true,
			key: "metrics_addr", kind: text(func(s *config.Owner) *string { return &s.MetricsAddr }, ifGiven(config.CheckAddr))},
	}}
}

// ownerMasterTable is `fluxkv owner`'s --master: a master's address, or masters on
// etcd to follow (ownerOptions: `up`'s owner registers with its embedded master).
func ownerMasterTable() *table[config.Owner, daemon.Options] {
	return &table[config.Owner, daemon.Options]{section: config.OwnerSection, rows: []setting[config.Owner, daemon.Options]{
		{flag: &cli.StringFlag{Name: "master", Usage: "the master's host:port, or etcd://HOST:PORT[,HOST:PORT...][/PREFIX/] to follow the leader " +
			"of masters campaigning on etcd (prefix default /fluxkv/<cluster-name>/; TLS: --etcd-cacert, --etcd-cert, --etcd-key); " +
			"required here or in the config"},
			key: "master", kind: text(func(s *config.Owner) *string { return &s.Master }, ifGiven(func(v string) error {
				if ha.IsURL(v) {
					return nil // ownerEtcdSettings checks it
				}
				return config.CheckMaster(v)
			}))},
	}}
}

// ownerEtcdTable is `fluxkv owner`'s TLS towards etcd, used with --master etcd://...
func ownerEtcdTable() *table[config.Owner, ha.TLS] {
	return &table[config.Owner, ha.TLS]{section: config.OwnerSection, rows: []setting[config.Owner, ha.TLS]{
		{flag: &cli.StringFlag{Name: "etcd-cacert", Usage: "with --master etcd://...: CA certificate (PEM) that verifies etcd's certificate"},
			key: "etcd_cacert", kind: text(func(s *config.Owner) *string { return &s.EtcdCACert }, nil),
			set: func(o *ha.TLS, s *config.Owner) { o.CACert = s.EtcdCACert }},
		{flag: &cli.StringFlag{Name: "etcd-cert", Usage: "with --master etcd://...: client certificate (PEM) this owner presents to etcd; needs --etcd-key"},
			key: "etcd_cert", kind: text(func(s *config.Owner) *string { return &s.EtcdCert }, nil),
			set: func(o *ha.TLS, s *config.Owner) { o.Cert = s.EtcdCert }},
		{flag: &cli.StringFlag{Name: "etcd-key", Usage: "with --master etcd://...: private key (PEM) of --etcd-cert"},
			key: "etcd_key", kind: text(func(s *config.Owner) *string { return &s.EtcdKey }, nil),
			set: func(o *ha.TLS, s *config.Owner) { o.Key = s.EtcdKey }},
	}}
}

// masterTable is the master section's settings of `fluxkv master` and `fluxkv up`,
// merged into config.Master and set in master.Options.
func masterTable() *table[config.Master, master.Options] {
	return &table[config.Master, master.Options]{section: config.MasterSection, rows: []setting[config.Master, master.Options]{
		// The address the master's Start listens on; masterFlags sets the default.
		{flag: &cli.StringFlag{Name: "listen", Aliases: []string{"master-listen"},
			Usage: "master TCP address owners register on (host:port; port 0 picks a free one)"},
			key: "listen", kind: text(func(s *config.Master) *string { return &s.Listen }, config.CheckAddr)},
		{flag: &cli.DurationFlag{Name: "node-ttl", Value: defaultNodeTTL, Usage: "tomb an owner silent for this long; at least twice --heartbeat-interval"},
			key: "node_ttl", kind: duration(func(s *config.Master) *time.Duration { return &s.NodeTTL }),
			set: func(o *master.Options, s *config.Master) { o.NodeTTL = s.NodeTTL }},
		{flag: &cli.DurationFlag{Name: "heartbeat-interval", DefaultText: "1s", Usage: "how often owners heartbeat; at least 1ms, and at most half --node-ttl"},
			key: "heartbeat_interval", kind: duration(func(s *config.Master) *time.Duration { return &s.HeartbeatInterval }),
			set: func(o *master.Options, s *config.Master) { o.HeartbeatInterval = s.HeartbeatInterval }},
		{flag: &cli.DurationFlag{Name: "inflight-ttl", DefaultText: "1m0s", Usage: "revoke an in-flight put or get older than this; at least 1ms"},
			key: "inflight_ttl", kind: duration(func(s *config.Master) *time.Duration { return &s.InflightTTL }),
			set: func(o *master.Options, s *config.Master) { o.InflightTTL = s.InflightTTL }},
		{flag: &cli.BoolFlag{Name: "no-promotion", Usage: "never promote SSD refills to memory replicas (for measuring SSD-hit gets)"},
			key: "no_promotion", kind: either(func(s *config.Master) *bool { return &s.NoPromotion }),
			set: func(o *master.Options, s *config.Master) { o.NoPromotion = s.NoPromotion }},
		{flag: &cli.IntFlag{Name: "persist-workers", DefaultText: "32",
			Usage: "concurrent SSD persist calls (each writes one value to an owner's SSD; at most half of them for one owner); too few and a fast put stream overruns the persist queue, leaving values memory-only; ≥ 0, 0 = the default"},
			key: "persist_workers", kind: replace(func(s *config.Master) *int { return &s.PersistWorkers }, countFlag),
			set: func(o *master.Options, s *config.Master) { o.PersistWorkers = s.PersistWorkers }},
		{flag: &cli.DurationFlag{Name: "alloc-wait", DefaultText: "5s", Usage: "how long a put waits for space (eviction, releases) before NO_SPACE; > 0, at most 10s and a sixth of --inflight-ttl (default: 5s, or a twelfth of a shorter --inflight-ttl)"},
			key: "alloc_wait", kind: duration(func(s *config.Master) *time.Duration { return &s.AllocWait }),
			set: func(o *master.Options, s *config.Master) { o.AllocWait = s.AllocWait }},
		{flag: &cli.StringFlag{Name: "placement", Value: "pool",
			Usage: "where puts go: pool = the requester while it has room, else the owner with the most free bytes, else evict across the pool (duplicate copies first) and place where room was made; the target owner pulls the value from the requester's transfer area (--transfer-reserve); local = always the requester"},
			key: "placement", kind: text(func(s *config.Master) *string { return &s.Placement }, config.CheckPlacement),
			set: func(o *master.Options, s *config.Master) { o.Placement = s.Placement }},
		{flag: &cli.StringFlag{Name: "ssd-admit", Value: "evict",
			Usage: "when values reach the owners' SSD: evict = a KV page (put with a parent) as it nears eviction from memory, so SSD holds what memory evicted, not a second copy (plain keys at their put); put = every value at its put"},
			key: "ssd_admit", kind: text(func(s *config.Master) *string { return &s.SSDAdmit }, config.CheckSSDAdmit),
			set: func(o *master.Options, s *config.Master) { o.SSDAdmit = s.SSDAdmit }},
		// The /metrics server's (stack.metrics).
		{flag: metricsAddrFlag(), common: true,
			key: "metrics_addr", kind: text(func(s *config.Master) *string { return &s.MetricsAddr }, ifGiven(config.CheckAddr))},
	}}
}

// haTable is the master's settings for high availability on etcd (docs/architecture.md §12), set in
// master.HAOptions: `fluxkv master` only (`fluxkv up` is one node with its own
// master). haSettings checks them together.
func haTable() *table[config.Master, master.HAOptions] {
	return &table[config.Master, master.HAOptions]{section: config.MasterSection, rows: []setting[config.Master, master.HAOptions]{
		{flag: &cli.StringSliceFlag{Name: "etcd-endpoints",
			Usage: "etcd client endpoints (host:port or http(s)://host:port), comma-separated or repeated: the masters campaign there and only the leader serves; unset = this master runs alone"},
			key: "etcd_endpoints", kind: replace(func(s *config.Master) *[]string { return &s.EtcdEndpoints }, endpointsFlag),
			set: func(o *master.HAOptions, s *config.Master) { o.Etcd.Endpoints = s.EtcdEndpoints }},
		{flag: &cli.StringFlag{Name: "advertise-addr", DefaultText: "the --listen address",
			Usage: "host:port owners reach this master at, published on etcd while it leads; required with --etcd-endpoints when --listen is a wildcard or port 0"},
			key: "advertise_addr", kind: text(func(s *config.Master) *string { return &s.AdvertiseAddr }, nil),
			set: func(o *master.HAOptions, s *config.Master) { o.AdvertiseAddr = s.AdvertiseAddr }},
		{flag: &cli.StringFlag{Name: "etcd-prefix", DefaultText: "/fluxkv/<cluster-name>/",
			Usage: "key prefix of this cluster on etcd, starting and ending with /; owners name the same one"},
			key: "etcd_prefix", kind: text(func(s *config.Master) *string { return &s.EtcdPrefix }, nil),
			set: func(o *master.HAOptions, s *config.Master) { o.Etcd.Prefix = s.EtcdPrefix }},
		// The etcd prefix's default (haSettings, haOptions).
		{flag: &cli.StringFlag{Name: "cluster-name", Value: "fluxkv", Usage: "cluster name; names the default --etcd-prefix"},
			key: "cluster_name", kind: text(func(s *config.Master) *string { return &s.ClusterName }, nonEmpty("it names the etcd prefix"))},
		{flag: &cli.StringFlag{Name: "etcd-cacert", Usage: "CA certificate (PEM) that verifies etcd's certificate (TLS towards etcd)"},
			key: "etcd_cacert", kind: text(func(s *config.Master) *string { return &s.EtcdCACert }, nil),
			set: func(o *master.HAOptions, s *config.Master) { o.Etcd.TLS.CACert = s.EtcdCACert }},
		{flag: &cli.StringFlag{Name: "etcd-cert", Usage: "client certificate (PEM) this master presents to etcd; needs --etcd-key"},
			key: "etcd_cert", kind: text(func(s *config.Master) *string { return &s.EtcdCert }, nil),
			set: func(o *master.HAOptions, s *config.Master) { o.Etcd.TLS.Cert = s.EtcdCert }},
		{flag: &cli.StringFlag{Name: "etcd-key", Usage: "private key (PEM) of --etcd-cert"},
			key: "etcd_key", kind: text(func(s *config.Master) *string { return &s.EtcdKey }, nil),
			set: func(o *master.HAOptions, s *config.Master) { o.Etcd.TLS.Key = s.EtcdKey }},
		{flag: &cli.DurationFlag{Name: "leader-ttl", DefaultText: "2s",
			Usage: "etcd lease TTL of the leadership (etcd grants whole seconds): a crashed leader is replaced within about this; > 0"},
			key: "leader_ttl", kind: duration(func(s *config.Master) *time.Duration { return &s.LeaderTTL }).withDefault("2s"),
			set: func(o *master.HAOptions, s *config.Master) { o.LeaderTTL = s.LeaderTTL }},
	}}
}

// nonEmpty refuses a flag given as "" (the file refuses an empty value itself); why
// says what the value is for.
func nonEmpty(why string) func(string) error {
	return func(v string) error {
		if v == "" {
			return errors.New("empty: " + why)
		}
		return nil
	}
}

func ownerFlags() []cli.Flag { return ownerTable().flags() }

// upOwnerFlags are the owner's flags as `fluxkv up` takes them: its one owner has no
// transfer area unless told (upCommand).
func upOwnerFlags() []cli.Flag {
	t := ownerTable()
	t.row("transfer-reserve").flag.(*cli.StringFlag).DefaultText = "0 (none: one owner holds every put)"
	return t.flags()
}

// ownerMasterFlag is `fluxkv owner`'s --master.
func ownerMasterFlag() cli.Flag { return ownerMasterTable().flags()[0] }

// ownerEtcdFlags are the owner's flags for TLS towards etcd, used with --master
// etcd://...: `fluxkv owner` only.
func ownerEtcdFlags() []cli.Flag { return ownerEtcdTable().flags() }

// masterFlags are the master section's flags; listen is --listen's default.
func masterFlags(listen string) []cli.Flag {
	t := masterTable()
	t.row("listen").flag.(*cli.StringFlag).Value = listen
	return t.flags()
}

// haFlags are the master's flags for high availability on etcd: `fluxkv master` only.
func haFlags() []cli.Flag { return haTable().flags() }
