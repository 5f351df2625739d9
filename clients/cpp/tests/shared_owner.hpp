// The owners most tests share (started on first use, stopped at exit): one plain, one
// isolating its clients with a small put area (so values stream through it).
#pragma once

#include <cstring>

#include "owner.hpp"

namespace fkvtest {

inline Owner& plain_owner() {
  static Owner o({}, "256MiB");
  return o;
}

// Client isolation with a 1 MiB put area: values above it are streamed through it.
inline Owner& isolated_owner() {
  static Owner o({"--client-isolation", "--put-area", "1MiB"}, "128MiB");
  return o;
}

inline bool same(const fluxkv::MemHolder& h, const std::vector<std::byte>& want) {
  return h.size() == want.size() && std::memcmp(h.data(), want.data(), want.size()) == 0;
}

}  // namespace fkvtest
