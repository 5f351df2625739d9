// master -> owner and owner <-> owner control calls. Bulk bytes never travel here: they
// go over the data-plane connection pool, read from and written to the segment directly.
namespace go peer
namespace py fluxkv._gen.peer

include "common.thrift"

// One value of a BatchSsdReplicaPersist: persist key@put_id (len bytes) to the local SSD
// ring. Its memory replica is at offset of source_node_id's segment: this owner's own
// (source_node_id empty or this node), or another owner's (the SSD pool,
// docs/architecture.md §10), which this owner pulls over the data plane first (fence:
// source_generation and put_id, which the master retains the replica for until the call
// ends). generation and master_epoch are the same in every item of a batch.
struct SsdReplicaPersistRequest {
  1: string key,
  2: i64 put_id,
  3: i64 offset,
  4: i64 len,
  5: i64 generation,
  6: string source_node_id,
  7: i64 source_generation,
  8: string source_data_addr,
  9: i64 master_epoch,
  // Names this persist (the master's task): its commit (SsdReplicaCommitItem.persist_id)
  // is published only while it is the key version's pending persist. 0: not told (a
  // master of an earlier release).
  10: i64 persist_id,
}

struct SsdReplicaPersistResponse {
  1: common.ErrorCode code,
  2: string message,
}

// The master's SSD persists for one owner in one call (docs/architecture.md §4 put step 3): the
// owner writes the records (in runs of up to 1 MiB of one source, one write each: values
// of its own segment, or of another owner's, pulled in one pipelined pull per run;
// PERSIST_BATCH_IN_FLIGHT runs at a time), commits
// the written ones with one master BatchSsdReplicaCommit and answers every item in results
// (same order). A call of more than PERSIST_BATCH_ITEMS items is refused.
struct BatchSsdReplicaPersistRequest {
  1: list<SsdReplicaPersistRequest> items,
}

const i32 PERSIST_BATCH_ITEMS = 64
const i32 PERSIST_BATCH_IN_FLIGHT = 8

struct BatchSsdReplicaPersistResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<SsdReplicaPersistResponse> results,
}

// A remote SSD refill (docs/architecture.md §10: pull only). The requester asks the SSD owner to read
// key@put_id (len bytes) from its SSD in STAGE_CHUNK_BYTES chunks into a bounded staging
// area of its own memory (STAGE_READS_IN_FLIGHT reads in flight, STAGE_READY_CHUNKS read
// chunks waiting); meanwhile the requester pulls each chunk over the data plane (op
// PULL_STAGED: fence generation and get_id, offset = the chunk's offset in the value) into
// target_offset of its own segment, at most STAGE_PULLS_IN_FLIGHT at once. The call
// answers once every chunk was served and the value verified (its CRC is known only after
// the last chunk), or failed: an error code means the read failed and the requester
// revokes with drop_ssd_source. The SSD owner gives up after deadline_ms (the requester's
// deadline, proportional to len) or when a read chunk waits unpulled for too long.
// target_* name the requester for logs; stage_offset, stage_len and done_* are unused (0).
struct SsdStageReadRequest {
  1: string key,
  2: i64 put_id,
  3: i64 get_id,
  4: i64 stage_offset,
  5: i64 stage_len,
  6: string target_node_id,
  7: string target_data_addr,
  8: i64 target_offset,
  9: i64 len,
  10: i64 generation,
  11: i64 deadline_ms,
}

// The shape of a remote SSD refill (SsdStageRead).
const i64 STAGE_CHUNK_BYTES = 4194304
const i32 STAGE_READS_IN_FLIGHT = 4
const i32 STAGE_READY_CHUNKS = 8
const i32 STAGE_PULLS_IN_FLIGHT = 4

struct SsdStageReadResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 done_holder_id,
  4: bool done_promoted,
}

// A get batch's refills from one SSD owner in one call: each item is an SsdStageRead
// of its own (its session, chunks, pulls and answer), of at most STAGE_CHUNK_BYTES (one
// chunk). The SSD owner registers every item's session at once, so each item's pull
// finds it and waits for its chunk (hearing WAIT), reads at most STAGE_BATCH_IN_FLIGHT
// items at a time in list order (fewer of values larger than a KV page), and answers every item in results (same order) once
// each was served and verified or failed. Once a read item's chunk waited unpulled too
// long (the requester stopped pulling), every item not served yet is answered
// UNAVAILABLE at once. The whole call is bounded by the refill deadline of its items'
// bytes together, at most the longest deadline_ms of its items; a call of more than
// STAGE_BATCH_ITEMS items is refused.
struct BatchSsdStageReadRequest {
  1: list<SsdStageReadRequest> items,
}

