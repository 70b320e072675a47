/* tests/test_bad_input.c: every public call given bad input returns the right status and a message that names it, without crashing or leaking. */
#include <errno.h>
#include <stdint.h>

#include "common.h"

/* Under AddressSanitizer a request for petabytes must come back as NULL, as
 * malloc's does, not end the process: that is what kiln is tested for here. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* A NULL argument: KILN_INVALID_ARGUMENT, and the message names it. */
#define KT_NULL_ARG(call, name)                                                                          \
  do {                                                                                                   \
    kiln_clear_error();                                                                                  \
    kiln_status_t kt_s_ = (call);                                                                        \
    ck_assert_msg(kt_s_ == KILN_INVALID_ARGUMENT, "%s -> %s, expected INVALID_ARGUMENT: %s", #call,       \
                  kiln_status_name(kt_s_), kiln_last_error());                                          \
    ck_assert_msg(strstr(kiln_last_error(), name) && strstr(kiln_last_error(), "NULL"),                 \
                  "%s: message \"%s\" does not name the NULL argument %s", #call, kiln_last_error(), name); \
    ck_assert_int_eq(kiln_last_status(), KILN_INVALID_ARGUMENT);                                         \
  } while (0)

/* A failure whose message contains every one of up to three needles. */
#define KT_FAILS3(call, code, n1, n2, n3)                                                                \
  do {                                                                                                   \
    KT_FAILS(call, code, n1);                                                                            \
    ck_assert_msg(strstr(kiln_last_error(), n2) != NULL, "%s: message \"%s\" lacks \"%s\"", #call,       \
                  kiln_last_error(), n2);                                                                \
    ck_assert_msg(strstr(kiln_last_error(), n3) != NULL, "%s: message \"%s\" lacks \"%s\"", #call,       \
                  kiln_last_error(), n3);                                                                \
  } while (0)

static const char *const kt_vars[] = {"KILN_BACKEND", "KILN_DEVICE", "KILN_POLICY", "KILN_PROVIDER",
                                      "KILN_CPU_DEVICES", "KILN_BACKEND_PATH", "KILN_LOG"};
static char kt_backend_path[4096];

/* A clean environment for a CPU-only start (the private cache stays). */
static void kt_env_reset(void) {
  kiln_deinitialize();
  for (size_t i = 0; i < sizeof kt_vars / sizeof kt_vars[0]; i++) unsetenv(kt_vars[i]);
  if (kt_backend_path[0]) setenv("KILN_BACKEND_PATH", kt_backend_path, 1);
  setenv("KILN_BACKEND", "cpu", 1);
}

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *d = NULL;
  KT_OK(kiln_device_find("cpu:0", &d));
  return d;
}

static kiln_tensor_t *kt_tensor(kiln_dtype_t dtype, int ndim, const int64_t *shape) {
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_ones(kt_cpu(), dtype, ndim, shape, &t));
  return t;
}

/* ---- NULL handles ---------------------------------------------------------------- */

START_TEST(test_null_device_calls) {
  kt_env_reset();
  kiln_device_t *d = NULL;
  size_t n = 0;
  kiln_device_info_t info;
  kiln_backend_info_t binfo;
  const char *key, *value;
  KT_NULL_ARG(kiln_device_count(NULL), "out_count");
  KT_NULL_ARG(kiln_device_get(0, NULL), "out_device");
  KT_NULL_ARG(kiln_device_default(NULL), "out_device");
  KT_NULL_ARG(kiln_device_find(NULL, &d), "selector");
  KT_NULL_ARG(kiln_device_find("cpu:0", NULL), "out_device");
  KT_NULL_ARG(kiln_try_all_gpus(NULL, 2, &n), "out_devices");
  KT_NULL_ARG(kiln_try_all_gpus(&d, 1, NULL), "out_count");
  KT_NULL_ARG(kiln_device_info(NULL, &info), "device");
  KT_NULL_ARG(kiln_device_info(kt_cpu(), NULL), "out_info");
  KT_NULL_ARG(kiln_device_property(NULL, 0, &key, &value), "device");
  KT_NULL_ARG(kiln_device_property(kt_cpu(), 0, NULL, &value), "out_key");
  KT_NULL_ARG(kiln_device_check(NULL), "device");
  KT_NULL_ARG(kiln_backend_count(NULL), "out_count");
  KT_NULL_ARG(kiln_backend_info(0, NULL), "out_info");
  /* Queries that cannot fail answer harmlessly. */
  ck_assert_ptr_null(kiln_device_retain(NULL));
  kiln_device_release(NULL);
  ck_assert_str_eq(kiln_device_selector(NULL), "");
  ck_assert_ptr_nonnull(kiln_device_name(NULL));
  ck_assert_uint_eq(kiln_device_property_count(NULL), 0);
  ck_assert_ptr_null(kiln_device_providers(NULL, "matmul"));
  ck_assert_ptr_null(kiln_device_providers(kt_cpu(), NULL));
  ck_assert_ptr_null(kiln_device_providers(kt_cpu(), "gemm"));
  /* An index past the end. */
  KT_FAILS(kiln_device_get(999, &d), KILN_NOT_FOUND, "999");
  KT_FAILS(kiln_backend_info(99, &binfo), KILN_NOT_FOUND, "99");
  KT_FAILS(kiln_device_property(kt_cpu(), 9999, &key, &value), KILN_NOT_FOUND, "9999");
  /* A pointer that is not one of kiln's devices is refused, not followed. */
  kiln_device_t *fake = (kiln_device_t *)&info;
  KT_FAILS(kiln_device_info(fake, &info), KILN_INVALID_ARGUMENT, "is not a device of this kiln");
  kiln_deinitialize();
}
END_TEST

