// owner -> master: routing, allocation and membership. The master never touches payload bytes.
namespace go master
namespace py fluxkv._gen.master

include "common.thrift"

// NodeRef names the calling owner incarnation. A request from an unknown or tombed
// incarnation gets STALE_GENERATION: the owner re-registers.
struct NodeRef {
  1: string node_id,
  2: i64 generation,
  // token: a random number the owner process chose, sent with its Register and with every
  // later call. The generation is public (Stat, fences); the token is known only to the
  // owner and the master, which answers a call whose token differs from the one its
  // registration gave STALE_GENERATION: a member holding the cluster secret cannot act as
  // another owner (ack its holders, revoke its puts). 0: an owner of an earlier release,
  // whose calls are taken on its generation alone.
  3: i64 token,
}

struct KvSsdStorageInfo {
  1: bool enabled,
  2: i64 capacity_bytes,
  3: i64 used_bytes,
  // The largest value one of the owner's rings holds (a ring is one shard file: a
  // record lives in one). 0: not reported (an owner of an earlier release); the master
  // then bounds a value by capacity_bytes alone.
  4: i64 max_value_bytes,
}

// A range of the owner's segment that an external still views (a holder) or writes
// (an in-flight put) when the owner registers again after a master restart; the new
// master keeps it allocated until the owner acks pin_id through BatchDeleteAck.
struct PinnedRange {
  1: i64 pin_id,
  2: i64 offset,
  3: i64 len,
}

// transfer_reserve: the transfer_reserve bytes of the segment before the landing area
// (landing_reserve; at its end without one) are the owner's transfer area, outside the
// memory pool: the master allocates there the source ranges
// of puts it places on other owners (0: every put of this owner is placed on it).
struct RegisterRequest {
  1: NodeRef node,
  2: i64 segment_size,
  3: string data_addr,
  4: string peer_addr,
  5: KvSsdStorageInfo kv_ssd_storage,
  6: list<PinnedRange> pinned,
  7: i64 transfer_reserve,
  // The epoch of the master this owner registered with last (0: none). An owner coming
  // from another master reports its replica index right after registering; until its
  // last report batch (ReportReplicasRequest.last) the master places no other owner's
  // put on it, since it does not know yet which of its ranges hold replicas.
  8: i64 prev_epoch,
  // landing_reserve: the last landing_reserve bytes of the segment (after the transfer
  // area) are the owner's landing area, outside the memory pool and never lent to it: the
  // master lands there the gets of values held elsewhere that are not promoted, before it
  // would evict a value for their room (0: none).
  9: i64 landing_reserve,
  // The owner takes the holder of a refill from another owner's SSD recorded at
  // GetStart (GetStartResponse.holder_id) and acks it on every path. An owner of an
  // earlier release leaves it false: its remote SSD refills get their holder at GetDone.
  10: bool remote_refill_holders,
  // The owner's count of the registrations it began (0: an owner of an earlier release).
  // The master keeps it for the incarnation this call makes and answers it in every
  // HeartbeatResponse.registration_seq, so an owner whose Register's answer was lost
  // learns that the master took it (and dropped every replica of its earlier state).
  11: i64 registration_seq,
}

struct RegisterResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 master_epoch,
  4: i64 heartbeat_interval_ms,
  5: i64 node_ttl_ms,
  // The master's bounds the owner keeps its own inside (0: an older master, whose
  // defaults the owner assumes): an in-flight put or get is revoked and its range freed
  // inflight_ttl_ms after it started, the ranges kept for a BatchSsdReplicaPersist are
  // released when the call times out (persist_timeout_ms), and a PullPut or
  // BatchPullPut's pooled puts fail when the call times out (pull_timeout_ms).
  6: i64 inflight_ttl_ms,
  7: i64 persist_timeout_ms,
  8: i64 pull_timeout_ms,
  // The epoch of the last HA term that served before this master's (0: none, or not
  // HA). An owner whose prev_epoch is older missed that term (never registered with
  // it): its replica index and SSD ring may hold versions that term deleted or
  // overwrote, so it reports nothing and forgets them.
  9: i64 last_term_epoch,
}

