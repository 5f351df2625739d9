package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// exitedProc starts "sh -c script" and waits for it to exit by itself.
func exitedProc(t *testing.T, wg *sync.WaitGroup, name, script string) *proc {
	t.Helper()
	p, err := startProc(wg, name, []string{"sh", "-c", script}, nil, filepath.Join(t.TempDir(), name+".log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not exit", name)
	}
	return p
}

// TestStopReportsACrashedDaemon: a daemon that exited by itself after the driver's last
// look (while the keys were deleted, the owners settled) fails the run at the stop. It
// was passed over as already stopped: a crash late in the run, PASS.
func TestStopReportsACrashedDaemon(t *testing.T) {
	var wg sync.WaitGroup
	defer wg.Wait()
	c := &cluster{master: exitedProc(t, &wg, "master", "exit 3"), owners: []*ownerProc{{p: exitedProc(t, &wg, "owner", "exit 0")}}}
	bad := c.stop()
	if len(bad) != 2 || !strings.Contains(bad[0], "owner exited by itself") || !strings.Contains(bad[1], "master exited by itself") {
		t.Fatalf("stop of a crashed owner and master: %q", bad)
	}
}

// TestStopAllReportsACrashedWorker: a worker that exited by itself after the loop's
// last reap (a crash the last chaos restart caused, say) fails the run when the workers
// stop. It was passed over.
func TestStopAllReportsACrashedWorker(t *testing.T) {
	var wg sync.WaitGroup
	defer wg.Wait()
	w := &workerPool{wg: &wg, last: map[string]*Counters{}, slots: []*workerSlot{{lang: "go", p: exitedProc(t, &wg, "w#1", "exit 2")}}}
	w.stopAll(5 * time.Second)
	if len(w.failures) != 1 || !strings.Contains(w.failures[0], "worker exited by itself before the end") {
		t.Fatalf("stopAll with a crashed worker: %q", w.failures)
	}
}

// TestFailedOpsLeaveOutAnswers: the run's bound on failed operations counts the errors
// that say an operation could not run, not answers (a miss, a put refused as existing)
// nor a full cache.
func TestFailedOpsLeaveOutAnswers(t *testing.T) {
	c := Counters{Errors: map[string]int64{"KEY_NOT_FOUND": 50, "ALREADY_EXISTS": 7, "NO_SPACE": 3, "UNAVAILABLE": 11, "CLIENT": 2}}
	if n := failedOps(c); n != 13 {
		t.Fatalf("failedOps = %d, want 13 (UNAVAILABLE and CLIENT)", n)
	}
}

// TestStartFailureStopsTheMaster: an owner that fails to start returns the cluster begun,
// so the driver stops its master. It returned nothing, and the driver waited for the
// master's reaper for ever (a review).
func TestStartFailureStopsTheMaster(t *testing.T) {
	bin := os.Getenv("FLUXKV_BIN")
	if bin == "" {
		t.Skip("FLUXKV_BIN is not set")
	}
	wrap := filepath.Join(t.TempDir(), "fluxkv")
	script := "#!/bin/sh\nif [ \"$1\" = owner ]; then exit 3; fi\nexec " + bin + " \"$@\"\n"
	if err := os.WriteFile(wrap, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	c, err := startCluster(&wg, nodeConfig{Bin: wrap, Dir: t.TempDir(), Owners: 1, DRAM: 16 << 20})
	if err == nil || c == nil || c.master == nil {
		t.Fatalf("startCluster with an owner that exits: %v, %v", c, err)
	}
	c.stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a child process still runs after the stop")
	}
}
