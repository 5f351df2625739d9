// ClientImpl: the state behind fluxkv::Client. It owns the current attach Session (replaced
// when the owner restarts, dropped in a forked child), runs every operation by the retry
// rules of protocol/external.thrift (run, put_end), and owns the release flusher thread.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "fluxkv/fluxkv.hpp"
#include "release_kicker.hpp"
#include "session.hpp"

namespace fluxkv::detail {

inline constexpr auto kOK = static_cast<std::int32_t>(wire::Code::OK);
inline constexpr auto kInvalid = static_cast<std::int32_t>(wire::Code::INVALID_ARGUMENT);
inline constexpr auto kNotFound = static_cast<std::int32_t>(wire::Code::KEY_NOT_FOUND);

// Raises the exception for a non-OK code (a missing code is a protocol error).
void raise_for(std::int32_t code, const std::string& message);
// The exception for a non-OK code, to be thrown later (batch items).
std::exception_ptr error_ptr(std::int32_t code, const std::string& message);
// Checks a key: 1..MAX_KEY_BYTES bytes.
void validate_key(std::string_view key);
// Checks a value length: 1 byte to the segment size seg. The message names the length as
// the caller gave it (SIZE_MAX as 18446744073709551615, never a signed -1).
std::int64_t validate_len(std::size_t n, std::int64_t seg);
// A key for messages: quoted, cut when long.
std::string quote(std::string_view key);
// The count of leading keys present a prefix answer for n keys gives (see batch.cpp).
std::size_t prefix_count(const BatchExistsResponse& r, std::size_t n);

class PutTxn;

class ClientImpl {
 public:
  ClientImpl(std::string path, const Options& opts);
  ~ClientImpl();
  ClientImpl(const ClientImpl&) = delete;
  ClientImpl& operator=(const ClientImpl&) = delete;

  static ClientImpl& of(Client& c) { return *c.impl_; }
  static std::shared_ptr<ClientImpl> shared(Client& c) { return c.impl_; }

  void close() noexcept;

  // The live session, attaching a new one when there is none (after fork, or after the
  // previous one was replaced).
  std::shared_ptr<Session> current();
  // The current session, attaching a new one if old is still current (or none is).
  std::shared_ptr<Session> renew(const std::shared_ptr<Session>& old);

  // Runs op(session) with one recovery, by the retry rules: on STALE_GENERATION, or a
  // broken connection to an owner whose attach connection closed, attach again and retry
  // once; a broken connection to a live owner is retried once on a fresh connection,
  // unless lost_reply_ok is false (PutStart: a request that may have been sent is not sent
  // again on a live session).
  template <class Op>
  auto run(Op&& op, bool lost_reply_ok = true) -> decltype(op(std::declval<std::shared_ptr<Session>&>())) {
    std::shared_ptr<Session> s = current();
    std::shared_ptr<Session> s2;
    std::string why;
    try {
      return op(s);
    } catch (const Stale& e) {
      why = std::string("the owner restarted (") + e.what() + ")";
      s2 = renew(s);
    } catch (const Broken& e) {
      if (e.timed_out)
        throw Unavailable(ErrorCode::UNAVAILABLE, "call to the owner at " + s->rpc_path + " timed out after " +
                                                      std::to_string(opts_.timeout.count()) + " ms", e.sys_errno);
      if (s->attach_alive()) {
        if (e.sent && !lost_reply_ok)
          throw Unavailable(ErrorCode::UNAVAILABLE, std::string("the connection to the owner broke, the reply was lost (") +
                                                        e.what() + ")", e.sys_errno);
        why = std::string("the connection to the owner broke (") + e.what() + ")";
        s->drop_idle();
        s2 = s;
      } else {
        why = std::string("the owner closed the session (") + e.what() + ")";
        try {
          s2 = renew(s);
        } catch (const Unavailable& u) {
          throw Unavailable(ErrorCode::UNAVAILABLE, why + "; attaching again failed: " + u.message(), u.sys_errno());
        }
      }
    }
    retries.fetch_add(1, std::memory_order_relaxed);
    try {
      return op(s2);
    } catch (const Stale& e) {
      throw Unavailable(ErrorCode::UNAVAILABLE, why + "; the retry failed too: stale generation (" + e.what() + ")");
    } catch (const Broken& e) {
      throw Unavailable(ErrorCode::UNAVAILABLE, why + "; the retry failed too: " + e.what(), e.sys_errno);
    }
  }

  // Sends a PutEnd, BatchPutEnd or PutWrite on session s by its rule: again on the same
  // session after a lost reply (the owner answers a repeat with the first outcome), never
  // elsewhere. Throws OutcomeUnknown when the session is gone or every send was lost.
  // Returns whether the answer came to a repeat.
  template <class W, class Resp>
  bool put_end(const std::shared_ptr<Session>& s, std::string_view method, W&& write_req, Resp& resp) {
    for (int attempt = 0;; ++attempt) {
      try {
        s->call(method, write_req, resp);
        return attempt > 0;
      } catch (const Replaced& e) {
        renew_quietly(s);
        if (attempt == 0)  // never sent: the put was not ended
          throw NotWritten(std::string(method) + " was not sent: " + e.what());
        throw OutcomeUnknown(std::string("the session was replaced before ") + std::string(method) + " was answered (" +
                             e.what() + ")");
      } catch (const Stale& e) {
        renew_quietly(s);
        throw OutcomeUnknown(std::string("the owner restarted before ") + std::string(method) + " was answered (" + e.what() + ")");
      } catch (const Broken& e) {
        if (!s->attach_alive()) {
          renew_quietly(s);
          throw OutcomeUnknown(std::string("the owner closed the session before ") + std::string(method) +
                               " was answered (" + e.what() + ")");
        }
        if (attempt + 1 == kPutEndTries) {
          if (s->isolated) {  // (the area turn held) the owner may still copy from the area
            Session::OwedCall owed{std::string(method), {}};
            Writer w(owed.body);
            write_req(w, SessionRef{s->client_id, s->session_token, s->generation, {}});
            s->area_owed = std::move(owed);
          }
          throw OutcomeUnknown(std::string(method) + " sent " + std::to_string(kPutEndTries) + " times without an answer (" +
                               e.what() + ")");
        }
        put_end_retries.fetch_add(1, std::memory_order_relaxed);
        s->drop_idle();
        resp = Resp{};
      }
    }
  }

