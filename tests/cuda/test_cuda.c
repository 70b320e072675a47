/* tests/cuda/test_cuda.c: the CUDA backend on a real GPU: buffers, copies, transfers from pageable memory, events, provider choice, TF32 off by default, CAST, every dtype's casts, fills, ranges, elementwise ops, comparisons, where, reductions, random and matmul against cpu:0, long reductions and tall matmuls; skipped (77) without one. */
#include <math.h>
#include <stdint.h>

#include "../common.h"

static kiln_device_t *gpu;       /* cuda:0 */
static kiln_device_t *gpu2;      /* cuda:1 when there is one */
static kiln_device_t *cpu;       /* cpu:0 */

static const char *property(kiln_device_t *device, const char *key) {
  for (size_t i = 0; i < kiln_device_property_count(device); i++) {
    const char *k, *v;
    if (kiln_device_property(device, i, &k, &v) == KILN_OK && !strcmp(k, key)) return v;
  }
  return NULL;
}

static bool has_provider(kiln_device_t *device, const char *op, const char *provider) {
  const char *list = kiln_device_providers(device, op);
  return list && strstr(list, provider) != NULL;
}

START_TEST(test_describes_the_device) {
  kiln_device_info_t info;
  KT_OK(kiln_device_info(gpu, &info));
  ck_assert_str_eq(info.backend, "cuda");
  ck_assert_int_eq(info.type, KILN_DEVICE_GPU);
  ck_assert_msg(!strncmp(info.uuid, "GPU-", 4) && strlen(info.uuid) == 40, "uuid '%s'", info.uuid);
  /* domain:bus:device.function, in lower case ("0000:3b:00.0"). */
  ck_assert_msg(strchr(info.pci_bus_id, ':') && strchr(info.pci_bus_id, '.') && !strpbrk(info.pci_bus_id, "ABCDEF"),
                "pci bus id '%s'", info.pci_bus_id);
  ck_assert_msg(strchr(info.compute_capability, '.') != NULL, "compute capability '%s'", info.compute_capability);
  ck_assert_uint_gt(info.memory_bytes, 0);
  ck_assert_uint_gt(info.compute_units, 0);
  ck_assert_uint_le(info.memory_free_bytes, info.memory_bytes);
  ck_assert_msg(!info.memory_free_is_estimate, "free memory comes from cuMemGetInfo, not an estimate");
  /* The fatbin covers this GPU with SASS of its major version and a minor
   * no higher than its own, or the device carries a warning saying it does
   * not (PTX JIT, or no code at all). */
  const char *archs = property(gpu, "compiled_architectures");
  ck_assert_msg(archs && !strncmp(archs, "sm_", 3) && strstr(archs, "PTX"), "compiled_architectures '%s'",
                archs ? archs : "(missing)");
  int major = 0, minor = 0;
  ck_assert_msg(sscanf(info.compute_capability, "%d.%d", &major, &minor) == 2, "compute capability '%s'",
                info.compute_capability);
  bool sass = false;
  for (const char *at = strstr(archs, "sm_"); at; at = strstr(at + 3, "sm_")) {
    const int arch = atoi(at + 3);
    if (arch / 10 == major && arch % 10 <= minor) sass = true;
  }
  const char *warning = property(gpu, "warning");
  ck_assert_msg(sass != (warning != NULL), "compute capability %s, compiled_architectures '%s', warning '%s'",
                info.compute_capability, archs, warning ? warning : "(none)");
  const char *pool = property(gpu, "memory_pool");
  ck_assert_msg(pool && (strstr(pool, "cuMemPoolCreate") || strstr(pool, "cuMemAlloc")), "memory_pool '%s'",
                pool ? pool : "(missing)");
  const char *providers = kiln_device_providers(gpu, "matmul");
  ck_assert_msg(providers && !strncmp(providers, "native", 6), "matmul providers '%s'", providers ? providers : "");
}
END_TEST

START_TEST(test_buffer_round_trip) {
  enum { N = 1 << 20 };
  uint32_t *data = malloc(N * sizeof *data), *back = malloc(N * sizeof *back);
  ck_assert_ptr_nonnull(data);
  ck_assert_ptr_nonnull(back);
  for (uint32_t i = 0; i < N; i++) data[i] = i * 2654435761u;
  kiln_buffer_t *buffer;
  KT_OK(kiln_buffer_create(gpu, N * sizeof *data, &buffer));
  kiln_queue_t *queue = kiln_device_default_queue(gpu);
  KT_OK(kiln_buffer_write(queue, buffer, 0, data, N * sizeof *data, true, 0, NULL, NULL));
  memset(back, 0, N * sizeof *back);
  KT_OK(kiln_buffer_read(queue, buffer, 0, back, N * sizeof *back, true, 0, NULL, NULL));
  ck_assert_int_eq(memcmp(data, back, N * sizeof *data), 0);

  /* A 4-byte fill at an offset, then an unaligned 1-byte fill. */
  const uint32_t pattern = 0xdeadbeefu;
  KT_OK(kiln_buffer_fill(queue, buffer, 64, 4096, &pattern, 4, 0, NULL, NULL));
  const uint8_t byte = 0x5a;
  KT_OK(kiln_buffer_fill(queue, buffer, 8193, 7, &byte, 1, 0, NULL, NULL));
  KT_OK(kiln_buffer_read(queue, buffer, 0, back, N * sizeof *back, true, 0, NULL, NULL));
  for (uint32_t i = 0; i < 16; i++) ck_assert_uint_eq(back[i], data[i]);
  for (uint32_t i = 16; i < 16 + 1024; i++) ck_assert_uint_eq(back[i], pattern);
  ck_assert_uint_eq(back[16 + 1024], data[16 + 1024]);
  const uint8_t *bytes = (const uint8_t *)back;
  for (size_t i = 8193; i < 8200; i++) ck_assert_uint_eq(bytes[i], byte);
  ck_assert_uint_eq(bytes[8192], ((const uint8_t *)data)[8192]);

  /* Asynchronous read, completed by the queue finish. */
  memset(back, 0, N * sizeof *back);
  KT_OK(kiln_buffer_read(queue, buffer, 0, back, 256, false, 0, NULL, NULL));
  KT_OK(kiln_queue_finish(queue));
  ck_assert_uint_eq(back[0], data[0]);
  kiln_buffer_release(buffer);

  kiln_buffer_t *empty;
  KT_OK(kiln_buffer_create(gpu, 0, &empty));
  ck_assert_uint_eq(kiln_buffer_size(empty), 0);
  kiln_buffer_release(empty);
  free(data);
  free(back);
}
END_TEST

/* Non-blocking transfers from and to pageable memory (malloc) go through
 * pinned staging: the bytes arrive all the same, in queue order, covered by
 * the queue's finish and by events recorded after them. */
START_TEST(test_pageable_transfers_are_staged) {
  enum { N = 3 << 18 }; /* 3 MiB of words: above the smallest staging class */
  uint32_t *data = malloc(N * sizeof *data), *back = malloc(N * sizeof *back);
  ck_assert_ptr_nonnull(data);
  ck_assert_ptr_nonnull(back);
  for (uint32_t i = 0; i < N; i++) data[i] = i * 2246822519u + 7u;
  kiln_buffer_t *buffer;
  KT_OK(kiln_buffer_create(gpu, N * sizeof *data, &buffer));
  kiln_queue_t *queue;
  KT_OK(kiln_queue_create(gpu, &queue));
  KT_OK(kiln_buffer_write(queue, buffer, 0, data, N * sizeof *data, false, 0, NULL, NULL));
  /* Overwrite part of it again, in order, from another pageable block. */
  uint32_t patch[100];
  for (int i = 0; i < 100; i++) patch[i] = 0xabc00000u + (uint32_t)i;
  KT_OK(kiln_buffer_write(queue, buffer, 4000, patch, sizeof patch, false, 0, NULL, NULL));
  memset(back, 0, N * sizeof *back);
  kiln_event_t *read_done;
  KT_OK(kiln_buffer_read(queue, buffer, 0, back, N * sizeof *back, false, 0, NULL, &read_done));
  KT_OK(kiln_event_wait(read_done));
  kiln_event_release(read_done);
  for (uint32_t i = 0; i < N; i++) {
    const uint32_t want = i >= 1000 && i < 1100 ? patch[i - 1000] : data[i];
    ck_assert_msg(back[i] == want, "word %u: %#x, expected %#x", i, back[i], want);
  }
  /* Many small ones in a row reuse the staging blocks. */
  for (int round = 0; round < 64; round++) {
    uint32_t word = (uint32_t)round * 3u, got = 0;
    KT_OK(kiln_buffer_write(queue, buffer, 4 * (size_t)round, &word, 4, false, 0, NULL, NULL));
    KT_OK(kiln_buffer_read(queue, buffer, 4 * (size_t)round, &got, 4, false, 0, NULL, NULL));
    KT_OK(kiln_queue_finish(queue));
    ck_assert_uint_eq(got, word);
  }
  kiln_queue_release(queue);
  kiln_buffer_release(buffer);
  free(data);
  free(back);
}
END_TEST