// evictions_ack: the sequence number of the last eviction notice the owner applied
// (HeartbeatResponse.evicted and ssd_dropped) from the master of epoch evictions_epoch;
// the master resends the notices after it (an ack naming another epoch is ignored).
struct HeartbeatRequest {
  1: NodeRef node,
  2: KvSsdStorageInfo kv_ssd_storage,
  3: i64 evictions_ack,
  4: i64 evictions_epoch,
}

// evicted: memory replicas of this owner the master evicted (key, put_id); ssd_dropped:
// SSD entries of this owner the master stopped routing to (a failed read); together the
// notices up to evictions_seq. The owner drops them from its replica index (its SSD
// ring) and acks with the next heartbeat; until then the master counts the owner among
// the holders of those versions (a delete or overwrite waits for it to drop them).
// evictions_more: more notices wait: the owner heartbeats again at once.
// evicted_seqs: the sequence number of each notice of evicted (same length; an older
// master sends none). A notice does not apply to a record the owner learned from an
// answer whose notices_seq is at least the notice's (GetStartResponse, GetDoneResponse):
// the replica it names was evicted before the one recorded.
struct HeartbeatResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 master_epoch,
  4: list<common.KeyVersion> evicted,
  5: i64 evictions_seq,
  6: list<common.KeyVersion> ssd_dropped,
  7: bool evictions_more,
  8: list<i64> evicted_seqs,
  // The registration_seq of the Register that made the incarnation this heartbeat
  // reached (0: an earlier master). Above the one of the owner's last answered Register,
  // it names a Register whose answer was lost: the master took it and dropped the
  // owner's replicas, and so does the owner.
  9: i64 registration_seq,
  // This owner's memory pool as the master accounts it (the segment less the transfer
  // and landing areas; the master owns allocation), for the owner's metrics: a scrape
  // reads the last heartbeat's figures instead of calling the master. Unset from an
  // earlier master.
  10: optional common.CapacityStat memory_segment,
}

// acks (in PutStart and GetStart) carries holder releases not yet sent with
// BatchDeleteAck; the master applies them before planning, so space a requester just
// released serves its next allocation instead of an eviction.
struct PutStartRequest {
  1: NodeRef node,
  2: string key,
  3: i64 len,
  4: bool reject_if_exists,
  5: list<i64> acks,
  // Set for a KV page: the page before it in its chain ("" for a first page); unset for a
  // plain key. See external.thrift.
  6: optional string parent,
}

// source_offset is where the external writes (in the requester's segment); when the
// target is the requester itself, source_offset == target_offset and nothing moves.
// Otherwise source_offset lies in the requester's transfer area, and at PutDone the
// master has the target owner pull the value (PeerService.PullPut) before it publishes;
// if the target fails, the master places the put again (the bytes are still in the
// source) or answers UNAVAILABLE.
struct PutStartResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 put_id,
  4: string target_node_id,
  5: string target_data_addr,
  6: i64 target_offset,
  7: i64 source_offset,
  8: bool persist_to_ssd,
}

struct PutDoneRequest {
  1: NodeRef node,
  2: string key,
  3: i64 put_id,
}

struct PutDoneResponse {
  1: common.ErrorCode code,
  2: string message,
}

struct PutRevokeRequest {
  1: NodeRef node,
  2: string key,
  3: i64 put_id,
}

struct PutRevokeResponse {
  1: common.ErrorCode code,
  2: string message,
}

// exclude_nodes: nodes whose replicas this plan must not use (a pull from them just
// failed: unreachable, fenced or dead); the re-plan finds another replica or misses.
// holder_id: the id the master records a local hit's holder under (done), or the
// holder of a refill from the requester's own SSD (recorded at GetStart too), chosen by
// the requester: negative, never used twice by one owner incarnation. A requester whose
// call failed in transport still knows it and acks it (the master may have recorded the
// holder before the reply was lost); 0, or an id the requester already holds: the
// master picks one.
struct GetStartRequest {
  1: NodeRef node,
  2: string key,
  3: list<i64> acks,
  4: list<string> exclude_nodes,
  5: i64 holder_id,
}

