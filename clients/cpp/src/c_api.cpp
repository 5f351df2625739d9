// The C ABI (fluxkv.h) over the C++ client: every entry point catches everything, so no
// exception crosses into C, and reports it in a fluxkv_error.
#include "fluxkv/fluxkv.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "client_impl.hpp"

static_assert(FLUXKV_MAX_PIN_MS == fluxkv::wire::MAX_PIN_MS, "fluxkv.h: FLUXKV_MAX_PIN_MS differs from the IDL");
static_assert(fluxkv::kMaxPin.count() == fluxkv::wire::MAX_PIN_MS, "fluxkv.hpp: kMaxPin differs from the IDL");

struct fluxkv_client {
  fluxkv::Client c;
};

struct fluxkv_holder {
  fluxkv::MemHolder h;
};

struct fluxkv_pending_put {
  std::shared_ptr<fluxkv::detail::ClientImpl> impl;  // keeps the client's state alive
  std::unique_ptr<fluxkv::detail::PutTxn> txn;
  std::string key;
  bool reject;
};

namespace {

void set_error(fluxkv_error* err, int code, int sys_errno, const char* message) {
  if (err == nullptr) return;
  err->code = code;
  err->sys_errno = sys_errno;
  std::strncpy(err->message, message, sizeof err->message - 1);
  err->message[sizeof err->message - 1] = '\0';
}

void clear_error(fluxkv_error* err) { set_error(err, FLUXKV_OK, 0, ""); }

// Runs fn, translating any exception into err; returns fallback on one.
template <class F, class R>
R guarded(fluxkv_error* err, R fallback, F&& fn) {
  try {
    clear_error(err);
    return fn();
  } catch (const fluxkv::Error& e) {
    set_error(err, static_cast<int>(e.code()), e.sys_errno(), e.what());
  } catch (const std::bad_alloc&) {
    set_error(err, FLUXKV_INTERNAL, ENOMEM, "out of memory");
  } catch (const std::exception& e) {
    set_error(err, FLUXKV_INTERNAL, 0, e.what());
  } catch (...) {
    set_error(err, FLUXKV_INTERNAL, 0, "unknown error");
  }
  return fallback;
}

std::string_view key_of(const char* key, size_t key_len) {
  if (key == nullptr && key_len > 0) throw fluxkv::InvalidArgument(fluxkv::ErrorCode::INVALID_ARGUMENT, "key is NULL");
  return {key == nullptr ? "" : key, key_len};
}

// The FLUXKV_PUT_* flags as reject_if_exists: a bit this library does not know is refused,
// not ignored (a caller built against a newer header must not get a put that quietly lacks
// what it asked for).
bool reject_of(unsigned flags) {
  constexpr unsigned known = FLUXKV_PUT_REJECT_IF_EXISTS;
  if ((flags & ~known) != 0) {
    char msg[128];
    std::snprintf(msg, sizeof msg, "unknown put flags 0x%x (known: FLUXKV_PUT_REJECT_IF_EXISTS = 0x%x)", flags & ~known, known);
    throw fluxkv::InvalidArgument(fluxkv::ErrorCode::INVALID_ARGUMENT, msg);
  }
  return (flags & FLUXKV_PUT_REJECT_IF_EXISTS) != 0;
}

fluxkv::Client& client_of(fluxkv_client* c) {
  if (c == nullptr) throw fluxkv::InvalidArgument(fluxkv::ErrorCode::INVALID_ARGUMENT, "client is NULL");
  return c->c;
}

}  // namespace

