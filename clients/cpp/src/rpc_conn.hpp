// RpcConn: one framed-binary thrift connection to ExternalService on the owner's RPC
// socket (TFramedTransport's format: 4-byte big-endian length + TBinaryProtocol message).
// One call at a time; the client's pool hands each connection to one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "binary_protocol.hpp"
#include "unique_fd.hpp"

namespace fluxkv::detail {

// A call failed in transport: no answer was read. sent is false when no byte of the
// request left (it may be sent again under any retry rule); timed_out when the call ran
// past the timeout. The connection is unusable afterwards.
class Broken : public std::runtime_error {
 public:
  Broken(const std::string& what, bool sent, bool timed_out, int sys_errno = 0)
      : std::runtime_error(what), sent(sent), timed_out(timed_out), sys_errno(sys_errno) {}
  bool sent;
  bool timed_out;
  int sys_errno;
};

// The owner answered with a TApplicationException (it failed the call itself).
class AppException : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Fault injection for tests (as the Go client's hooks): when set and it returns true for a
// call's method, the reply is lost as a timed-out call loses it: once it has arrived (the
// owner acted on the call) the call fails without reading it, and the connection is closed
// with the reply unread. Null in production.
using DropReplyHook = bool (*)(std::string_view method);
extern std::atomic<DropReplyHook> drop_reply_hook;

class RpcConn {
 public:
  // Throws Broken(sent=false) when the connection cannot be opened.
  RpcConn(const std::string& path, std::chrono::milliseconds timeout);

  // Sends method(req) and reads its reply. write_req(Writer&) writes the request struct's
  // fields and stop; read_success(Reader&) reads the response struct.
  template <class W, class R>
  void call(std::string_view method, W&& write_req, R&& read_success) {
    Writer w = begin(method);
    write_req(w);
    send();
    if (DropReplyHook drop = drop_reply_hook.load(std::memory_order_relaxed); drop != nullptr && drop(method)) {
      await_reply();
      broken_ = true;
      throw Broken(std::string(method) + ": reply dropped (fault injected by a test)", true, false);
    }
    Reader r = receive(method);
    bool got = false;
    TType t;
    std::int16_t id;
    try {
      while (r.field(t, id)) {
        if (id == 0 && t == T_STRUCT) {
          read_success(r);
          got = true;
        } else {
          r.skip(t);
        }
      }
    } catch (const ProtocolError& e) {
      broken_ = true;
      throw Broken(std::string(method) + ": malformed reply: " + e.what(), true, false);
    }
    if (!got) {
      broken_ = true;
      throw Broken(std::string(method) + ": reply without a result", true, false);
    }
  }

  // False after any failure: the connection must be closed, not reused.
  bool usable() const noexcept { return !broken_; }
  // Closes this process's copy of the socket (close(2), never shutdown(2)): a forked
  // child's, of a connection its parent is using.
  void close_copy() noexcept {
    fd_.reset();
    broken_ = true;
  }

 private:
  Writer begin(std::string_view method);
  void send();
  Reader receive(std::string_view method);
  void await_reply();  // the drop hook's: waits (up to 10 s) until reply bytes can be read

  // Lowers SO_RCVTIMEO to what is left of the call (receive, after a partial read): the
  // socket's timeout bounds each recv, and an owner trickling its reply held a call of a
  // 300 ms timeout for 3.3 s (a review). Throws Broken(timed_out) when nothing is left.
  void fit_to_deadline();

  UniqueFd fd_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_{};  // of the call in progress: begin() + timeout_
  bool lowered_ = false;  // SO_RCVTIMEO is below timeout_ (restored when the reply is in)
  std::vector<std::uint8_t> out_;
  std::vector<std::uint8_t> in_;
  std::int32_t seq_ = 0;
  bool broken_ = false;
};

}  // namespace fluxkv::detail
