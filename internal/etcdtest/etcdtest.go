// Package etcdtest runs a real etcd cluster (the etcd binary on PATH, Debian's
// etcd-server on CI) as child processes of a test, so that tests of master high
// availability can kill, pause and restart individual members and watch what the
// masters do. Members listen on free ports of Options.Host and keep their data on
// tmpfs; everything is killed and removed when the test ends.
//
// A Cluster's methods take no testing.TB of their own: they report failures on the
// test that started the cluster, so they must be called from that test's goroutine.
package etcdtest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fluxkv/fluxkv/internal/etcddial"
	"github.com/fluxkv/fluxkv/internal/proctest"
)

// Options configure a cluster; the zero value is one member on 127.0.0.1.
type Options struct {
	Members int    // 1 (default) or 3
	Host    string // address to listen on; default "127.0.0.1" (tests in network namespaces pass a bridge address)
	// Heartbeat/Election in ms: default 100/1000 for 1 member; 200/1300 for 3
	// members, whose peers must keep up with each other on 2 busy CI cores.
	HeartbeatMs, ElectionMs int
	// LogLevel is etcd's --log-level; default "error". "warn" or "info" shows
	// elections and lost peers in the log tails that a failed test prints.
	LogLevel string
}

// startTimeout bounds how long Start and Restart wait for members to answer.
const startTimeout = 20 * time.Second

// startAttempts is how often Start picks new ports when one was taken between
// choosing it and etcd binding it.
const startAttempts = 3

// logTailLines is how much of each member's log a failed test prints.
const logTailLines = 30

// Cluster is a running etcd cluster; see Start.
type Cluster struct {
	t       testing.TB
	bin     string
	opts    Options
	dataDir string // per cluster, on tmpfs; one subdirectory per member
	logDir  string
	token   string
	members []*member
}

type member struct {
	name    string
	client  string // host:port
	peer    string // host:port
	dataDir string
	logPath string

	cmd    *exec.Cmd     // nil until started and after Kill
	done   chan struct{} // closed when cmd has been waited for
	err    error         // cmd.Wait's result, valid once done is closed
	paused bool
}

// Start starts a cluster of o.Members members and returns once every member
// serves linearizable reads. The cluster is killed and its data removed by
// t.Cleanup; if the test failed, the tail of each member's log is logged first.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal("etcd not installed: run `make deps-test` (installs Debian's etcd-server)")
	}
	o = o.withDefaults()
	if o.Members < 1 {
		t.Fatalf("etcdtest: Options.Members = %d", o.Members)
	}
	// etcd fsyncs its WAL on every write; on a disk that makes busy CI machines
	// miss heartbeats, so the data lives on tmpfs when there is one.
	shm := "/dev/shm"
	if fi, err := os.Stat(shm); err != nil || !fi.IsDir() {
		shm = ""
	}
	dataDir, err := os.MkdirTemp(shm, "etcdtest-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{
		t:       t,
		bin:     bin,
		opts:    o,
		dataDir: dataDir,
		logDir:  t.TempDir(),
		// A token unique to this cluster keeps members of concurrently running
		// tests from joining each other if ports get reused.
		token: filepath.Base(dataDir),
	}
	t.Cleanup(c.cleanup)

	for attempt := 1; ; attempt++ {
		c.configure()
		for i := range c.members {
			c.start(i)
		}
		err := c.waitHealthy(startTimeout)
		if err == nil {
			return c
		}
		if attempt >= startAttempts || !c.portClash() {
			t.Fatalf("etcdtest: cluster did not start: %v", err)
		}
		t.Logf("etcdtest: a port was taken, retrying with new ports: %v", err)
		c.killAll()
	}
}

