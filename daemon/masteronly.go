package daemon

import (
	"context"

	"github.com/fluxkv/fluxkv/protocol/auth"
	"github.com/fluxkv/fluxkv/protocol/kitex_gen/common"
)

// Master-only peer calls (docs/architecture.md §11). The cluster secret makes a caller a member;
// PullPut, BatchPullPut, BatchSsdReplicaPersist, InvalidateCachedInfo and ReleaseHotSet write this
// owner's segment or SSD, or drop what it knows, on the master's word, so they are
// answered only on a connection whose handshake proved a master key this owner
// accepts (Options.MasterKeys), for this node id. SsdStageRead stays open to every
// member: owners ask it of each other.

// masterOnly refuses method unless the calling connection proved a master; an
// insecure cluster (no secrets, no handshake) has no roles and refuses nothing.
func (h *peerHandler) masterOnly(ctx context.Context, method string) error {
	if h.o.opts.Secrets == nil || auth.ConnRole(ctx) == auth.RoleMaster {
		return nil
	}
	h.refused.Warn().Str("method", method).Msg("master-only peer call from a connection that did not prove a master; refused")
	if h.o.opts.MasterKeys == nil {
		return errCode(common.ErrorCode_PERMISSION_DENIED, "%s is a master-only call and owner %q accepts no master key: give it the master's public key "+
			"(--master-pubkey-file)", method, h.o.opts.NodeID)
	}
	return errCode(common.ErrorCode_PERMISSION_DENIED, "%s is a master-only call: this connection did not prove a master key owner %q accepts "+
		"(the master signs with --master-key-file; owners accept --master-pubkey-file)", method, h.o.opts.NodeID)
}
