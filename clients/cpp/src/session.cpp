#include "session.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "fork_registry.hpp"
#include "unix_socket.hpp"

namespace fluxkv::detail {

namespace {

// Intentionally leaked: sessions may be destroyed from static destructors.
std::mutex& sessions_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::set<Session*>& sessions() {
  static auto* s = new std::set<Session*>();
  return *s;
}

// The attach connections of sessions being built (under sessions_mu): made and recorded
// under the lock, so a fork never copies one a forked child does not close.
std::set<int>& attaching() {
  static auto* s = new std::set<int>();
  return *s;
}

// The attach handshake: AttachHello out, AttachReply back with the segment's memfd (and,
// under isolation, the put area's) as SCM_RIGHTS.
AttachReply handshake(const SessionConfig& cfg, const UniqueFd& sock, std::vector<UniqueFd>& fds) {
  connect_unix(sock, cfg.path, cfg.attach_timeout, "attach socket");
  std::vector<std::uint8_t> hello(4);
  Writer w(hello);
  std::string_view name(cfg.name);
  if (name.size() > static_cast<std::size_t>(wire::MAX_HELLO_NAME_BYTES)) name = name.substr(0, wire::MAX_HELLO_NAME_BYTES);
  write_attach_hello(w, wire::PROTOCOL_VERSION, name, static_cast<std::int32_t>(::getpid()));
  auto body = static_cast<std::uint32_t>(hello.size() - 4);
  for (int i = 0; i < 4; ++i) hello[i] = static_cast<std::uint8_t>(body >> (24 - 8 * i));
  std::size_t written;
  if (int e = send_all(sock.get(), hello.data(), hello.size(), &written); e != 0)
    throw Unavailable(ErrorCode::UNAVAILABLE, "attach to " + cfg.path + ": " + std::strerror(e), e);
  std::vector<std::uint8_t> payload;
  try {
    payload = recv_frame_with_fds(sock.get(), static_cast<std::uint32_t>(wire::MAX_ATTACH_FRAME_BYTES), fds);
  } catch (const Unavailable& e) {
    throw Unavailable(ErrorCode::UNAVAILABLE, "attach to " + cfg.path + ": " + e.message(), e.sys_errno());
  }
  AttachReply reply;
  try {
    Reader r(payload.data(), payload.size());
    reply.read(r);
  } catch (const ProtocolError& e) {
    throw Error(ErrorCode::INTERNAL, std::string("attach reply: malformed: ") + e.what());
  }
  if (reply.code != static_cast<std::int32_t>(wire::Code::OK))
    throw_error(static_cast<ErrorCode>(reply.code < 0 ? static_cast<std::int32_t>(wire::Code::INTERNAL) : reply.code),
                "attach refused: " + reply.message);
  if (reply.has_protocol_version && reply.protocol_version != wire::PROTOCOL_VERSION)
    throw Error(ErrorCode::INTERNAL, "owner speaks protocol version " + std::to_string(reply.protocol_version) +
                                         ", this client " + std::to_string(wire::PROTOCOL_VERSION));
  std::size_t want = reply.isolated ? 2 : 1;
  if (fds.size() != want)
    throw Error(ErrorCode::INTERNAL, "attach reply carried " + std::to_string(fds.size()) + " file descriptors, expected " +
                                         std::to_string(want) +
                                         (reply.isolated ? " (the segment's memfd, then the put area)" : " (the segment's memfd)"));
  return reply;
}

}  // namespace

Session::Session(const SessionConfig& cfg, std::shared_ptr<ReleaseKicker> kicker) : cfg_(cfg), kicker_(std::move(kicker)) {
  ForkRegistry::install();  // the first client's session is built before the client registers
  UniqueFd sock;
  {
    std::lock_guard lk(sessions_mu());
    sock = unix_stream_socket();
    attaching().insert(sock.get());
  }
  // Until it is registered below, a forked child closes its copy; on failure it is
  // closed under the lock, before its number can be reused.
  AttachReply reply;
  try {
    std::vector<UniqueFd> fds;  // closed here: the mappings outlive them
    reply = handshake(cfg, sock, fds);
    ro = Mapping(fds[0].get(), reply.segment_size, false, "segment");
    if (reply.isolated) {
      // The segment is write-sealed: never mapped writable; puts go through the area.
      area = Mapping(fds[1].get(), reply.put_area_size, true, "put area");
    } else {
      rw = Mapping(fds[0].get(), reply.segment_size, true, "segment");
    }
  } catch (...) {
    std::lock_guard lk(sessions_mu());
    attaching().erase(sock.get());
    sock.reset();
    throw;
  }
  set_timeouts(sock.get(), std::chrono::milliseconds(0));
  client_id = reply.client_id;
  session_token = reply.session_token;
  generation = reply.owner_generation;
  segment_size = reply.segment_size;
  rpc_path = reply.rpc_socket.empty() ? cfg.path + ".rpc" : reply.rpc_socket;
  node_id = reply.node_id;
  isolated = reply.isolated;
  std::lock_guard lk(sessions_mu());
  attaching().erase(sock.get());
  attach_fd_ = std::move(sock);
  sessions().insert(this);
}

Session::~Session() {
  // Its connections close while it is still registered: a fork in between would leave
  // the child copies no fork handler knows of.
  std::lock_guard lk(sessions_mu());
  attach_fd_.reset();
  idle_.clear();
  sessions().erase(this);
}

void Session::fork_prepare_all() noexcept {
  sessions_mu().lock();
  for (Session* s : sessions()) s->mu_.lock();
}

void Session::fork_parent_all() noexcept {
  for (auto it = sessions().rbegin(); it != sessions().rend(); ++it) (*it)->mu_.unlock();
  sessions_mu().unlock();
}

void Session::fork_child_all() noexcept {
  for (Session* s : sessions()) {
    s->mu_.unlock();
    s->retire(SessionState::forked);
  }
  // Sessions another thread was attaching: that thread is not in this child.
  for (int fd : attaching()) ::close(fd);
  attaching().clear();
  sessions_mu().unlock();
}

std::string Session::unusable_reason() const {
  switch (state()) {
    case SessionState::live: return "";
    case SessionState::closed: return "the client was closed";
    case SessionState::replaced: return "the owner restarted (its generation changed) or the session was replaced";
    case SessionState::forked: return "it belongs to the parent process (fork)";
  }
  return "unknown";
}

void Session::take(std::unique_ptr<RpcConn>& conn, std::vector<std::int64_t>* releases, std::uint64_t* carry) {
  std::unique_lock lk(mu_);
  if (releases != nullptr && flushes_ > 0) flushed_.wait_for(lk, cfg_.timeout, [&] { return flushes_ == 0; });
  if (!live()) {
    if (state() == SessionState::replaced) throw Replaced("the session was replaced by another thread");
    throw Unavailable(ErrorCode::UNAVAILABLE, "session unusable: " + unusable_reason());
  }
  if (!idle_.empty()) {
    conn = std::move(idle_.back());
    idle_.pop_back();
    busy_.insert(conn.get());
  }
  if (releases != nullptr && !pending_.empty()) {
    std::size_t k = std::min(pending_.size(), static_cast<std::size_t>(wire::MAX_RELEASES_PER_CALL));
    releases->assign(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(k));
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(k));
    *carry = ++carry_seq_;
    carrying_.insert(*carry);
  }
}