// When done is true the get needed no transfer (a local memory replica was reused) and
// holder_id is already recorded: no GetDone follows. Otherwise the requester moves the
// bytes into target_offset as source says, then calls GetDone (or GetRevoke). A remote
// SSD source stages the value in its own memory (peer SsdStageRead): stage_offset and
// stage_len are unused (0).
struct GetStartResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 get_id,
  4: i64 put_id,
  5: i64 len,
  6: common.Source source,
  7: string source_node_id,
  8: string source_data_addr,
  9: string source_peer_addr,
  10: i64 source_offset,
  11: i64 target_offset,
  12: i64 stage_offset,
  13: i64 stage_len,
  14: bool done,
  15: i64 holder_id,
  // The source incarnation a pull must name in its fence (with source_node_id and
  // get_id as the transfer id): a source that restarted refuses it.
  16: i64 source_generation,
  // For a local hit (done): the last eviction notice the master numbered for the
  // requester (HeartbeatResponse.evicted_seqs); notices up to it do not apply to this
  // replica (they are older than it).
  17: i64 notices_seq,
}

struct GetDoneRequest {
  1: NodeRef node,
  2: string key,
  3: i64 get_id,
}

// notices_seq: with promoted, as GetStartResponse.notices_seq for the new replica.
struct GetDoneResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 holder_id,
  4: bool promoted,
  5: i64 notices_seq,
}

struct GetRevokeRequest {
  1: NodeRef node,
  2: string key,
  3: i64 get_id,
  4: bool drop_ssd_source,
  // Why the get was given up (logged by the master), e.g. "pull from n2: unreachable".
  5: string reason,
  // The pull from the plan's source failed for the source's part (unreachable, fenced,
  // too slow): the master prefers other replicas over that source for a while, or every
  // get would try a source whose data plane is cut first again.
  6: bool source_failed,
}

struct GetRevokeResponse {
  1: common.ErrorCode code,
  2: string message,
}

struct DeleteRequest {
  1: NodeRef node,
  2: string key,
}

struct DeleteResponse {
  1: common.ErrorCode code,
  2: string message,
  3: bool deleted,
  // The version the delete removed (0: the key had no route). The requesting owner
  // drops its cached info and SSD entries of every version up to it.
  4: i64 put_id,
}

struct ExistsRequest {
  1: NodeRef node,
  2: string key,
}

struct ExistsResponse {
  1: common.ErrorCode code,
  2: string message,
  3: bool exists,
}

// One SSD record an owner wrote for a BatchSsdReplicaPersist.
struct SsdReplicaCommitItem {
  1: string key,
  2: i64 put_id,
  3: i64 len,
  // The owner's number of the record (a rewrite of the same version is another record,
  // numbered higher): an eviction report names it, so a report of the record a rewrite
  // replaced leaves the rewrite's route. 0: not told (an owner of an earlier release).
  4: i64 record_seq,
  // The persist that wrote it (SsdReplicaPersistRequest.persist_id) when it pulled the
  // value from another owner: published only while that persist is still pending. A
  // persist that ended (its source owner was tombed; alive, that owner may have
  // registered again and given the range read to another value) is refused even where
  // this owner holds a memory copy of the key. 0: a persist of this owner's own memory,
  // or not told (an owner or master of an earlier release).
  5: i64 persist_id,
}

// The records of one BatchSsdReplicaPersist, committed together (at most
// peer.PERSIST_BATCH_ITEMS).
struct BatchSsdReplicaCommitRequest {
  1: NodeRef node,
  2: list<SsdReplicaCommitItem> items,
}

// OK whether each commit was published or ignored (stale put_id, replica gone, node tombed).
struct BatchSsdReplicaCommitResponse {
  1: common.ErrorCode code,
  2: string message,
  // Whether each item's SSD replica was published (same order). False for a late commit
  // (the key no longer has that put_id, the node lost the memory replica, or it was
  // tombed): the owner then drops the entry from its ring index.
  3: list<bool> published,
}

