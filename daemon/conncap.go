package daemon

import (
	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/ssd"
)

// Limits of the derived connection cap (Options.MaxConnections = 0).
const (
	// fdReserveBase is kept for everything but the two sockets' connections: the segment,
	// the listeners and spare fds, logs, epoll, the metrics server, master and peer
	// connections (both ends, for `fluxkv up`'s embedded master).
	fdReserveBase = 64
	// fdReservePerSSDPath covers one SSD path's shard files and io_uring instances.
	fdReservePerSSDPath = 16
	// minConnections and maxDerivedConnections bound the derived cap: a tiny limit still
	// lets a few clients in; a huge one does not promise memory for a million idle
	// connections (each costs a goroutine and a read buffer).
	minConnections        = 8
	maxDerivedConnections = 32768
)

// defaultMaxConnections derives the per-socket connection cap from the open-file limit:
//
//	reserve = 64 + nofile/16 + 16 × (SSD paths, + extra shards beyond 4 each)
//	cap     = clamp((nofile − reserve) / 2, 8, 32768)
//
// so that both sockets full still leave the reserve for the segment, SSD files and
// master/peer connections. Under `prlimit --nofile=256`: reserve 80, cap 88.
func defaultMaxConnections(nofile uint64, so *ssd.Options) int {
	reserve := uint64(fdReserveBase) + nofile/16
	if so != nil {
		per := uint64(fdReservePerSSDPath)
		if so.ShardsPerDevice > 4 {
			per += uint64(so.ShardsPerDevice - 4)
		}
		reserve += per * uint64(len(so.Paths))
	}
	if nofile <= reserve+2*minConnections {
		return minConnections
	}
	return int(min((nofile-reserve)/2, maxDerivedConnections))
}

// Bounds of the data plane's connection cap (dataPlaneConnections).
const (
	minDataPlaneConnections = 256
	maxDataPlaneConnections = 8192
)

// dataPlaneConnections caps the data plane's connections (transfer.ServerOptions.MaxConns,
// pooled ones included) at nofile/32, half of the nofile/16 the derived socket caps keep
// in reserve, within [256, 8192]. Each other owner keeps up to 4 connections to it
// (transfer.ClientOptions.MaxPullsPerPeer, and as many idle), more while it stages SSD
// refills from it: a fixed 256 refused the pulls of the 65th busy peer, so gets of its
// replicas failed over or missed in clusters of more than 64 owners.
func dataPlaneConnections(nofile uint64) int {
	return int(min(max(nofile/32, minDataPlaneConnections), maxDataPlaneConnections))
}

// nofileLimit is the soft RLIMIT_NOFILE (Go raises it to the hard limit at start).
func nofileLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	return rl.Cur
}