START_TEST(test_copies_between_devices) {
  enum { N = 300000 };
  float *data = malloc(N * sizeof *data), *back = malloc(N * sizeof *back);
  for (int i = 0; i < N; i++) data[i] = (float)i * 0.25f - 1000.0f;
  kiln_buffer_t *a, *b, *host_side;
  KT_OK(kiln_buffer_create(gpu, N * sizeof(float), &a));
  KT_OK(kiln_buffer_create(gpu, N * sizeof(float), &b));
  KT_OK(kiln_buffer_create(cpu, N * sizeof(float), &host_side));
  kiln_queue_t *q = kiln_device_default_queue(gpu);
  KT_OK(kiln_buffer_write(q, a, 0, data, N * sizeof(float), true, 0, NULL, NULL));
  /* Device to device on one GPU, at offsets. */
  KT_OK(kiln_buffer_copy(q, a, 4, b, 0, (N - 1) * sizeof(float), 0, NULL, NULL));
  KT_OK(kiln_buffer_read(q, b, 0, back, (N - 1) * sizeof(float), true, 0, NULL, NULL));
  ck_assert_int_eq(memcmp(back, data + 1, (N - 1) * sizeof(float)), 0);
  /* GPU -> CPU backend -> GPU, through host staging. */
  KT_OK(kiln_buffer_copy(kiln_device_default_queue(cpu), a, 0, host_side, 0, N * sizeof(float), 0, NULL, NULL));
  KT_OK(kiln_buffer_copy(q, host_side, 0, b, 0, N * sizeof(float), 0, NULL, NULL));
  memset(back, 0, N * sizeof *back);
  KT_OK(kiln_buffer_read(q, b, 0, back, N * sizeof(float), true, 0, NULL, NULL));
  ck_assert_int_eq(memcmp(back, data, N * sizeof(float)), 0);
  if (gpu2) {
    /* Direct access comes from the pools (cuMemPoolSetAccess): devinfo lists
     * a peer only where it was granted. */
    const char *peers = property(gpu2, "peer_access");
    ck_assert_msg(peers && (!strcmp(peers, "none") || strstr(peers, "cuda:")), "peer_access '%s'",
                  peers ? peers : "(missing)");
    /* Peer copy (direct or staged by the driver), ordered on the destination. */
    kiln_buffer_t *c;
    KT_OK(kiln_buffer_create(gpu2, N * sizeof(float), &c));
    kiln_queue_t *q2 = kiln_device_default_queue(gpu2);
    KT_OK(kiln_buffer_copy(q2, a, 0, c, 0, N * sizeof(float), 0, NULL, NULL));
    memset(back, 0, N * sizeof *back);
    KT_OK(kiln_buffer_read(q2, c, 0, back, N * sizeof(float), true, 0, NULL, NULL));
    ck_assert_int_eq(memcmp(back, data, N * sizeof(float)), 0);
    kiln_buffer_release(c);
  }
  kiln_buffer_release(a);
  kiln_buffer_release(b);
  kiln_buffer_release(host_side);
  free(data);
  free(back);
}
END_TEST

START_TEST(test_events_time_work) {
  kiln_queue_t *queue;
  KT_OK(kiln_queue_create(gpu, &queue));
  kiln_buffer_t *buffer;
  const size_t size = (size_t)256 << 20;
  KT_OK(kiln_buffer_create(gpu, size, &buffer));
  kiln_event_t *start, *end;
  KT_OK(kiln_queue_record(queue, &start));
  const uint32_t pattern = 7;
  for (int i = 0; i < 8; i++) KT_OK(kiln_buffer_fill(queue, buffer, 0, size, &pattern, 4, 0, NULL, NULL));
  KT_OK(kiln_queue_record(queue, &end));
  KT_OK(kiln_event_wait(end));
  KT_OK(kiln_event_query(end));
  KT_OK(kiln_event_query(start));
  double ms = -1.0;
  KT_OK(kiln_event_elapsed(start, end, &ms));
  /* Two gigabytes written take time on any GPU; no upper bound asserted. */
  ck_assert_msg(ms > 0.0, "elapsed %f ms", ms);
  /* Events are reused once released: a new one waits and times as well. */
  for (int round = 0; round < 3; round++) {
    kiln_event_t *a, *b;
    KT_OK(kiln_queue_record(queue, &a));
    KT_OK(kiln_buffer_fill(queue, buffer, 0, size / 8, &pattern, 4, 0, NULL, NULL));
    KT_OK(kiln_queue_record(queue, &b));
    KT_OK(kiln_event_wait(b));
    KT_OK(kiln_event_query(a));
    double again = -1.0;
    KT_OK(kiln_event_elapsed(a, b, &again));
    ck_assert_msg(again >= 0.0, "elapsed %f ms", again);
    kiln_event_release(a);
    kiln_event_release(b);
  }

  /* A second queue ordered after the first through an event. */
  kiln_queue_t *other;
  KT_OK(kiln_queue_create(gpu, &other));
  KT_OK(kiln_queue_wait(other, end));
  uint32_t word = 0;
  KT_OK(kiln_buffer_read(other, buffer, size - 4, &word, 4, true, 0, NULL, NULL));
  ck_assert_uint_eq(word, pattern);
  kiln_event_release(start);
  kiln_event_release(end);
  KT_OK(kiln_queue_finish(queue));
  kiln_buffer_release(buffer);
  kiln_queue_release(other);
  kiln_queue_release(queue);
}
END_TEST

/* How far a vendor provider's result may be from the native one's, per
 * dtype, relative to 1 + |native| (written once, for the cuBLAS and the
 * cuDNN rows):
 * - gemm: the matmul test's inputs are multiples of 1/128 with sums far
 *   below 2^11, so every product and partial sum is exact in f32 and f64
 *   whatever the order, and f16 and bf16 round the one exact f32 sum once
 *   (cuBLAS is told to keep a split-k's partial sums in f32). So f32 is
 *   held exact, as before the dtypes; f64 to the 1e-12 relative of the
 *   suite's other f64 checks (DGEMM's order is cuBLAS's choice); f16 and
 *   bf16 to one unit of the dtype at 1.0 (2^-10 ~ 9.8e-4, 2^-7 ~ 7.8e-3),
 *   in case a tensor-core kernel rounds the sum to the neighbouring value;
 * - conv: cuDNN may convolve by Winograd or FFT, whose transforms round in
 *   the compute type (double for f64, float for the rest): 1e-12 in f64,
 *   1e-4 in f32 (as before the dtypes), and for f16 and bf16 their unit at
 *   1.0 (the f32 transform's error is far below it, the one rounding to
 *   the dtype dominates). */
static const struct vendor_tolerance_t {
  kiln_dtype_t dtype;
  double gemm, conv;
} vendor_tolerances[] = {
    {KILN_F64, 1e-12, 1e-12},
    {KILN_F32, 0.0, 1e-4},
    {KILN_F16, 1e-3, 1e-3},
    {KILN_BF16, 8e-3, 8e-3},
};
#define VENDOR_DTYPES (sizeof vendor_tolerances / sizeof vendor_tolerances[0])

/* A GPU tensor of dtype d from f32 values (exact in d: the tests' values
 * are small multiples of powers of two). */
static kiln_tensor_t *from_f32(kiln_dtype_t d, int ndim, const int64_t *shape, const float *values) {
  kiln_tensor_t *t32, *t;
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, ndim, shape, values, &t32));
  if (d == KILN_F32) return t32;
  KT_OK(kiln_tensor_cast(t32, d, &t));
  kiln_tensor_release(t32);
  return t;
}

/* A GPU tensor's values as doubles (exact from every float dtype); the
 * caller frees them. */
static double *to_f64(kiln_tensor_t *t) {
  kiln_tensor_t *t64;
  KT_OK(kiln_tensor_cast(t, KILN_F64, &t64));
  const size_t count = (size_t)kiln_tensor_numel(t64);
  double *values = malloc(count * sizeof *values);
  KT_OK(kiln_tensor_read(t64, values, count * sizeof *values));
  kiln_tensor_release(t64);
  return values;
}

/* Run a matmul in dtype d with one provider forced; the provider that ran
 * must be it. */
static double *matmul_with(const char *provider, kiln_dtype_t d, int64_t m, int64_t n, int64_t k, const float *a,
                           const float *b, bool trans_a, bool trans_b) {
  char overrides[64];
  snprintf(overrides, sizeof overrides, "matmul=%s", provider);
  KT_OK(kiln_set_providers(overrides));
  const int64_t sa[2] = {trans_a ? k : m, trans_a ? m : k}, sb[2] = {trans_b ? n : k, trans_b ? k : n};
  kiln_tensor_t *ta = from_f32(d, 2, sa, a), *tb = from_f32(d, 2, sb, b), *tc;
  KT_OK(kiln_tensor_matmul(ta, tb, trans_a, trans_b, &tc));
  ck_assert_msg(!strcmp(kiln_last_provider(), provider), "matmul in %s ran on '%s', not '%s'", kiln_dtype_name(d),
                kiln_last_provider(), provider);
  ck_assert_int_eq(kiln_tensor_dtype(tc), d);
  double *c = to_f64(tc);
  kiln_tensor_release(ta);
  kiln_tensor_release(tb);
  kiln_tensor_release(tc);
  KT_OK(kiln_set_providers(""));
  return c;
}