func (o Options) withDefaults() Options {
	if o.Members == 0 {
		o.Members = 1
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	hb, el := 100, 1000
	if o.Members > 1 {
		hb, el = 200, 1300
	}
	if o.HeartbeatMs == 0 {
		o.HeartbeatMs = hb
	}
	if o.ElectionMs == 0 {
		o.ElectionMs = el
	}
	if o.LogLevel == "" {
		o.LogLevel = "error"
	}
	return o
}

// configure gives every member fresh ports, an empty data dir and an empty log.
func (c *Cluster) configure() {
	ports := freePorts(c.t, c.opts.Host, 2*c.opts.Members)
	c.members = make([]*member, c.opts.Members)
	for i := range c.members {
		name := "m" + strconv.Itoa(i)
		m := &member{
			name:    name,
			client:  net.JoinHostPort(c.opts.Host, strconv.Itoa(ports[2*i])),
			peer:    net.JoinHostPort(c.opts.Host, strconv.Itoa(ports[2*i+1])),
			dataDir: filepath.Join(c.dataDir, name),
			logPath: filepath.Join(c.logDir, name+".log"),
		}
		if err := os.RemoveAll(m.dataDir); err != nil {
			c.t.Fatal(err)
		}
		if err := os.WriteFile(m.logPath, nil, 0o644); err != nil {
			c.t.Fatal(err)
		}
		c.members[i] = m
	}
}

// freePorts returns n distinct ports that were free on host, below the ephemeral range
// (proctest.FreePortOn: an outgoing connection cannot take one before etcd binds it).
func freePorts(t testing.TB, host string, n int) []int {
	t.Helper()
	seen := make(map[int]bool, n)
	ports := make([]int, 0, n)
	for len(ports) < n {
		addr, err := proctest.FreePortOn(host)
		if err != nil {
			t.Fatalf("etcdtest: no free port on %s: %v", host, err)
		}
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if !seen[port] {
			seen[port] = true
			ports = append(ports, port)
		}
	}
	return ports
}

// start runs member i's etcd process. The flags are the same for the first start
// and for Restart: etcd ignores the --initial-* ones once its data dir exists.
func (c *Cluster) start(i int) {
	m := c.members[i]
	var initial []string
	for _, p := range c.members {
		initial = append(initial, p.name+"=http://"+p.peer)
	}
	cmd := exec.Command(c.bin,
		"--name", m.name,
		"--data-dir", m.dataDir,
		"--listen-client-urls", "http://"+m.client,
		"--advertise-client-urls", "http://"+m.client,
		"--listen-peer-urls", "http://"+m.peer,
		"--initial-advertise-peer-urls", "http://"+m.peer,
		"--initial-cluster", strings.Join(initial, ","),
		"--initial-cluster-token", c.token,
		"--initial-cluster-state", "new",
		"--heartbeat-interval", strconv.Itoa(c.opts.HeartbeatMs),
		"--election-timeout", strconv.Itoa(c.opts.ElectionMs),
		"--logger", "zap", "--log-outputs", "stderr", "--log-level", c.opts.LogLevel,
	)
	// Appending keeps the log of the run before a Restart.
	log, err := os.OpenFile(m.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	// An *os.File is handed to the child as is, so the parent's copy can be
	// closed right away and Wait has no output to copy.
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("etcdtest: start %s: %v", m.name, err)
	}
	m.cmd, m.done, m.err, m.paused = cmd, make(chan struct{}), nil, false
	go func(done chan struct{}) {
		m.err = cmd.Wait()
		close(done)
	}(m.done)
}

// Endpoints returns the members' client endpoints, "host:port", in member order.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.client
	}
	return eps
}