void Session::done(std::unique_ptr<RpcConn> conn, const std::vector<std::int64_t>& releases, bool failed,
                   std::uint64_t carry) {
  std::unique_ptr<RpcConn> drop;  // closed outside the lock
  bool notify = false;
  bool requeued = false;
  {
    std::lock_guard lk(mu_);
    if (!releases.empty()) {
      if (failed && live()) {
        pending_.insert(pending_.begin(), releases.begin(), releases.end());
        ++requeues_;
        requeued = true;
      }
      carrying_.erase(carry);
      notify = true;
    }
    if (!failed) rpc_count_.fetch_add(1, std::memory_order_relaxed);
    if (conn) busy_.erase(conn.get());
    if (conn && !failed && conn->usable() && live() && static_cast<int>(idle_.size()) < cfg_.max_idle) {
      idle_.push_back(std::move(conn));
    } else if (conn) {
      conn->close_copy();  // close(2) now, before a fork could copy it unseen; the object goes below
      drop = std::move(conn);
    }
  }
  if (notify) released_.notify_all();
  // Back in the queue: the flusher may have found it empty meanwhile and stopped watching.
  // Kicked outside mu_ (the flusher takes the kicker's lock before it).
  if (requeued) kicker_->kick();
}

void Session::queue_release(std::int64_t holder_id) noexcept {
  if (!live()) return;  // the session's end released it
  try {
    std::lock_guard lk(mu_);
    if (!live()) return;
    pending_.push_back(holder_id);
  } catch (...) {
    return;  // out of memory: the session's end releases it
  }
  kicker_->kick();
}

