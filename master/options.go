package master

import (
	"cmp"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Options configures the master. Zero fields take the defaults below.
type Options struct {
	// HeartbeatInterval is how often owners heartbeat (told to them at Register). Default 1s.
	HeartbeatInterval time.Duration
	// NodeTTL is how long an owner may stay silent before it is tombed. Default 5s.
	NodeTTL time.Duration
	// InflightTTL bounds an in-flight put or get; past it the master revokes it. Default 60s.
	InflightTTL time.Duration
	// AllocRetryInterval and AllocWait bound the wait for space when a segment is full
	// and eviction freed nothing usable: retry every interval, give up with NO_SPACE
	// after AllocWait. Defaults 2ms and 5s.
	AllocRetryInterval time.Duration
	AllocWait          time.Duration
	// MaxPromotions caps durable promotions of one key version (a refilled get target
	// becoming a memory replica). Default 2; NoPromotion turns promotion off (benchmarks
	// of SSD-hit gets).
	MaxPromotions int
	NoPromotion   bool
	// PersistWorkers bounds concurrent BatchSsdReplicaPersist calls; PersistQueue bounds the
	// persists waiting for a worker (a put whose persist finds the queue full is not
	// persisted). Defaults 32 and 1024: a call takes the values queued for its owner (up
	// to PERSIST_BATCH_ITEMS), whose SSD writes run 8 at a time, so a fast put stream
	// needs calls in flight (issue 28: on the conversation trace replayed as fast as
	// possible, 4 workers of single-value calls left 70 % of the values memory-only).
	PersistWorkers int
	PersistQueue   int
	// PersistTimeout bounds one BatchSsdReplicaPersist call to a live owner (an SSD write of
	// a 16 MiB value may take a while). Default 30s. A dead owner's call fails much
	// sooner (PeerConnectTimeout), and the calls of an owner that is tombed meanwhile
	// are cancelled.
	PersistTimeout time.Duration
	// PersistWorkersPerNode bounds the persist workers busy with one owner at once, so a
	// slow or dead owner never occupies every worker. Default PersistWorkers/2, at least
	// 1 (with one worker a dead owner still delays the others, by PeerConnectTimeout per
	// persist).
	PersistWorkersPerNode int
	// SSDAdmit is when a value's SSD replica is written (docs/ssd.md "What reaches SSD"):
	// SSDAdmitEvict (the default) writes a KV page (a key put with a parent) as it nears
	// eviction from memory, so flash holds what memory evicted rather than a second copy
	// of what memory holds; plain keys are persisted at their put. SSDAdmitPut persists
	// every value at its put, as soon as it can, and keeps its memory replica out of the
	// eviction order until then (DESIGN.md's put path). Neither mode loses anything to a
	// restart the other keeps: an owner's SSD tier starts empty, and a restarted master
	// learns both tiers from the owners' reports (a reported page not on SSD is dirty).
	SSDAdmit string
	// WriteBackAhead is the part of each owner's memory pool that the SSD write-back keeps
	// written (or being written) ahead of its evictions, in the eviction order's oldest
	// pages (SSDAdmitEvict only): it must cover what the pool evicts while a write-back
	// is on its way, or allocations wait for write-backs. 0 means the default, 1/8.
	WriteBackAhead float64
	// PeerConnectTimeout bounds connecting to an owner's peer service. With cluster
	// authentication the owner's hello must also come within max(PeerConnectTimeout,
	// 500ms), so a call to a dead owner fails within about twice that. Default 500ms
	// (a dead owner fails within ~1s).
	PeerConnectTimeout time.Duration
	// InvalidateTimeout bounds one InvalidateCachedInfo call to an owner. Calls to
	// different owners run in parallel, one in flight per owner; entries that arrive
	// meanwhile go in that owner's next call. A failed call is not retried. Default 500ms.
	InvalidateTimeout time.Duration
	// InvalidateQueue caps the distinct keys waiting for one owner's next
	// InvalidateCachedInfo call; past it the oldest are dropped (counted, logged).
	// Default 16384.
	InvalidateQueue int
	// Placement decides where a put's memory replica goes (docs/architecture.md §10 "Placement (one
	// pool)"): PlacementPool (the default) places it on the requester when its pool has
	// room, else on the live owner with the most free bytes, else evicts across the pool
	// (duplicates before sole copies) and places it where room was made; the requester
	// writes the value into its transfer area and the target owner pulls it at PutDone.
	// PlacementLocal keeps every put on its requester.
	Placement string
	// PullTimeout bounds one PullPut or BatchPullPut call (the target owner pulling pooled puts from
	// the requester's transfer area; the owner gives up after its own 30s transfer
	// deadline). Default 35s; it must exceed the owners' transfer deadline, or the
	// master could free a range an owner still writes.
	PullTimeout time.Duration
	// RebuildWindow is how long after its start the master adopts the replica indexes
	// owners report when they register again (a master restart is not a cache flush;
	// see rebuild.go). An owner that registers later starts with an empty index.
	// Default 30s.
	RebuildWindow time.Duration
	// WriteQuiet holds the answers of deletes and publishes for this long after the
	// master's start: an owner that has not registered with it yet may still answer gets
	// from its cached holdings (until its lease, two heartbeat intervals after its last
	// heartbeat to the previous master, runs out), and the new master cannot invalidate
	// an owner it does not know. Default 2 × HeartbeatInterval; negative: none (`fluxkv
	// up`, whose owner restarts with its master).
	WriteQuiet time.Duration
	// Epoch numbers this master's state for the owners (registration, eviction notices,
	// the master_epoch of its peer calls); 0 means the current time in nanoseconds. An
	// HA term sets its leadership's epoch (and IDBase from it).
	Epoch int64
	// LastTermEpoch is the epoch of the last HA term that served before this one
	// (ha.Term.MarkServing; 0: none, or not HA), answered at every registration
	// (RegisterResponse.last_term_epoch): an owner registered last with an older master
	// missed that term, and forgets its replicas instead of reporting them.
	LastTermEpoch int64
	// IDBase seeds put, get and holder ids; 0 means the current time in nanoseconds, so
	// ids of a restarted master never collide with ids owners still hold.
	IDBase int64
	// Secrets authenticate every connection to the master and the master's calls to
	// owners' peer services (docs/architecture.md §11). Required unless InsecureCluster.
	Secrets *auth.Secrets
	// InsecureCluster runs without cluster authentication when Secrets is nil: anyone
	// who reaches the port can call the master. Owners must run insecure too.
	InsecureCluster bool
	// MasterKey proves this master to owners on every connection it opens to their peer
	// ports (docs/architecture.md §11): owners answer master-only calls (PullPut, BatchPullPut, BatchSsdReplicaPersist,
	// InvalidateCachedInfo, ReleaseHotSet) only on such a connection, checked against
	// their accepted public keys. nil: its connections are a member's, and owners that
	// check refuse those calls (fluxkv master refuses to start without one).
	MasterKey *auth.MasterKey
	// FrameMemory bounds the bytes of request frames in progress across all the master's
	// connections (wire.FrameBudget); a frame that finds no room within 10s is refused
	// and its connection closed. Default 0: wire.DefaultFrameBudget(0) (a thirty-second
	// of RAM, at least 64 MiB).
	FrameMemory int64
	// Logger receives structured logs. Default: disabled.
	Logger *zerolog.Logger
	// Metrics receives per-call counters and latencies, the listener's refusals and
	// timeouts and, under HA, the leadership. Default: none.
	Metrics *metrics.Metrics
	// NoCallMetrics keeps the per-call counters and latencies out of Metrics (`fluxkv
	// up`: its owner's calls are the node's, and the methods share names).
	NoCallMetrics bool
}

// SSDAdmit values.
const (
	SSDAdmitEvict = "evict"
	SSDAdmitPut   = "put"
)

// Placement values.
const (
	PlacementPool  = "pool"
	PlacementLocal = "local"
)

const (
	defaultPersistWorkers     = 32
	defaultPeerConnectTimeout = 500 * time.Millisecond
	defaultInvalidateTimeout  = 500 * time.Millisecond
	defaultInvalidateQueue    = 16384
)

func (o *Options) setDefaults() {
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = time.Second
	}
	if o.NodeTTL == 0 {
		o.NodeTTL = 5 * time.Second
	}
	if o.InflightTTL == 0 {
		o.InflightTTL = 60 * time.Second
	}
	if o.AllocRetryInterval == 0 {
		o.AllocRetryInterval = 2 * time.Millisecond
	}
	if o.AllocWait == 0 {
		o.AllocWait = 5 * time.Second
	}
	if o.MaxPromotions == 0 {
		o.MaxPromotions = 2
	}
	if o.PersistWorkers == 0 {
		o.PersistWorkers = defaultPersistWorkers
	}
	if o.PersistQueue == 0 {
		o.PersistQueue = 1024
	}
	if o.FrameMemory == 0 {
		o.FrameMemory = wire.DefaultFrameBudget(0)
	}
	if o.PersistTimeout == 0 {
		o.PersistTimeout = 30 * time.Second
	}
	if o.PersistWorkersPerNode == 0 {
		o.PersistWorkersPerNode = max(1, o.PersistWorkers/2)
	}
	if o.PeerConnectTimeout == 0 {
		o.PeerConnectTimeout = defaultPeerConnectTimeout
	}
	if o.InvalidateTimeout == 0 {
		o.InvalidateTimeout = defaultInvalidateTimeout
	}
	if o.InvalidateQueue == 0 {
		o.InvalidateQueue = defaultInvalidateQueue
	}
	if o.RebuildWindow == 0 {
		o.RebuildWindow = 30 * time.Second
	}
	if o.WriteQuiet == 0 {
		o.WriteQuiet = 2 * o.HeartbeatInterval
	}
	if o.Placement == "" {
		o.Placement = PlacementPool
	}
	if o.SSDAdmit == "" {
		o.SSDAdmit = SSDAdmitEvict
	}
	if o.WriteBackAhead == 0 {
		o.WriteBackAhead = 1.0 / 8
	}
	if o.PullTimeout == 0 {
		o.PullTimeout = 35 * time.Second
	}
	if o.IDBase == 0 {
		o.IDBase = time.Now().UnixNano()
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
}

func (o *Options) maxPromotions() int {
	if o.NoPromotion {
		return 0
	}
	return o.MaxPromotions
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if o.HeartbeatInterval < 0 || o.NodeTTL < 0 || o.InflightTTL < 0 || o.AllocRetryInterval < 0 || o.AllocWait < 0 ||
		o.PersistTimeout < 0 || o.PeerConnectTimeout < 0 || o.InvalidateTimeout < 0 || o.PullTimeout < 0 || o.RebuildWindow < 0 {
		return fmt.Errorf("master options: durations must not be negative")
	}
	if o.NodeTTL != 0 && o.HeartbeatInterval != 0 && o.NodeTTL <= o.HeartbeatInterval {
		return fmt.Errorf("master options: node TTL %v must exceed the heartbeat interval %v", o.NodeTTL, o.HeartbeatInterval)
	}
	if o.PersistWorkers < 0 || o.PersistQueue < 0 || o.PersistWorkersPerNode < 0 || o.InvalidateQueue < 0 {
		return fmt.Errorf("master options: worker and queue sizes must not be negative")
	}
	if workers := cmp.Or(o.PersistWorkers, defaultPersistWorkers); o.PersistWorkersPerNode > workers {
		return fmt.Errorf("master options: persist workers per node %d exceed the %d persist workers", o.PersistWorkersPerNode, workers)
	}
	if o.Placement != "" && o.Placement != PlacementPool && o.Placement != PlacementLocal {
		return fmt.Errorf("master options: placement %q: want %q or %q", o.Placement, PlacementPool, PlacementLocal)
	}
	if o.SSDAdmit != "" && o.SSDAdmit != SSDAdmitEvict && o.SSDAdmit != SSDAdmitPut {
		return fmt.Errorf("master options: SSD admission %q: want %q or %q", o.SSDAdmit, SSDAdmitEvict, SSDAdmitPut)
	}
	if o.WriteBackAhead < 0 || o.WriteBackAhead > 1 {
		return fmt.Errorf("master options: write-back ahead %v: want a part of the pool, 0 to 1", o.WriteBackAhead)
	}
	if o.MaxPromotions < 0 {
		return fmt.Errorf("master options: max promotions must not be negative")
	}
	if o.Secrets == nil && !o.InsecureCluster {
		return fmt.Errorf("master options: no cluster secrets: set Secrets, or InsecureCluster to serve without authentication")
	}
	return nil
}
