// Error codes map to the right exception classes: from the owner, from the client's own
// checks, and from the system (no owner, a socket that refuses us).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

#include "shared_owner.hpp"
#include "testing.hpp"

using namespace fkvtest;

TEST(every_code_maps_to_its_exception) {
  using fluxkv::ErrorCode;
  CHECK_THROWS(fluxkv::KeyNotFound, fluxkv::throw_error(ErrorCode::KEY_NOT_FOUND, "x"));
  CHECK_THROWS(fluxkv::NoSpace, fluxkv::throw_error(ErrorCode::NO_SPACE, "x"));
  CHECK_THROWS(fluxkv::InvalidArgument, fluxkv::throw_error(ErrorCode::INVALID_ARGUMENT, "x"));
  CHECK_THROWS(fluxkv::AlreadyExists, fluxkv::throw_error(ErrorCode::ALREADY_EXISTS, "x"));
  CHECK_THROWS(fluxkv::Unavailable, fluxkv::throw_error(ErrorCode::UNAVAILABLE, "x"));
  CHECK_THROWS(fluxkv::PermissionDenied, fluxkv::throw_error(ErrorCode::PERMISSION_DENIED, "x"));
  try {
    fluxkv::throw_error(ErrorCode::BUSY, "busy now");
  } catch (const fluxkv::KeyNotFound&) {
    CHECK(!"BUSY must not be KeyNotFound");
  } catch (const fluxkv::Error& e) {
    CHECK(e.code() == ErrorCode::BUSY);
    CHECK_EQ(std::string(e.what()), std::string("BUSY: busy now"));
    CHECK_EQ(e.message(), std::string("busy now"));
  }
}

TEST(owner_and_client_errors) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  try {
    c.get("errors/absent");
    CHECK(!"get of an absent key must throw");
  } catch (const fluxkv::KeyNotFound& e) {
    CHECK(e.code() == fluxkv::ErrorCode::KEY_NOT_FOUND);
  }
  auto v = pattern(1, 10);
  CHECK_THROWS(fluxkv::InvalidArgument, c.put("", v));
  CHECK_THROWS(fluxkv::InvalidArgument, c.put(std::string(4097, 'k'), v));
  c.put(std::string(4096, 'k'), v);  // MAX_KEY_BYTES exactly
  CHECK(c.remove(std::string(4096, 'k')));
  CHECK_THROWS(fluxkv::InvalidArgument, c.put("errors/empty", nullptr, 0));
  CHECK_THROWS(fluxkv::InvalidArgument, c.put_with("errors/huge", static_cast<std::size_t>(c.segment_size()) + 1,
                                               [](std::span<std::byte>) {}));
  try {  // SIZE_MAX is named as given, not as a signed -1
    c.put_with("errors/huge", SIZE_MAX, [](std::span<std::byte>) {});
    CHECK(!"put_with of SIZE_MAX bytes must throw");
  } catch (const fluxkv::InvalidArgument& e) {
    CHECK(std::string(e.what()).find("value length 18446744073709551615 (SIZE_MAX)") != std::string::npos);
  }
  c.put("errors/small", v);
  std::vector<std::byte> tiny(5);
  CHECK_THROWS(fluxkv::InvalidArgument, c.get_into("errors/small", tiny));
  CHECK_THROWS(fluxkv::AlreadyExists, c.put("errors/small", v, fluxkv::PutOptions{true}));
  // A fill that throws aborts the put: nothing is published, the exception propagates.
  CHECK_THROWS(std::runtime_error,
               c.put_with("errors/aborted", 100, [](std::span<std::byte>) { throw std::runtime_error("fill failed"); }));
  CHECK(!c.exists("errors/aborted"));
  c.remove("errors/small");
}

TEST(no_owner_is_unavailable) {
  try {
    fluxkv::Client::connect("/tmp/fkv-cpp-no-such-dir/fluxkv.sock");
    CHECK(!"connect must fail");
  } catch (const fluxkv::Unavailable& e) {
    CHECK(e.code() == fluxkv::ErrorCode::UNAVAILABLE);
    CHECK(e.sys_errno() == ENOENT);
  }
}

TEST(refused_socket_is_permission_denied) {
  // As root the socket's permissions admit everyone: drop to nobody in a child.
  const std::string sock = plain_owner().socket();
  pid_t pid = ::fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(2);
    try {
      fluxkv::Client::connect(sock);
    } catch (const fluxkv::PermissionDenied&) {
      ::_exit(0);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(4);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK_EQ(WEXITSTATUS(status), 0);
}

TEST(full_cache_is_no_space) {
  Owner o({"--alloc-wait", "200ms", "--transfer-reserve", "off"}, "16MiB");
  auto c = fluxkv::Client::connect(o.socket());
  auto v = pattern(2, 1 << 20);
  std::vector<fluxkv::MemHolder> pinned;  // held values cannot be evicted
  bool no_space = false;
  for (int i = 0; i < 40 && !no_space; ++i) {
    std::string k = "full/" + std::to_string(i);
    try {
      c.put(k, v);
      pinned.push_back(c.get(k));
    } catch (const fluxkv::NoSpace& e) {
      CHECK(e.code() == fluxkv::ErrorCode::NO_SPACE);
      no_space = true;
    }
  }
  CHECK(no_space);
  CHECK(pinned.size() >= 8);
}
