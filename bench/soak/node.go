package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog/log"

	"github.com/fluxkv/fluxkv/clients/go/fluxkv"
	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/protocol/auth"
)

// nodeConfig sizes the node the soak runs against.
type nodeConfig struct {
	Bin      string // the fluxkv binary
	Dir      string // temp dir: sockets, SSD files, logs
	Owners   int    // owners of the one master (1 until the cluster issue lands)
	DRAM     int64  // per owner
	SSDLimit int64  // per owner; 0: SSD off
	// SSDOwners is how many owners (the first ones) have SSD; 0: all. With fewer, the
	// others' values reach SSD through the SSD pool (persisted by an SSD owner).
	SSDOwners int
}

// ownerProc is one owner: its fixed paths and ports survive restarts.
type ownerProc struct {
	idx         int
	nodeID      string
	sockDir     string
	ssdDir      string
	metricsAddr string
	p           *proc
	inc         int   // incarnations started
	generation  int64 // of the running incarnation
}

// socket is the owner's attach socket.
func (o *ownerProc) socket() string { return filepath.Join(o.sockDir, "fluxkv.sock") }

// cluster runs the master and the owners as separate processes from cfg.Bin.
type cluster struct {
	cfg        nodeConfig
	wg         *sync.WaitGroup
	masterAddr string
	secret     string // the --cluster-secret-file of the master and every owner
	masterKey  string // the master's --master-key-file; masterPub its public half (owners)
	masterPub  string
	master     *proc
	masterInc  int
	owners     []*ownerProc
}

// startBudget is how long a daemon incarnation may take to start.
const startBudget = 30 * time.Second

// startCluster starts the master, then every owner, and waits until each is ready.
func startCluster(wg *sync.WaitGroup, cfg nodeConfig) (*cluster, error) {
	c := &cluster{cfg: cfg, wg: wg}
	var err error
	if c.masterAddr, err = proctest.FreePort(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	c.secret = filepath.Join(cfg.Dir, "cluster.secret")
	c.masterKey, c.masterPub = filepath.Join(cfg.Dir, "master.key"), filepath.Join(cfg.Dir, "master.pub")
	if err := auth.GenerateMasterKeyFiles(c.masterKey, c.masterPub); err != nil {
		return nil, err
	}
	if err := auth.GenerateSecretFile(c.secret); err != nil {
		return nil, err
	}
	if err := c.startMaster(); err != nil {
		return nil, err
	}
	// From here a failure returns c, for the caller to stop what runs (it returned nil,
	// and the driver waited for the master's reaper for ever; a review).
	for i := 0; i < cfg.Owners; i++ {
		o := &ownerProc{idx: i, nodeID: fmt.Sprintf("soak-%d", i),
			sockDir: filepath.Join(cfg.Dir, fmt.Sprintf("owner%d", i)), ssdDir: filepath.Join(cfg.Dir, fmt.Sprintf("ssd%d", i))}
		if o.metricsAddr, err = proctest.FreePort(); err != nil {
			return c, err
		}
		for _, d := range []string{o.sockDir, o.ssdDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return c, fmt.Errorf("owner dir: %w", err)
			}
		}
		c.owners = append(c.owners, o)
		if err := c.startOwner(o); err != nil {
			return c, err
		}
	}
	return c, nil
}

func (c *cluster) logPath(name string, inc int) string {
	return filepath.Join(c.cfg.Dir, "logs", fmt.Sprintf("%s.%d.log", name, inc))
}

// startMaster starts a master incarnation on the fixed address and waits until it accepts.
func (c *cluster) startMaster() error {
	c.masterInc++
	argv := []string{c.cfg.Bin, "master", "--listen", c.masterAddr, "--cluster-secret-file", c.secret, "--master-key-file", c.masterKey}
	p, err := startProc(c.wg, "master", argv, nil, c.logPath("master", c.masterInc), nil)
	if err != nil {
		return err
	}
	c.master = p
	if err := p.pt.WaitFor(startBudget, "the master to listen", func() bool { return proctest.Accepts("tcp", c.masterAddr) }); err != nil {
		return fmt.Errorf("master did not start: %s", p.describe())
	}
	return nil
}

