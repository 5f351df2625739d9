// external <-> owner: the API an inference process speaks over the owner's Unix sockets.
//
// Attach first: connect to DIR/fluxkv.sock, send one frame holding an AttachHello
// (4-byte big-endian length + TBinaryProtocol struct), receive one frame holding an
// AttachReply together with the segment's memfd as SCM_RIGHTS ancillary data. Keep that
// connection open: its close releases everything the client holds. Then speak framed
// binary thrift (TFramedTransport + TBinaryProtocol) to ExternalService on the socket
// named in AttachReply.rpc_socket (DIR/fluxkv.sock.rpc).
namespace go external
namespace py fluxkv._gen.external

include "common.thrift"

// 2: AttachReply.isolated / put_area_size, a put area fd under isolation, AreaCopy in
// PutEnd / BatchPutEnd and PutWrite, ErrorCode PERMISSION_DENIED.
const i32 PROTOCOL_VERSION = 2

// Wire limits: the owner enforces every one of them itself (a client-side check is a
// convenience, never the guard); clients use them to size their own buffers and waves.
// The longest key.
const i32 MAX_KEY_BYTES = 4096
// The longest frame (4-byte length + message) either side sends or accepts on the
// RPC socket: a batch of MAX_BATCH keys of MAX_KEY_BYTES fits. Larger: the
// connection is closed.
const i32 MAX_FRAME_BYTES = 33554432
// The largest attach hello or reply frame.
const i32 MAX_ATTACH_FRAME_BYTES = 65536
// The longest client name in AttachHello.
const i32 MAX_HELLO_NAME_BYTES = 256
// The most items in one batch call, and the most holder ids in one Release.
const i32 MAX_BATCH = 4096
// The most holder ids piggybacked in Session.releases on any one call.
const i32 MAX_RELEASES_PER_CALL = 4096
// The longest pin of a prefix lookup (BatchExistsRequest.pin_ms).
const i32 MAX_PIN_MS = 5000

// Namespaces (DeleteNamespace, NamespaceStat). A key's namespace is the text before its
// last NAMESPACE_SEPARATOR: "kv1/m/tp0of1/ab12" is in namespace "kv1/m/tp0of1". A key
// without one (or whose only one is its first byte) is in no namespace. Namespaces are
// not nested: "kv1/m/tp0of1/x" is in "kv1/m/tp0of1", not in "kv1/m". A namespace named
// in a call is 1..MAX_KEY_BYTES bytes ("a//x" is in namespace "a/").
const string NAMESPACE_SEPARATOR = "/"

// Retry rules. A call "fails in transport" when no answer came back: the connection
// broke, was refused, or the call timed out. Whether it may be sent again depends on the
// call (each one's comment in ExternalService says which rule it follows):
//
// - RETRY SAFE (Get, BatchGet, Exists, BatchExists, Stat, Delete, BatchDelete, PutAbort,
//   BatchPutAbort, DeleteNamespace, NamespaceStat): send again after a transport failure, on a fresh RPC connection,
//   or after STALE_GENERATION once re-attached (the owner restarted).
// - RETRY ON THE SAME SESSION (PutWrite: simply sent again while the put is pending; a
//   PutWrite naming only value ranges the put's PutWrites copied copies nothing, so
//   neither the repeat nor the first arriving late copies bytes the client put in the
//   area since).
// - RETRY ON THE SAME SESSION (PutEnd, BatchPutEnd): the owner remembers the outcome of
//   each session's last PUT_END_MEMORY ended puts and answers a repeated PutEnd with
//   the same code. After a lost reply the client sends PutEnd again on the same session
//   (same attach connection, any RPC connection), never the whole put. If the session
//   itself is gone (STALE_GENERATION, or the owner closed the attach connection), or a
//   repeated PutEnd is answered INVALID_ARGUMENT (the put is no longer remembered), or
//   the clients' PutEnd tries (3) all went unanswered on a live session, the put's
//   outcome is unknown: without reject_if_exists the client redoes the whole put on the
//   current session (the same bytes: harmless; a put of the tries that never arrived
//   keeps its range until the owner's in-flight TTL frees it); with reject_if_exists it
//   reports UNAVAILABLE saying the outcome is unknown, never ALREADY_EXISTS for its own
//   put.
// - RETRY WHEN UNSENT (PutStart, BatchPutStart): sent again only when the request never
//   left (the connection could not be opened) or the session is gone (its end revoked
//   any put the lost request started). A lost reply on a live session: the client
//   reports UNAVAILABLE.
//
// A reply the client never read (it closed the connection first: a call timed out)
// hands out nothing: the owner releases the holders of a lost Get or BatchGet reply and
// aborts the puts a lost PutStart or BatchPutStart reply started, once it sees the loss
// (its write of the reply failed, or the connection was closed with the reply unread).
// A client sends one call at a time on a connection and closes a connection whose call
// failed; a reply counts as read once its connection carries the next request.
// - NEVER RETRIED (Release): the ids of a failed Release stay queued and ride on later
//   calls, at most MAX_RELEASES_PER_CALL per call. Releasing twice answers
//   INVALID_ARGUMENT for that id and does no harm.

