package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// proc is one child process of the driver: a master, an owner or a worker incarnation.
// One goroutine (joined through the driver's WaitGroup) reads its stdout line by line,
// then reaps it; done closes when it has exited.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string // its stderr (and, for daemons, stdout)
	done    chan struct{}
	state   *os.ProcessState // set before done closes
	killed  atomic.Bool      // the driver killed or stopped it: its exit is expected
}

// startProc starts argv with stderr to logPath. onLine, if set, gets every stdout line
// (else stdout goes to the log too).
func startProc(wg *sync.WaitGroup, name string, argv, env []string, logPath string, onLine func(line []byte)) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the driver
	var out io.ReadCloser
	if onLine != nil {
		if out, err = cmd.StdoutPipe(); err != nil {
			logf.Close()
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
	} else {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if out != nil {
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				onLine(sc.Bytes())
			}
			io.Copy(io.Discard, out)
		}
		cmd.Wait()
		logf.Close()
		p.state = cmd.ProcessState
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// unexpected reports an exit the driver did not cause.
func (p *proc) unexpected() bool { return p.exited() && !p.killed.Load() }

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() {
	p.killed.Store(true)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits up to grace, then kills; it reports whether the process
// exited by itself with status 0.
func (p *proc) stop(grace time.Duration) bool {
	p.killed.Store(true)
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.state.Success()
	case <-time.After(grace):
		p.kill()
		return false
	}
}

// describe says how the process ended and shows the end of its log.
func (p *proc) describe() string {
	status := "running"
	if p.exited() {
		status = p.state.String()
	}
	return fmt.Sprintf("%s (pid %d) %s; last lines of %s:\n%s", p.name, p.cmd.Process.Pid, status, p.logPath, tailFile(p.logPath, 15))
}

// tailFile returns the last n lines of a file.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var s strings.Builder
	for _, l := range lines {
		s.WriteString("    ")
		s.Write(l)
		s.WriteByte('\n')
	}
	return s.String()
}
