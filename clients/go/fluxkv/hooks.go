package fluxkv

import (
	"sync/atomic"

	"github.com/cloudwego/gopkg/protocol/thrift"
)

// hooks are the client's test instrumentation: nil functions in production.
type hooks struct {
	// onSend sees every request just before it is sent.
	onSend func(method string, args thrift.FastCodec)
	// dropReply, when it returns true for a call, loses its reply as a timed-out call
	// does: the owner acted on the request, the connection is closed with the answer
	// unread.
	dropReply func(method string) bool
	// onReply sees every reply decoded, before the client reads it (a test may change it:
	// a malformed answer).
	onReply func(method string, result thrift.FastCodec)
	// flushing runs as Flush begins, before it looks at the queue.
	flushing func()
}

func (h *hooks) sent(method string, args thrift.FastCodec) {
	if h.onSend != nil {
		h.onSend(method, args)
	}
}

// stats count what the retry rules and batch waves did, for tests and debugging.
type stats struct {
	retries       atomic.Int64 // calls sent again under their retry rule
	putEndRetries atomic.Int64 // PutEnd / BatchPutEnd sent again on the same session
	putRedos      atomic.Int64 // whole puts redone after their outcome became unknown
	waves         atomic.Int64 // BatchPut waves started
	maxWaveBytes  atomic.Int64 // the most bytes one wave held started and not ended
}

func (s *stats) noteWave(bytes int64) {
	s.waves.Add(1)
	for {
		cur := s.maxWaveBytes.Load()
		if bytes <= cur || s.maxWaveBytes.CompareAndSwap(cur, bytes) {
			return
		}
	}
}
