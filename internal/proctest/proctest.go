// Package proctest is the one harness for tests and drivers that run fluxkv (or any
// other program) as real processes: it finds the fluxkv binary, starts a process with
// its log kept in memory or in a file, waits for a condition while watching for an
// early exit, stops it with SIGTERM and then SIGKILL after a bound, reaps it, and turns
// the race detector's report or exit status into a failure message.
//
// The package does not import testing: bench/soak, a plain binary, uses the same Proc
// as the test packages, and SelfCopy takes the small TB interface that *testing.T
// satisfies.
package proctest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Timing budgets of process tests. `make test` runs them against bin/fluxkv-race
// (several times slower) on two busy cores, so each is a generous deadline on a
// condition, never an expected speed.
const (
	StartBudget = 60 * time.Second // a process to open its socket, listen or log a line
	// StopBudget is how long SIGTERM may take: the owner's own shutdown timeout is 4 s,
	// the systemd units allow 20 s.
	StopBudget = 20 * time.Second
)

const (
	pollEvery = 20 * time.Millisecond // how often WaitFor checks its condition
	// waitDelay is how long the output of an exited process is still read: a
	// descendant that inherited its stdout or stderr may keep them open for ever.
	waitDelay = time.Second
)

// Options says what process Start runs and where its output goes.
type Options struct {
	// Args is the command line; Args[0] is the program (looked up in PATH).
	Args []string
	// Name names the process in messages; default: the base name of Args[0] and the
	// other arguments.
	Name string
	// Env is added to the environment of the caller (add RaceEnv for a -race child).
	Env []string
	// LogFile, if set, is created and receives the process's log; else the log is kept
	// in memory. Either way Log returns it.
	LogFile string
	// OnLogLine, if set, is called with every line of the log (without its newline),
	// after the line is in the log, from a reader goroutine of the Proc.
	OnLogLine func(line []byte)
	// OnStdoutLine, if set, is called with every line of stdout (without its newline)
	// from a reader goroutine of the Proc, and the log is stderr only; else the log is
	// stderr and stdout together.
	OnStdoutLine func(line []byte)
	// KillWithParent kills the process with SIGKILL when the thread that started it
	// exits (Pdeathsig): a driver's children never outlive it.
	KillWithParent bool
	// Group, if set, counts the Proc's goroutines, so a driver can join every process
	// it started with one Wait. Done closes once they have ended anyway.
	Group *sync.WaitGroup
}

// Proc is a process started by Start. Its goroutines read its output and reap it; Done
// closes when it has exited and all its output is read. The methods are safe for
// concurrent use.
type Proc struct {
	// Cmd is the running command (read-only: for its Process).
	Cmd *exec.Cmd

	name    string
	logFile string
	mem     *Buffer // the log, when there is no LogFile
	done    chan struct{}
	err     error // Wait's result; set before done closes
	stopped atomic.Bool
}

// Start starts the process o describes.
func Start(o Options) (*Proc, error) {
	if len(o.Args) == 0 {
		return nil, errors.New("proctest: no command")
	}
	p := &Proc{name: o.Name, logFile: o.LogFile, done: make(chan struct{})}
	if p.name == "" {
		p.name = strings.Join(append([]string{filepath.Base(o.Args[0])}, o.Args[1:]...), " ")
	}
	cmd := exec.Command(o.Args[0], o.Args[1:]...)
	cmd.Env = append(os.Environ(), o.Env...)
	if o.KillWithParent {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	cmd.WaitDelay = waitDelay
	p.Cmd = cmd

	// What to close once the process has been started (the child's ends of pipes) and
	// once it has been reaped (the log file, the reader ends).
	var afterStart, afterExit []io.Closer
	fail := func(err error) (*Proc, error) {
		for _, c := range append(afterStart, afterExit...) {
			c.Close()
		}
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	var log io.Writer
	if o.LogFile != "" {
		f, err := os.Create(o.LogFile)
		if err != nil {
			return fail(err)
		}
		afterExit = append(afterExit, f)
		log = f
	} else {
		p.mem = &Buffer{}
		log = p.mem
	}
	var readers []func()
	if o.OnLogLine != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		afterStart, afterExit = append(afterStart, w), append(afterExit, r)
		sink := log
		readers = append(readers, func() {
			eachLine(r, func(line []byte) {
				sink.Write(append(line, '\n'))
				o.OnLogLine(line)
			})
		})
		log = w
	}
	cmd.Stderr = log
	if o.OnStdoutLine != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		afterStart, afterExit = append(afterStart, w), append(afterExit, r)
		readers = append(readers, func() { eachLine(r, o.OnStdoutLine) })
		cmd.Stdout = w
	} else {
		cmd.Stdout = log // the same writer: one pipe (or file) for both
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	for _, c := range afterStart {
		c.Close()
	}

	if o.Group != nil {
		o.Group.Add(1)
	}
	go func() {
		if o.Group != nil {
			defer o.Group.Done()
		}
		var read sync.WaitGroup
		for _, r := range readers {
			read.Add(1)
			go func() {
				defer read.Done()
				r()
			}()
		}
		err := cmd.Wait()
		readDone := make(chan struct{})
		go func() {
			defer close(readDone)
			read.Wait()
		}()
		select {
		case <-readDone:
		case <-time.After(waitDelay):
			// A descendant holds the pipes open: stop reading.
		}
		for _, c := range afterExit {
			c.Close()
		}
		<-readDone
		p.err = err
		close(p.done)
	}()
	return p, nil
}

// eachLine calls f with every line read from r, of any length, until EOF.
func eachLine(r io.Reader, f func(line []byte)) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			f(bytes.TrimSuffix(line, []byte("\n")))
		}
		if err != nil {
			return
		}
	}
}

