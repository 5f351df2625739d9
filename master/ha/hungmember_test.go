package ha_test

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/internal/etcdtest"
	"github.com/fluxkv/fluxkv/master/ha"
)

// watchStreams reads etcd_debugging_mvcc_watch_stream_total from a member's /metrics:
// the watch streams it serves.
func watchStreams(t *testing.T, ep string) int {
	t.Helper()
	resp, err := http.Get("http://" + ep + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watch_stream_total "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return int(f)
		}
	}
	return -1
}

// A standby whose election watch lives on an etcd member that hangs (SIGSTOP: its TCP
// connections stay up, nothing answers) leads once the leader resigns, the two other
// members holding quorum: Config.Client's keepalive pings find the hung member and the
// watch moves on. Without them the standby waited for good (a review).
func TestStandbyLeadsPastAHungMember(t *testing.T) {
	etcd := etcdtest.Start(t, etcdtest.Options{Members: 3})
	eps := etcd.Endpoints()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := ha.Config{Endpoints: eps, Prefix: ha.DefaultPrefix("hung")}
	a := ha.NewElector(etcd.Client(t, 0), cfg, ha.ElectorOptions{Addr: "a:1", TTL: 2 * time.Second})
	ta := <-campaign(t, ctx, a)
	if ta == nil {
		t.Fatal("a does not lead")
	}
	// b, a master's elector on members 1 and 2, its client made as masters make it.
	bcfg := ha.Config{Endpoints: eps[1:], Prefix: cfg.Prefix}
	bcli, err := bcfg.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer bcli.Close()
	b := ha.NewElector(bcli, cfg, ha.ElectorOptions{Addr: "b:1", TTL: 2 * time.Second})
	chB := campaign(t, ctx, b)
	x := -1
	for deadline := time.Now().Add(10 * time.Second); x < 0 && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		for i := 1; i <= 2; i++ {
			if watchStreams(t, eps[i]) > 0 {
				x = i
			}
		}
	}
	if x < 0 {
		t.Fatal("b's election watch not found on member 1 or 2")
	}
	etcd.Pause(x)
	defer etcd.Resume(x)
	resigned := time.Now()
	ta.Resign(ctx)
	select {
	case tb := <-chB:
		if tb == nil {
			t.Fatal("b's campaign failed")
		}
		t.Logf("b leads %v after a resigned, member %d hung", time.Since(resigned).Round(time.Millisecond), x)
		tb.Resign(context.Background())
	case <-time.After(40 * time.Second):
		t.Fatalf("b does not lead 40 s after a resigned (member %d of 3 hung, quorum intact)", x)
	}
}
