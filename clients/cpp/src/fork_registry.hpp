// ForkRegistry: every live client, so pthread_atfork handlers can make fork() safe. The
// prepare handler locks what another thread may hold (so the child does not inherit a
// locked mutex); in the child, each client drops the inherited session (closing its
// connections in the child only) and attaches again on its first call.
#pragma once

namespace fluxkv::detail {

class ClientImpl;

struct ForkRegistry {
  static void add(ClientImpl* c);
  static void remove(ClientImpl* c) noexcept;
};

}  // namespace fluxkv::detail
