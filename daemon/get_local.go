package daemon

import mp "github.com/fluxkv/fluxkv/protocol/kitex_gen/master"

// localHit is a get the master completed in GetStart: the key's memory replica is in
// this segment and the holder refers to it directly (no copy, no transfer), so the
// holding may stay cached after release at no memory cost.
func localHit(key string, plan *mp.GetStartResponse) *holding {
	return &holding{key: key, putID: plan.PutId, len: plan.Len, source: plan.Source,
		offset: plan.TargetOffset, masterID: plan.HolderId, replica: true, noticesSeq: plan.NoticesSeq}
}
