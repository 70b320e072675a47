/* tests/cuda/test_cuda_iface.c: the CUDA plugin through its interface table alone (dlopen, kiln_backend_entry): buffers allocated on a queue, the pinned-memory cache, reused event pairs; skipped (77) without a CUDA device. */
/*
 * These are the slots whose behaviour the core cannot show from outside:
 * buffer_allocate_on (a slot the core does not call yet), host_allocate
 * handing back the block host_free returned, and queue_record reusing
 * released events. KILN_TEST_CUDA_PLUGIN names the plugin (meson sets it).
 * Runs against whatever libcuda.so.1 the loader finds: a GPU's driver, or
 * the test driver of tests/cuda/emulator.
 */
#include <check.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/backend.h"

static _Thread_local char message[4096];
static kiln_status_t host_set_error(kiln_status_t status, const char *fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof message, fmt, args);
  va_end(args);
  return status;
}
static const char *host_last_error(void) { return message; }
static void host_log(kiln_log_level_t level, const char *fmt, ...) {}
static kiln_log_level_t host_log_level(void) { return KILN_LOG_OFF; }
static const char *host_setting(const char *variable) { return NULL; }
static const kiln_host_t host = {
    .size = sizeof(kiln_host_t),
    .set_error = host_set_error,
    .last_error = host_last_error,
    .log = host_log,
    .log_level = host_log_level,
    .setting = host_setting,
};

static const kiln_backend_iface_t *cuda;
static kiln_backend_context_t *ctx;
static kiln_backend_device_desc_t desc;

