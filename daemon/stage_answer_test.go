package daemon

import (
	"context"
	"fmt"
	"testing"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/peer"
	"github.com/fluxkv/fluxkv/protocol/wire"
	"github.com/fluxkv/fluxkv/ssd"
)

// TestStageAnswerCodes: a remote refill answers KEY_NOT_FOUND (the requester drops the
// SSD replica) only for a failed read; a refill that ended otherwise, a record moved by
// a refresh of its version among them, answers UNAVAILABLE and keeps the replica.
func TestStageAnswerCodes(t *testing.T) {
	req := &peer.SsdStageReadRequest{Key: "k", PutId: 3}
	for _, tc := range []struct {
		err  error
		want common.ErrorCode
	}{
		{fmt.Errorf("ssd load: %w", ssd.ErrNotFound), common.ErrorCode_KEY_NOT_FOUND},
		{fmt.Errorf("ssd load: %w", ssd.ErrCorrupt), common.ErrorCode_KEY_NOT_FOUND},
		{fmt.Errorf("ssd load: read at 0: input/output error"), common.ErrorCode_KEY_NOT_FOUND},
		{fmt.Errorf("ssd load: overwritten while waiting for a buffer: %w", ssd.ErrMoved), common.ErrorCode_UNAVAILABLE},
		{ssd.ErrClosed, common.ErrorCode_UNAVAILABLE},
		{fmt.Errorf("%w: unpulled", errStageEnded), common.ErrorCode_UNAVAILABLE},
		{context.DeadlineExceeded, common.ErrorCode_UNAVAILABLE},
	} {
		if got := wire.CodeOf(stageAnswer(context.Background(), req, "n1", tc.err)); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
	if err := stageAnswer(context.Background(), req, "n1", nil); err != nil {
		t.Errorf("a served refill: %v", err)
	}
}