struct BatchSsdReplicaEvictRequest {
  1: NodeRef node,
  2: list<common.KeyVersion> entries,
  // record_seqs[i] is the number of entries[i]'s record (SsdReplicaCommitItem.record_seq;
  // 0 or missing: not told): the master clears a replica only when it names the record
  // the master last recorded, or either number is unknown.
  3: list<i64> record_seqs,
}

struct BatchSsdReplicaEvictResponse {
  1: common.ErrorCode code,
  2: string message,
}

// touched: keys this owner served from its hot set (held replicas, no master trip)
// since its last report: the master refreshes them in the owner's eviction order.
struct BatchDeleteAckRequest {
  1: NodeRef node,
  2: list<i64> holder_ids,
  3: list<string> touched,
}

struct BatchDeleteAckResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 unknown,
}

// One entry of an owner's replica index (ReportReplicas): key@put_id, len bytes, with a
// memory replica at offset of the owner's pool when memory is set, and/or a committed
// entry on its SSD ring when ssd is set.
struct ReplicaRecord {
  1: string key,
  2: i64 put_id,
  3: i64 len,
  4: bool memory,
  5: i64 offset,
  6: bool ssd,
  // A KV page's parent as its put named it ("" for a chain's first page), so the new
  // master ranks it as a page again; unset for a plain key, an SSD record, or a copy
  // the owner did not put itself (those are ranked as plain keys).
  7: optional string parent,
  // An SSD record's number (SsdReplicaCommitItem.record_seq); 0: not told.
  8: i64 record_seq,
}

// After registering with a master that does not know it (a restarted master), an owner
// reports its replica index in batches of at most REPORT_BATCH records; the master
// rebuilds routes, allocations and eviction order from them. rejected lists the indexes
// (into records) the master refused: a newer version is known, the key was deleted or
// evicted since the restart, the range overlaps one in use, or the master's rebuild
// window has closed. The owner drops rejected records.
struct ReportReplicasRequest {
  1: NodeRef node,
  2: list<ReplicaRecord> records,
  // The report's last batch (possibly empty): the owner's ranges are all known now.
  3: bool last,
}

struct ReportReplicasResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<i32> rejected,
}

const i32 REPORT_BATCH = 4096

// Batch forms of the per-key calls: an owner serves a client batch with one of them
// (split at BATCH items). results[i] answers items[i] (keys[i]) exactly as the per-key
// call would; one item's failure never fails the others. The response code is not OK
// only when no item was evaluated (an unknown or tombed node, a shut master, more than
// BATCH items).
const i32 BATCH = 4096

// holder_ids[i]: GetStartRequest.holder_id for keys[i] (absent or shorter: the master
// picks). held_bytes: the bytes of the requester's segment the client's batch holds
// already, answered without this call (hot-set hits, earlier calls of the batch): with
// the call's own ranges, a key that cannot fit the segment beside them fails NO_SPACE
// at once instead of waiting for room.
struct BatchGetStartRequest {
  1: NodeRef node,
  2: list<string> keys,
  3: list<i64> acks,
  4: list<i64> holder_ids,
  5: i64 held_bytes,
}

struct BatchGetStartResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<GetStartResponse> results,
}

// prefix: evaluate keys in order and stop after the first absent one (results is then
// shorter than keys).
struct BatchExistsRequest {
  1: NodeRef node,
  2: list<string> keys,
  3: bool prefix,
}

struct BatchExistsResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<ExistsResponse> results,
}

struct BatchDeleteRequest {
  1: NodeRef node,
  2: list<string> keys,
}

struct BatchDeleteResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<DeleteResponse> results,
}

struct PutStartItem {
  1: string key,
  2: i64 len,
  3: bool reject_if_exists,
  4: optional string parent, // see PutStartRequest
}

struct BatchPutStartRequest {
  1: NodeRef node,
  2: list<PutStartItem> items,
  3: list<i64> acks,
}

struct BatchPutStartResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<PutStartResponse> results,
}

struct PutDoneItem {
  1: string key,
  2: i64 put_id,
}

struct GetDoneItem {
  1: string key,
  2: i64 get_id,
}

// The GetDones of gets that completed while another GetDone of the same owner was out.
struct BatchGetDoneRequest {
  1: NodeRef node,
  2: list<GetDoneItem> items,
}

