package main

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/daemon"
	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/shm"
	"github.com/fluxkv/fluxkv/ssd"
)

// Settings come from three places, in this order of precedence: a flag given on the
// command line (or its environment variable), the --config file, the flag's default.
// Each is declared once, in settingtable.go, and merged in the order of the flags;
// the settings that go together are checked next, the addresses and names last. A
// value that cannot mean what it says (a negative duration, a DRAM size beyond the
// machine's memory, SSD paths without limits) is refused at start with exit status 2
// and a message naming the flag, and the YAML key when the value came from the file:
// a service must not run quietly with something other than what it was told.

// Master defaults the merged settings are checked with (master.Options' defaults).
const (
	defaultNodeTTL           = 5 * time.Second
	defaultHeartbeatInterval = time.Second
	defaultInflightTTL       = time.Minute
	defaultAllocWait         = 5 * time.Second
)

// minMasterTime is the shortest node TTL, heartbeat interval and in-flight TTL: owners
// get them in whole milliseconds (RegisterResponse), and take 0 for their defaults.
const minMasterTime = time.Millisecond

// minFrameMemory is the smallest --frame-memory: two frames of the largest size.
const minFrameMemory = 2 * int64(wire.MaxFrameBytes)

// settingName names a setting in a refusal: the flag when it was given on the command
// line or nothing set it, else the YAML key with its flag.
func settingName(c *cli.Context, flag, key string, fromFile bool) string {
	if c.IsSet(flag) || !fromFile {
		return "--" + flag
	}
	return key + " (--" + flag + ")"
}

// refuse is a start-up refusal: exit status 2 with the message.
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

