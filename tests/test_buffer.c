/* tests/test_buffer.c: buffers and the per-device pool: exact round trips, fills, copies, reuse, exhaustion, size 0. */
#include <stdint.h>

#include "common.h"
#include "runtime/internal.h"

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu", &device));
  return device;
}

static void kt_pattern(unsigned char *bytes, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) bytes[i] = (unsigned char)((i * 131u + seed * 17u + (i >> 8)) & 0xff);
}

START_TEST(test_write_read_round_trip) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = kiln_device_current_queue(d);
  enum { N = 100003 };
  static unsigned char in[N], out[N];
  kt_pattern(in, N, 1);
  kiln_buffer_t *b = NULL;
  KT_OK(kiln_buffer_create(d, N, &b));
  ck_assert_uint_eq(kiln_buffer_size(b), N);
  ck_assert_ptr_eq(kiln_buffer_device(b), d);
  KT_OK(kiln_buffer_write(q, b, 0, in, N, true, 0, NULL, NULL));
  memset(out, 0, N);
  KT_OK(kiln_buffer_read(q, b, 0, out, N, true, 0, NULL, NULL));
  ck_assert_mem_eq(in, out, N);

  /* A sub-range at an odd offset, written without blocking, read after an event. */
  unsigned char part[1000], back[1000];
  kt_pattern(part, sizeof part, 7);
  kiln_event_t *written = NULL;
  KT_OK(kiln_buffer_write(q, b, 777, part, sizeof part, false, 0, NULL, &written));
  KT_OK(kiln_event_wait(written));
  KT_OK(kiln_buffer_read(q, b, 777, back, sizeof back, true, 1, &written, NULL));
  ck_assert_mem_eq(part, back, sizeof part);
  KT_OK(kiln_buffer_read(q, b, 0, out, N, true, 0, NULL, NULL));
  ck_assert_mem_eq(out, in, 777);
  ck_assert_mem_eq(out + 777, part, sizeof part);
  ck_assert_mem_eq(out + 1777, in + 1777, N - 1777);
  kiln_event_release(written);
  kiln_buffer_release(b);
}
END_TEST

