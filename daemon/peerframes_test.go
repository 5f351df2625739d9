package daemon

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/master"
	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestPeerFramesApartFromLocalClients: local clients that hold the RPC socket's whole
// frame memory (frames announced at the largest size, their bodies trickled) leave the
// peer port's alone: a large frame of the master's or another owner's call to this
// owner (a batch pull, a persist, invalidations) still finds room and is read.
func TestPeerFramesApartFromLocalClients(t *testing.T) {
	t.Parallel()
	n := startNode(t, 8<<20, nil, master.Options{})
	announce := func(conn net.Conn) {
		t.Helper()
		t.Cleanup(func() { conn.Close() })
		if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, uint32(wire.MaxFrameBytes-4))); err != nil {
			t.Fatal(err)
		}
	}
	limit := n.o.frames.Limit()
	for range int(limit / int64(wire.MaxFrameBytes)) {
		conn, err := net.Dial("unix", wire.RPCSocketPath(n.o.SocketPath()))
		if err != nil {
			t.Fatal(err)
		}
		announce(conn)
	}
	waitUntil(t, func() bool { return limit-n.o.frames.InUse() < int64(wire.MaxFrameBytes) }) // no room for another
	// A member's connection to the peer port (authenticated as the cluster's members
	// are) announces the largest frame too: its memory is reserved at once.
	conn, err := auth.NewDialer(n.opts.Secrets, auth.PurposePeer).DialTimeout("tcp", n.o.peerAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	announce(conn)
	waitUntil(t, func() bool { return n.o.peerFrames.InUse() >= int64(wire.MaxFrameBytes-4) })
}