  // Best effort PutAbort / BatchPutAbort of started puts; the owner also revokes them when
  // the session ends.
  void abort(const std::shared_ptr<Session>& s, std::span<const PutEndItem> puts) noexcept;
  // Before a put writes the put area (its turn held): sends again a call that named the
  // area and went unanswered (Session::area_owed); throws Unavailable while it stays
  // unanswered on the live session (the owner may still copy the area into that put).
  void settle_area(const std::shared_ptr<Session>& s);
  // Streams a value larger than the put area through it (isolation), each area-full part
  // copied by a PutWrite; with keep_last the last part's copy is returned for PutEnd.
  std::vector<AreaCopy> stream(const std::shared_ptr<Session>& s, std::string_view key, std::int64_t put_id,
                               const std::byte* src, std::int64_t n, bool keep_last);

  // The operations (Client's public methods forward here).
  std::int64_t put(std::string_view key, std::size_t n, bool reject, const std::byte* src,
                   const std::function<void(std::span<std::byte>)>* fill);
  MemHolder get(std::string_view key);
  bool flag_call(std::string_view method, std::string_view key);  // Exists, Delete
  void batch_put(std::span<const PutItem> items, bool reject);
  std::vector<std::optional<MemHolder>> batch_get(std::span<const std::string_view> keys);
  std::vector<bool> batch_flags(std::string_view method, std::span<const std::string_view> keys);
  std::size_t batch_exists_prefix(std::span<const std::string_view> keys, std::int64_t pin_ms);
  std::string stat_json();
  void flush();
  std::int64_t release_errors() const noexcept;

  const std::string& path() const noexcept { return path_; }
  const Options& options() const noexcept { return opts_; }

  // fork(): prepare locks what another thread may hold; the child drops the session.
  void fork_prepare() noexcept;
  void fork_parent() noexcept;
  void fork_child() noexcept;

  // What the retry rules did (tests, debugging).
  std::atomic<std::int64_t> retries{0};
  std::atomic<std::int64_t> put_end_retries{0};
  std::atomic<std::int64_t> put_redos{0};

  static constexpr int kPutEndTries = 3;

 private:
  friend class PutTxn;
  MemHolder make_holder(const std::shared_ptr<Session>& s, std::string_view key, const GetResponse& r);
  void put_wave(std::span<const PutItem> items, std::vector<std::size_t> idx, bool reject,
                std::vector<std::exception_ptr>& errors);
  std::vector<std::size_t> put_wave_once(std::span<const PutItem> items, const std::vector<std::size_t>& idx, bool reject,
                                         std::vector<std::exception_ptr>& errors);
  void renew_quietly(const std::shared_ptr<Session>& s) noexcept;
  std::shared_ptr<Session> attach_locked();
  void start_flusher_locked();
  void stop_flusher() noexcept;
  static void* flusher_main(void* self);
  void flush_loop();

  const std::string path_;
  const Options opts_;
  const SessionConfig cfg_;
  std::shared_ptr<ReleaseKicker> kicker_ = std::make_shared<ReleaseKicker>();

  mutable std::mutex mu_;  // protects cur_, closed_, flusher_*, retired_release_errors_
  std::shared_ptr<Session> cur_;
  bool closed_ = false;
  // The flusher is a raw pthread: after fork() it does not exist in the child, whose copy of
  // this object must forget it (a joinable std::thread would terminate the process).
  pthread_t flusher_{};
  bool flusher_running_ = false;
  std::int64_t retired_release_errors_ = 0;
};

// One put on one session: PutStart, the bytes written, then PutEnd. The destructor aborts a
// put that was neither committed nor aborted.
class PutTxn {
 public:
  PutTxn(ClientImpl& c, std::string_view key, std::size_t n, bool reject);
  ~PutTxn();
  PutTxn(const PutTxn&) = delete;
  PutTxn& operator=(const PutTxn&) = delete;

  // Where the value is written in place: the segment (rw), the put area, or, when the value
  // exceeds the area, a scratch buffer that commit streams through it.
  std::span<std::byte> writable();
  // Publishes the value: copied from src first when given, else as written into
  // writable(). Throws OutcomeUnknown when the outcome became unknown, else the put's error.
  void commit(const std::byte* src);
  // After commit threw OutcomeUnknown: whether writable() still holds the value (a redo
  // may copy from it). Not for a value written in place in the segment whose put the
  // owner forgot: the owner may have given its range to another value.
  bool kept() const noexcept;
  void abort() noexcept;
  std::int64_t put_id() const noexcept { return put_id_; }
  std::int64_t size() const noexcept { return n_; }

 private:
  void end_turn() noexcept;

  ClientImpl& c_;
  std::string key_;
  std::int64_t n_;
  std::shared_ptr<Session> s_;
  std::int64_t put_id_ = 0;
  std::int64_t offset_ = 0;
  bool turn_ = false;
  bool done_ = false;
  bool saved_ = false;  // scratch_ holds the value (kept after an unknown outcome)
  std::vector<std::byte> scratch_;
};

}  // namespace fluxkv::detail