START_TEST(test_null_queue_calls) {
  kt_env_reset();
  kiln_device_t *dev = kt_cpu();
  kiln_queue_t *q = NULL;
  kiln_event_t *e = NULL;
  double ms;
  KT_NULL_ARG(kiln_queue_create(NULL, &q), "device");
  KT_NULL_ARG(kiln_queue_create(dev, NULL), "out_queue");
  KT_NULL_ARG(kiln_device_set_current_queue(NULL, NULL), "device");
  KT_NULL_ARG(kiln_queue_finish(NULL), "queue");
  KT_NULL_ARG(kiln_queue_record(NULL, &e), "queue");
  q = kiln_device_default_queue(dev);
  ck_assert_ptr_nonnull(q);
  KT_NULL_ARG(kiln_queue_record(q, NULL), "out_event");
  KT_NULL_ARG(kiln_queue_wait(NULL, NULL), "queue");
  KT_NULL_ARG(kiln_queue_wait(q, NULL), "event");
  KT_NULL_ARG(kiln_event_wait(NULL), "event");
  KT_NULL_ARG(kiln_event_query(NULL), "event");
  KT_OK(kiln_queue_record(q, &e));
  KT_NULL_ARG(kiln_event_elapsed(NULL, e, &ms), "start");
  KT_NULL_ARG(kiln_event_elapsed(e, NULL, &ms), "end");
  KT_NULL_ARG(kiln_event_elapsed(e, e, NULL), "out_ms");
  /* A wait list with a hole, and events of two queues timed together. */
  kiln_event_t *const holes[2] = {e, NULL};
  kiln_buffer_t *b = NULL;
  char host[8] = {0};
  KT_OK(kiln_buffer_create(dev, sizeof host, &b));
  KT_FAILS(kiln_buffer_write(q, b, 0, host, sizeof host, true, 2, holes, NULL), KILN_INVALID_ARGUMENT,
           "wait event 1 of 2 is NULL");
  kiln_queue_t *other = NULL;
  kiln_event_t *e2 = NULL;
  KT_OK(kiln_queue_create(dev, &other));
  KT_OK(kiln_queue_record(other, &e2));
  KT_FAILS(kiln_event_elapsed(e, e2, &ms), KILN_INVALID_ARGUMENT, "queue");
  kiln_event_release(e2);
  kiln_queue_release(other);
  kiln_buffer_release(b);
  kiln_event_release(e);
  ck_assert_ptr_null(kiln_device_default_queue(NULL));
  ck_assert_ptr_null(kiln_device_current_queue(NULL));
  ck_assert_ptr_null(kiln_queue_device(NULL));
  ck_assert_ptr_null(kiln_queue_retain(NULL));
  kiln_queue_release(NULL);
  ck_assert_ptr_null(kiln_event_retain(NULL));
  kiln_event_release(NULL);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_null_buffer_calls) {
  kt_env_reset();
  kiln_device_t *dev = kt_cpu();
  kiln_queue_t *q = kiln_device_default_queue(dev);
  kiln_buffer_t *b = NULL, *b2 = NULL;
  char host[64] = {0};
  const uint32_t pattern = 0;
  KT_NULL_ARG(kiln_buffer_create(NULL, 16, &b), "device");
  KT_NULL_ARG(kiln_buffer_create(dev, 16, NULL), "out_buffer");
  KT_OK(kiln_buffer_create(dev, 64, &b));
  KT_OK(kiln_buffer_create(dev, 64, &b2));
  KT_NULL_ARG(kiln_buffer_write(NULL, b, 0, host, 4, true, 0, NULL, NULL), "queue");
  KT_NULL_ARG(kiln_buffer_write(q, NULL, 0, host, 4, true, 0, NULL, NULL), "buffer");
  KT_NULL_ARG(kiln_buffer_write(q, b, 0, NULL, 4, true, 0, NULL, NULL), "host");
  KT_NULL_ARG(kiln_buffer_read(NULL, b, 0, host, 4, true, 0, NULL, NULL), "queue");
  KT_NULL_ARG(kiln_buffer_read(q, NULL, 0, host, 4, true, 0, NULL, NULL), "buffer");
  KT_NULL_ARG(kiln_buffer_read(q, b, 0, NULL, 4, true, 0, NULL, NULL), "host");
  KT_NULL_ARG(kiln_buffer_read(q, b, 0, host, 4, true, 2, NULL, NULL), "wait list");
  KT_NULL_ARG(kiln_buffer_copy(NULL, b, 0, b2, 0, 4, 0, NULL, NULL), "queue");
  KT_NULL_ARG(kiln_buffer_copy(q, NULL, 0, b2, 0, 4, 0, NULL, NULL), "src");
  KT_NULL_ARG(kiln_buffer_copy(q, b, 0, NULL, 0, 4, 0, NULL, NULL), "dst");
  KT_NULL_ARG(kiln_buffer_fill(NULL, b, 0, 4, &pattern, 4, 0, NULL, NULL), "queue");
  KT_NULL_ARG(kiln_buffer_fill(q, NULL, 0, 4, &pattern, 4, 0, NULL, NULL), "buffer");
  KT_NULL_ARG(kiln_buffer_fill(q, b, 0, 4, NULL, 4, 0, NULL, NULL), "pattern");
  /* Ranges past the end, and patterns of a size the fill does not take. */
  KT_FAILS(kiln_buffer_write(q, b, 60, host, 8, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "64");
  KT_FAILS(kiln_buffer_read(q, b, SIZE_MAX, host, 2, true, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "64");
  KT_FAILS(kiln_buffer_copy(q, b, 32, b2, 0, 40, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "64");
  KT_FAILS(kiln_buffer_fill(q, b, 0, 12, &pattern, 3, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "3");
  KT_FAILS(kiln_buffer_fill(q, b, 0, 6, &pattern, 4, 0, NULL, NULL), KILN_INVALID_ARGUMENT, "6");
  ck_assert_uint_eq(kiln_buffer_size(NULL), 0);
  ck_assert_ptr_null(kiln_buffer_device(NULL));
  ck_assert_ptr_null(kiln_buffer_retain(NULL));
  kiln_buffer_release(NULL);
  kiln_buffer_release(b);
  kiln_buffer_release(b2);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_null_tensor_calls) {
  kt_env_reset();
  kiln_device_t *dev = kt_cpu();
  const int64_t s2[2] = {2, 3};
  kiln_tensor_t *t = kt_tensor(KILN_F32, 2, s2), *out = NULL;
  float host[6];
  double v;
  int perm[2] = {1, 0};
  const kiln_pool2d_params_t pool = {{1, 1}, {1, 1}, {0, 0}};

  KT_NULL_ARG(kiln_tensor_empty(NULL, KILN_F32, 2, s2, &out), "device");
  KT_NULL_ARG(kiln_tensor_empty(dev, KILN_F32, 2, s2, NULL), "out");
  KT_NULL_ARG(kiln_tensor_empty(dev, KILN_F32, 2, NULL, &out), "shape");
  KT_NULL_ARG(kiln_tensor_zeros(NULL, KILN_F32, 2, s2, &out), "device");
  KT_NULL_ARG(kiln_tensor_ones(dev, KILN_F32, 2, s2, NULL), "out");
  KT_NULL_ARG(kiln_tensor_full(NULL, KILN_F32, 2, s2, 1.0, &out), "device");
  KT_NULL_ARG(kiln_tensor_arange(NULL, KILN_F32, 0, 4, 1, &out), "device");
  KT_NULL_ARG(kiln_tensor_arange(dev, KILN_F32, 0, 4, 1, NULL), "out");
  KT_NULL_ARG(kiln_tensor_from_host(NULL, KILN_F32, 2, s2, host, &out), "device");
  KT_NULL_ARG(kiln_tensor_from_host(dev, KILN_F32, 2, s2, NULL, &out), "data");
  KT_NULL_ARG(kiln_tensor_uniform(NULL, 2, s2, 1, 0, 1, &out), "device");
  KT_NULL_ARG(kiln_tensor_normal(dev, 2, s2, 1, 0, 1, NULL), "out");

  KT_NULL_ARG(kiln_tensor_read(NULL, host, sizeof host), "tensor");
  KT_NULL_ARG(kiln_tensor_read(t, NULL, sizeof host), "host");
  KT_NULL_ARG(kiln_tensor_item(NULL, &v), "tensor");
  KT_NULL_ARG(kiln_tensor_item(t, NULL), "out_value");
  KT_NULL_ARG(kiln_tensor_copy(NULL, dev, &out), "tensor");
  KT_NULL_ARG(kiln_tensor_copy(t, NULL, &out), "device");
  KT_NULL_ARG(kiln_tensor_copy(t, dev, NULL), "out");
  KT_NULL_ARG(kiln_tensor_to(NULL, dev, &out), "tensor");
  KT_NULL_ARG(kiln_tensor_to(t, NULL, &out), "device");
  KT_NULL_ARG(kiln_tensor_reshape(NULL, 1, (const int64_t[]){6}, &out), "tensor");
  KT_NULL_ARG(kiln_tensor_reshape(t, 1, NULL, &out), "shape");
  KT_NULL_ARG(kiln_tensor_reshape(t, 1, (const int64_t[]){6}, NULL), "out");
  KT_NULL_ARG(kiln_tensor_transpose(NULL, 0, 1, &out), "tensor");
  KT_NULL_ARG(kiln_tensor_transpose(t, 0, 1, NULL), "out");
  KT_NULL_ARG(kiln_tensor_permute(NULL, perm, &out), "tensor");
  KT_NULL_ARG(kiln_tensor_permute(t, NULL, &out), "perm");
  KT_NULL_ARG(kiln_tensor_contiguous(NULL, &out), "tensor");
  KT_NULL_ARG(kiln_tensor_contiguous(t, NULL), "out");

  KT_NULL_ARG(kiln_tensor_unary(KILN_UNARY_EXP, NULL, &out), "a");
  KT_NULL_ARG(kiln_tensor_exp(t, NULL), "out");
  KT_NULL_ARG(kiln_tensor_relu(NULL, &out), "a");
  KT_NULL_ARG(kiln_tensor_binary(KILN_BINARY_ADD, NULL, t, &out), "a");
  KT_NULL_ARG(kiln_tensor_binary(KILN_BINARY_ADD, t, NULL, &out), "b");
  KT_NULL_ARG(kiln_tensor_add(t, t, NULL), "out");
  KT_NULL_ARG(kiln_tensor_mul_scalar(NULL, 2.0, &out), "a");
  KT_NULL_ARG(kiln_tensor_binary_scalar(KILN_BINARY_SUB, t, 1.0, NULL), "out");
  KT_NULL_ARG(kiln_tensor_matmul(NULL, t, false, true, &out), "a");
  KT_NULL_ARG(kiln_tensor_matmul(t, NULL, false, true, &out), "b");
  KT_NULL_ARG(kiln_tensor_matmul(t, t, false, true, NULL), "out");
  KT_NULL_ARG(kiln_tensor_sum(NULL, 0, false, &out), "a");
  KT_NULL_ARG(kiln_tensor_mean(t, 0, false, NULL), "out");
  KT_NULL_ARG(kiln_tensor_max(NULL, KILN_ALL_AXES, false, &out), "a");
  KT_NULL_ARG(kiln_tensor_argmax(NULL, 0, true, &out), "a");
  KT_NULL_ARG(kiln_tensor_norm(NULL, &out), "a");
  KT_NULL_ARG(kiln_tensor_softmax(NULL, &out), "a");
  KT_NULL_ARG(kiln_tensor_log_softmax(t, NULL), "out");
  KT_NULL_ARG(kiln_tensor_cross_entropy(NULL, t, &out), "logits");
  KT_NULL_ARG(kiln_tensor_cross_entropy(t, NULL, &out), "labels");
  KT_NULL_ARG(kiln_tensor_conv2d(NULL, t, NULL, NULL, &out), "x");
  KT_NULL_ARG(kiln_tensor_conv2d(t, NULL, NULL, NULL, &out), "weight");
  KT_NULL_ARG(kiln_tensor_conv2d(t, t, NULL, NULL, NULL), "out");
  KT_NULL_ARG(kiln_tensor_max_pool2d(NULL, &pool, &out), "x");
  KT_NULL_ARG(kiln_tensor_max_pool2d(t, NULL, &out), "params");
  KT_NULL_ARG(kiln_tensor_max_pool2d(t, &pool, NULL), "out");
  /* Nothing was written to *out by any failure. */
  ck_assert_ptr_null(out);

  ck_assert_ptr_null(kiln_tensor_retain(NULL));
  kiln_tensor_release(NULL);
  ck_assert_int_eq(kiln_tensor_ndim(NULL), 0);
  ck_assert_int_eq(kiln_tensor_numel(NULL), 0);
  ck_assert_ptr_null(kiln_tensor_shape(NULL));
  ck_assert_ptr_null(kiln_tensor_device(NULL));
  ck_assert_ptr_null(kiln_tensor_buffer(NULL));
  ck_assert(!kiln_tensor_is_contiguous(NULL));
  kiln_tensor_release(t);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_null_runtime_calls) {
  kt_env_reset();
  KT_NULL_ARG(kiln_set_providers(NULL), "overrides");
  KT_NULL_ARG(kiln_cache_stats(NULL), "out_stats");
  kiln_config_initialize(NULL);
  KT_FAILS(kiln_set_policy((kiln_policy_t)7), KILN_INVALID_ARGUMENT, "kiln_set_policy(7)");
  KT_FAILS(kiln_set_providers("matmul=fast"), KILN_INVALID_ARGUMENT, "unknown provider \"fast\"");
  /* A second kiln_initialize, after kiln started, is refused. */
  size_t n;
  KT_OK(kiln_device_count(&n));
  KT_FAILS(kiln_initialize(NULL), KILN_INVALID_ARGUMENT, "already started");
  kiln_deinitialize();
}
END_TEST

/* ---- sizes --------------------------------------------------------------------------- */

START_TEST(test_sizes) {
  kt_env_reset();
  kiln_device_t *dev = kt_cpu();
  kiln_tensor_t *out = NULL;
  KT_FAILS3(kiln_tensor_zeros(dev, KILN_F32, 2, (const int64_t[]){3, -2}, &out), KILN_INVALID_ARGUMENT, "-2",
            "negative", "dimension 1");
  KT_FAILS(kiln_tensor_empty(dev, KILN_I32, 1, (const int64_t[]){-1}, &out), KILN_INVALID_ARGUMENT, "-1");
  KT_FAILS(kiln_tensor_uniform(dev, 1, (const int64_t[]){-5}, 1, 0, 1, &out), KILN_INVALID_ARGUMENT, "-5");
  KT_FAILS(kiln_tensor_ones(dev, KILN_F32, 9, (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}, &out),
           KILN_INVALID_ARGUMENT, "ndim 9");
  KT_FAILS(kiln_tensor_ones(dev, KILN_F32, -1, NULL, &out), KILN_INVALID_ARGUMENT, "ndim -1");
  /* A byte size that overflows size_t: 2^62 * 2^62 elements, or 2^62 f32s. */
  KT_FAILS3(kiln_tensor_zeros(dev, KILN_F32, 2, (const int64_t[]){INT64_C(1) << 62, INT64_C(1) << 62}, &out),
            KILN_INVALID_ARGUMENT, "overflows", "4611686018427387904", "f32");
  KT_FAILS(kiln_tensor_empty(dev, KILN_F32, 1, (const int64_t[]){INT64_C(1) << 62}, &out), KILN_INVALID_ARGUMENT,
           "overflows");
  KT_FAILS(kiln_tensor_empty(dev, KILN_I32, 1, (const int64_t[]){INT64_MAX}, &out), KILN_INVALID_ARGUMENT,
           "overflows");
  /* Larger than the device: 2^50 floats (4 PiB) on cpu:0. */
  KT_FAILS3(kiln_tensor_empty(dev, KILN_F32, 1, (const int64_t[]){INT64_C(1) << 50}, &out), KILN_OUT_OF_MEMORY,
            "4503599627370496", "cpu:0", "largest allocation");
  KT_FAILS(kiln_tensor_zeros(dev, KILN_F32, 2, (const int64_t[]){INT64_C(1) << 25, INT64_C(1) << 25}, &out),
           KILN_OUT_OF_MEMORY, "bytes");
  kiln_buffer_t *b = NULL;
  KT_FAILS(kiln_buffer_create(dev, (size_t)1 << 52, &b), KILN_OUT_OF_MEMORY, "4503599627370496");
  ck_assert_ptr_null(b);
  ck_assert_ptr_null(out);
  /* kiln still works after refusing them. */
  KT_OK(kiln_tensor_zeros(dev, KILN_F32, 1, (const int64_t[]){4}, &out));
  float host[4] = {1, 1, 1, 1};
  KT_OK(kiln_tensor_read(out, host, sizeof host));
  ck_assert(host[0] == 0.0f && host[3] == 0.0f);
  /* Reads into too little host memory, and item of more than one element. */
  KT_FAILS3(kiln_tensor_read(out, host, 8), KILN_INVALID_ARGUMENT, "8 bytes", "16 bytes", "at least 16");
  double v;
  KT_FAILS(kiln_tensor_item(out, &v), KILN_INVALID_ARGUMENT, "4");
  kiln_tensor_release(out);
  kiln_deinitialize();
}
END_TEST

/* ---- faults found by attacking kiln, kept as regressions ------------------------ */

/* A zero batch broadcast against anything is a zero batch: [0,64,64] @ [64,64]
 * is [0,64,64], and nothing is read from the empty operand (it used to be
 * [1,64,64] made from memory kiln did not own), under every policy. */
START_TEST(test_zero_batch_matmul) {
  kt_env_reset();
  kiln_device_t *dev = kt_cpu();
  static const char *const policies[] = {"vendor", "portable", "fastest"};
  for (size_t p = 0; p < 3; p++) {
    KT_OK(kiln_set_policy(p == 0 ? KILN_POLICY_VENDOR : p == 1 ? KILN_POLICY_PORTABLE : KILN_POLICY_FASTEST));
    kiln_tensor_t *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    KT_OK(kiln_tensor_empty(dev, KILN_F32, 3, (const int64_t[]){0, 64, 64}, &a));
    KT_OK(kiln_tensor_ones(dev, KILN_F32, 2, (const int64_t[]){64, 64}, &b));
    KT_OK(kiln_tensor_matmul(a, b, false, false, &c));
    ck_assert_msg(kiln_tensor_ndim(c) == 3 && kiln_tensor_shape(c)[0] == 0 && kiln_tensor_shape(c)[1] == 64 &&
                      kiln_tensor_shape(c)[2] == 64,
                  "policy %s: [0,64,64] @ [64,64] gave %d dims, first %lld", policies[p], kiln_tensor_ndim(c),
                  (long long)kiln_tensor_shape(c)[0]);
    KT_OK(kiln_tensor_matmul(b, a, false, false, &d));
    ck_assert_int_eq(kiln_tensor_shape(d)[0], 0);
    kiln_tensor_release(a);
    kiln_tensor_release(b);
    kiln_tensor_release(c);
    kiln_tensor_release(d);
  }
  kiln_deinitialize();
}
END_TEST

/* Sizes of empty tensors with huge extents are computed without overflow
 * (undefined behaviour that UBSan reported), and a window that cannot fit
 * is refused: conv2d of [1,1,4,4] with weight [0,1,2^62,1] at dilation 4 gave
 * OK and [1,0,12,4]. */
START_TEST(test_huge_empty_extents) {
  kt_env_reset();
  kiln_device_t *dev = kt_cpu();
  const int64_t huge = INT64_C(1) << 62;
  kiln_tensor_t *x = kt_tensor(KILN_F32, 4, (const int64_t[]){1, 1, 4, 4});
  kiln_tensor_t *w = NULL, *out = NULL;
  KT_OK(kiln_tensor_empty(dev, KILN_F32, 4, (const int64_t[]){0, 1, huge, 1}, &w));
  ck_assert_int_eq(kiln_tensor_numel(w), 0);
  ck_assert(kiln_tensor_is_contiguous(w));
  kiln_conv2d_params_t params = kiln_conv2d_params_default();
  params.dilation[0] = 4;
  KT_FAILS(kiln_tensor_conv2d(x, w, NULL, &params, &out), KILN_SHAPE_MISMATCH, "does not fit");
  ck_assert_ptr_null(out);
  kiln_tensor_t *e = NULL;
  KT_OK(kiln_tensor_empty(dev, KILN_F32, 3, (const int64_t[]){0, huge, 4}, &e));
  KT_FAILS(kiln_tensor_sum(e, 0, false, &out), KILN_INVALID_ARGUMENT, "overflows");
  KT_OK(kiln_tensor_sum(e, 1, false, &out));
  ck_assert_int_eq(kiln_tensor_numel(out), 0);
  kiln_tensor_release(out);
  kiln_tensor_t *v = NULL;
  KT_OK(kiln_tensor_transpose(e, 0, 1, &v));
  ck_assert(kiln_tensor_is_contiguous(v));
  KT_OK(kiln_tensor_contiguous(v, &out));
  kiln_tensor_release(out);
  kiln_tensor_release(v);
  kiln_tensor_release(e);
  kiln_tensor_release(w);
  kiln_tensor_release(x);
  kiln_deinitialize();
}
END_TEST

/* kiln_tensor_cast takes every dtype, and says which values are not dtypes. */
START_TEST(test_cast_arguments) {
  kt_env_reset();
  kiln_tensor_t *a = kt_tensor(KILN_F32, 1, (const int64_t[]){3});
  kiln_tensor_t *out = NULL;
  KT_NULL_ARG(kiln_tensor_cast(NULL, KILN_I32, &out), "a");
  KT_NULL_ARG(kiln_tensor_cast(a, KILN_I32, NULL), "out");
  KT_FAILS(kiln_tensor_cast(a, (kiln_dtype_t)77, &out), KILN_INVALID_ARGUMENT, "dtype 77 is not a kiln_dtype_t");
  ck_assert_ptr_null(out);
  KT_OK(kiln_tensor_cast(a, KILN_I32, &out));
  ck_assert_int_eq(kiln_tensor_dtype(out), KILN_I32);
  kiln_tensor_release(out);
  kiln_tensor_release(a);
  kiln_deinitialize();
}
END_TEST

/* KILN_LOG=off applies even when the level was raised earlier in the process. */
static int kt_log_lines;
static void kt_count_log(kiln_log_level_t level, const char *message, void *user) { kt_log_lines++; }

/* KILN_LOG takes its levels in any case: KILN_LOG=DEBUG is debug. */
START_TEST(test_log_level_any_case) {
  static const struct {
    const char *value;
    kiln_log_level_t level;
  } cases[] = {{"DEBUG", KILN_LOG_DEBUG}, {"Info", KILN_LOG_INFO}, {"WARN", KILN_LOG_WARN}, {"Off", KILN_LOG_OFF}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kt_env_reset();
    setenv("KILN_LOG", cases[i].value, 1);
    KT_OK(kiln_ensure_initialized());
    ck_assert_msg(kiln_log_level() == cases[i].level, "KILN_LOG=%s gives level %d", cases[i].value,
                  (int)kiln_log_level());
    kiln_log_set_level(KILN_LOG_OFF);
    kiln_deinitialize();
  }
  unsetenv("KILN_LOG");
}
END_TEST

START_TEST(test_log_off_applies) {
  kt_env_reset();
  kiln_log_set_callback(kt_count_log, NULL);
  kiln_log_set_level(KILN_LOG_DEBUG);
  setenv("KILN_LOG", "off", 1);
  KT_OK(kiln_ensure_initialized());
  ck_assert_int_eq(kiln_log_level(), KILN_LOG_OFF);
  kt_log_lines = 0;
  kiln_tensor_t *t = kt_tensor(KILN_F32, 1, (const int64_t[]){3});
  kiln_tensor_release(t);
  ck_assert_int_eq(kt_log_lines, 0);
  kiln_log_set_callback(NULL, NULL);
  unsetenv("KILN_LOG");
  kiln_deinitialize();
}
END_TEST

/* ---- shapes --------------------------------------------------------------------------- */

START_TEST(test_shape_mismatch) {
  kt_env_reset();
  kiln_tensor_t *a = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 4});
  kiln_tensor_t *b = kt_tensor(KILN_F32, 2, (const int64_t[]){5, 4});
  kiln_tensor_t *v = kt_tensor(KILN_F32, 1, (const int64_t[]){4});
  kiln_tensor_t *x = kt_tensor(KILN_F32, 4, (const int64_t[]){1, 3, 5, 5});
  kiln_tensor_t *w = kt_tensor(KILN_F32, 4, (const int64_t[]){2, 4, 3, 3});
  kiln_tensor_t *w_big = kt_tensor(KILN_F32, 4, (const int64_t[]){2, 3, 7, 7});
  kiln_tensor_t *bias = kt_tensor(KILN_F32, 1, (const int64_t[]){3});
  kiln_tensor_t *labels = kt_tensor(KILN_I32, 1, (const int64_t[]){5});
  kiln_tensor_t *out = NULL;

  KT_FAILS3(kiln_tensor_add(a, b, &out), KILN_SHAPE_MISMATCH, "[3, 4]", "[5, 4]", "do not broadcast");
  /* NumPy compares from the last dimension: [2, 3] and [3, 2] first differ
   * there, and each operand's dimension is named in its own numbering. */
  {
    kiln_tensor_t *p = kt_tensor(KILN_F32, 2, (const int64_t[]){2, 3});
    kiln_tensor_t *q = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 2});
    kiln_tensor_t *r = kt_tensor(KILN_F32, 3, (const int64_t[]){4, 1, 5});
    KT_FAILS3(kiln_tensor_add(p, q, &out), KILN_SHAPE_MISMATCH, "[2, 3] and [3, 2]",
              "a's dimension 1 (size 3) meets b's dimension 1 (size 2)", "aligned at their last dimension");
    KT_FAILS(kiln_tensor_mul(r, p, &out), KILN_SHAPE_MISMATCH, "a's dimension 2 (size 5) meets b's dimension 1 (size 3)");
    KT_FAILS(kiln_tensor_sub(p, r, &out), KILN_SHAPE_MISMATCH, "a's dimension 1 (size 3) meets b's dimension 2 (size 5)");
    kiln_tensor_release(p);
    kiln_tensor_release(q);
    kiln_tensor_release(r);
  }
  KT_FAILS3(kiln_tensor_maximum(b, a, &out), KILN_SHAPE_MISMATCH, "[5, 4]", "[3, 4]", "must match or be 1");
  KT_FAILS3(kiln_tensor_matmul(a, b, false, false, &out), KILN_SHAPE_MISMATCH, "inner dimensions differ", "3 x 4",
            "5 x 4");
  KT_FAILS(kiln_tensor_matmul(a, v, false, false, &out), KILN_SHAPE_MISMATCH, "2 or 3 dimensions");
  kiln_tensor_t *ba = kt_tensor(KILN_F32, 3, (const int64_t[]){2, 3, 4});
  kiln_tensor_t *bb = kt_tensor(KILN_F32, 3, (const int64_t[]){3, 4, 2});
  KT_FAILS(kiln_tensor_matmul(ba, bb, false, false, &out), KILN_SHAPE_MISMATCH, "batch sizes differ");
  KT_FAILS3(kiln_tensor_conv2d(x, w, NULL, NULL, &out), KILN_SHAPE_MISMATCH, "3 channels", "expects 4",
            "[2, 4, 3, 3]");
  KT_FAILS(kiln_tensor_conv2d(x, w_big, NULL, NULL, &out), KILN_SHAPE_MISMATCH, "no positions");
  kiln_tensor_t *w_ok = kt_tensor(KILN_F32, 4, (const int64_t[]){2, 3, 3, 3});
  KT_FAILS(kiln_tensor_conv2d(x, w_ok, bias, NULL, &out), KILN_SHAPE_MISMATCH, "bias must be [2]");
  KT_FAILS(kiln_tensor_conv2d(a, w_ok, NULL, NULL, &out), KILN_SHAPE_MISMATCH, "[N, C, H, W]");
  KT_FAILS(kiln_tensor_max_pool2d(a, &(kiln_pool2d_params_t){{2, 2}, {0, 0}, {0, 0}}, &out), KILN_SHAPE_MISMATCH,
           "[N, C, H, W]");
  KT_FAILS3(kiln_tensor_reshape(a, 2, (const int64_t[]){5, 3}, &out), KILN_SHAPE_MISMATCH, "12", "15", "reshape");
  KT_FAILS(kiln_tensor_reshape(a, 2, (const int64_t[]){-1, 5}, &out), KILN_SHAPE_MISMATCH, "12");
  KT_FAILS(kiln_tensor_reshape(a, 2, (const int64_t[]){-1, -1}, &out), KILN_INVALID_ARGUMENT, "both -1");
  KT_FAILS3(kiln_tensor_cross_entropy(a, labels, &out), KILN_SHAPE_MISMATCH, "[3, 4]", "[5]", "[N, C]");
  KT_FAILS(kiln_tensor_transpose(a, 0, 2, &out), KILN_INVALID_ARGUMENT, "2");
  KT_FAILS(kiln_tensor_permute(a, (const int[]){0, 0}, &out), KILN_INVALID_ARGUMENT, "perm");
  KT_FAILS3(kiln_tensor_sum(a, 2, false, &out), KILN_INVALID_ARGUMENT, "axis 2", "out of range", "KILN_ALL_AXES");
  KT_FAILS(kiln_tensor_argmax(a, -3, false, &out), KILN_INVALID_ARGUMENT, "axis -3");
  kiln_tensor_t *empty = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 0});
  KT_FAILS(kiln_tensor_max(empty, 1, false, &out), KILN_INVALID_ARGUMENT, "empty");
  KT_FAILS(kiln_tensor_argmax(empty, KILN_ALL_AXES, false, &out), KILN_INVALID_ARGUMENT, "empty");
  /* Parameters out of range. */
  KT_FAILS(kiln_tensor_conv2d(x, w_ok, NULL, &(kiln_conv2d_params_t){{0, 1}, {0, 0}, {1, 1}}, &out),
           KILN_INVALID_ARGUMENT, "stride (0, 1)");
  KT_FAILS(kiln_tensor_conv2d(x, w_ok, NULL, &(kiln_conv2d_params_t){{1, 1}, {-1, 0}, {1, 1}}, &out),
           KILN_INVALID_ARGUMENT, "padding (-1, 0)");
  KT_FAILS(kiln_tensor_max_pool2d(x, &(kiln_pool2d_params_t){{2, 2}, {1, 1}, {2, 0}}, &out), KILN_INVALID_ARGUMENT,
           "padding (2, 0)");
  KT_FAILS(kiln_tensor_max_pool2d(x, &(kiln_pool2d_params_t){{0, 2}, {1, 1}, {0, 0}}, &out), KILN_INVALID_ARGUMENT,
           "kernel (0, 2)");
  KT_FAILS(kiln_tensor_arange(kt_cpu(), KILN_F32, 0, 5, 0, &out), KILN_INVALID_ARGUMENT, "step");
  KT_FAILS(kiln_tensor_normal(kt_cpu(), 1, (const int64_t[]){4}, 1, 0.0f, -1.0f, &out), KILN_INVALID_ARGUMENT,
           "stddev -1");
  KT_FAILS(kiln_tensor_uniform(kt_cpu(), 1, (const int64_t[]){4}, 1, 2.0f, 1.0f, &out), KILN_INVALID_ARGUMENT,
           "low <= high");
  KT_FAILS(kiln_tensor_uniform(kt_cpu(), 1, (const int64_t[]){4}, 1, NAN, 1.0f, &out), KILN_INVALID_ARGUMENT,
           "finite");
  KT_FAILS(kiln_tensor_unary((kiln_unary_op_t)99, a, &out), KILN_INVALID_ARGUMENT, "op 99");
  KT_FAILS(kiln_tensor_binary((kiln_binary_op_t)-1, a, a, &out), KILN_INVALID_ARGUMENT, "op -1");
  ck_assert_ptr_null(out);

  kiln_tensor_t *all[] = {a, b, v, x, w, w_big, bias, labels, ba, bb, w_ok, empty};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
  kiln_deinitialize();
}
END_TEST