// Client returns a client of the given members, of all when none are given,
// closed when t ends. A client of one member lets a test choose who answers:
// a client of all may be stuck on a paused member until its context expires.
func (c *Cluster) Client(t testing.TB, members ...int) *clientv3.Client {
	t.Helper()
	eps := c.Endpoints()
	if len(members) > 0 {
		eps = nil
		for _, i := range members {
			eps = append(eps, c.member(i).client)
		}
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 2 * time.Second,
		DialOptions: etcddial.Options(), // as the masters' (ha.Config.Client)
		Logger:      zap.NewNop(),       // members going away is what these tests are about
	})
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Leader returns the index of the member that is the raft leader now, as the
// running, unpaused members report it, so that tests can kill or pause it.
func (c *Cluster) Leader(t testing.TB) int {
	t.Helper()
	cli := c.Client(t)
	for i, m := range c.members {
		if m.cmd == nil || m.paused {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, m.client)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	t.Fatal("etcdtest: no member reports itself leader")
	return -1
}

// Kill sends SIGKILL to member i, paused or not, and waits for it to exit.
// Killing a member that is not running does nothing.
func (c *Cluster) Kill(i int) {
	m := c.member(i)
	if m.cmd == nil {
		return
	}
	// An error means the process has exited already; waiting is all that is left.
	_ = m.cmd.Process.Kill()
	<-m.done
	m.cmd, m.paused = nil, false
}

// Restart starts member i again, after Kill, with its old data dir and ports,
// and waits until it serves linearizable reads (so a quorum must be up).
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if c.member(i).cmd != nil {
		c.t.Fatalf("etcdtest: Restart(%d): member is running; Kill it first", i)
	}
	c.start(i)
	if err := c.waitMember(i, time.Now().Add(startTimeout)); err != nil {
		c.t.Fatalf("etcdtest: Restart(%d): %v", i, err)
	}
}

// Pause stops member i with SIGSTOP: it keeps its sockets but answers nothing,
// like a hung or partitioned machine.
func (c *Cluster) Pause(i int) { c.signal(i, syscall.SIGSTOP, true) }

// Resume continues member i after Pause with SIGCONT.
func (c *Cluster) Resume(i int) { c.signal(i, syscall.SIGCONT, false) }

func (c *Cluster) signal(i int, sig syscall.Signal, paused bool) {
	c.t.Helper()
	m := c.member(i)
	if m.cmd == nil {
		c.t.Fatalf("etcdtest: %v member %d: not running", sig, i)
	}
	if err := m.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("etcdtest: %v member %d: %v", sig, i, err)
	}
	m.paused = paused
}

func (c *Cluster) member(i int) *member {
	c.t.Helper()
	if i < 0 || i >= len(c.members) {
		c.t.Fatalf("etcdtest: no member %d in a cluster of %d", i, len(c.members))
	}
	return c.members[i]
}

// WaitHealthy waits until every running member (started, neither killed nor
// paused) serves a linearizable Get, and fails t after timeout.
func (c *Cluster) WaitHealthy(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := c.waitHealthy(timeout); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
}

func (c *Cluster) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i, m := range c.members {
		if m.cmd == nil || m.paused {
			continue
		}
		if err := c.waitMember(i, deadline); err != nil {
			return err
		}
	}
	return nil
}

// waitMember retries a linearizable Get against member i's own endpoint until
// it succeeds or the deadline passes. A linearizable read goes through the
// leader, so it also proves that the member is part of a working quorum.
func (c *Cluster) waitMember(i int, deadline time.Time) error {
	m := c.members[i]
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{m.client},
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(), // retries are expected here, not news
	})
	if err != nil {
		return fmt.Errorf("member %d: %v", i, err)
	}
	defer cli.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = cli.Get(ctx, "health")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-m.done:
			return fmt.Errorf("member %d exited: %v", i, m.err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("member %d (%s) not healthy: %v", i, m.client, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// portClash reports whether a member failed because its port was taken.
func (c *Cluster) portClash() bool {
	for _, m := range c.members {
		if b, err := os.ReadFile(m.logPath); err == nil && bytes.Contains(b, []byte("address already in use")) {
			return true
		}
	}
	return false
}

func (c *Cluster) killAll() {
	for i := range c.members {
		c.Kill(i)
	}
}

// cleanup runs from t.Cleanup, so also after a failure or panic of the test:
// no etcd may outlive it.
func (c *Cluster) cleanup() {
	c.killAll()
	if c.t.Failed() {
		for _, m := range c.members {
			c.t.Logf("etcdtest: last lines of %s's log (%s):\n%s", m.name, m.client, tail(m.logPath, logTailLines))
		}
	}
	if err := os.RemoveAll(c.dataDir); err != nil {
		c.t.Errorf("etcdtest: %v", err)
	}
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) == 0 {
		return "(empty)"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
