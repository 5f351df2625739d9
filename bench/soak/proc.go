package main

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fluxkv/fluxkv/internal/proctest"
)

// proc is one child process of the driver: a master, an owner or a worker incarnation,
// run by proctest. Its goroutines (joined through the driver's WaitGroup) read its
// stdout line by line and reap it; done closes when it has exited.
type proc struct {
	name    string
	pt      *proctest.Proc
	cmd     *exec.Cmd       // pt's, for its pid and signals
	logPath string          // its stderr (and, for daemons, stdout)
	done    <-chan struct{} // pt.Done()
	killed  atomic.Bool     // the driver killed or stopped it: its exit is expected
}

// startProc starts argv with stderr to logPath; it never outlives the driver. onLine,
// if set, gets every stdout line (else stdout goes to the log too).
func startProc(wg *sync.WaitGroup, name string, argv, env []string, logPath string, onLine func(line []byte)) (*proc, error) {
	pt, err := proctest.Start(proctest.Options{
		Name: name, Args: argv, Env: env, LogFile: logPath, OnStdoutLine: onLine,
		KillWithParent: true, Group: wg,
	})
	if err != nil {
		return nil, err
	}
	return &proc{name: name, pt: pt, cmd: pt.Cmd, logPath: logPath, done: pt.Done()}, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool { return p.pt.Exited() }

// unexpected reports an exit the driver did not cause.
func (p *proc) unexpected() bool { return p.exited() && !p.killed.Load() }

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	p.killed.Store(true)
	p.pt.Kill()
}

// stop sends SIGTERM and waits up to grace, then kills; it reports whether the process
// exited by itself with status 0 (and showed no race).
func (p *proc) stop(grace time.Duration) bool {
	p.killed.Store(true)
	return p.pt.Stop(grace) == nil
}

// stopOrDump is stop for a process that can write its stacks to its log on signal dump:
// when it has not exited within grace of SIGTERM, it gets dump and a moment to write them
// before the kill, so the log says where it was stuck.
func (p *proc) stopOrDump(grace time.Duration, dump syscall.Signal) bool {
	p.killed.Store(true)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Signal(dump)
		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
		}
	}
	return p.pt.Stop(0) == nil
}

// describe says how the process ended and shows the end of its log.
func (p *proc) describe() string {
	var s strings.Builder
	for _, l := range proctest.TailLines(p.pt.Log(), 40) {
		s.WriteString("    " + l + "\n")
	}
	return fmt.Sprintf("%s (pid %d) %s; last lines of %s:\n%s", p.name, p.cmd.Process.Pid, p.pt.Status(), p.logPath, s.String())
}