// How many ended puts (PutEnd or BatchPutEnd items) per session the owner remembers
// the outcome of, to answer a repeated PutEnd: two full batches (MAX_BATCH), so a lost
// BatchPutEnd reply is answered again for every item of its wave, with room for the
// session's other calls meanwhile (it was 64: the older items of a larger wave were
// redone).
const i32 PUT_END_MEMORY = 8192
// Batch puts go in waves (BatchPutStart, copy, BatchPutEnd) that hold at most
// segment_size / PUT_WAVE_SEGMENT_DIVISOR bytes started and not yet ended, and at most
// MAX_BATCH items, so a batch never waits for space only it holds. An item larger than
// the segment fails the whole batch with INVALID_ARGUMENT before anything starts; an
// item larger than the wave bound goes alone in its wave.
const i32 PUT_WAVE_SEGMENT_DIVISOR = 2

struct AttachHello {
  1: i32 protocol_version,
  2: string name,
  3: i32 pid,
}

struct AttachReply {
  1: common.ErrorCode code,
  2: string message,
  3: i32 protocol_version,
  4: i64 client_id,
  5: i64 session_token,
  6: i64 owner_generation,
  7: i64 segment_size,
  8: string rpc_socket,
  9: string node_id,
  // Client isolation (docs/architecture.md §11). true: the segment is sealed with F_SEAL_FUTURE_WRITE,
  // so the client maps it read-only and can never write it; the reply carries a second
  // fd, this session's put area (put_area_size bytes, sealed against shrink and grow),
  // which the client maps read-write. A put then writes its value into the put area and
  // names the ranges to copy (AreaCopy) in PutWrite / PutEnd; the owner copies them into
  // the put's range. false: no put area; the client writes its values straight into the
  // segment at PutStartResponse.offset.
  10: bool isolated,
  11: i64 put_area_size,
}

// One copy the owner makes, under isolation, from the session's put area into a started
// put: len bytes at area_offset of the put area land at value_offset of the value. Both
// ranges must lie inside the put area and the value, and the copies of one call into one
// put add up to at most the smaller of the value and the put area (they do not overlap).
// One call carries at most MAX_BATCH copies (over all its items).
struct AreaCopy {
  1: i64 value_offset,
  2: i64 area_offset,
  3: i64 len,
}

// Session names the caller in every RPC. releases piggybacks holder releases
// (processed before the call itself: they may free the room a put needs; a client that
// has releases in flight on another connection waits for them before a call that
// depends on them) so a get + release loop costs one round trip.
struct Session {
  1: i64 client_id,
  2: i64 session_token,
  3: i64 owner_generation,
  4: list<i64> releases,
}

struct PutOptions {
  1: bool reject_if_exists,
}

struct PutStartRequest {
  1: Session session,
  2: string key,
  3: i64 len,
  4: PutOptions opts,
  // Set for a KV page: the page before it in its prefix chain, "" for a chain's first
  // page; eviction keeps a chain's pages while their prefix is cached. Unset: a plain
  // key. A set parent other than "" is a valid key, not the key itself.
  5: optional string parent,
}

// The external copies len bytes into its read-write mapping at offset, then calls PutEnd.
struct PutStartResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 put_id,
  4: i64 offset,
}

struct PutEndRequest {
  1: Session session,
  2: string key,
  3: i64 put_id,
  // Under isolation: copied from the put area before the put is published (a value
  // that fits the area needs no PutWrite). Without isolation: must be empty.
  4: list<AreaCopy> copies,
}

// Under isolation, copies part of a value from the put area into a started put, so a
// value larger than the area is streamed through it: fill the area, PutWrite, repeat,
// the last part in PutEnd. The client must not change the named area bytes until answered.
// Each value range is named once per put: a PutWrite whose ranges a PutWrite of the put
// copied is taken for its repeat (OK, nothing copied); one naming a copied range in part,
// or mixing copied and new ranges, or leaving the copied ranges in more than 64 separate
// pieces (parts copied out of order), is INVALID_ARGUMENT.
struct PutWriteRequest {
  1: Session session,
  2: string key,
  3: i64 put_id,
  4: list<AreaCopy> copies,
}

