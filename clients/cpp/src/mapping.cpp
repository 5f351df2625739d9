#include "mapping.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "fluxkv/fluxkv.hpp"

namespace fluxkv::detail {

Mapping::Mapping(int fd, std::int64_t size, bool writable, const char* what) {
  if (size <= 0) throw Error(ErrorCode::INTERNAL, std::string("attach reply announces ") + what + " size " + std::to_string(size));
  // A memfd that could shrink under the mapping would make a read of it die of SIGBUS:
  // the owner seals it against shrinking and growing, and its size is the announced one.
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    int e = errno;
    throw Error(ErrorCode::INTERNAL, std::string(what) + " is not a sealable memfd (F_GET_SEALS: " + std::strerror(e) + ")", e);
  }
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
    throw Error(ErrorCode::INTERNAL, std::string(what) + " memfd is not sealed against shrinking and growing");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    throw Error(ErrorCode::INTERNAL, std::string("fstat ") + what + ": " + std::strerror(e), e);
  }
  if (st.st_size != size)
    throw Error(ErrorCode::INTERNAL, std::string("memfd holds ") + std::to_string(st.st_size) + " bytes, not the announced " +
                                         what + " size " + std::to_string(size));
  int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = ::mmap(nullptr, static_cast<std::size_t>(size), prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    throw Error(ErrorCode::INTERNAL, std::string("map ") + what + " (" + std::to_string(size) + " bytes): " + std::strerror(e), e);
  }
  base_ = static_cast<std::byte*>(p);
  size_ = static_cast<std::size_t>(size);
}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, size_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Mapping::~Mapping() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

}  // namespace fluxkv::detail
