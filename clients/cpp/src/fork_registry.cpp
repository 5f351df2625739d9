#include "fork_registry.hpp"

#include <pthread.h>

#include <mutex>
#include <set>

#include "client_impl.hpp"

namespace fluxkv::detail {

namespace {

std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}

// Intentionally leaked: clients may be destroyed from static destructors after this
// would otherwise have been.
std::set<ClientImpl*>& clients() {
  static auto* s = new std::set<ClientImpl*>();
  return *s;
}

// Clients before sessions: a client's lock is taken before its session's everywhere.
void prepare() {
  registry_mu().lock();
  for (ClientImpl* c : clients()) c->fork_prepare();
  Session::fork_prepare_all();
}

void parent() {
  Session::fork_parent_all();
  for (auto it = clients().rbegin(); it != clients().rend(); ++it) (*it)->fork_parent();
  registry_mu().unlock();
}

void child() {
  Session::fork_child_all();
  for (auto it = clients().rbegin(); it != clients().rend(); ++it) (*it)->fork_child();
  registry_mu().unlock();
}

}  // namespace

void ForkRegistry::install() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(&prepare, &parent, &child); });
}

void ForkRegistry::add(ClientImpl* c) {
  install();
  std::lock_guard lk(registry_mu());
  clients().insert(c);
}

void ForkRegistry::remove(ClientImpl* c) noexcept {
  std::lock_guard lk(registry_mu());
  clients().erase(c);
}

}  // namespace fluxkv::detail
