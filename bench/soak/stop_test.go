package main

import (
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
