package master

import (
	"context"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// FuzzMasterFrames sends authenticated frames to a real master on loopback: every
// method's request with every field filled, each with one length announcing 2^31-1
// (the outside report's ~40-byte BatchDeleteAck and ReportReplicas frames that killed
// the master), and whatever the fuzzer makes of them. After each the master must still
// answer a Stat, the process having allocated under 1 GiB for the frame.
//
//	go test ./master/ -run '^$' -fuzz '^FuzzMasterFrames$' -fuzztime 20s
func FuzzMasterFrames(f *testing.F) {
	s := authtest.Secrets(f)
	nop := zerolog.Nop()
	srv, err := NewServer(Options{Secrets: s, Logger: &nop, AllocWait: 10 * time.Millisecond,
		InvalidateTimeout: 50 * time.Millisecond, WriteQuiet: -1})
	if err != nil {
		f.Fatal(err)
	}
	if err := srv.Start("127.0.0.1:0"); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { srv.Stop() })
	addr := srv.Addr().String()
	c, err := masterservice.NewClient("fluxkv-master", append(auth.ClientOptions(s, auth.PurposeMaster),
		client.WithHostPorts(addr), client.WithRPCTimeout(10*time.Second))...)
	if err != nil {
		f.Fatal(err)
	}
	authtest.FuzzFrames(f, masterservice.NewServiceInfo(), addr, s, auth.PurposeMaster, func() error {
		_, err := c.Stat(context.Background(), &mp.StatRequest{})
		return err
	})
}
