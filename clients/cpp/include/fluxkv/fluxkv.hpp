// fluxkv C++ client: attach to the local fluxkv owner and put, get (zero copy), check and
// remove values in its shared memory segment.
//
//   auto c = fluxkv::Client::connect("/run/fluxkv/fluxkv.sock");
//   c.put("k", buf.data(), buf.size());
//   fluxkv::MemHolder h = c.get("k");     // a read-only view of the owner's segment
//   consume(h.data(), h.size());           // valid until h is destroyed or released
//
// The API mirrors the Python client (clients/python/fluxkv). Every call may throw a
// fluxkv::Error (or a subclass naming the wire ErrorCode). A Client is safe for
// concurrent use by any number of threads. This header includes no thrift or boost: the
// implementation is behind a pointer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fluxkv {

namespace detail {
class ClientImpl;
class Session;
}  // namespace detail

// The protocol's ErrorCode (protocol/common.thrift); a compile-time check in the library
// keeps these equal to the IDL.
enum class ErrorCode : int {
  OK = 0,
  KEY_NOT_FOUND = 1,
  NO_SPACE = 2,
  INVALID_ARGUMENT = 3,
  ALREADY_EXISTS = 4,
  BUSY = 5,
  STALE_GENERATION = 6,
  UNAVAILABLE = 7,
  INTERNAL = 8,
  PERMISSION_DENIED = 9,
  // Between a master that is not the leader and an owner only (master HA on etcd); an
  // owner answers its clients UNAVAILABLE instead.
  NOT_LEADER = 10,
};

// Base of every error the client throws. code() is the wire ErrorCode (INTERNAL for a
// malformed reply, INVALID_ARGUMENT for a request the client refused itself); sys_errno()
// the errno behind a system call failure, else 0.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, int sys_errno = 0);
  ErrorCode code() const noexcept { return code_; }
  int sys_errno() const noexcept { return errno_; }
  // The server's (or the client's) message without the "CODE: " prefix what() carries.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  int errno_;
  std::string message_;
};

// The key has no readable replica.
class KeyNotFound : public Error { public: using Error::Error; };
// The cache could not make room for the value in time.
class NoSpace : public Error { public: using Error::Error; };
// A malformed request: empty or over-long key, zero or over-segment length, a buffer too small.
class InvalidArgument : public Error { public: using Error::Error; };
// put with reject_if_exists found the key present.
class AlreadyExists : public Error { public: using Error::Error; };
// The owner cannot be reached or cannot serve now (or a put's outcome is unknown).
class Unavailable : public Error { public: using Error::Error; };
// The owner does not admit this process, or the socket's permissions refused the connect.
class PermissionDenied : public Error { public: using Error::Error; };

// Throws the exception class for code (never returns). Codes without a class throw Error.
[[noreturn]] void throw_error(ErrorCode code, const std::string& message, int sys_errno = 0);

struct PutOptions {
  // Fail with AlreadyExists when the key has a value.
  bool reject_if_exists = false;
};

struct Options {
  // Shown by the owner in its logs. Default: "cpp:" + the program name.
  std::string name;
  // Bounds one call (send + reply). Default 60 s, as the Python client.
  std::chrono::milliseconds timeout{60000};
  // Bounds the attach handshake.
  std::chrono::milliseconds attach_timeout{10000};
  // Idle RPC connections kept for reuse.
  int max_idle_connections = 16;
  // How long a released holder's ack may wait to ride on the next call before a
  // background thread sends it on its own.
  std::chrono::microseconds release_delay{2000};
  // Each duration above is capped at a year (so milliseconds::max() means "no limit").
};

// A zero-copy, read-only view of one value in the owner's segment. The owner keeps the
// bytes for as long as the holder lives, even if the key is overwritten, deleted or
// evicted meanwhile, and even after the owner restarted (the holder keeps its own mapping
// of the old segment). Move-only; the destructor (or release()) gives the bytes back: the
// ack rides on the client's next call. A holder may outlive its Client.
class MemHolder {
 public:
  MemHolder() noexcept = default;
  MemHolder(MemHolder&& o) noexcept;
  MemHolder& operator=(MemHolder&& o) noexcept;
  MemHolder(const MemHolder&) = delete;
  MemHolder& operator=(const MemHolder&) = delete;
  ~MemHolder();

  // The value's bytes: read-only (a write faults), valid until release or destruction.
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  std::span<const std::byte> span() const noexcept { return {data_, size_}; }
  // A copy of the value.
  std::vector<std::byte> bytes() const;
  // "memory" or "ssd": where the owner found the bytes.
  std::string_view source() const noexcept;
  // Whether the bytes crossed the network (pulled from another owner's replica).
  bool remote() const noexcept { return remote_; }
  // The version of the key this holder shows.
  std::int64_t put_id() const noexcept { return put_id_; }
  std::int64_t holder_id() const noexcept { return id_; }
  // False once released (or moved from).
  explicit operator bool() const noexcept { return session_ != nullptr; }
  // Gives the bytes back now. Idempotent.
  void release() noexcept;

 private:
  friend class detail::ClientImpl;
  MemHolder(std::shared_ptr<detail::Session> s, std::int64_t id, const std::byte* data, std::size_t size,
            int source, bool remote, std::int64_t put_id) noexcept;

  std::shared_ptr<detail::Session> session_;
  std::int64_t id_ = 0;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int source_ = 0;
  bool remote_ = false;
  std::int64_t put_id_ = 0;
};

