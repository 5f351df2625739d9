// FakeOwner: a scripted owner for tests of what a misbehaving owner answers. It answers the attach handshake with a
// memfd segment (SCM_RIGHTS) and serves framed binary thrift on its RPC socket; a test
// supplies the reply body of each call (the fields of the method's response struct). It
// records every holder id released (piggybacked or by Release).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "binary_protocol.hpp"
#include "messages.hpp"
#include "wire_constants.hpp"

namespace fkvtest {

struct FakeCall {
  std::string method;
  std::vector<std::string> keys;         // field 2 list<string> (batch keys) or field 2 string (a key)
  std::vector<std::int64_t> releases;    // piggybacked
  std::vector<std::int64_t> holder_ids;  // Release's
};

class FakeOwner {
 public:
  // reply(call, w) writes the response struct's fields (without the final stop).
  using Reply = std::function<void(const FakeCall&, fluxkv::detail::Writer&)>;

  // area > 0: the owner isolates its clients, each with a put area of area bytes.
  // sealed false: the segment's memfd is not sealed against shrinking (a buggy owner).
  explicit FakeOwner(Reply reply, std::int64_t seg = 1 << 20, std::int64_t area = 0, bool sealed = true)
      : reply_(std::move(reply)), seg_(seg), area_(area) {
    char tmpl[] = "/tmp/fkv-fake-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    attach_path_ = dir_ + "/fluxkv.sock";
    rpc_path_ = dir_ + "/fluxkv.sock.rpc";
    memfd_ = sealed_memfd("fake-seg", seg_, sealed);
    if (area_ > 0) area_fd_ = sealed_memfd("fake-area", area_, true);
    attach_ls_ = listen_on(attach_path_);
    rpc_ls_ = listen_on(rpc_path_);
    threads_.emplace_back([this] { attach_loop(); });
    threads_.emplace_back([this] { rpc_loop(); });
  }
  ~FakeOwner() {
    stop_ = true;
    ::shutdown(attach_ls_, SHUT_RDWR);
    ::shutdown(rpc_ls_, SHUT_RDWR);
    {
      std::lock_guard lk(mu_);
      for (int fd : conns_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : threads_) t.join();
    for (auto& t : conn_threads_) t.join();
    for (int fd : conns_) ::close(fd);
    ::close(attach_ls_);
    ::close(rpc_ls_);
    ::close(memfd_);
    if (area_fd_ >= 0) ::close(area_fd_);
    ::unlink(attach_path_.c_str());
    ::unlink(rpc_path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& socket() const { return attach_path_; }
  int memfd() const { return memfd_; }
  int area_fd() const { return area_fd_; }  // the put area's (isolated), else -1
  std::vector<std::int64_t> released() {
    std::lock_guard lk(mu_);
    return released_;
  }
  std::vector<std::string> methods() {
    std::lock_guard lk(mu_);
    return methods_;
  }
  // When lose(call) returns true the call is lost before the owner acts on it: its
  // connection is closed with no reply and nothing (no release) is recorded. lose may block
  // (a request stuck on its way). Set before the client makes the calls it concerns.
  void set_lose(std::function<bool(const FakeCall&)> lose) {
    std::lock_guard lk(mu_);
    lose_ = std::move(lose);
  }
  // When raise(call) returns true the owner answers the call with a TApplicationException
  // (as a server that could not run it) instead of a reply.
  void set_raise(std::function<bool(const FakeCall&)> raise) {
    std::lock_guard lk(mu_);
    raise_ = std::move(raise);
  }

 private:
  // sealed_memfd is a memfd of size bytes sealed against shrinking and growing (with
  // seal), as the owner's are.
  static int sealed_memfd(const char* name, std::int64_t size, bool seal) {
    int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ::ftruncate(fd, size) != 0 || (seal && ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0))
      throw std::runtime_error("memfd");
    return fd;
  }
  static int listen_on(const std::string& path) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0)
      throw std::runtime_error("bind " + path);
    return fd;
  }
  static bool read_full(int fd, std::uint8_t* p, std::size_t n) {
    while (n > 0) {
      ssize_t r = ::recv(fd, p, n, 0);
      if (r <= 0) return false;
      p += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  static bool read_frame(int fd, std::vector<std::uint8_t>& body) {
    std::uint8_t h[4];
    if (!read_full(fd, h, 4)) return false;
    std::uint32_t n = (std::uint32_t{h[0]} << 24) | (std::uint32_t{h[1]} << 16) | (std::uint32_t{h[2]} << 8) | h[3];
    body.resize(n);
    return read_full(fd, body.data(), n);
  }
  static void frame(std::vector<std::uint8_t>& out) {
    auto n = static_cast<std::uint32_t>(out.size() - 4);
    for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(n >> (24 - 8 * i));
  }
  void track(int fd) {
    std::lock_guard lk(mu_);
    conns_.push_back(fd);
  }

  void attach_loop() {
    using namespace fluxkv::detail;
    for (;;) {
      int c = ::accept4(attach_ls_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      track(c);
      std::vector<std::uint8_t> hello;
      if (!read_frame(c, hello)) continue;
      std::vector<std::uint8_t> out(4);
      Writer w(out);
      w.field(T_I32, 1);
      w.i32(0);
      w.field(T_I32, 3);
      w.i32(fluxkv::wire::PROTOCOL_VERSION);
      w.field(T_I64, 4);
      w.i64(1);
      w.field(T_I64, 5);
      w.i64(1);
      w.field(T_I64, 6);
      w.i64(1);
      w.field(T_I64, 7);
      w.i64(seg_);
      w.field(T_STRING, 8);
      w.string(rpc_path_);
      w.field(T_STRING, 9);
      w.string("fake");
      if (area_ > 0) {
        w.field(T_BOOL, 10);
        w.boolean(true);
        w.field(T_I64, 11);
        w.i64(area_);
      }
      w.stop();
      frame(out);
      iovec iov{out.data(), out.size()};
      int fds[2] = {memfd_, area_fd_};
      int nfd = area_ > 0 ? 2 : 1;
      alignas(cmsghdr) char cbuf[CMSG_SPACE(2 * sizeof(int))];
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = cbuf;
      msg.msg_controllen = sizeof cbuf;
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      msg.msg_controllen = CMSG_SPACE(nfd * sizeof(int));
      cm->cmsg_len = CMSG_LEN(nfd * sizeof(int));
      std::memcpy(CMSG_DATA(cm), fds, nfd * sizeof(int));
      ::sendmsg(c, &msg, MSG_NOSIGNAL);
    }
  }

  void rpc_loop() {
    for (;;) {
      int c = ::accept4(rpc_ls_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      track(c);
      std::lock_guard lk(mu_);
      conn_threads_.emplace_back([this, c] { serve(c); });
    }
  }

  void serve(int c) {
    using namespace fluxkv::detail;
    std::vector<std::uint8_t> in;
    while (!stop_ && read_frame(c, in)) {
      Reader r(in.data(), in.size());
      FakeCall call;
      std::string name;
      MessageType type;
      std::int32_t seq;
      r.message_begin(name, type, seq);
      call.method = name;
      TType t;
      std::int16_t id;
      while (r.field(t, id)) {
        if (id != 1 || t != T_STRUCT) {
          r.skip(t);
          continue;
        }
        // req
        while (r.field(t, id)) {
          if (id == 1 && t == T_STRUCT) {  // session
            while (r.field(t, id)) {
              if (id == 4 && t == T_LIST) {
                std::size_t n = r.list_begin(T_I64);
                for (std::size_t i = 0; i < n; ++i) call.releases.push_back(r.i64());
              } else {
                r.skip(t);
              }
            }
          } else if (id == 2 && t == T_STRING) {
            call.keys.push_back(r.string());
          } else if (id == 2 && t == T_LIST) {
            auto save = r;
            std::uint8_t elem = 0;
            {
              // peek the element type
              Reader p = save;
              elem = static_cast<std::uint8_t>(p.i8());
            }
            if (elem == T_STRING) {
              std::size_t n = r.list_begin(T_STRING);
              for (std::size_t i = 0; i < n; ++i) call.keys.push_back(r.string());
            } else if (elem == T_I64) {
              std::size_t n = r.list_begin(T_I64);
              for (std::size_t i = 0; i < n; ++i) call.holder_ids.push_back(r.i64());
            } else {
              r.skip(t);
            }
          } else {
            r.skip(t);
          }
        }
      }
      std::function<bool(const FakeCall&)> lose;
      {
        std::lock_guard lk(mu_);
        lose = lose_;
      }
      if (lose && lose(call)) {
        ::shutdown(c, SHUT_RDWR);  // closed by the destructor
        return;
      }
      {
        std::lock_guard lk(mu_);
        methods_.push_back(call.method);
        released_.insert(released_.end(), call.releases.begin(), call.releases.end());
        released_.insert(released_.end(), call.holder_ids.begin(), call.holder_ids.end());
      }
      std::function<bool(const FakeCall&)> raise;
      {
        std::lock_guard lk(mu_);
        raise = raise_;
      }
      std::vector<std::uint8_t> out(4);
      Writer w(out);
      if (raise && raise(call)) {
        w.message_begin(name, M_EXCEPTION, seq);
        w.field(T_STRING, 1);
        w.string("internal error (fault injected by the test)");
        w.field(T_I32, 2);
        w.i32(6);  // INTERNAL_ERROR
        w.stop();
      } else {
        w.message_begin(name, M_REPLY, seq);
        w.field(T_STRUCT, 0);
        reply_(call, w);
        w.stop();  // response struct
        w.stop();  // result struct
      }
      frame(out);
      std::size_t written;
      (void)written;
      if (::send(c, out.data(), out.size(), MSG_NOSIGNAL) < 0) return;
    }
  }

  Reply reply_;
  std::int64_t seg_;
  std::int64_t area_ = 0;
  int area_fd_ = -1;
  std::string dir_, attach_path_, rpc_path_;
  int memfd_ = -1, attach_ls_ = -1, rpc_ls_ = -1;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<int> conns_;
  std::vector<std::thread> threads_;
  std::vector<std::thread> conn_threads_;
  std::vector<std::int64_t> released_;
  std::vector<std::string> methods_;
  std::function<bool(const FakeCall&)> lose_;
  std::function<bool(const FakeCall&)> raise_;
};

// Writes a GetResponse's fields (a holder of len bytes at offset) into w.
inline void write_get(fluxkv::detail::Writer& w, std::int32_t code, std::int64_t holder, std::int64_t offset,
                      std::int64_t len) {
  using namespace fluxkv::detail;
  w.field(T_I32, 1);
  w.i32(code);
  if (holder != 0) {
    w.field(T_I64, 3);
    w.i64(holder);
    w.field(T_I64, 4);
    w.i64(offset);
    w.field(T_I64, 5);
    w.i64(len);
    w.field(T_I32, 6);
    w.i32(1);
  }
}

}  // namespace fkvtest
