package daemon

import (
	"testing"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/auth/authtest"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external/externalservice"
)

// FuzzExternalDispatch feeds arbitrary frames to the external server's decoder and
// dispatcher: it must answer or close, never panic. Requests without a valid session
// are rejected before any master call, so no master is needed. Fuzz with FLUXKV_BIN
// set (to anything) so that each worker's TestMain skips building fluxkv:
//
//	FLUXKV_BIN=/nonexistent go test ./daemon -run '^$' -fuzz FuzzExternalDispatch -fuzztime 20s
func FuzzExternalDispatch(f *testing.F) {
	for _, m := range []string{"Get", "PutStart", "Release", "BatchGet", "Stat"} {
		b, _ := thrift.MarshalFastMsg(m, thrift.CALL, 1, &external.ExternalServiceGetArgs{Req: &external.GetRequest{Key: "k"}})
		f.Add(b)
	}
	f.Add([]byte{0x80, 0x01, 0x00, 0x01, 0, 0, 0, 3, 'G', 'e', 't', 0, 0, 0, 1, 0x0c, 0x00, 0x01})
	// Hostile sizes: a list announcing 2^31-1 ids, and a ONEWAY call.
	f.Add(append(thrift.Binary.AppendMessageBegin(nil, "Release", thrift.CALL, 1),
		byte(thrift.STRUCT), 0, 1, byte(thrift.LIST), 0, 2, byte(thrift.I64), 0x7f, 0xff, 0xff, 0xff, 0, 0))
	b, _ := thrift.MarshalFastMsg("Get", thrift.ONEWAY, 1, &external.ExternalServiceGetArgs{Req: &external.GetRequest{Key: "k"}})
	f.Add(b)
	// Every method's request with every field filled, and each with one length
	// announcing 2^31-1.
	for _, m := range authtest.Requests(externalservice.NewServiceInfo()) {
		f.Add(m)
	}
	for _, m := range authtest.Bombs(externalservice.NewServiceInfo()) {
		f.Add(m)
	}
	o := &Owner{generation: 7}
	o.mu.st = newOwnerState(stateOptions{generation: 7})
	s := &framedServer{svc: externalservice.NewServiceInfo(), handler: &externalHandler{o: o}, log: zerolog.Nop()}
	f.Fuzz(func(t *testing.T, frame []byte) {
		method, typ, seq, off, err := thrift.Binary.ReadMessageBegin(frame)
		if err != nil {
			return // the server closes such a connection
		}
		reply, _ := s.dispatch(&connState{}, method, typ, seq, frame[off:])
		if len(reply) == 0 {
			t.Fatal("no reply")
		}
	})
}