/* ---- dtypes ---------------------------------------------------------------------------- */

START_TEST(test_dtype_mismatch) {
  kt_env_reset();
  const int64_t s[2] = {2, 3};
  kiln_tensor_t *f = kt_tensor(KILN_F32, 2, s), *i = kt_tensor(KILN_I32, 2, s), *out = NULL;
  kiln_tensor_t *fm = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 2});
  kiln_tensor_t *im = kt_tensor(KILN_I32, 2, (const int64_t[]){3, 2});
  kiln_tensor_t *fl = kt_tensor(KILN_F32, 1, (const int64_t[]){2});
  /* Two dtypes promote (kiln_result_dtype); one without a kernel says so. */
  KT_OK(kiln_tensor_add(f, i, &out));
  ck_assert_int_eq(kiln_tensor_dtype(out), KILN_F32);
  kiln_tensor_release(out);
  out = NULL;
  KT_FAILS(kiln_tensor_matmul(i, im, false, false, &out), KILN_DTYPE_MISMATCH, "i32");
  KT_FAILS(kiln_tensor_matmul(f, im, false, false, &out), KILN_DTYPE_MISMATCH, "use f32");
  KT_FAILS3(kiln_tensor_exp(i, &out), KILN_DTYPE_MISMATCH, "exp", "i32", "use f32");
  KT_FAILS(kiln_tensor_mean(i, 0, false, &out), KILN_DTYPE_MISMATCH, "mean");
  KT_FAILS(kiln_tensor_norm(i, &out), KILN_DTYPE_MISMATCH, "norm");
  KT_FAILS(kiln_tensor_softmax(i, &out), KILN_DTYPE_MISMATCH, "softmax");
  KT_FAILS(kiln_tensor_log_softmax(i, &out), KILN_DTYPE_MISMATCH, "log_softmax");
  KT_FAILS3(kiln_tensor_cross_entropy(f, fl, &out), KILN_DTYPE_MISMATCH, "logits are f32", "labels f32",
            "i32 labels");
  KT_FAILS(kiln_tensor_conv2d(i, i, NULL, NULL, &out), KILN_DTYPE_MISMATCH, "conv2d");
  KT_FAILS(kiln_tensor_max_pool2d(i, &(kiln_pool2d_params_t){{1, 1}, {1, 1}, {0, 0}}, &out), KILN_DTYPE_MISMATCH,
           "max_pool2d");
  /* Every dtype is stored; compute without a kernel is refused, naming the cast. */
  kiln_tensor_t *h = NULL;
  KT_OK(kiln_tensor_ones(kt_cpu(), KILN_BOOL, 2, s, &h));
  KT_FAILS(kiln_tensor_sqrt(h, &out), KILN_DTYPE_MISMATCH,
           "sqrt does not support dtype bool (a); use f32, f16, bf16 or f64: cast to f32 first");
  kiln_tensor_release(h);
  KT_FAILS(kiln_tensor_zeros(kt_cpu(), (kiln_dtype_t)42, 2, s, &out), KILN_INVALID_ARGUMENT, "dtype 42");
  ck_assert_ptr_null(out);
  ck_assert_str_eq(kiln_dtype_name((kiln_dtype_t)42), "?");
  ck_assert_uint_eq(kiln_dtype_size((kiln_dtype_t)42), 0);
  kiln_tensor_release(f);
  kiln_tensor_release(i);
  kiln_tensor_release(fm);
  kiln_tensor_release(im);
  kiln_tensor_release(fl);
  kiln_deinitialize();
}
END_TEST

