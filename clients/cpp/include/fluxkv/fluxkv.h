/* fluxkv C ABI: the fluxkv client for C and for every language that binds C (Rust, Go with
 * cgo, Julia, ...). Opaque handles; no C++ exception crosses it.
 *
 * Conventions: every function that returns int returns -1 on error and fills *err (err may
 * be NULL); otherwise 0 or, where documented, 1. Keys are byte strings (key, key_len).
 * A client is safe for concurrent use by any number of threads, except fluxkv_close: it
 * frees the client, so no other call on it may be running or start.
 *
 *   fluxkv_error err;
 *   fluxkv_client* c = fluxkv_connect(NULL, &err);        // $FLUXKV_SOCKET or the default
 *   fluxkv_put(c, "k", 1, buf, len, &err);
 *   fluxkv_holder* h;
 *   if (fluxkv_get(c, "k", 1, &h, &err) == 1) {            // 1 hit, 0 miss, -1 error
 *     use(fluxkv_holder_data(h), fluxkv_holder_size(h));   // zero copy, read-only
 *     fluxkv_holder_release(h);
 *   }
 *   fluxkv_close(c);
 */
#ifndef FLUXKV_H
#define FLUXKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What fluxkv_abi_version() returns for this header: bumped on any incompatible change. */
#define FLUXKV_ABI_VERSION 1

/* The protocol's ErrorCode (protocol/common.thrift); the library checks at compile time that
 * these equal the IDL. Errors the client finds itself use INVALID_ARGUMENT (bad arguments),
 * UNAVAILABLE (the owner cannot be reached) or INTERNAL (malformed replies, system errors). */
enum {
  FLUXKV_OK = 0,
  FLUXKV_KEY_NOT_FOUND = 1,
  FLUXKV_NO_SPACE = 2,
  FLUXKV_INVALID_ARGUMENT = 3,
  FLUXKV_ALREADY_EXISTS = 4,
  FLUXKV_BUSY = 5,
  FLUXKV_STALE_GENERATION = 6,
  FLUXKV_UNAVAILABLE = 7,
  FLUXKV_INTERNAL = 8,
  FLUXKV_PERMISSION_DENIED = 9,
  /* Between a master that is not the leader and an owner only (master HA on etcd); an
     owner answers its clients UNAVAILABLE instead. */
  FLUXKV_NOT_LEADER = 10
};

typedef struct {
  int code;          /* FLUXKV_* */
  int sys_errno;     /* the errno behind a failed system call, else 0 */
  char message[256]; /* NUL-terminated, cut to fit */
} fluxkv_error;

typedef struct fluxkv_client fluxkv_client;
typedef struct fluxkv_holder fluxkv_holder;
typedef struct fluxkv_pending_put fluxkv_pending_put;

/* A writable byte range (fluxkv_put_begin). */
typedef struct {
  void* data;
  size_t len;
} fluxkv_span;

/* Put flags (fluxkv_put_flags, fluxkv_put_begin): a bit not defined here is refused with
 * INVALID_ARGUMENT, never ignored. */
#define FLUXKV_PUT_REJECT_IF_EXISTS 1u

int fluxkv_abi_version(void);

/* Attaches to the owner at socket_path (a socket or its directory; NULL or "": $FLUXKV_SOCKET,
 * else $XDG_RUNTIME_DIR/fluxkv/fluxkv.sock if it exists, else /run/fluxkv/fluxkv.sock). NULL on error. */
fluxkv_client* fluxkv_connect(const char* socket_path, fluxkv_error* err);
/* Sends queued releases, ends the session and frees the client (once every other thread's
 * call on it returned: it may not run beside them). Holders stay valid until released.
 * NULL is a no-op. */
void fluxkv_close(fluxkv_client* c);