// One item of batch_put: a key and the bytes to store under it (not copied until the call).
struct PutItem {
  std::string_view key;
  std::span<const std::byte> value;
};

// A connection to the local fluxkv owner. Thread-safe: calls borrow one of a pool of RPC
// connections. Releases of holders ride on the next call. When the owner restarts, the
// client attaches again by itself (retrying the call once where the protocol's retry rules
// allow). After fork() the child drops the inherited session and attaches again on its
// first call. Move-only; destruction closes it.
class Client {
 public:
  // Attaches to the owner at socket_path (a socket or its directory). Empty: $FLUXKV_SOCKET,
  // else $XDG_RUNTIME_DIR/fluxkv/fluxkv.sock if it exists, else /run/fluxkv/fluxkv.sock. Throws
  // Unavailable when no owner listens there, PermissionDenied when refused.
  static Client connect(const std::string& socket_path = "", const Options& opts = {});

  Client(Client&&) noexcept;
  Client& operator=(Client&&) noexcept;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // Sends queued releases and ends the session. Idempotent. Live holders stay readable.
  void close() noexcept;

  // Stores len bytes under key: one copy, into shared memory (under client isolation into
  // the session's put area, which the owner copies from).
  void put(std::string_view key, const void* data, std::size_t len, PutOptions opts = {});
  void put(std::string_view key, std::span<const std::byte> value, PutOptions opts = {});
  // Stores len bytes under key written by fill straight into shared memory (zero copy).
  // The span is valid only during the call. If fill throws, the put is aborted and the
  // exception propagates. fill may run twice when the owner restarted before the put was
  // published (the put is redone on the new session). Under client isolation the span
  // lies in the put area (or, when len exceeds it, in a scratch buffer streamed through
  // it); fill must not put through the same client then. Returns the put_id.
  std::int64_t put_with(std::string_view key, std::size_t len, const std::function<void(std::span<std::byte>)>& fill,
                        PutOptions opts = {});

  // A holder of key's value. Throws KeyNotFound on a miss.
  MemHolder get(std::string_view key);
  // Copies key's value into out; returns its length. InvalidArgument when out is too small.
  std::size_t get_into(std::string_view key, std::span<std::byte> out);
  bool exists(std::string_view key);
  // Removes key; true when it existed. Holders of it keep their bytes.
  bool remove(std::string_view key);

  // Stores many values in waves (as the Python client's batch_put). Every item is
  // attempted; the first failure is thrown after all of them ran.
  void batch_put(std::span<const PutItem> items, PutOptions opts = {});
  // One holder per key, nullopt for a miss; any other per-key error throws.
  std::vector<std::optional<MemHolder>> batch_get(std::span<const std::string_view> keys);
  std::vector<bool> batch_exists(std::span<const std::string_view> keys);
  std::vector<bool> batch_remove(std::span<const std::string_view> keys);
  // A prefix lookup: keys are the pages of one prompt in order; returns how many leading
  // keys are present. The owner evaluates each chunk of MAX_BATCH keys in one call and
  // stops at the first absent key (a later chunk is sent only when the whole previous one
  // was present); a key it could not evaluate ends the count like an absent one. pin > 0
  // (at most kMaxPin) also pins the pages found for that long: each becomes a holding of
  // this client's session in the owner's memory, so the load that follows finds it and
  // eviction spares it (pages on another owner or on SSD only as far as half the owner's
  // landing area takes; the rest are counted unpinned). A pin needs no release (it ends when its time is up, with the
  // session, or when this client gets the key); pins count against the owner's hot-set
  // budget, and a page that cannot be pinned ends the count. InvalidArgument for a pin
  // outside 0..kMaxPin or a bad key, before anything is sent. An owner that predates
  // prefix lookups answers every key and pins nothing: the count is the same.
  std::size_t batch_exists_prefix(std::span<const std::string_view> keys, std::chrono::milliseconds pin = {});

  // The owner's status as JSON (the Python client's stat(): node_id, keys, client_holders,
  // clients, members[...] with memory_segment / kv_ssd capacity and used bytes). Queued
  // releases are sent first, so it reflects them.
  std::string stat_json();
  // Sends the queued holder releases now, and waits for the calls of other threads in
  // flight that carry releases (each bounded by the call timeout): the owner has them all
  // when it returns. Throws Unavailable when calls carrying them failed twice (they stay
  // queued for a later call).
  void flush();

  std::string node_id();
  std::int64_t generation();
  std::int64_t segment_size();
  bool isolated();
  const std::string& socket_path() const;
  // Release acks the owner refused (unknown or double release): 0 unless something is wrong.
  std::int64_t release_errors() const;

 private:
  friend class detail::ClientImpl;
  explicit Client(std::shared_ptr<detail::ClientImpl> impl) noexcept;
  std::shared_ptr<detail::ClientImpl> impl_;
};

// The longest pin of Client::batch_exists_prefix (the protocol's MAX_PIN_MS; checked
// against the IDL when the library is built).
inline constexpr std::chrono::milliseconds kMaxPin{5000};

// The default attach socket: $FLUXKV_SOCKET, else $XDG_RUNTIME_DIR/fluxkv/fluxkv.sock if it exists,
// else /run/fluxkv/fluxkv.sock.
std::string default_socket();

}  // namespace fluxkv
