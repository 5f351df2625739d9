// Holders and put bytes a misbehaving or failing owner must not leak or mix up: a batch get
// whose one key fails releases the holders of the keys after it; a C ABI put whose outcome
// became unknown redoes its own bytes, not what another thread wrote into the put area
// since; threads putting and getting across an owner's kill -9.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "client_impl.hpp"
#include "fake_owner.hpp"
#include "fluxkv/fluxkv.h"
#include "shared_owner.hpp"
#include "testing.hpp"

using namespace fkvtest;
using namespace fluxkv::detail;

namespace {

// Answers Release with OK for every id, and every other call by the test's function.
FakeOwner::Reply with_release(FakeOwner::Reply other) {
  return [other](const FakeCall& c, Writer& w) {
    if (c.method == "Release") {
      w.field(T_I32, 1);
      w.i32(0);
      w.field(T_LIST, 3);
      w.list_begin(T_I32, c.holder_ids.size());
      for (std::size_t i = 0; i < c.holder_ids.size(); ++i) w.i32(0);
      return;
    }
    other(c, w);
  };
}

bool has(const std::vector<std::int64_t>& v, std::int64_t id) { return std::find(v.begin(), v.end(), id) != v.end(); }

}  // namespace

// BatchGet: the owner answers each key on its own ("one key's failure never fails the
// others"). When one key fails (here NO_SPACE), batch_get throws; the holders the owner
// handed out for the other keys of the chunk (after the failing one) must still be released.
TEST(batch_get_item_error_releases_the_other_holders) {
  FakeOwner o(with_release([](const FakeCall& c, Writer& w) {
    if (c.method == "BatchGet") {
      w.field(T_I32, 1);
      w.i32(0);
      w.field(T_LIST, 3);
      w.list_begin(T_STRUCT, c.keys.size());
      for (std::size_t i = 0; i < c.keys.size(); ++i) {
        if (i == 1) write_get(w, static_cast<std::int32_t>(fluxkv::wire::Code::NO_SPACE), 0, 0, 0);
        else write_get(w, 0, 100 + static_cast<std::int64_t>(i), 64 * static_cast<std::int64_t>(i), 10);
        w.stop();
      }
      return;
    }
    w.field(T_I32, 1);
    w.i32(0);
  }));
  auto c = fluxkv::Client::connect(o.socket());
  std::string_view keys[] = {"k0", "k1", "k2", "k3"};
  CHECK_THROWS(fluxkv::NoSpace, c.batch_get(keys));
  c.flush();
  c.close();
  auto rel = o.released();
  CHECK(has(rel, 100));  // before the failing key: released by RAII
  CHECK(has(rel, 102));  // after it: never released (held by the owner until the session ends)
  CHECK(has(rel, 103));
}

// Same, when a key's holder lies outside the segment (a buggy owner): the holders of the
// keys after it leak too.
TEST(batch_get_bad_holder_releases_the_other_holders) {
  FakeOwner o(with_release([](const FakeCall& c, Writer& w) {
    if (c.method == "BatchGet") {
      w.field(T_I32, 1);
      w.i32(0);
      w.field(T_LIST, 3);
      w.list_begin(T_STRUCT, c.keys.size());
      for (std::size_t i = 0; i < c.keys.size(); ++i) {
        std::int64_t off = i == 0 ? (std::int64_t{1} << 40) : 64 * static_cast<std::int64_t>(i);
        write_get(w, 0, 200 + static_cast<std::int64_t>(i), off, 10);
        w.stop();
      }
      return;
    }
    w.field(T_I32, 1);
    w.i32(0);
  }));
  auto c = fluxkv::Client::connect(o.socket());
  std::string_view keys[] = {"k0", "k1", "k2"};
  CHECK_THROWS(fluxkv::Error, c.batch_get(keys));
  c.flush();
  c.close();
  auto rel = o.released();
  CHECK(has(rel, 200));  // the bad one itself is queued for release
  CHECK(has(rel, 201));
  CHECK(has(rel, 202));
}

// A BatchGet answer with fewer results than keys is refused as a whole; the holders it
// carried are released (the client read them: no lost reply gives them back).
TEST(batch_get_malformed_answer_releases_its_holders) {
  FakeOwner o(with_release([](const FakeCall& c, Writer& w) {
    w.field(T_I32, 1);
    w.i32(0);
    if (c.method == "BatchGet") {
      w.field(T_LIST, 3);
      w.list_begin(T_STRUCT, 1);
      write_get(w, 0, 300, 0, 10);
      w.stop();
    }
  }));
  auto c = fluxkv::Client::connect(o.socket());
  std::string_view keys[] = {"a", "b"};
  CHECK_THROWS(fluxkv::Error, c.batch_get(keys));
  c.flush();
  c.close();
  CHECK(has(o.released(), 300));
}

