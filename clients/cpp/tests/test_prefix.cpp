// Prefix lookups (Client::batch_exists_prefix, fluxkv_batch_exists_prefix): the count of
// leading keys present, chunks of MAX_BATCH sent only while every key so far was present,
// the pin checked before anything is sent; the wire encoding, and the count read from a
// prefix-aware owner's answer and from one that predates prefix lookups (every key
// answered, found 0: the path a live owner takes until it serves prefix lookups).
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "client_impl.hpp"
#include "fluxkv/fluxkv.h"
#include "shared_owner.hpp"
#include "testing.hpp"

using namespace fkvtest;
using namespace std::chrono_literals;
using fluxkv::detail::BatchExistsResponse;
using fluxkv::detail::FlagResponse;

namespace {

std::atomic<int> g_exists_calls{0};

// Counts BatchExists replies (rpc_conn.hpp's test hook; it drops nothing).
bool count_exists(std::string_view method) {
  if (method == "BatchExists") g_exists_calls.fetch_add(1);
  return false;
}

struct CountingCalls {
  CountingCalls() {
    g_exists_calls = 0;
    fluxkv::detail::drop_reply_hook = &count_exists;
  }
  ~CountingCalls() { fluxkv::detail::drop_reply_hook = nullptr; }
  int take() { return g_exists_calls.exchange(0); }
};

std::vector<std::string> names(const std::string& prefix, std::size_t n) {
  std::vector<std::string> v;
  for (std::size_t i = 0; i < n; ++i) v.push_back(prefix + "/" + std::to_string(i));
  return v;
}

void put_all(fluxkv::Client& c, const std::vector<std::string>& keys, std::size_t skip) {
  std::byte one[1] = {std::byte{1}};
  std::vector<fluxkv::PutItem> items;
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (i != skip) items.push_back({keys[i], one});
  c.batch_put(items);
}

std::vector<std::string_view> views(const std::vector<std::string>& v, std::size_t lo = 0, std::size_t hi = SIZE_MAX) {
  return {v.begin() + static_cast<long>(lo), v.begin() + static_cast<long>(std::min(hi, v.size()))};
}

FlagResponse flag(bool present, std::int32_t code = 0) {
  FlagResponse f;
  f.code = code;
  f.flag = present;
  return f;
}

}  // namespace

TEST(prefix_lookup_counts_the_leading_keys_present) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  auto keys = names("prefix", 10);
  put_all(c, keys, 5);  // keys[5] is the gap
  CountingCalls calls;
  CHECK_EQ(c.batch_exists_prefix(views(keys)), 5u);                  // a gap in the middle stops the count
  CHECK_EQ(c.batch_exists_prefix(views(keys, 0, 5)), 5u);            // all present
  CHECK_EQ(c.batch_exists_prefix(views(keys, 6)), 4u);               // all present after the gap
  CHECK_EQ(c.batch_exists_prefix(views(keys, 5)), 0u);               // first absent
  CHECK_EQ(c.batch_exists_prefix(views(keys, 5, 6)), 0u);            // one key, absent
  CHECK_EQ(c.batch_exists_prefix(views(keys), fluxkv::kMaxPin), 5u);  // pinned for the longest pin
  CHECK_EQ(c.batch_exists_prefix(views(keys, 0, 3), 1ms), 3u);
  CHECK_EQ(calls.take(), 7);
  CHECK_EQ(c.batch_exists_prefix({}), 0u);  // no keys: no call
  CHECK_EQ(calls.take(), 0);
  // Pinned keys stay readable; a plain batch_exists still answers every key.
  fluxkv::MemHolder h = c.get(keys[0]);
  CHECK_EQ(h.size(), 1u);
  auto ex = c.batch_exists(views(keys));
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK_EQ(static_cast<bool>(ex[i]), i != 5);
  CHECK_EQ(c.release_errors(), 0);
}

TEST(prefix_lookup_checks_the_pin_and_keys_before_sending) {
  auto c = fluxkv::Client::connect(plain_owner().socket());
  auto keys = names("prefix-pin", 1);
  put_all(c, keys, SIZE_MAX);
  CountingCalls calls;
  for (std::chrono::milliseconds pin : std::initializer_list<std::chrono::milliseconds>{-1ms, fluxkv::kMaxPin + 1ms, 1h})
    CHECK_THROWS(fluxkv::InvalidArgument, c.batch_exists_prefix(views(keys), pin));
  std::string long_key(static_cast<std::size_t>(fluxkv::wire::MAX_KEY_BYTES) + 1, 'k');
  std::vector<std::string_view> bad = {keys[0], ""};
  CHECK_THROWS(fluxkv::InvalidArgument, c.batch_exists_prefix(bad));
  bad = {long_key};
  CHECK_THROWS(fluxkv::InvalidArgument, c.batch_exists_prefix(bad));
  CHECK_EQ(calls.take(), 0);
  for (auto pin : {0ms, 1ms, fluxkv::kMaxPin}) CHECK_EQ(c.batch_exists_prefix(views(keys), pin), 1u);
  CHECK_EQ(calls.take(), 3);
}

