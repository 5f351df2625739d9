// The C ABI: the C example against both owners, its zero-copy put under client isolation
// (the put area, or a scratch buffer streamed through it) and without it (the segment).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "fluxkv/fluxkv.h"
#include "shared_owner.hpp"
#include "testing.hpp"

using namespace fkvtest;

namespace {

int run_example(const std::string& sock, std::string& out) {
  std::string cmd = std::string(FLUXKV_EXAMPLE) + " " + sock + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return -1;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
  int status = ::pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void c_zero_copy_put(const std::string& sock) {
  fluxkv_error err;
  fluxkv_client* c = fluxkv_connect(sock.c_str(), &err);
  if (c == nullptr) fail(std::string("fluxkv_connect: ") + err.message, __FILE__, __LINE__);
  for (std::size_t n : {std::size_t{1}, std::size_t{1} << 20, (std::size_t{3} << 20) + 7}) {
    auto v = pattern(n, n);
    std::string key = "cabi/" + std::to_string(n);
    fluxkv_pending_put* p = nullptr;
    fluxkv_span span{};
    CHECK_EQ(fluxkv_put_begin(c, key.data(), key.size(), n, 0, &p, &span, &err), 0);
    CHECK_EQ(span.len, n);
    std::memcpy(span.data, v.data(), n);
    CHECK_EQ(fluxkv_put_commit(p, &err), 0);
    fluxkv_holder* h = nullptr;
    CHECK_EQ(fluxkv_get(c, key.data(), key.size(), &h, &err), 1);
    CHECK_EQ(fluxkv_holder_size(h), n);
    CHECK(std::memcmp(fluxkv_holder_data(h), v.data(), n) == 0);
    CHECK_EQ(std::string(fluxkv_holder_source(h)), std::string("memory"));
    fluxkv_holder_release(h);
    // An aborted put publishes nothing.
    CHECK_EQ(fluxkv_put_begin(c, "cabi/aborted", 12, n, 0, &p, &span, &err), 0);
    fluxkv_put_abort(p);
    CHECK_EQ(fluxkv_exists(c, "cabi/aborted", 12, &err), 0);
    CHECK_EQ(fluxkv_put_begin(c, key.data(), key.size(), n, FLUXKV_PUT_REJECT_IF_EXISTS, &p, &span, &err), -1);
    CHECK_EQ(err.code, FLUXKV_ALREADY_EXISTS);
    CHECK(p == nullptr);
    CHECK_EQ(fluxkv_delete(c, key.data(), key.size(), &err), 1);
  }
  CHECK_EQ(fluxkv_put_begin(c, "", 0, 10, 0, nullptr, nullptr, &err), -1);
  CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
  fluxkv_close(c);
}

}  // namespace

TEST(c_example_runs_against_both_owners) {
  for (Owner* o : {&plain_owner(), &isolated_owner()}) {
    std::string out;
    int rc = run_example(o->socket(), out);
    if (rc != 0) fail("fluxkv_example exited " + std::to_string(rc) + ":\n" + out, __FILE__, __LINE__);
    CHECK(out.find("ok") != std::string::npos);
  }
}

TEST(c_abi_zero_copy_put) {
  c_zero_copy_put(plain_owner().socket());
  c_zero_copy_put(isolated_owner().socket());
}

TEST(c_abi_errors_and_version) {
  CHECK_EQ(fluxkv_abi_version(), FLUXKV_ABI_VERSION);
  fluxkv_error err;
  CHECK(fluxkv_connect("/tmp/fkv-cpp-no-such-dir/fluxkv.sock", &err) == nullptr);
  CHECK_EQ(err.code, FLUXKV_UNAVAILABLE);
  CHECK(std::strlen(err.message) > 0);
  CHECK(fluxkv_connect("/tmp/fkv-cpp-no-such-dir/fluxkv.sock", nullptr) == nullptr);  // err may be NULL
  fluxkv_client* c = fluxkv_connect(plain_owner().socket().c_str(), &err);
  CHECK(c != nullptr);
  fluxkv_holder* h = reinterpret_cast<fluxkv_holder*>(1);
  CHECK_EQ(fluxkv_get(c, "cabi/absent", 11, &h, &err), 0);
  CHECK(h == nullptr);
  CHECK_EQ(err.code, FLUXKV_OK);
  CHECK_EQ(fluxkv_put(c, "", 0, "x", 1, &err), -1);
  CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
  CHECK_EQ(fluxkv_put(c, "cabi/x", 6, "x", 1, nullptr), 0);
  CHECK_EQ(fluxkv_put_flags(c, "cabi/x", 6, "y", 1, FLUXKV_PUT_REJECT_IF_EXISTS, &err), -1);
  CHECK_EQ(err.code, FLUXKV_ALREADY_EXISTS);
  CHECK_EQ(fluxkv_get(c, "cabi/x", 6, &h, &err), 1);
  CHECK_EQ(fluxkv_delete(c, "cabi/x", 6, &err), 1);
  CHECK_EQ(fluxkv_delete(c, "cabi/x", 6, &err), 0);
  char* st = fluxkv_stat_json(c, &err);
  CHECK(st != nullptr);
  CHECK_EQ(json_number(st, "client_holders"), 1);
  fluxkv_free_string(st);
  fluxkv_close(c);
  CHECK_EQ(*static_cast<const char*>(fluxkv_holder_data(h)), 'x');  // valid after close
  fluxkv_holder_release(h);
}

// Flags this library does not define are refused, not ignored; a length of SIZE_MAX is
// refused and named as such, not as a signed -1. Nothing is published by either.
TEST(c_abi_refuses_unknown_flags_and_huge_lengths) {
  fluxkv_error err;
  fluxkv_client* c = fluxkv_connect(plain_owner().socket().c_str(), &err);
  if (c == nullptr) fail(std::string("fluxkv_connect: ") + err.message, __FILE__, __LINE__);
  for (unsigned flags : {2u, 0x80000000u, FLUXKV_PUT_REJECT_IF_EXISTS | 4u}) {
    fluxkv_pending_put* p = reinterpret_cast<fluxkv_pending_put*>(1);
    fluxkv_span span{};
    CHECK_EQ(fluxkv_put_begin(c, "cabi/flags", 10, 8, flags, &p, &span, &err), -1);
    CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
    CHECK(p == nullptr);
    CHECK(std::string(err.message).find("unknown put flags") != std::string::npos);
    CHECK_EQ(fluxkv_put_flags(c, "cabi/flags", 10, "12345678", 8, flags, &err), -1);
    CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
    CHECK(std::string(err.message).find("unknown put flags") != std::string::npos);
  }
  CHECK_EQ(fluxkv_exists(c, "cabi/flags", 10, &err), 0);
  // The defined flag still works through both.
  CHECK_EQ(fluxkv_put_flags(c, "cabi/flags", 10, "12345678", 8, FLUXKV_PUT_REJECT_IF_EXISTS, &err), 0);
  CHECK_EQ(fluxkv_delete(c, "cabi/flags", 10, &err), 1);

  for (std::size_t n : {SIZE_MAX, SIZE_MAX / 2 + 1}) {
    fluxkv_pending_put* p = nullptr;
    fluxkv_span span{};
    CHECK_EQ(fluxkv_put_begin(c, "cabi/huge", 9, n, 0, &p, &span, &err), -1);
    CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
    CHECK(p == nullptr);
    std::string msg = err.message;
    if (msg.find("value length " + std::to_string(n) + " ") == std::string::npos || msg.find("-1") != std::string::npos)
      fail("put_begin of " + std::to_string(n) + " bytes: " + msg, __FILE__, __LINE__);
    CHECK_EQ(msg.find("SIZE_MAX") != std::string::npos, n == SIZE_MAX);
    // fluxkv_put refuses it before reading a byte of data.
    CHECK_EQ(fluxkv_put(c, "cabi/huge", 9, "x", n, &err), -1);
    CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
    CHECK(std::string(err.message).find(std::to_string(n)) != std::string::npos);
  }
  CHECK_EQ(fluxkv_exists(c, "cabi/huge", 9, &err), 0);
  fluxkv_close(c);
}

// A failed fluxkv_put_begin leaves no stale pointer behind: *put is NULL and *span is
// {NULL, 0}, so a caller that writes through span without checking the return (or checks
// span.data) cannot scribble over memory that was never reserved.
TEST(c_abi_failed_put_begin_clears_the_span) {
  fluxkv_error err;
  fluxkv_client* c = fluxkv_connect(plain_owner().socket().c_str(), &err);
  if (c == nullptr) fail(std::string("fluxkv_connect: ") + err.message, __FILE__, __LINE__);
  char junk[1];
  auto check = [&](const char* key, size_t key_len, size_t len, unsigned flags) {
    fluxkv_pending_put* p = reinterpret_cast<fluxkv_pending_put*>(1);
    fluxkv_span span{junk, 12345};
    CHECK_EQ(fluxkv_put_begin(c, key, key_len, len, flags, &p, &span, &err), -1);
    CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
    CHECK(p == nullptr);
    CHECK(span.data == nullptr);
    CHECK_EQ(span.len, 0u);
  };
  check("cabi/span", 9, 0, 0);          // an empty value
  check("cabi/span", 9, SIZE_MAX, 0);   // longer than the segment
  check("", 0, 8, 0);                   // an empty key
  check("cabi/span", 9, 8, 2u);         // an unknown flag
  fluxkv_close(c);
}
