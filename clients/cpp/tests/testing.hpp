// A minimal test harness: TEST(name) registers a function; CHECK fails the test (and
// stops it) with the expression, file and line; main runs every test, or those whose name
// contains a filter, and exits 1 if any failed.
#pragma once

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fkvtest {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Case {
  const char* name;
  std::function<void()> fn;
};

std::vector<Case>& registry();

struct Register {
  Register(const char* name, std::function<void()> fn) { registry().push_back({name, std::move(fn)}); }
};

[[noreturn]] inline void fail(const std::string& what, const char* file, int line) {
  std::ostringstream s;
  s << file << ":" << line << ": " << what;
  throw Failure(s.str());
}

}  // namespace fkvtest

#define FKV_CAT2(a, b) a##b
#define FKV_CAT(a, b) FKV_CAT2(a, b)
#define TEST(name)                                                          \
  static void name();                                                       \
  static ::fkvtest::Register FKV_CAT(reg_, name)(#name, &name);              \
  static void name()

#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) ::fkvtest::fail("CHECK(" #cond ") failed", __FILE__, __LINE__); \
  } while (0)

#define CHECK_EQ(a, b)                                                                       \
  do {                                                                                       \
    auto&& fkv_a = (a);                                                                      \
    auto&& fkv_b = (b);                                                                      \
    if (!(fkv_a == fkv_b)) {                                                                 \
      std::ostringstream fkv_s;                                                              \
      fkv_s << "CHECK_EQ(" #a ", " #b ") failed: " << fkv_a << " != " << fkv_b;             \
      ::fkvtest::fail(fkv_s.str(), __FILE__, __LINE__);                                      \
    }                                                                                        \
  } while (0)

// Checks that stmt throws exactly the exception type T (or a subclass).
#define CHECK_THROWS(T, stmt)                                                                        \
  do {                                                                                               \
    bool fkv_thrown = false;                                                                         \
    try {                                                                                            \
      stmt;                                                                                          \
    } catch (const T&) {                                                                             \
      fkv_thrown = true;                                                                             \
    } catch (const std::exception& fkv_e) {                                                          \
      ::fkvtest::fail(std::string(#stmt " threw another exception: ") + fkv_e.what(), __FILE__, __LINE__); \
    }                                                                                                \
    if (!fkv_thrown) ::fkvtest::fail(#stmt " did not throw " #T, __FILE__, __LINE__);               \
  } while (0)
