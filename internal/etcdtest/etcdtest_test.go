package etcdtest

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func put(t *testing.T, cli *clientv3.Client, key, val string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, val); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func wantGet(t *testing.T, cli *clientv3.Client, key, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != want {
		t.Fatalf("get %s = %v, want %q", key, resp.Kvs, want)
	}
}

func TestSingle(t *testing.T) {
	c := Start(t, Options{})
	if eps := c.Endpoints(); len(eps) != 1 {
		t.Fatalf("Endpoints() = %v, want one", eps)
	}
	cli := c.Client(t)
	put(t, cli, "k", "v")

	c.Kill(0)
	c.Restart(0)
	// The data dir on tmpfs survived the SIGKILL: etcd had fsynced the put.
	wantGet(t, cli, "k", "v")
}

func TestThree(t *testing.T) {
	c := Start(t, Options{Members: 3})
	put(t, c.Client(t), "a", "1")

	// Losing the leader costs an election; the other two then serve on.
	dead := c.Leader(t)
	live := (dead + 1) % 3
	c.Kill(dead)
	c.WaitHealthy(t, 10*time.Second)
	cli := c.Client(t, live)
	put(t, cli, "b", "2")
	wantGet(t, cli, "a", "1")

	// The restarted member catches up from the others.
	c.Restart(dead)
	wantGet(t, c.Client(t, dead), "b", "2")

	// A paused leader holds its sockets but answers nothing: the others elect a
	// new one; once resumed it steps down and serves again.
	paused := c.Leader(t)
	live = (paused + 1) % 3
	c.Pause(paused)
	c.WaitHealthy(t, 10*time.Second)
	put(t, c.Client(t, live), "c", "3")
	c.Resume(paused)
	c.WaitHealthy(t, 10*time.Second)
	wantGet(t, c.Client(t, paused), "c", "3")
}

// TestCleanup checks that no etcd outlives its test and that the data is gone.
func TestCleanup(t *testing.T) {
	var pids []int
	var dataDir string
	t.Run("cluster", func(t *testing.T) {
		c := Start(t, Options{})
		c.Pause(0) // a stopped process must die too
		for _, m := range c.members {
			pids = append(pids, m.cmd.Process.Pid)
		}
		dataDir = c.dataDir
	})
	for _, pid := range pids {
		// Cleanup waited for the process, so it is reaped and its pid is free.
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("etcd pid %d after cleanup: kill 0 = %v, want ESRCH", pid, err)
		}
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("data dir %s after cleanup: %v", dataDir, err)
	}
}
