#include "client_impl.hpp"

#include <errno.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "fork_registry.hpp"

namespace fluxkv::detail {

namespace {

std::string default_name() {
  const char* prog = program_invocation_short_name;
  return std::string("cpp:") + (prog != nullptr && *prog != '\0' ? prog : "cpp");
}

// Objects a forked child must never destroy (see fork_child), reachable from here so leak
// checkers do not report them.
void keep_forever(std::shared_ptr<void> p) noexcept {
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  try {
    kept->push_back(std::move(p));
  } catch (...) {
    new std::shared_ptr<void>(std::move(p));  // out of memory: still never destroyed
  }
}

// The longest wait built on a duration option: a larger one (milliseconds::max() meaning
// "no limit") would overflow std::chrono's nanoseconds in condition_variable::wait_for
// (undefined behaviour; in practice a wait that returns at once).
constexpr std::chrono::hours kLongestWait{24 * 365};

template <class D>
D capped(D d) {
  return std::min(d, std::chrono::duration_cast<D>(kLongestWait));
}

Options capped_options(Options o) {
  o.timeout = capped(o.timeout);
  o.attach_timeout = capped(o.attach_timeout);
  o.release_delay = capped(o.release_delay);
  return o;
}

SessionConfig config_of(const std::string& path, const Options& o) {
  return SessionConfig{path, o.name.empty() ? default_name() : o.name, o.timeout, o.attach_timeout, o.max_idle_connections};
}

}  // namespace

ClientImpl::ClientImpl(std::string path, const Options& opts)
    : path_(std::move(path)), opts_(capped_options(opts)), cfg_(config_of(path_, opts_)) {
  if (opts.max_idle_connections < 0 || opts.timeout.count() <= 0 || opts.attach_timeout.count() <= 0 ||
      opts.release_delay.count() <= 0)
    throw InvalidArgument(ErrorCode::INVALID_ARGUMENT,
                          "options: timeouts and release_delay must be positive, max_idle_connections at least 0");
  // Registered for fork() before it attaches and starts its flusher: a fork in between
  // left the child a client the handlers skipped, its flusher counted as running and the
  // parent's kicker, which can block it (a review). fork_child copes with a half-built one.
  ForkRegistry::add(this);
  try {
    std::lock_guard lk(mu_);
    cur_ = attach_locked();
    start_flusher_locked();
  } catch (...) {
    ForkRegistry::remove(this);
    throw;
  }
}

ClientImpl::~ClientImpl() {
  close();
  ForkRegistry::remove(this);
}

std::shared_ptr<Session> ClientImpl::attach_locked() {
  if (!kicker_) throw Error(ErrorCode::INTERNAL, "out of memory after fork()");
  return std::make_shared<Session>(cfg_, kicker_);
}

std::shared_ptr<Session> ClientImpl::current() {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lk(mu_);
    if (cur_ && cur_->live()) return cur_;
    s = cur_;
  }
  return renew(s);
}

std::shared_ptr<Session> ClientImpl::renew(const std::shared_ptr<Session>& old) {
  std::lock_guard lk(mu_);
  if (closed_) throw Unavailable(ErrorCode::UNAVAILABLE, "the client is closed");
  if (cur_ && cur_ != old && cur_->live()) return cur_;
  if (cur_) {
    retired_release_errors_ += cur_->release_errors();
    cur_->retire(SessionState::replaced);
    cur_.reset();
  }
  // Attaching under the lock serializes re-attach: the other threads wait for this one.
  cur_ = attach_locked();
  start_flusher_locked();  // after fork() the child has none yet
  return cur_;
}

void ClientImpl::renew_quietly(const std::shared_ptr<Session>& s) noexcept {
  try {
    renew(s);
  } catch (...) {
    // The owner is not back yet: the next call attaches (or reports why it cannot).
  }
}

void ClientImpl::close() noexcept {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lk(mu_);
    if (closed_) return;
    closed_ = true;
    s = std::move(cur_);
  }
  stop_flusher();
  if (!s) return;
  try {
    if (s->live()) s->flush_releases();
  } catch (...) {
    // The owner is gone: the end of the attach session releases everything.
  }
  {
    std::lock_guard lk(mu_);
    retired_release_errors_ += s->release_errors();
  }
  s->retire(SessionState::closed);
}

