// Holder lifetimes: a holder outlives an overwrite and a delete of its key, its client's
// close, and its owner's restart; a process killed with -9 while holding frees its holders;
// released holders' acks reach the owner without another call.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "session.hpp"
#include "shared_owner.hpp"
#include "testing.hpp"

using namespace fkvtest;

namespace {
// The owner's holders of every client (client_holders counts the caller's own only).
std::int64_t holders_of(fluxkv::Client& c) { return json_number(c.stat_json(), "holders"); }

// The owner's holders once the previous tests' releases have landed (they reach the master
// asynchronously): none, since no test keeps a holder past its end.
std::int64_t settled_holders(fluxkv::Client& observer) {
  if (!eventually([&] { return holders_of(observer) == 0; })) fail("holders of earlier tests never went", __FILE__, __LINE__);
  return 0;
}

// Kills and reaps a child process when the test leaves, failed or not.
struct KillOnExit {
  pid_t pid;
  int status = 0;
  bool reaped = false;
  int kill_and_wait() {
    if (!reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      reaped = true;
    }
    return status;
  }
  ~KillOnExit() { kill_and_wait(); }
};
std::int64_t used_of(fluxkv::Client& c) { return json_number(c.stat_json(), "used_bytes"); }

// Holds the first Release call made while it is set until the gate opens (Session's test
// hook): a flush in flight, as a slow owner or a busy scheduler would keep it.
struct ReleaseGate {
  static inline std::mutex mu;
  static inline std::condition_variable cv;
  static inline bool entered = false, open = false;
  static void hook(std::string_view method) {
    std::unique_lock lk(mu);
    if (method != "Release" || entered) return;
    entered = true;
    cv.notify_all();
    cv.wait_for(lk, std::chrono::seconds(10), [] { return open; });
  }
  ReleaseGate() {
    std::lock_guard lk(mu);
    entered = open = false;
    fluxkv::detail::Session::call_hook_for_tests.store(&hook);
  }
  bool wait_entered() {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(10), [] { return entered; });
  }
  void release() {
    std::lock_guard lk(mu);
    open = true;
    cv.notify_all();
  }
  ~ReleaseGate() {
    release();
    fluxkv::detail::Session::call_hook_for_tests.store(nullptr);
  }
};
}  // namespace

TEST(holder_outlives_overwrite_and_delete) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  auto v1 = pattern(1, 1 << 20);
  auto v2 = pattern(2, 1 << 20);
  c.put("hold/k", v1);
  fluxkv::MemHolder h1 = c.get("hold/k");
  c.put("hold/k", v2);
  fluxkv::MemHolder h2 = c.get("hold/k");
  CHECK(same(h1, v1));
  CHECK(same(h2, v2));
  CHECK(h1.put_id() != h2.put_id());
  CHECK(c.remove("hold/k"));
  CHECK_THROWS(fluxkv::KeyNotFound, c.get("hold/k"));
  CHECK(same(h1, v1));
  CHECK(same(h2, v2));
  fluxkv::MemHolder moved = std::move(h1);
  CHECK(!h1);
  CHECK(same(moved, v1));
  moved.release();
  CHECK(!moved);
  moved.release();  // idempotent
}

TEST(released_holders_reach_the_owner_without_another_call) {
  auto observer = fluxkv::Client::connect(plain_owner().socket());
  std::int64_t base = settled_holders(observer);
  auto c = fluxkv::Client::connect(plain_owner().socket());
  {
    // The owner counts one holding per key, however many holders share it.
    std::vector<fluxkv::MemHolder> hs;
    for (int i = 0; i < 10; ++i) {
      c.put("hold/flush/" + std::to_string(i), pattern(3, 4096));
      hs.push_back(c.get("hold/flush/" + std::to_string(i)));
      hs.push_back(c.get("hold/flush/" + std::to_string(i)));
    }
    CHECK_EQ(holders_of(observer), base + 10);
    CHECK_EQ(json_number(c.stat_json(), "client_holders"), 20);
  }
  // No call on c after the releases: its flusher sends them after the release delay.
  CHECK(eventually([&] { return holders_of(observer) == base; }));
  CHECK_EQ(c.release_errors(), 0);
  for (int i = 0; i < 10; ++i) c.remove("hold/flush/" + std::to_string(i));
}

namespace {
// Fails the first Release call made while it is set before any byte leaves (Session's test
// hook: a broken connection, which a real owner does not produce on demand) and counts the
// Release calls.
struct FailFirstRelease {
  static inline std::atomic<int> calls{0};
  static void hook(std::string_view method) {
    if (method == "Release" && calls.fetch_add(1) == 0)
      throw fluxkv::detail::Broken("Release: connection broken (fault injected by a test)", false, false);
  }
  FailFirstRelease() {
    calls = 0;
    fluxkv::detail::Session::call_hook_for_tests.store(&hook);
  }
  ~FailFirstRelease() { fluxkv::detail::Session::call_hook_for_tests.store(nullptr); }
};
}  // namespace