struct PutWriteResponse {
  1: common.ErrorCode code,
  2: string message,
}

struct PutEndResponse {
  1: common.ErrorCode code,
  2: string message,
}

struct PutAbortRequest {
  1: Session session,
  2: string key,
  3: i64 put_id,
}

struct PutAbortResponse {
  1: common.ErrorCode code,
  2: string message,
}

struct GetRequest {
  1: Session session,
  2: string key,
}

// A holder: len bytes at offset of the segment, valid until Release(holder_id).
struct GetResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 holder_id,
  4: i64 offset,
  5: i64 len,
  6: common.Source source,
  7: i64 put_id,
  // The bytes crossed the network: pulled from another owner's replica into this
  // owner's segment (source says which tier they came from there). A get that takes
  // over this session's pin of the key (BatchExists pin_ms) and finds the pinned bytes
  // here reports source and remote as the pin's lookup found them.
  8: bool remote,
}

struct ReleaseRequest {
  1: Session session,
  2: list<i64> holder_ids,
}

// results[i] is OK or INVALID_ARGUMENT (unknown holder or already released).
struct ReleaseResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<common.ErrorCode> results,
}

struct DeleteRequest {
  1: Session session,
  2: string key,
}

struct DeleteResponse {
  1: common.ErrorCode code,
  2: string message,
  3: bool deleted,
}

struct ExistsRequest {
  1: Session session,
  2: string key,
}

struct ExistsResponse {
  1: common.ErrorCode code,
  2: string message,
  3: bool exists,
}

struct PutStartItem {
  1: string key,
  2: i64 len,
  3: PutOptions opts,
  // Set for a KV page: the page before it in its prefix chain, "" for a chain's first
  // page; eviction keeps a chain's pages while their prefix is cached. Unset: a plain
  // key. A set parent other than "" is a valid key, not the key itself.
  4: optional string parent,
}

struct BatchPutStartRequest {
  1: Session session,
  2: list<PutStartItem> items,
}

struct BatchPutStartResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<PutStartResponse> results,
}

struct PutEndItem {
  1: string key,
  2: i64 put_id,
  // As PutEndRequest.copies (BatchPutEnd only; ignored by BatchPutAbort).
  3: list<AreaCopy> copies,
}

struct BatchPutEndRequest {
  1: Session session,
  2: list<PutEndItem> items,
}

struct BatchPutEndResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<PutEndResponse> results,
}

struct BatchPutAbortRequest {
  1: Session session,
  2: list<PutEndItem> items,
}

struct BatchPutAbortResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<PutAbortResponse> results,
}

struct BatchKeysRequest {
  1: Session session,
  2: list<string> keys,
}

struct BatchGetResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<GetResponse> results,
}

// A prefix lookup (prefix): the keys are the pages of one prompt in order; the answer
// is the count of leading keys present (BatchExistsResponse.found), evaluated in one
// call and stopped at the first absent key. pin_ms > 0 (prefix only, at most
// MAX_PIN_MS) also pins the pages found for that long: each becomes a holding of this
// session in the owner's memory, so the load that follows finds it and eviction spares
// it. A page the owner does not hold in memory (on another owner or on SSD) is brought
// in only as far as half the owner's landing area takes; the rest are counted unpinned
// (the load brings them in), since bringing them in would take the room of other
// values. A pin needs no release: it ends when its time is up, when the session ends,
// or when the session gets the same key (the get's holder takes over). Pins count
// against the owner's hot-set budget; a page that cannot be pinned (no space) or
// brought in ends the count like an absent one.
struct BatchExistsRequest {
  1: Session session,
  2: list<string> keys,
  3: bool prefix,
  4: i64 pin_ms,
}

// results[i] answers keys[i]. With prefix, results stop after the first absent key
// (or the first error): found counts the leading keys present, results the keys
// evaluated. Without prefix, found counts every key present.
struct BatchExistsResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<ExistsResponse> results,
  4: i32 found,
}

struct BatchDeleteResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<DeleteResponse> results,
}

// name: a namespace (see NAMESPACE_SEPARATOR).
struct NamespaceRequest {
  1: Session session,
  2: string name,
}

// deleted: the keys of the namespace that existed and were deleted.
struct DeleteNamespaceResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 deleted,
}

