#include "rpc_conn.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "fluxkv/fluxkv.hpp"
#include "unix_socket.hpp"
#include "wire_constants.hpp"

namespace fluxkv::detail {

std::atomic<DropReplyHook> drop_reply_hook{nullptr};

namespace {
constexpr std::size_t kRecvSize = 64 * 1024;

std::uint32_t load_be32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

Broken io_error(const char* what, int e, bool sent) {
  bool timed_out = e == EAGAIN || e == EWOULDBLOCK;
  return Broken(std::string(what) + ": " + (timed_out ? "timed out" : std::strerror(e)), sent, timed_out, e);
}
}  // namespace

RpcConn::RpcConn(const std::string& path, std::chrono::milliseconds timeout) : timeout_(timeout) {
  try {
    fd_ = connect_unix(path, timeout, "RPC socket");
  } catch (const Error& e) {
    throw Broken(e.message(), false, false, e.sys_errno());
  }
  in_.resize(kRecvSize);
}

void RpcConn::fit_to_deadline() {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
  if (left.count() <= 0) {
    broken_ = true;
    throw Broken("receive: timed out (the reply did not come whole within the call timeout)", true, true, EAGAIN);
  }
  set_timeouts(fd_.get(), left);
  lowered_ = true;
}

void RpcConn::await_reply() {
  pollfd p{fd_.get(), POLLIN, 0};
  while (::poll(&p, 1, 10'000) < 0 && errno == EINTR) {
  }
}

Writer RpcConn::begin(std::string_view method) {
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  out_.clear();
  out_.resize(4);  // the frame length, patched by send()
  Writer w(out_);
  w.message_begin(method, M_CALL, ++seq_);
  w.field(T_STRUCT, 1);  // args.req
  return w;
}

void RpcConn::send() {
  Writer(out_).stop();  // end of the args struct
  std::size_t n = out_.size();
  if (n > static_cast<std::size_t>(wire::MAX_FRAME_BYTES))
    throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "request frame of " + std::to_string(n) +
                                                           " bytes exceeds the limit of " + std::to_string(wire::MAX_FRAME_BYTES));
  auto body = static_cast<std::uint32_t>(n - 4);
  out_[0] = static_cast<std::uint8_t>(body >> 24);
  out_[1] = static_cast<std::uint8_t>(body >> 16);
  out_[2] = static_cast<std::uint8_t>(body >> 8);
  out_[3] = static_cast<std::uint8_t>(body);
  std::size_t written = 0;
  if (int e = send_all(fd_.get(), out_.data(), n, &written); e != 0) {
    broken_ = true;
    throw io_error("send", e, written > 0);
  }
}

Reader RpcConn::receive(std::string_view method) {
  std::size_t have = 0;
  std::size_t need = 4;
  while (have < need) {
    ssize_t got = ::recv(fd_.get(), in_.data() + have, in_.size() - have, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      broken_ = true;
      throw io_error("receive", errno, true);
    }
    if (got == 0) {
      broken_ = true;
      throw Broken("the owner closed the connection", true, false);
    }
    have += static_cast<std::size_t>(got);
    if (need == 4 && have >= 4) {
      std::uint32_t body = load_be32(in_.data());
      if (body == 0 || std::uint64_t{body} + 4 > static_cast<std::uint64_t>(wire::MAX_FRAME_BYTES)) {
        broken_ = true;
        throw Broken("reply frame of " + std::to_string(body) + " bytes", true, false);
      }
      need = 4 + std::size_t{body};
      if (in_.size() < need) in_.resize(need);
    }
    if (have < need) fit_to_deadline();  // (not on the usual path: a whole frame in one read)
  }
  if (have > need) {
    broken_ = true;
    throw Broken("the owner sent more than one reply frame", true, false);
  }
  if (lowered_) {
    set_timeouts(fd_.get(), timeout_);
    lowered_ = false;
  }
  Reader r(in_.data() + 4, need - 4);
  std::string name;
  MessageType type;
  std::int32_t seq;
  try {
    r.message_begin(name, type, seq);
    if (type == M_EXCEPTION) {
      std::string msg;
      std::int32_t kind = 0;
      TType t;
      std::int16_t id;
      while (r.field(t, id)) {
        if (id == 1 && t == T_STRING) msg = r.string();
        else if (id == 2 && t == T_I32) kind = r.i32();
        else r.skip(t);
      }
      broken_ = true;  // keep the pool free of connections in doubt
      throw AppException(std::string(method) + ": " + msg + " (TApplicationException type " + std::to_string(kind) + ")");
    }
  } catch (const ProtocolError& e) {
    broken_ = true;
    throw Broken(std::string(method) + ": malformed reply header: " + e.what(), true, false);
  }
  if (type != M_REPLY || name != method || seq != seq_) {
    broken_ = true;
    throw Broken("reply to " + name + "#" + std::to_string(seq) + " while waiting for " + std::string(method) + "#" +
                     std::to_string(seq_),
                 true, false);
  }
  return r;
}

}  // namespace fluxkv::detail