// The flusher's Release fails (the session lives on): the ids stay queued and the flusher
// sends them again on its own. Before, it stopped watching after the failure: an idle
// client left the owner holding them (and their bytes) until its next call.
TEST(failed_release_is_resent_without_another_call) {
  auto observer = fluxkv::Client::connect(plain_owner().socket());
  std::int64_t base = settled_holders(observer);
  auto c = fluxkv::Client::connect(plain_owner().socket());
  c.put("hold/resend", pattern(8, 4096));
  fluxkv::MemHolder h = c.get("hold/resend");
  CHECK_EQ(holders_of(observer), base + 1);
  {
    FailFirstRelease fault;
    h.release();  // no call on c after this: only its flusher can send the release
    CHECK(eventually([&] { return holders_of(observer) == base; }));
    CHECK(FailFirstRelease::calls.load() >= 2);  // the failed one, then the one that landed
  }
  CHECK_EQ(c.release_errors(), 0);
  c.remove("hold/resend");
}

TEST(holder_outlives_its_client) {
  auto v = pattern(4, 70000);
  fluxkv::MemHolder h;
  std::int64_t base;
  {
    auto observer = fluxkv::Client::connect(plain_owner().socket());
    base = settled_holders(observer);
    auto c = fluxkv::Client::connect(plain_owner().socket());
    c.put("hold/after-close", v);
    h = c.get("hold/after-close");
    c.close();
    c.close();  // idempotent
    CHECK_THROWS(fluxkv::Error, c.get("hold/after-close"));
    // The closed client's session lives on while a holder does: the bytes stay held.
    CHECK_EQ(holders_of(observer), base + 1);
    CHECK(same(h, v));
  }
  h.release();  // the last holder ends the session: the owner releases everything
  auto observer = fluxkv::Client::connect(plain_owner().socket());
  CHECK(eventually([&] { return holders_of(observer) == base; }));
  observer.remove("hold/after-close");
}

TEST(killed_process_frees_its_holders) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  std::int64_t base_holders = settled_holders(c);
  std::int64_t base_used = used_of(c);
  c.put("hold/kill", pattern(5, 1 << 20));
  int fds[2];
  CHECK(::pipe2(fds, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the tests
    ::dup2(fds[1], 1);
    std::string self = self_exe();
    std::string sock = plain_owner().socket();
    ::execl(self.c_str(), self.c_str(), "--hold", sock.c_str(), "hold/kill", "8", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  KillOnExit child{pid};
  ::close(fds[1]);
  char buf[64] = {};
  ssize_t n = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  bool ready = n > 0 && std::strncmp(buf, "ready 8", 7) == 0;
  if (ready) {
    CHECK(c.remove("hold/kill"));  // the child's holders keep the bytes
    CHECK_EQ(holders_of(c), base_holders + 1);  // one holding of the key, 8 holders in the child
    CHECK(used_of(c) > base_used);
  }
  int status = child.kill_and_wait();
  CHECK(ready);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  CHECK(eventually([&] { return holders_of(c) == base_holders && used_of(c) == base_used; }));
}

TEST(owner_restart_reattaches_and_old_holders_stay_readable) {
  Owner o({}, "64MiB");
  auto c = fluxkv::Client::connect(o.socket());
  auto v1 = pattern(6, 300000);
  c.put("restart/k", v1);
  fluxkv::MemHolder h = c.get("restart/k");
  std::int64_t gen = c.generation();
  CHECK_EQ(o.stop(), 0);
  o.start();
  CHECK(same(h, v1));  // its own mapping of the old segment
  // The first call finds the session gone, attaches again and retries.
  CHECK_THROWS(fluxkv::KeyNotFound, c.get("restart/k"));
  CHECK(c.generation() != gen);
  auto v2 = pattern(7, 300000);
  c.put("restart/k", v2);
  CHECK(same(c.get("restart/k"), v2));
  CHECK(same(h, v1));
  h.release();  // its session ended with the old owner: nothing to send
  CHECK_EQ(json_number(c.stat_json(), "client_holders"), 0);
  CHECK_EQ(c.release_errors(), 0);
}

// A call made while a flush's Release is in flight waits for it: on another connection it
// could reach the owner first and plan room (a get's target, a put) that those releases
// were about to free, and a full owner would evict a value for it.
TEST(calls_wait_for_a_release_flush_in_flight) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  auto v = pattern(5, 4096);
  c.put("hold/ordered", v);
  c.get("hold/ordered").release();  // queued
  std::atomic<bool> got{false};
  {
    ReleaseGate gate;
    std::thread flusher([&] { c.flush(); });
    CHECK(gate.wait_entered());
    std::thread reader([&] {
      fluxkv::MemHolder h = c.get("hold/ordered");
      got = same(h, v);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    bool early = got.load();
    gate.release();
    flusher.join();
    reader.join();
    CHECK(!early);  // the get went out while the Release was in flight
  }
  CHECK(got.load());
  CHECK_EQ(c.release_errors(), 0);
  c.remove("hold/ordered");
}
