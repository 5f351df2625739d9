package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/urfave/cli/v2"

	"github.com/fluxkv/fluxkv/config"
	"github.com/fluxkv/fluxkv/daemon"
	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/ssd"
)

// The long-running commands all wire the same way: flags and --config → settings →
// metrics server → components → wait for SIGTERM/SIGINT → stop in reverse order,
// each step logged with its duration.

func masterCommand() *cli.Command {
	return &cli.Command{
		Name:  "master",
		Usage: "run the master (routes, allocation, membership) over TCP",
		Flags: append(append(append([]cli.Flag{configFlag(), metricsAddrFlag(), masterKeyFlag()}, masterFlags("127.0.0.1:7700")...), clusterFlags()...), haFlags()...),
		Action: func(c *cli.Context) error {
			ctx, cancel := signalContext()
			defer cancel()
			f, err := loadConfig(c, config.RoleMaster)
			if err != nil {
				return err
			}
			mc, err := masterSettings(c, f)
			if err != nil {
				return err
			}
			if len(mc.EtcdEndpoints) > 0 {
				if err := checkEtcdTLS(haOptions(mc).Etcd.TLS); err != nil {
					return err
				}
			}
			if err := applyLogSettings(c, mc.LogLevel, mc.LogFormat); err != nil {
				return err
			}
			secrets, err := clusterSecrets(c, "master", masterSecretsKey, mc.ClusterSecretFiles, mc.InsecureCluster)
			if err != nil {
				return err
			}
			masterKey, err := clusterMasterKey(c, f, secrets)
			if err != nil {
				return err
			}
			st := stack{masterKey: masterKey}
			m, err := st.metrics(mc.MetricsAddr, "master")
			if err != nil {
				return st.fail(ctx, err)
			}
			srv, err := st.master(mc, m, secrets, 0, false)
			if err != nil {
				return st.fail(ctx, err)
			}
			// The standalone master's gauges are cluster totals (an HA master's while
			// it leads).
			m.SetCapacityFunc(srv.Capacity)
			exportMaster(m, srv)
			waitStop(ctx)
			return st.stop()
		},
	}
}

func ownerCommand() *cli.Command {
	return &cli.Command{
		Name:  "owner",
		Usage: "run the per-node owner sidecar; it registers with a master",
		Flags: append([]cli.Flag{configFlag(), metricsAddrFlag(), ownerMasterFlag()},
			append(append(append(ownerFlags(), clusterFlags()...), masterPubKeyFlag()), ownerEtcdFlags()...)...),
		Action: func(c *cli.Context) error {
			ctx, cancel := signalContext()
			defer cancel()
			f, err := loadConfig(c, config.RoleOwner)
			if err != nil {
				return err
			}
			oc, err := ownerSettings(c, f)
			if err != nil {
				return err
			}
			if err := checkSSDSpace(oc); err != nil {
				return err
			}
			if ha.IsURL(oc.Master) {
				var tls ha.TLS
				ownerEtcdTable().apply(&oc, &tls)
				if err := checkEtcdTLS(tls); err != nil {
					return err
				}
			}
			if oc.Master == "" {
				return cli.Exit("owner: the master's address is required: --master HOST:PORT (or etcd://HOST:PORT,... for masters on etcd) or fluxkv_spec.master in --config", 2)
			}
			if err := applyLogSettings(c, oc.LogLevel, oc.LogFormat); err != nil {
				return err
			}
			secrets, err := clusterSecrets(c, "owner", ownerSecretsKey, oc.ClusterSecretFiles, oc.InsecureCluster)
			if err != nil {
				return err
			}
			pubKeys, err := clusterMasterPubKeys(c, f, secrets, nil)
			if err != nil {
				return err
			}
			st := stack{masterPubKeys: pubKeys}
			m, err := st.metrics(oc.MetricsAddr, "owner")
			if err != nil {
				return st.fail(ctx, err)
			}
			if _, err := st.owner(ctx, oc, oc.Master, m, secrets); err != nil {
				return st.fail(ctx, err)
			}
			waitStop(ctx)
			return st.stop()
		},
	}
}

