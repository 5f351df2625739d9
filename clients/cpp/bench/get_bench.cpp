// fluxkv_get_bench: single-threaded memory-hit gets from C++, the C++ half of
// bench/cpp_get_bench.py (the method of bench/python_get_bench.py: a warmup, then a fixed
// window of get calls round-robin over the keys, each call timed).
//
//   fluxkv_get_bench --socket S --prefix bench/ --keys 16 --size 1048576 --mode holder --seconds 5
//
// holder: get() and release (the holder's destructor): zero copy.
// copy:   get() then a copy of the value into a reused buffer, then release.
// The keys must exist with --size bytes; the first get of each is checked for its size.
// Prints one JSON line: gets, seconds, gets_per_s, p50_us, p99_us, mean_us.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "fluxkv/fluxkv.hpp"

namespace {

struct Args {
  std::string socket;
  std::string prefix = "bench/";
  int keys = 16;
  std::size_t size = 1 << 20;
  std::string mode = "holder";
  double seconds = 5;
  double warmup = 0.5;
};

int usage() {
  std::fprintf(stderr,
               "usage: fluxkv_get_bench --socket S [--prefix P] [--keys N] [--size BYTES] [--mode holder|copy] "
               "[--seconds S] [--warmup S]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i], v = argv[i + 1];
    if (f == "--socket") a.socket = v;
    else if (f == "--prefix") a.prefix = v;
    else if (f == "--keys") a.keys = std::stoi(v);
    else if (f == "--size") a.size = std::stoull(v);
    else if (f == "--mode") a.mode = v;
    else if (f == "--seconds") a.seconds = std::stod(v);
    else if (f == "--warmup") a.warmup = std::stod(v);
    else return usage();
  }
  if (argc % 2 == 0 || a.keys <= 0 || (a.mode != "holder" && a.mode != "copy")) return usage();
  try {
    auto c = fluxkv::Client::connect(a.socket);
    std::vector<std::string> keys;
    for (int i = 0; i < a.keys; ++i) keys.push_back(a.prefix + std::to_string(i));
    for (const auto& k : keys) {
      fluxkv::MemHolder h = c.get(k);
      if (h.size() != a.size || h.source() != "memory") {
        std::fprintf(stderr, "%s: %zu bytes from %.*s, want a %zu-byte memory hit\n", k.c_str(), h.size(),
                     static_cast<int>(h.source().size()), h.source().data(), a.size);
        return 1;
      }
    }
    std::vector<std::byte> buf(a.size);
    std::size_t sink = 0;
    auto one = [&](const std::string& k) {
      fluxkv::MemHolder h = c.get(k);
      if (a.mode == "copy") {
        std::memcpy(buf.data(), h.data(), h.size());
        sink += static_cast<std::size_t>(buf[h.size() - 1]);
      }
    };
    using clock = std::chrono::steady_clock;
    auto end = clock::now() + std::chrono::duration<double>(a.warmup);
    for (std::size_t i = 0; clock::now() < end; ++i) one(keys[i % keys.size()]);
    std::vector<std::int64_t> lat;
    lat.reserve(1 << 20);
    auto start = clock::now();
    auto stop = start + std::chrono::duration<double>(a.seconds);
    auto now = start;
    for (std::size_t i = 0; now < stop; ++i) {
      auto t0 = now;
      one(keys[i % keys.size()]);
      now = clock::now();
      lat.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(now - t0).count());
    }
    double elapsed = std::chrono::duration<double>(now - start).count();
    std::sort(lat.begin(), lat.end());
    double mean = std::accumulate(lat.begin(), lat.end(), 0.0) / static_cast<double>(lat.size());
    std::printf("{\"mode\": \"%s\", \"gets\": %zu, \"seconds\": %.6f, \"gets_per_s\": %.1f, \"p50_us\": %.3f, "
                "\"p99_us\": %.3f, \"mean_us\": %.3f, \"sink\": %zu}\n",
                a.mode.c_str(), lat.size(), elapsed, static_cast<double>(lat.size()) / elapsed, lat[lat.size() / 2] / 1e3,
                lat[std::min(lat.size() - 1, lat.size() * 99 / 100)] / 1e3, mean / 1e3, sink);
    c.close();
  } catch (const fluxkv::Error& e) {
    std::fprintf(stderr, "fluxkv_get_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
