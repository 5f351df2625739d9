// Package etcddial holds the gRPC dial options fluxkv's etcd clients share (the masters'
// and owners' in master/ha, the tests' in internal/etcdtest).
package etcddial

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// MaxRetryDelay caps the wait between two attempts to reach an etcd member that went
// away: an eighth of the default leader TTL (2 s). gRPC's default backoff (1 s, ×1.6,
// up to 2 minutes) waited about 4 s between its third and fourth attempts, so an etcd
// outage of five seconds outlasted the leader's lease, which etcd re-arms for one TTL
// when it comes back, and the term ended (TestTermSurvivesAnEtcdOutage, 5 runs in 51
// on a loaded machine).
const MaxRetryDelay = 250 * time.Millisecond

// Options are the dial options: retries 100 ms apart at first, growing to
// MaxRetryDelay (a refused connection costs little: etcd members are few); each attempt may take 2 s to connect (a member that drops packets is
// given up on that soon; one that refuses fails at once).
func Options() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: MaxRetryDelay},
		MinConnectTimeout: 2 * time.Second,
	})}
}
