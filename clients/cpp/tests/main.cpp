// The test binary: `fluxkv_tests [FILTER...]` runs every test whose name contains one of
// the FILTERs (all tests without one).
// `fluxkv_tests --hold SOCKET KEY COUNT` is the child the kill -9 test starts: it takes
// COUNT holders of KEY, says "ready" and waits to be killed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "fluxkv/fluxkv.hpp"
#include "testing.hpp"

namespace fkvtest {
std::vector<Case>& registry() {
  static std::vector<Case> r;
  return r;
}
}  // namespace fkvtest

namespace {

int hold_main(const char* socket, const char* key, int count) {
  auto c = fluxkv::Client::connect(socket);
  std::vector<fluxkv::MemHolder> held;
  for (int i = 0; i < count; ++i) held.push_back(c.get(key));
  std::printf("ready %d\n", count);
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--hold") == 0) return hold_main(argv[2], argv[3], std::atoi(argv[4]));
  std::vector<std::string> filters(argv + 1, argv + argc);
  auto selected = [&](const std::string& name) {
    if (filters.empty()) return true;
    for (const auto& f : filters)
      if (name.find(f) != std::string::npos) return true;
    return false;
  };
  int failed = 0;
  int ran = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& c : fkvtest::registry()) {
    if (!selected(c.name)) continue;
    ++ran;
    auto start = std::chrono::steady_clock::now();
    std::string err;
    try {
      c.fn();
    } catch (const fkvtest::Failure& f) {
      err = f.what();
    } catch (const std::exception& e) {
      err = std::string("unexpected exception: ") + e.what();
    } catch (...) {
      err = "unexpected non-standard exception";
    }
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    if (err.empty()) {
      std::printf("ok   %-40s %6lld ms\n", c.name, static_cast<long long>(ms));
    } else {
      ++failed;
      std::printf("FAIL %-40s %6lld ms\n     %s\n", c.name, static_cast<long long>(ms), err.c_str());
    }
    std::fflush(stdout);
  }
  auto total = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%d of %d tests passed in %lld ms\n", ran - failed, ran, static_cast<long long>(total));
  if (ran == 0) {
    std::printf("no test matches\n");
    return 1;
  }
  return failed == 0 ? 0 : 1;
}