func upCommand() *cli.Command {
	return &cli.Command{
		Name:  "up",
		Usage: "run a single-node cache: an embedded master and an owner in one process (the owner calls the master in-process)",
		Flags: append(append(append([]cli.Flag{configFlag(), metricsAddrFlag(), masterKeyFlag(), masterPubKeyFlag()}, upOwnerFlags()...), masterFlags("127.0.0.1:0")...), clusterFlags()...),
		Action: func(c *cli.Context) error {
			ctx, cancel := signalContext()
			defer cancel()
			f, err := loadConfig(c, config.RoleUp)
			if err != nil {
				return err
			}
			mc, err := masterSettings(c, f)
			if err != nil {
				return err
			}
			oc, err := ownerSettings(c, f)
			if err != nil {
				return err
			}
			if err := upListenClash(c, f, mc, oc); err != nil {
				return err
			}
			if err := checkSSDSpace(oc); err != nil {
				return err
			}
			// One process, one log and one /metrics: the owner's settings first.
			level, format := oc.LogLevel, oc.LogFormat
			if level == "" {
				level = mc.LogLevel
			}
			if format == "" {
				format = mc.LogFormat
			}
			if err := applyLogSettings(c, level, format); err != nil {
				return err
			}
			if oc.Master != "" {
				logger.Warn().Str("master", oc.Master).Msg("fluxkv_spec.master is not used by up: the owner registers with the embedded master")
			}
			secrets, err := upSecrets(c, f, oc.SocketDir)
			if err != nil {
				return err
			}
			masterKey, err := upMasterKey(c, f, oc.SocketDir, secrets)
			if err != nil {
				return err
			}
			pubKeys, err := clusterMasterPubKeys(c, f, secrets, masterKey)
			if err != nil {
				return err
			}
			addr := oc.MetricsAddr
			switch {
			case addr == "":
				addr = mc.MetricsAddr
			case mc.MetricsAddr != "" && mc.MetricsAddr != addr:
				logger.Warn().Str("serving", addr).Str("unused", mc.MetricsAddr).
					Msg("up serves one /metrics: the owner's metrics address; the master's is not used")
			}
			st := stack{masterKey: masterKey, masterPubKeys: pubKeys}
			m, err := st.metrics(addr, "master", "owner")
			if err != nil {
				return st.fail(ctx, err)
			}
			// The embedded master records no per-call metrics: its methods share names
			// with the owner's (PutStart, Delete, Exists, Stat), and one /metrics
			// endpoint would count a client's put twice. The owner's are what clients
			// see. Its listener's refusals and timeouts (other owners reach it over TCP)
			// are counted as any master's.
			// Its owner restarts with it (a new, empty incarnation): no write quiet period,
			// unless it listens on a fixed port, which other owners may reach it at again
			// after a restart with hot sets of the incarnation before (a review).
			quiet := time.Duration(-1)
			if _, port, err := net.SplitHostPort(mc.Listen); err == nil && port != "0" {
				quiet = 0 // the master's default
			}
			srv, err := st.master(mc, m, secrets, quiet, true)
			if err != nil {
				return st.fail(ctx, err)
			}
			exportMaster(m, srv) // its leadership and members are the node's to show
			if oc.TransferReserve == nil {
				// One owner: every put is placed on it, a transfer area would be idle memory.
				none := int64(0)
				oc.TransferReserve = &none
			}
			// The owner calls the embedded master in-process (other owners given its
			// address reach it over TCP); one campaigning on etcd may not lead, so the
			// owner then dials it and follows the leader as any owner does.
			if s, ok := srv.(*master.Server); ok {
				st.localMaster = s.LocalClient()
			}
			if _, err := st.owner(ctx, oc, srv.Addr().String(), m, secrets); err != nil {
				return st.fail(ctx, err)
			}
			waitStop(ctx)
			return st.stop()
		},
	}
}

