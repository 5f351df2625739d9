package daemon

import (
	"golang.org/x/sys/unix"

	"github.com/fluxkv/fluxkv/ssd"
)

// The open-file limit (nofile) is split three ways when Options.MaxConnections is 0:
//
//	base     64 + 16 × (SSD paths, + extra shards beyond 4 each): the segment, the
//	         listeners and a spare fd, logs, epoll, the metrics server, master
//	         connections (both ends for `fluxkv up`'s embedded master), SSD shard files
//	         and io_uring instances
//	network  nofile/8 in four equal parts: the data plane's authenticated connections
//	         (dataPlaneConnections), those in their handshake (as many: auth.Listener's
//	         MaxPending), the peer service's handshakes (peerPendingHandshakes), and the
//	         owner's own connections to the other owners (idle ones capped as the data
//	         plane's; those carrying a pull are at most 4 per peer, and transient)
//	sockets  the rest, half to the attach socket and half to the RPC socket
//	         (defaultMaxConnections)
//
// so that every cap full at once still fits the limit (a review found the data plane's
// fixed floor of 256 connections, and as many handshakes, past the limit below nofile
// 4,096, and the network's share counted twice above it).
const (
	// fdReserveBase is the base's fixed part.
	fdReserveBase = 64
	// fdReservePerSSDPath covers one SSD path's shard files and io_uring instances.
	fdReservePerSSDPath = 16
	// minConnections and maxDerivedConnections bound the derived socket cap: a tiny limit
	// still lets a few clients in; a huge one does not promise memory for a million idle
	// connections (each costs a goroutine and a read buffer).
	minConnections        = 8
	maxDerivedConnections = 32768
)

// fdReserve is the base and the network's share of nofile.
func fdReserve(nofile uint64, so *ssd.Options) uint64 {
	reserve := uint64(fdReserveBase) + nofile/8
	if so != nil {
		per := uint64(fdReservePerSSDPath)
		if so.ShardsPerDevice > 4 {
			per += uint64(so.ShardsPerDevice - 4)
		}
		reserve += per * uint64(len(so.Paths))
	}
	return reserve
}

// defaultMaxConnections derives the per-socket connection cap from the open-file limit:
// clamp((nofile − fdReserve)/2, 8, 32768). Under `prlimit --nofile=256`: reserve 96,
// cap 80.
func defaultMaxConnections(nofile uint64, so *ssd.Options) int {
	reserve := fdReserve(nofile, so)
	if nofile <= reserve+2*minConnections {
		return minConnections
	}
	return int(min((nofile-reserve)/2, maxDerivedConnections))
}

// Bounds of the data plane's connection cap (dataPlaneConnections) and of the peer
// service's handshakes (peerPendingHandshakes).
const (
	minNetworkPart          = 8
	maxDataPlaneConnections = 8192
	maxPeerPending          = 256
)

// dataPlaneConnections caps the data plane's connections (transfer.ServerOptions.MaxConns,
// pooled ones included; as many may be in their handshake), and the owner's own idle
// ones to the other owners (transfer.ClientOptions.MaxIdle), each at nofile/32, within
// [8, 8192]. Each other owner keeps up to 4 connections to it
// (transfer.ClientOptions.MaxPullsPerPeer, and as many idle), more while it stages SSD
// refills from it: a fixed 256 refused the pulls of the 65th busy peer, so gets of its
// replicas failed over or missed in clusters of more than 64 owners (at nofile 65,536:
// 2,048 connections).
func dataPlaneConnections(nofile uint64) int {
	return int(min(max(nofile/32, minNetworkPart), maxDataPlaneConnections))
}

// peerPendingHandshakes caps the peer service's connections in their handshake
// (auth.ListenerOptions.MaxPending) at nofile/32, within [8, 256]; its authenticated
// ones are the master's and the other owners', few.
func peerPendingHandshakes(nofile uint64) int {
	return int(min(max(nofile/32, minNetworkPart), maxPeerPending))
}

// nofileLimit is the soft RLIMIT_NOFILE (Go raises it to the hard limit at start).
func nofileLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 1024
	}
	return rl.Cur
}
