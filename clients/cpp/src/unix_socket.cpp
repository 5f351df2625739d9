#include "unix_socket.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "fluxkv/fluxkv.hpp"

namespace fluxkv::detail {

namespace {
constexpr int kMaxFds = 4;

std::string err_text(int e) { return std::strerror(e); }
}  // namespace

void set_timeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

UniqueFd unix_stream_socket() {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) {
    int e = errno;
    throw Unavailable(ErrorCode::UNAVAILABLE, std::string("socket: ") + err_text(e), e);
  }
  return fd;
}

UniqueFd connect_unix(const std::string& path, std::chrono::milliseconds timeout, const char* what) {
  UniqueFd fd = unix_stream_socket();
  connect_unix(fd, path, timeout, what);
  return fd;
}

void connect_unix(const UniqueFd& fd, const std::string& path, std::chrono::milliseconds timeout, const char* what) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path)
    throw InvalidArgument(ErrorCode::INVALID_ARGUMENT,
                          std::string(what) + " path \"" + path + "\" must be 1.." + std::to_string(sizeof addr.sun_path - 1) + " bytes");
  std::memcpy(addr.sun_path, path.data(), path.size());
  set_timeouts(fd.get(), timeout);
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int e = errno;
    if (e == EACCES || e == EPERM)
      throw PermissionDenied(ErrorCode::PERMISSION_DENIED,
                             "cannot connect to " + path + ": " + err_text(e) +
                                 ": the socket admits its owner and members of its group (see `ls -l " + path +
                                 "`); add the user with `usermod -aG GROUP USER` (it takes effect at the user's next login)",
                             e);
    if (e == EAGAIN || e == ETIMEDOUT || e == EINPROGRESS)
      throw Unavailable(ErrorCode::UNAVAILABLE, std::string("connect to ") + what + " " + path + " timed out", e);
    throw Unavailable(ErrorCode::UNAVAILABLE, std::string("no fluxkv owner at ") + path + ": " + err_text(e), e);
  }
}

int send_all(int fd, const std::uint8_t* buf, std::size_t n, std::size_t* written) {
  std::size_t off = 0;
  while (off < n) {
    ssize_t w = ::send(fd, buf + off, n - off, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      *written = off;
      return errno;
    }
    off += static_cast<std::size_t>(w);
  }
  *written = off;
  return 0;
}

std::vector<std::uint8_t> recv_frame_with_fds(int fd, std::uint32_t max_body, std::vector<UniqueFd>& fds) {
  std::vector<std::uint8_t> data;
  std::size_t need = 4;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(kMaxFds * sizeof(int))];
  data.resize(4);
  std::size_t have = 0;
  while (have < need) {
    iovec iov{data.data() + have, need - have};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    ssize_t got = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0) {
      int e = errno;
      if (e == EINTR) continue;
      if (e == EAGAIN || e == EWOULDBLOCK) throw Unavailable(ErrorCode::UNAVAILABLE, "attach: no reply in time", e);
      throw Unavailable(ErrorCode::UNAVAILABLE, "attach: " + err_text(e), e);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int passed;
        std::memcpy(&passed, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(passed);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC)
      throw Error(ErrorCode::INTERNAL, "attach reply: ancillary data truncated (too many file descriptors)");
    if (got == 0)
      throw Unavailable(ErrorCode::UNAVAILABLE, "attach socket closed after " + std::to_string(have) + " of " +
                                                    std::to_string(need) + " bytes of the reply");
    have += static_cast<std::size_t>(got);
    if (need == 4 && have == 4) {
      std::uint32_t size = (std::uint32_t{data[0]} << 24) | (std::uint32_t{data[1]} << 16) | (std::uint32_t{data[2]} << 8) | data[3];
      if (size > max_body)
        throw Error(ErrorCode::INTERNAL, "attach reply frame of " + std::to_string(size) + " bytes exceeds " + std::to_string(max_body));
      need = 4 + size;
      data.resize(need);
    }
  }
  data.erase(data.begin(), data.begin() + 4);
  return data;
}

bool peer_alive(int fd) {
  if (fd < 0) return false;
  char b;
  ssize_t n = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;
  if (n == 0) return false;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

}  // namespace fluxkv::detail