/* A failed assertion leaves a test through a long jump (CK_NOFORK), past the
 * kiln_set_providers("") at the end of matmul_with and conv_with: the
 * overrides are cleared here, after every test, failed or not. */
static void providers_reset(void) { (void)kiln_set_providers(""); }

START_TEST(test_cublas_and_native_matmul_agree) {
  if (!has_provider(gpu, "matmul", "cublas")) {
    printf("cublas absent (%s): native only\n", property(gpu, "cublas") ? property(gpu, "cublas") : "?");
    return;
  }
  /* Awkward sizes: not multiples of the 128 tile, every transposition, in
   * every dtype the cublas row serves (Sgemm, Dgemm, GemmEx). */
  const int64_t m = 131, n = 257, k = 67;
  float *a = malloc((size_t)(m * k) * sizeof *a), *b = malloc((size_t)(k * n) * sizeof *b);
  for (int64_t i = 0; i < m * k; i++) a[i] = (float)((i * 37) % 19) / 8.0f - 1.0f;
  for (int64_t i = 0; i < k * n; i++) b[i] = (float)((i * 11) % 23) / 16.0f - 0.5f;
  for (size_t di = 0; di < VENDOR_DTYPES; di++) {
    const kiln_dtype_t d = vendor_tolerances[di].dtype;
    for (int t = 0; t < 4; t++) {
      double *c1 = matmul_with("native", d, m, n, k, a, b, t & 1, t & 2);
      double *c2 = matmul_with("cublas", d, m, n, k, a, b, t & 1, t & 2);
      for (int64_t i = 0; i < m * n; i++)
        ck_assert_msg(fabs(c1[i] - c2[i]) <= vendor_tolerances[di].gemm * (1.0 + fabs(c1[i])),
                      "%s t=%d [%lld] %.17g vs %.17g", kiln_dtype_name(d), t, (long long)i, c1[i], c2[i]);
      free(c1);
      free(c2);
    }
  }
  free(a);
  free(b);
}
END_TEST

START_TEST(test_tf32_off_by_default) {
  const char *setting = getenv("KILN_CUDA_TF32");
  if (setting && !strcmp(setting, "1")) {
    printf("KILN_CUDA_TF32=1 in the environment: the default cannot be checked\n");
    return;
  }
  const char *tf32 = property(gpu, "tf32");
  ck_assert_msg(tf32 && !strncmp(tf32, "off", 3), "tf32 property '%s'", tf32 ? tf32 : "(missing)");
  /* 1 + 2^-12 needs 13 mantissa bits; TF32 keeps 10 and would round it to 1,
   * so a sum of 256 such products is 256.0625 in f32 and 256 in TF32. */
  const int64_t m = 256, n = 256, k = 256;
  float *a = malloc((size_t)(m * k) * sizeof *a), *b = malloc((size_t)(k * n) * sizeof *b);
  for (int64_t i = 0; i < m * k; i++) a[i] = 1.0f + 1.0f / 4096.0f;
  for (int64_t i = 0; i < k * n; i++) b[i] = 1.0f;
  const char *providers[2] = {"native", "cublas"};
  for (int p = 0; p < 2; p++) {
    if (p == 1 && !has_provider(gpu, "matmul", "cublas")) break;
    double *c = matmul_with(providers[p], KILN_F32, m, n, k, a, b, false, false);
    for (int64_t i = 0; i < m * n; i++) ck_assert_msg(c[i] == 256.0625, "%s: c[%lld] = %.7g", providers[p], (long long)i, c[i]);
    free(c);
  }
  free(a);
  free(b);
}
END_TEST

/* conv2d (with a bias) or max_pool2d in dtype d with one provider forced. */
static double *conv_with(const char *provider, bool pooling, kiln_dtype_t d) {
  char overrides[64];
  snprintf(overrides, sizeof overrides, "%s=%s", pooling ? "max_pool2d" : "conv2d", provider);
  KT_OK(kiln_set_providers(overrides));
  const int64_t xs[4] = {2, 3, 17, 13}, ws[4] = {5, 3, 3, 3}, bs[1] = {5};
  float x[2 * 3 * 17 * 13], w[5 * 3 * 3 * 3], bias[5];
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (float)((i * 7) % 13) / 4.0f - 1.5f;
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = (float)((i * 5) % 9) / 8.0f - 0.5f;
  for (int i = 0; i < 5; i++) bias[i] = (float)i / 2.0f;
  kiln_tensor_t *tx = from_f32(d, 4, xs, x), *tw = from_f32(d, 4, ws, w), *tb = from_f32(d, 1, bs, bias), *ty;
  if (pooling) {
    kiln_pool2d_params_t params = {{3, 2}, {2, 2}, {1, 1}};
    KT_OK(kiln_tensor_max_pool2d(tx, &params, &ty));
  } else {
    kiln_conv2d_params_t params = {{2, 1}, {1, 2}, {1, 2}};
    KT_OK(kiln_tensor_conv2d(tx, tw, tb, &params, &ty));
  }
  ck_assert_msg(!strcmp(kiln_last_provider(), provider), "%s in %s ran on '%s', not '%s'",
                pooling ? "max_pool2d" : "conv2d", kiln_dtype_name(d), kiln_last_provider(), provider);
  ck_assert_int_eq(kiln_tensor_dtype(ty), d);
  double *y = to_f64(ty);
  kiln_tensor_release(tx);
  kiln_tensor_release(tw);
  kiln_tensor_release(tb);
  kiln_tensor_release(ty);
  KT_OK(kiln_set_providers(""));
  return y;
}

START_TEST(test_cudnn_and_native_agree) {
  if (!has_provider(gpu, "conv2d", "cudnn")) {
    printf("cudnn absent (%s): native only\n", property(gpu, "cudnn") ? property(gpu, "cudnn") : "?");
    return;
  }
  /* max_pool2d in f32 (its cudnn row's one dtype), then conv2d with its
   * bias in every dtype the cudnn row serves. */
  for (size_t di = 0; di <= VENDOR_DTYPES; di++) {
    const bool pooling = di == VENDOR_DTYPES;
    const kiln_dtype_t d = pooling ? KILN_F32 : vendor_tolerances[di].dtype;
    double *y1 = conv_with("native", pooling, d), *y2 = conv_with("cudnn", pooling, d);
    /* P = (17 + 2 - 2 - 1) / 2 + 1 = 9, Q = (13 + 4 - 4 - 1) / 1 + 1 = 13 for the conv. */
    const size_t count = pooling ? (size_t)2 * 3 * 9 * 7 : (size_t)2 * 5 * 9 * 13;
    /* Pooling picks values: exact. */
    const double tolerance = pooling ? 0.0 : vendor_tolerances[di].conv;
    for (size_t i = 0; i < count; i++)
      ck_assert_msg(fabs(y1[i] - y2[i]) <= tolerance * (1.0 + fabs(y1[i])), "%s in %s [%zu] %.17g vs %.17g",
                    pooling ? "max_pool2d" : "conv2d", kiln_dtype_name(d), i, y1[i], y2[i]);
    free(y1);
    free(y2);
  }
}
END_TEST

/* CAST both ways (kernels new with the op table), from a contiguous tensor
 * (the flat path) and from a transposed view (the strided walk): f32 -> i32
 * truncates toward zero, NaN becomes 0, out of range saturates; i32 -> f32
 * rounds to nearest even. */
START_TEST(test_cast_runs) {
  const char *providers = kiln_device_providers(gpu, "cast");
  ck_assert_msg(providers && !strncmp(providers, "native", 6), "cast providers '%s'", providers ? providers : "");
  const float f[8] = {1.5f, -1.5f, NAN, 3e9f, -3e9f, -0.7f, 2147483520.0f, 123456.9f};
  const int32_t f_as_i[8] = {1, -1, 0, INT32_MAX, INT32_MIN, 0, 2147483520, 123456};
  /* 16777217 and -16777219 are ties between two floats: the even one wins. */
  const int32_t i[8] = {16777217, -16777219, INT32_MAX, INT32_MIN, 0, -5, 33554435, 7};
  const float i_as_f[8] = {16777216.0f, -16777220.0f, 2147483648.0f, -2147483648.0f, 0.0f, -5.0f, 33554436.0f, 7.0f};
  const int64_t shape[2] = {2, 4};
  kiln_tensor_t *tf, *ti, *tf_t, *ti_t, *out;
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 2, shape, f, &tf));
  KT_OK(kiln_tensor_from_host(gpu, KILN_I32, 2, shape, i, &ti));
  KT_OK(kiln_tensor_transpose(tf, 0, 1, &tf_t));
  KT_OK(kiln_tensor_transpose(ti, 0, 1, &ti_t));
  int32_t got_i[8];
  float got_f[8];
  KT_OK(kiln_tensor_cast(tf, KILN_I32, &out));
  KT_OK(kiln_tensor_read(out, got_i, sizeof got_i));
  kiln_tensor_release(out);
  for (int k = 0; k < 8; k++)
    ck_assert_msg(got_i[k] == f_as_i[k], "(i32)%g is %d, expected %d", (double)f[k], got_i[k], f_as_i[k]);
  KT_OK(kiln_tensor_cast(tf_t, KILN_I32, &out));
  KT_OK(kiln_tensor_read(out, got_i, sizeof got_i));
  kiln_tensor_release(out);
  /* out[r][c] of the [4, 2] transpose is in[c][r]. */
  for (int k = 0; k < 8; k++) ck_assert_int_eq(got_i[k], f_as_i[(k % 2) * 4 + k / 2]);
  KT_OK(kiln_tensor_cast(ti, KILN_F32, &out));
  KT_OK(kiln_tensor_read(out, got_f, sizeof got_f));
  kiln_tensor_release(out);
  for (int k = 0; k < 8; k++)
    ck_assert_msg(got_f[k] == i_as_f[k], "(f32)%d is %.1f, expected %.1f", i[k], (double)got_f[k], (double)i_as_f[k]);
  KT_OK(kiln_tensor_cast(ti_t, KILN_F32, &out));
  KT_OK(kiln_tensor_read(out, got_f, sizeof got_f));
  kiln_tensor_release(out);
  for (int k = 0; k < 8; k++) ck_assert_float_eq(got_f[k], i_as_f[(k % 2) * 4 + k / 2]);
  kiln_tensor_release(tf_t);
  kiln_tensor_release(ti_t);
  kiln_tensor_release(tf);
  kiln_tensor_release(ti);
}
END_TEST

