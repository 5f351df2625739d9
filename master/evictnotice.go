package master

import "github.com/fluxkv/fluxkv/protocol/kitex_gen/common"

// evictNoticeBatch caps the eviction notices one heartbeat reply carries.
const evictNoticeBatch = 4096

// evictNotice tells an owner that the master evicted its memory replica of key@putID,
// or (ssd) stopped routing to its SSD entry of it.
type evictNotice struct {
	seq   int64
	key   string
	putID int64
	ssd   bool
}

// evictOutbox holds the eviction notices an owner has not acknowledged yet (docs/architecture.md
// §5, owners know their replicas). Evictions are silent on the hot path: the master frees
// the range at once and queues a notice; the owner learns it from the next heartbeat
// reply, drops the record from its replica index and acks the sequence number with the
// heartbeat after. Until then the owner may still report the version after a master
// restart, so it counts as a holder of it: a delete or overwrite of that key waits for
// this owner to drop it (Invalidation.Sync).
type evictOutbox struct {
	notices []evictNotice // ascending seq
	lastSeq int64
	byKey   map[string]int // unacked notices per key
}

// push queues the eviction of key@putID (ssd: of its SSD entry).
func (b *evictOutbox) push(key string, putID int64, ssd bool) {
	b.lastSeq++
	b.notices = append(b.notices, evictNotice{seq: b.lastSeq, key: key, putID: putID, ssd: ssd})
	if b.byKey == nil {
		b.byKey = make(map[string]int)
	}
	b.byKey[key]++
}

// ack drops the notices up to seq, which the owner has applied.
func (b *evictOutbox) ack(seq int64) {
	i := 0
	for i < len(b.notices) && b.notices[i].seq <= seq {
		k := b.notices[i].key
		if b.byKey[k]--; b.byKey[k] <= 0 {
			delete(b.byKey, k)
		}
		i++
	}
	if i == len(b.notices) {
		b.notices = nil // let the backing array go
		return
	}
	b.notices = b.notices[i:]
}

// pending returns up to evictNoticeBatch unacked notices (memory and SSD), the seq of
// the last one, and whether more wait after them.
func (b *evictOutbox) pending() Notices {
	n := min(len(b.notices), evictNoticeBatch)
	if n == 0 {
		return Notices{Seq: b.lastSeq}
	}
	var ns Notices
	for _, e := range b.notices[:n] {
		kv := &common.KeyVersion{Key: e.key, PutId: e.putID}
		if e.ssd {
			ns.SSDDropped = append(ns.SSDDropped, kv)
		} else {
			ns.Evicted = append(ns.Evicted, kv)
			ns.EvictedSeqs = append(ns.EvictedSeqs, e.seq)
		}
	}
	ns.Seq, ns.More = b.notices[n-1].seq, n < len(b.notices)
	return ns
}

// has reports whether an unacked notice names key.
func (b *evictOutbox) has(key string) bool { return b.byKey[key] > 0 }

// names reports whether an unacked notice (of the memory replica, or with ssd of the SSD
// entry) names key at putID or above. The owner applies a notice to whatever record of
// key it holds up to that put id, so a replica of the version placed on it again (a
// promotion, a write-back) before the ack could be the one the notice drops.
func (b *evictOutbox) names(key string, putID int64, ssd bool) bool {
	if b.byKey[key] == 0 {
		return false
	}
	for _, e := range b.notices {
		if e.key == key && e.ssd == ssd && e.putID >= putID {
			return true
		}
	}
	return false
}

// len is the number of unacked notices.
func (b *evictOutbox) len() int { return len(b.notices) }
