// Unix socket plumbing: connecting with timeouts, whole-buffer sends, and reading one
// length-prefixed frame together with the file descriptors passed on it (SCM_RIGHTS).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "unique_fd.hpp"

namespace fluxkv::detail {

// Connects a SOCK_STREAM Unix socket (close-on-exec) to path, with send and receive
// timeouts set to timeout. Throws Unavailable (nobody listens, timed out) or
// PermissionDenied (EACCES: the socket's permissions refused us); what names the socket.
UniqueFd connect_unix(const std::string& path, std::chrono::milliseconds timeout, const char* what);

// The same in two steps: a SOCK_STREAM Unix socket (close-on-exec; throws Unavailable), then
// connecting it (a caller that must record the socket before it connects: Session).
UniqueFd unix_stream_socket();
void connect_unix(const UniqueFd& fd, const std::string& path, std::chrono::milliseconds timeout, const char* what);

// Sets SO_RCVTIMEO and SO_SNDTIMEO (0: none).
void set_timeouts(int fd, std::chrono::milliseconds timeout);

// Writes all of buf; returns 0 on success, else errno, with *written the bytes that left.
int send_all(int fd, const std::uint8_t* buf, std::size_t n, std::size_t* written);

// Reads exactly one frame (4-byte big-endian length + body, body at most max_body bytes)
// and every fd passed with any of its bytes. Never reads past the frame. Throws
// Unavailable when the peer closed or timed out.
std::vector<std::uint8_t> recv_frame_with_fds(int fd, std::uint32_t max_body, std::vector<UniqueFd>& fds);

// Whether the peer still holds the connection open (MSG_PEEK without waiting): false once
// it closed it.
bool peer_alive(int fd);

}  // namespace fluxkv::detail
