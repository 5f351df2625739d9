// Put, get, exists, remove and the batch forms against a real owner, byte for byte.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "shared_owner.hpp"
#include "testing.hpp"

using namespace fkvtest;

namespace {
// 1 byte ... 16 MiB + 1, around the page and MiB boundaries.
const std::size_t kSizes[] = {1, 2, 7, 4095, 4096, 4097, 65536, (1u << 20) - 1, 1u << 20, (1u << 20) + 1,
                              (4u << 20) + 3, 16u << 20, (16u << 20) + 1};

void sizes_roundtrip(fluxkv::Client& c, const std::string& prefix) {
  std::uint64_t seed = 1;
  for (std::size_t n : kSizes) {
    std::string key = prefix + "/put/" + std::to_string(n);
    auto v = pattern(seed++, n);
    c.put(key, v.data(), v.size());
    fluxkv::MemHolder h = c.get(key);
    CHECK_EQ(h.size(), n);
    CHECK(same(h, v));
    CHECK_EQ(h.source(), std::string_view("memory"));
    CHECK(!h.remote());

    // put_with writes in place; get_into copies out.
    std::string key2 = prefix + "/with/" + std::to_string(n);
    auto w = pattern(seed++, n);
    std::int64_t put_id = c.put_with(key2, n, [&](std::span<std::byte> dst) {
      CHECK_EQ(dst.size(), n);
      std::memcpy(dst.data(), w.data(), n);
    });
    std::vector<std::byte> out(n + 5);
    CHECK_EQ(c.get_into(key2, out), n);
    CHECK(std::memcmp(w.data(), out.data(), n) == 0);
    fluxkv::MemHolder h2 = c.get(key2);
    CHECK_EQ(h2.put_id(), put_id);
    c.remove(key);
    c.remove(key2);
  }
}
}  // namespace

TEST(sizes_1B_to_16MiB_plus_1_byte_exact) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  CHECK(!c.isolated());
  sizes_roundtrip(c, "sizes");
  CHECK_EQ(c.release_errors(), 0);
}

TEST(sizes_under_client_isolation_stream_through_the_put_area) {
  auto c = fluxkv::Client::connect(isolated_owner().socket());
  CHECK(c.isolated());
  sizes_roundtrip(c, "iso");
  CHECK_EQ(c.release_errors(), 0);
}

TEST(exists_remove_and_reject_if_exists) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  auto v = pattern(7, 100);
  CHECK(!c.exists("basic/x"));
  CHECK(!c.remove("basic/x"));
  c.put("basic/x", v);
  CHECK(c.exists("basic/x"));
  CHECK_THROWS(fluxkv::AlreadyExists, c.put("basic/x", v, fluxkv::PutOptions{true}));
  CHECK(c.remove("basic/x"));
  CHECK(!c.exists("basic/x"));
  CHECK_THROWS(fluxkv::KeyNotFound, c.get("basic/x"));
  c.put("basic/x", v, fluxkv::PutOptions{true});  // absent again: accepted
  CHECK(c.remove("basic/x"));
}

TEST(batch_forms) {
  for (Owner* o : {&plain_owner(), &isolated_owner()}) {
    auto c = fluxkv::Client::connect(o->socket());
    std::vector<std::string> keys;
    std::vector<std::vector<std::byte>> vals;
    // Small values share a wave; the 3 MiB one exceeds the isolated owner's put area.
    std::size_t sizes[] = {10, 1000, 3u << 20, 5000, 1u << 20};
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      keys.push_back("batch/" + std::to_string(i));
      vals.push_back(pattern(100 + i, sizes[i]));
    }
    std::vector<fluxkv::PutItem> items;
    for (std::size_t i = 0; i < keys.size(); ++i) items.push_back({keys[i], vals[i]});
    c.batch_put(items);
    std::vector<std::string_view> ks(keys.begin(), keys.end());
    ks.push_back("batch/missing");
    auto hs = c.batch_get(ks);
    CHECK_EQ(hs.size(), ks.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      CHECK(hs[i].has_value());
      CHECK(same(*hs[i], vals[i]));
    }
    CHECK(!hs.back().has_value());
    auto ex = c.batch_exists(ks);
    CHECK_EQ(std::count(ex.begin(), ex.end(), true), static_cast<long>(keys.size()));
    CHECK(!ex.back());
    CHECK_THROWS(fluxkv::AlreadyExists, c.batch_put(items, fluxkv::PutOptions{true}));
    auto del = c.batch_remove(ks);
    CHECK_EQ(std::count(del.begin(), del.end(), true), static_cast<long>(keys.size()));
    // The holders still show the removed values.
    for (std::size_t i = 0; i < keys.size(); ++i) CHECK(same(*hs[i], vals[i]));
  }
}

