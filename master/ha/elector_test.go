package ha_test

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fluxkv/fluxkv/internal/etcdtest"
	"github.com/fluxkv/fluxkv/master/ha"
)

func campaign(t *testing.T, ctx context.Context, el *ha.Elector) <-chan *ha.Term {
	ch := make(chan *ha.Term, 1)
	go func() {
		tm, err := el.Campaign(ctx)
		if err != nil {
			close(ch)
			return
		}
		ch <- tm
	}()
	return ch
}

// startEtcd starts a one-member etcd and returns a client of it, the config of a
// cluster on it and a context cancelled when the test ends.
func startEtcd(t *testing.T) (*etcdtest.Cluster, ha.Config, *clientv3.Client, context.Context) {
	etcd := etcdtest.Start(t, etcdtest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return etcd, ha.Config{Endpoints: etcd.Endpoints(), Prefix: ha.DefaultPrefix("t")}, etcd.Client(t), ctx
}

// Two candidates: one leads, the other waits; the leader resigns and the other leads
// with the next epoch; owners watching see each leader once it published its epoch.
func TestElectionHandover(t *testing.T) {
	_, cfg, cli, ctx := startEtcd(t)

	seen := make(chan ha.Record, 16)
	go ha.Watch(ctx, cli, cfg, zerolog.Nop(), func(r ha.Record, ok bool) {
		if ok {
			seen <- r
		}
	})

	a := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "a:1", TTL: 2 * time.Second})
	b := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "b:1", TTL: 2 * time.Second})
	ta := <-campaign(t, ctx, a)
	if ta == nil || !ta.Leading() {
		t.Fatal("a does not lead")
	}
	if err := ta.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-seen; r.Addr != "a:1" || r.Epoch != ta.Epoch {
		t.Fatalf("watch saw %+v, want a:1 epoch %d", r, ta.Epoch)
	}
	chB := campaign(t, ctx, b)
	select {
	case <-chB:
		t.Fatal("b leads while a does")
	case <-time.After(500 * time.Millisecond):
	}
	cs, err := ha.Candidates(ctx, cli, cfg)
	if err != nil || len(cs) != 2 || !cs[0].Leader || cs[0].Addr != "a:1" || cs[1].Leader || cs[1].Addr != "b:1" {
		t.Fatalf("candidates %+v, %v", cs, err)
	}
	resigned := time.Now()
	ta.Resign(ctx)
	if ta.Leading() {
		t.Fatal("a leads after resigning")
	}
	tb := <-chB
	if tb == nil || tb.Epoch != ta.Epoch+1 {
		t.Fatalf("b's term %+v after a's epoch %d", tb, ta.Epoch)
	}
	// a stopped serving no earlier than resigned: b's term must start Margin later, as
	// after a lease lost at etcd (b's quiet period counts on it).
	if d := time.Since(resigned); d < ha.Margin(2*time.Second) {
		t.Errorf("b leads %v after a resigned, under the margin %v", d, ha.Margin(2*time.Second))
	}
	if err := tb.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-seen; r.Addr != "b:1" || r.Epoch != tb.Epoch {
		t.Fatalf("watch saw %+v, want b:1 epoch %d", r, tb.Epoch)
	}
	tb.Resign(ctx)
}

// TestRaiseEpoch: a term raises the epoch counter past ids that went past its range, and
// the next term's epoch is above the raised counter; a raise below the counter leaves it.
func TestRaiseEpoch(t *testing.T) {
	_, cfg, cli, ctx := startEtcd(t)
	a := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "a:1", TTL: 2 * time.Second})
	ta := <-campaign(t, ctx, a)
	if ta == nil {
		t.Fatal("no term")
	}
	if err := ta.RaiseEpoch(ctx, ta.Epoch+100); err != nil {
		t.Fatal(err)
	}
	if err := ta.RaiseEpoch(ctx, ta.Epoch+50); err != nil {
		t.Fatal(err)
	}
	ta.Resign(ctx)
	b := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "b:1", TTL: 2 * time.Second})
	tb := <-campaign(t, ctx, b)
	if tb == nil {
		t.Fatal("no term")
	}
	defer tb.Resign(context.Background())
	if tb.Epoch != ta.Epoch+101 {
		t.Fatalf("the term after one that raised the counter to %d has epoch %d", ta.Epoch+100, tb.Epoch)
	}
	if err := ta.RaiseEpoch(ctx, tb.Epoch+5); err == nil {
		t.Error("a resigned term raised the epoch counter")
	}
}

