package ha

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Candidate is one master campaigning (or leading) on etcd.
type Candidate struct {
	Record
	Leader bool
}

// Candidates lists the masters campaigning on etcd, the leader (the oldest key) first.
func Candidates(ctx context.Context, cli *clientv3.Client, cfg Config) ([]Candidate, error) {
	resp, err := cli.Get(ctx, cfg.electionPrefix()+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("list masters on etcd: %w", err)
	}
	out := make([]Candidate, 0, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		var r Record
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			r.Addr = string(kv.Value) // not ours; show it as it is
		}
		out = append(out, Candidate{Record: r, Leader: i == 0})
	}
	return out, nil
}

// leader reads the current leader's record (ok false: no candidate).
func leader(ctx context.Context, cli *clientv3.Client, cfg Config) (Record, int64, bool, error) {
	resp, err := cli.Get(ctx, cfg.electionPrefix()+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return Record{}, 0, false, err
	}
	if len(resp.Kvs) == 0 {
		return Record{}, resp.Header.Revision, false, nil
	}
	var r Record
	if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
		return Record{}, resp.Header.Revision, false, fmt.Errorf("leader key %s: %w", resp.Kvs[0].Key, err)
	}
	return r, resp.Header.Revision, true, nil
}

// Watch follows the leader: it calls f with the leader's record each time it changes
// (a new leader, or the leader publishing its epoch); a record with Epoch 0 (a leader
// still taking office) or no leader at all is passed as well, with ok false. It
// returns when ctx ends. etcd errors are logged and retried.
func Watch(ctx context.Context, cli *clientv3.Client, cfg Config, log zerolog.Logger, f func(r Record, ok bool)) {
	var last Record
	lastOK, first := false, true
	emit := func(r Record, ok bool) {
		ok = ok && r.Epoch > 0
		if first || r != last || ok != lastOK {
			first, last, lastOK = false, r, ok
			f(r, ok)
		}
	}
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, rev, ok, err := leader(gctx, cli, cfg)
		cancel()
		if err != nil {
			log.Warn().Err(err).Msg("reading the master leader from etcd failed; retrying")
			sleep(ctx, 250*time.Millisecond)
			continue
		}
		emit(r, ok)
		// Any change under the election prefix may change the leader: read it again.
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := cli.Watch(wctx, cfg.electionPrefix()+"/", clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for wr := range wch {
			if wr.Err() != nil {
				log.Warn().Err(wr.Err()).Msg("watching the master leader on etcd failed; watching again")
				break
			}
			gctx, gcancel := context.WithTimeout(ctx, 2*time.Second)
			r, _, ok, err := leader(gctx, cli, cfg)
			gcancel()
			if err != nil {
				log.Warn().Err(err).Msg("reading the master leader from etcd failed; watching again")
				break
			}
			emit(r, ok)
		}
		cancel()
		sleep(ctx, 100*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
