package daemon

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestPeerFramesApartFromLocalClients: local clients that hold the RPC socket's whole
// frame memory (frames announced at the largest size, their bodies trickled) leave the
// peer port's budget alone: the master's and other owners' large calls to this owner
// (batch pulls, persists, invalidations) still find room.
func TestPeerFramesApartFromLocalClients(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{})
	limit := n.o.frames.Limit()
	for range int(limit / int64(wire.MaxFrameBytes)) {
		conn, err := net.Dial("unix", wire.RPCSocketPath(n.o.SocketPath()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, uint32(wire.MaxFrameBytes-4))); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, func() bool { return limit-n.o.frames.InUse() < int64(wire.MaxFrameBytes) }) // no room for another
	held, err := n.o.peerFrames.Reserve(wire.MaxFrameBytes, time.Now().Add(100*time.Millisecond))
	if err != nil {
		t.Fatalf("a peer call's frame while local clients hold the RPC socket's frame memory: %v", err)
	}
	n.o.peerFrames.Release(held)
}
