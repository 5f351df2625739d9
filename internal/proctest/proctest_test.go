package proctest

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// sh starts a shell script as a Proc.
func sh(t *testing.T, script string, o Options) *Proc {
	t.Helper()
	o.Args = []string{"sh", "-c", script}
	p, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// A process that logs a line, then stops on SIGTERM with status 0: WaitFor sees the
// line, Stop reports a clean stop, and the log holds stdout and stderr.
func TestStartWaitStop(t *testing.T) {
	p := sh(t, `trap 'echo bye >&2; exit 0' TERM; echo ready; while :; do sleep 0.05; done`, Options{Name: "looper"})
	if err := p.WaitFor(StartBudget, "ready", func() bool { return strings.Contains(p.Log(), "ready\n") }); err != nil {
		t.Fatal(err)
	}
	if p.Exited() || p.Status() != "running" {
		t.Fatalf("exited early: %s", p.Status())
	}
	if err := p.Stop(StopBudget); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Log(), "bye") || p.ExitCode() != 0 || p.Unexpected() {
		t.Fatalf("log %q, exit %d, unexpected %v", p.Log(), p.ExitCode(), p.Unexpected())
	}
	if err := p.Stop(StopBudget); err != nil {
		t.Fatalf("a second Stop: %v", err)
	}
}

// A process that ignores SIGTERM is killed after the grace, and Stop says so.
func TestStopKillsAfterGrace(t *testing.T) {
	p := sh(t, `trap '' TERM; echo ready; while :; do sleep 0.05; done`, Options{Name: "stubborn"})
	if err := p.WaitFor(StartBudget, "ready", func() bool { return strings.Contains(p.Log(), "ready") }); err != nil {
		t.Fatal(err)
	}
	err := p.Stop(200 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "stubborn did not exit within 200ms of SIGTERM") {
		t.Fatalf("Stop: %v", err)
	}
	if p.ExitCode() != -1 {
		t.Fatalf("exit code %d, want -1 (SIGKILL)", p.ExitCode())
	}
}

// The race detector's exit status and its report are failures; an exit nobody caused
// is unexpected, and WaitFor says the process exited.
func TestRaceFailure(t *testing.T) {
	p := sh(t, `echo starting; exit 66`, Options{Name: "racer"})
	err := p.WaitFor(StartBudget, "never", func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "racer exited with status 66, the race detector's") {
		t.Fatalf("WaitFor: %v", err)
	}
	if !p.Unexpected() {
		t.Error("an exit by itself is not unexpected")
	}
	if err := p.Stop(StopBudget); err == nil {
		t.Error("Stop of a raced process reported no failure")
	}

	// sleep outlives the shell with its stderr: Kill returns all the same.
	p = sh(t, `echo "==================" >&2; echo "WARNING: DATA RACE" >&2; echo "Write at 0x1" >&2; sleep 60`, Options{Name: "reporter"})
	if err := p.WaitFor(StartBudget, "the report", func() bool { return strings.Contains(p.Log(), "Write at") }); err != nil {
		t.Fatal(err)
	}
	p.Kill()
	if msg := p.RaceFailure(); !strings.HasPrefix(msg, "the race detector reported a race in reporter") || !strings.Contains(msg, "Write at 0x1") {
		t.Fatalf("RaceFailure: %q", msg)
	}
	if p.Unexpected() {
		t.Error("a killed process is unexpected")
	}

	p = sh(t, `exit 3`, Options{})
	<-p.Done()
	if msg := p.RaceFailure(); msg != "" || p.ExitCode() != 3 {
		t.Fatalf("exit 3: race failure %q, code %d", msg, p.ExitCode())
	}
	if err := p.Stop(StopBudget); err == nil || !strings.Contains(err.Error(), "sh -c exit 3 exited by itself") {
		t.Fatalf("Stop after exit 3: %v", err)
	}
}

// Stdout lines go to OnStdoutLine, stderr to the log file (lines to OnLogLine); the
// Group counts the Proc's goroutines until it is reaped.
func TestLinesAndLogFile(t *testing.T) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var out, logged []string
	logPath := filepath.Join(t.TempDir(), "p.log")
	long := strings.Repeat("x", 200<<10) // a line longer than the read buffer
	p := sh(t, `echo one; echo err1 >&2; head -c 204800 /dev/zero | tr '\0' x; echo; printf two; printf err2 >&2`, Options{
		LogFile: logPath, Group: &wg,
		OnStdoutLine: func(line []byte) { mu.Lock(); out = append(out, string(line)); mu.Unlock() },
		OnLogLine:    func(line []byte) { mu.Lock(); logged = append(logged, string(line)); mu.Unlock() },
	})
	wg.Wait()
	if !p.Exited() || p.Err() != nil {
		t.Fatalf("after the group's Wait: exited %v, err %v", p.Exited(), p.Err())
	}
	if len(out) != 3 || out[0] != "one" || out[1] != long || out[2] != "two" {
		t.Errorf("stdout lines: %d, first %.10q", len(out), out)
	}
	if strings.Join(logged, ",") != "err1,err2" {
		t.Errorf("log lines %q", logged)
	}
	b, err := os.ReadFile(logPath)
	if err != nil || string(b) != "err1\nerr2\n" || p.Log() != string(b) {
		t.Errorf("log file %q (%v), Log %q", b, err, p.Log())
	}
	if lines := TailLines(p.Log(), 1); len(lines) != 1 || lines[0] != "err2" {
		t.Errorf("TailLines: %q", lines)
	}
}

func TestStartFails(t *testing.T) {
	if _, err := Start(Options{Args: []string{filepath.Join(t.TempDir(), "nope")}}); err == nil {
		t.Fatal("started a missing program")
	}
	if _, err := Start(Options{Args: []string{"true"}, LogFile: filepath.Join(t.TempDir(), "no", "dir")}); err == nil {
		t.Fatal("started with an unwritable log file")
	}
}

func TestFreePortAccepts(t *testing.T) {
	addr, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if Accepts("tcp", addr) {
		t.Fatalf("%s accepts before anyone listens", addr)
	}
	if Accepts("unix", filepath.Join(t.TempDir(), "none.sock")) {
		t.Fatal("a missing socket accepts")
	}
}

func TestBinaryFromEnv(t *testing.T) {
	t.Setenv(BinEnv, "/opt/fluxkv-race")
	t.Setenv(NoRaceBinEnv, "")
	for _, f := range []func(bool) (string, error){Binary, NoRaceBinary} {
		if p, err := f(true); err != nil || p != "/opt/fluxkv-race" {
			t.Fatalf("got %q, %v", p, err)
		}
	}
	t.Setenv(NoRaceBinEnv, "/opt/fluxkv")
	if p, _ := NoRaceBinary(true); p != "/opt/fluxkv" {
		t.Fatalf("NoRaceBinary: %q", p)
	}
}

func TestTail(t *testing.T) {
	if got := Tail("abcdef", 3); got != "...def" {
		t.Fatal(got)
	}
	if got := Tail("abc", 3); got != "abc" {
		t.Fatal(got)
	}
}

// A descendant that keeps the log pipe open does not keep the Proc from being reaped.
func TestDescendantHoldsPipe(t *testing.T) {
	p := sh(t, `echo up >&2; sleep 60 & echo bye`, Options{OnLogLine: func([]byte) {}})
	select {
	case <-p.Done():
	case <-time.After(StopBudget):
		t.Fatal("not reaped while a descendant holds its pipe")
	}
	if !strings.Contains(p.Log(), "up\nbye\n") {
		t.Fatalf("log %q", p.Log())
	}
}
