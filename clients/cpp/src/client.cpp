// fluxkv::Client: the public API, forwarding to ClientImpl.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "client_impl.hpp"

namespace fluxkv {

namespace {
constexpr const char* kSocketName = "fluxkv.sock";

// A path given by the user: empty means the default; a directory means DIR/fluxkv.sock.
std::string resolve_socket(const std::string& path) {
  if (path.empty()) return default_socket();
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return path + "/" + kSocketName;
  return path;
}

detail::ClientImpl& live(const std::shared_ptr<detail::ClientImpl>& impl) {
  if (!impl) throw Unavailable(ErrorCode::UNAVAILABLE, "the client was moved from");
  return *impl;
}
}  // namespace

std::string default_socket() {
  if (const char* env = std::getenv("FLUXKV_SOCKET"); env != nullptr && *env != '\0') return env;
  // A node this user runs, else the system's (a login sets XDG_RUNTIME_DIR, and the
  // systemd owner listens in /run/fluxkv).
  if (const char* runtime = std::getenv("XDG_RUNTIME_DIR"); runtime != nullptr && *runtime != '\0') {
    std::string own = std::string(runtime) + "/fluxkv/" + kSocketName;
    if (::access(own.c_str(), F_OK) == 0) return own;
  }
  return std::string("/run/fluxkv/") + kSocketName;
}

Client Client::connect(const std::string& socket_path, const Options& opts) {
  return Client(std::make_shared<detail::ClientImpl>(resolve_socket(socket_path), opts));
}

Client::Client(std::shared_ptr<detail::ClientImpl> impl) noexcept : impl_(std::move(impl)) {}
Client::Client(Client&&) noexcept = default;
Client& Client::operator=(Client&& o) noexcept {
  if (this != &o) {
    close();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Client::~Client() { close(); }

void Client::close() noexcept {
  if (impl_) impl_->close();
}

void Client::put(std::string_view key, const void* data, std::size_t len, PutOptions opts) {
  if (data == nullptr && len > 0) throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "put: data is null");
  live(impl_).put(key, len, opts.reject_if_exists, static_cast<const std::byte*>(data), nullptr);
}

void Client::put(std::string_view key, std::span<const std::byte> value, PutOptions opts) {
  put(key, value.data(), value.size(), opts);
}

std::int64_t Client::put_with(std::string_view key, std::size_t len, const std::function<void(std::span<std::byte>)>& fill,
                              PutOptions opts) {
  if (!fill) throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "put_with: fill is empty");
  return live(impl_).put(key, len, opts.reject_if_exists, nullptr, &fill);
}

MemHolder Client::get(std::string_view key) { return live(impl_).get(key); }

std::size_t Client::get_into(std::string_view key, std::span<std::byte> out) {
  MemHolder h = get(key);
  if (out.size() < h.size())
    throw InvalidArgument(ErrorCode::INVALID_ARGUMENT, "buffer of " + std::to_string(out.size()) +
                                                           " bytes is smaller than the value of " + detail::quote(key) + " (" +
                                                           std::to_string(h.size()) + " bytes)");
  std::copy(h.data(), h.data() + h.size(), out.data());
  return h.size();
}

bool Client::exists(std::string_view key) { return live(impl_).flag_call("Exists", key); }
bool Client::remove(std::string_view key) { return live(impl_).flag_call("Delete", key); }

void Client::batch_put(std::span<const PutItem> items, PutOptions opts) { live(impl_).batch_put(items, opts.reject_if_exists); }

std::vector<std::optional<MemHolder>> Client::batch_get(std::span<const std::string_view> keys) {
  return live(impl_).batch_get(keys);
}
std::vector<bool> Client::batch_exists(std::span<const std::string_view> keys) {
  return live(impl_).batch_flags("BatchExists", keys);
}
std::size_t Client::batch_exists_prefix(std::span<const std::string_view> keys, std::chrono::milliseconds pin) {
  return live(impl_).batch_exists_prefix(keys, pin.count());
}
std::vector<bool> Client::batch_remove(std::span<const std::string_view> keys) {
  return live(impl_).batch_flags("BatchDelete", keys);
}

std::string Client::stat_json() { return live(impl_).stat_json(); }
void Client::flush() { live(impl_).flush(); }

std::string Client::node_id() { return live(impl_).current()->node_id; }
std::int64_t Client::generation() { return live(impl_).current()->generation; }
std::int64_t Client::segment_size() { return live(impl_).current()->segment_size; }
bool Client::isolated() { return live(impl_).current()->isolated; }
const std::string& Client::socket_path() const { return live(impl_).path(); }
std::int64_t Client::release_errors() const { return live(impl_).release_errors(); }

}  // namespace fluxkv