// stack holds the started components; stop stops them in reverse order.
type stack struct {
	steps []stopStep

	masterKey     *auth.MasterKey     // the master's (nil: insecure)
	masterPubKeys *auth.MasterPubKeys // those the owner accepts (nil: insecure)
	// localMaster is the embedded master's in-process client (up; nil: the owner dials
	// its master).
	localMaster masterservice.Client

	ready *metrics.Readiness // /readyz: the components up (nil: no metrics server)
}

type stopStep struct {
	what string
	stop func() error
}

func (s *stack) push(what string, stop func() error) {
	s.steps = append(s.steps, stopStep{what, stop})
}

// stop stops every component, last started first, logging each with its duration;
// it returns the first failure as the exit status.
func (s *stack) stop() error {
	var first error
	for i := len(s.steps) - 1; i >= 0; i-- {
		st := s.steps[i]
		t0 := time.Now()
		err := st.stop()
		ev := logger.Info()
		if err != nil {
			ev = logger.Error()
		}
		ev.Str("component", st.what).Dur("took", time.Since(t0)).Err(err).Msg("stopped")
		if err != nil && first == nil {
			first = cli.Exit(fmt.Sprintf("stop %s: %v", st.what, err), 1)
		}
	}
	s.steps = nil
	return first
}

// fail stops what started and returns the start error err (exit status 1 unless err
// already carries one). A start cut short by a stop signal (signalContext) is a clean stop: exit 0.
func (s *stack) fail(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		logger.Info().Err(err).Str("signal", signalName(ctx)).Msg("signal received during start-up; stopping")
		return s.stop()
	}
	s.stop()
	if _, ok := err.(cli.ExitCoder); ok {
		return err
	}
	return cli.Exit(err.Error(), 1)
}

// metrics starts the /metrics server on addr and returns the instruments the
// components record into; without an address there is neither (nil *Metrics
// records nothing). Its /readyz answers ready once each of components (started by
// master and owner) is up.
func (s *stack) metrics(addr string, components ...string) (*metrics.Metrics, error) {
	if addr == "" {
		return nil, nil
	}
	t0 := time.Now()
	m := metrics.New()
	s.ready = metrics.NewReadiness(components...)
	l := logger.With().Str("component", "metrics").Logger()
	srv, err := metrics.Serve(addr, m, metrics.Options{Ready: s.ready.Check, Logger: &l})
	if err != nil {
		return nil, err
	}
	s.push("metrics", srv.Close)
	logger.Info().Str("component", "metrics").Str("addr", srv.Addr()).Dur("took", time.Since(t0)).Msg("metrics serving on /metrics")
	return m, nil
}

// masterServer is a started master: a standalone *master.Server, or a *master.HA
// campaigning on etcd.
type masterServer interface {
	Start(addr string) error
	Stop() error
	Addr() net.Addr
	Capacity() metrics.Capacity
	Members() int
}

var (
	_ masterServer = (*master.Server)(nil)
	_ masterServer = (*master.HA)(nil)
)

// master starts a master; writeQuiet is master.Options.WriteQuiet (0: its default),
// noCallMetrics master.Options.NoCallMetrics.
// With etcd endpoints it is one of several campaigning there (HA, docs/architecture.md §12).
func (s *stack) master(mc config.Master, m *metrics.Metrics, secrets *auth.Secrets, writeQuiet time.Duration, noCallMetrics bool) (masterServer, error) {
	t0 := time.Now()
	opts := masterOptions(mc, m, secrets)
	opts.WriteQuiet, opts.NoCallMetrics = writeQuiet, noCallMetrics
	opts.MasterKey = s.masterKey
	var (
		srv masterServer
		err error
	)
	if len(mc.EtcdEndpoints) > 0 {
		srv, err = master.NewHA(opts, haOptions(mc))
	} else {
		srv, err = master.NewServer(opts)
	}
	if err != nil {
		return nil, err
	}
	if err := srv.Start(mc.Listen); err != nil {
		return nil, err
	}
	// Ready while it serves its listener: an HA master that does not lead answers
	// every call NOT_LEADER with the leader's address, which owners follow.
	s.ready.Up("master", nil)
	s.push("master", func() error {
		s.ready.Down("master")
		return srv.Stop()
	})
	ev := logger.Info().Str("component", "master").EmbedObject(currentBuild()).Str("addr", srv.Addr().String())
	if len(mc.EtcdEndpoints) > 0 {
		ev = ev.Strs("etcd_endpoints", mc.EtcdEndpoints).Str("etcd_prefix", mc.EtcdPrefix).Str("advertise_addr", mc.AdvertiseAddr)
	}
	// write_quiet: deletes and publishes wait out a quiet period after the start (off for
	// `up` on an ephemeral port: no owner but its own reaches that master after a restart).
	ev.Bool("write_quiet", writeQuiet >= 0).Dur("took", time.Since(t0)).Msg("master started")
	return srv, nil
}