TEST(prefix_lookup_over_max_batch_sends_a_chunk_only_after_a_full_one) {
  const auto chunk = static_cast<std::size_t>(fluxkv::wire::MAX_BATCH);
  auto c = fluxkv::Client::connect(plain_owner().socket());
  const std::size_t total = chunk + 50, gap = chunk + 10;  // keys[gap] is absent: in the second chunk
  auto keys = names("prefix-chunk", total);
  put_all(c, keys, gap);
  CountingCalls calls;
  CHECK_EQ(c.batch_exists_prefix(views(keys), 1000ms), gap);  // gap in the second chunk
  CHECK_EQ(calls.take(), 2);
  CHECK_EQ(c.batch_exists_prefix(views(keys, 0, gap)), gap);  // all present, two chunks
  CHECK_EQ(calls.take(), 2);
  CHECK_EQ(c.batch_exists_prefix(views(keys, 0, chunk)), chunk);  // exactly one chunk
  CHECK_EQ(calls.take(), 1);
  CHECK_EQ(c.batch_exists_prefix(views(keys, 10)), chunk);  // the second chunk starts with the gap
  CHECK_EQ(calls.take(), 2);
  auto with_gap = views(keys);
  with_gap.insert(with_gap.begin() + 1, "prefix-chunk/missing");
  CHECK_EQ(c.batch_exists_prefix(with_gap), 1u);  // a gap in the first chunk: the second is not sent
  CHECK_EQ(calls.take(), 1);
  with_gap.erase(with_gap.begin());
  CHECK_EQ(c.batch_exists_prefix(with_gap), 0u);  // first absent
  CHECK_EQ(calls.take(), 1);
}

TEST(c_abi_prefix_lookup) {
  fluxkv_error err;
  fluxkv_client* c = fluxkv_connect(plain_owner().socket().c_str(), &err);
  if (c == nullptr) fail(std::string("fluxkv_connect: ") + err.message, __FILE__, __LINE__);
  const char* keys[] = {"cabi-prefix/0", "cabi-prefix/1", "cabi-prefix/2", "cabi-prefix/3"};
  size_t lens[] = {13, 13, 13, 13};
  for (int i : {0, 1, 3}) CHECK_EQ(fluxkv_put(c, keys[i], lens[i], "v", 1, &err), 0);  // keys[2] absent
  size_t found = 99;
  CHECK_EQ(fluxkv_batch_exists_prefix(c, keys, lens, 4, 0, &found, &err), 0);
  CHECK_EQ(found, 2u);
  CHECK_EQ(err.code, FLUXKV_OK);
  CHECK_EQ(fluxkv_batch_exists_prefix(c, keys, lens, 2, FLUXKV_MAX_PIN_MS, &found, &err), 0);
  CHECK_EQ(found, 2u);
  CHECK_EQ(fluxkv_batch_exists_prefix(c, keys + 2, lens + 2, 2, 10, &found, &err), 0);
  CHECK_EQ(found, 0u);
  CHECK_EQ(fluxkv_batch_exists_prefix(c, nullptr, nullptr, 0, 0, &found, &err), 0);  // no keys
  CHECK_EQ(found, 0u);
  for (int64_t pin : {int64_t{-1}, int64_t{FLUXKV_MAX_PIN_MS} + 1}) {
    found = 99;
    CHECK_EQ(fluxkv_batch_exists_prefix(c, keys, lens, 4, pin, &found, &err), -1);
    CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
    CHECK_EQ(found, 0u);
  }
  CHECK_EQ(fluxkv_batch_exists_prefix(c, nullptr, lens, 4, 0, &found, &err), -1);
  CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
  CHECK_EQ(fluxkv_batch_exists_prefix(c, keys, nullptr, 4, 0, &found, &err), -1);
  CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
  CHECK_EQ(fluxkv_batch_exists_prefix(c, keys, lens, 4, 0, nullptr, &err), -1);
  CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
  CHECK_EQ(fluxkv_batch_exists_prefix(nullptr, keys, lens, 4, 0, &found, &err), -1);
  CHECK_EQ(err.code, FLUXKV_INVALID_ARGUMENT);
  const char* empty[] = {""};
  size_t zero[] = {0};
  CHECK_EQ(fluxkv_batch_exists_prefix(c, empty, zero, 1, 0, &found, nullptr), -1);  // err may be NULL
  fluxkv_close(c);
}