extern "C" {

int fluxkv_abi_version(void) { return FLUXKV_ABI_VERSION; }

fluxkv_client* fluxkv_connect(const char* socket_path, fluxkv_error* err) {
  return guarded(err, static_cast<fluxkv_client*>(nullptr), [&] {
    return new fluxkv_client{fluxkv::Client::connect(socket_path == nullptr ? "" : socket_path)};
  });
}

void fluxkv_close(fluxkv_client* c) { delete c; }

int fluxkv_put(fluxkv_client* c, const char* key, size_t key_len, const void* data, size_t len, fluxkv_error* err) {
  return fluxkv_put_flags(c, key, key_len, data, len, 0, err);
}

int fluxkv_put_flags(fluxkv_client* c, const char* key, size_t key_len, const void* data, size_t len, unsigned flags,
                     fluxkv_error* err) {
  return guarded(err, -1, [&] {
    bool reject = reject_of(flags);
    client_of(c).put(key_of(key, key_len), data, len, fluxkv::PutOptions{reject});
    return 0;
  });
}

int fluxkv_put_begin(fluxkv_client* c, const char* key, size_t key_len, size_t len, unsigned flags, fluxkv_pending_put** put,
                     fluxkv_span* span, fluxkv_error* err) {
  if (put != nullptr) *put = nullptr;
  if (span != nullptr) *span = fluxkv_span{nullptr, 0};  // what a failure leaves
  return guarded(err, -1, [&] {
    if (put == nullptr || span == nullptr)
      throw fluxkv::InvalidArgument(fluxkv::ErrorCode::INVALID_ARGUMENT, "put and span must not be NULL");
    bool reject = reject_of(flags);
    auto p = std::make_unique<fluxkv_pending_put>();
    p->impl = fluxkv::detail::ClientImpl::shared(client_of(c));
    p->key = std::string(key_of(key, key_len));
    p->reject = reject;
    p->txn = std::make_unique<fluxkv::detail::PutTxn>(*p->impl, p->key, len, p->reject);
    std::span<std::byte> w = p->txn->writable();
    span->data = w.data();
    span->len = w.size();
    *put = p.release();
    return 0;
  });
}

int fluxkv_put_commit(fluxkv_pending_put* put, fluxkv_error* err) {
  std::unique_ptr<fluxkv_pending_put> p(put);
  return guarded(err, -1, [&] {
    if (!p) throw fluxkv::InvalidArgument(fluxkv::ErrorCode::INVALID_ARGUMENT, "put is NULL");
    try {
      p->txn->commit(nullptr);
    } catch (const fluxkv::detail::OutcomeUnknown& e) {
      // The owner restarted before the put was published. The bytes are still in this
      // process (the old session's mapping or the scratch buffer): without reject_if_exists
      // put them again on the new session, as the protocol's rule says; with it the outcome
      // stays unknown, unless the put was never ended (NotWritten: nothing was published).
      if (p->reject && dynamic_cast<const fluxkv::detail::NotWritten*>(&e) == nullptr)
        throw fluxkv::Unavailable(fluxkv::ErrorCode::UNAVAILABLE, "put " + fluxkv::detail::quote(p->key) +
                                                                      ": the outcome is unknown: " + e.what());
      if (!p->txn->kept())
        throw fluxkv::Unavailable(fluxkv::ErrorCode::UNAVAILABLE,
                                  "put " + fluxkv::detail::quote(p->key) + ": the outcome is unknown (" + e.what() +
                                      ") and the bytes written in place may be another value's by now: put it again");
      p->impl->put_redos.fetch_add(1, std::memory_order_relaxed);
      std::span<std::byte> w = p->txn->writable();
      p->impl->put(p->key, w.size(), p->reject, w.data(), nullptr);
    }
    return 0;
  });
}

void fluxkv_put_abort(fluxkv_pending_put* put) { delete put; }  // ~PutTxn aborts an open put

int fluxkv_get(fluxkv_client* c, const char* key, size_t key_len, fluxkv_holder** out, fluxkv_error* err) {
  if (out != nullptr) *out = nullptr;
  return guarded(err, -1, [&] {
    if (out == nullptr) throw fluxkv::InvalidArgument(fluxkv::ErrorCode::INVALID_ARGUMENT, "out is NULL");
    try {
      *out = new fluxkv_holder{client_of(c).get(key_of(key, key_len))};
    } catch (const fluxkv::KeyNotFound&) {
      return 0;
    }
    return 1;
  });
}

const void* fluxkv_holder_data(const fluxkv_holder* h) { return h == nullptr ? nullptr : h->h.data(); }
size_t fluxkv_holder_size(const fluxkv_holder* h) { return h == nullptr ? 0 : h->h.size(); }
const char* fluxkv_holder_source(const fluxkv_holder* h) {
  if (h == nullptr) return "unknown";
  std::string_view s = h->h.source();
  return s.data();  // a string literal: NUL-terminated, static
}
int fluxkv_holder_remote(const fluxkv_holder* h) { return h != nullptr && h->h.remote() ? 1 : 0; }
void fluxkv_holder_release(fluxkv_holder* h) { delete h; }

int fluxkv_exists(fluxkv_client* c, const char* key, size_t key_len, fluxkv_error* err) {
  return guarded(err, -1, [&] { return client_of(c).exists(key_of(key, key_len)) ? 1 : 0; });
}

int fluxkv_delete(fluxkv_client* c, const char* key, size_t key_len, fluxkv_error* err) {
  return guarded(err, -1, [&] { return client_of(c).remove(key_of(key, key_len)) ? 1 : 0; });
}

int fluxkv_batch_exists_prefix(fluxkv_client* c, const char* const* keys, const size_t* key_lens, size_t n, int64_t pin_ms,
                               size_t* found, fluxkv_error* err) {
  if (found != nullptr) *found = 0;
  return guarded(err, -1, [&] {
    if (found == nullptr) throw fluxkv::InvalidArgument(fluxkv::ErrorCode::INVALID_ARGUMENT, "found is NULL");
    if (n > 0 && (keys == nullptr || key_lens == nullptr))
      throw fluxkv::InvalidArgument(fluxkv::ErrorCode::INVALID_ARGUMENT, "keys and key_lens must not be NULL");
    fluxkv::Client& client = client_of(c);
    std::vector<std::string_view> ks;
    ks.reserve(n);
    for (size_t i = 0; i < n; ++i) ks.push_back(key_of(keys[i], key_lens[i]));
    *found = client.batch_exists_prefix(ks, std::chrono::milliseconds(pin_ms));
    return 0;
  });
}

char* fluxkv_stat_json(fluxkv_client* c, fluxkv_error* err) {
  return guarded(err, static_cast<char*>(nullptr), [&] {
    std::string s = client_of(c).stat_json();
    auto* out = static_cast<char*>(std::malloc(s.size() + 1));
    if (out == nullptr) throw std::bad_alloc();
    std::memcpy(out, s.c_str(), s.size() + 1);
    return out;
  });
}

void fluxkv_free_string(char* s) { std::free(s); }

}  // extern "C"