TEST(stat_json_has_the_status_shape) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  std::string j = c.stat_json();
  for (const char* f : {"\"node_id\"", "\"keys\"", "\"client_holders\"", "\"clients\"", "\"members\"", "\"memory_segment\"",
                        "\"capacity_bytes\"", "\"used_bytes\"", "\"kv_ssd\"", "\"generation\"", "\"alive\": true"})
    CHECK(j.find(f) != std::string::npos);
  CHECK_EQ(json_number(j, "capacity_bytes") > 0, true);
  CHECK(json_number(j, "clients") >= 1);
}

TEST(connect_resolves_env_default_and_directory) {
  const std::string sock = plain_owner().socket();
  ::setenv("FLUXKV_SOCKET", sock.c_str(), 1);
  CHECK_EQ(fluxkv::default_socket(), sock);
  {
    auto c = fluxkv::Client::connect("");
    CHECK_EQ(c.socket_path(), sock);
    CHECK(!c.node_id().empty());
  }
  ::unsetenv("FLUXKV_SOCKET");
  ::setenv("XDG_RUNTIME_DIR", "/nonexistent-run", 1);  // no node of this user's there
  CHECK_EQ(fluxkv::default_socket(), std::string("/run/fluxkv/fluxkv.sock"));
  {
    // plain_owner's socket is DIR/fluxkv.sock: as $XDG_RUNTIME_DIR/fluxkv/fluxkv.sock
    // when DIR's parent is the runtime dir and DIR is named fluxkv; else a link to it.
    char tmpl[] = "/tmp/fluxkv-xdg-XXXXXX";
    const char* runtime = ::mkdtemp(tmpl);
    CHECK(runtime != nullptr);
    const std::string dir = std::string(runtime) + "/fluxkv";
    CHECK_EQ(::mkdir(dir.c_str(), 0700), 0);
    const std::string own = dir + "/fluxkv.sock";
    CHECK_EQ(::symlink(sock.c_str(), own.c_str()), 0);
    ::setenv("XDG_RUNTIME_DIR", runtime, 1);
    CHECK_EQ(fluxkv::default_socket(), own);
    ::unlink(own.c_str());
    ::rmdir(dir.c_str());
    ::rmdir(runtime);
  }
  ::unsetenv("XDG_RUNTIME_DIR");
  CHECK_EQ(fluxkv::default_socket(), std::string("/run/fluxkv/fluxkv.sock"));
  auto c = fluxkv::Client::connect(plain_owner().dir());  // a directory: DIR/fluxkv.sock
  CHECK_EQ(c.socket_path(), sock);
}

// The largest durations an engine may pass to mean "no limit" work: every wait built on
// them (the release flusher's delay, a flush's wait for releases in flight, a call's wait
// for a flush) stays in range instead of overflowing std::chrono's nanoseconds (undefined
// behaviour: UBSan halts the ASan build; a wrapped wait returns at once).
TEST(huge_timeouts_and_release_delay_do_not_overflow) {
  fluxkv::Options o;
  o.timeout = std::chrono::milliseconds::max();
  o.attach_timeout = std::chrono::milliseconds::max();
  o.release_delay = std::chrono::microseconds::max();
  auto c = fluxkv::Client::connect(plain_owner().socket(), o);
  auto v = pattern(11, 4096);
  c.put("basic/huge-timeouts", v);
  {
    fluxkv::MemHolder h = c.get("basic/huge-timeouts");
    CHECK(same(h, v));
  }
  c.flush();  // sends the queued release and waits for releases in flight
  CHECK(c.stat_json().find("\"client_holders\": 0") != std::string::npos);
  CHECK(c.remove("basic/huge-timeouts"));
  CHECK_EQ(c.release_errors(), 0);
}