struct BatchGetDoneResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<GetDoneResponse> results,
}

// The master publishes BATCH_PUT_DONE_PARALLEL items of a BatchPutDone at once: each
// may wait for a pull by another owner (a put placed there). An owner allows its call
// one TransferTimeout per round of that many items.
const i32 BATCH_PUT_DONE_PARALLEL = 8

// The items' pulls (puts placed on other owners) run concurrently.
struct BatchPutDoneRequest {
  1: NodeRef node,
  2: list<PutDoneItem> items,
}

struct BatchPutDoneResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<PutDoneResponse> results,
}

// Namespaces (external.thrift NAMESPACE_SEPARATOR: a key's namespace is the text before
// its last '/'). The master indexes the keys of every namespace, so these calls cost
// O(keys of the namespace), never O(all keys). name: 1..MAX_KEY_BYTES bytes, not ending
// with '/'.
struct NamespaceRequest {
  1: NodeRef node,
  2: string name,
}

// NamespaceDelete deletes at most BATCH keys of the namespace under one hold of the
// master's lock, each exactly as Delete deletes a key (the same invalidations, SSD
// replicas and tombstones), and answers once the owners that may hold them confirmed
// (the requester among them: it drops its hot set, replica index and SSD entries of
// those keys before the answer, lost or not). deleted: the keys that existed. left: the
// keys of the namespace after this call; while some are left the owner calls again, at
// most left/BATCH+1 more times after its first call (keys put while the delete runs may
// survive it; a stream of puts never keeps it looping).
struct NamespaceDeleteResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 deleted,
  4: i64 left,
}

// keys: the namespace's routed keys; bytes: the length of each one's current version,
// summed (one copy however many replicas).
struct NamespaceStatResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 keys,
  4: i64 bytes,
}

struct StatRequest {
}

struct StatResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<common.MemberStat> members,
  4: i64 keys,
  // The masters: the one answering alone, or (HA) every candidate on etcd, the leader first.
  5: list<common.MasterInfo> masters,
  // Distinct values held in memory (keys with at least one memory replica), and the
  // bytes of memory replicas beyond each key's first (duplicates).
  6: i64 memory_values,
  7: i64 memory_duplicate_bytes,
}

service MasterService {
  RegisterResponse Register(1: RegisterRequest req),
  HeartbeatResponse Heartbeat(1: HeartbeatRequest req),
  PutStartResponse PutStart(1: PutStartRequest req),
  PutDoneResponse PutDone(1: PutDoneRequest req),
  PutRevokeResponse PutRevoke(1: PutRevokeRequest req),
  GetStartResponse GetStart(1: GetStartRequest req),
  GetDoneResponse GetDone(1: GetDoneRequest req),
  GetRevokeResponse GetRevoke(1: GetRevokeRequest req),
  DeleteResponse Delete(1: DeleteRequest req),
  ExistsResponse Exists(1: ExistsRequest req),
  BatchSsdReplicaCommitResponse BatchSsdReplicaCommit(1: BatchSsdReplicaCommitRequest req),
  BatchSsdReplicaEvictResponse BatchSsdReplicaEvict(1: BatchSsdReplicaEvictRequest req),
  BatchDeleteAckResponse BatchDeleteAck(1: BatchDeleteAckRequest req),
  StatResponse Stat(1: StatRequest req),
  ReportReplicasResponse ReportReplicas(1: ReportReplicasRequest req),
  BatchGetStartResponse BatchGetStart(1: BatchGetStartRequest req),
  BatchGetDoneResponse BatchGetDone(1: BatchGetDoneRequest req),
  BatchExistsResponse BatchExists(1: BatchExistsRequest req),
  BatchDeleteResponse BatchDelete(1: BatchDeleteRequest req),
  BatchPutStartResponse BatchPutStart(1: BatchPutStartRequest req),
  BatchPutDoneResponse BatchPutDone(1: BatchPutDoneRequest req),
  NamespaceDeleteResponse NamespaceDelete(1: NamespaceRequest req),
  NamespaceStatResponse NamespaceStat(1: NamespaceRequest req),
}