/* ---- every dtype: storage kernels against cpu:0, bit for bit ------------------------------------ */

enum { DT_N = 64 }; /* elements of each source tensor: even, for the [2, 32] transpose */

/* The values every cast starts from, as f64: NaN of both signs, +-inf, +-0,
 * f32, f16 and bf16 subnormals, ties for f16 and bf16 (1 + 2^-11, 1 + 3 *
 * 2^-11, 1 + 2^-8), f16's largest and its overflow tie, values just past
 * each integer range, 2^24 + 1 and 2^63. */
static void dtype_specials(double v[DT_N]) {
  const double fixed[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.5, -1.5, 2.5, -2.5,
                          0.7, -0.7, 65504.0, 65520.0, -65520.0, 65519.99, 5.960464477539063e-08,
                          2.9802322387695312e-08, 1e-6, -3e-5, 1e-40, -1e-45, 3.4028235e38, 1e300,
                          1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048, 1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 127.5, 128.0,
                          -128.0, -129.0, 255.9, 256.0, -1.0, 32767.0, 32768.0, -32769.0, 2147483647.0,
                          2147483648.0, -2147483649.0, 16777217.0, 9.2233720368547758e18, -9.2233720368547758e18,
                          1e19, -1e19, 3.0e38, 1.17549435e-38, 6.1035156e-05, 6.097555e-05, 0.1, 1e-8, 12345.678,
                          -0.4999, 0.5, 33554435.0, 4294967296.0, -4294967297.0, 1e5, 1e-310, -1e-320, 42.0, 3.0,
                          -7.25};
  for (int i = 0; i < DT_N; i++) v[i] = fixed[i % (sizeof fixed / sizeof fixed[0])];
}

/* Raw patterns no f64 cast makes: NaN payloads of f16 and bf16 (signalling
 * ones too), the largest and smallest integers. */
static void dtype_raw(kiln_dtype_t d, void *out) {
  if (d == KILN_F16 || d == KILN_BF16) {
    const uint16_t f16[] = {0x7e01, 0xfd55, 0x7c01, 0xfc00, 0x7c00, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0x8000, 0x3c00};
    const uint16_t bf16[] = {0x7fc1, 0xff81, 0x7f81, 0xff80, 0x7f80, 0x0001, 0x8001, 0x007f, 0x0080, 0x7f7f, 0x8000, 0x3f80};
    uint16_t *o = out;
    for (int i = 0; i < DT_N; i++) o[i] = (d == KILN_F16 ? f16 : bf16)[i % 12] ^ (uint16_t)(i >= 12 ? (i * 37) & 0x3ff : 0);
  } else {
    const int64_t i64[] = {INT64_MIN, INT64_MAX, ((int64_t)1 << 53) + 1, -((int64_t)1 << 24) - 1, 255, 256, -1, 0x7fff,
                           0x8000, -0x8001, (int64_t)1 << 62, 0x7fffffff};
    int64_t *o = out;
    for (int i = 0; i < DT_N; i++) o[i] = (int64_t)((uint64_t)i64[i % 12] + (uint64_t)(i >= 12 ? i * 977 : 0)); /* wraps */
  }
}

/* One tensor of dtype d with the same bytes on cpu:0 and on the GPU. */
static void dtype_pair(kiln_dtype_t d, const void *bytes, kiln_tensor_t **on_cpu, kiln_tensor_t **on_gpu) {
  const int64_t shape[2] = {2, DT_N / 2};
  KT_OK(kiln_tensor_from_host(cpu, d, 2, shape, bytes, on_cpu));
  KT_OK(kiln_tensor_from_host(gpu, d, 2, shape, bytes, on_gpu));
}

/* Both results' bytes equal, or a message naming the first difference. */
static void same_bytes(const char *what, kiln_tensor_t *expected, kiln_tensor_t *got) {
  const size_t size = kiln_dtype_size(kiln_tensor_dtype(expected));
  ck_assert_int_eq(kiln_tensor_dtype(got), kiln_tensor_dtype(expected));
  ck_assert_int_eq(kiln_tensor_numel(got), kiln_tensor_numel(expected));
  const size_t n = (size_t)kiln_tensor_numel(expected), bytes = n * size;
  unsigned char *e = malloc(bytes ? bytes : 1), *g = malloc(bytes ? bytes : 1);
  KT_OK(kiln_tensor_read(expected, e, bytes));
  KT_OK(kiln_tensor_read(got, g, bytes));
  for (size_t i = 0; i < n; i++) {
    if (memcmp(e + i * size, g + i * size, size) == 0) continue;
    uint64_t ev = 0, gv = 0;
    memcpy(&ev, e + i * size, size);
    memcpy(&gv, g + i * size, size);
    ck_abort_msg("%s: element %zu is 0x%llx on the GPU, 0x%llx on cpu:0", what, i, (unsigned long long)gv,
                 (unsigned long long)ev);
  }
  free(e);
  free(g);
}

/* Cast a's pair to every other dtype on both devices, from the contiguous
 * tensors and from their transposes (the strided walk). */
static void casts_from(kiln_dtype_t s, const void *bytes) {
  kiln_tensor_t *c, *g, *ct, *gt;
  dtype_pair(s, bytes, &c, &g);
  KT_OK(kiln_tensor_transpose(c, 0, 1, &ct));
  KT_OK(kiln_tensor_transpose(g, 0, 1, &gt));
  for (int d = 0; d < KILN_DTYPE_COUNT_; d++) {
    char what[64];
    kiln_tensor_t *e, *r;
    snprintf(what, sizeof what, "cast %s -> %s", kiln_dtype_name(s), kiln_dtype_name((kiln_dtype_t)d));
    KT_OK(kiln_tensor_cast(c, (kiln_dtype_t)d, &e));
    KT_OK(kiln_tensor_cast(g, (kiln_dtype_t)d, &r));
    same_bytes(what, e, r);
    kiln_tensor_release(e);
    kiln_tensor_release(r);
    snprintf(what, sizeof what, "cast %s -> %s, transposed", kiln_dtype_name(s), kiln_dtype_name((kiln_dtype_t)d));
    KT_OK(kiln_tensor_cast(ct, (kiln_dtype_t)d, &e));
    KT_OK(kiln_tensor_cast(gt, (kiln_dtype_t)d, &r));
    same_bytes(what, e, r);
    kiln_tensor_release(e);
    kiln_tensor_release(r);
  }
  kiln_tensor_release(ct);
  kiln_tensor_release(gt);
  kiln_tensor_release(c);
  kiln_tensor_release(g);
}

/* CAST of every pair of dtypes (and COPY, the same dtype, contiguous and
 * strided) gives cpu:0's bits: NaN (payloads kept, signalling ones
 * quieted), +-inf, -0, subnormals, ties to even, values past every range.
 * Each source is the specials cast to it on cpu:0; f16, bf16 and i64 get
 * raw patterns too. */
START_TEST(test_cast_every_pair_matches_cpu) {
  double v[DT_N];
  dtype_specials(v);
  const int64_t shape[2] = {2, DT_N / 2};
  kiln_tensor_t *f64;
  KT_OK(kiln_tensor_from_host(cpu, KILN_F64, 2, shape, v, &f64));
  for (int s = 0; s < KILN_DTYPE_COUNT_; s++) {
    kiln_tensor_t *src;
    KT_OK(kiln_tensor_cast(f64, (kiln_dtype_t)s, &src));
    unsigned char bytes[DT_N * 8];
    KT_OK(kiln_tensor_read(src, bytes, (size_t)DT_N * kiln_dtype_size((kiln_dtype_t)s)));
    kiln_tensor_release(src);
    casts_from((kiln_dtype_t)s, bytes);
  }
  kiln_tensor_release(f64);
  const kiln_dtype_t raw[3] = {KILN_F16, KILN_BF16, KILN_I64};
  for (int k = 0; k < 3; k++) {
    int64_t bytes[DT_N];
    dtype_raw(raw[k], bytes);
    casts_from(raw[k], bytes);
  }
}
END_TEST