// -- release flusher ------------------------------------------------------------------

void ClientImpl::start_flusher_locked() {
  // No kicker lock here: the flusher takes kicker->mu before mu_, so taking it under mu_
  // could deadlock. A fresh kicker (or fork_child) has stop and armed false already.
  if (flusher_running_) return;
  if (int e = pthread_create(&flusher_, nullptr, &ClientImpl::flusher_main, this); e != 0)
    throw Error(ErrorCode::INTERNAL, std::string("start the release flusher thread: ") + std::strerror(e), e);
  flusher_running_ = true;
}

void ClientImpl::stop_flusher() noexcept {
  bool running;
  pthread_t t;
  {
    std::lock_guard lk(mu_);
    running = std::exchange(flusher_running_, false);
    t = flusher_;
  }
  if (!running) return;
  {
    std::lock_guard k(kicker_->mu);
    kicker_->stop = true;
  }
  kicker_->cv.notify_all();
  pthread_join(t, nullptr);
}

void* ClientImpl::flusher_main(void* self) {
  static_cast<ClientImpl*>(self)->flush_loop();
  return nullptr;
}

// Sends queued releases that no call picked up within release_delay. Sleeps until kicked;
// once kicked it stays armed, checking every release_delay: while calls flow they carry the
// releases and it does nothing; after a quiet delay it sends what is queued, and disarms
// once the queue is empty. A busy get/release loop therefore costs no wakeups. A failed
// send leaves the ids queued (Session::done): while the owner keeps the session it stays
// armed and sends them again, backing off up to a second, as the Go client's timer does.
void ClientImpl::flush_loop() {
  ReleaseKicker& k = *kicker_;
  std::unique_lock lk(k.mu);
  std::chrono::microseconds backoff{0};  // grows while sends fail; 0 after a success
  for (;;) {
    k.cv.wait(lk, [&] { return k.armed || k.stop; });
    if (k.stop) return;
    for (;;) {
      std::shared_ptr<Session> s;
      {
        std::lock_guard g(mu_);
        if (cur_ && cur_->live()) s = cur_;
      }
      if (!s) {
        k.armed = false;
        break;
      }
      std::uint64_t seen = s->rpc_count();
      if (k.cv.wait_for(lk, opts_.release_delay, [&] { return k.stop; })) return;
      if (!s->live()) continue;
      if (!s->has_pending()) {
        // Nothing queued, whatever the calls did (a busy client's flusher woke every
        // release_delay with an empty queue; a review). A release queued after this check
        // kicks again (it takes k.mu after us).
        k.armed = false;
        break;
      }
      if (s->rpc_count() != seen) continue;  // calls are flowing: they carry the releases
      lk.unlock();
      bool failed = false;
      bool gone = false;
      try {
        s->flush_releases();
      } catch (...) {
        failed = true;
        // The owner is gone or the session ended: its end released them.
        gone = !s->live() || !s->attach_alive();
      }
      s.reset();
      lk.lock();
      if (gone) {
        backoff = {};
        k.armed = false;
        break;
      }
      if (!failed) {
        backoff = {};
        continue;
      }
      // The ids are queued again: send them after a pause (a call may carry them first).
      backoff = std::min<std::chrono::microseconds>(
          std::max<std::chrono::microseconds>({2 * backoff, opts_.release_delay, std::chrono::milliseconds(10)}),
          std::chrono::seconds(1));
      if (k.cv.wait_for(lk, backoff, [&] { return k.stop; })) return;
    }
  }
}

// -- fork ----------------------------------------------------------------------------------

void ClientImpl::fork_prepare() noexcept {
  kicker_->mu.lock();
  mu_.lock();
  // (Its sessions' locks are taken next, with every other session's: Session::fork_prepare_all.)
}

void ClientImpl::fork_parent() noexcept {
  mu_.unlock();
  kicker_->mu.unlock();
}