// An owner's segment memfd not sealed against shrinking could be truncated under the
// client's mapping, and a holder's read would die of SIGBUS: connect refuses it.
TEST(connect_refuses_an_unsealed_segment) {
  FakeOwner o([](const FakeCall&, Writer& w) {
    w.field(T_I32, 1);
    w.i32(0);
  }, 1 << 20, 0, false);
  CHECK_THROWS(fluxkv::Error, fluxkv::Client::connect(o.socket()));
}

// Under isolation, a batch whose first wave streams an item larger than the put area and
// whose PutWrite is refused: that item fails, and the later waves still run ("every item
// is attempted; the first failure is thrown after all of them ran").
TEST(batch_put_stream_error_leaves_later_waves) {
  std::atomic<int> starts{0}, ends{0};
  FakeOwner o(
      [&](const FakeCall& c, Writer& w) {
        if (c.method == "PutWrite") {  // NO_SPACE
          w.field(T_I32, 1);
          w.i32(static_cast<std::int32_t>(fluxkv::wire::Code::NO_SPACE));
          return;
        }
        w.field(T_I32, 1);
        w.i32(0);
        if (c.method == "BatchPutStart" || c.method == "BatchPutEnd") {
          int n = c.method == "BatchPutStart" ? ++starts : ++ends;
          w.field(T_LIST, 3);
          w.list_begin(T_STRUCT, 1);  // each wave holds one item here
          w.field(T_I32, 1);
          w.i32(0);
          if (c.method == "BatchPutStart") {
            w.field(T_I64, 3);
            w.i64(10 * n);
            w.field(T_I64, 4);
            w.i64(0);
          }
          w.stop();
        }
      },
      8 << 20, 1 << 20);
  auto c = fluxkv::Client::connect(o.socket());
  CHECK(c.isolated());
  std::vector<std::byte> big(2 << 20), small(100);
  fluxkv::PutItem items[] = {{"big", big}, {"small", small}};
  CHECK_THROWS(fluxkv::NoSpace, c.batch_put(items));
  CHECK_EQ(starts.load(), 2);
  CHECK_EQ(ends.load(), 1);  // the small item's wave; the big one was aborted
}

// A reply whose list announces more results than any call has keys is malformed: the
// decoder refuses it before allocating them.
TEST(answer_lists_are_bounded) {
  std::vector<std::uint8_t> buf;
  Writer w(buf);
  w.field(T_I32, 1);
  w.i32(0);
  w.field(T_LIST, 3);
  w.list_begin(T_STRUCT, kMaxResults + 1);
  for (std::size_t i = 0; i <= kMaxResults; ++i) w.stop();
  w.stop();
  Reader r(buf.data(), buf.size());
  BatchResponse<GetResponse> resp;
  CHECK_THROWS(ProtocolError, resp.read(r));
}

// A call carrying queued releases is lost before the owner acts on it (and so is its
// retry): the call fails and its ids go back to the queue. The flusher stopped watching
// while they were out (it found the queue empty), so nothing sends them again unless their
// return wakes it: an idle client left the owner holding them until its next call.
TEST(releases_of_a_lost_call_are_sent_without_another_call) {
  FakeOwner o(with_release([](const FakeCall& c, Writer& w) {
    if (c.method == "Get") {
      write_get(w, 0, 300, 0, 10);
      return;
    }
    w.field(T_I32, 1);
    w.i32(0);
  }));
  fluxkv::Options opts;
  opts.release_delay = std::chrono::milliseconds(100);
  auto c = fluxkv::Client::connect(o.socket(), opts);
  fluxkv::MemHolder h = c.get("k");
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, open = false;
  o.set_lose([&](const FakeCall& call) {
    if (call.method != "Exists" || call.releases.empty()) return false;
    std::unique_lock lk(mu);
    if (!entered) {  // the first one waits: meanwhile the flusher finds the queue empty
      entered = true;
      cv.notify_all();
      cv.wait_for(lk, std::chrono::seconds(10), [&] { return open; });
    }
    return true;  // lost, and so is the retry
  });
  h.release();  // queued: the Exists below carries it
  std::atomic<bool> unavailable{false};
  std::thread t([&] {
    try {
      c.exists("k");
    } catch (const fluxkv::Unavailable&) {
      unavailable = true;
    }
  });
  {
    std::unique_lock lk(mu);
    CHECK(cv.wait_for(lk, std::chrono::seconds(10), [&] { return entered; }));
  }
  // Ten release delays with the id out of the queue: the flusher disarms (were it still
  // watching, it would send the id: the test would pass without catching anything).
  std::this_thread::sleep_for(std::chrono::seconds(1));
  {
    std::lock_guard lk(mu);
    open = true;
  }
  cv.notify_all();
  t.join();
  CHECK(unavailable.load());
  // No call on c from here: only its flusher can send the id.
  CHECK(eventually([&] { return has(o.released(), 300); }));
  CHECK_EQ(c.release_errors(), 0);
}