#define OK_(call)                                                                          \
  do {                                                                                     \
    kiln_status_t s_ = (call);                                                             \
    ck_assert_msg(s_ == KILN_OK, "%s -> %d: %s", #call, (int)s_, message);                 \
  } while (0)

START_TEST(test_buffer_allocated_on_a_queue) {
  ck_assert_ptr_nonnull(cuda->buffer_allocate_on);
  kiln_backend_queue_t *queue;
  OK_(cuda->queue_create(ctx, desc.impl, &queue));
  enum { N = 1 << 16 };
  uint32_t *data = NULL, *back = NULL;
  OK_(cuda->host_allocate(ctx, desc.impl, N * sizeof *data, (void **)&data));
  OK_(cuda->host_allocate(ctx, desc.impl, N * sizeof *back, (void **)&back));
  for (uint32_t i = 0; i < N; i++) data[i] = i ^ 0x5a5a5a5au;
  /* Allocated, written, read and freed in the queue's order, no waiting. */
  for (int round = 0; round < 8; round++) {
    kiln_backend_buffer_t *buffer;
    OK_(cuda->buffer_allocate_on(ctx, desc.impl, queue, N * sizeof *data, &buffer));
    OK_(cuda->buffer_write(ctx, queue, buffer, 0, data, N * sizeof *data, false));
    memset(back, 0, N * sizeof *back);
    OK_(cuda->buffer_read(ctx, queue, buffer, 0, back, N * sizeof *back, false));
    OK_(cuda->queue_finish(ctx, queue));
    ck_assert_int_eq(memcmp(data, back, N * sizeof *data), 0);
    cuda->buffer_free(ctx, desc.impl, buffer);
  }
  /* queue NULL: for any queue, as buffer_allocate. */
  kiln_backend_buffer_t *any;
  OK_(cuda->buffer_allocate_on(ctx, desc.impl, NULL, 4096, &any));
  cuda->buffer_free(ctx, desc.impl, any);
  kiln_backend_buffer_t *empty;
  OK_(cuda->buffer_allocate_on(ctx, desc.impl, queue, 0, &empty));
  cuda->buffer_free(ctx, desc.impl, empty);
  cuda->host_free(ctx, desc.impl, data);
  cuda->host_free(ctx, desc.impl, back);
  OK_(cuda->queue_finish(ctx, queue));
  cuda->queue_destroy(ctx, queue);
}
END_TEST

/* The core stages copies between backends through host_allocate'd memory:
 * a block freed is the one the next allocation of its size gets, so a
 * staged copy allocates no pinned memory once the cache holds one. */
START_TEST(test_pinned_memory_is_reused) {
  void *a = NULL, *b = NULL, *c = NULL;
  OK_(cuda->host_allocate(ctx, desc.impl, (size_t)4 << 20, &a));
  cuda->host_free(ctx, desc.impl, a);
  OK_(cuda->host_allocate(ctx, desc.impl, (size_t)4 << 20, &b));
  ck_assert_ptr_eq(a, b);
  OK_(cuda->host_allocate(ctx, desc.impl, (size_t)3 << 20, &c)); /* same class, while b is held: another */
  ck_assert_ptr_ne(b, c);
  memset(b, 1, (size_t)4 << 20);
  memset(c, 2, (size_t)3 << 20);
  cuda->host_free(ctx, desc.impl, b);
  cuda->host_free(ctx, desc.impl, c);
  /* Past the largest class: allocated and freed as asked. */
  void *big = NULL;
  OK_(cuda->host_allocate(ctx, desc.impl, (size_t)65 << 20, &big));
  memset(big, 3, (size_t)65 << 20);
  cuda->host_free(ctx, desc.impl, big);
}
END_TEST

START_TEST(test_events_are_reused_pairs) {
  kiln_backend_queue_t *queue;
  OK_(cuda->queue_create(ctx, desc.impl, &queue));
  kiln_backend_event_t *first, *second, *third;
  OK_(cuda->queue_record(ctx, queue, &first));
  OK_(cuda->event_wait(ctx, first));
  cuda->event_release(ctx, first);
  OK_(cuda->queue_record(ctx, queue, &second));
  ck_assert_ptr_eq(first, second); /* no new event created */
  kiln_backend_buffer_t *buffer;
  OK_(cuda->buffer_allocate(ctx, desc.impl, (size_t)16 << 20, &buffer));
  const uint32_t pattern = 9;
  OK_(cuda->buffer_fill(ctx, queue, buffer, 0, (size_t)16 << 20, &pattern, 4));
  OK_(cuda->queue_record(ctx, queue, &third));
  ck_assert_ptr_ne(second, third);
  /* Waits and queries use the pair's event without timing, elapsed the
   * other: once the end has been waited for, both work. */
  kiln_backend_queue_t *other;
  OK_(cuda->queue_create(ctx, desc.impl, &other));
  OK_(cuda->queue_wait(ctx, other, third));
  uint32_t word = 0;
  OK_(cuda->buffer_read(ctx, other, buffer, ((size_t)16 << 20) - 4, &word, 4, true));
  ck_assert_uint_eq(word, pattern);
  OK_(cuda->event_wait(ctx, third));
  OK_(cuda->event_query(ctx, second));
  OK_(cuda->event_query(ctx, third));
  double ms = -1.0;
  OK_(cuda->event_elapsed(ctx, second, third, &ms));
  ck_assert_msg(ms >= 0.0, "elapsed %f ms", ms);
  cuda->event_release(ctx, second);
  cuda->event_release(ctx, third);
  cuda->buffer_free(ctx, desc.impl, buffer);
  OK_(cuda->queue_finish(ctx, other));
  cuda->queue_destroy(ctx, other);
  cuda->queue_destroy(ctx, queue);
}
END_TEST

START_TEST(test_pageable_writes_and_reads) {
  kiln_backend_queue_t *queue;
  OK_(cuda->queue_create(ctx, desc.impl, &queue));
  enum { N = 300000 };
  float *data = malloc(N * sizeof *data), *back = malloc(N * sizeof *back);
  for (int i = 0; i < N; i++) data[i] = (float)i * 0.5f;
  kiln_backend_buffer_t *buffer;
  OK_(cuda->buffer_allocate(ctx, desc.impl, N * sizeof *data, &buffer));
  OK_(cuda->buffer_write(ctx, queue, buffer, 0, data, N * sizeof *data, false));
  /* Staged: the caller's memory may change at once. */
  memset(data, 0, N * sizeof *data);
  OK_(cuda->buffer_read(ctx, queue, buffer, 0, back, N * sizeof *back, false));
  OK_(cuda->queue_finish(ctx, queue));
  for (int i = 0; i < N; i++) ck_assert_msg(back[i] == (float)i * 0.5f, "[%d] %g", i, back[i]);
  cuda->buffer_free(ctx, desc.impl, buffer);
  cuda->queue_destroy(ctx, queue);
  free(data);
  free(back);
}
END_TEST

static const char *property(const char *key) {
  for (size_t i = 0; i < desc.property_count; i++)
    if (!strcmp(desc.properties[i].key, key)) return desc.properties[i].value;
  return NULL;
}

START_TEST(test_describes_pool_and_peers) {
  const char *pool = property("memory_pool");
  ck_assert_ptr_nonnull(pool);
  ck_assert_msg(strstr(pool, "cuMemPoolCreate") || strstr(pool, "cuMemAlloc"), "memory_pool '%s'", pool);
  const char *peers = property("peer_access");
  ck_assert_ptr_nonnull(peers);
  ck_assert_msg(!strcmp(peers, "none") || !strncmp(peers, "cuda:", 5), "peer_access '%s'", peers);
}
END_TEST

/* Peers reach kiln's buffers, which come from each device's pool, only once
 * the pool grants them access: devinfo lists a peer exactly where the
 * hardware allows it and the grant was made (a context's peer access does
 * not cover pool memory). */
START_TEST(test_peer_access_comes_from_the_pools) {
  const size_t count = cuda->device_count(ctx);
  if (count < 2) {
    printf("one device: no peers to check\n");
    return;
  }
  void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  ck_assert_ptr_nonnull(driver);
  int (*can_access)(int *, int, int) = NULL;
  void *symbol = dlsym(driver, "cuDeviceCanAccessPeer");
  ck_assert_ptr_nonnull(symbol);
  memcpy(&can_access, &symbol, sizeof can_access);
  for (int i = 0; i < 2; i++) {
    kiln_backend_device_desc_t d;
    OK_(cuda->device_describe(ctx, (size_t)i, &d));
    const char *peers = NULL;
    for (size_t p = 0; p < d.property_count; p++)
      if (!strcmp(d.properties[p].key, "peer_access")) peers = d.properties[p].value;
    ck_assert_ptr_nonnull(peers);
    int can = 0;
    ck_assert_int_eq(can_access(&can, i, 1 - i), 0);
    char other[16];
    snprintf(other, sizeof other, "cuda:%d", 1 - i);
    ck_assert_msg((strstr(peers, other) != NULL) == (can != 0), "cuda:%d: peer_access '%s', cuDeviceCanAccessPeer %d",
                  i, peers, can);
    const char *pool = NULL;
    for (size_t p = 0; p < d.property_count; p++)
      if (!strcmp(d.properties[p].key, "memory_pool")) pool = d.properties[p].value;
    ck_assert_ptr_nonnull(pool);
  }
}
END_TEST

int main(void) {
  const char *path = getenv("KILN_TEST_CUDA_PLUGIN");
  if (!path || !*path) {
    printf("SKIP: KILN_TEST_CUDA_PLUGIN does not name the plugin\n");
    return 77;
  }
  void *plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!plugin) {
    const char *e = dlerror();
    printf("SKIP: the CUDA plugin does not load here: %s\n", e ? e : "no reason given");
    return 77;
  }
  kiln_backend_entry_fn entry = NULL;
  void *symbol = dlsym(plugin, KILN_BACKEND_ENTRY_SYMBOL);
  memcpy(&entry, &symbol, sizeof entry);
  if (!entry) {
    printf("FAIL: %s exports no %s\n", path, KILN_BACKEND_ENTRY_SYMBOL);
    return 1;
  }
  cuda = entry();
  if (cuda->abi_version != KILN_BACKEND_ABI_VERSION || cuda->size != sizeof *cuda) {
    printf("FAIL: the plugin's table is ABI %u, %u bytes; this test was built for ABI %u, %zu bytes\n",
           cuda->abi_version, cuda->size, KILN_BACKEND_ABI_VERSION, sizeof *cuda);
    return 1;
  }
  if (cuda->initialize(&host, &ctx) != KILN_OK || cuda->device_count(ctx) == 0) {
    printf("SKIP: no CUDA device: %s\n", message[0] ? message : "the driver reports none");
    return 77;
  }
  if (cuda->device_describe(ctx, 0, &desc) != KILN_OK) {
    printf("SKIP: cuda:0 cannot be used: %s\n", message);
    return 77;
  }
  Suite *suite = suite_create("cuda-iface");
  TCase *tc = tcase_create("cuda-iface");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_buffer_allocated_on_a_queue);
  tcase_add_test(tc, test_pinned_memory_is_reused);
  tcase_add_test(tc, test_events_are_reused_pairs);
  tcase_add_test(tc, test_pageable_writes_and_reads);
  tcase_add_test(tc, test_describes_pool_and_peers);
  tcase_add_test(tc, test_peer_access_comes_from_the_pools);
  suite_add_tcase(suite, tc);
  SRunner *runner = srunner_create(suite);
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  cuda->deinitialize(ctx);
  return failed == 0 ? 0 : 1;
}