// exportMaster shows srv's members and leadership on m: a standalone master leads from
// its start, in one epoch; an HA master records its terms itself (master.HA).
func exportMaster(m *metrics.Metrics, srv masterServer) {
	m.SetMembersFunc(srv.Members)
	if s, ok := srv.(*master.Server); ok {
		m.LeadershipChange(metrics.LeadershipWon, s.Epoch())
		m.Leading(true)
	}
}

// haOptions turns merged master settings with etcd endpoints into the HA options:
// the prefix defaults to /fluxkv/<cluster name>/ (masterSettings resolved it already).
func haOptions(mc config.Master) master.HAOptions {
	var o master.HAOptions
	haTable().apply(&mc, &o)
	if o.Etcd.Prefix == "" {
		o.Etcd.Prefix = ha.DefaultPrefix(mc.ClusterName)
	}
	return o
}

func (s *stack) owner(ctx context.Context, oc config.Owner, masterAddr string, m *metrics.Metrics, secrets *auth.Secrets) (*daemon.Owner, error) {
	t0 := time.Now()
	opts := ownerOptions(oc, masterAddr, m, secrets)
	opts.MasterKeys = s.masterPubKeys
	opts.LocalMaster = s.localMaster
	o, err := daemon.New(opts)
	if err != nil {
		return nil, err
	}
	m.SetRegisteredFunc(o.Registered)
	if err := o.Start(ctx); err != nil {
		if errors.Is(err, ssd.ErrLimit) {
			// An SSD limit only the start found too large: refused like any setting.
			return nil, cli.Exit(err.Error(), 2)
		}
		return nil, err
	}
	m.SetCapacityFunc(o.Capacity)
	// Ready with its sockets listening (Start opened them) while registered.
	s.ready.Up("owner", func() error {
		if !o.Registered() {
			return errors.New("not registered with a master (no answer within its lease)")
		}
		return nil
	})
	s.push("owner", func() error {
		s.ready.Down("owner")
		m.SetCapacityFunc(nil) // scrapes during and after the stop do not call into it
		return o.Stop()
	})
	// The segment as mapped (DRAM rounded up to the page, and the landing reserve) in exact bytes and for
	// people; the requested size beside it when the rounding changed it.
	seg := segmentSize(oc.DRAM) + segmentSize(oc.LandingReserve)
	ev := logger.Info().Str("component", "owner").EmbedObject(currentBuild()).Str("socket", o.SocketPath()).
		Int64("segment_bytes", seg).Str("segment", humanSize(seg))
	if segmentSize(oc.DRAM) != oc.DRAM {
		ev = ev.Int64("dram_requested_bytes", oc.DRAM)
	}
	if oc.LandingReserve > 0 {
		ev = ev.Int64("landing_reserve_bytes", segmentSize(oc.LandingReserve))
	}
	if oc.SSDEnabled() {
		ev = ev.Strs("large_file_paths", oc.LargeFilePaths).Ints64("large_limit_size", oc.LargeLimitSize).
			Str("cluster_name", oc.ClusterName).Str("instance_key", oc.InstanceKey)
	} else {
		ev = ev.Bool("ssd", false)
		if len(oc.LargeFilePaths) > 0 {
			logger.Warn().Strs("large_file_paths", oc.LargeFilePaths).
				Msg("SSD cache off: fluxkv_spec.large_limit_size is null, so large_file_paths are not used")
		}
	}
	ev.Dur("took", time.Since(t0)).Msg("owner started")
	return o, nil
}

