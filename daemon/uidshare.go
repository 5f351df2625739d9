package daemon

import (
	"fmt"
	"math"
	"os"
	"sync"
	"time"

	"github.com/fluxkv/fluxkv/protocol/wire"
)

// Per-uid shares (Options.UIDShare, docs/local-clients.md): a client uid other than
// the owner's and root takes at most a share of each owner-wide resource its clients
// compete for, so that no admitted tenant can deny the others service: each Unix
// socket's connection slots (acceptor), the put areas' total under client isolation
// (putAreaBudget) and the RPC socket's frame memory (uidFrames). The owner's uid and
// root are not bounded: they can ptrace the owner. Off by default (a share of 1): an
// owner whose one tenant runs as a uid of its own (admitted by group or --allow-uid, the
// usual setup with client isolation) would give it half of everything with nobody else
// attached; an owner that admits several tenants sets the share.

// DefaultUIDShare is Options.UIDShare's default: no per-uid bound.
const DefaultUIDShare = 1.0

// ownerUID is the owner's uid (not bounded).
var ownerUID = uint32(os.Getuid())

// boundedUID reports whether uid's clients are held to their share.
func boundedUID(uid uint32) bool { return uid != 0 && uid != ownerUID }

// shareOf is what one bounded uid may take of total at share: total × share, rounded
// down to a multiple of unit, at least floor (and at most total); all of it for a share
// outside 0 < share < 1.
func shareOf(total int64, share float64, unit, floor int64) int64 {
	if share >= 1 || share <= 0 {
		return total
	}
	n := int64(math.Floor(float64(total)*share)) / unit * unit
	return min(max(n, floor), total)
}

// uidFrames gives each bounded uid with an RPC connection open a frame budget of its
// own, its share of the socket's (wire.FrameBudget); a frame reserves from it before
// the socket's. A uid's budget lives while it has connections: every reservation of a
// connection ends before the connection does.
type uidFrames struct {
	limit int64 // each uid's budget
	mu    sync.Mutex
	uids  map[uint32]*uidBudget
}

type uidBudget struct {
	b     *wire.FrameBudget
	conns int
}

func newUIDFrames(total int64, share float64) *uidFrames {
	if share >= 1 || share <= 0 {
		return nil
	}
	return &uidFrames{limit: shareOf(total, share, 1, 0), uids: make(map[uint32]*uidBudget)}
}

// open returns uid's budget for one more of its connections (nil: uid is not bounded,
// or no shares); close(uid) ends that use.
func (f *uidFrames) open(uid uint32) *wire.FrameBudget {
	if f == nil || !boundedUID(uid) {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	u := f.uids[uid]
	if u == nil {
		u = &uidBudget{b: wire.NewFrameBudget(f.limit)}
		f.uids[uid] = u
	}
	u.conns++
	return u.b
}

func (f *uidFrames) close(uid uint32) {
	if f == nil || !boundedUID(uid) {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if u := f.uids[uid]; u != nil {
		if u.conns--; u.conns == 0 {
			delete(f.uids, uid)
		}
	}
}

// reserveFrame reserves a frame of n bytes from the uid's budget (nil: none), then from
// the socket's, both waiting until deadline; held is what releaseFrame gives back.
func reserveFrame(uid uint32, own, all *wire.FrameBudget, n int, deadline time.Time) (held [2]int64, err error) {
	if own != nil {
		if held[0], err = own.Reserve(n, deadline); err != nil {
			return held, fmt.Errorf("uid %d's share of the frame memory (--uid-share): %w", uid, err)
		}
	}
	if held[1], err = all.Reserve(n, deadline); err != nil {
		own.Release(held[0])
		return [2]int64{}, err
	}
	return held, nil
}

func releaseFrame(own, all *wire.FrameBudget, held [2]int64) {
	own.Release(held[0])
	all.Release(held[1])
}
