package daemon_test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSignalsStopCleanly: SIGHUP and SIGINT stop an owner and a master as SIGTERM does
// (exit 0, sockets removed, the signal logged). Kitex's servers had signal handlers of
// their own: a hangup closed the master's port and the owner's peer service while both
// processes stayed up and ready.
func TestSignalsStopCleanly(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			m := startMaster(t, "")
			o := startOwner(t, t.TempDir(), m.addr, "16MiB", "signalled")
			c := connect(t, o.socket)
			if err := c.Put("k", payload(1, 4096)); err != nil {
				t.Fatal(err)
			}
			for _, p := range []*proc{o, m} {
				p.stopWith(sig)
				if log := p.stderr.String(); !strings.Contains(log, "signal received") || !strings.Contains(log, sig.String()) {
					t.Errorf("%s: no log line names %v:\n%s", p.name(), sig, tail(log))
				}
			}
		})
	}
}

// TestHangupIgnoredUnderNohup: a node started with SIGHUP ignored (nohup) keeps it
// ignored (Go's signal.Notify would have installed a handler) and serves on; SIGTERM
// still stops it cleanly.
func TestHangupIgnoredUnderNohup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := startWrapped(t, []string{"nohup"}, "up", "--dir", dir, "--dram", "16MiB")
	p.socket = filepath.Join(dir, "fluxkv.sock")
	p.waitSocket()
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	p.checkAlive()
	c := connect(t, p.socket)
	if err := c.Put("k", payload(2, 4096)); err != nil {
		t.Fatalf("a put after SIGHUP: %v", err)
	}
	c.Close()
	p.stop()
}