TEST(prefix_count_from_new_and_old_owners) {
  auto resp = [](std::vector<FlagResponse> results, std::int32_t found) {
    BatchExistsResponse r;
    r.code = 0;
    r.results = std::move(results);
    r.has_results = true;
    r.found = found;
    return r;
  };
  const std::int32_t unavailable = static_cast<std::int32_t>(fluxkv::wire::Code::UNAVAILABLE);
  using fluxkv::detail::prefix_count;
  // A prefix-aware owner: results stop after the first absent key, found counts.
  CHECK_EQ(prefix_count(resp({flag(true), flag(true), flag(false)}, 2), 5), 2u);
  CHECK_EQ(prefix_count(resp({flag(true), flag(true), flag(true)}, 3), 3), 3u);
  CHECK_EQ(prefix_count(resp({flag(false)}, 0), 4), 0u);
  CHECK_EQ(prefix_count(resp({flag(false)}, 0), 1), 0u);
  CHECK_EQ(prefix_count(resp({flag(true, unavailable)}, 0), 3), 0u);
  CHECK_EQ(prefix_count(resp({flag(true)}, 9), 1), 1u);  // found beyond the keys: clamped
  CHECK_EQ(prefix_count(resp({}, -1), 2), 0u);
  CHECK_EQ(prefix_count(resp({flag(true), flag(false), flag(true)}, 3), 3), 3u);  // found > 0 wins
  // An owner that predates prefix lookups: every key answered, found 0.
  CHECK_EQ(prefix_count(resp({flag(true), flag(true), flag(false), flag(true), flag(true)}, 0), 5), 2u);
  CHECK_EQ(prefix_count(resp({flag(true), flag(true), flag(true)}, 0), 3), 3u);
  CHECK_EQ(prefix_count(resp({flag(false), flag(true), flag(true)}, 0), 3), 0u);
  CHECK_EQ(prefix_count(resp({flag(true), flag(true, unavailable), flag(true)}, 0), 3), 1u);  // a failed key ends it
  CHECK_EQ(prefix_count(resp({flag(true), flag(true), flag(true)}, 0), 2), 2u);
}

TEST(prefix_request_and_response_encoding) {
  std::vector<std::uint8_t> buf;
  fluxkv::detail::Writer w(buf);
  std::string_view ks[] = {"a", "bc"};
  fluxkv::detail::write_batch_exists(w, fluxkv::detail::SessionRef{1, 2, 3, {}}, ks, true, 1234);
  using namespace fluxkv::detail;
  Reader r(buf.data(), buf.size());
  TType t;
  std::int16_t id;
  CHECK(r.field(t, id) && t == T_STRUCT && id == 1);  // session
  r.skip(t);
  CHECK(r.field(t, id) && t == T_LIST && id == 2);
  CHECK_EQ(r.list_begin(T_STRING), 2u);
  CHECK_EQ(r.string(), std::string("a"));
  CHECK_EQ(r.string(), std::string("bc"));
  CHECK(r.field(t, id) && t == T_BOOL && id == 3);
  CHECK(r.boolean());
  CHECK(r.field(t, id) && t == T_I64 && id == 4);
  CHECK_EQ(r.i64(), 1234);
  CHECK(!r.field(t, id));
  CHECK_EQ(r.remaining(), 0u);

  // { 1: OK, 3: [ {1: OK, 3: true}, {1: KEY_NOT_FOUND} ], 4: 1, 9: "a newer field" }
  std::vector<std::uint8_t> rb;
  Writer rw(rb);
  rw.field(T_I32, 1);
  rw.i32(0);
  rw.field(T_LIST, 3);
  rw.list_begin(T_STRUCT, 2);
  rw.field(T_I32, 1);
  rw.i32(0);
  rw.field(T_BOOL, 3);
  rw.boolean(true);
  rw.stop();
  rw.field(T_I32, 1);
  rw.i32(1);
  rw.stop();
  rw.field(T_I32, 4);
  rw.i32(1);
  rw.field(T_STRING, 9);
  rw.string("a newer field");
  rw.stop();
  BatchExistsResponse resp;
  Reader rr(rb.data(), rb.size());
  resp.read(rr);
  CHECK_EQ(resp.code, 0);
  CHECK(resp.has_results);
  CHECK_EQ(resp.results.size(), 2u);
  CHECK(resp.results[0].flag);
  CHECK_EQ(resp.results[1].code, 1);
  CHECK_EQ(resp.found, 1);
  CHECK_EQ(rr.remaining(), 0u);
  CHECK_EQ(prefix_count(resp, 2), 1u);
}