// Name is the process's name in messages.
func (p *Proc) Name() string { return p.name }

// Done closes when the process has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is Wait's result: nil for exit status 0, an *exec.ExitError otherwise. Valid
// once Done has closed.
func (p *Proc) Err() error { return p.err }

// ExitCode is the exit status, -1 when a signal ended the process. Valid once Done
// has closed.
func (p *Proc) ExitCode() int { return p.Cmd.ProcessState.ExitCode() }

// Status says how the process ended, or "running".
func (p *Proc) Status() string {
	if !p.Exited() {
		return "running"
	}
	return p.Cmd.ProcessState.String()
}

// Unexpected reports an exit neither Stop nor Kill caused.
func (p *Proc) Unexpected() bool { return p.Exited() && !p.stopped.Load() }

// Log is the process's log so far (stderr, and stdout unless OnStdoutLine took it).
func (p *Proc) Log() string {
	if p.mem != nil {
		return p.mem.String()
	}
	b, err := os.ReadFile(p.logFile)
	if err != nil {
		return fmt.Sprintf("(read the log: %v)", err)
	}
	return string(b)
}

// Kill sends SIGKILL (a crash: the process cleans nothing up) and waits for the exit.
func (p *Proc) Kill() {
	p.stopped.Store(true)
	p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to grace for the exit, then kills the process. It
// returns nil when the process exited by itself with status 0 and shows no race; else
// an error that says why, with the end of the log. When Stop or Kill already ended the
// process, Stop does nothing and returns nil.
func (p *Proc) Stop(grace time.Duration) error {
	if p.stopped.Swap(true) {
		<-p.done
		return nil
	}
	if p.Exited() {
		if msg := p.RaceFailure(); msg != "" {
			return errors.New(msg)
		}
		if p.err != nil {
			return fmt.Errorf("%s exited by itself (%v) before SIGTERM:\n%s", p.name, p.err, Tail(p.Log(), 4000))
		}
		return nil
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		if msg := p.RaceFailure(); msg != "" {
			return errors.New(msg)
		}
		return fmt.Errorf("%s did not exit within %v of SIGTERM:\n%s", p.name, grace, Tail(p.Log(), 4000))
	}
	if msg := p.RaceFailure(); msg != "" {
		return errors.New(msg)
	}
	if p.err != nil {
		return fmt.Errorf("%s exited with %v after SIGTERM:\n%s", p.name, p.err, Tail(p.Log(), 4000))
	}
	return nil
}

// RaceFailure says why the process shows a race, or "" when it does not: a race
// detector report in its log, or (once it has exited) the race detector's exit status.
func (p *Proc) RaceFailure() string {
	var err error
	if p.Exited() {
		err = p.err
	}
	return RaceFailure(p.name, p.Log(), err)
}

// WaitFor polls cond until it holds, and fails when the process exits first or budget
// passes; what names the awaited condition in the error ("socket X to accept"). A race
// found in the exited process is the error then.
func (p *Proc) WaitFor(budget time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(budget)
	for {
		if cond() {
			return nil
		}
		select {
		case <-p.done:
			if cond() { // the output is all read once done closes
				return nil
			}
			if msg := p.RaceFailure(); msg != "" {
				return errors.New(msg)
			}
			return fmt.Errorf("%s exited (%v) while waiting for %s:\n%s", p.name, p.err, what, Tail(p.Log(), 4000))
		case <-time.After(pollEvery):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: gave up waiting %v for %s:\n%s", p.name, budget, what, Tail(p.Log(), 4000))
		}
	}
}

// Accepts reports whether addr accepts a connection now ("unix" or "tcp"). A crashed
// predecessor may have left a stale socket file: only an accepting socket counts.
func Accepts(network, addr string) bool {
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// FreePort returns a loopback address whose port is free right now, below the kernel's
// ephemeral range: a port from that range (what listening on port 0 gives) may be
// taken by any outgoing connection's local port before the process it is meant for
// binds it, and on a busy machine running tests in parallel it was.
func FreePort() (string, error) { return FreePortOn("127.0.0.1") }

// FreePortOn is FreePort on host's address.
func FreePortOn(host string) (string, error) {
	low := ephemeralLow()
	const first = 10000
	if low-first < 1000 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return "", fmt.Errorf("pick a port: %w", err)
		}
		defer l.Close()
		return l.Addr().String(), nil
	}
	var err error
	for range 200 {
		var l net.Listener
		addr := net.JoinHostPort(host, strconv.Itoa(first+rand.IntN(low-first)))
		if l, err = net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr, nil
		}
	}
	return "", fmt.Errorf("pick a port below %d: %w", low, err)
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768 where it
// cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

// Tail is the end of s, at most n bytes, for a failure message.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// TailLines is the last n lines of s.
func TailLines(s string, n int) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// Buffer is an io.Writer whose contents can be read while a process writes to it.
type Buffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String is everything written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