// loadConfig reads --config for role; without --config it is an empty file. A word
// left after the flags is refused: the flags after it were never read (`--dram 64 GiB`
// ran a 64-byte cache with every later flag dropped).
func loadConfig(c *cli.Context, role config.Role) (*config.File, error) {
	if c.NArg() > 0 {
		return nil, refuse("fluxkv %s takes no arguments, got %q: flags after it were not read (a size takes no space before its unit: --dram 64GiB)",
			c.Command.Name, c.Args().First())
	}
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

// maxAllocWait bounds --alloc-wait below the owner's master call bound (15 s) and the
// oldest plan a batch get carries out (10 s); maxPersistWorkers bounds --persist-workers.
const (
	maxAllocWait      = 10 * time.Second
	maxPersistWorkers = 4096
)

// masterSettings merges the file's master section under the flags.
func masterSettings(c *cli.Context, f *config.File) (config.Master, error) {
	var fm config.Master
	if f.Master != nil {
		fm = *f.Master
	}
	s := config.Master{LogLevel: fm.LogLevel, LogFormat: fm.LogFormat}
	s.ClusterSecretFiles, s.InsecureCluster = clusterSettings(c, fm.ClusterSecretFiles, fm.InsecureCluster)
	t := masterTable()
	if err := t.merge(c, &fm, &s); err != nil {
		return s, err
	}
	if err := t.check(c, &fm, &s); err != nil {
		return s, err
	}
	ttl, hb, inflight := cmp.Or(s.NodeTTL, defaultNodeTTL), cmp.Or(s.HeartbeatInterval, defaultHeartbeatInterval), cmp.Or(s.InflightTTL, defaultInflightTTL)
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"node-ttl", ttl}, {"heartbeat-interval", hb}, {"inflight-ttl", inflight}} {
		if d.v < minMasterTime {
			return s, refuse("%s %v is under %v: owners are told it in whole milliseconds", t.name(c, d.flag, &fm), d.v, minMasterTime)
		}
	}
	if ttl < 2*hb {
		return s, refuse("%s %v must be at least twice %s %v (an owner's lease ends a quarter heartbeat before the TTL: one heartbeat late or lost must not end it)",
			t.name(c, "node-ttl", &fm), ttl, t.name(c, "heartbeat-interval", &fm), hb)
	}
	// A batch get's plan older than min(10 s, in-flight TTL/6) is revoked and made again
	// (the owner's planAge): a wait for room as long would double such a batch's wait.
	planAge := min(maxAllocWait, inflight/6)
	switch {
	case s.AllocWait > planAge:
		return s, refuse("%s %v is over %v, the oldest plan an owner still carries out (at most 10 s, and a sixth of %s %v): an owner's call to the master ends after 15 s, and a batch whose plans waited longer is planned again (a put waiting longer would be answered UNAVAILABLE, not NO_SPACE, while the master may still place it)",
			t.name(c, "alloc-wait", &fm), s.AllocWait, planAge, t.name(c, "inflight-ttl", &fm), inflight)
	case s.AllocWait == 0 && defaultAllocWait > planAge:
		s.AllocWait = planAge / 2 // a short in-flight TTL lowers the default
	}
	if s.PersistWorkers > maxPersistWorkers {
		return s, refuse("%s %d is over %d (one goroutine each)", t.name(c, "persist-workers", &fm), s.PersistWorkers, maxPersistWorkers)
	}
	if !isUp(c) { // up's: upListenClash
		if err := listenClash(listener{t.name(c, "listen", &fm), s.Listen}, listener{t.name(c, "metrics-addr", &fm), s.MetricsAddr}); err != nil {
			return s, err
		}
	}
	if hasFlag(c, "etcd-endpoints") {
		if err := haSettings(c, fm, &s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// haSettings merges the master's etcd settings (HA, docs/architecture.md §12) over the file's and
// checks them together. Without endpoints the master runs alone and every other HA
// setting is refused (it would be silently ignored); with them the prefix is resolved
// (default /fluxkv/<cluster name>/) and the cluster name is kept.
func haSettings(c *cli.Context, fm config.Master, s *config.Master) error {
	t := haTable()
	if err := t.merge(c, &fm, s); err != nil {
		return err
	}
	if err := t.check(c, &fm, s); err != nil {
		return err
	}
	if len(s.EtcdEndpoints) == 0 {
		for _, r := range t.rows {
			if r.key != "etcd_endpoints" && r.key != "cluster_name" && r.kind.has(s) {
				return refuse("%s needs --etcd-endpoints (master.etcd_endpoints): without etcd the master runs alone", t.ref(&r).name(c, r.kind.has(&fm)))
			}
		}
		s.ClusterName = "" // it only names the etcd prefix
		return nil
	}
	if s.EtcdPrefix == "" {
		s.EtcdPrefix = ha.DefaultPrefix(s.ClusterName)
	}
	if err := config.CheckEtcdPrefix(s.EtcdPrefix); err != nil {
		return refuse("%s: %v", t.name(c, "etcd-prefix", &fm), err)
	}
	if err := certPair(c, t, &fm, s); err != nil {
		return err
	}
	if s.AdvertiseAddr != "" {
		if err := config.CheckAdvertiseAddr(s.AdvertiseAddr); err != nil {
			return refuse("%s: %v", t.name(c, "advertise-addr", &fm), err)
		}
	} else if config.IsWildcardAddr(s.Listen) {
		return refuse("--advertise-addr (master.advertise_addr) is required with etcd endpoints when %s %q is a wildcard or port 0: "+
			"the leader publishes the address owners reach it at", masterTable().name(c, "listen", &fm), s.Listen)
	}
	return nil
}

// certPair refuses an etcd client certificate without its key, or the reverse; t is
// the section's table, file the file's section.
func certPair[S, O any](c *cli.Context, t *table[S, O], file, s *S) error {
	have, lack := t.row("etcd-cert"), t.row("etcd-key")
	if have.kind.has(s) == lack.kind.has(s) {
		return nil
	}
	if !have.kind.has(s) {
		have, lack = lack, have
	}
	l := t.ref(lack)
	return refuse("%s without --%s (%s): give both the client certificate and its key, or neither",
		t.ref(have).name(c, have.kind.has(file)), l.flag, l.key)
}

// ownerSettings merges the file's fluxkv_spec section under the flags. The master
// address is not required here: `up` supplies its embedded master's.
func ownerSettings(c *cli.Context, f *config.File) (config.Owner, error) {
	var fo config.Owner
	if f.Owner != nil {
		fo = *f.Owner
	}
	s := config.Owner{LogLevel: fo.LogLevel, LogFormat: fo.LogFormat}
	s.ClusterSecretFiles, s.InsecureCluster = clusterSettings(c, fo.ClusterSecretFiles, fo.InsecureCluster)
	// `up` has no --master flag (its owner registers with the embedded master):
	// there Master is the file's value, which up ignores with a warning.
	t, mt := ownerTable(), ownerMasterTable()
	for _, merge := range []func(*cli.Context, *config.Owner, *config.Owner) error{t.merge, mt.merge, ownerEtcdTable().merge} {
		if err := merge(c, &fo, &s); err != nil {
			return s, err
		}
	}
	if err := checkMaxConnections(t.name(c, "max-connections", &fo), s.MaxConnections); err != nil {
		return s, err
	}
	if err := checkDRAM(t.name(c, "dram", &fo), s.DRAM, s.LandingReserve); err != nil {
		return s, err
	}
	if s.TransferReserve != nil && *s.TransferReserve >= s.DRAM {
		return s, refuse("%s %s must be below the DRAM segment %s (the rest is the memory pool)",
			t.name(c, "transfer-reserve", &fo), humanSize(*s.TransferReserve), humanSize(s.DRAM))
	}
	if err := ownerSSDFlags(c, &s); err != nil {
		return s, err
	}
	if err := putAreaFlags(c, &fo, &s); err != nil {
		return s, err
	}
	// As --dir: a relative path is the working directory's now, not the one a service
	// manager starts the owner in (/ under systemd). A new slice: the file's is shared.
	if s.LargeFilePaths != nil {
		paths := make([]string, len(s.LargeFilePaths))
		for i, p := range s.LargeFilePaths {
			paths[i] = p
			if p == "" {
				continue // the SSD tier refuses it
			}
			a, err := filepath.Abs(p)
			if err != nil {
				return s, cli.Exit(fmt.Sprintf("SSD path %q: %v", p, err), 2)
			}
			paths[i] = a
		}
		s.LargeFilePaths = paths
	}
	if s.SocketDir == "" { // --dir "" (the file refuses an empty value itself), not the working directory
		return s, refuse("--dir: empty (leave it out for the default %s)", wire.DefaultDir())
	}
	dir, err := filepath.Abs(s.SocketDir)
	if err != nil {
		return s, cli.Exit(fmt.Sprintf("socket directory %q: %v", s.SocketDir, err), 2)
	}
	s.SocketDir = dir
	if err := dirOrCreatable(dir); err != nil {
		return s, refuse("%s %s: %v", t.name(c, "dir", &fo), dir, err)
	}
	// One owned by another user is refused at the start too, but with exit status 1,
	// which a service manager restarts for good (RestartPreventExitStatus=2).
	if _, err := wire.CheckDir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return s, refuse("%s: %v", t.name(c, "dir", &fo), err)
	}
	// The longer of the owner's two sockets must fit sun_path: the owner would find it
	// only when it listens, after the master has started.
	if p := wire.RPCSocketPath(filepath.Join(dir, wire.SocketName)); shm.CheckSocketPath(p) != nil {
		return s, refuse("%s %s: socket path %q is %d bytes, a Unix socket path holds at most %d: choose a shorter directory",
			t.name(c, "dir", &fo), dir, p, len(p), shm.MaxSocketPath)
	}
	if err := ownerEtcdSettings(c, fo, &s); err != nil {
		return s, err
	}
	for _, check := range []func(*cli.Context, *config.Owner, *config.Owner) error{t.check, mt.check} {
		if err := check(c, &fo, &s); err != nil {
			return s, err
		}
	}
	if err := listenClash(ownerListeners(c, &fo, &s, !isUp(c))...); err != nil {
		return s, err
	}
	if !isUp(c) { // up's master is its own: upListenClash
		if err := loopbackListeners(c, &fo, &s, s.Master); err != nil {
			return s, err
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

// ownerEtcdSettings checks an owner's --master etcd://... (HA, docs/architecture.md §12: the owner
// follows the leader published there; without a prefix it is /fluxkv/<cluster name>/)
// with --etcd-cacert, --etcd-cert and --etcd-key, which only go with it.
func ownerEtcdSettings(c *cli.Context, fo config.Owner, s *config.Owner) error {
	t := ownerEtcdTable()
	if !ha.IsURL(s.Master) {
		for _, r := range t.rows {
			if r.kind.has(s) {
				return refuse("%s needs --master %sHOST:PORT[,HOST:PORT...] (fluxkv_spec.master): it is for the connection to etcd",
					t.ref(&r).name(c, r.kind.has(&fo)), ha.Scheme)
			}
		}
		return nil
	}
	if _, err := ha.ParseURL(s.Master, s.ClusterName); err != nil {
		return refuse("%s: %v", ownerMasterTable().name(c, "master", &fo), err)
	}
	return certPair(c, t, &fo, s)
}

// ownerSSDFlags applies --large-limit-size with --large-file-paths (merged already),
// each replacing the file's list; the pair is then checked together by the seed's
// rules (ssd.Config).
func ownerSSDFlags(c *cli.Context, s *config.Owner) error {
	paths, limitsSet := c.IsSet("large-file-paths"), c.IsSet("large-limit-size")
	if !paths && !limitsSet {
		return nil
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
	for i, p := range oc.LargeFilePaths {
		if err := dirOrCreatable(p); err != nil {
			return refuse("ssd: large_file_paths[%d] %s: %v (--ssd-path names SSD cache directories)", i, p, err)
		}
	}
	// The options the owner will open the tier with.
	so := *ownerOptions(oc, "", nil, nil).SSD
	if err := ssd.CheckSpace(so); errors.Is(err, ssd.ErrLimit) {
		return refuse("%v", err)
	}
	if err := ssd.CheckDirectIO(so); err != nil {
		return refuse("%v (--ssd-path, large_file_paths: a directory on a file system that takes O_DIRECT)", err)
	}
	return nil // any other error is the start's to report
}

// dirOrCreatable refuses a directory path (sockets, SSD) that is something else, or
// whose nearest existing ancestor is not a directory (the owner creates the rest);
// what it cannot stat is left to the start to report.
func dirOrCreatable(path string) error {
	p := filepath.Clean(path)
	for {
		fi, err := os.Stat(p)
		switch {
		case err == nil && fi.IsDir():
			return nil
		case err == nil && p == filepath.Clean(path):
			return errors.New("not a directory")
		case err == nil:
			return fmt.Errorf("%s is not a directory", p)
		case !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR), p == filepath.Dir(p):
			return nil
		}
		p = filepath.Dir(p)
	}
}

// checkEtcdTLS refuses TLS files towards etcd that cannot be read or hold no
// certificate or key (the connection to etcd would find it only after the start,
// with exit status 1); tls is what the flags and the file merged into.
func checkEtcdTLS(tls ha.TLS) error {
	if err := tls.Check(); err != nil {
		return refuse("--etcd-cacert/--etcd-cert/--etcd-key: %v", err)
	}
	return nil
}

// checkDRAM refuses a segment larger than the machine's memory or this process's memory
// cgroup limit: the memfd would be created, and the node would fail (or swap, or be
// OOM-killed) at its prefault or once it fills. name names the setting.
func checkDRAM(name string, dram, landing int64) error {
	with := ""
	if landing > 0 {
		with = " with the landing reserve of " + humanSize(landing)
	}
	total, err := memTotal()
	if err != nil {
		logger.Warn().Err(err).Msg("cannot check --dram against the machine's memory")
	} else if dram > total || landing > total || segmentSize(dram)+segmentSize(landing) > total {
		// Each size alone first: one near the int64 limit would wrap negative when
		// rounded up to the page or added to the other, and pass.
		return refuse("%s %s%s exceeds this machine's memory (%s, MemTotal)", name, humanSize(dram), with, approxSize(total))
	}
	// A container's or unit's memory limit: the owner faulting the segment in (or its
	// clients filling it) would be OOM-killed, with no message.
	if limit, file := cgroupMemoryLimit(); limit > 0 && segmentSize(dram)+segmentSize(landing) > limit {
		return refuse("%s %s%s exceeds this process's memory cgroup limit (%s, %s): the segment is charged to it; raise the limit "+
			"(the container's, or MemoryMax= of the unit) above the segment and the owner's own memory, or lower the size",
			name, humanSize(dram), with, approxSize(limit), file)
	}
	// Memory others hold now is no reason to refuse (it may be freed, and the segment
	// is faulted in only as it fills), but a segment that cannot fit in what is free
	// now ends, once full, in swapping or the OOM killer.
	if avail, err := memAvailable(); err == nil && segmentSize(dram)+segmentSize(landing) > avail {
		logger.Warn().Str("setting", name).Int64("bytes", segmentSize(dram)+segmentSize(landing)).Int64("mem_available", avail).
			Msgf("%s %s%s exceeds the memory available now (%s, MemAvailable): once the cache fills, the machine may swap or its OOM killer end the owner or a client",
				name, humanSize(dram), with, approxSize(avail))
	}
	return nil
}

// checkMaxConnections refuses a --max-connections (or max_connections, as name says)
// below 0, or with the two sockets' caps together above the open-file limit, which
// would make it a cap the node cannot reach.
func checkMaxConnections(name string, n int) error {
	if n < 0 {
		return refuse("%s must be ≥ 0, got %d (0 = derived from the open-file limit)", name, n)
	}
	if n == 0 {
		return nil
	}
	limit, err := openFileLimit()
	if err != nil {
		logger.Warn().Err(err).Msg("cannot check --max-connections against the open-file limit")
		return nil
	}
	if 2*uint64(n) > limit {
		return refuse("%s %d per socket (attach and RPC: %d) exceeds the open-file limit (RLIMIT_NOFILE %d): raise the limit (LimitNOFILE= in the unit) or lower the cap",
			name, n, 2*n, limit)
	}
	return nil
}

// A listener is one TCP listener of a process: the setting's name (settingName) and
// its merged address.
type listener struct{ name, addr string }

// listenClash refuses two listeners of one process on the same port of overlapping
// hosts (the same host, or a wildcard on either side): the second would fail to bind
// only once the components before it had started, with "address already in use" as
// if another process held the port. Port 0 (a free one) and unset addresses never
// clash; two hosts written differently are compared by the address each would bind
// (localhost is 127.0.0.1; a name is resolved only then, and one that does not resolve
// is left to the bind).
func listenClash(ls ...listener) error {
	type hostPort struct {
		host string
		port uint64
	}
	parse := func(a string) (hostPort, bool) {
		h, p, err := net.SplitHostPort(a)
		if err != nil {
			return hostPort{}, false
		}
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return hostPort{}, false
		}
		return hostPort{h, n}, true
	}
	wildcard := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "" || ip != nil && ip.IsUnspecified()
	}
	for i := range ls {
		a, ok := parse(ls[i].addr)
		if !ok {
			continue
		}
		for j := i + 1; j < len(ls); j++ {
			b, ok := parse(ls[j].addr)
			if !ok || a.port != b.port {
				continue
			}
			if a.host == b.host || wildcard(a.host) || wildcard(b.host) || sameBindIP(ls[i].addr, ls[j].addr) {
				return refuse("%s %q and %s %q are one port of one host: give each listener its own port (or port 0)",
					ls[i].name, ls[i].addr, ls[j].name, ls[j].addr)
			}
		}
	}
	return nil
}

// sameBindIP reports whether two host:port addresses resolve to one IP, the one
// net.Listen("tcp", ...) binds (the first IPv4 address of a name).
func sameBindIP(a, b string) bool {
	ra, err := net.ResolveTCPAddr("tcp", a)
	if err != nil {
		return false
	}
	rb, err := net.ResolveTCPAddr("tcp", b)
	return err == nil && ra.IP.Equal(rb.IP)
}

// isUp reports whether the running command is `fluxkv up`, whose master and owner
// listen in one process (upListenClash checks them together).
func isUp(c *cli.Context) bool { return c.Command != nil && c.Command.Name == "up" }

// ownerListeners are an owner's TCP listeners; metrics is false for `up`, where the
// node's one /metrics server may be the master section's (upListenClash).
func ownerListeners(c *cli.Context, fo, s *config.Owner, metrics bool) []listener {
	t := ownerTable()
	ls := []listener{
		{t.name(c, "peer-listen", fo), s.PeerListen},
		{t.name(c, "data-listen", fo), s.DataListen},
	}
	if metrics {
		ls = append(ls, listener{t.name(c, "metrics-addr", fo), s.MetricsAddr})
	}
	return ls
}

// putAreaFlags refuses put area settings that would be ignored (without client
// isolation) or cut down without a word (an area larger than the cap on all sessions'
// areas: no session could have it).
func putAreaFlags(c *cli.Context, fo, s *config.Owner) error {
	t := ownerTable()
	if s.ClientIsolation == nil || !*s.ClientIsolation {
		for _, f := range []struct {
			name string
			v    int64
		}{{"put-area", s.PutArea}, {"put-area-total", s.PutAreaTotal}} {
			if f.v != 0 {
				return refuse("%s is set without %s: put areas exist only under client isolation",
					t.name(c, f.name, fo), t.name(c, "client-isolation", fo))
			}
		}
		return nil
	}
	// (A put area larger than the segment is the segment: --put-area's "at most the segment".)
	if area, total := min(s.PutArea, s.DRAM), cmp.Or(s.PutAreaTotal, daemon.DefaultPutAreaTotal); area > total {
		return refuse("%s %s is larger than %s %s: no session could have it", t.name(c, "put-area", fo), humanSize(area),
			t.name(c, "put-area-total", fo), humanSize(total))
	}
	return nil
}

// loopbackListeners refuses a loopback peer or data listener when the owner's master
// is not on loopback, as the owner would once it had bound them
// (daemon.CheckListenReachable): other owners could not reach it. Following masters on
// etcd (etcd://...), the first etcd endpoint off loopback stands for the masters (they
// run beside etcd, not beside this owner).
func loopbackListeners(c *cli.Context, fo, s *config.Owner, master string) error {
	if ha.IsURL(master) {
		cfg, err := ha.ParseURL(master, "fluxkv")
		if err != nil {
			return nil // the etcd settings' check names it
		}
		master = ""
		for _, ep := range cfg.Endpoints {
			if daemon.CheckListenReachable("", "127.0.0.1:0", ep) != nil { // ep is off loopback
				master = ep
				break
			}
		}
	}
	if master == "" {
		return nil
	}
	peer := s.PeerListen
	if peer == "" {
		peer = "127.0.0.1:0" // the daemon's default
	}
	t := ownerTable()
	if err := daemon.CheckListenReachable(t.name(c, "peer-listen", fo), peer, master); err != nil {
		return refuse("%v", err)
	}
	if s.DataListen != "" { // else the peer listener's host
		if err := daemon.CheckListenReachable(t.name(c, "data-listen", fo), s.DataListen, master); err != nil {
			return refuse("%v", err)
		}
	}
	// The host both are registered at (the owner said "set --advertise-host" of one
	// that was set).
	if h := s.AdvertiseHost; h != "" && daemon.CheckListenReachable("", net.JoinHostPort(h, "0"), master) != nil {
		return refuse("%s %s is a loopback address but the master %s is not on loopback: other owners could not reach this owner; advertise a host they reach",
			t.name(c, "advertise-host", fo), h, master)
	}
	return nil
}

// upListenClash checks the listeners of `fluxkv up` together: the embedded master's,
// the owner's, and the one /metrics server (fluxkv_spec's address, else master's).
func upListenClash(c *cli.Context, f *config.File, mc config.Master, oc config.Owner) error {
	var fo config.Owner
	var fm config.Master
	if f.Owner != nil {
		fo = *f.Owner
	}
	if f.Master != nil {
		fm = *f.Master
	}
	ls := append([]listener{{masterTable().name(c, "listen", &fm), mc.Listen}}, ownerListeners(c, &fo, &oc, false)...)
	if oc.MetricsAddr != "" {
		ls = append(ls, listener{ownerTable().name(c, "metrics-addr", &fo), oc.MetricsAddr})
	} else {
		ls = append(ls, listener{masterTable().name(c, "metrics-addr", &fm), mc.MetricsAddr})
	}
	if err := listenClash(ls...); err != nil {
		return err
	}
	return loopbackListeners(c, &fo, &oc, mc.Listen)
}
