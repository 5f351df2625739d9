// master -> owner and owner <-> owner control calls. Bulk bytes never travel here: they
// go over the data-plane connection pool, read from and written to the segment directly.
namespace go peer
namespace py fluxkv._gen.peer

include "common.thrift"

// Persist len bytes at offset of the owner's segment (the memory replica of key@put_id)
// to the local SSD ring, then commit with master SsdReplicaCommit.
struct SsdReplicaPersistRequest {
  1: string key,
  2: i64 put_id,
  3: i64 offset,
  4: i64 len,
  5: i64 generation,
}

struct SsdReplicaPersistResponse {
  1: common.ErrorCode code,
  2: string message,
}

// A remote SSD refill (DESIGN §10: pull only). The requester asks the SSD owner to read
// key@put_id from its SSD into the staging range the master allocated in the SSD
// owner's segment; the SSD owner answers once the value is staged and verified (an
// error code: the read failed, the requester revokes with drop_ssd_source). The
// requester then pulls the staging range over the data plane (fence: the SSD owner's
// generation and get_id) into target_offset of its own segment and calls GetDone.
// target_* name the requester for logs; done_* are unused (0).
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
}

struct SsdStageReadResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 done_holder_id,
  4: bool done_promoted,
}

// Each entry tells the owner that every version of key up to put_id is dead: it drops
// its cached info and its SSD entries of those versions (live holders keep their bytes).
struct InvalidateCachedInfoRequest {
  1: list<common.KeyVersion> entries,
  2: i64 generation,
}

struct InvalidateCachedInfoResponse {
  1: common.ErrorCode code,
  2: string message,
}

// Pooled placement (DESIGN §10): the master asks the put's target owner to pull the
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
}

struct PullPutResponse {
  1: common.ErrorCode code,
  2: string message,
}

service PeerService {
  SsdReplicaPersistResponse SsdReplicaPersist(1: SsdReplicaPersistRequest req),
  SsdStageReadResponse SsdStageRead(1: SsdStageReadRequest req),
  InvalidateCachedInfoResponse InvalidateCachedInfo(1: InvalidateCachedInfoRequest req),
  PullPutResponse PullPut(1: PullPutRequest req),
}
