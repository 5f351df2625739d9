#include "client_impl.hpp"

namespace fluxkv {

MemHolder::MemHolder(std::shared_ptr<detail::Session> s, std::int64_t id, const std::byte* data, std::size_t size,
                     int source, bool remote, std::int64_t put_id) noexcept
    : session_(std::move(s)), id_(id), data_(data), size_(size), source_(source), remote_(remote), put_id_(put_id) {}

MemHolder::MemHolder(MemHolder&& o) noexcept
    : session_(std::move(o.session_)),
      id_(o.id_),
      data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      source_(o.source_),
      remote_(o.remote_),
      put_id_(o.put_id_) {}

MemHolder& MemHolder::operator=(MemHolder&& o) noexcept {
  if (this != &o) {
    release();
    session_ = std::move(o.session_);
    id_ = o.id_;
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    source_ = o.source_;
    remote_ = o.remote_;
    put_id_ = o.put_id_;
  }
  return *this;
}

MemHolder::~MemHolder() { release(); }

void MemHolder::release() noexcept {
  if (!session_) return;
  session_->queue_release(id_);
  // The last holder of a closed client's session closes its attach connection here.
  session_.reset();
  data_ = nullptr;
  size_ = 0;
}

std::vector<std::byte> MemHolder::bytes() const { return std::vector<std::byte>(data_, data_ + size_); }

std::string_view MemHolder::source() const noexcept {
  switch (source_) {
    case 1: return "memory";
    case 2: return "ssd";
    default: return "unknown";
  }
}

}  // namespace fluxkv