/* Stores len bytes under key (one copy into shared memory). 0 ok. */
int fluxkv_put(fluxkv_client* c, const char* key, size_t key_len, const void* data, size_t len, fluxkv_error* err);
/* fluxkv_put with FLUXKV_PUT_* flags (ALREADY_EXISTS with FLUXKV_PUT_REJECT_IF_EXISTS). */
int fluxkv_put_flags(fluxkv_client* c, const char* key, size_t key_len, const void* data, size_t len, unsigned flags,
                     fluxkv_error* err);

/* Zero-copy put: begin reserves len bytes and returns where to write them in *span (in the
 * shared segment, or under client isolation in the session's put area or a scratch buffer);
 * commit publishes them, abort gives the reservation back. Both free *put. While a put is
 * open under client isolation other puts of the client wait for it: commit or abort soon,
 * and before fluxkv_close. 0 ok; -1 on error (*put is then NULL and *span {NULL, 0}). */
int fluxkv_put_begin(fluxkv_client* c, const char* key, size_t key_len, size_t len, unsigned flags, fluxkv_pending_put** put,
                     fluxkv_span* span, fluxkv_error* err);
int fluxkv_put_commit(fluxkv_pending_put* put, fluxkv_error* err);
void fluxkv_put_abort(fluxkv_pending_put* put);

/* 1 with *out set to a holder of key's value, 0 on a miss (*out NULL), -1 on error. */
int fluxkv_get(fluxkv_client* c, const char* key, size_t key_len, fluxkv_holder** out, fluxkv_error* err);
/* The value's bytes (read-only: a write faults) and length, valid until release. */
const void* fluxkv_holder_data(const fluxkv_holder* h);
size_t fluxkv_holder_size(const fluxkv_holder* h);
/* "memory" or "ssd": where the owner found the bytes (a static string). */
const char* fluxkv_holder_source(const fluxkv_holder* h);
/* 1 when the bytes crossed the network (pulled from another owner's replica), else 0. */
int fluxkv_holder_remote(const fluxkv_holder* h);
/* Gives the bytes back and frees the holder; valid after fluxkv_close. NULL is a no-op. */
void fluxkv_holder_release(fluxkv_holder* h);

/* 1 present, 0 absent. */
int fluxkv_exists(fluxkv_client* c, const char* key, size_t key_len, fluxkv_error* err);
/* 1 deleted, 0 absent. Holders of the key keep their bytes. */
int fluxkv_delete(fluxkv_client* c, const char* key, size_t key_len, fluxkv_error* err);

/* The longest pin of fluxkv_batch_exists_prefix, in milliseconds (the protocol's MAX_PIN_MS). */
#define FLUXKV_MAX_PIN_MS 5000

/* A prefix lookup: keys[i] (key_lens[i] bytes), i < n, are the pages of one prompt in order;
 * *found is set to how many leading keys are present. The owner evaluates each chunk of
 * MAX_BATCH (4096) keys in one call and stops at the first absent key; a later chunk is sent
 * only when the whole previous one was present. pin_ms > 0 (at most FLUXKV_MAX_PIN_MS) also
 * pins the pages found for that long in the owner's memory, so the loads that follow find
 * them: no release is needed (a pin ends when its time is up, when the client closes, or
 * when the client gets the key). A pin outside 0..FLUXKV_MAX_PIN_MS, a bad key, or NULL keys
 * or key_lens with n > 0 are refused with INVALID_ARGUMENT before anything is sent. 0 ok;
 * -1 on error (*found is then 0). */
int fluxkv_batch_exists_prefix(fluxkv_client* c, const char* const* keys, const size_t* key_lens, size_t n, int64_t pin_ms,
                               size_t* found, fluxkv_error* err);

/* The owner's status as a NUL-terminated JSON object (node_id, keys, client_holders, clients,
 * members); free it with fluxkv_free_string. NULL on error. */
char* fluxkv_stat_json(fluxkv_client* c, fluxkv_error* err);
void fluxkv_free_string(char* s);

#ifdef __cplusplus
}
#endif

#endif /* FLUXKV_H */