namespace {
std::atomic<int> g_putend_drops{0};
bool drop_put_end(std::string_view m) {
  if (m != "PutEnd") return false;
  for (int n = g_putend_drops.load(); n > 0;)
    if (g_putend_drops.compare_exchange_weak(n, n - 1)) return true;
  return false;
}
std::atomic<int> g_put_starts{0};
void count_put_start(std::string_view m) {
  if (m == "PutStart") g_put_starts.fetch_add(1);
}
}  // namespace

// C ABI zero-copy put under client isolation: the value lies in the session's put area.
// When every PutEnd reply is lost (the outcome is unknown on a live session),
// fluxkv_put_commit redoes the put from the put area, but it gave the area's turn back
// first: another thread's put, waiting for the turn, writes its own value there, and the
// redo then publishes that thread's bytes under this key.
TEST(c_abi_redo_keeps_its_own_bytes_under_isolation) {
  fluxkv_error err;
  fluxkv_client* c = fluxkv_connect(isolated_owner().socket().c_str(), &err);
  CHECK(c != nullptr);
  const std::size_t n = 4096;
  auto a = pattern(101, n);
  auto b = pattern(202, n);
  fluxkv_pending_put* p = nullptr;
  fluxkv_span span{};
  CHECK_EQ(fluxkv_put_begin(c, "leaks/a", 8, n, 0, &p, &span, &err), 0);
  std::memcpy(span.data, a.data(), n);
  // Another thread puts leaks/b meanwhile: it waits for the put area's turn.
  g_put_starts = 0;
  Session::call_hook_for_tests = &count_put_start;
  std::atomic<int> brc{1};
  std::thread t([&] {
    fluxkv_error e2;
    brc = fluxkv_put(c, "leaks/b", 8, b.data(), n, &e2);
  });
  while (g_put_starts.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its PutStart answered, waiting for the turn
  Session::call_hook_for_tests = nullptr;
  g_putend_drops = ClientImpl::kPutEndTries;
  drop_reply_hook = &drop_put_end;
  int rc = fluxkv_put_commit(p, &err);
  drop_reply_hook = nullptr;
  t.join();
  CHECK_EQ(rc, 0);
  CHECK_EQ(brc.load(), 0);
  fluxkv_holder* h = nullptr;
  CHECK_EQ(fluxkv_get(c, "leaks/a", 8, &h, &err), 1);
  bool ok = fluxkv_holder_size(h) == n && std::memcmp(fluxkv_holder_data(h), a.data(), n) == 0;
  bool is_b = fluxkv_holder_size(h) == n && std::memcmp(fluxkv_holder_data(h), b.data(), n) == 0;
  fluxkv_holder_release(h);
  fluxkv_delete(c, "leaks/a", 8, &err);
  fluxkv_delete(c, "leaks/b", 8, &err);
  fluxkv_close(c);
  CHECK(!is_b);
  CHECK(ok);
}

namespace {
std::atomic<int> g_first_put_end_drops{0};
bool drop_first_put_end(std::string_view m) {
  if (m != "PutEnd") return false;
  for (int n = g_first_put_end_drops.load(); n > 0;)
    if (g_first_put_end_drops.compare_exchange_weak(n, n - 1)) return true;
  return false;
}
}  // namespace

// A C ABI zero-copy put whose first PutEnd reply is lost, and whose repeat the owner
// answers INVALID_ARGUMENT (it forgot the put: expired, or its outcome out of its memory).
// Isolated, the bytes are the client's own (put area, scratch buffer): the redo publishes
// them. Written in place in the segment, the owner may have given their range to another
// value already: the commit fails UNAVAILABLE ("put it again") and nothing is redone.
// Before, the redo streamed zeros (a value larger than the area) or published the range's
// next value as this put's, and fluxkv_put_commit answered success.
TEST(c_abi_redo_after_a_forgotten_put_publishes_its_own_bytes_or_fails) {
  for (bool isolated : {false, true}) {
    const std::int64_t area = isolated ? (1 << 20) : 0;
    const std::size_t n = isolated ? (1 << 20) + (1 << 19) : 4096;
    std::atomic<int> put_starts{0}, put_ends{0};
    std::vector<std::uint8_t> redone;  // the redo's first bytes, where the owner copies from
    FakeOwner* op = nullptr;
    FakeOwner o(
        [&](const FakeCall& c, Writer& w) {
          if (c.method == "PutStart") {
            int k = ++put_starts;
            w.field(T_I32, 1);
            w.i32(0);
            w.field(T_I64, 3);
            w.i64(k);
            w.field(T_I64, 4);
            w.i64(k == 1 ? 0 : 65536);
            return;
          }
          bool redo = put_starts.load() == 2;
          if (c.method == "PutEnd" && ++put_ends == 2) {  // the repeat: forgotten, its range reused
            std::vector<std::uint8_t> other(4096, 0xEE);
            if (::pwrite(op->memfd(), other.data(), other.size(), 0) != 4096) throw std::runtime_error("pwrite");
            w.field(T_I32, 1);
            w.i32(static_cast<std::int32_t>(fluxkv::wire::Code::INVALID_ARGUMENT));
            w.field(T_STRING, 2);
            w.string("unknown put");
            return;
          }
          if (redo && redone.empty() && (c.method == "PutWrite" || c.method == "PutEnd")) {
            redone.resize(64);
            int fd = isolated ? op->area_fd() : op->memfd();
            if (::pread(fd, redone.data(), redone.size(), isolated ? 0 : 65536) != 64) throw std::runtime_error("pread");
          }
          w.field(T_I32, 1);
          w.i32(0);
        },
        8 << 20, area);
    op = &o;
    fluxkv_error err;
    fluxkv_client* c = fluxkv_connect(o.socket().c_str(), &err);
    CHECK(c != nullptr);
    fluxkv_pending_put* p = nullptr;
    fluxkv_span span{};
    CHECK_EQ(fluxkv_put_begin(c, "k", 1, n, 0, &p, &span, &err), 0);
    std::memset(span.data, 0xAB, n);
    g_first_put_end_drops = 1;
    drop_reply_hook = &drop_first_put_end;
    int rc = fluxkv_put_commit(p, &err);
    drop_reply_hook = nullptr;
    fluxkv_close(c);
    if (!isolated) {
      CHECK_EQ(rc, -1);
      CHECK_EQ(err.code, FLUXKV_UNAVAILABLE);
      CHECK(std::string(err.message).find("put it again") != std::string::npos);
      CHECK_EQ(put_starts.load(), 1);  // not redone from a range another value may hold
      continue;
    }
    CHECK_EQ(rc, 0);
    CHECK_EQ(put_starts.load(), 2);  // redone
    CHECK_EQ(redone.size(), std::size_t{64});
    CHECK(std::all_of(redone.begin(), redone.end(), [](std::uint8_t b) { return b == 0xAB; }));
  }
}

// Exploratory (passes): threads share a client across an owner restart (run under TSan/ASan).
TEST(threads_across_owner_restart) {
  Owner o;
  auto c = fluxkv::Client::connect(o.socket());
  std::atomic<bool> stop{false};
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      std::vector<fluxkv::MemHolder> kept;
      for (int i = 0; !stop; ++i) {
        std::string k = "rs/" + std::to_string(t) + "/" + std::to_string(i % 5);
        auto v = pattern(static_cast<std::uint64_t>(t * 100 + i), 1000 + static_cast<std::size_t>(i % 7) * 3000);
        try {
          c.put(k, v);
          fluxkv::MemHolder h = c.get(k);
          kept.push_back(std::move(h));
          if (kept.size() > 3) kept.erase(kept.begin());
          std::string_view ks[] = {k, "rs/missing"};
          auto hs = c.batch_get(ks);
        } catch (const fluxkv::Error&) {
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  o.stop(9);
  o.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  for (auto& t : ts) t.join();
  CHECK_EQ(c.release_errors(), 0);
}

// batch_put attempts every wave: a wave whose BatchPutEnd the owner fails (an application
// exception) fails its items, and the later waves are still put; the first failure is
// thrown after all of them ran. It left batch_put at once: the third wave never went out.
TEST(batch_put_attempts_every_wave_after_a_failed_one) {
  std::atomic<int> starts{0}, ends{0};
  FakeOwner o(
      [&](const FakeCall& c, Writer& w) {
        if (c.method == "BatchPutStart" || c.method == "BatchPutEnd") {  // one item a wave
          int k = c.method == "BatchPutStart" ? ++starts : ++ends;
          w.field(T_I32, 1);
          w.i32(0);
          w.field(T_LIST, 3);
          w.list_begin(T_STRUCT, 1);
          w.field(T_I32, 1);
          w.i32(0);
          if (c.method == "BatchPutStart") {
            w.field(T_I64, 3);
            w.i64(k);
            w.field(T_I64, 4);
            w.i64(0);
          }
          w.stop();
          return;
        }
        w.field(T_I32, 1);
        w.i32(0);
      },
      8 << 20);
  std::atomic<int> put_ends{0};
  o.set_raise([&](const FakeCall& c) { return c.method == "BatchPutEnd" && ++put_ends == 2; });
  auto c = fluxkv::Client::connect(o.socket());
  std::vector<std::byte> v(3 << 20, std::byte{7});  // 3 MiB: a wave each (half the segment)
  std::vector<fluxkv::PutItem> items{{"a", v}, {"b", v}, {"c", v}};
  try {
    c.batch_put(items);
    CHECK(!"a batch with a failed wave must throw");
  } catch (const fluxkv::Error& e) {
    CHECK(std::string(e.what()).find("owner failed the call") != std::string::npos);
  }
  CHECK_EQ(starts.load(), 3);
  CHECK_EQ(put_ends.load(), 3);
}

namespace {
// A one-shot gate the fake owner's connection threads wait on.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void set() {
    {
      std::lock_guard lk(mu);
      open = true;
    }
    cv.notify_all();
  }
  bool wait(std::chrono::milliseconds d = std::chrono::seconds(10)) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, d, [&] { return open; });
  }
};
}  // namespace