// masterOptions turns merged master settings into master options; nil secrets run
// an insecure cluster (clusterSecrets allowed it).
func masterOptions(mc config.Master, m *metrics.Metrics, secrets *auth.Secrets) master.Options {
	l := componentLogger("master")
	opts := master.Options{Secrets: secrets, InsecureCluster: secrets == nil, Metrics: m, Logger: &l}
	masterTable().apply(&mc, &opts)
	return opts
}

// ownerOptions turns merged owner settings into daemon options; large_limit_size
// turns the SSD tier on (docs/architecture.md §6); nil secrets run an insecure cluster
// (clusterSecrets allowed it). A masterAddr etcd://... (ownerSettings checked it)
// makes the owner follow the leader on etcd (HA, docs/architecture.md §12) instead.
func ownerOptions(oc config.Owner, masterAddr string, m *metrics.Metrics, secrets *auth.Secrets) daemon.Options {
	l := componentLogger("owner")
	opts := daemon.Options{Secrets: secrets, InsecureCluster: secrets == nil, MasterAddr: masterAddr, Metrics: m, Logger: &l}
	ownerTable().apply(&oc, &opts)
	if ha.IsURL(masterAddr) {
		// On the impossible parse error (ownerSettings refused it) the empty config
		// makes the daemon refuse to start: "no etcd endpoints".
		cfg, _ := ha.ParseURL(masterAddr, oc.ClusterName)
		ownerEtcdTable().apply(&oc, &cfg.TLS)
		opts.MasterEtcd = &cfg
		opts.MasterAddr = ""
	}
	if oc.SSDEnabled() {
		opts.SSD = &ssd.Options{
			Cluster:     oc.ClusterName,
			InstanceKey: oc.InstanceKey,
			Paths:       oc.LargeFilePaths,
			Limits:      oc.LargeLimitSize,
		}
	}
	return opts
}

func componentLogger(role string) zerolog.Logger {
	return logger.With().Str("role", role).Logger()
}

// signalContext is cancelled by SIGINT, SIGTERM or SIGHUP (a hangup of the terminal
// that started the process: it stops cleanly rather than die with its sockets left
// behind), the signal its cause (stopSignal); a signal ignored at start (nohup) stays
// ignored. It is set up before anything starts, so
// a signal during start-up also stops the process cleanly. After the first signal the
// default handling is back: a second one ends a stop that takes too long at once.
func signalContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	for _, sig := range stopSignals {
		// One the process was started with ignored stays so: Notify would install a
		// handler (nohup's SIGHUP, a background job's SIGINT would stop it).
		if !signal.Ignored(sig) {
			signal.Notify(sigs, sig)
		}
	}
	go func() {
		defer signal.Stop(sigs)
		select {
		case sig := <-sigs:
			cancel(stopSignal{sig})
		case <-ctx.Done():
		}
	}()
	return ctx, func() { cancel(nil) }
}

// stopSignals stop a serving process (signalContext).
var stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// stopSignal is the cause of a signal context's end.
type stopSignal struct{ os.Signal }

func (s stopSignal) Error() string { return "signal " + s.String() }

// waitStop blocks until the signal context ends and logs the signal.
func waitStop(ctx context.Context) {
	<-ctx.Done()
	logger.Info().Str("signal", signalName(ctx)).Msg("signal received; stopping (a second one ends the process at once)")
}

// signalName is the signal that ended ctx (signalContext).
func signalName(ctx context.Context) string {
	var s stopSignal
	if errors.As(context.Cause(ctx), &s) {
		return s.String()
	}
	return "none"
}