/* FILL (zeros, ones, full) and ARANGE of every dtype give cpu:0's bits. */
START_TEST(test_fill_and_arange_every_dtype_match_cpu) {
  const double values[] = {0.0, 1.0, -0.0, -1.5, NAN, INFINITY, 1e10, 65504.5, 1.0 + 1.0 / 256, -300.7};
  const int64_t shape[2] = {3, 37};
  for (int d = 0; d < KILN_DTYPE_COUNT_; d++) {
    const kiln_dtype_t dt = (kiln_dtype_t)d;
    char what[96];
    for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
      kiln_tensor_t *e, *r;
      snprintf(what, sizeof what, "full(%s, %g)", kiln_dtype_name(dt), values[k]);
      KT_OK(kiln_tensor_full(cpu, dt, 2, shape, values[k], &e));
      KT_OK(kiln_tensor_full(gpu, dt, 2, shape, values[k], &r));
      same_bytes(what, e, r);
      kiln_tensor_release(e);
      kiln_tensor_release(r);
    }
    if (dt == KILN_BOOL) continue; /* arange of bool is refused */
    const double ranges[][3] = {{-3.5, 40.0, 0.7}, {-200.0, 300.0, 1.0}, {1e9, 1e10, 3.3e7}, {0.0, 1.0, 0.01},
                                {65000.0, 66000.0, 7.5}};
    for (size_t k = 0; k < sizeof ranges / sizeof ranges[0]; k++) {
      kiln_tensor_t *e, *r;
      snprintf(what, sizeof what, "arange(%s, %g, %g, %g)", kiln_dtype_name(dt), ranges[k][0], ranges[k][1],
               ranges[k][2]);
      KT_OK(kiln_tensor_arange(cpu, dt, ranges[k][0], ranges[k][1], ranges[k][2], &e));
      KT_OK(kiln_tensor_arange(gpu, dt, ranges[k][0], ranges[k][1], ranges[k][2], &r));
      same_bytes(what, e, r);
      kiln_tensor_release(e);
      kiln_tensor_release(r);
    }
  }
}
END_TEST

/* Float bits as ordered integers (sign-magnitude to two's complement order). */
static int64_t ordered(kiln_dtype_t d, uint64_t bits) {
  const int width = (int)kiln_dtype_size(d) * 8;
  const uint64_t sign = (uint64_t)1 << (width - 1);
  const int64_t magnitude = (int64_t)(bits & (sign - 1));
  return bits & sign ? -magnitude : magnitude;
}

static bool is_nan_bits(kiln_dtype_t d, uint64_t b) {
  switch (d) {
  case KILN_F16: return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu);
  case KILN_BF16: return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu);
  case KILN_F32: return (b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu);
  case KILN_F64: return (b & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (b & 0xfffffffffffffull);
  default: return false;
  }
}

/* Results within `ulps` units in the last place of the dtype (0: the same
 * bits; NaN matches NaN). */
static void close_bits(const char *what, kiln_tensor_t *expected, kiln_tensor_t *got, int ulps) {
  if (ulps == 0) {
    same_bytes(what, expected, got);
    return;
  }
  const kiln_dtype_t d = kiln_tensor_dtype(expected);
  const size_t size = kiln_dtype_size(d), n = (size_t)kiln_tensor_numel(expected);
  ck_assert_int_eq(kiln_tensor_dtype(got), d);
  unsigned char *e = malloc(n * size + 1), *g = malloc(n * size + 1);
  KT_OK(kiln_tensor_read(expected, e, n * size));
  KT_OK(kiln_tensor_read(got, g, n * size));
  for (size_t i = 0; i < n; i++) {
    uint64_t ev = 0, gv = 0;
    memcpy(&ev, e + i * size, size);
    memcpy(&gv, g + i * size, size);
    if (ev == gv || (is_nan_bits(d, ev) && is_nan_bits(d, gv))) continue;
    const int64_t diff = ordered(d, ev) - ordered(d, gv);
    ck_assert_msg(diff >= -ulps && diff <= ulps, "%s: element %zu is 0x%llx on the GPU, 0x%llx on cpu:0 (%lld ulps)",
                  what, i, (unsigned long long)gv, (unsigned long long)ev, (long long)diff);
  }
  free(e);
  free(g);
}

/* Both devices answer alike: the same status, and (when OK) results
 * within `ulps`. */
static void both_agree(const char *what, kiln_status_t sc, kiln_tensor_t *e, kiln_status_t sg, kiln_tensor_t *r,
                       int ulps) {
  ck_assert_msg(sc == sg, "%s: cpu:0 says %d, the GPU %d (%s)", what, (int)sc, (int)sg, kiln_last_error());
  if (sc == KILN_OK) close_bits(what, e, r, ulps);
  kiln_tensor_release(e);
  kiln_tensor_release(r);
}

/* The specials of dtype_specials in dtype d, on both devices ([2, 32]), and
 * a second operand: the same values in another order. */
static void dtype_operands(kiln_dtype_t d, kiln_tensor_t *c[2], kiln_tensor_t *g[2]) {
  double v[DT_N], w[DT_N];
  dtype_specials(v);
  for (int i = 0; i < DT_N; i++) w[i] = v[(i * 7 + 3) % DT_N];
  const int64_t shape[2] = {2, DT_N / 2};
  for (int k = 0; k < 2; k++) {
    kiln_tensor_t *f64, *src;
    KT_OK(kiln_tensor_from_host(cpu, KILN_F64, 2, shape, k ? w : v, &f64));
    KT_OK(kiln_tensor_cast(f64, d, &src));
    unsigned char bytes[DT_N * 8];
    KT_OK(kiln_tensor_read(src, bytes, (size_t)DT_N * kiln_dtype_size(d)));
    dtype_pair(d, bytes, &c[k], &g[k]);
    kiln_tensor_release(src);
    kiln_tensor_release(f64);
  }
}

/* UNARY, BINARY, BINARY_SCALAR and COMPARE of every dtype, WHERE with a
 * condition of every dtype, contiguous and strided (a transposed operand),
 * against cpu:0: the same bits (integers wrap, f16 and bf16 computed in f32
 * and rounded once, f64 in f64), except exp, log, tanh and sigmoid, whose
 * math library is the device's: within 1 ulp of the dtype (CUDA's expf,
 * logf and tanhf are within 2 ulps of the exact result, glibc's within 1;
 * on the test driver both are glibc's and agree). An op a dtype does not
 * take fails alike on both. */
