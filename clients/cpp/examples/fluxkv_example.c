/* The fluxkv C ABI in one program: connect, put, get (zero copy), a zero-copy put, exists,
 * delete, a miss, status, and a holder released after the client closed.
 *
 *   cc -o fluxkv_example fluxkv_example.c $(pkg-config --cflags --libs fluxkv)
 *   ./fluxkv_example /run/fluxkv/fluxkv.sock      # or no argument: $FLUXKV_SOCKET
 *
 * Prints "ok" and exits 0 when every step behaved; otherwise says which step failed. */
#include <fluxkv/fluxkv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(step, err)                                                                       \
  do {                                                                                        \
    fprintf(stderr, "%s failed: code %d errno %d: %s\n", step, (err).code, (err).sys_errno, (err).message); \
    return 1;                                                                                 \
  } while (0)

int main(int argc, char** argv) {
  fluxkv_error err;
  const char* sock = argc > 1 ? argv[1] : NULL;
  if (fluxkv_abi_version() != FLUXKV_ABI_VERSION) {
    fprintf(stderr, "library ABI %d, header %d\n", fluxkv_abi_version(), FLUXKV_ABI_VERSION);
    return 1;
  }
  fluxkv_client* c = fluxkv_connect(sock, &err);
  if (c == NULL) FAIL("connect", err);

  /* A plain put and a zero-copy get. */
  const char key[] = "example/greeting";
  const char value[] = "hello from C";
  if (fluxkv_put(c, key, strlen(key), value, sizeof value, &err) != 0) FAIL("put", err);
  fluxkv_holder* h = NULL;
  if (fluxkv_get(c, key, strlen(key), &h, &err) != 1) FAIL("get", err);
  if (fluxkv_holder_size(h) != sizeof value || memcmp(fluxkv_holder_data(h), value, sizeof value) != 0) {
    fprintf(stderr, "get returned other bytes\n");
    return 1;
  }
  printf("get %s: \"%s\" (%zu bytes, from %s)\n", key, (const char*)fluxkv_holder_data(h), fluxkv_holder_size(h),
         fluxkv_holder_source(h));

  /* A zero-copy put: write the value straight into shared memory. */
  const char big_key[] = "example/squares";
  size_t n = 1 << 20;
  fluxkv_pending_put* p = NULL;
  fluxkv_span span;
  if (fluxkv_put_begin(c, big_key, strlen(big_key), n, 0, &p, &span, &err) != 0) FAIL("put_begin", err);
  unsigned char* dst = span.data;
  for (size_t i = 0; i < span.len; i++) dst[i] = (unsigned char)(i * i);
  if (fluxkv_put_commit(p, &err) != 0) FAIL("put_commit", err);
  fluxkv_holder* hb = NULL;
  if (fluxkv_get(c, big_key, strlen(big_key), &hb, &err) != 1) FAIL("get squares", err);
  const unsigned char* got = fluxkv_holder_data(hb);
  for (size_t i = 0; i < n; i++) {
    if (got[i] != (unsigned char)(i * i)) {
      fprintf(stderr, "squares differ at byte %zu\n", i);
      return 1;
    }
  }
  fluxkv_holder_release(hb);

  if (fluxkv_exists(c, key, strlen(key), &err) != 1) FAIL("exists", err);
  if (fluxkv_delete(c, key, strlen(key), &err) != 1) FAIL("delete", err);
  if (fluxkv_delete(c, key, strlen(key), &err) != 0) FAIL("delete again", err);
  if (fluxkv_exists(c, key, strlen(key), &err) != 0) FAIL("exists after delete", err);
  fluxkv_holder* miss = NULL;
  if (fluxkv_get(c, key, strlen(key), &miss, &err) != 0 || miss != NULL) FAIL("get of a deleted key", err);
  if (fluxkv_delete(c, big_key, strlen(big_key), &err) != 1) FAIL("delete squares", err);

  /* Errors come back as codes, never as crashes. */
  if (fluxkv_put(c, "", 0, value, sizeof value, &err) != -1 || err.code != FLUXKV_INVALID_ARGUMENT) {
    fprintf(stderr, "an empty key was not refused with INVALID_ARGUMENT\n");
    return 1;
  }

  char* status = fluxkv_stat_json(c, &err);
  if (status == NULL) FAIL("stat", err);
  printf("status: %.120s...\n", status);
  fluxkv_free_string(status);

  fluxkv_close(c);
  /* The holder outlives the client: the deleted value is still readable, then released. */
  if (memcmp(fluxkv_holder_data(h), value, sizeof value) != 0) {
    fprintf(stderr, "holder changed after close\n");
    return 1;
  }
  fluxkv_holder_release(h);
  printf("ok\n");
  return 0;
}
