package daemon

import (
	"testing"

	"github.com/cloudwego/gopkg/protocol/thrift"
	"github.com/rs/zerolog"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/external/externalservice"
)

// FuzzExternalDispatch feeds arbitrary frames to the external server's decoder and
// dispatcher: it must answer or close, never panic. Requests without a valid session
// are rejected before any master call, so no master is needed.
func FuzzExternalDispatch(f *testing.F) {
	for _, m := range []string{"Get", "PutStart", "Release", "BatchGet", "Stat"} {
		b, _ := thrift.MarshalFastMsg(m, thrift.CALL, 1, &external.ExternalServiceGetArgs{Req: &external.GetRequest{Key: "k"}})
		f.Add(b)
	}
	f.Add([]byte{0x80, 0x01, 0x00, 0x01, 0, 0, 0, 3, 'G', 'e', 't', 0, 0, 0, 1, 0x0c, 0x00, 0x01})
	o := &Owner{sessions: map[int64]*session{}, cache: map[string]*holding{}, generation: 7}
	s := &framedServer{svc: externalservice.NewServiceInfo(), handler: &externalHandler{o: o}, log: zerolog.Nop()}
	f.Fuzz(func(t *testing.T, frame []byte) {
		method, typ, seq, off, err := thrift.Binary.ReadMessageBegin(frame)
		if err != nil {
			return // the server closes such a connection
		}
		reply, _ := s.dispatch(method, typ, seq, frame[off:])
		if len(reply) == 0 {
			t.Fatal("no reply")
		}
	})
}
