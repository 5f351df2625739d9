// Mapping owns one shared mapping of a memfd (the owner's segment or a put area) and
// unmaps it on destruction. The fd itself is not kept: the mapping outlives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace fluxkv::detail {

class Mapping {
 public:
  Mapping() noexcept = default;
  // Maps size bytes of fd, read-only or read-write; checks the memfd holds that much.
  // what names the mapping in errors.
  Mapping(int fd, std::int64_t size, bool writable, const char* what);
  Mapping(Mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();

  std::byte* data() const noexcept { return base_; }
  std::size_t size() const noexcept { return size_; }
  explicit operator bool() const noexcept { return base_ != nullptr; }
  // Whether [offset, offset+len) is a non-empty range inside the mapping.
  bool contains(std::int64_t offset, std::int64_t len) const noexcept {
    return offset >= 0 && len > 0 && static_cast<std::uint64_t>(offset) <= size_ &&
           static_cast<std::uint64_t>(len) <= size_ - static_cast<std::uint64_t>(offset);
  }

 private:
  std::byte* base_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace fluxkv::detail