START_TEST(test_elementwise_every_dtype_matches_cpu) {
  const double scalars[] = {2.5, -3.0, 0.0, 1e6};
  for (int di = 0; di < KILN_DTYPE_COUNT_; di++) {
    const kiln_dtype_t d = (kiln_dtype_t)di;
    kiln_tensor_t *c[2], *g[2], *ct, *gt;
    dtype_operands(d, c, g);
    KT_OK(kiln_tensor_transpose(c[1], 0, 1, &ct));
    KT_OK(kiln_tensor_transpose(g[1], 0, 1, &gt));
    kiln_tensor_t *c1t, *g1t; /* [32, 2] views of both, for a strided pair */
    KT_OK(kiln_tensor_transpose(c[0], 0, 1, &c1t));
    KT_OK(kiln_tensor_transpose(g[0], 0, 1, &g1t));
    char what[96];
    for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
      const int ulps = op == KILN_UNARY_EXP || op == KILN_UNARY_LOG || op == KILN_UNARY_TANH || op == KILN_UNARY_SIGMOID;
      kiln_tensor_t *e = NULL, *r = NULL;
      snprintf(what, sizeof what, "unary %d of %s", op, kiln_dtype_name(d));
      const kiln_status_t sc = kiln_tensor_unary((kiln_unary_op_t)op, c[0], &e);
      const kiln_status_t sg = kiln_tensor_unary((kiln_unary_op_t)op, g[0], &r);
      both_agree(what, sc, e, sg, r, ulps);
      snprintf(what, sizeof what, "unary %d of %s, strided", op, kiln_dtype_name(d));
      const kiln_status_t sct = kiln_tensor_unary((kiln_unary_op_t)op, ct, &e);
      const kiln_status_t sgt = kiln_tensor_unary((kiln_unary_op_t)op, gt, &r);
      both_agree(what, sct, e, sgt, r, ulps);
    }
    for (int op = 0; op < KILN_BINARY_COUNT_; op++) {
      kiln_tensor_t *e = NULL, *r = NULL;
      snprintf(what, sizeof what, "binary %d of %s", op, kiln_dtype_name(d));
      kiln_status_t sc = kiln_tensor_binary((kiln_binary_op_t)op, c[0], c[1], &e);
      kiln_status_t sg = kiln_tensor_binary((kiln_binary_op_t)op, g[0], g[1], &r);
      both_agree(what, sc, e, sg, r, 0);
      snprintf(what, sizeof what, "binary %d of %s, strided", op, kiln_dtype_name(d));
      sc = kiln_tensor_binary((kiln_binary_op_t)op, c1t, ct, &e);
      sg = kiln_tensor_binary((kiln_binary_op_t)op, g1t, gt, &r);
      both_agree(what, sc, e, sg, r, 0);
      for (size_t k = 0; k < sizeof scalars / sizeof scalars[0]; k++) {
        snprintf(what, sizeof what, "binary %d of %s and %g", op, kiln_dtype_name(d), scalars[k]);
        sc = kiln_tensor_binary_scalar((kiln_binary_op_t)op, c[0], scalars[k], &e);
        sg = kiln_tensor_binary_scalar((kiln_binary_op_t)op, g[0], scalars[k], &r);
        both_agree(what, sc, e, sg, r, 0);
      }
    }
    for (int op = 0; op < KILN_COMPARE_COUNT_; op++) {
      kiln_tensor_t *e = NULL, *r = NULL;
      snprintf(what, sizeof what, "compare %d of %s", op, kiln_dtype_name(d));
      kiln_status_t sc = kiln_tensor_compare((kiln_compare_op_t)op, c[0], c[1], &e);
      kiln_status_t sg = kiln_tensor_compare((kiln_compare_op_t)op, g[0], g[1], &r);
      both_agree(what, sc, e, sg, r, 0);
      snprintf(what, sizeof what, "compare %d of %s, strided", op, kiln_dtype_name(d));
      sc = kiln_tensor_compare((kiln_compare_op_t)op, c1t, ct, &e);
      sg = kiln_tensor_compare((kiln_compare_op_t)op, g1t, gt, &r);
      both_agree(what, sc, e, sg, r, 0);
    }
    /* where(cond of d, a, b) for a and b of every dtype. */
    for (int vi = 0; vi < KILN_DTYPE_COUNT_; vi++) {
      kiln_tensor_t *vc[2], *vg[2], *e = NULL, *r = NULL;
      dtype_operands((kiln_dtype_t)vi, vc, vg);
      snprintf(what, sizeof what, "where(%s, %s)", kiln_dtype_name(d), kiln_dtype_name((kiln_dtype_t)vi));
      kiln_status_t sc = kiln_tensor_where(c[1], vc[0], vc[1], &e);
      kiln_status_t sg = kiln_tensor_where(g[1], vg[0], vg[1], &r);
      both_agree(what, sc, e, sg, r, 0);
      snprintf(what, sizeof what, "where(%s, %s), strided", kiln_dtype_name(d), kiln_dtype_name((kiln_dtype_t)vi));
      kiln_tensor_t *vct, *vgt;
      KT_OK(kiln_tensor_transpose(vc[0], 0, 1, &vct));
      KT_OK(kiln_tensor_transpose(vg[0], 0, 1, &vgt));
      sc = kiln_tensor_where(c1t, vct, ct, &e);
      sg = kiln_tensor_where(g1t, vgt, gt, &r);
      /* ct and gt are of d: where promotes the values when they differ. */
      both_agree(what, sc, e, sg, r, 0);
      kiln_tensor_release(vct);
      kiln_tensor_release(vgt);
      for (int k = 0; k < 2; k++) {
        kiln_tensor_release(vc[k]);
        kiln_tensor_release(vg[k]);
      }
    }
    kiln_tensor_release(c1t);
    kiln_tensor_release(g1t);
    kiln_tensor_release(ct);
    kiln_tensor_release(gt);
    for (int k = 0; k < 2; k++) {
      kiln_tensor_release(c[k]);
      kiln_tensor_release(g[k]);
    }
  }
}
END_TEST

/* ---- reductions of every dtype ------------------------------------------------------------------- */

/* Float results within a relative `rel` of cpu:0's (f32, f64: the order of
 * the sums differs; NaN matches NaN, infinities and zeros exactly). */
static void close_rel(const char *what, kiln_tensor_t *expected, kiln_tensor_t *got, double rel) {
  const kiln_dtype_t d = kiln_tensor_dtype(expected);
  ck_assert_int_eq(kiln_tensor_dtype(got), d);
  ck_assert(d == KILN_F32 || d == KILN_F64);
  const size_t n = (size_t)kiln_tensor_numel(expected);
  kiln_tensor_t *e64, *g64, *g_cpu;
  KT_OK(kiln_tensor_to(got, cpu, &g_cpu));
  KT_OK(kiln_tensor_cast(expected, KILN_F64, &e64));
  KT_OK(kiln_tensor_cast(g_cpu, KILN_F64, &g64));
  double *e = malloc(n * 8 + 8), *g = malloc(n * 8 + 8);
  KT_OK(kiln_tensor_read(e64, e, n * 8));
  KT_OK(kiln_tensor_read(g64, g, n * 8));
  for (size_t i = 0; i < n; i++) {
    if (e[i] == g[i] || (isnan(e[i]) && isnan(g[i]))) continue;
    ck_assert_msg(isfinite(e[i]) && fabs(g[i] - e[i]) <= rel * fabs(e[i]),
                  "%s: element %zu is %.17g on the GPU, %.17g on cpu:0 (relative tolerance %g)", what, i, g[i], e[i],
                  rel);
  }
  free(e);
  free(g);
  kiln_tensor_release(e64);
  kiln_tensor_release(g64);
  kiln_tensor_release(g_cpu);
}

/* A tensor of dtype d from doubles by the cast rule, the same bytes on both
 * devices. */
static void reduce_pair(kiln_dtype_t d, int ndim, const int64_t *shape, const double *v, kiln_tensor_t **c,
                        kiln_tensor_t **g) {
  kiln_tensor_t *f64;
  KT_OK(kiln_tensor_from_host(cpu, KILN_F64, ndim, shape, v, &f64));
  KT_OK(kiln_tensor_cast(f64, d, c));
  KT_OK(kiln_tensor_to(*c, gpu, g));
  kiln_tensor_release(f64);
}

/* The shapes each dtype is reduced in, and over which axes (1: axis 0, 2:
 * axis 1): short rows and columns (one pass), a long row and a long column
 * (split over blocks, the parts pass). Thousands of short rows would be
 * thousands of blocks, slow on the test driver: not here. */
static const int64_t reduce_shapes[][3] = {{3, 300, 3}, {300, 5, 1}, {2, 9001, 2}, {9001, 2, 1}};

/* Every reduction of a tensor of dtype d over both axes, and sum_to, on
 * both devices. `exact` values make every sum exact in every accumulator
 * (multiples of 1/4 below 16 in size): the results but NORM's are then the
 * same bits for every dtype. Otherwise (positive values, no cancellation) floats are
 * compared within 1 unit of f16 and bf16 (f32 accumulation in another
 * order: the f32 results differ in the last bits, which rounding into 16
 * bits may carry into one unit), 1e-12 relative in f64 and 1e-5 in f32
 * (CUDA sums f32 in double, cpu:0 pairwise in f32); integers and bool,
 * summed exactly modulo 2^64, the same bits; MAX and ARGMAX always the
 * same bits (the element itself, NaN first). */