// startOwner starts an owner incarnation and waits until a client can attach to it and
// sees a new generation.
func (c *cluster) startOwner(o *ownerProc) error {
	o.inc++
	argv := []string{c.cfg.Bin, "owner", "--master", c.masterAddr, "--dir", o.sockDir, "--dram", fmt.Sprint(c.cfg.DRAM),
		"--node-id", o.nodeID, "--metrics-addr", o.metricsAddr, "--cluster-secret-file", c.secret,
		"--master-pubkey-file", c.masterPub}
	if c.cfg.SSDLimit > 0 && (c.cfg.SSDOwners <= 0 || o.idx < c.cfg.SSDOwners) {
		argv = append(argv, "--ssd-path", o.ssdDir, "--ssd-limit", fmt.Sprint(c.cfg.SSDLimit))
	}
	p, err := startProc(c.wg, fmt.Sprintf("owner%d", o.idx), argv, nil, c.logPath(fmt.Sprintf("owner%d", o.idx), o.inc), nil)
	if err != nil {
		return err
	}
	o.p = p
	prev := o.generation
	var attachErr error
	err = p.pt.WaitFor(startBudget, "an attach to a new generation", func() bool {
		cl, err := fluxkv.Connect(fluxkv.Options{Socket: o.socket(), Name: "soak-driver", Timeout: 5 * time.Second})
		if attachErr = err; err != nil {
			return false
		}
		gen := cl.Generation()
		cl.Close()
		if gen == prev {
			return false
		}
		o.generation = gen
		return true
	})
	if err != nil {
		return fmt.Errorf("owner %s did not start (last attach error: %v): %s", o.nodeID, attachErr, p.describe())
	}
	return nil
}

// restartMaster kills the master with SIGKILL, waits pause, and starts it again.
func (c *cluster) restartMaster(pause time.Duration) error {
	c.master.kill()
	log.Info().Int("incarnation", c.masterInc).Dur("pause", pause).Msg("master killed")
	time.Sleep(pause)
	start := time.Now()
	if err := c.startMaster(); err != nil {
		return err
	}
	log.Info().Int("incarnation", c.masterInc).Dur("took", time.Since(start)).Msg("master restarted")
	return nil
}

// restartOwner kills owner o with SIGKILL, waits pause, and starts it again.
func (c *cluster) restartOwner(o *ownerProc, pause time.Duration) error {
	o.p.kill()
	log.Info().Str("node", o.nodeID).Int("incarnation", o.inc).Dur("pause", pause).Msg("owner killed")
	time.Sleep(pause)
	start := time.Now()
	if err := c.startOwner(o); err != nil {
		return err
	}
	log.Info().Str("node", o.nodeID).Int("incarnation", o.inc).Dur("took", time.Since(start)).Msg("owner restarted")
	return nil
}

// crashed describes every daemon that exited without the driver killing it.
func (c *cluster) crashed() []string {
	var out []string
	if c.master.unexpected() {
		out = append(out, c.master.describe())
	}
	for _, o := range c.owners {
		if o.p.unexpected() {
			out = append(out, o.p.describe())
		}
	}
	return out
}

// stop ends every daemon: owners first (SIGTERM, a graceful stop), then the master. A
// daemon that exited by itself since the last look (crashed) is a failure too: it was
// passed over, and a crash while the keys were deleted or the owners settled went unseen.
func (c *cluster) stop() []string {
	var bad []string
	end := func(what string, p *proc) {
		switch {
		case p == nil: // (never started: startCluster failed on it)
		case p.unexpected():
			bad = append(bad, what+" exited by itself before the end: "+p.describe())
		case !p.exited() && !p.stop(15*time.Second):
			bad = append(bad, what+" did not stop cleanly on SIGTERM: "+p.describe())
		}
	}
	for _, o := range c.owners {
		end("owner", o.p)
	}
	end("master", c.master)
	return bad
}