// A leader whose etcd stops answering stops leading within the TTL (its fence), long
// before etcd could let another candidate win; when etcd answers again the term either
// resumes (its lease survived) or is over.
func TestLeaderFencedWhenEtcdStops(t *testing.T) {
	etcd, cfg, cli, ctx := startEtcd(t)
	a := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "a:1", TTL: 2 * time.Second})
	ta := <-campaign(t, ctx, a)
	if ta == nil {
		t.Fatal("no term")
	}
	defer ta.Resign(context.Background())
	etcd.Pause(0)
	paused := time.Now()
	// A check begun past the lease that still finds the term leading is the failure; a
	// check this goroutine made late (a busy machine) that finds it fenced is not.
	var fenced time.Duration
	for {
		at := time.Since(paused)
		if !ta.Leading() {
			fenced = at
			break
		}
		if at > 2*time.Second {
			t.Fatalf("still leading %v after etcd stopped: past the 2s lease", at)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("fenced by %v after etcd stopped", fenced)
	etcd.Resume(0)
	deadline := time.Now().Add(10 * time.Second)
	for !ta.Leading() {
		select {
		case <-ta.Done():
			t.Log("the lease expired while etcd was stopped: term over")
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("neither leading again nor over 10s after etcd resumed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Log("the term resumed: its lease survived")
}

// TestResignWhileEtcdPaused: a leader cut off from etcd (etcd paused) is told to stop:
// Resign must return within about the lease's TTL (it waited for the session's own
// 60 s revoke), so a master's Stop (SIGTERM) finishes while etcd is unreachable.
func TestResignWhileEtcdPaused(t *testing.T) {
	etcd, cfg, cli, ctx := startEtcd(t)
	a := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "a:1", TTL: 2 * time.Second})
	ta := <-campaign(t, ctx, a)
	if ta == nil {
		t.Fatal("no term")
	}
	etcd.Pause(0)
	resumed := false
	defer func() {
		if !resumed {
			etcd.Resume(0)
		}
	}()
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ta.Resign(rctx)
		close(done)
	}()
	select {
	case <-done:
		t.Logf("Resign returned after %v with etcd paused", time.Since(t0))
	case <-time.After(6 * time.Second):
		etcd.Resume(0)
		resumed = true
		<-done
		t.Fatalf("Resign (ctx 1s, TTL 2s) still blocked 6s after etcd paused; returned only after etcd resumed (%v)", time.Since(t0))
	}
}

// TestCampaignCancelWhileEtcdPaused: a candidate waiting behind a leader is stopped (its
// ctx cancelled) while etcd is unreachable: Campaign must return, or master.HA.Stop
// (which waits for it before it closes the etcd client) hangs until etcd comes back.
func TestCampaignCancelWhileEtcdPaused(t *testing.T) {
	etcd, cfg, cli, ctx := startEtcd(t)
	a := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "a:1", TTL: 2 * time.Second})
	b := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "b:1", TTL: 2 * time.Second})
	ta := <-campaign(t, ctx, a)
	if ta == nil {
		t.Fatal("no term")
	}
	bctx, bcancel := context.WithCancel(ctx)
	chB := campaign(t, bctx, b)
	time.Sleep(500 * time.Millisecond) // b waits behind a
	etcd.Pause(0)
	resumed := false
	defer func() {
		if !resumed {
			etcd.Resume(0)
		}
		ta.Resign(context.Background())
	}()
	t0 := time.Now()
	bcancel()
	select {
	case tb := <-chB:
		if tb != nil {
			t.Fatal("b leads")
		}
		t.Logf("b's Campaign returned %v after its ctx ended, etcd paused", time.Since(t0))
	case <-time.After(6 * time.Second):
		etcd.Resume(0)
		resumed = true
		select {
		case <-chB:
		case <-time.After(70 * time.Second):
		}
		t.Fatalf("b's Campaign still blocked 6s after its ctx was cancelled (etcd paused); returned %v after, once etcd resumed", time.Since(t0))
	}
}