static void reductions_match(kiln_dtype_t d, bool exact) {
  const bool is_float = d == KILN_F32 || d == KILN_F64 || d == KILN_F16 || d == KILN_BF16;
  for (size_t s = 0; s < sizeof reduce_shapes / sizeof reduce_shapes[0]; s++) {
    const int64_t *shape = reduce_shapes[s];
    const size_t n = (size_t)(shape[0] * shape[1]);
    double *v = malloc(n * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (size_t i = 0; i < n; i++) {
      const unsigned h = (unsigned)((i * 2654435761u) >> 7) % 1000u;
      if (!is_float)
        v[i] = d == KILN_BOOL ? (double)(h % 3 == 0) : d == KILN_U8 ? (double)(h % 256) : (double)(h % 251) - 125.0;
      else if (exact)
        v[i] = (double)(int)(h % 120) / 4.0 - 15.0;
      else
        v[i] = 0.5 + (double)h / 997.0 + (double)(i % 13) / 131.0;
    }
    if (is_float && s == 0) v[407] = NAN; /* row 1 of [3, 300]: NaN wins max at its index */
    if (d == KILN_I64)
      for (size_t i = 0; i < n; i += 7) v[i] = 4.0e18; /* sums wrap modulo 2^64 into i64 */
    kiln_tensor_t *c, *g;
    reduce_pair(d, 2, shape, v, &c, &g);
    char what[128];
    for (int axis = 0; axis < 2; axis++) {
      if (!(shape[2] >> axis & 1)) continue;
      for (int op = 0; op < 5; op++) {
        static const char *const names[5] = {"sum", "mean", "max", "argmax", "norm"};
        kiln_tensor_t *e = NULL, *r = NULL;
        kiln_status_t sc, sg;
        switch (op) {
        case 0: sc = kiln_tensor_sum(c, axis, false, &e), sg = kiln_tensor_sum(g, axis, false, &r); break;
        case 1: sc = kiln_tensor_mean(c, axis, false, &e), sg = kiln_tensor_mean(g, axis, false, &r); break;
        case 2: sc = kiln_tensor_max(c, axis, false, &e), sg = kiln_tensor_max(g, axis, false, &r); break;
        case 3: sc = kiln_tensor_argmax(c, axis, false, &e), sg = kiln_tensor_argmax(g, axis, false, &r); break;
        default:
          if (axis || s != 0) continue; /* NORM is of the whole tensor: once per dtype */
          sc = kiln_tensor_norm(c, &e), sg = kiln_tensor_norm(g, &r);
          break;
        }
        snprintf(what, sizeof what, "%s of %s [%lld, %lld] over axis %d%s", names[op], kiln_dtype_name(d),
                 (long long)shape[0], (long long)shape[1], axis, exact ? " (exact values)" : "");
        ck_assert_msg(sc == sg, "%s: cpu:0 says %d, the GPU %d (%s)", what, (int)sc, (int)sg, kiln_last_error());
        if (sc != KILN_OK) continue;
        const kiln_dtype_t rd = kiln_tensor_dtype(e);
        /* NORM's squares (multiples of 1/16 summing past 2^20) are not exact in f32. */
        if (!is_float || op == 2 || op == 3 || (exact && op != 4))
          same_bytes(what, e, r);
        else if (rd == KILN_F16 || rd == KILN_BF16)
          close_bits(what, e, r, 1);
        else
          close_rel(what, e, r, rd == KILN_F64 ? 1e-12 : 1e-5);
        kiln_tensor_release(e);
        kiln_tensor_release(r);
      }
      /* sum_to keeps the dtype (integers wrap in it, bool: any). */
      const int64_t to[2] = {axis ? shape[0] : 1, axis ? 1 : shape[1]};
      kiln_tensor_t *e, *r;
      snprintf(what, sizeof what, "sum_to of %s [%lld, %lld] over axis %d%s", kiln_dtype_name(d),
               (long long)shape[0], (long long)shape[1], axis, exact ? " (exact values)" : "");
      KT_OK(kiln_tensor_sum_to(c, 2, to, &e));
      KT_OK(kiln_tensor_sum_to(g, 2, to, &r));
      ck_assert_int_eq(kiln_tensor_dtype(r), d);
      if (exact || !is_float) same_bytes(what, e, r);
      else if (d == KILN_F16 || d == KILN_BF16) close_bits(what, e, r, 1);
      else close_rel(what, e, r, d == KILN_F64 ? 1e-12 : 1e-5);
      kiln_tensor_release(e);
      kiln_tensor_release(r);
    }
    kiln_tensor_release(c);
    kiln_tensor_release(g);
    free(v);
  }
}

/* SUM, MEAN, MAX, ARGMAX, NORM and sum_to of every dtype on the GPU give
 * cpu:0's results (the rules of reductions_match): integers and bool
 * accumulate in 64 bits (the sum an i64), f16 and bf16 in f32, f64 in
 * f64, each result in the dtype the core chose; ops a dtype does not take
 * (mean of i32, max of bool) fail alike. */
START_TEST(test_reductions_every_dtype_match_cpu) {
  for (int di = 0; di < KILN_DTYPE_COUNT_; di++) {
    const kiln_dtype_t d = (kiln_dtype_t)di;
    reductions_match(d, true);
    if (d == KILN_F32 || d == KILN_F64 || d == KILN_F16 || d == KILN_BF16) reductions_match(d, false);
  }
}
END_TEST

/* uniform and normal in every float dtype give cpu:0's bits (kernels/philox.h:
 * f16 and bf16 the f32 sample rounded once, f64 from the same counters in
 * double; the normal's log, sqrt and cos are the header's own, so on a GPU
 * too). Integer dtypes are refused alike. */
START_TEST(test_random_every_float_dtype_matches_cpu) {
  const int64_t shape[2] = {3, 1001};
  const uint64_t seeds[2] = {7, 0x123456789abcdefull};
  const float bounds[3][2] = {{0.0f, 1.0f}, {-2.0f, 3.0f}, {1000.0f, 1000.5f}};
  for (int di = 0; di < KILN_DTYPE_COUNT_; di++) {
    const kiln_dtype_t d = (kiln_dtype_t)di;
    for (int k = 0; k < 2; k++)
      for (int b = 0; b < 3; b++)
        for (int normal = 0; normal < 2; normal++) {
          kiln_tensor_t *e = NULL, *r = NULL;
          char what[128];
          snprintf(what, sizeof what, "%s(%s, seed %llu, %g, %g)", normal ? "normal" : "uniform", kiln_dtype_name(d),
                   (unsigned long long)seeds[k], bounds[b][0], bounds[b][1]);
          const kiln_status_t sc =
              normal ? kiln_tensor_normal_dtype(cpu, d, 2, shape, seeds[k], bounds[b][0], bounds[b][1], &e)
                     : kiln_tensor_uniform_dtype(cpu, d, 2, shape, seeds[k], bounds[b][0], bounds[b][1], &e);
          const kiln_status_t sg =
              normal ? kiln_tensor_normal_dtype(gpu, d, 2, shape, seeds[k], bounds[b][0], bounds[b][1], &r)
                     : kiln_tensor_uniform_dtype(gpu, d, 2, shape, seeds[k], bounds[b][0], bounds[b][1], &r);
          both_agree(what, sc, e, sg, r, 0);
        }
  }
}
END_TEST

/* MATMUL in f64, f16 and bf16 (and f32) on the native GEMM against cpu:0,
 * every transpose, shapes across the 128-wide tiles and the k-steps of 8,
 * one batched with B broadcast. `exact` operands (multiples of 1/8 in
 * [-2, 2), k <= 70) make every sum exact in f32: the results are then the
 * same bits in every dtype (f16 and bf16 rounded once from the exact f32
 * value). Otherwise (positive operands, no cancellation): within 1 unit of
 * f16 and bf16 (f32 accumulation in another order, rounded once), 1e-12
 * relative in f64, 1e-5 in f32. */
static void matmul_matches(kiln_dtype_t d, bool exact) {
  static const int64_t sizes[][4] = {{1, 1, 1, 1}, {37, 19, 45, 1}, {130, 70, 129, 1}, {9, 13, 33, 3}};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    const int64_t m = sizes[s][0], k = sizes[s][1], n = sizes[s][2], batch = sizes[s][3];
    for (int t = 0; t < 4; t++) {
      const bool ta = t & 1, tb = t & 2;
      const int64_t sa[3] = {batch, ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n};
      const size_t na = (size_t)(batch * m * k), nb = (size_t)(k * n);
      double *va = malloc(na * sizeof *va), *vb = malloc(nb * sizeof *vb);
      ck_assert_ptr_nonnull(va);
      ck_assert_ptr_nonnull(vb);
      for (size_t i = 0; i < na + nb; i++) {
        const unsigned h = (unsigned)(((i + 17 * s + 5 * (size_t)t) * 2654435761u) >> 9) % 1024u;
        const double v = exact ? (double)(h % 32) / 8.0 - 2.0 : 0.25 + (double)h / 1021.0;
        if (i < na) va[i] = v;
        else vb[i - na] = v;
      }
      kiln_tensor_t *ca, *ga, *cb, *gb, *e = NULL, *r = NULL;
      reduce_pair(d, batch > 1 ? 3 : 2, batch > 1 ? sa : sa + 1, va, &ca, &ga);
      reduce_pair(d, 2, sb, vb, &cb, &gb);
      char what[128];
      snprintf(what, sizeof what, "matmul %s%s [%lldx%lldx%lld, batch %lld]%s%s", kiln_dtype_name(d),
               exact ? " (exact values)" : "", (long long)m, (long long)k, (long long)n, (long long)batch,
               ta ? " A^T" : "", tb ? " B^T" : "");
      KT_OK(kiln_tensor_matmul(ca, cb, ta, tb, &e));
      KT_OK(kiln_tensor_matmul(ga, gb, ta, tb, &r));
      ck_assert_str_eq(kiln_last_provider(), "native");
      if (exact) same_bytes(what, e, r);
      else if (d == KILN_F16 || d == KILN_BF16) close_bits(what, e, r, 1);
      else close_rel(what, e, r, d == KILN_F64 ? 1e-12 : 1e-5);
      kiln_tensor_t *all[6] = {ca, ga, cb, gb, e, r};
      for (int i = 0; i < 6; i++) kiln_tensor_release(all[i]);
      free(va);
      free(vb);
    }
  }
}

START_TEST(test_matmul_every_float_dtype_matches_cpu) {
  KT_OK(kiln_set_providers("matmul=native"));
  const kiln_dtype_t dtypes[4] = {KILN_F64, KILN_F16, KILN_BF16, KILN_F32};
  for (int i = 0; i < 4; i++) {
    matmul_matches(dtypes[i], true);
    matmul_matches(dtypes[i], false);
  }
  /* Integers and bool are refused alike, naming the cast. */
  const int64_t shape[2] = {2, 2};
  kiln_tensor_t *ci, *gi, *e = NULL, *r = NULL;
  const double v[4] = {1, 2, 3, 4};
  reduce_pair(KILN_I32, 2, shape, v, &ci, &gi);
  const kiln_status_t sc = kiln_tensor_matmul(ci, ci, false, false, &e);
  const kiln_status_t sg = kiln_tensor_matmul(gi, gi, false, false, &r);
  ck_assert_int_eq(sc, KILN_DTYPE_MISMATCH);
  ck_assert_int_eq(sg, KILN_DTYPE_MISMATCH);
  kiln_tensor_release(ci);
  kiln_tensor_release(gi);
}
END_TEST