/* ---- training: gradients and updates --------------------------------------------------------
 * Each new function: NULLs, dtypes, shapes, devices, and for the updates
 * strided views, operands sharing memory and hyperparameters out of range,
 * with the words runtime/ops_train.c uses. A refused call writes nothing to
 * *out and leaves the tensors it would have updated as they were. */

static const kiln_sgd_params_t kt_sgd_ok = {0.1, 0.9, 0, 0, false, false};
static const kiln_adam_params_t kt_adam_ok = {1e-3, 0.9, 0.999, 1e-8, 0};

START_TEST(test_training_nulls) {
  kt_env_reset();
  kiln_device_t *dev = kt_cpu();
  const int64_t s2[2] = {2, 3}, x4[4] = {1, 1, 3, 3}, w4[4] = {1, 1, 2, 2}, y4[4] = {1, 1, 2, 2};
  kiln_tensor_t *t = kt_tensor(KILN_F32, 2, s2), *u = kt_tensor(KILN_F32, 2, s2), *m = kt_tensor(KILN_F32, 2, s2);
  kiln_tensor_t *v = kt_tensor(KILN_F32, 2, s2);
  kiln_tensor_t *logits = kt_tensor(KILN_F32, 2, s2), *labels = NULL;
  KT_OK(kiln_tensor_zeros(dev, KILN_I32, 1, (const int64_t[]){2}, &labels));
  kiln_tensor_t *x = kt_tensor(KILN_F32, 4, x4), *w = kt_tensor(KILN_F32, 4, w4), *dy = kt_tensor(KILN_F32, 4, y4);
  const kiln_pool2d_params_t pool = {{2, 2}, {1, 1}, {0, 0}};
  kiln_tensor_t *out = NULL;
  kiln_memory_stats_t stats;

  KT_NULL_ARG(kiln_tensor_unary_backward(KILN_UNARY_TANH, NULL, t, &out), "x");
  KT_NULL_ARG(kiln_tensor_unary_backward(KILN_UNARY_TANH, t, NULL, &out), "dy");
  KT_NULL_ARG(kiln_tensor_unary_backward(KILN_UNARY_TANH, t, t, NULL), "out");
  KT_NULL_ARG(kiln_tensor_sum_to(NULL, 1, &s2[1], &out), "a");
  KT_NULL_ARG(kiln_tensor_sum_to(t, 1, &s2[1], NULL), "out");
  KT_FAILS(kiln_tensor_sum_to(t, 1, NULL, &out), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sum_to: ndim 1 with shape (nil); pass 0..8 sizes");
  KT_NULL_ARG(kiln_tensor_broadcast_to(NULL, 2, s2, &out), "a");
  KT_NULL_ARG(kiln_tensor_broadcast_to(t, 2, s2, NULL), "out");
  KT_FAILS(kiln_tensor_broadcast_to(t, 2, NULL, &out), KILN_INVALID_ARGUMENT,
           "kiln_tensor_broadcast_to: ndim 2 with shape (nil); pass 0..8 sizes");
  KT_NULL_ARG(kiln_tensor_softmax_backward(NULL, t, false, &out), "y");
  KT_NULL_ARG(kiln_tensor_softmax_backward(t, NULL, true, &out), "dy");
  KT_NULL_ARG(kiln_tensor_softmax_backward(t, t, false, NULL), "out");
  KT_NULL_ARG(kiln_tensor_cross_entropy_backward(NULL, labels, NULL, &out), "logits");
  KT_NULL_ARG(kiln_tensor_cross_entropy_backward(logits, NULL, NULL, &out), "labels");
  KT_NULL_ARG(kiln_tensor_cross_entropy_backward(logits, labels, NULL, NULL), "out");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_input(NULL, w, x4, NULL, &out), "dy");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_input(dy, NULL, x4, NULL, &out), "weight");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_input(dy, w, NULL, NULL, &out), "x_shape");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_input(dy, w, x4, NULL, NULL), "out");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_weight(NULL, dy, w4, NULL, &out), "x");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_weight(x, NULL, w4, NULL, &out), "dy");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_weight(x, dy, NULL, NULL, &out), "w_shape");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_weight(x, dy, w4, NULL, NULL), "out");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_bias(NULL, &out), "dy");
  KT_NULL_ARG(kiln_tensor_conv2d_backward_bias(dy, NULL), "out");
  KT_NULL_ARG(kiln_tensor_max_pool2d_backward(NULL, dy, &pool, &out), "x");
  KT_NULL_ARG(kiln_tensor_max_pool2d_backward(x, NULL, &pool, &out), "dy");
  KT_NULL_ARG(kiln_tensor_max_pool2d_backward(x, dy, NULL, &out), "params");
  KT_NULL_ARG(kiln_tensor_max_pool2d_backward(x, dy, &pool, NULL), "out");
  ck_assert_ptr_null(out);

  KT_NULL_ARG(kiln_tensor_accumulate(NULL, 1.0, t), "a");
  KT_NULL_ARG(kiln_tensor_accumulate(t, 1.0, NULL), "b");
  KT_NULL_ARG(kiln_tensor_sgd_update(NULL, u, m, &kt_sgd_ok), "param");
  KT_NULL_ARG(kiln_tensor_sgd_update(t, NULL, m, &kt_sgd_ok), "grad");
  KT_NULL_ARG(kiln_tensor_sgd_update(t, u, m, NULL), "params");
  KT_FAILS(kiln_tensor_sgd_update(t, u, NULL, &kt_sgd_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: momentum_buf is NULL with momentum 0.9; pass a zero-initialised tensor of "
           "param's shape (kiln_tensor_zeros)");
  KT_NULL_ARG(kiln_tensor_adam_update(NULL, u, m, v, 1, &kt_adam_ok), "param");
  KT_NULL_ARG(kiln_tensor_adam_update(t, NULL, m, v, 1, &kt_adam_ok), "grad");
  KT_NULL_ARG(kiln_tensor_adam_update(t, u, NULL, v, 1, &kt_adam_ok), "m");
  KT_NULL_ARG(kiln_tensor_adam_update(t, u, m, NULL, 1, &kt_adam_ok), "v");
  KT_NULL_ARG(kiln_tensor_adam_update(t, u, m, v, 1, NULL), "params");

  KT_NULL_ARG(kiln_device_memory_stats(NULL, &stats), "device");
  KT_NULL_ARG(kiln_device_memory_stats(dev, NULL), "out_stats");
  KT_NULL_ARG(kiln_device_memory_reset_peak(NULL), "device");
  kiln_device_t *fake = (kiln_device_t *)&stats;
  KT_FAILS(kiln_device_memory_stats(fake, &stats), KILN_INVALID_ARGUMENT, "is not a device of this kiln");

  kiln_tensor_t *all[] = {t, u, m, v, logits, labels, x, w, dy};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_training_dtypes) {
  kt_env_reset();
  const int64_t s2[2] = {2, 3}, x4[4] = {1, 1, 3, 3}, w4[4] = {1, 1, 2, 2};
  kiln_tensor_t *f = kt_tensor(KILN_F32, 2, s2), *i = kt_tensor(KILN_I32, 2, s2), *out = NULL;
  kiln_tensor_t *xf = kt_tensor(KILN_F32, 4, x4), *xi = kt_tensor(KILN_I32, 4, x4);
  kiln_tensor_t *wf = kt_tensor(KILN_F32, 4, w4), *wi = kt_tensor(KILN_I32, 4, w4);
  kiln_tensor_t *dyf = kt_tensor(KILN_F32, 4, w4), *dyi = kt_tensor(KILN_I32, 4, w4);
  kiln_tensor_t *labels = kt_tensor(KILN_I32, 1, (const int64_t[]){2});
  kiln_tensor_t *flabels = kt_tensor(KILN_F32, 1, (const int64_t[]){2});
  kiln_tensor_t *dloss_i = kt_tensor(KILN_I32, 0, NULL);
  const kiln_pool2d_params_t pool = {{2, 2}, {1, 1}, {0, 0}};

  KT_FAILS(kiln_tensor_unary_backward(KILN_UNARY_EXP, i, f, &out), KILN_DTYPE_MISMATCH,
           "kiln_tensor_unary_backward: unary_backward does not support dtype i32 (x); use f32");
  KT_FAILS(kiln_tensor_unary_backward(KILN_UNARY_RELU, f, i, &out), KILN_DTYPE_MISMATCH,
           "kiln_tensor_unary_backward: unary_backward does not support dtype i32 (dy); use f32");
  KT_FAILS(kiln_tensor_softmax_backward(i, f, false, &out), KILN_DTYPE_MISMATCH,
           "kiln_tensor_softmax_backward: softmax_backward does not support dtype i32 (y); use f32");
  KT_FAILS(kiln_tensor_softmax_backward(f, i, true, &out), KILN_DTYPE_MISMATCH,
           "softmax_backward does not support dtype i32 (dy); use f32");
  KT_FAILS(kiln_tensor_cross_entropy_backward(f, flabels, NULL, &out), KILN_DTYPE_MISMATCH,
           "kiln_tensor_cross_entropy_backward: logits are f32, labels f32; pass f32 logits, i32 labels and an f32 "
           "dloss");
  KT_FAILS(kiln_tensor_cross_entropy_backward(i, labels, NULL, &out), KILN_DTYPE_MISMATCH,
           "logits are i32, labels i32; pass f32 logits");
  KT_FAILS(kiln_tensor_cross_entropy_backward(f, labels, dloss_i, &out), KILN_DTYPE_MISMATCH,
           "logits are f32, labels i32, dloss i32; pass f32 logits, i32 labels and an f32 dloss");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dyi, wf, x4, NULL, &out), KILN_DTYPE_MISMATCH,
           "kiln_tensor_conv2d_backward_input: conv2d_backward_input does not support dtype i32 (dy); use f32");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dyf, wi, x4, NULL, &out), KILN_DTYPE_MISMATCH,
           "conv2d_backward_input does not support dtype i32 (weight); use f32");
  KT_FAILS(kiln_tensor_conv2d_backward_weight(xi, dyf, w4, NULL, &out), KILN_DTYPE_MISMATCH,
           "kiln_tensor_conv2d_backward_weight: conv2d_backward_weight does not support dtype i32 (x); use f32");
  KT_FAILS(kiln_tensor_conv2d_backward_weight(xf, dyi, w4, NULL, &out), KILN_DTYPE_MISMATCH,
           "conv2d_backward_weight does not support dtype i32 (dy); use f32");
  KT_FAILS(kiln_tensor_conv2d_backward_bias(dyi, &out), KILN_DTYPE_MISMATCH,
           "kiln_tensor_conv2d_backward_bias: conv2d_backward_bias does not support dtype i32 (dy); use f32");
  KT_FAILS(kiln_tensor_max_pool2d_backward(xi, dyf, &pool, &out), KILN_DTYPE_MISMATCH,
           "kiln_tensor_max_pool2d_backward: max_pool2d_backward does not support dtype i32 (x); use f32");
  KT_FAILS(kiln_tensor_max_pool2d_backward(xf, dyi, &pool, &out), KILN_DTYPE_MISMATCH,
           "max_pool2d_backward does not support dtype i32 (dy); use f32");
  ck_assert_ptr_null(out);
  /* sum_to and broadcast_to take i32 too. */
  KT_OK(kiln_tensor_sum_to(i, 1, &s2[1], &out));
  kiln_tensor_release(out);
  out = NULL;
  KT_OK(kiln_tensor_broadcast_to(i, 3, (const int64_t[]){4, 2, 3}, &out));
  kiln_tensor_release(out);
  out = NULL;

  KT_FAILS(kiln_tensor_accumulate(i, 1.0, f), KILN_DTYPE_MISMATCH,
           "kiln_tensor_accumulate: an update does not support dtype i32 (a); use f32");
  KT_FAILS(kiln_tensor_accumulate(f, 1.0, i), KILN_DTYPE_MISMATCH, "an update does not support dtype i32 (b)");
  kiln_tensor_t *f2 = kt_tensor(KILN_F32, 2, s2), *f3 = kt_tensor(KILN_F32, 2, s2);
  KT_FAILS(kiln_tensor_sgd_update(f, i, f2, &kt_sgd_ok), KILN_DTYPE_MISMATCH,
           "kiln_tensor_sgd_update: an update does not support dtype i32 (grad); use f32");
  KT_FAILS(kiln_tensor_sgd_update(f, f2, i, &kt_sgd_ok), KILN_DTYPE_MISMATCH,
           "an update does not support dtype i32 (momentum_buf)");
  KT_FAILS(kiln_tensor_adam_update(i, f, f2, f3, 1, &kt_adam_ok), KILN_DTYPE_MISMATCH,
           "kiln_tensor_adam_update: an update does not support dtype i32 (param); use f32");
  KT_FAILS(kiln_tensor_adam_update(f, f2, f3, i, 1, &kt_adam_ok), KILN_DTYPE_MISMATCH,
           "an update does not support dtype i32 (v)");
  /* The refused updates changed nothing. */
  float host[6];
  KT_OK(kiln_tensor_read(f, host, sizeof host));
  for (int k = 0; k < 6; k++) ck_assert(host[k] == 1.0f);

  kiln_tensor_t *all[] = {f, i, xf, xi, wf, wi, dyf, dyi, labels, flabels, dloss_i, f2, f3};
  for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) kiln_tensor_release(all[k]);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_training_shapes) {
  kt_env_reset();
  kiln_tensor_t *a = kt_tensor(KILN_F32, 2, (const int64_t[]){2, 3});
  kiln_tensor_t *b = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 2});
  kiln_tensor_t *c35 = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 5});
  kiln_tensor_t *one = kt_tensor(KILN_F32, 1, (const int64_t[]){3});
  kiln_tensor_t *labels = kt_tensor(KILN_I32, 1, (const int64_t[]){5});
  kiln_tensor_t *dloss2 = kt_tensor(KILN_F32, 1, (const int64_t[]){2});
  kiln_tensor_t *x = kt_tensor(KILN_F32, 4, (const int64_t[]){1, 3, 5, 5});
  kiln_tensor_t *x3 = kt_tensor(KILN_F32, 3, (const int64_t[]){3, 5, 5});
  kiln_tensor_t *w = kt_tensor(KILN_F32, 4, (const int64_t[]){2, 3, 3, 3});
  kiln_tensor_t *w3 = kt_tensor(KILN_F32, 3, (const int64_t[]){2, 3, 3});
  kiln_tensor_t *dy = kt_tensor(KILN_F32, 4, (const int64_t[]){1, 2, 3, 3});
  kiln_tensor_t *dy_bad = kt_tensor(KILN_F32, 4, (const int64_t[]){1, 2, 4, 3});
  kiln_tensor_t *dy3 = kt_tensor(KILN_F32, 3, (const int64_t[]){2, 3, 4});
  kiln_tensor_t *px = kt_tensor(KILN_F32, 4, (const int64_t[]){1, 1, 5, 5});
  kiln_tensor_t *pdy = kt_tensor(KILN_F32, 4, (const int64_t[]){1, 1, 4, 4});
  kiln_tensor_t *out = NULL;
  const int64_t x_shape[4] = {1, 3, 5, 5}, w_shape[4] = {2, 3, 3, 3};

  KT_FAILS(kiln_tensor_unary_backward(KILN_UNARY_EXP, a, b, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_unary_backward: x is [2, 3] but dy is [3, 2]; pass the gradient of f(x), of x's shape");
  KT_FAILS(kiln_tensor_unary_backward((kiln_unary_op_t)99, a, a, &out), KILN_INVALID_ARGUMENT,
           "kiln_tensor_unary_backward: op 99 is not a kiln_unary_op_t; use KILN_UNARY_NEG ... KILN_UNARY_TANH");

  KT_FAILS(kiln_tensor_sum_to(c35, 1, (const int64_t[]){4}, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_sum_to: shape [4] does not broadcast to [3, 5] (dimension 0: 4 vs 5); sizes must match or "
           "be 1");
  KT_FAILS(kiln_tensor_sum_to(c35, 3, (const int64_t[]){2, 3, 5}, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_sum_to: shape [2, 3, 5] has more dimensions than [3, 5]; a broadcast shape has at most as "
           "many");
  KT_FAILS(kiln_tensor_sum_to(c35, 2, (const int64_t[]){-1, 5}, &out), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sum_to: size -1 of shape [-1, 5] is negative");
  KT_FAILS(kiln_tensor_sum_to(c35, 9, (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 3, 5}, &out), KILN_INVALID_ARGUMENT,
           "ndim 9 with shape");
  KT_FAILS(kiln_tensor_sum_to(c35, -1, (const int64_t[]){5}, &out), KILN_INVALID_ARGUMENT, "ndim -1 with shape");

  KT_FAILS(kiln_tensor_broadcast_to(one, 1, (const int64_t[]){4}, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_broadcast_to: a [3] does not broadcast to [4] (dimension 0: 3 vs 4); sizes must match or be 1");
  KT_FAILS(kiln_tensor_broadcast_to(a, 1, (const int64_t[]){3}, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_broadcast_to: a [2, 3] has more dimensions than the shape [3]");
  KT_FAILS(kiln_tensor_broadcast_to(one, 2, (const int64_t[]){-2, 3}, &out), KILN_INVALID_ARGUMENT,
           "size -2 of dimension 0 is negative");
  KT_FAILS(kiln_tensor_broadcast_to(one, 9, (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 3}, &out),
           KILN_INVALID_ARGUMENT, "ndim 9 with shape");

  KT_FAILS(kiln_tensor_softmax_backward(a, b, false, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_softmax_backward: y is [2, 3] but dy is [3, 2]; pass the forward's result and its gradient");
  KT_FAILS(kiln_tensor_cross_entropy_backward(a, labels, NULL, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_cross_entropy_backward: logits [2, 3] and labels [5]; pass logits [N, C] and labels [N]");
  KT_FAILS(kiln_tensor_cross_entropy_backward(x3, labels, NULL, &out), KILN_SHAPE_MISMATCH,
           "logits [3, 5, 5] and labels [5]; pass logits [N, C] and labels [N]");
  kiln_tensor_t *logits = kt_tensor(KILN_F32, 2, (const int64_t[]){5, 4});
  KT_FAILS(kiln_tensor_cross_entropy_backward(logits, labels, dloss2, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_cross_entropy_backward: dloss has 2 elements; pass a one-element tensor (or NULL for 1)");

  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w3, x_shape, NULL, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_conv2d_backward_input: weight [2, 3, 3]; pass weight [K, C, R, S]");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy_bad, w, x_shape, NULL, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_conv2d_backward_input: dy is [1, 2, 4, 3] but the convolution's result is [1, 2, 3, 3]; pass "
           "the gradient of that result");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, (const int64_t[]){1, 4, 5, 5}, NULL, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_conv2d_backward_input: x has 4 channels but weight expects 3 (x [1, 4, 5, 5], weight [2, 3, 3, "
           "3])");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, (const int64_t[]){1, 3, -5, 5}, NULL, &out),
           KILN_INVALID_ARGUMENT,
           "kiln_tensor_conv2d_backward_input: x [1, 3, -5, 5] and weight [2, 3, 3, 3]: sizes must be >= 0");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, (const int64_t[]){1, 3, 2, 5}, NULL, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_conv2d_backward_input: the 3x3 window (dilation 1x1) does not fit x [1, 3, 2, 5] with padding "
           "0x0");
  /* Extents near INT64_MAX are computed without overflow. */
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, (const int64_t[]){1, 3, INT64_MAX, 5}, NULL, &out),
           KILN_SHAPE_MISMATCH, "but the convolution's result is [1, 2, 9223372036854775805, 3]");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, (const int64_t[]){1, 3, INT64_MAX, 5},
                                             &(kiln_conv2d_params_t){{1, 1}, {1, 1}, {1, 1}}, &out),
           KILN_SHAPE_MISMATCH, "does not fit");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, x_shape, &(kiln_conv2d_params_t){{0, 1}, {0, 0}, {1, 1}}, &out),
           KILN_INVALID_ARGUMENT,
           "kiln_tensor_conv2d_backward_input: stride (0, 1), padding (0, 0), dilation (1, 1): strides and dilations "
           "must be >= 1 and paddings >= 0");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, x_shape, &(kiln_conv2d_params_t){{1, 1}, {0, -1}, {1, 1}}, &out),
           KILN_INVALID_ARGUMENT, "padding (0, -1)");
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, x_shape, &(kiln_conv2d_params_t){{1, 1}, {0, 0}, {1, 0}}, &out),
           KILN_INVALID_ARGUMENT, "dilation (1, 0)");
  /* The same dy for another stride is not the gradient of that convolution. */
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, x_shape, &(kiln_conv2d_params_t){{2, 2}, {0, 0}, {1, 1}}, &out),
           KILN_SHAPE_MISMATCH, "dy is [1, 2, 3, 3] but the convolution's result is [1, 2, 2, 2]");

  KT_FAILS(kiln_tensor_conv2d_backward_weight(x3, dy, w_shape, NULL, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_conv2d_backward_weight: x [3, 5, 5]; pass x [N, C, H, W]");
  KT_FAILS(kiln_tensor_conv2d_backward_weight(x, dy_bad, w_shape, NULL, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_conv2d_backward_weight: dy is [1, 2, 4, 3] but the convolution's result is [1, 2, 3, 3]");
  KT_FAILS(kiln_tensor_conv2d_backward_weight(x, dy, (const int64_t[]){2, 4, 3, 3}, NULL, &out), KILN_SHAPE_MISMATCH,
           "x has 3 channels but weight expects 4");
  KT_FAILS(kiln_tensor_conv2d_backward_weight(x, dy, (const int64_t[]){2, 3, 0, 3}, NULL, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_conv2d_backward_weight: weight [2, 3, 0, 3] has an empty channel or window dimension; C, R, S "
           "must be >= 1");
  KT_FAILS(kiln_tensor_conv2d_backward_weight(x, dy, (const int64_t[]){-2, 3, 3, 3}, NULL, &out),
           KILN_INVALID_ARGUMENT, "sizes must be >= 0");
  KT_FAILS(kiln_tensor_conv2d_backward_weight(x, dy, w_shape, &(kiln_conv2d_params_t){{1, 1}, {0, 0}, {-1, 1}}, &out),
           KILN_INVALID_ARGUMENT, "dilation (-1, 1)");

  KT_FAILS(kiln_tensor_conv2d_backward_bias(dy3, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_conv2d_backward_bias: dy [2, 3, 4]; pass the gradient of a conv2d result [N, K, P, Q]");

  const kiln_pool2d_params_t k2 = {{2, 2}, {1, 1}, {0, 0}};
  KT_FAILS(kiln_tensor_max_pool2d_backward(px, pdy, &(kiln_pool2d_params_t){{2, 2}, {1, 1}, {2, 0}}, &out),
           KILN_INVALID_ARGUMENT,
           "kiln_tensor_max_pool2d_backward: kernel (2, 2), stride (1, 1), padding (2, 0): kernels and strides must "
           "be >= 1 and each padding within [0, kernel/2]");
  KT_FAILS(kiln_tensor_max_pool2d_backward(px, pdy, &(kiln_pool2d_params_t){{0, 2}, {1, 1}, {0, 0}}, &out),
           KILN_INVALID_ARGUMENT, "kernel (0, 2)");
  KT_FAILS(kiln_tensor_max_pool2d_backward(px, pdy, &(kiln_pool2d_params_t){{2, 2}, {-1, 1}, {0, 0}}, &out),
           KILN_INVALID_ARGUMENT, "stride (-1, 1)");
  KT_FAILS(kiln_tensor_max_pool2d_backward(px, pdy, &(kiln_pool2d_params_t){{2, 2}, {1, 1}, {-1, 0}}, &out),
           KILN_INVALID_ARGUMENT, "padding (-1, 0)");
  KT_FAILS(kiln_tensor_max_pool2d_backward(x3, pdy, &k2, &out), KILN_SHAPE_MISMATCH,
           "kiln_tensor_max_pool2d_backward: x [3, 5, 5]; pass x [N, C, H, W]");
  KT_FAILS(kiln_tensor_max_pool2d_backward(px, pdy, &(kiln_pool2d_params_t){{7, 7}, {1, 1}, {0, 0}}, &out),
           KILN_SHAPE_MISMATCH,
           "kiln_tensor_max_pool2d_backward: the 7x7 window does not fit x [1, 1, 5, 5] with padding 0x0");
  KT_FAILS(kiln_tensor_max_pool2d_backward(px, pdy, &(kiln_pool2d_params_t){{2, 2}, {0, 0}, {0, 0}}, &out),
           KILN_SHAPE_MISMATCH,
           "kiln_tensor_max_pool2d_backward: dy is [1, 1, 4, 4] but the pooling's result is [1, 1, 2, 2]; pass the "
           "gradient of that result");
  ck_assert_ptr_null(out);

  KT_FAILS(kiln_tensor_accumulate(a, 1.0, b), KILN_SHAPE_MISMATCH,
           "kiln_tensor_accumulate: a is [2, 3] but b is [3, 2]; an update takes tensors of one shape");
  kiln_tensor_t *a2 = kt_tensor(KILN_F32, 2, (const int64_t[]){2, 3});
  kiln_tensor_t *a3 = kt_tensor(KILN_F32, 2, (const int64_t[]){2, 3});
  KT_FAILS(kiln_tensor_sgd_update(a, a2, b, &kt_sgd_ok), KILN_SHAPE_MISMATCH,
           "kiln_tensor_sgd_update: param is [2, 3] but momentum_buf is [3, 2]; an update takes tensors of one shape");
  KT_FAILS(kiln_tensor_adam_update(a, b, a2, a3, 1, &kt_adam_ok), KILN_SHAPE_MISMATCH,
           "kiln_tensor_adam_update: param is [2, 3] but grad is [3, 2]");
  KT_FAILS(kiln_tensor_adam_update(a, a2, a3, one, 1, &kt_adam_ok), KILN_SHAPE_MISMATCH,
           "param is [2, 3] but v is [3]");

  kiln_tensor_t *all[] = {a, b, c35, one, labels, dloss2, x, x3, w, w3, dy, dy_bad, dy3, px, pdy, logits, a2, a3};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_training_devices) {
  kt_env_reset();
  setenv("KILN_CPU_DEVICES", "2", 1);
  kiln_device_t *d0 = NULL, *d1 = NULL;
  KT_OK(kiln_device_find("cpu:0", &d0));
  KT_OK(kiln_device_find("cpu:1", &d1));
  const int64_t s[2] = {2, 2}, x4[4] = {1, 1, 3, 3}, w4[4] = {1, 1, 2, 2};
  kiln_tensor_t *a = NULL, *b = NULL, *c = NULL, *x0 = NULL, *w1 = NULL, *dy0 = NULL, *dy1 = NULL, *l1 = NULL;
  kiln_tensor_t *d1loss = NULL, *m0 = NULL, *v0 = NULL, *v1 = NULL, *out = NULL;
  KT_OK(kiln_tensor_ones(d0, KILN_F32, 2, s, &a));
  KT_OK(kiln_tensor_ones(d1, KILN_F32, 2, s, &b));
  KT_OK(kiln_tensor_ones(d0, KILN_F32, 2, s, &c));
  KT_OK(kiln_tensor_ones(d0, KILN_F32, 2, s, &m0));
  KT_OK(kiln_tensor_ones(d0, KILN_F32, 2, s, &v0));
  KT_OK(kiln_tensor_ones(d1, KILN_F32, 2, s, &v1));
  KT_OK(kiln_tensor_ones(d0, KILN_F32, 4, x4, &x0));
  KT_OK(kiln_tensor_ones(d1, KILN_F32, 4, w4, &w1));
  KT_OK(kiln_tensor_ones(d0, KILN_F32, 4, w4, &dy0));
  KT_OK(kiln_tensor_ones(d1, KILN_F32, 4, w4, &dy1));
  KT_OK(kiln_tensor_zeros(d1, KILN_I32, 1, (const int64_t[]){2}, &l1));
  KT_OK(kiln_tensor_ones(d1, KILN_F32, 0, NULL, &d1loss));
  const kiln_pool2d_params_t pool = {{2, 2}, {1, 1}, {0, 0}};

  KT_FAILS3(kiln_tensor_unary_backward(KILN_UNARY_EXP, a, b, &out), KILN_DEVICE_MISMATCH,
            "kiln_tensor_unary_backward: operands live on different devices: x on cpu:0", "dy on cpu:1",
            "kiln never copies implicitly: move one first with kiln_tensor_to(dy, kiln_tensor_device(x), &dy2)");
  KT_FAILS3(kiln_tensor_softmax_backward(a, b, false, &out), KILN_DEVICE_MISMATCH,
            "kiln_tensor_softmax_backward: operands live on different devices: y on cpu:0", "dy on cpu:1",
            "kiln_tensor_to(dy, kiln_tensor_device(y), &dy2)");
  KT_FAILS3(kiln_tensor_cross_entropy_backward(a, l1, NULL, &out), KILN_DEVICE_MISMATCH,
            "kiln_tensor_cross_entropy_backward: operands live on different devices: logits on cpu:0",
            "labels on cpu:1",
            "kiln_tensor_to(labels, kiln_tensor_device(logits), &labels2)");
  kiln_tensor_t *l0 = NULL;
  KT_OK(kiln_tensor_zeros(d0, KILN_I32, 1, (const int64_t[]){2}, &l0));
  KT_FAILS3(kiln_tensor_cross_entropy_backward(a, l0, d1loss, &out), KILN_DEVICE_MISMATCH, "logits on cpu:0",
            "dloss on cpu:1", "kiln_tensor_to(dloss, kiln_tensor_device(logits), &dloss2)");
  KT_FAILS3(kiln_tensor_conv2d_backward_input(dy0, w1, x4, NULL, &out), KILN_DEVICE_MISMATCH,
            "kiln_tensor_conv2d_backward_input: operands live on different devices: dy on cpu:0", "weight on cpu:1",
            "kiln_tensor_to(weight, kiln_tensor_device(dy), &weight2)");
  KT_FAILS3(kiln_tensor_conv2d_backward_weight(x0, dy1, w4, NULL, &out), KILN_DEVICE_MISMATCH,
            "kiln_tensor_conv2d_backward_weight: operands live on different devices: x on cpu:0", "dy on cpu:1",
            "kiln_tensor_to(dy, kiln_tensor_device(x), &dy2)");
  KT_FAILS3(kiln_tensor_max_pool2d_backward(x0, dy1, &pool, &out), KILN_DEVICE_MISMATCH,
            "kiln_tensor_max_pool2d_backward: operands live on different devices: x on cpu:0", "dy on cpu:1",
            "kiln_tensor_to(dy, kiln_tensor_device(x), &dy2)");
  ck_assert_ptr_null(out);
  KT_FAILS3(kiln_tensor_accumulate(a, 1.0, b), KILN_DEVICE_MISMATCH,
            "kiln_tensor_accumulate: operands live on different devices: a on cpu:0", "b on cpu:1",
            "kiln_tensor_to(b, kiln_tensor_device(a), &b2)");
  KT_FAILS3(kiln_tensor_sgd_update(a, c, b, &kt_sgd_ok), KILN_DEVICE_MISMATCH,
            "kiln_tensor_sgd_update: operands live on different devices: param on cpu:0", "momentum_buf on cpu:1",
            "kiln_tensor_to(momentum_buf, kiln_tensor_device(param), &momentum_buf2)");
  KT_FAILS3(kiln_tensor_adam_update(a, c, m0, v1, 1, &kt_adam_ok), KILN_DEVICE_MISMATCH,
            "kiln_tensor_adam_update: operands live on different devices: param on cpu:0", "v on cpu:1",
            "kiln_tensor_to(v, kiln_tensor_device(param), &v2)");
  KT_FAILS3(kiln_tensor_adam_update(b, c, m0, v0, 1, &kt_adam_ok), KILN_DEVICE_MISMATCH, "param on cpu:1",
            "grad on cpu:0", "kiln_tensor_to(grad, kiln_tensor_device(param), &grad2)");
  /* Statistics are per device: what cpu:1 holds is not cpu:0's. */
  kiln_memory_stats_t s0, s1;
  KT_OK(kiln_device_memory_stats(d0, &s0));
  KT_OK(kiln_device_memory_stats(d1, &s1));
  ck_assert_uint_gt(s0.in_use_bytes, s1.in_use_bytes);

  kiln_tensor_t *all[] = {a, b, c, x0, w1, dy0, dy1, l1, l0, d1loss, m0, v0, v1};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
  kiln_deinitialize();
  unsetenv("KILN_CPU_DEVICES");
}
END_TEST

/* Strided views, operands sharing memory, hyperparameters out of range. */
/* Hyperparameters the f32 kernels cannot hold are refused, and SGD's first
 * step with dampening follows torch.optim.SGD (buf = g) when asked to. */
START_TEST(test_training_float_range_and_first_step) {
  kt_env_reset();
  kiln_device_t *dev = kt_cpu();
  kiln_tensor_t *p = NULL, *g = NULL, *buf = NULL;
  KT_OK(kiln_tensor_full(dev, KILN_F32, 1, (const int64_t[]){1}, 1.0, &p));
  KT_OK(kiln_tensor_full(dev, KILN_F32, 1, (const int64_t[]){1}, 2.0, &g));
  KT_OK(kiln_tensor_zeros(dev, KILN_F32, 1, (const int64_t[]){1}, &buf));
  kiln_sgd_params_t big = {1e39, 0, 0, 0, false, false};
  KT_FAILS(kiln_tensor_sgd_update(p, g, NULL, &big), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: lr = 1e+39 is beyond what a float holds");
  kiln_adam_params_t tiny_eps = {1e-3, 0.9, 0.999, 1e-50, 0};
  KT_FAILS(kiln_tensor_adam_update(p, g, buf, buf, 1, &tiny_eps), KILN_INVALID_ARGUMENT, "eps = 1e-50 is beyond");
  KT_FAILS(kiln_tensor_accumulate(p, 1e39, g), KILN_INVALID_ARGUMENT, "alpha = 1e+39; pass a number finite as a float");
  /* momentum 0.5, dampening 0.25, g 2, lr 0.1, param 1: torch's first step
   * gives buf 2 and param 0.8; without first_step the zero buffer gives 1.5
   * and 0.85. */
  kiln_sgd_params_t sgd = {0.1, 0.5, 0.25, 0, false, true};
  KT_OK(kiln_tensor_sgd_update(p, g, buf, &sgd));
  double v = 0;
  KT_OK(kiln_tensor_item(buf, &v));
  ck_assert_double_eq_tol(v, 2.0, 1e-7);
  KT_OK(kiln_tensor_item(p, &v));
  ck_assert_double_eq_tol(v, 0.8, 1e-7);
  kiln_tensor_release(p);
  kiln_tensor_release(buf);
  KT_OK(kiln_tensor_full(dev, KILN_F32, 1, (const int64_t[]){1}, 1.0, &p));
  KT_OK(kiln_tensor_zeros(dev, KILN_F32, 1, (const int64_t[]){1}, &buf));
  sgd.first_step = false;
  KT_OK(kiln_tensor_sgd_update(p, g, buf, &sgd));
  KT_OK(kiln_tensor_item(buf, &v));
  ck_assert_double_eq_tol(v, 1.5, 1e-7);
  KT_OK(kiln_tensor_item(p, &v));
  ck_assert_double_eq_tol(v, 0.85, 1e-7);
  kiln_tensor_release(p);
  kiln_tensor_release(g);
  kiln_tensor_release(buf);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_training_updates) {
  kt_env_reset();
  const int64_t s[2] = {2, 3};
  kiln_tensor_t *p = kt_tensor(KILN_F32, 2, s), *g = kt_tensor(KILN_F32, 2, s), *m = kt_tensor(KILN_F32, 2, s);
  kiln_tensor_t *v = kt_tensor(KILN_F32, 2, s), *sq = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 3});
  kiln_tensor_t *t = NULL, *pt = NULL, *flat = NULL;
  /* A transposed [3, 3]: the shape of a [3, 3] tensor, strided. */
  KT_OK(kiln_tensor_transpose(sq, 0, 1, &t));
  kiln_tensor_t *sq2 = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 3});
  kiln_tensor_t *sq3 = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 3});
  kiln_tensor_t *sq4 = kt_tensor(KILN_F32, 2, (const int64_t[]){3, 3});
  KT_FAILS(kiln_tensor_accumulate(t, 1.0, sq2), KILN_INVALID_ARGUMENT,
           "kiln_tensor_accumulate: a is a strided view; updates write in place and take contiguous tensors (pass the "
           "tensor itself, or kiln_tensor_contiguous of it and use that)");
  KT_FAILS(kiln_tensor_accumulate(sq2, 1.0, t), KILN_INVALID_ARGUMENT,
           "kiln_tensor_accumulate: b is a strided view; updates write in place");
  KT_FAILS(kiln_tensor_sgd_update(sq2, t, sq3, &kt_sgd_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: grad is a strided view");
  KT_FAILS(kiln_tensor_sgd_update(sq2, sq3, t, &kt_sgd_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: momentum_buf is a strided view");
  KT_FAILS(kiln_tensor_adam_update(t, sq2, sq3, sq4, 1, &kt_adam_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: param is a strided view");
  KT_FAILS(kiln_tensor_adam_update(sq2, sq3, t, sq4, 1, &kt_adam_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: m is a strided view");
  KT_FAILS(kiln_tensor_adam_update(sq2, sq3, sq4, t, 1, &kt_adam_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: v is a strided view");

  /* The same tensor twice, and a view of one as another. */
  KT_FAILS(kiln_tensor_accumulate(p, 1.0, p), KILN_INVALID_ARGUMENT,
           "kiln_tensor_accumulate: a and b share memory; an update needs separate tensors for each");
  KT_OK(kiln_tensor_reshape(p, 1, (const int64_t[]){6}, &flat));
  KT_OK(kiln_tensor_reshape(p, 2, (const int64_t[]){3, 2}, &pt));
  KT_FAILS(kiln_tensor_sgd_update(p, g, pt, &kt_sgd_ok), KILN_SHAPE_MISMATCH,
           "param is [2, 3] but momentum_buf is [3, 2]");
  kiln_tensor_t *p2 = NULL;
  KT_OK(kiln_tensor_reshape(flat, 2, s, &p2));
  KT_FAILS(kiln_tensor_sgd_update(p, g, p2, &kt_sgd_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: param and momentum_buf share memory; an update needs separate tensors for each");
  KT_FAILS(kiln_tensor_sgd_update(p, p2, m, &kt_sgd_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: param and grad share memory");
  KT_FAILS(kiln_tensor_sgd_update(p, g, g, &kt_sgd_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_sgd_update: grad and momentum_buf share memory");
  KT_FAILS(kiln_tensor_adam_update(p, g, m, m, 1, &kt_adam_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: m and v share memory; an update needs separate tensors for each");
  KT_FAILS(kiln_tensor_adam_update(p, g, p2, v, 1, &kt_adam_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: param and m share memory");
  KT_FAILS(kiln_tensor_adam_update(p, g, m, g, 1, &kt_adam_ok), KILN_INVALID_ARGUMENT,
           "kiln_tensor_adam_update: grad and v share memory");

  /* Hyperparameters. */
  KT_FAILS(kiln_tensor_accumulate(p, NAN, g), KILN_INVALID_ARGUMENT,
           "kiln_tensor_accumulate: alpha = nan; pass a number finite as a float");
  KT_FAILS(kiln_tensor_accumulate(p, -INFINITY, g), KILN_INVALID_ARGUMENT, "alpha = -inf; pass a number finite as a float");
  static const struct {
    kiln_sgd_params_t p;
    const char *needle;
  } sgd[] = {
      {{0, 0, 0, 0, false, false}, "kiln_tensor_sgd_update: lr = 0 is outside (0, inf)"},
      {{-0.1, 0, 0, 0, false, false}, "kiln_tensor_sgd_update: lr = -0.1 is outside (0, inf)"},
      {{NAN, 0, 0, 0, false, false}, "kiln_tensor_sgd_update: lr = nan is outside (0, inf)"},
      {{INFINITY, 0, 0, 0, false, false}, "kiln_tensor_sgd_update: lr = inf is outside (0, inf)"},
      {{0.1, -0.5, 0, 0, false, false}, "kiln_tensor_sgd_update: momentum = -0.5 is outside [0, inf)"},
      {{0.1, INFINITY, 0, 0, false, false}, "kiln_tensor_sgd_update: momentum = inf is outside [0, inf)"},
      {{0.1, 0.9, 1.5, 0, false, false}, "kiln_tensor_sgd_update: dampening = 1.5 is outside [0, 1]"},
      {{0.1, 0.9, -0.25, 0, false, false}, "kiln_tensor_sgd_update: dampening = -0.25 is outside [0, 1]"},
      {{0.1, 0.9, 0, -1, false, false}, "kiln_tensor_sgd_update: weight_decay = -1 is outside [0, inf)"},
      {{0.1, 0.9, 0, NAN, false, false}, "kiln_tensor_sgd_update: weight_decay = nan is outside [0, inf)"},
      {{0.1, 0, 0, 0, true, false},
       "kiln_tensor_sgd_update: nesterov needs momentum > 0 and dampening 0 (got momentum 0, dampening 0)"},
      {{0.1, 0.9, 0.5, 0, true, false},
       "kiln_tensor_sgd_update: nesterov needs momentum > 0 and dampening 0 (got momentum 0.9, dampening 0.5)"},
  };
  for (size_t i = 0; i < sizeof sgd / sizeof sgd[0]; i++) {
    kiln_clear_error();
    kiln_status_t st = kiln_tensor_sgd_update(p, g, m, &sgd[i].p);
    ck_assert_msg(st == KILN_INVALID_ARGUMENT && strstr(kiln_last_error(), sgd[i].needle),
                  "sgd case %zu -> %s: \"%s\" lacks \"%s\"", i, kiln_status_name(st), kiln_last_error(),
                  sgd[i].needle);
  }
  static const struct {
    kiln_adam_params_t p;
    int64_t step;
    const char *needle;
  } adam[] = {
      {{0, 0.9, 0.999, 1e-8, 0}, 1, "kiln_tensor_adam_update: lr = 0 is outside (0, inf)"},
      {{1e-3, 1, 0.999, 1e-8, 0}, 1, "kiln_tensor_adam_update: beta1 = 1 is outside [0, 1)"},
      {{1e-3, -0.1, 0.999, 1e-8, 0}, 1, "kiln_tensor_adam_update: beta1 = -0.1 is outside [0, 1)"},
      {{1e-3, 0.9, 1, 1e-8, 0}, 1, "kiln_tensor_adam_update: beta2 = 1 is outside [0, 1)"},
      {{1e-3, 0.9, NAN, 1e-8, 0}, 1, "kiln_tensor_adam_update: beta2 = nan is outside [0, 1)"},
      {{1e-3, 0.9, 0.999, 0, 0}, 1, "kiln_tensor_adam_update: eps = 0 is outside (0, inf)"},
      {{1e-3, 0.9, 0.999, -1e-8, 0}, 1, "kiln_tensor_adam_update: eps = -1e-08 is outside (0, inf)"},
      {{1e-3, 0.9, 0.999, 1e-8, -0.5}, 1, "kiln_tensor_adam_update: weight_decay = -0.5 is outside [0, inf)"},
      {{1e-3, 0.9, 0.999, 1e-8, INFINITY}, 1, "kiln_tensor_adam_update: weight_decay = inf is outside [0, inf)"},
      {{1e-3, 0.9, 0.999, 1e-8, 0}, 0, "kiln_tensor_adam_update: step = 0; count updates from 1"},
      {{1e-3, 0.9, 0.999, 1e-8, 0}, -7, "kiln_tensor_adam_update: step = -7; count updates from 1"},
  };
  for (size_t i = 0; i < sizeof adam / sizeof adam[0]; i++) {
    kiln_clear_error();
    kiln_status_t st = kiln_tensor_adam_update(p, g, m, v, adam[i].step, &adam[i].p);
    ck_assert_msg(st == KILN_INVALID_ARGUMENT && strstr(kiln_last_error(), adam[i].needle),
                  "adam case %zu -> %s: \"%s\" lacks \"%s\"", i, kiln_status_name(st), kiln_last_error(),
                  adam[i].needle);
  }
  /* Momentum 0 needs no buffer; a refused call changed nothing. */
  const kiln_sgd_params_t plain = {0.5, 0, 0, 0, false, false};
  KT_OK(kiln_tensor_sgd_update(sq2, sq3, NULL, &plain));
  float host[6];
  kiln_tensor_t *check[] = {p, g, m, v};
  for (size_t i = 0; i < 4; i++) {
    KT_OK(kiln_tensor_read(check[i], host, sizeof host));
    for (int k = 0; k < 6; k++)
      ck_assert_msg(host[k] == 1.0f, "operand %zu element %d is %g after refused updates", i, k, (double)host[k]);
  }
  float host9[9];
  KT_OK(kiln_tensor_read(sq2, host9, sizeof host9));
  ck_assert_msg(host9[0] == 0.5f, "sgd without momentum: 1 - 0.5 * 1 gave %g", (double)host9[0]);

  kiln_tensor_t *all[] = {p, g, m, v, sq, t, pt, flat, p2, sq2, sq3, sq4};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
  kiln_deinitialize();
}
END_TEST

/* ---- devices --------------------------------------------------------------------------- */

START_TEST(test_unknown_devices) {
  kt_env_reset();
  kiln_device_t *d = NULL;
  KT_FAILS3(kiln_device_find("cpu:7", &d), KILN_NOT_FOUND, "cpu:7", "cpu:0", "");
  KT_FAILS(kiln_device_find("bogus:0", &d), KILN_NOT_FOUND, "bogus:0");
  KT_FAILS(kiln_device_find("gpu", &d), KILN_NOT_FOUND, "gpu");
  static const struct { const char *selector, *needle; } malformed[] = {
      {"cpu:", "Incomplete selector 'cpu:': try 'cpu:*'"},
      {"cpu:0:1", "too many colons in 'cpu:0:1'"},
      {":0", "no backend before ':' in ':0'; try '*:0'"},
      {"cpu:gpux", "unknown device 'gpux' in 'cpu:gpux'"},
      {"CPU:0", "'CPU' in 'CPU:0' is not a backend name"},
      {"cpu:0,", "empty device in 'cpu:0,'"},
      {"", "empty"},
      {"cpu:99999999999999999999", "too large"},
  };
  for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
    kiln_clear_error();
    kiln_status_t s = kiln_device_find(malformed[i].selector, &d);
    ck_assert_msg(s == KILN_INVALID_ARGUMENT, "find(\"%s\") -> %s: %s", malformed[i].selector,
                  kiln_status_name(s), kiln_last_error());
    ck_assert_msg(strstr(kiln_last_error(), malformed[i].needle) != NULL, "find(\"%s\"): \"%s\" lacks \"%s\"",
                  malformed[i].selector, kiln_last_error(), malformed[i].needle);
  }
  ck_assert_ptr_null(d);
  kiln_deinitialize();
}
END_TEST

START_TEST(test_device_mismatch) {
  kt_env_reset();
  setenv("KILN_CPU_DEVICES", "2", 1);
  kiln_device_t *d0 = NULL, *d1 = NULL;
  KT_OK(kiln_device_find("cpu:0", &d0));
  KT_OK(kiln_device_find("cpu:1", &d1));
  const int64_t s[1] = {4};
  kiln_tensor_t *a = NULL, *b = NULL, *out = NULL;
  KT_OK(kiln_tensor_ones(d0, KILN_F32, 1, s, &a));
  KT_OK(kiln_tensor_ones(d1, KILN_F32, 1, s, &b));
  KT_FAILS3(kiln_tensor_add(a, b, &out), KILN_DEVICE_MISMATCH, "cpu:0", "cpu:1", "kiln_tensor_to");
  KT_FAILS(kiln_tensor_matmul(a, b, false, false, &out), KILN_DEVICE_MISMATCH, "kiln_tensor_to");
  kiln_queue_t *q1 = kiln_device_default_queue(d1);
  KT_FAILS3(kiln_device_set_current_queue(d0, q1), KILN_DEVICE_MISMATCH, "cpu:1", "cpu:0", "kiln_queue_create");
  ck_assert_ptr_null(out);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_deinitialize();
  unsetenv("KILN_CPU_DEVICES");
}
END_TEST

/* ---- the environment ---------------------------------------------------------------------
 * Each malformed value: kiln refuses to start with the code, the message
 * quotes the value and says what is accepted, and every later call repeats
 * it until kiln_deinitialize. */
typedef struct kt_env_case_t {
  const char *var, *value;
  kiln_status_t code;
  const char *needle1, *needle2;
} kt_env_case_t;

static const kt_env_case_t kt_env_cases[] = {
    {"KILN_BACKEND", "cpu,cpu", KILN_INVALID_ARGUMENT, "KILN_BACKEND=\"cpu,cpu\" names \"cpu\" twice", "[a-z0-9_]+"},
    {"KILN_BACKEND", "cpu,", KILN_INVALID_ARGUMENT, "KILN_BACKEND=\"cpu,\" has an empty backend name", "[a-z0-9_]+"},
    {"KILN_BACKEND", "CPU", KILN_INVALID_ARGUMENT, "\"CPU\" is not a backend name", "[a-z0-9_]+"},
    {"KILN_BACKEND", "a,b,c,d,e,f,g,h,i", KILN_INVALID_ARGUMENT, "names more than 8 backends", "[a-z0-9_]+"},
    {"KILN_BACKEND", "nosuch", KILN_UNAVAILABLE, "backend 'nosuch' named in KILN_BACKEND cannot be used",
     "libkiln-nosuch.so not found"},
    {"KILN_DEVICE", "cpu", KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"cpu\" is not a device selector",
     "Incomplete selector 'cpu': try 'cpu:*'"},
    {"KILN_DEVICE", "cpu:0:1", KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"cpu:0:1\"", "too many colons"},
    {"KILN_DEVICE", "cpu:gpux", KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"cpu:gpux\"", "use *, cpu, gpu, accelerator"},
    {"KILN_DEVICE", ":0", KILN_INVALID_ARGUMENT, "KILN_DEVICE=\":0\"", "try '*:0'"},
    {"KILN_DEVICE", "cpu:0;;cpu:0", KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"cpu:0;;cpu:0\"", "empty term"},
    {"KILN_DEVICE", "Cpu:0", KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"Cpu:0\"", "is not a backend name"},
    {"KILN_POLICY", "fast", KILN_INVALID_ARGUMENT, "KILN_POLICY=\"fast\" is not a policy",
     "use one of: vendor, portable, fastest"},
    {"KILN_POLICY", "Vendor", KILN_INVALID_ARGUMENT, "KILN_POLICY=\"Vendor\"", "vendor, portable, fastest"},
    {"KILN_PROVIDER", "matmul", KILN_INVALID_ARGUMENT, "KILN_PROVIDER=\"matmul\"", "has no '='"},
    {"KILN_PROVIDER", "gemm=blas", KILN_INVALID_ARGUMENT, "unknown op \"gemm\" in \"gemm=blas\"", "ops: "},
    {"KILN_PROVIDER", "matmul=fast", KILN_INVALID_ARGUMENT, "unknown provider \"fast\" in \"matmul=fast\"",
     "native, blas, clblast, cublas, cudnn"},
    {"KILN_PROVIDER", "matmul=blas,", KILN_INVALID_ARGUMENT, "empty item in \"matmul=blas,\"", "KILN_PROVIDER"},
    {"KILN_PROVIDER", "add=native,mul=blas", KILN_INVALID_ARGUMENT, "\"add\" and \"mul\" both set the provider",
     "give it once"},
    {"KILN_CPU_DEVICES", "0", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"0\" is not a device count",
     "an integer from 1 to 64"},
    {"KILN_CPU_DEVICES", "two", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"two\"", "from 1 to 64"},
    {"KILN_CPU_DEVICES", "2x", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"2x\"", "from 1 to 64"},
    {"KILN_CPU_DEVICES", "-2", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"-2\"", "from 1 to 64"},
    {"KILN_CPU_DEVICES", " 2", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\" 2\"", "from 1 to 64"},
    {"KILN_CPU_DEVICES", "65", KILN_INVALID_ARGUMENT, "KILN_CPU_DEVICES=\"65\"", "from 1 to 64"},
    {"KILN_CPU_DEVICES", "99999999999999999999", KILN_INVALID_ARGUMENT, "\"99999999999999999999\"", "from 1 to 64"},
    {"KILN_LOG", "verbose", KILN_INVALID_ARGUMENT, "KILN_LOG=\"verbose\" is not a log level",
     "use one of: off, error, warn, info, debug"},
    {"KILN_LOG", "loud", KILN_INVALID_ARGUMENT, "KILN_LOG=\"loud\"", "off, error, warn, info, debug"},
    /* A term must name a backend kiln knows, and a hint never leads to one
     * that selects nothing. */
    {"KILN_DEVICE", "bogus", KILN_INVALID_ARGUMENT, "'bogus' is neither a backend nor a device type",
     "cuda, opencl, cpu"},
    {"KILN_DEVICE", "bogus:*", KILN_INVALID_ARGUMENT, "unknown backend 'bogus' in 'bogus:*'", "cuda, opencl, cpu"},
    {"KILN_DEVICE", "gpu", KILN_INVALID_ARGUMENT, "KILN_DEVICE=\"gpu\"", "try '*:gpu'"},
    /* A selector that leaves no device visible is an error too. */
    {"KILN_DEVICE", "cpu:5", KILN_NOT_FOUND, "KILN_DEVICE=\"cpu:5\" leaves no device visible", "cpu:0"},
};

START_TEST(test_malformed_environment) {
  const kt_env_case_t *c = &kt_env_cases[_i];
  kt_env_reset();
  setenv(c->var, c->value, 1);
  for (int attempt = 0; attempt < 2; attempt++) {
    /* The first call starts kiln; the second sees the remembered failure. */
    kiln_clear_error();
    size_t count = 99;
    kiln_status_t s = attempt == 0 ? kiln_ensure_initialized() : kiln_device_count(&count);
    ck_assert_msg(s == c->code, "%s=\"%s\" (call %d) -> %s, expected %s: %s", c->var, c->value, attempt,
                  kiln_status_name(s), kiln_status_name(c->code), kiln_last_error());
    ck_assert_msg(strstr(kiln_last_error(), c->needle1) && strstr(kiln_last_error(), c->needle2),
                  "%s=\"%s\": message \"%s\" lacks \"%s\" or \"%s\"", c->var, c->value, kiln_last_error(),
                  c->needle1, c->needle2);
    ck_assert_msg(strstr(kiln_last_error(), "kiln could not start: ") != NULL, "%s", kiln_last_error());
    ck_assert_uint_eq(count, 99);
  }
  ck_assert_ptr_null(kiln_try_gpu(0));
  /* Fixing the value and deinitialising lets kiln start. */
  kiln_deinitialize();
  unsetenv(c->var);
  KT_OK(kiln_ensure_initialized());
  kiln_deinitialize();
}
END_TEST

/* The same values through kiln_config_t: the message names the field, and a
 * failed kiln_initialize leaves kiln stopped so the caller can try again. */
START_TEST(test_malformed_config) {
  kt_env_reset();
  kiln_config_t config;
  kiln_config_initialize(&config);
  config.policy = "fast";
  KT_FAILS3(kiln_initialize(&config), KILN_INVALID_ARGUMENT, "kiln_config_t.policy=\"fast\"", "is not a policy",
            "vendor, portable, fastest");
  kiln_config_initialize(&config);
  config.device = "opencl";
  KT_FAILS(kiln_initialize(&config), KILN_INVALID_ARGUMENT, "kiln_config_t.device=\"opencl\"");
  kiln_config_initialize(&config);
  config.provider = "matmul=fast";
  KT_FAILS(kiln_initialize(&config), KILN_INVALID_ARGUMENT, "kiln_config_t.provider=\"matmul=fast\"");
  kiln_config_initialize(&config);
  config.log = "loud";
  KT_FAILS(kiln_initialize(&config), KILN_INVALID_ARGUMENT, "kiln_config_t.log=\"loud\"");
  kiln_config_initialize(&config);
  config.backend = "cpu,,cpu";
  KT_FAILS(kiln_initialize(&config), KILN_INVALID_ARGUMENT, "kiln_config_t.backend=\"cpu,,cpu\"");
  kiln_config_initialize(&config);
  config.cpu_devices = 0;
  KT_FAILS3(kiln_initialize(&config), KILN_INVALID_ARGUMENT, "kiln_config_t.cpu_devices=0", "1 to 64", "-1");
  config.cpu_devices = 65;
  KT_FAILS(kiln_initialize(&config), KILN_INVALID_ARGUMENT, "kiln_config_t.cpu_devices=65");
  /* A field wins over a malformed variable; an empty variable is unset. */
  setenv("KILN_POLICY", "fast", 1);
  setenv("KILN_LOG", "", 1);
  kiln_config_initialize(&config);
  config.policy = "portable";
  KT_OK(kiln_initialize(&config));
  ck_assert_int_eq(kiln_policy(), KILN_POLICY_PORTABLE);
  kiln_deinitialize();
  unsetenv("KILN_POLICY");
  unsetenv("KILN_LOG");
}
END_TEST

/* KILN_BACKEND_PATH is a list of folders: missing ones are named among the
 * paths tried, and a file there that is not a plugin is refused with the
 * loader's reason. */
START_TEST(test_backend_path) {
  kt_env_reset();
  setenv("KILN_BACKEND_PATH", "/nonexistent/one::/nonexistent/two", 1);
  setenv("KILN_BACKEND", "nosuch,cpu", 1);
  KT_FAILS3(kiln_ensure_initialized(), KILN_UNAVAILABLE, "/nonexistent/one/libkiln-nosuch.so",
            "/nonexistent/two/libkiln-nosuch.so", "set KILN_BACKEND_PATH to the folder that holds it");
  kiln_deinitialize();

  char dir[4200], path[4300];
  snprintf(dir, sizeof dir, "%s/plugins", getenv("KILN_CACHE_DIR"));
  mkdir(getenv("KILN_CACHE_DIR"), 0700);
  mkdir(dir, 0700);
  /* Not a shared object at all. */
  snprintf(path, sizeof path, "%s/libkiln-junk.so", dir);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  for (int i = 0; i < 64; i++) fputs("not an ELF file\n", f);
  fclose(f);
  setenv("KILN_BACKEND_PATH", dir, 1);
  setenv("KILN_BACKEND", "junk,cpu", 1);
  KT_FAILS3(kiln_ensure_initialized(), KILN_UNAVAILABLE, "backend 'junk' named in KILN_BACKEND cannot be used",
            "libkiln-junk.so: ", "ELF header");
  kiln_deinitialize();
  /* A shared object without the entry point. */
  snprintf(path, sizeof path, "%s/libkiln-notplugin.so", dir);
  const char *libm = access("/lib/x86_64-linux-gnu/libm.so.6", F_OK) == 0 ? "/lib/x86_64-linux-gnu/libm.so.6"
                                                                              : "/usr/lib/libm.so.6";
  if (symlink(libm, path) == 0) {
    setenv("KILN_BACKEND", "notplugin,cpu", 1);
    KT_FAILS3(kiln_ensure_initialized(), KILN_ABI_MISMATCH, "does not export kiln_backend_entry()",
              "not a kiln backend plugin", "libkiln-notplugin.so");
    kiln_deinitialize();
  }
  /* Unset (the default list), the same folder is no error. */
  unsetenv("KILN_BACKEND");
  KT_OK(kiln_ensure_initialized());
  kiln_deinitialize();
}
END_TEST

/* KILN_CACHE_DIR has no malformed value: a folder that cannot be made runs
 * uncached, counted, never an error. */
START_TEST(test_cache_dir) {
  kt_env_reset();
  char file[4200], below[4300];
  mkdir(getenv("KILN_CACHE_DIR"), 0700);
  snprintf(file, sizeof file, "%s/plainfile", getenv("KILN_CACHE_DIR"));
  FILE *f = fopen(file, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  snprintf(below, sizeof below, "%s/cache", file);
  char saved[4200];
  snprintf(saved, sizeof saved, "%s", getenv("KILN_CACHE_DIR"));
  setenv("KILN_CACHE_DIR", below, 1);
  setenv("KILN_POLICY", "fastest", 1);
  KT_OK(kiln_ensure_initialized());
  ck_assert_str_eq(kiln_cache_dir(), below);
  /* fastest stores its measurement: the store fails quietly. */
  const int64_t s[2] = {4, 4};
  kiln_tensor_t *a = kt_tensor(KILN_F32, 2, s), *out = NULL;
  KT_OK(kiln_tensor_matmul(a, a, false, false, &out));
  float host[16];
  KT_OK(kiln_tensor_read(out, host, sizeof host));
  ck_assert(host[0] == 4.0f);
  kiln_cache_stats_t stats;
  KT_OK(kiln_cache_stats(&stats));
  ck_assert_uint_eq(stats.stores, 0);
  kiln_tensor_release(a);
  kiln_tensor_release(out);
  kiln_deinitialize();
  setenv("KILN_CACHE_DIR", saved, 1);
  unsetenv("KILN_POLICY");
}
END_TEST

static Suite *kt_bad_input_suite(void) {
  Suite *s = suite_create("bad_input");
  TCase *nulls = tcase_create("NULL handles");
  tcase_add_test(nulls, test_null_device_calls);
  tcase_add_test(nulls, test_null_queue_calls);
  tcase_add_test(nulls, test_null_buffer_calls);
  tcase_add_test(nulls, test_null_tensor_calls);
  tcase_add_test(nulls, test_null_runtime_calls);
  suite_add_tcase(s, nulls);
  TCase *values = tcase_create("sizes, shapes, dtypes, devices");
  tcase_add_test(values, test_sizes);
  tcase_add_test(values, test_shape_mismatch);
  tcase_add_test(values, test_dtype_mismatch);
  tcase_add_test(values, test_unknown_devices);
  tcase_add_test(values, test_device_mismatch);
  tcase_add_test(values, test_zero_batch_matmul);
  tcase_add_test(values, test_huge_empty_extents);
  tcase_add_test(values, test_cast_arguments);
  tcase_add_test(values, test_log_off_applies);
  tcase_add_test(values, test_log_level_any_case);
  suite_add_tcase(s, values);
  TCase *training = tcase_create("training");
  tcase_add_test(training, test_training_nulls);
  tcase_add_test(training, test_training_dtypes);
  tcase_add_test(training, test_training_shapes);
  tcase_add_test(training, test_training_devices);
  tcase_add_test(training, test_training_updates);
  tcase_add_test(training, test_training_float_range_and_first_step);
  suite_add_tcase(s, training);
  TCase *env = tcase_create("environment");
  tcase_add_loop_test(env, test_malformed_environment, 0, (int)(sizeof kt_env_cases / sizeof kt_env_cases[0]));
  tcase_add_test(env, test_malformed_config);
  tcase_add_test(env, test_backend_path);
  tcase_add_test(env, test_cache_dir);
  suite_add_tcase(s, env);
  return s;
}

int main(void) {
  kt_private_cache_dir();
  const char *path = getenv("KILN_BACKEND_PATH");
  if (path) snprintf(kt_backend_path, sizeof kt_backend_path, "%s", path);
  /* Check runs each test in a forked child: kiln starts there, never here. */
  return kt_run_suite(kt_bad_input_suite());
}
