package daemon

import (
	"fmt"

	"github.com/fluxkv/fluxkv/daemon/transfer"
)

// checkPutSource fences a data-plane pull of this owner's segment against what the
// master allocated: when id names a put of this owner's clients that the master placed
// on another owner (its bytes wait in this owner's transfer area, at the source range
// PutStart answered), the pull must lie in that range. A PullPut reaches the target
// only from the master (masteronly.go) and names that range; this keeps a wrong one
// (a master bug, or a member pulling with a put's fence) from being served other bytes
// of the segment under the put's name. Put, get and holder ids share the master's one
// counter, so a get's pull never matches a put here.
func (st *ownerState) checkPutSource(id, offset, length int64) error {
	for _, c := range st.sessions {
		p := c.puts[id]
		if p == nil || p.local {
			continue
		}
		if offset < p.offset || length > p.len || offset-p.offset > p.len-length {
			return fmt.Errorf("%w: pull of put %d: range [%d,+%d) is not inside its transfer area [%d,+%d)",
				transfer.ErrFenced, id, offset, length, p.offset, p.len)
		}
		return nil
	}
	return nil
}
