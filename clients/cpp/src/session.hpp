// Session: one attach session with one owner incarnation. It owns the attach connection
// (its close makes the owner release everything this session holds), the mappings of the
// segment (read-only; read-write too unless the owner isolates clients, which gives a put
// area instead), the pool of idle RPC connections and the queue of holder releases
// waiting to ride on a call. Holders keep their Session alive, so their bytes stay mapped
// after the client re-attached, closed or forked.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "fluxkv/fluxkv.hpp"
#include "mapping.hpp"
#include "messages.hpp"
#include "release_kicker.hpp"
#include "rpc_conn.hpp"
#include "unique_fd.hpp"
#include "wire_constants.hpp"

namespace fluxkv::detail {

// The owner answered STALE_GENERATION: it restarted since this session attached (or the
// session was replaced by another thread).
class Stale : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Another thread replaced the session (the owner restarted) before this call was sent.
class Replaced : public Stale {
 public:
  using Stale::Stale;
};

// The put's outcome is unknown: its session ended, or the owner forgot the put, before
// the answer to its PutEnd came back.
class OutcomeUnknown : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The put was never ended: its session ended before its PutEnd was sent (another thread
// replaced it), or a PutWrite of its streamed value found the session gone. The owner
// revoked it (or the client aborted it) and nothing was published: it is redone once,
// with reject_if_exists too.
class NotWritten : public OutcomeUnknown {
 public:
  using OutcomeUnknown::OutcomeUnknown;
};

enum class SessionState { live, closed, replaced, forked };

// A turn on the put area that any thread may end (a C caller may commit a zero-copy put
// from another thread than the one that began it, which std::mutex forbids).
class AreaTurn {
 public:
  void acquire() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return !busy_; });
    busy_ = true;
  }
  void release() {
    {
      std::lock_guard lk(mu_);
      busy_ = false;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;
};

struct SessionConfig {
  std::string path;  // the attach socket
  std::string name;
  std::chrono::milliseconds timeout;
  std::chrono::milliseconds attach_timeout;
  int max_idle;
};

class Session {
 public:
  // Runs the attach handshake and maps what the reply carried.
  Session(const SessionConfig& cfg, std::shared_ptr<ReleaseKicker> kicker);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Sends method on a pooled connection. write_req(Writer&, const SessionRef&) writes the
  // request; resp.read(Reader&) reads the answer. With piggyback, queued releases ride
  // along. Throws Broken (transport), Stale (STALE_GENERATION), Error (the owner failed the
  // call); any other code is left in resp for the caller.
  template <class W, class Resp>
  void call(std::string_view method, W&& write_req, Resp& resp, bool piggyback = true) {
    if (auto hook = call_hook_for_tests.load(std::memory_order_acquire)) hook(method);
    std::unique_ptr<RpcConn> conn;
    std::vector<std::int64_t> rel;
    std::uint64_t carry = 0;
    take(conn, piggyback ? &rel : nullptr, &carry);
    SessionRef ref{client_id, session_token, generation, rel};
    try {
      if (!conn) {
        // (A fork between the connect and busy leaves the child a copy of this new
        // connection, with no call on it yet.)
        conn = std::make_unique<RpcConn>(rpc_path, cfg_.timeout);  // Broken(sent=false) on failure
        busy(conn.get());
      }
      conn->call(
          method, [&](Writer& w) { write_req(w, ref); }, [&](Reader& r) { resp.read(r); });
    } catch (const AppException& e) {
      done(std::move(conn), rel, true, carry);
      throw Error(ErrorCode::INTERNAL, std::string("owner failed the call: ") + e.what());
    } catch (...) {
      done(std::move(conn), rel, true, carry);  // the owner may not have seen them: a repeated release is harmless
      throw;
    }
    done(std::move(conn), rel, false, carry);
    if (resp.code == static_cast<std::int32_t>(wire::Code::STALE_GENERATION))
      throw Stale(resp.message.empty() ? "stale generation" : resp.message);
  }

  // Called with the method before every call of every session, when set: tests hold a call
  // back with it (a fault a real owner cannot produce on demand). Never set outside tests.
  static inline std::atomic<void (*)(std::string_view)> call_hook_for_tests{nullptr};

  bool live() const noexcept { return state_.load(std::memory_order_acquire) == SessionState::live; }
  SessionState state() const noexcept { return state_.load(std::memory_order_acquire); }
  // Why a session that is not live cannot serve.
  std::string unusable_reason() const;

  // Queues a holder's release for the next call (a no-op once the session ended: its end
  // released everything). Never blocks on I/O.
  void queue_release(std::int64_t holder_id) noexcept;
  bool has_pending();
  // Sends every queued release with Release, then waits (up to the call timeout) for the
  // calls of other threads carrying releases that began before it ended; what a failed one
  // gave back meanwhile it sends once more.
  void flush_releases();
  // Sends every queued release with Release calls (flush_releases' first half).
  void send_pending_releases();
  // False once the owner closed the attach connection (it exited or restarted).
  bool attach_alive();
  void drop_idle();
  // Ends a live session (forked: any session not forked yet, a closed one too). closed:
  // the attach connection stays open until the last holder goes (so their bytes stay
  // valid); replaced or forked: it closes now.
  void retire(SessionState why) noexcept;

  std::uint64_t rpc_count() const noexcept { return rpc_count_.load(std::memory_order_relaxed); }
  std::int64_t release_errors() const noexcept { return release_errors_.load(std::memory_order_relaxed); }

  // What the attach reply said.
  std::int64_t client_id = 0;
  std::int64_t session_token = 0;
  std::int64_t generation = 0;
  std::int64_t segment_size = 0;
  std::string rpc_path;
  std::string node_id;
  bool isolated = false;

  Mapping ro;    // every holder's view
  Mapping rw;    // the put path's, without isolation
  Mapping area;  // the session's put area, under isolation
  // Serializes the puts that use the put area, from the first byte written into it until
  // the PutWrite / PutEnd that copies it is answered.
  AreaTurn area_turn;
  // Under area_turn: a PutEnd, BatchPutEnd or PutWrite that named the put area and went
  // unanswered on this live session (its method and request fields): the owner may still
  // copy from the area, so no put writes it until that call is answered
  // (ClientImpl::settle_area).
  struct OwedCall {
    std::string method;
    std::vector<std::uint8_t> body;
  };
  std::optional<OwedCall> area_owed;

  // fork(): every session of the process, whatever its client or state (one closed while
  // a holder lives keeps its attach connection, one whose client was destroyed too). The
  // prepare handler takes each one's mu_ so no other thread holds it in the child; in the
  // child each session becomes forked: its copies of the attach connection and of every
  // RPC connection close there (close(2) only), so the parent's closes reach the owner
  // while the child lives. ForkRegistry calls them after the clients' own handlers.
  static void fork_prepare_all() noexcept;
  static void fork_parent_all() noexcept;
  static void fork_child_all() noexcept;

 private:
  // take hands a call a pooled connection (conn stays null when none is idle), marked
  // busy in the same hold of mu_ (a fork never sees it neither pooled nor busy), and the
  // queued releases to piggyback, numbered *carry when there are some.
  void take(std::unique_ptr<RpcConn>& conn, std::vector<std::int64_t>* releases, std::uint64_t* carry);
  // busy marks a connection a call just opened as used by it.
  void busy(RpcConn* conn);
  // done ends a call: its connection (null: none) is no longer busy and, in the same hold
  // of mu_, goes back to the pool or is closed (a failed call's always is).
  void done(std::unique_ptr<RpcConn> conn, const std::vector<std::int64_t>& releases, bool failed, std::uint64_t carry);

  SessionConfig cfg_;
  std::shared_ptr<ReleaseKicker> kicker_;
  std::atomic<SessionState> state_{SessionState::live};
  std::atomic<std::uint64_t> rpc_count_{0};
  std::atomic<std::int64_t> release_errors_{0};

  std::mutex mu_;  // protects idle_, busy_, pending_, carry_seq_, carrying_, flushes_, attach_fd_
  std::condition_variable released_;  // a call carrying releases ended
  std::condition_variable flushed_;   // flushes_ reached 0
  std::vector<std::unique_ptr<RpcConn>> idle_;
  // The connections calls are using now: a forked child closes its copies of them too
  // (retire), so that the parent's close of one (a call that timed out) reaches the owner,
  // which then takes back what the lost reply handed out.
  std::unordered_set<RpcConn*> busy_;
  std::deque<std::int64_t> pending_;
  // The calls carrying releases, not yet answered, each numbered when it took them
  // (carry_seq_): flush_releases waits for those numbered before it ended, not for calls
  // begun after it (under steady traffic it waited the whole call timeout; a review).
  std::uint64_t carry_seq_ = 0;
  std::set<std::uint64_t> carrying_;
  std::uint64_t requeues_ = 0;  // calls that failed and gave their releases back (done)
  // Release calls of flush_releases not yet answered: every piggybacking call waits for
  // them first (take). On another connection it could reach the owner before the releases
  // it follows and plan room (a get's target, a put) they were about to free: a full owner
  // would evict a value for it.
  int flushes_ = 0;
  UniqueFd attach_fd_;
};

}  // namespace fluxkv::detail