void ClientImpl::fork_child() noexcept {
  // Every session, this one too, is forked already (Session::fork_child_all): its
  // connections' copies here are closed.
  std::shared_ptr<Session> s = std::move(cur_);
  // The flusher thread does not exist here: forget it; the next attach starts one.
  flusher_running_ = false;
  mu_.unlock();
  kicker_->mu.unlock();
  // A condition variable a parent thread was waiting on at fork() (the flusher's, a
  // session's) keeps that phantom waiter here: signalling it can block, and so can
  // destroying it (glibc waits for its waiters). So the child never touches them again:
  // it keeps the inherited kicker and session forever (a few hundred bytes; the session's
  // mappings stay for its holders anyway) and starts with a fresh kicker.
  keep_forever(std::move(kicker_));
  try {
    kicker_ = std::make_shared<ReleaseKicker>();
  } catch (...) {
    kicker_.reset();  // out of memory: renew() fails cleanly instead
  }
  if (s) keep_forever(std::move(s));
}

// -- calls ----------------------------------------------------------------------------------

MemHolder ClientImpl::make_holder(const std::shared_ptr<Session>& s, std::string_view key, const GetResponse& r) {
  if (!r.has_holder || !s->ro.contains(r.offset, r.len)) {
    if (r.has_holder) s->queue_release(r.holder_id);
    throw Error(ErrorCode::INTERNAL, "Get(" + quote(key) + ") returned holder " + std::to_string(r.holder_id) + " at offset " +
                                         std::to_string(r.offset) + " len " + std::to_string(r.len) + ", outside the " +
                                         std::to_string(s->ro.size()) + "-byte segment");
  }
  return MemHolder(s, r.holder_id, s->ro.data() + r.offset, static_cast<std::size_t>(r.len), r.source, r.remote, r.put_id);
}

MemHolder ClientImpl::get(std::string_view key) {
  validate_key(key);
  return run([&](std::shared_ptr<Session>& s) {
    GetResponse r;
    s->call("Get", [&](Writer& w, const SessionRef& ref) { write_key_request(w, ref, key); }, r);
    if (r.code != static_cast<std::int32_t>(wire::Code::OK)) raise_for(r.code, r.message);
    return make_holder(s, key, r);
  });
}

bool ClientImpl::flag_call(std::string_view method, std::string_view key) {
  validate_key(key);
  return run([&](std::shared_ptr<Session>& s) {
    FlagResponse r;
    s->call(method, [&](Writer& w, const SessionRef& ref) { write_key_request(w, ref, key); }, r);
    if (r.code == static_cast<std::int32_t>(wire::Code::KEY_NOT_FOUND)) return false;
    raise_for(r.code, r.message);
    return r.flag;
  });
}

void ClientImpl::abort(const std::shared_ptr<Session>& s, std::span<const PutEndItem> puts) noexcept {
  try {
    if (puts.size() == 1) {
      PlainResponse r;
      s->call("PutAbort", [&](Writer& w, const SessionRef& ref) { write_put_ref(w, ref, puts[0].key, puts[0].put_id, nullptr); }, r);
    } else if (!puts.empty()) {
      BatchResponse<PlainResponse> r;
      s->call("BatchPutAbort", [&](Writer& w, const SessionRef& ref) { write_batch_put_end(w, ref, puts); }, r);
    }
  } catch (...) {
    // Best effort: the owner revokes them when the session ends or their TTL passes.
  }
}

void ClientImpl::flush() {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lk(mu_);
    s = cur_;
  }
  if (!s || !s->live()) return;  // (with nothing queued it still waits for calls carrying releases)
  try {
    s->flush_releases();
  } catch (const Broken&) {
    // The owner is gone; its end of the session released them.
  } catch (const Stale&) {
  }
  // (Any other failure is the caller's: Unavailable when calls carrying releases failed
  // twice, as Go's Flush and Python's flush() report it; it was swallowed.)
}

std::int64_t ClientImpl::release_errors() const noexcept {
  std::lock_guard lk(mu_);
  return retired_release_errors_ + (cur_ ? cur_->release_errors() : 0);
}

}  // namespace fluxkv::detail
