package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

// FuzzPeerFrames sends authenticated frames to a real owner's peer port (an owner and
// its master in this process, on loopback): every PeerService method's request with
// every field filled, each with one length announcing 2^31-1 (the outside report's
// InvalidateCachedInfo frame that killed an owner), and what the fuzzer makes of them.
// After each the owner must still answer a peer call, the process having allocated
// under 1 GiB for the frame (the heap other tests left is not counted).
//
//	FLUXKV_BIN=/nonexistent go test ./daemon/ -run '^$' -fuzz '^FuzzPeerFrames$' -fuzztime 20s
func FuzzPeerFrames(f *testing.F) {
	s := authtest.Secrets(f)
	m := startAuthMaster(f, s)
	o, err := New(authOwnerOptions(f, m, s))
	if err != nil {
		f.Fatal(err)
	}
	if err := o.Start(context.Background()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { o.Stop() })
	addr := o.peer.addr()
	c, err := peerservice.NewClient("fluxkv-owner", append(auth.ClientOptions(s, auth.PurposePeer),
		client.WithHostPorts(addr), client.WithRPCTimeout(10*time.Second))...)
	if err != nil {
		f.Fatal(err)
	}
	// SsdStageRead is an owner's call: any member may make it (this one fails: no such
	// value), and an answer means the owner still serves.
	authtest.FuzzFrames(f, peerservice.NewServiceInfo(), addr, s, auth.PurposePeer, func() error {
		_, err := c.SsdStageRead(context.Background(), &peer.SsdStageReadRequest{Key: "k", Len: 1})
		return err
	})
}
