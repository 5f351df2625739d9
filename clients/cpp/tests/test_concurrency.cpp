// Several threads on one client at once, and fork(): the child drops the inherited session
// and attaches again on first use while the parent goes on with its own.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <cstring>
#include <string>
#include <thread>

#include "rpc_conn.hpp"
#include "shared_owner.hpp"
#include "testing.hpp"

using namespace fkvtest;

TEST(threads_share_one_client) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  constexpr int kThreads = 8;
  constexpr int kRounds = 150;
  std::atomic<int> bad{0};
  std::atomic<int> errors{0};
  std::string first_error;
  std::mutex mu;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      try {
        std::vector<fluxkv::MemHolder> kept;  // releases come from many threads at once
        for (int i = 0; i < kRounds; ++i) {
          std::string k = "threads/" + std::to_string(t) + "/" + std::to_string(i % 7);
          std::size_t n = 1 + static_cast<std::size_t>((t * 7919 + i * 104729) % 200000);
          auto v = pattern(static_cast<std::uint64_t>(t * 1000 + i), n);
          if (i % 3 == 0) {
            c.put_with(k, n, [&](std::span<std::byte> dst) { std::memcpy(dst.data(), v.data(), n); });
          } else {
            c.put(k, v);
          }
          fluxkv::MemHolder h = c.get(k);
          if (!same(h, v)) bad++;
          if (!c.exists(k)) bad++;
          if (i % 5 == 0) kept.push_back(std::move(h));
          if (kept.size() > 4) kept.erase(kept.begin());
        }
      } catch (const std::exception& e) {
        errors++;
        std::lock_guard lk(mu);
        first_error = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  if (errors.load() != 0) fail("a thread failed: " + first_error, __FILE__, __LINE__);
  CHECK_EQ(bad.load(), 0);
  CHECK(eventually([&] { return json_number(c.stat_json(), "client_holders") == 0; }));
  CHECK_EQ(c.release_errors(), 0);
}

TEST(fork_child_attaches_again) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  auto v = pattern(9, 123456);
  c.put("fork/parent", v);
  fluxkv::MemHolder h = c.get("fork/parent");
  std::int64_t parent_client = json_number(c.stat_json(), "clients");
  pid_t pid = ::fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    int rc = 0;
    try {
      // The inherited session is dropped: this is a new attach, with its own holders.
      auto w = pattern(10, 65536);
      c.put("fork/child", w);
      fluxkv::MemHolder hc = c.get("fork/child");
      if (!same(hc, w)) rc = 10;
      fluxkv::MemHolder hp = c.get("fork/parent");
      if (!same(hp, v)) rc = 11;
      if (json_number(c.stat_json(), "clients") != parent_client + 1) rc = 12;
      h.release();  // the parent's holder: a no-op here, it must not release the parent's
    } catch (...) {
      rc = 13;
    }
    c.close();
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
  // The parent's session and holder are untouched by the child.
  CHECK(same(h, v));
  CHECK_EQ(json_number(c.stat_json(), "client_holders"), 1);
  CHECK(same(c.get("fork/child"), pattern(10, 65536)));
  h.release();
  CHECK(eventually([&] { return json_number(c.stat_json(), "client_holders") == 0; }));
  CHECK_EQ(c.release_errors(), 0);
}

namespace {

std::string owner_dir_for_fork;    // the owner's directory: its sockets are under it
std::atomic<int> fork_in_call_result{-1};

// How many of this process's file descriptors are connected to a socket of the owner.
int owner_sockets() {
  int n = 0;
  for (int fd = 3; fd < 4096; ++fd) {
    sockaddr_un a{};
    socklen_t len = sizeof a;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && a.sun_family == AF_UNIX &&
        std::string(a.sun_path).rfind(owner_dir_for_fork, 0) == 0)
      ++n;
  }
  return n;
}

// The drop-reply hook: forks while the Stat call's connection is in use (its request
// sent, its reply not read), then lets the call go on. The child exits 0 when it holds
// no socket of the owner.
bool fork_in_call(std::string_view method) {
  if (method != "Stat") return false;
  int before = owner_sockets();  // the attach connection and this call's, at least
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(owner_sockets() == 0 ? 0 : 20);
  int status = 0;
  ::waitpid(pid, &status, 0);
  fork_in_call_result = before >= 2 && WIFEXITED(status) ? WEXITSTATUS(status) : 30;
  return false;
}

}  // namespace

// A fork while another thread attaches (connected, its hello sent, the owner's reply not
// come) closes the child's copy of that attach connection: the session being built is
// known to the fork handlers from before its socket exists (the copy kept the owner's
// session, and its holders' bytes, until the child exited).
TEST(fork_child_closes_an_attach_in_progress) {
  char tmpl[] = "/tmp/fkv-attach-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::string path = dir + "/fluxkv.sock";
  int ls = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  CHECK(::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(ls, 4) == 0);
  fluxkv::Options o;
  o.attach_timeout = std::chrono::milliseconds(3000);
  std::thread t([&] {
    try {
      fluxkv::Client::connect(path, o);  // an owner that never answers: times out
    } catch (const fluxkv::Error&) {
    }
  });
  int s = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  CHECK(s >= 0);
  std::uint8_t head[4];
  CHECK(::recv(s, head, sizeof head, MSG_WAITALL) == 4);  // its hello: the client waits for the reply
  owner_dir_for_fork = dir;
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(owner_sockets() == 0 ? 0 : 20);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(s);  // the attach fails at once
  t.join();
  ::close(ls);
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);  // the child held no copy of the connection
}

// A connection a call of the parent is using at fork() is closed in the child, as idle
// ones are: else the child's copy kept the socket open after the parent closed it (a call
// that timed out), and the owner, never seeing the close, kept what the lost reply handed
// out while the child lived. The parent's call goes on.
TEST(fork_child_closes_connections_of_calls_in_flight) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  c.put("fork/busy", pattern(3, 100));
  owner_dir_for_fork = plain_owner().dir();
  fluxkv::detail::drop_reply_hook = &fork_in_call;
  std::string st = c.stat_json();
  fluxkv::detail::drop_reply_hook = nullptr;
  CHECK_EQ(fork_in_call_result.load(), 0);
  CHECK(json_number(st, "clients") >= 1);
}

// A session no client names any more (closed while a holder of it lives, or left by a
// destroyed client) keeps its attach connection until its last holder goes. A child
// forked meanwhile closes its copy at once: else the owner kept the session (and the
// holder's bytes) until the child exited, after the parent let go (a review).
TEST(fork_child_closes_sessions_it_does_not_know) {
  auto watcher = fluxkv::Client::connect(plain_owner().socket());
  watcher.put("fork/unknown", pattern(4, 4096));
  const std::int64_t base = json_number(watcher.stat_json(), "clients");
  for (bool destroy : {false, true}) {
    std::optional<fluxkv::Client> c(fluxkv::Client::connect(plain_owner().socket()));
    fluxkv::MemHolder h = c->get("fork/unknown");
    if (destroy) {
      c.reset();
    } else {
      c->close();
    }
    CHECK_EQ(json_number(watcher.stat_json(), "clients"), base + 1);
    int fds[2];
    CHECK(::pipe(fds) == 0);
    pid_t pid = ::fork();
    CHECK(pid >= 0);
    if (pid == 0) {  // waits for the parent's word, then exits
      ::close(fds[1]);
      char b;
      (void)!::read(fds[0], &b, 1);
      ::_exit(0);
    }
    ::close(fds[0]);
    h.release();
    bool gone = eventually([&] { return json_number(watcher.stat_json(), "clients") == base; });
    ::close(fds[1]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(gone);
  }
}
