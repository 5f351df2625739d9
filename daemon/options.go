package daemon

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/cloudwego/kitex/server"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/master/ha"
	"github.com/fluxkv/fluxkv/metrics"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// Options configures an owner. Zero fields take the defaults below.
type Options struct {
	// Dir holds the sockets: Dir/fluxkv.sock (attach) and Dir/fluxkv.sock.rpc.
	Dir string
	// DRAM is the memory pool plus the transfer area in bytes, rounded up to the page
	// size; the segment is DRAM + LandingReserve. Default 1 GiB.
	DRAM int64
	// MasterAddr is the master's host:port. Required unless MasterEtcd is set.
	MasterAddr string
	// MasterEtcd, when set, names the etcd cluster and prefix where masters campaign
	// (HA, docs/architecture.md §12): the owner follows the leader published there instead of
	// MasterAddr, and registers again with each new leader.
	MasterEtcd *ha.Config
	// LocalMaster, when set, is the client of a master in this process (fluxkv up:
	// master.Server.LocalClient) at MasterAddr: the owner's calls to it run its
	// handlers directly instead of crossing a loopback connection. MasterAddr stays
	// the master's address (logs, status); the master's calls to the owner still
	// use the peer service. Not with MasterEtcd.
	LocalMaster masterservice.Client
	// NodeID names this owner in the cluster. Default: the host name.
	NodeID string
	// PeerListen is the TCP address of the PeerService (master → owner calls). Default 127.0.0.1:0.
	PeerListen string
	// Secrets authenticate the owner to the master and every caller of its peer
	// service (docs/architecture.md §11). Required unless InsecureCluster.
	Secrets *auth.Secrets
	// InsecureCluster runs without cluster authentication when Secrets is nil: anyone
	// who reaches the peer port can call it. The master must run insecure too.
	InsecureCluster bool
	// MasterKeys are the master public keys this owner accepts (docs/architecture.md §11): with
	// Secrets, master-only peer calls (PullPut, BatchPullPut, BatchSsdReplicaPersist, InvalidateCachedInfo,
	// ReleaseHotSet) are answered only on a connection whose handshake proved one of
	// them, for this node id; other members' calls get PERMISSION_DENIED. nil: no
	// connection can prove a master, so those calls are refused from everyone
	// (fluxkv owner refuses to start without keys).
	MasterKeys *auth.MasterPubKeys
	// DataListen is the TCP address of the data plane (owner-to-owner pulls). Default:
	// PeerListen's host, port 0.
	DataListen string
	// AdvertiseHost is the host other owners and the master reach this owner's peer and
	// data listeners at. Default: the listener's own address, or for a wildcard
	// listener this host's address on the route to the master.
	AdvertiseHost string
	// TransferReserve is the transfer area: the last bytes of DRAM (before the landing
	// area), outside the memory pool, where this owner's clients write puts the master
	// places on other owners (pooled placement); they pull from it. A put's source is
	// taken there, else in the landing area (master/xferarea.go, allocSourceLocked); a
	// value neither can take is placed here. Remote gets that are not promoted land
	// there too, and the master lends its idle room to the pool. Default 0:
	// min(DRAM/8, 256 MiB); negative: no transfer area (every put of this owner is
	// placed on it, unless the landing area takes its source).
	TransferReserve int64
	// LandingReserve is memory beyond DRAM, at the end of the segment, outside the pool
	// and never lent to it, where the master lands the gets of values held elsewhere that
	// are not promoted (master/xferarea.go, getTargetLocked): an owner whose pool is full
	// then evicts nothing for the room of its reads from other owners, where without one
	// each such get in flight takes a value's room (what a Mooncake client's local buffer
	// does for its gets). The segment is DRAM + LandingReserve (rounded up to pages).
	// Default 0: none.
	LandingReserve int64
	// TransferTimeout bounds one pull from another owner, well under the master's
	// in-flight TTL (a stalled one fails sooner: no byte for a second; a get's pull of
	// memory, by 5 s plus its bytes at 32 MiB/s when that is shorter). Default 30s.
	// The master sends its in-flight TTL and pull timeout at registration; the owner
	// lowers this bound to half the TTL for gets and 6/7 of the pull timeout for pooled
	// puts when they are shorter (daemon/bounds.go), and logs so.
	TransferTimeout time.Duration
	// PutCopyDeadline is how long after its PutStart was sent the owner still copies a
	// put's bytes from the session's put area into its range (PutWrite, PutEnd copies;
	// client isolation): the master frees an in-flight put's range after its
	// --inflight-ttl, so a later copy could land in another key's value. Default 50s;
	// a master whose TTL (sent at registration) is shorter than 6/5 of it lowers it to
	// 5/6 of that TTL.
	PutCopyDeadline time.Duration
	// PersistReadWindow is how long after a BatchSsdReplicaPersist arrived the owner
	// still reads its values' source ranges (its own segment, or another owner's by a
	// pull): the master releases the ranges it kept for the persist when the call
	// times out (its PersistTimeout, 30 s by default), after which they may hold other
	// values. Default 20s; a master whose persist timeout (sent at registration) is
	// shorter than 3/2 of it lowers it to 2/3 of that timeout.
	PersistReadWindow time.Duration
	// SocketMode is the permission of both sockets. Default 0660: the socket's group decides who may attach.
	SocketMode os.FileMode
	// AllowedUIDs may attach besides root, this process's uid and members of the
	// socket's group (checked with SO_PEERCRED).
	AllowedUIDs []uint32
	// RegisterTimeout bounds the wait for the master at start. Default 30s.
	RegisterTimeout time.Duration
	// MasterTimeout bounds one call to the master. Default 15s (a put may wait 5s for space).
	MasterTimeout time.Duration
	// AckDelay is how long holder acks may wait to be batched. Default 1ms.
	AckDelay time.Duration
	// CacheGrace keeps a released holding of a replica in this segment cached (in the
	// hot set) this long, so later gets of the key skip the master. The master cannot
	// evict a held replica; when it needs the space it asks for the idle ones back
	// (ReleaseHotSet). Default 30s; negative disables the hot set.
	CacheGrace time.Duration
	// HotSet is the fraction of the memory pool (DRAM less TransferReserve) that
	// idle holdings of the hot set may keep pinned; past it the least recently released
	// go. Default 0.5; negative disables the hot set.
	HotSet float64
	// ShutdownTimeout bounds Stop. Default 4s.
	ShutdownTimeout time.Duration
	// Logger receives structured logs. Default: disabled.
	Logger *zerolog.Logger
	// Metrics receives per-call counters and latencies. Default: none.
	Metrics *metrics.Metrics
	// MaxConnections caps the open connections of each socket (attach and RPC); one
	// more is accepted and refused with a clear error. Default 0: derived from
	// RLIMIT_NOFILE (see defaultMaxConnections): what is left after a reserve for the
	// segment, SSD files and master/peer connections, split between the two sockets.
	MaxConnections int
	// HelloTimeout bounds the wait for an attach hello once connected. Default 5s.
	HelloTimeout time.Duration
	// FrameTimeout bounds an RPC frame once its first byte arrived (the rest of the
	// request must follow within it), and the write of a reply. Default 10s.
	FrameTimeout time.Duration
	// FrameMemory bounds the bytes of request frames in progress across the owner's RPC
	// connections (wire.FrameBudget): a frame over 8 KiB reserves its size before its
	// body is read, waits up to FrameTimeout for room, and is refused with a clear error
	// after that. The peer port has a budget of its own, a quarter of it (at least
	// 64 MiB), so local clients cannot stall the cluster's calls. Default 0:
	// wire.DefaultFrameBudget(DRAM) (an eighth of DRAM, at most an eighth of RAM, at
	// least 64 MiB).
	FrameMemory int64
	// IdleTimeout closes an RPC connection idle this long unless its last call named a
	// session that is still attached (those idle forever). Default 10s.
	IdleTimeout time.Duration
	// ClientIsolation seals the segment with F_SEAL_FUTURE_WRITE once the owner has
	// mapped it, so no client can change a byte of it; puts go through a per-session
	// put area the owner copies from (docs/architecture.md §11). Default false.
	ClientIsolation bool
	// Prefault allocates the whole segment in Start, every page faulted in (progress
	// logged), so no put pays a page's first touch (on a virtual machine the host's
	// backing of the page too) and a machine without the memory fails at start. Default
	// false (pages are allocated as they are first written); the command line's default
	// is true.
	Prefault bool
	// HugePages advises transparent huge pages for the segment (shm.SegmentOptions.HugePages):
	// where the kernel's policy for shared memory allows them
	// (/sys/kernel/mm/transparent_hugepage/shmem_enabled: advise, within_size or always),
	// the prefault backs the segment with 2 MiB pages, and every client maps them with a
	// 512th of the page-table entries (docs/running.md "Huge pages"). False refuses
	// them. Default false; the command line's default is true.
	HugePages bool
	// PutArea is the size of each session's put area under isolation (a value larger
	// than it is streamed through it in parts), rounded up to the page size. Default
	// 32 MiB, at most the segment.
	PutArea int64
	// PutAreaTotal caps the put areas of all live sessions together; an attach that
	// would exceed it gets a smaller area (at least minPutArea) or is refused with
	// NO_SPACE. Default 1 GiB.
	PutAreaTotal int64
	// UIDShare is the largest share a client uid other than the owner's and root may
	// take of each resource the owner's clients compete for: each Unix socket's
	// connection cap, PutAreaTotal and FrameMemory (uidshare.go), so that one admitted
	// tenant cannot deny the others service. A fraction 0 < x ≤ 1; 1 lifts the bound.
	// Default 0 means DefaultUIDShare (1: no per-uid bound).
	UIDShare float64
	// SSD enables the SSD tier (docs/architecture.md §6) with these storage options; nil = memory only.
	SSD *ssd.Options

	testPeerServerOpts []server.Option             // added to the peer service's Kitex options by tests
	testPuller         func(pullClient) pullClient // wraps the puller, for tests that break a pull
	testCopyChunk      func(key string, chunk int) // runs after each chunk copyIn copied, for tests that stall it
	testBeforePin      func()                      // runs in pinFound once the lookup's pages landed, before they are pinned
}

