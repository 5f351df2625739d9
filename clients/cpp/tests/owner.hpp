// Owner: a real `fluxkv up` process in a fresh temporary directory, for the tests. It dies
// with the test process (PR_SET_PDEATHSIG), is stopped with SIGTERM by the destructor (then
// SIGKILL after a deadline), and its directory is removed. Helpers for values and status.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fluxkv/fluxkv.hpp"

namespace fkvtest {

class Owner {
 public:
  explicit Owner(std::vector<std::string> extra_args = {}, std::string dram = "256MiB");
  ~Owner();
  Owner(const Owner&) = delete;
  Owner& operator=(const Owner&) = delete;

  const std::string& socket() const { return socket_; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }
  // Stops the process (SIGTERM, or sig); returns its exit status (128+signal if killed).
  int stop(int sig = 15);
  // Starts it again in the same directory: a new incarnation of the same node.
  void start();

 private:
  std::string root_;
  std::string dir_;
  std::string socket_;
  std::string dram_;
  std::vector<std::string> extra_;
  pid_t pid_ = -1;
};

// The fluxkv binary: $FLUXKV_BIN, else bin/fluxkv of the repository.
std::string fluxkv_bin();
// Path of this test binary (for child processes it re-executes).
std::string self_exe();

// Deterministic bytes for (seed, n).
std::vector<std::byte> pattern(std::uint64_t seed, std::size_t n);
// A number field of the stat JSON ("client_holders", "keys", ...): the first occurrence.
std::int64_t json_number(const std::string& json, const std::string& field);
// Polls fn until it returns true or the deadline passes; returns the last result.
bool eventually(const std::function<bool()>& fn, std::chrono::milliseconds deadline = std::chrono::seconds(10));

}  // namespace fkvtest