START_TEST(test_fill_patterns) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = kiln_device_current_queue(d);
  kiln_buffer_t *b = NULL;
  KT_OK(kiln_buffer_create(d, 64, &b));
  unsigned char zero = 0, out[64];
  KT_OK(kiln_buffer_fill(q, b, 0, 64, &zero, 1, 0, NULL, NULL));
  uint8_t p1 = 0xab;
  uint16_t p2 = 0x1234;
  uint32_t p4 = 0xdeadbeef;
  KT_OK(kiln_buffer_fill(q, b, 4, 8, &p1, 1, 0, NULL, NULL));
  KT_OK(kiln_buffer_fill(q, b, 16, 8, &p2, 2, 0, NULL, NULL));
  KT_OK(kiln_buffer_fill(q, b, 32, 16, &p4, 4, 0, NULL, NULL));
  KT_OK(kiln_buffer_read(q, b, 0, out, 64, true, 0, NULL, NULL));
  unsigned char want[64] = {0};
  memset(want + 4, 0xab, 8);
  for (int i = 0; i < 4; i++) memcpy(want + 16 + 2 * i, &p2, 2);
  for (int i = 0; i < 4; i++) memcpy(want + 32 + 4 * i, &p4, 4);
  ck_assert_mem_eq(out, want, 64);

  KT_FAILS(kiln_buffer_fill(q, b, 0, 6, &p4, 4, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "multiples of pattern_size 4");
  KT_FAILS(kiln_buffer_fill(q, b, 0, 6, &p4, 3, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "pattern_size 3");
  KT_FAILS(kiln_buffer_fill(q, b, 60, 8, &p4, 4, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "outside the buffer of 64 bytes");
  kiln_buffer_release(b);
}
END_TEST

START_TEST(test_copy_same_device) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = kiln_device_current_queue(d);
  enum { N = 5000 };
  unsigned char in[N], out[N];
  kt_pattern(in, N, 3);
  kiln_buffer_t *a = NULL, *b = NULL;
  KT_OK(kiln_buffer_create(d, N, &a));
  KT_OK(kiln_buffer_create(d, N, &b));
  unsigned char zero = 0;
  KT_OK(kiln_buffer_fill(q, b, 0, N, &zero, 1, 0, NULL, NULL));
  KT_OK(kiln_buffer_write(q, a, 0, in, N, false, 0, NULL, NULL));
  kiln_event_t *done = NULL;
  KT_OK(kiln_buffer_copy(q, a, 100, b, 50, 1000, 0, NULL, &done));
  KT_OK(kiln_event_wait(done));
  kiln_event_release(done);
  KT_OK(kiln_buffer_read(q, b, 0, out, N, true, 0, NULL, NULL));
  unsigned char want[N] = {0};
  memcpy(want + 50, in + 100, 1000);
  ck_assert_mem_eq(out, want, N);

  /* A copy on a second queue still sees the write enqueued on the current one. */
  kiln_queue_t *q2 = NULL;
  KT_OK(kiln_queue_create(d, &q2));
  kt_pattern(in, N, 9);
  KT_OK(kiln_buffer_write(q, a, 0, in, N, false, 0, NULL, NULL));
  KT_OK(kiln_buffer_copy(q2, a, 0, b, 0, N, 0, NULL, NULL));
  KT_OK(kiln_queue_finish(q2));
  KT_OK(kiln_buffer_read(q2, b, 0, out, N, true, 0, NULL, NULL));
  ck_assert_mem_eq(out, in, N);

  KT_FAILS(kiln_buffer_copy(q, a, 0, a, 10, 100, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "overlap");
  KT_FAILS(kiln_buffer_copy(q, a, N - 10, b, 0, 11, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "outside the source buffer");
  kiln_queue_release(q2);
  kiln_buffer_release(a);
  kiln_buffer_release(b);
}
END_TEST

START_TEST(test_pool_reuse) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = kiln_device_current_queue(d);
  kiln_buffer_t *b = NULL, *other = NULL;
  unsigned char data[1000] = {1};

  /* kiln_buffer_create hands out only idle memory (the caller may use it on
   * any queue): a block with pending work returns once its queue finished. */
  KT_OK(kiln_buffer_create(d, 1000, &b));
  KT_OK(kiln_buffer_write(q, b, 0, data, sizeof data, false, 0, NULL, NULL));
  kiln_backend_buffer_t *impl = b->impl;
  kiln_buffer_release(b);
  KT_OK(kiln_buffer_create(d, 1000, &other));
  ck_assert_ptr_ne(other->impl, impl);
  KT_OK(kiln_queue_finish(q));
  KT_OK(kiln_buffer_create(d, 900, &b));
  ck_assert_ptr_eq(b->impl, impl); /* same size class */
  ck_assert_uint_ge(b->capacity, 1000);
  kiln_buffer_release(b);
  kiln_buffer_release(other);

  /* An operation's result on the same in-order queue reuses a block at once;
   * another queue gets it only once the first finished. */
  const int64_t shape[1] = {3000};
  kiln_tensor_t *t = NULL, *t2 = NULL;
  KT_OK(kiln_tensor_ones(d, KILN_F32, 1, shape, &t));
  kiln_backend_buffer_t *timpl = kiln_tensor_buffer(t)->impl;
  kiln_tensor_release(t);
  KT_OK(kiln_tensor_ones(d, KILN_F32, 1, shape, &t));
  ck_assert_ptr_eq(kiln_tensor_buffer(t)->impl, timpl);
  kiln_tensor_release(t);
  kiln_queue_t *q2 = NULL;
  KT_OK(kiln_queue_create(d, &q2));
  KT_OK(kiln_device_set_current_queue(d, q2));
  KT_OK(kiln_tensor_ones(d, KILN_F32, 1, shape, &t2));
  ck_assert_ptr_ne(kiln_tensor_buffer(t2)->impl, timpl);
  KT_OK(kiln_queue_finish(q));
  KT_OK(kiln_tensor_ones(d, KILN_F32, 1, shape, &t));
  ck_assert_ptr_eq(kiln_tensor_buffer(t)->impl, timpl);
  float got[3000];
  KT_OK(kiln_tensor_read(t, got, sizeof got));
  ck_assert(got[0] == 1.0f && got[2999] == 1.0f);
  kiln_tensor_release(t);
  kiln_tensor_release(t2);
  KT_OK(kiln_device_set_current_queue(d, NULL));

  /* Trimming empties the pool. */
  ck_assert_uint_gt(d->pool.pooled_bytes, 0);
  kiln__pool_trim(d);
  ck_assert_uint_eq(d->pool.pooled_bytes, 0);
  kiln_queue_release(q2);
}
END_TEST

START_TEST(test_out_of_memory) {
  kiln_device_t *d = kt_cpu();
  kiln_device_info_t info;
  KT_OK(kiln_device_info(d, &info));
  kiln_buffer_t *b = NULL;
  size_t huge = (size_t)info.memory_bytes * 4;
  KT_FAILS(kiln_buffer_create(d, huge, &b), KILN_OUT_OF_MEMORY, "cannot allocate");
  ck_assert_ptr_null(b);
  char size_text[64];
  snprintf(size_text, sizeof size_text, "%zu bytes", huge);
  ck_assert_msg(strstr(kiln_last_error(), size_text) && strstr(kiln_last_error(), "cpu:0"), "%s", kiln_last_error());
  KT_FAILS(kiln_buffer_create(d, SIZE_MAX, &b), KILN_OUT_OF_MEMORY, "cpu:0");
  /* The device still works afterwards. */
  KT_OK(kiln_buffer_create(d, 4096, &b));
  kiln_buffer_release(b);
}
END_TEST

START_TEST(test_host_staging_memory) {
  /* Staging memory from kiln_host_allocate feeds a non-blocking write and
   * receives a non-blocking read, as a batch loader uses it. */
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = kiln_device_current_queue(d);
  enum { N = 65536 };
  unsigned char *in = NULL, *out = NULL, *empty = NULL;
  KT_OK(kiln_host_allocate(d, N, (void **)&in));
  KT_OK(kiln_host_allocate(d, N, (void **)&out));
  KT_OK(kiln_host_allocate(d, 0, (void **)&empty));
  ck_assert_ptr_nonnull(empty);
  ck_assert_ptr_ne(empty, in);
  kt_pattern(in, N, 3);
  kiln_buffer_t *b = NULL;
  KT_OK(kiln_buffer_create(d, N, &b));
  KT_OK(kiln_buffer_write(q, b, 0, in, N, false, 0, NULL, NULL));
  KT_OK(kiln_buffer_read(q, b, 0, out, N, false, 0, NULL, NULL));
  KT_OK(kiln_queue_finish(q));
  ck_assert_mem_eq(in, out, N);
  kiln_buffer_release(b);
  kiln_host_free(d, in);
  kiln_host_free(d, out);
  kiln_host_free(d, empty);
  kiln_host_free(d, NULL);
  void *p = NULL;
  KT_FAILS(kiln_host_allocate(NULL, 16, &p), KILN_INVALID_ARGUMENT, "device is NULL");
  KT_FAILS(kiln_host_allocate(d, 16, NULL), KILN_INVALID_ARGUMENT, "out_ptr is NULL");
}
END_TEST

START_TEST(test_size_zero) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = kiln_device_current_queue(d);
  kiln_buffer_t *b = NULL;
  KT_OK(kiln_buffer_create(d, 0, &b));
  ck_assert_uint_eq(kiln_buffer_size(b), 0);
  KT_OK(kiln_buffer_write(q, b, 0, NULL, 0, true, 0, NULL, NULL));
  KT_OK(kiln_buffer_read(q, b, 0, NULL, 0, true, 0, NULL, NULL));
  kiln_event_t *e = NULL;
  KT_OK(kiln_buffer_copy(q, b, 0, b, 0, 0, 0, NULL, &e));
  KT_OK(kiln_event_wait(e));
  kiln_event_release(e);
  KT_FAILS(kiln_buffer_read(q, b, 0, NULL, 1, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "outside the buffer of 0 bytes");
  kiln_buffer_release(b);
}
END_TEST

START_TEST(test_bad_arguments) {
  kiln_device_t *d = kt_cpu();
  kiln_queue_t *q = kiln_device_current_queue(d);
  kiln_buffer_t *b = NULL;
  KT_FAILS(kiln_buffer_create(NULL, 16, &b), KILN_INVALID_ARGUMENT, "kiln_buffer_create: device is NULL");
  KT_FAILS(kiln_buffer_create(d, 16, NULL), KILN_INVALID_ARGUMENT, "out_buffer is NULL");
  KT_OK(kiln_buffer_create(d, 16, &b));
  char host[32];
  KT_FAILS(kiln_buffer_write(NULL, b, 0, host, 16, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "queue is NULL");
  KT_FAILS(kiln_buffer_write(q, NULL, 0, host, 16, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "buffer is NULL");
  KT_FAILS(kiln_buffer_write(q, b, 8, host, 16, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT,
           "bytes [8, 8 + 16) lie outside the buffer of 16 bytes");
  KT_FAILS(kiln_buffer_write(q, b, SIZE_MAX, host, 2, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "outside the buffer");
  KT_FAILS(kiln_buffer_read(q, b, 0, NULL, 16, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "host memory is NULL");
  KT_FAILS(kiln_buffer_read(q, b, 0, host, 16, true, 2, NULL, NULL), KILN_INVALID_ARGUMENT, "wait_count is 2");
  kiln_event_t *events[1] = {NULL};
  KT_FAILS(kiln_buffer_read(q, b, 0, host, 16, true, 1, events, NULL), KILN_INVALID_ARGUMENT, "wait event 0 of 1 is NULL");
  kiln_buffer_release(b);
  kiln_buffer_release(NULL);
  ck_assert_ptr_null(kiln_buffer_retain(NULL));
}
END_TEST

/* The test plugin (tests/stub_backend.c) keeps its buffers in host memory
 * but exposes no host pointer: copies between it and the CPU take the
 * cross-backend paths. Skipped, saying why, when the plugin is not built. */
START_TEST(test_copy_across_backends) {
  kiln_deinitialize();
  setenv("KILN_BACKEND", "cpu,stub", 1);
  kiln_status_t started = kiln_ensure_initialized();
  kiln_device_t *stub = NULL;
  if (started != KILN_OK || kiln_device_find("stub", &stub) != KILN_OK) {
    printf("test_copy_across_backends skipped: the stub plugin did not load: %s\n", kiln_last_error());
    kiln_deinitialize();
    setenv("KILN_BACKEND", "cpu", 1);
    return;
  }
  kiln_device_t *cpu = kt_cpu();
  enum { N = 9 * 1024 * 1024 + 3 };
  static unsigned char in[N], out[N];
  kt_pattern(in, N, 5);
  kiln_buffer_t *c = NULL, *s = NULL;
  KT_OK(kiln_buffer_create(cpu, N, &c));
  KT_OK(kiln_buffer_create(stub, N, &s));
  kiln_queue_t *qc = kiln_device_current_queue(cpu), *qs = kiln_device_current_queue(stub);
  KT_OK(kiln_buffer_write(qc, c, 0, in, N, false, 0, NULL, NULL));
  KT_OK(kiln_buffer_copy(qs, c, 0, s, 0, N, 0, NULL, NULL)); /* source has a host pointer */
  KT_OK(kiln_buffer_read(qs, s, 0, out, N, true, 0, NULL, NULL));
  ck_assert_mem_eq(in, out, N);
  unsigned char zero = 0;
  KT_OK(kiln_buffer_fill(qc, c, 0, N, &zero, 1, 0, NULL, NULL));
  KT_OK(kiln_buffer_copy(qc, s, 11, c, 3, N - 11, 0, NULL, NULL)); /* destination has one */
  KT_OK(kiln_buffer_read(qc, c, 0, out, N, true, 0, NULL, NULL));
  ck_assert(out[0] == 0 && out[1] == 0 && out[2] == 0);
  ck_assert_mem_eq(out + 3, in + 11, N - 11);

  /* Tensors move across too: to the stub and back. */
  kiln_tensor_t *t = NULL, *on_stub = NULL, *back = NULL;
  KT_OK(kiln_tensor_arange(cpu, KILN_I32, 0, 1000, 1, &t));
  KT_OK(kiln_tensor_to(t, stub, &on_stub));
  ck_assert_ptr_eq(kiln_tensor_device(on_stub), stub);
  KT_OK(kiln_tensor_to(on_stub, cpu, &back));
  int32_t values[1000];
  KT_OK(kiln_tensor_read(back, values, sizeof values));
  for (int i = 0; i < 1000; i++) ck_assert_int_eq(values[i], i);
  KT_OK(kiln_tensor_read(on_stub, values, sizeof values));
  ck_assert_int_eq(values[999], 999);
  kiln_tensor_release(t);
  kiln_tensor_release(on_stub);
  kiln_tensor_release(back);
  kiln_buffer_release(c);
  kiln_buffer_release(s);
  kiln_deinitialize();
  setenv("KILN_BACKEND", "cpu", 1);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  setenv("KILN_BACKEND", "cpu", 1);
  Suite *s = suite_create("buffer");
  TCase *tc = tcase_create("buffer");
  tcase_add_test(tc, test_write_read_round_trip);
  tcase_add_test(tc, test_fill_patterns);
  tcase_add_test(tc, test_copy_same_device);
  tcase_add_test(tc, test_pool_reuse);
  tcase_add_test(tc, test_out_of_memory);
  tcase_add_test(tc, test_host_staging_memory);
  tcase_add_test(tc, test_size_zero);
  tcase_add_test(tc, test_bad_arguments);
  tcase_add_test(tc, test_copy_across_backends);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