const pageSize = 4096

// transferGranule aligns the transfer area (the master allocates in 512-byte granules).
const transferGranule = 512

// Put area sizes under client isolation: the default per session, and the smallest area
// a session is given when the total is nearly used up.
const (
	defaultPutArea = 32 << 20
	minPutArea     = 1 << 20
)

// DefaultPutAreaTotal is Options.PutAreaTotal's default: the cap on all sessions' put
// areas together.
const DefaultPutAreaTotal = 1 << 30

func (o *Options) setDefaults() {
	if o.Dir == "" {
		o.Dir = wire.DefaultDir()
	}
	if o.DRAM == 0 {
		o.DRAM = 1 << 30
	}
	o.DRAM = (o.DRAM + pageSize - 1) / pageSize * pageSize
	if o.NodeID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "owner"
		}
		o.NodeID = h
	}
	if o.PeerListen == "" {
		o.PeerListen = "127.0.0.1:0"
	}
	if o.DataListen == "" {
		host, _, err := net.SplitHostPort(o.PeerListen)
		if err != nil {
			host = "127.0.0.1"
		}
		o.DataListen = net.JoinHostPort(host, "0")
	}
	switch {
	case o.TransferReserve == 0:
		o.TransferReserve = min(o.DRAM/8, 256<<20)
	case o.TransferReserve < 0:
		o.TransferReserve = 0
	}
	o.TransferReserve = o.TransferReserve / transferGranule * transferGranule
	o.LandingReserve = (max(o.LandingReserve, 0) + pageSize - 1) / pageSize * pageSize
	if o.TransferTimeout == 0 {
		o.TransferTimeout = 30 * time.Second
	}
	if o.PutCopyDeadline == 0 {
		o.PutCopyDeadline = 50 * time.Second
	}
	if o.PersistReadWindow == 0 {
		o.PersistReadWindow = 20 * time.Second
	}
	if o.SocketMode == 0 {
		o.SocketMode = 0o660
	}
	if o.RegisterTimeout == 0 {
		o.RegisterTimeout = 30 * time.Second
	}
	if o.MasterTimeout == 0 {
		o.MasterTimeout = 15 * time.Second
	}
	if o.AckDelay == 0 {
		o.AckDelay = time.Millisecond
	}
	if o.CacheGrace == 0 {
		o.CacheGrace = 30 * time.Second
	}
	if o.HotSet == 0 {
		o.HotSet = defaultHotSet
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 4 * time.Second
	}
	if o.MaxConnections == 0 {
		o.MaxConnections = defaultMaxConnections(nofileLimit(), o.SSD)
	}
	if o.HelloTimeout == 0 {
		o.HelloTimeout = 5 * time.Second
	}
	if o.FrameTimeout == 0 {
		o.FrameTimeout = 10 * time.Second
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 10 * time.Second
	}
	if o.FrameMemory == 0 {
		o.FrameMemory = wire.DefaultFrameBudget(o.DRAM)
	}
	if o.PutArea == 0 {
		o.PutArea = defaultPutArea
	}
	// At most the segment, before rounding: a size near the int64 limit would wrap.
	// DRAM is a page multiple, so the rounded area stays within it.
	o.PutArea = min(o.PutArea, o.DRAM)
	o.PutArea = (o.PutArea + pageSize - 1) / pageSize * pageSize
	if o.PutAreaTotal == 0 {
		o.PutAreaTotal = DefaultPutAreaTotal
	}
	if o.UIDShare == 0 {
		o.UIDShare = DefaultUIDShare
	}
	if o.Logger == nil {
		l := zerolog.Nop()
		o.Logger = &l
	}
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if o.MasterAddr == "" && o.MasterEtcd == nil {
		return fmt.Errorf("owner: master address is required")
	}
	if o.MasterAddr != "" && o.MasterEtcd != nil {
		return fmt.Errorf("owner: a master address and an etcd cluster to follow are exclusive")
	}
	if o.LocalMaster != nil && o.MasterEtcd != nil {
		return fmt.Errorf("owner: an in-process master and an etcd cluster to follow are exclusive")
	}
	if o.MasterEtcd != nil {
		if err := o.MasterEtcd.Validate(); err != nil {
			return fmt.Errorf("owner: master on etcd: %w", err)
		}
	}
	if o.Secrets == nil && !o.InsecureCluster {
		return fmt.Errorf("owner: no cluster secrets: set Secrets, or InsecureCluster to run without authentication")
	}
	if o.DRAM < 0 {
		return fmt.Errorf("owner: dram %d must be positive", o.DRAM)
	}
	if o.MaxConnections < 0 {
		return fmt.Errorf("owner: max connections %d must not be negative (0 = derived from the open-file limit)", o.MaxConnections)
	}
	if o.HelloTimeout < 0 || o.FrameTimeout < 0 || o.IdleTimeout < 0 {
		return fmt.Errorf("owner: hello/frame/idle timeouts (%v/%v/%v) must not be negative", o.HelloTimeout, o.FrameTimeout, o.IdleTimeout)
	}
	if o.TransferReserve > 0 && o.DRAM > 0 && o.TransferReserve >= o.DRAM {
		return fmt.Errorf("owner: transfer reserve %d must be below DRAM %d", o.TransferReserve, o.DRAM)
	}
	if o.HotSet > 1 {
		return fmt.Errorf("owner: hot set %v is a fraction of the memory pool: at most 1 (negative disables it)", o.HotSet)
	}
	if o.PutArea < 0 || o.PutAreaTotal < 0 {
		return fmt.Errorf("owner: put area %d and put area total %d must not be negative", o.PutArea, o.PutAreaTotal)
	}
	if o.FrameMemory < 0 {
		return fmt.Errorf("owner: frame memory %d must not be negative", o.FrameMemory)
	}
	if !(o.UIDShare >= 0 && o.UIDShare <= 1) { // NaN too
		return fmt.Errorf("owner: uid share %v is a fraction: 0 < x ≤ 1 (1: no per-uid bound; 0: the default %v)", o.UIDShare, DefaultUIDShare)
	}
	if o.PutAreaTotal != 0 && o.PutAreaTotal < minPutArea {
		return fmt.Errorf("owner: put area total %d must be at least %d bytes", o.PutAreaTotal, minPutArea)
	}
	if err := wire.ValidateNodeID(o.NodeID); o.NodeID != "" && err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	return nil
}

// defaultHotSet is the default HotSet.
const defaultHotSet = 0.5

// pinBudget is the bytes prefix-lookup pins may hold: the hot-set budget, or with the
// hot set off the default hot set's share of the pool (pins last a moment; a page that
// cannot be pinned ends a prefix lookup's count, so none would be found).
func (o *Options) pinBudget() int64 {
	if b := o.hotSetBudget(); b > 0 {
		return b
	}
	return int64(defaultHotSet * float64(o.DRAM-o.TransferReserve))
}

// hotSetBudget is the bytes idle hot-set holdings may keep (0: none).
func (o *Options) hotSetBudget() int64 {
	if o.HotSet <= 0 || o.CacheGrace <= 0 {
		return 0
	}
	return int64(o.HotSet * float64(o.DRAM-o.TransferReserve))
}

// SocketPath is the attach socket users name.
func (o *Options) SocketPath() string { return filepath.Join(o.Dir, wire.SocketName) }