// keys: the keys of the namespace; bytes: their values' bytes (the current version of
// each key counted once, however many replicas it has).
struct NamespaceStatResponse {
  1: common.ErrorCode code,
  2: string message,
  3: i64 keys,
  4: i64 bytes,
}

// keep_hot_set: the owner keeps its hot set (the released holdings it caches for later
// gets) as it is; the holders figures then count those holdings. Without it the owner
// lets them go first, so the figures count only holders in use (exact for leak checks),
// and its next gets of those keys ask the master again: a status poll (`fluxkv status`)
// sets it.
struct StatRequest {
  1: Session session,
  2: bool keep_hot_set,
}

struct StatResponse {
  1: common.ErrorCode code,
  2: string message,
  3: list<common.MemberStat> members,
  4: i64 keys,
  5: string node_id,
  6: i64 client_holders,
  7: i64 clients,
  // The masters as the leader sees them (master StatResponse.masters).
  8: list<common.MasterInfo> masters,
  // Distinct values in memory and duplicate bytes (master StatResponse).
  9: i64 memory_values,
  10: i64 memory_duplicate_bytes,
}

service ExternalService {
  // Starts a put: reserves len bytes at offset. Rule: RETRY WHEN UNSENT.
  PutStartResponse PutStart(1: PutStartRequest req),
  // Publishes a started put. Rule: RETRY ON THE SAME SESSION; a repeat within
  // PUT_END_MEMORY ended puts answers the first outcome, an older one INVALID_ARGUMENT.
  PutEndResponse PutEnd(1: PutEndRequest req),
  // Under isolation: copies parts of a started put's value from the put area. Rule:
  // RETRY ON THE SAME SESSION (a repeat waits for the first and copies nothing again);
  // INVALID_ARGUMENT without isolation, for an unknown put, a range outside the value or
  // the area, or a value range named again in part (PutWriteRequest).
  PutWriteResponse PutWrite(1: PutWriteRequest req),
  // Gives a started put back. Rule: RETRY SAFE; an unknown put (already ended, aborted
  // or revoked) answers INVALID_ARGUMENT: treat as done.
  PutAbortResponse PutAbort(1: PutAbortRequest req),
  // Rule: RETRY SAFE (a lost reply's holder is released: see the retry rules).
  GetResponse Get(1: GetRequest req),
  // Rule: NEVER RETRIED; at most MAX_BATCH holder_ids.
  ReleaseResponse Release(1: ReleaseRequest req),
  // Rule: RETRY SAFE; a retried delete may report deleted=false.
  DeleteResponse Delete(1: DeleteRequest req),
  // Rule: RETRY SAFE.
  ExistsResponse Exists(1: ExistsRequest req),
  // At most MAX_BATCH items; results[i] answers items[i]. Rule: RETRY WHEN UNSENT.
  BatchPutStartResponse BatchPutStart(1: BatchPutStartRequest req),
  // At most MAX_BATCH items. Rule: RETRY ON THE SAME SESSION, read per item.
  BatchPutEndResponse BatchPutEnd(1: BatchPutEndRequest req),
  // At most MAX_BATCH items. Rule: RETRY SAFE.
  BatchPutAbortResponse BatchPutAbort(1: BatchPutAbortRequest req),
  // At most MAX_BATCH keys. Rule: RETRY SAFE.
  BatchGetResponse BatchGet(1: BatchKeysRequest req),
  // At most MAX_BATCH keys. Rule: RETRY SAFE.
  BatchExistsResponse BatchExists(1: BatchExistsRequest req),
  // At most MAX_BATCH keys. Rule: RETRY SAFE; a retried delete may report deleted=false.
  BatchDeleteResponse BatchDelete(1: BatchKeysRequest req),
  // Rule: RETRY SAFE.
  StatResponse Stat(1: StatRequest req),
  // Deletes every key of a namespace, cluster-wide, exactly as BatchDelete deletes keys
  // (holders keep their bytes; other owners learn it as they learn a delete), this
  // owner's own cached holdings of them included. The owner asks the master in chunks of
  // at most master BATCH keys, so the cost follows the namespace's size, not the cache's.
  // A key put while the delete runs may survive it. Rule: RETRY SAFE; a retried delete
  // may count fewer keys.
  DeleteNamespaceResponse DeleteNamespace(1: NamespaceRequest req),
  // The namespace's key count and value bytes, as the master knows them. Rule: RETRY SAFE.
  NamespaceStatResponse NamespaceStat(1: NamespaceRequest req),
}