bool Session::has_pending() {
  std::lock_guard lk(mu_);
  return !pending_.empty();
}

void Session::flush_releases() {
  // Twice at most: a call carrying releases that fails while this one waits gives them
  // back to the queue, and the second round sends them.
  for (int round = 0; round < 2; ++round) {
    send_pending_releases();
    // The calls carrying releases that began before now have their answers (or gave them
    // back): not those begun later, each of which a steady load keeps going.
    std::unique_lock lk(mu_);
    std::uint64_t upto = carry_seq_;
    std::uint64_t requeues = requeues_;
    released_.wait_for(lk, cfg_.timeout, [&] { return carrying_.empty() || *carrying_.begin() > upto; });
    if (!live()) return;
    bool failed = requeues_ != requeues;
    if (!failed) return;  // (what is queued now came after the flush began)
    if (round == 1)
      throw Unavailable(ErrorCode::UNAVAILABLE, "a call carrying releases failed twice: they stay queued for a later call");
  }
}

void Session::send_pending_releases() {
  for (;;) {
    std::vector<std::int64_t> ids;
    std::uint64_t carry = 0;
    {
      std::lock_guard lk(mu_);
      if (pending_.empty()) break;
      std::size_t k = std::min(pending_.size(), static_cast<std::size_t>(wire::MAX_RELEASES_PER_CALL));
      ids.assign(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(k));
      pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(k));
      carry = ++carry_seq_;
      carrying_.insert(carry);
      ++flushes_;
    }
    auto flushed = [&] {
      bool notify = false;
      {
        std::lock_guard lk(mu_);
        notify = --flushes_ == 0;
      }
      if (notify) flushed_.notify_all();
    };
    ReleaseResponse r;
    try {
      call("Release", [&](Writer& w, const SessionRef& s) { write_release(w, s, ids); }, r, false);
    } catch (...) {
      done(nullptr, ids, true, carry);  // never retried: the ids stay queued for a later call
      flushed();
      throw;
    }
    done(nullptr, ids, false, carry);
    flushed();
    if (r.results.size() != ids.size()) {
      if (r.code != static_cast<std::int32_t>(wire::Code::OK)) release_errors_.fetch_add(static_cast<std::int64_t>(ids.size()));
      continue;
    }
    // results[i] is INVALID_ARGUMENT for an unknown or double release: a client (or
    // daemon) bug, counted so tests can assert there is none.
    for (std::int32_t c : r.results)
      if (c != static_cast<std::int32_t>(wire::Code::OK)) release_errors_.fetch_add(1);
  }
}

bool Session::attach_alive() {
  std::lock_guard lk(mu_);
  return peer_alive(attach_fd_.get());
}

void Session::drop_idle() {
  std::vector<std::unique_ptr<RpcConn>> drop;
  std::lock_guard lk(mu_);
  drop.swap(idle_);
}

void Session::busy(RpcConn* conn) {
  std::lock_guard lk(mu_);
  busy_.insert(conn);
}

void Session::retire(SessionState why) noexcept {
  std::vector<std::unique_ptr<RpcConn>> drop;
  std::lock_guard lk(mu_);
  SessionState expect = SessionState::live;
  // A forked child ends every session, a closed one (its attach connection kept for its
  // holders) too; any other end only a live one.
  if (!state_.compare_exchange_strong(expect, why) && (why != SessionState::forked || expect == SessionState::forked))
    return;
  if (why == SessionState::forked) state_.store(why);
  pending_.clear();
  drop.swap(idle_);
  if (why == SessionState::forked) {
    // The parent's calls in flight at fork(), on threads this child does not have: their
    // connections' copies here go (close(2) only), the objects stay untouched.
    for (RpcConn* c : busy_) c->close_copy();
    busy_.clear();
  }
  if (why != SessionState::closed) attach_fd_.reset();
}

}  // namespace fluxkv::detail