const i32 STAGE_BATCH_IN_FLIGHT = 16
const i32 STAGE_BATCH_ITEMS = 256

struct BatchSsdStageReadResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<SsdStageReadResponse> results,
}

// Each entry tells the owner that every version of key up to put_id is dead: it drops
// its cached info and its SSD entries of those versions (live holders keep their bytes).
struct InvalidateCachedInfoRequest {
  1: list<common.KeyVersion> entries,
  2: i64 generation,
  3: i64 master_epoch,
}

struct InvalidateCachedInfoResponse {
  1: common.ErrorCode code,
  2: string message,
}

// Pooled placement (docs/architecture.md §10): the master asks the put's target owner to pull the
// value from the requester's transfer area into the target range it allocated in the
// target's segment, before it publishes the put. generation names the target
// incarnation the range was allocated in (another one refuses: STALE_GENERATION); the
// source fence is (source_node_id, source_generation, put_id). The owner answers once
// the bytes are in (OK) or the pull failed (UNAVAILABLE, with the reason); it never
// writes the range after answering.
struct PullPutRequest {
  1: string key,
  2: i64 put_id,
  3: i64 generation,
  4: i64 target_offset,
  5: i64 len,
  6: string source_node_id,
  7: i64 source_generation,
  8: string source_data_addr,
  9: i64 source_offset,
  10: i64 master_epoch,
}

struct PullPutResponse {
  1: common.ErrorCode code,
  2: string message,
}

// The PullPuts of one master BatchPutDone placed on this owner: the owner pulls the
// items of each source with one pipelined transfer (the values stream back to back on
// one data-plane connection instead of one call and one pull each) and answers
// results[i] for items[i] exactly as PullPut would, once every item's bytes are in or
// its pull failed. At most PULL_PUT_BATCH_ITEMS items (more: INVALID_ARGUMENT for the
// call); generation and master_epoch are the same in every item.
const i32 PULL_PUT_BATCH_ITEMS = 4096

struct BatchPullPutRequest {
  1: list<PullPutRequest> items,
}

struct BatchPullPutResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<PullPutResponse> results,
}

// The master needs space in this owner's segment and found none it could evict: the
// owner lets go of idle holdings of its hot set (least recently used first) until at
// least bytes are released or none is left, acks them to the master (BatchDeleteAck),
// then answers with the bytes released.
//
// keys (optional): the master's eviction order reached these keys and found them held.
// The owner lets go of their holdings that are idle (a holding an external still uses
// stays) and of nothing else; bytes is then their size, for an owner of an earlier
// release that does not know keys (it releases that many bytes, least recently used
// first, instead of all its idle holdings).
struct ReleaseHotSetRequest {
  1: i64 generation,
  2: i64 bytes,
  3: i64 master_epoch,
  4: optional list<string> keys,
}

struct ReleaseHotSetResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 released_bytes,
}

// master_epoch in the master's calls (BatchSsdReplicaPersist, InvalidateCachedInfo, PullPut,
// BatchPullPut, ReleaseHotSet) is the calling master's epoch: an owner registered with a later master
// refuses the call (UNAVAILABLE), so a deposed leader cannot change it (docs/architecture.md §12).

service PeerService {
  BatchSsdReplicaPersistResponse BatchSsdReplicaPersist(1: BatchSsdReplicaPersistRequest req),
  SsdStageReadResponse SsdStageRead(1: SsdStageReadRequest req),
  BatchSsdStageReadResponse BatchSsdStageRead(1: BatchSsdStageReadRequest req),
  InvalidateCachedInfoResponse InvalidateCachedInfo(1: InvalidateCachedInfoRequest req),
  PullPutResponse PullPut(1: PullPutRequest req),
  BatchPullPutResponse BatchPullPut(1: BatchPullPutRequest req),
  ReleaseHotSetResponse ReleaseHotSet(1: ReleaseHotSetRequest req),
}
