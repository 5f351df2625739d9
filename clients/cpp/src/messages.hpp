// The ExternalService messages of protocol/external.thrift this client sends and reads,
// encoded with binary_protocol.hpp. Field ids and types follow the IDL; a reader skips
// fields it does not know, so a newer owner's extra fields do no harm.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "binary_protocol.hpp"
#include "wire_constants.hpp"

namespace fluxkv::detail {

// The most results an answer holds (one per key of a call of at most MAX_BATCH), and
// the most members a Stat lists: what a reply's list may announce.
inline constexpr std::size_t kMaxResults = static_cast<std::size_t>(wire::MAX_BATCH);
inline constexpr std::size_t kMaxMembers = 1 << 16;

// Session names the caller in every RPC; releases piggybacks holder releases.
struct SessionRef {
  std::int64_t client_id = 0;
  std::int64_t session_token = 0;
  std::int64_t owner_generation = 0;
  std::span<const std::int64_t> releases;
};

struct AreaCopy {
  std::int64_t value_offset = 0;
  std::int64_t area_offset = 0;
  std::int64_t len = 0;
};

// Calls a reader function for every field of a struct; fields it does not take (it
// returns false) are skipped.
template <class F>
void read_struct(Reader& r, F&& on_field) {
  TType t;
  std::int16_t id;
  while (r.field(t, id)) {
    if (!on_field(t, id)) r.skip(t);
  }
}

// Field 1 (code) and 2 (message) of every response. A missing code reads as INTERNAL.
struct Status {
  std::int32_t code = -1;
  std::string message;
  // Takes field 1 or 2; false for any other field.
  bool read_field(Reader& r, TType t, std::int16_t id);
};

struct PutStartResponse : Status {
  std::int64_t put_id = 0;
  std::int64_t offset = -1;
  void read(Reader& r);
};

struct GetResponse : Status {
  std::int64_t holder_id = 0;
  bool has_holder = false;
  std::int64_t offset = -1;
  std::int64_t len = -1;
  std::int32_t source = 0;
  std::int64_t put_id = 0;
  bool remote = false;
  void read(Reader& r);
};

// PutEnd, PutWrite and PutAbort answers: code and message only.
struct PlainResponse : Status {
  void read(Reader& r);
};

// Delete (deleted) and Exists (exists) answers: field 3 is the flag.
struct FlagResponse : Status {
  bool flag = false;
  void read(Reader& r);
};

struct ReleaseResponse : Status {
  std::vector<std::int32_t> results;
  void read(Reader& r);
};

// BatchGet, BatchExists, BatchDelete, BatchPutStart, BatchPutEnd: field 3 lists one T per item.
template <class T>
struct BatchResponse : Status {
  std::vector<T> results;
  bool has_results = false;
  void read(Reader& r) {
    read_struct(r, [&](TType t, std::int16_t id) {
      if (read_field(r, t, id)) return true;
      if (id != 3 || t != T_LIST) return false;
      std::size_t n = r.list_begin(T_STRUCT, kMaxResults);
      results.resize(n);
      for (auto& x : results) x.read(r);
      has_results = true;
      return true;
    });
  }
};

// BatchExists: the per-key answers (field 3) and found (field 4), the count of leading
// keys present of a prefix lookup (0 from an owner that predates prefix lookups).
struct BatchExistsResponse : BatchResponse<FlagResponse> {
  std::int32_t found = 0;
  void read(Reader& r);
};

struct CapacityStat {
  std::int64_t capacity_bytes = 0;
  std::int64_t used_bytes = 0;
  void read(Reader& r);
};

struct MemberStat {
  std::string node_id;
  std::int64_t generation = 0;
  CapacityStat memory_segment;
  CapacityStat kv_ssd;
  bool alive = false;
  std::string data_addr;
  std::string peer_addr;
  std::int64_t memory_replicas = 0;
  std::int64_t ssd_replicas = 0;
  std::int64_t holders = 0;
  void read(Reader& r);
};

struct StatResponse : Status {
  std::vector<MemberStat> members;
  std::int64_t keys = 0;
  std::string node_id;
  std::int64_t client_holders = 0;
  std::int64_t clients = 0;
  void read(Reader& r);
};

struct AttachReply : Status {
  std::int32_t protocol_version = 0;
  bool has_protocol_version = false;
  std::int64_t client_id = 0;
  std::int64_t session_token = 0;
  std::int64_t owner_generation = 0;
  std::int64_t segment_size = 0;
  std::string rpc_socket;
  std::string node_id;
  bool isolated = false;
  std::int64_t put_area_size = 0;
  void read(Reader& r);
};

// The body of an AttachHello frame.
void write_attach_hello(Writer& w, std::int32_t protocol_version, std::string_view name, std::int32_t pid);

// Request structs (the `req` argument, field 1 of every method's args).
void write_session(Writer& w, const SessionRef& s);
void write_key_request(Writer& w, const SessionRef& s, std::string_view key);  // Get, Delete, Exists
void write_put_start(Writer& w, const SessionRef& s, std::string_view key, std::int64_t len, bool reject_if_exists);
// PutEnd (copies field 4), PutWrite (copies field 4), PutAbort (no copies).
void write_put_ref(Writer& w, const SessionRef& s, std::string_view key, std::int64_t put_id,
                   const std::vector<AreaCopy>* copies);
void write_release(Writer& w, const SessionRef& s, std::span<const std::int64_t> ids);
void write_keys(Writer& w, const SessionRef& s, std::span<const std::string_view> keys);  // BatchGet/Exists/Delete
// BatchExists as a prefix lookup (prefix, pin_ms: fields 3 and 4 of BatchExistsRequest).
void write_batch_exists(Writer& w, const SessionRef& s, std::span<const std::string_view> keys, bool prefix,
                        std::int64_t pin_ms);

struct PutStartItem {
  std::string_view key;
  std::int64_t len = 0;
};
void write_batch_put_start(Writer& w, const SessionRef& s, std::span<const PutStartItem> items, bool reject_if_exists);

struct PutEndItem {
  std::string_view key;
  std::int64_t put_id = 0;
  std::vector<AreaCopy> copies;
};
// BatchPutEnd and BatchPutAbort (the latter ignores copies).
void write_batch_put_end(Writer& w, const SessionRef& s, std::span<const PutEndItem> items);
void write_stat(Writer& w, const SessionRef& s);

}  // namespace fluxkv::detail