// flush() returns only once the releases it waits for reached the owner, or throws: a call
// carrying release 300 is lost while flush waits for it, and its retry takes 300 back off
// the queue under a carry number past flush's; flush returned when another waited-for call
// ended, 300 undelivered and riding on a retry that failed too (a review; the Go client's
// TestFlushReportsReleasesItCouldNotDeliver).
TEST(flush_waits_for_the_retry_of_a_failed_call_carrying_releases) {
  std::atomic<std::int64_t> next_holder{300};
  Gate t1_lost, t1_retry_in, go_lose_retry, t2_in, go_t2;
  std::atomic<int> seen300{0};
  FakeOwner o(with_release([&](const FakeCall& c, Writer& w) {
    if (c.method == "Get") {
      write_get(w, 0, next_holder++, 0, 10);
      return;
    }
    w.field(T_I32, 1);
    w.i32(0);
  }));
  o.set_lose([&](const FakeCall& c) {
    if (c.method != "Exists") return false;
    if (has(c.releases, 300)) {
      if (++seen300 == 1) {
        t1_lost.wait();  // the first try: lost when the test says
        return true;
      }
      t1_retry_in.set();
      go_lose_retry.wait();
      return true;  // the retry: lost too
    }
    if (has(c.releases, 301)) {
      t2_in.set();
      go_t2.wait();
    }
    return false;
  });
  fluxkv::Options opts;
  opts.release_delay = std::chrono::hours(1);  // only calls and flush send releases
  auto c = fluxkv::Client::connect(o.socket(), opts);
  fluxkv::MemHolder h300 = c.get("a"), h301 = c.get("b");
  h300.release();
  auto exists = [&](const char* k) {
    try {
      c.exists(k);
    } catch (const fluxkv::Error&) {
    }
  };
  std::thread t1(exists, "a");
  CHECK(eventually([&] { return seen300.load() > 0; }));
  h301.release();
  std::thread t2(exists, "b");
  CHECK(t2_in.wait());
  std::atomic<bool> flushed{false}, threw{false};
  std::thread f([&] {
    try {
      c.flush();
      flushed = true;
    } catch (const fluxkv::Unavailable&) {
      threw = true;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // flush waits for carries 1 and 2
  t1_lost.set();                                                // carry 1 fails; its retry takes 300
  CHECK(t1_retry_in.wait());
  go_t2.set();  // carry 2 answered
  bool returned = eventually([&] { return flushed.load(); }, std::chrono::milliseconds(1000));
  bool delivered = has(o.released(), 300);
  go_lose_retry.set();
  f.join();
  t1.join();
  t2.join();
  CHECK(!(returned && !delivered));
  CHECK(threw.load() || has(o.released(), 300));  // the retry was lost too: flush says so
}
