package auth_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/server"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer/peerservice"
)

// roleStub answers InvalidateCachedInfo OK only on a master's connection.
type roleStub struct{ peerStub }

func (*roleStub) InvalidateCachedInfo(ctx context.Context, _ *peer.InvalidateCachedInfoRequest) (*peer.InvalidateCachedInfoResponse, error) {
	if auth.ConnRole(ctx) != auth.RoleMaster {
		return &peer.InvalidateCachedInfoResponse{Code: common.ErrorCode_PERMISSION_DENIED}, nil
	}
	return &peer.InvalidateCachedInfoResponse{Code: common.ErrorCode_OK}, nil
}

// ConnRole in a Kitex handler reports what the calling connection proved: master for
// the master's dialer, member for a member's, both on one server at once.
func TestKitexConnRole(t *testing.T) {
	s := authtest.Secrets(t)
	key, pubs := authtest.MasterKeys(t)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := raw.Addr().String()
	ln := auth.Listener(raw, s, auth.PurposePeer, auth.ListenerOptions{MasterCheck: auth.NewMasterCheck(pubs, "n1")})
	svr := peerservice.NewServer(&roleStub{}, append(auth.ServerOptions(ln), server.WithExitWaitTime(time.Second))...)
	go svr.Run()
	t.Cleanup(func() { svr.Stop() })
	time.Sleep(20 * time.Millisecond)

	call := func(d *auth.Dialer) common.ErrorCode {
		t.Helper()
		c, err := peerservice.NewClient("peer", append(auth.ClientOptions(s, auth.PurposePeer),
			client.WithHostPorts(addr), client.WithRPCTimeout(10*time.Second), client.WithDialer(d))...)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.InvalidateCachedInfo(context.Background(), &peer.InvalidateCachedInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Code
	}
	for i := 0; i < 2; i++ { // interleaved: each connection keeps its own role
		if code := call(auth.NewMasterDialer(s, auth.PurposePeer, key, func(string) string { return "n1" })); code != common.ErrorCode_OK {
			t.Fatalf("master's call: %v", code)
		}
		if code := call(auth.NewDialer(s, auth.PurposePeer)); code != common.ErrorCode_PERMISSION_DENIED {
			t.Fatalf("member's call: %v, want PERMISSION_DENIED", code)
		}
	}
}
