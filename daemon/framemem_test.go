package daemon_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/internal/proctest"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// memoryCgroup makes a cgroup v1 memory group limited to limit bytes, or says why it
// cannot (no v1 memory hierarchy, not root); the test removes it when done.
func memoryCgroup(t *testing.T, limit int64) (string, error) {
	const root = "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(root, "memory.limit_in_bytes")); err != nil {
		return "", fmt.Errorf("no cgroup v1 memory hierarchy at %s", root)
	}
	dir := filepath.Join(root, fmt.Sprintf("fluxkv-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", err
	}
	t.Cleanup(func() {
		for i := 0; i < 50 && os.Remove(dir) != nil; i++ { // the last task may still be exiting
			time.Sleep(20 * time.Millisecond)
		}
	})
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		return "", err
	}
	return dir, nil
}

// procStatusKiB reads a "Name: N kB" line of /proc/PID/status.
func procStatusKiB(t *testing.T, pid int, name string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}

// TestFrameMemoryBounded is the outside report's attack: 40 RPC connections each send
// 31 MiB of a frame announcing 32 MiB and stall (before the budget, the owner's RSS
// grew ~42 MiB per connection and a 1.5 GiB cgroup OOM-killed it at 37). With a
// 256 MiB segment the frame budget is 64 MiB: two frames are read, the others wait for
// room and are refused with the budget's message; the owner's peak RSS grows by the
// budget and slack, it survives inside the same 1.5 GiB cgroup, and it keeps serving.
//
// Not parallel: a memory cgroup named after the pid, and an RSS bound.
func TestFrameMemoryBounded(t *testing.T) {
	const (
		conns    = 40
		budget   = 64 << 20 // wire.DefaultFrameBudget(256 MiB)
		slack    = 64 << 20 // the runtime, socket buffers, the reply and log buffers
		cgroupSz = 3 << 29  // 1.5 GiB, the report's
	)
	dir := t.TempDir()
	socket := filepath.Join(dir, "fluxkv.sock")
	argv := []string{noRaceBin(), "--log-level", "info", "up", "--dir", dir, "--dram", "256MiB", "--frame-timeout", "2s"}
	cg, cgErr := memoryCgroup(t, cgroupSz)
	if cgErr == nil {
		// Join the group before exec, so every page the owner touches is charged to it.
		argv = append([]string{"sh", "-c", `echo $$ > "$0"/cgroup.procs && exec "$@"`, cg}, argv...)
	} else {
		t.Logf("running without a memory cgroup (%v): peak RSS is still measured", cgErr)
	}
	p := &proc{t: t, stderr: &proctest.Buffer{}, done: make(chan error, 1), socket: socket}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(p.stop)
	p.waitSocket()
	c := connect(t, socket)
	if err := c.Put("k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	pid := p.cmd.Process.Pid
	base := procStatusKiB(t, pid, "VmRSS") << 10

	// Each connection announces the largest frame and sends all of it but the last MiB.
	const announced = wire.MaxFrameBytes - 4
	chunk := bytes.Repeat([]byte{0xAB}, 1<<20)
	var wg sync.WaitGroup
	var mu sync.Mutex
	refusedMsgs := 0
	for i := 0; i < conns; i++ {
		conn, err := net.Dial("unix", wire.RPCSocketPath(socket))
		if err != nil {
			t.Fatalf("rpc dial %d: %v", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(2 * time.Minute))
			if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, uint32(announced))); err != nil {
				return
			}
			for sent := 0; sent < announced-len(chunk); sent += len(chunk) {
				if _, err := conn.Write(chunk); err != nil {
					break // refused: the owner closed the connection
				}
			}
			// The owner answers a refusal for want of frame memory before closing, and
			// closes a stalled frame after --frame-timeout.
			reply, _ := io.ReadAll(conn)
			if bytes.Contains(reply, []byte(wire.ErrFrameBudget.Error())) {
				mu.Lock()
				refusedMsgs++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	p.checkAlive()
	peak := procStatusKiB(t, pid, "VmHWM") << 10
	var cgPeak int64
	if cgErr == nil {
		b, _ := os.ReadFile(filepath.Join(cg, "memory.max_usage_in_bytes"))
		cgPeak, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	t.Logf("%d connections × 31 MiB of 32 MiB frames: owner RSS %d MiB before, peak %d MiB (+%d MiB; budget %d MiB); cgroup peak %d MiB of %d; %d refused with the budget's message",
		conns, base>>20, peak>>20, (peak-base)>>20, budget>>20, cgPeak>>20, cgroupSz>>20, refusedMsgs)
	// The budget bounds the live frames; the garbage collector may let the heap reach
	// twice the live bytes before it runs.
	if peak-base > 2*budget+slack {
		t.Fatalf("peak RSS grew by %d MiB: frame memory is not bounded by the %d MiB budget", (peak-base)>>20, budget>>20)
	}
	if refusedMsgs == 0 {
		t.Fatalf("no connection was refused with %q:\n%s", wire.ErrFrameBudget, tail(p.stderr.String()))
	}
	h, err := c.Get("k")
	if err != nil || string(h.Bytes()) != "value" {
		t.Fatalf("get after the attack: %v", err)
	}
	h.Release()
}
