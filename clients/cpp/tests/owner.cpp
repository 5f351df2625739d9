#include "owner.hpp"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

namespace fkvtest {

namespace {

bool accepts(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

std::string log_tail(const std::string& path) {
  std::string cmd = "tail -n 20 " + path + " 2>/dev/null";
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f) != nullptr) out += buf;
    ::pclose(f);
  }
  return out;
}

}  // namespace

std::string fluxkv_bin() {
  if (const char* b = std::getenv("FLUXKV_BIN"); b != nullptr && *b != '\0') return b;
  return FLUXKV_REPO_BIN;
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

Owner::Owner(std::vector<std::string> extra_args, std::string dram) : dram_(std::move(dram)), extra_(std::move(extra_args)) {
  // Short: Unix socket paths are limited to 107 bytes. run.sh points FLUXKV_TEST_TMP at a
  // directory it removes even when this process is killed before its destructors run.
  const char* base = std::getenv("FLUXKV_TEST_TMP");
  std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/fkv-cpp-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp " + tmpl + " failed");
  root_ = tmpl;
  dir_ = root_ + "/node";
  std::filesystem::create_directory(dir_);
  socket_ = dir_ + "/fluxkv.sock";
  start();
}

Owner::~Owner() {
  stop();
  std::error_code ec;
  std::filesystem::remove_all(root_, ec);
}

void Owner::start() {
  struct stat before {};
  bool had = ::stat(socket_.c_str(), &before) == 0;
  std::string bin = fluxkv_bin();
  std::string log = root_ + "/owner.log";
  std::vector<std::string> args{bin, "up", "--dir", dir_, "--dram", dram_};
  args.insert(args.end(), extra_.begin(), extra_.end());
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the tests
    if (::getppid() != parent) ::_exit(127);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  // Ready: a socket file newer than any a previous incarnation left, accepting connections.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error(bin + " up exited early:\n" + log_tail(log));
    }
    struct stat st {};
    if (::stat(socket_.c_str(), &st) == 0 && (!had || st.st_ino != before.st_ino || st.st_ctim.tv_nsec != before.st_ctim.tv_nsec) &&
        accepts(socket_))
      return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop(SIGKILL);
  throw std::runtime_error(socket_ + " did not appear within 30 s:\n" + log_tail(log));
}

int Owner::stop(int sig) {
  if (pid_ < 0) return 0;
  ::kill(pid_, sig);
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::byte> pattern(std::uint64_t seed, std::size_t n) {
  // Eight bytes per step: cheap enough for the unoptimized sanitizer build too.
  std::vector<std::byte> v(n);
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (std::size_t i = 0; i < n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, std::min<std::size_t>(8, n - i));
  }
  return v;
}

std::int64_t json_number(const std::string& json, const std::string& field) {
  std::string k = "\"" + field + "\": ";
  auto at = json.find(k);
  if (at == std::string::npos) throw std::runtime_error("no " + field + " in " + json);
  return std::stoll(json.substr(at + k.size()));
}

bool eventually(const std::function<bool()>& fn, std::chrono::milliseconds deadline) {
  auto end = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    if (fn()) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace fkvtest
