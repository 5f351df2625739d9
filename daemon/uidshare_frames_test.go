package daemon

import (
	"strings"
	"testing"
	"time"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

// TestUIDFramesShare: a bounded uid's frames take at most its share of the RPC
// socket's frame memory (the next one is refused naming the share while the socket's
// budget has room); another uid has a share of its own, root none, and a uid's budget
// goes with its last connection.
func TestUIDFramesShare(t *testing.T) {
	const frame = wire.MaxFrameBytes
	all := wire.NewFrameBudget(8 * int64(frame))
	f := newUIDFrames(all.Limit(), 0.5)
	own := f.open(65534)
	if own == nil || own.Limit() != 4*int64(frame) {
		t.Fatalf("uid 65534's budget %v, want %d bytes", own.Limit(), 4*frame)
	}
	var held [][2]int64
	for i := 0; i < 4; i++ {
		h, err := reserveFrame(65534, own, all, frame, time.Time{})
		if err != nil {
			t.Fatalf("frame %d within the share: %v", i, err)
		}
		held = append(held, h)
	}
	_, err := reserveFrame(65534, own, all, frame, time.Now().Add(20*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "uid 65534's share of the frame memory") {
		t.Fatalf("a frame past the share: %v, want the share's refusal", err)
	}
	if own.InUse() != 4*int64(frame) || all.InUse() != 4*int64(frame) {
		t.Fatalf("after the refusal: uid %d, socket %d bytes in use, want %d each", own.InUse(), all.InUse(), 4*frame)
	}
	if other := f.open(65533); other == own {
		t.Fatal("two uids share one budget")
	} else if _, err := reserveFrame(65533, other, all, frame, time.Time{}); err != nil {
		t.Fatalf("another uid's frame: %v", err)
	} else {
		f.close(65533)
	}
	if f.open(0) != nil {
		t.Fatal("root got a share")
	}
	h, err := reserveFrame(0, nil, all, 2*frame/2, time.Time{})
	if err != nil {
		t.Fatalf("root's frame: %v", err)
	}
	releaseFrame(nil, all, h)
	for _, h := range held {
		releaseFrame(own, all, h)
	}
	if own.InUse() != 0 || all.InUse() != int64(frame) { // 65533's frame is not given back here
		t.Fatalf("after the releases: uid %d, socket %d bytes in use", own.InUse(), all.InUse())
	}
	f.close(65534)
	if len(f.uids) != 0 {
		t.Fatalf("budgets of %d uids left after their last connections", len(f.uids))
	}
	if newUIDFrames(all.Limit(), 1) != nil {
		t.Fatal("a share of 1 made per-uid budgets")
	}
}
