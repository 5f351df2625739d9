package daemon

import (
	"fmt"

	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
	"github.com/fluxkv/fluxkv/shm"
)

// putAreaBudget shares Options.PutAreaTotal among the put areas of live sessions under
// client isolation (docs/architecture.md §11). Not safe for concurrent use: Owner.mu protects it.
type putAreaBudget struct {
	per   int64 // Options.PutArea: what a session gets while the total allows
	total int64 // Options.PutAreaTotal
	used  int64 // bytes of the live sessions' areas
}

// reserve takes the next session's area size: per, or what is left of the total when
// that is less, but never below min(per, minPutArea); below that the attach is refused
// with NO_SPACE.
func (b *putAreaBudget) reserve() (int64, error) {
	size := min(b.per, (b.total-b.used)/pageSize*pageSize)
	if floor := min(b.per, minPutArea); size < floor {
		return 0, errCode(common.ErrorCode_NO_SPACE,
			"the put areas of the attached sessions use %d of the %d bytes --put-area-total allows (a session needs at least %d): detach clients or raise --put-area-total",
			b.used, b.total, floor)
	}
	b.used += size
	return size, nil
}

// release gives a closed area's bytes back.
func (b *putAreaBudget) release(size int64) {
	if size > b.used {
		panic(fmt.Sprintf("BUG: put area budget: releasing %d bytes, %d in use", size, b.used))
	}
	b.used -= size
}

// newPutAreaLocked creates the put area of size bytes for client id (nil for size 0:
// no isolation); a failure gives the size back to the budget.
func (o *Owner) newPutAreaLocked(st *ownerState, clientID, size int64) (*shm.Segment, error) {
	if size == 0 {
		return nil, nil
	}
	area, err := shm.CreatePutArea(fmt.Sprintf("fluxkv-%s-put-%d", o.opts.NodeID, clientID), size)
	if err != nil {
		st.areas.release(size)
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
		st.areas.release(area.Size())
	}
	o.unlock()
	if area != nil {
		if err := area.Close(); err != nil {
			o.log.Warn().Err(err).Int64("client", c.id).Msg("close put area")
		}
	}
}
