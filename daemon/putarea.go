package daemon

import (
	"fmt"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/shm"
)

// putAreaBudget shares Options.PutAreaTotal among the put areas of live sessions under
// client isolation (docs/architecture.md §11); a bounded uid's sessions take at most
// its share of the total (uidLimit, uidshare.go). Not safe for concurrent use: Owner.mu
// protects it.
type putAreaBudget struct {
	per      int64 // Options.PutArea: what a session gets while the total allows
	total    int64 // Options.PutAreaTotal
	uidLimit int64 // what one bounded uid's areas may take (total: no bound)
	share    float64
	used     int64            // bytes of the live sessions' areas
	byUID    map[uint32]int64 // bytes of each bounded uid's areas
}

func newPutAreaBudget(per, total int64, share float64) putAreaBudget {
	return putAreaBudget{per: per, total: total, share: share, uidLimit: shareOf(total, share, pageSize, minPutArea),
		byUID: make(map[uint32]int64)}
}

// reserve takes the size of uid's next session's area: per, or what is left of the
// total (or of the uid's share) when that is less, but never below min(per,
// minPutArea); below that the attach is refused with NO_SPACE.
func (b *putAreaBudget) reserve(uid uint32) (int64, error) {
	size := min(b.per, (b.total-b.used)/pageSize*pageSize)
	floor := min(b.per, minPutArea)
	bounded := boundedUID(uid) && b.uidLimit < b.total
	if bounded {
		if own := min(b.per, (b.uidLimit-b.byUID[uid])/pageSize*pageSize); own < size {
			if size = own; size < floor {
				return 0, errCode(common.ErrorCode_NO_SPACE,
					"the put areas of uid %d's sessions use %d of the %d bytes its share allows (--uid-share %g of --put-area-total %d; a session needs at least %d): detach some of them",
					uid, b.byUID[uid], b.uidLimit, b.share, b.total, floor)
			}
		}
	}
	if size < floor {
		return 0, errCode(common.ErrorCode_NO_SPACE,
			"the put areas of the attached sessions use %d of the %d bytes --put-area-total allows (a session needs at least %d): detach clients or raise --put-area-total",
			b.used, b.total, floor)
	}
	b.used += size
	if bounded {
		b.byUID[uid] += size
	}
	return size, nil
}

// release gives the bytes of a closed area of uid's back.
func (b *putAreaBudget) release(uid uint32, size int64) {
	if size > b.used {
		panic(fmt.Sprintf("BUG: put area budget: releasing %d bytes, %d in use", size, b.used))
	}
	b.used -= size
	if boundedUID(uid) && b.uidLimit < b.total {
		if b.byUID[uid] -= size; b.byUID[uid] <= 0 {
			if b.byUID[uid] < 0 {
				panic(fmt.Sprintf("BUG: put area budget: uid %d released %d bytes more than it took", uid, -b.byUID[uid]))
			}
			delete(b.byUID, uid)
		}
	}
}

// newPutAreaLocked creates the put area of size bytes for client id of uid (nil for
// size 0: no isolation); a failure gives the size back to the budget.
func (o *Owner) newPutAreaLocked(st *ownerState, clientID int64, uid uint32, size int64) (*shm.Segment, error) {
	if size == 0 {
		return nil, nil
	}
	area, err := shm.CreatePutArea(shm.MemfdName("fluxkv-", o.opts.NodeID, fmt.Sprintf("-put-%d", clientID)), size)
	if err != nil {
		st.areas.release(uid, size)
		return nil, errCode(common.ErrorCode_NO_SPACE, "create the session's put area of %d bytes: %v", size, err)
	}
	return area, nil
}

// closePutArea unmaps and closes the area of an ended session (no copy runs: endSession
// waited for them) and returns its bytes to the budget.
func (o *Owner) closePutArea(c *session) {
	st := o.lock()
	area := c.area
	c.area = nil
	if area != nil {
		st.areas.release(c.cred.Uid, area.Size())
	}
	o.unlock()
	if area != nil {
		if err := area.Close(); err != nil {
			o.log.Warn().Err(err).Int64("client", c.id).Msg("close put area")
		}
	}
}