// Each term records on etcd that it serves, with its timing, and learns the last term
// that did: the first none, the next the first's record, a term that never marked
// itself (it won and died before serving) is passed over, and a deposed term cannot
// mark itself. After the epoch counter was reset by hand, the next term still learns
// the last one's record and records its own lower epoch.
func TestMarkServing(t *testing.T) {
	_, cfg, cli, ctx := startEtcd(t)
	el := ha.NewElector(cli, cfg, ha.ElectorOptions{Addr: "a:1", TTL: 2 * time.Second})
	timing := func(i int) ha.Served {
		return ha.Served{Heartbeat: time.Duration(i) * time.Second, TTL: time.Duration(10+i) * time.Second, QuietUntil: int64(1000 + i)}
	}
	mark := func(tm *ha.Term, i int, want ha.Served) {
		t.Helper()
		var seen ha.Served
		last, rec, err := tm.MarkServing(ctx, func(l ha.Served) ha.Served { seen = l; return timing(i) })
		if err != nil || last != want || seen != want {
			t.Fatalf("term %d's MarkServing: %+v (its record made from %+v), %v; want %+v", i, last, seen, err, want)
		}
		if mine := timing(i); rec.Epoch != tm.Epoch || rec.Heartbeat != mine.Heartbeat || rec.QuietUntil != mine.QuietUntil {
			t.Fatalf("term %d recorded %+v", i, rec)
		}
	}
	mine := func(tm *ha.Term, i int) ha.Served {
		s := timing(i)
		s.Epoch = tm.Epoch
		return s
	}
	t1 := <-campaign(t, ctx, el)
	mark(t1, 1, ha.Served{})
	t1.Resign(ctx)
	t2 := <-campaign(t, ctx, el) // wins, never serves
	t2.Resign(ctx)
	t3 := <-campaign(t, ctx, el)
	if t3 == nil || t3.Epoch != t1.Epoch+2 {
		t.Fatalf("third term %+v after epoch %d", t3, t1.Epoch)
	}
	mark(t3, 3, mine(t1, 1))
	mark(t3, 3, mine(t3, 3)) // again: its own
	t3.Resign(ctx)
	t4 := <-campaign(t, ctx, el)
	t4.Resign(ctx)
	if _, _, err := t4.MarkServing(ctx, func(ha.Served) ha.Served { return timing(4) }); err == nil {
		t.Fatal("a resigned term marked itself serving")
	}
	t5 := <-campaign(t, ctx, el)
	mark(t5, 5, mine(t3, 3))
	t5.Resign(ctx)
	if _, err := cli.Put(ctx, cfg.Prefix+"epoch", "0"); err != nil {
		t.Fatal(err)
	}
	t6 := <-campaign(t, ctx, el)
	if t6 == nil || t6.Epoch != 1 {
		t.Fatalf("the term after a reset: %+v, want epoch 1", t6)
	}
	mark(t6, 6, mine(t5, 5))
	t6.Resign(ctx)
	if _, err := cli.Put(ctx, cfg.Prefix+"served", "garbage"); err != nil {
		t.Fatal(err)
	}
	t7 := <-campaign(t, ctx, el)
	mark(t7, 7, ha.Served{}) // a record that does not parse is none
	t7.Resign(ctx)
	t8 := <-campaign(t, ctx, el)
	mark(t8, 8, mine(t7, 7))
	t8.Resign(ctx)
	if _, err := cli.Put(ctx, cfg.Prefix+"served", "5"); err != nil { // a bare epoch
		t.Fatal(err)
	}
	t9 := <-campaign(t, ctx, el)
	mark(t9, 9, ha.Served{Epoch: 5})
}
