// ForkRegistry: every live client, so pthread_atfork handlers can make fork() safe. The
// prepare handler locks what another thread may hold (so the child does not inherit a
// locked mutex): each client's state, then every session's (Session::fork_prepare_all);
// in the child every session of the process ends (its connections closed in the child
// only), and each client drops its own and attaches again on its first call.
#pragma once

namespace fluxkv::detail {

class ClientImpl;

struct ForkRegistry {
  // Installs the pthread_atfork handlers (once): before a session's first socket exists.
  static void install();
  static void add(ClientImpl* c);
  static void remove(ClientImpl* c) noexcept;
};

}  // namespace fluxkv::detail
