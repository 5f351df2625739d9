package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/cloudwego/kitex/client/callopt"

	mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/master/masterservice"
)

// putDoneDeadline records how long the context of each PutDone had left.
type putDoneDeadline struct {
	masterservice.Client
	left chan time.Duration
}

func (p *putDoneDeadline) PutDone(ctx context.Context, req *mp.PutDoneRequest, o ...callopt.Option) (*mp.PutDoneResponse, error) {
	left := time.Duration(-1)
	if d, ok := ctx.Deadline(); ok {
		left = time.Until(d)
	}
	p.left <- left
	return p.Client.PutDone(ctx, req, o...)
}

// TestLocalPutDoneAllowsForThePull: the in-process master ignores call options, and its
// PutDone's waits end with the caller's context: a PutDone of a put placed on another
// owner (pulled by it during the call) must get a context that allows for the pull,
// MasterTimeout plus TransferTimeout, as it did before master calls were bounded by
// their connections.
func TestLocalPutDoneAllowsForThePull(t *testing.T) {
	t.Parallel()
	m := ackMaster(t, "127.0.0.1:0")
	o, _ := ackOwner(t, m, nil)
	rec := &putDoneDeadline{Client: m.LocalClient(), left: make(chan time.Duration, 1)}
	useMasterClient(o, rec)
	_, _ = o.askPutDone([]*pendingPut{{key: "elsewhere", putID: 1 << 40, local: false}}, []int{0})
	want := o.opts.MasterTimeout + o.opts.TransferTimeout
	if left := <-rec.left; left < want-time.Second {
		t.Fatalf("the in-process PutDone of a put placed on another owner had %v left, want about %v", left, want)
	}
}