/* conv2d in f64 on the native path (im2col, the f64 GEMM, the bias) against
 * cpu:0 within 1e-12 relative: a padded 3x3 of stride 2 with bias and a 1x1
 * (the GEMM alone) without. */
START_TEST(test_conv2d_f64_matches_cpu) {
  const int64_t xs[4] = {2, 3, 9, 7}, ws[2][4] = {{4, 3, 3, 3}, {5, 3, 1, 1}}, bs[1] = {4};
  double x[2 * 3 * 9 * 7], w[4 * 3 * 3 * 3], b[4];
  for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) x[i] = (double)((i * 37) % 101) / 50.0 - 1.0 + 1e-9 * (double)i;
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) w[i] = (double)((i * 53) % 67) / 33.0 - 1.0;
  for (int i = 0; i < 4; i++) b[i] = 0.25 * i - 0.3;
  kiln_tensor_t *cx, *gx, *cb, *gb;
  reduce_pair(KILN_F64, 4, xs, x, &cx, &gx);
  reduce_pair(KILN_F64, 1, bs, b, &cb, &gb);
  for (int v = 0; v < 2; v++) {
    kiln_tensor_t *cw, *gw, *e, *r;
    reduce_pair(KILN_F64, 4, ws[v], w, &cw, &gw);
    kiln_conv2d_params_t params = kiln_conv2d_params_default();
    if (v == 0) {
      params.stride[0] = params.stride[1] = 2;
      params.padding[0] = params.padding[1] = 1;
    }
    KT_OK(kiln_tensor_conv2d(cx, cw, v == 0 ? cb : NULL, &params, &e));
    KT_OK(kiln_tensor_conv2d(gx, gw, v == 0 ? gb : NULL, &params, &r));
    close_rel(v == 0 ? "conv2d f64 3x3 stride 2 pad 1, bias" : "conv2d f64 1x1", e, r, 1e-12);
    kiln_tensor_release(cw);
    kiln_tensor_release(gw);
    kiln_tensor_release(e);
    kiln_tensor_release(r);
  }
  kiln_tensor_t *all[4] = {cx, gx, cb, gb};
  for (int i = 0; i < 4; i++) kiln_tensor_release(all[i]);
}
END_TEST

/* Axis 0 of a tall, narrow tensor: the long axis is split over many blocks
 * and merged in a second pass. Small integers keep every sum exact. */
START_TEST(test_column_reduction_of_a_long_axis) {
  enum { ROWS = 100003, COLS = 4 };
  float *x = malloc((size_t)ROWS * COLS * sizeof *x);
  ck_assert_ptr_nonnull(x);
  double sum[COLS] = {0};
  float best[COLS];
  int32_t arg[COLS];
  for (int c = 0; c < COLS; c++) best[c] = -INFINITY, arg[c] = 0;
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < COLS; c++) {
      const float v = (float)((r * 31 + c * 17) % 23) - 11.0f + (r == 77777 && c == 2 ? 100.0f : 0.0f);
      x[(size_t)r * COLS + c] = v;
      sum[c] += v;
      if (v > best[c]) best[c] = v, arg[c] = r;
    }
  const int64_t shape[2] = {ROWS, COLS};
  kiln_tensor_t *t, *s, *m, *a;
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 2, shape, x, &t));
  KT_OK(kiln_tensor_sum(t, 0, false, &s));
  KT_OK(kiln_tensor_max(t, 0, false, &m));
  KT_OK(kiln_tensor_argmax(t, 0, false, &a));
  float got_s[COLS], got_m[COLS];
  int32_t got_a[COLS];
  KT_OK(kiln_tensor_read(s, got_s, sizeof got_s));
  KT_OK(kiln_tensor_read(m, got_m, sizeof got_m));
  KT_OK(kiln_tensor_read(a, got_a, sizeof got_a));
  for (int c = 0; c < COLS; c++) {
    ck_assert_msg(got_s[c] == (float)sum[c], "sum[%d] = %.1f, expected %.1f", c, got_s[c], sum[c]);
    ck_assert_msg(got_m[c] == best[c], "max[%d] = %g, expected %g", c, got_m[c], best[c]);
    ck_assert_msg(got_a[c] == arg[c], "argmax[%d] = %d, expected %d", c, got_a[c], arg[c]);
  }
  kiln_tensor_release(t);
  kiln_tensor_release(s);
  kiln_tensor_release(m);
  kiln_tensor_release(a);
  free(x);
}
END_TEST

/* More rows than the grid's 65535 row tiles of 128: the native SGEMM loops
 * over the rest instead of refusing (m above 8,388,480). */
START_TEST(test_native_matmul_of_many_rows) {
  const int64_t m = 65535 * 128 + 129, k = 2, n = 1;
  float *a = malloc((size_t)(m * k) * sizeof *a), *c = malloc((size_t)m * sizeof *c);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(c);
  for (int64_t i = 0; i < m; i++) a[2 * i] = (float)(i % 7), a[2 * i + 1] = 1.0f;
  const float b[2] = {2.0f, 3.0f};
  KT_OK(kiln_set_providers("matmul=native"));
  const int64_t sa[2] = {m, k}, sb[2] = {k, n};
  kiln_tensor_t *ta, *tb, *tc;
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 2, sa, a, &ta));
  KT_OK(kiln_tensor_from_host(gpu, KILN_F32, 2, sb, b, &tb));
  KT_OK(kiln_tensor_matmul(ta, tb, false, false, &tc));
  ck_assert_str_eq(kiln_last_provider(), "native");
  KT_OK(kiln_tensor_read(tc, c, (size_t)m * sizeof *c));
  for (int64_t i = 0; i < m; i++)
    ck_assert_msg(c[i] == (float)(2 * (i % 7) + 3), "c[%lld] = %g", (long long)i, c[i]);
  kiln_tensor_release(ta);
  kiln_tensor_release(tb);
  kiln_tensor_release(tc);
  free(a);
  free(c);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  size_t backends = 0;
  if (kiln_backend_count(&backends) != KILN_OK) {
    printf("SKIP: kiln could not start, so the CUDA backend cannot be tested: %s\n", kiln_last_error());
    return 77;
  }
  kiln_backend_info_t info;
  bool found = false;
  for (size_t i = 0; i < backends; i++)
    if (kiln_backend_info(i, &info) == KILN_OK && !strcmp(info.name, "cuda")) {
      found = true;
      break;
    }
  if (!found) {
    printf("SKIP: the cuda backend was not considered (KILN_BACKEND='%s')\n",
           getenv("KILN_BACKEND") ? getenv("KILN_BACKEND") : "");
    return 77;
  }
  if (info.state != KILN_BACKEND_LOADED) {
    printf("SKIP: no CUDA device visible: cuda backend %s: %s (plugin %s)\n", kiln_backend_state_name(info.state),
           info.reason && info.reason[0] ? info.reason : "no reason given", info.path ? info.path : "?");
    return 77;
  }
  if (kiln_device_find("cuda:0", &gpu) != KILN_OK || kiln_device_find("cpu:0", &cpu) != KILN_OK) {
    printf("SKIP: cuda:0 or cpu:0 is hidden (KILN_DEVICE='%s'): %s\n",
           getenv("KILN_DEVICE") ? getenv("KILN_DEVICE") : "", kiln_last_error());
    return 77;
  }
  if (kiln_device_find("cuda:1", &gpu2) != KILN_OK) gpu2 = NULL;
  kiln_clear_error();

  Suite *suite = suite_create("cuda");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 300);
  tcase_add_checked_fixture(tc, NULL, providers_reset);
  tcase_add_test(tc, test_describes_the_device);
  tcase_add_test(tc, test_buffer_round_trip);
  tcase_add_test(tc, test_pageable_transfers_are_staged);
  tcase_add_test(tc, test_copies_between_devices);
  tcase_add_test(tc, test_events_time_work);
  tcase_add_test(tc, test_cublas_and_native_matmul_agree);
  tcase_add_test(tc, test_tf32_off_by_default);
  tcase_add_test(tc, test_cudnn_and_native_agree);
  tcase_add_test(tc, test_cast_runs);
  tcase_add_test(tc, test_cast_every_pair_matches_cpu);
  tcase_add_test(tc, test_fill_and_arange_every_dtype_match_cpu);
  tcase_add_test(tc, test_elementwise_every_dtype_matches_cpu);
  tcase_add_test(tc, test_column_reduction_of_a_long_axis);
  tcase_add_test(tc, test_reductions_every_dtype_match_cpu);
  tcase_add_test(tc, test_random_every_float_dtype_matches_cpu);
  tcase_add_test(tc, test_matmul_every_float_dtype_matches_cpu);
  tcase_add_test(tc, test_conv2d_f64_matches_cpu);
  tcase_add_test(tc, test_native_matmul_of_many_rows);
  suite_add_tcase(suite, tc);
  SRunner *runner = srunner_create(suite);
  /* CUDA cannot be used in a child forked after it started: run in-process. */
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  kiln_deinitialize();
  return failed == 0 ? 0 : 1;
}
