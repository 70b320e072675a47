/* tests/opencl/test_opencl_dtypes.c: every dtype on every OpenCL device against cpu:0, bit for bit: casts of every pair, fill, arange, copies. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../common.h"

/* Run with KILN_OPENCL_NO_FP64=1 (the suite opencl-dtypes-no-fp64), every
 * device is taken as lacking cl_khr_fp64: f64 ops must be refused naming
 * it, and every other dtype takes the kernels such devices get. */
static bool no_fp64(void) {
  const char *v = getenv("KILN_OPENCL_NO_FP64");
  return v && *v && strcmp(v, "0") != 0;
}

static kiln_device_t *cpu_device(void) {
  kiln_device_t *d = NULL;
  KT_OK(kiln_device_find("cpu:0", &d));
  return d;
}

static size_t opencl_devices(kiln_device_t **out, size_t capacity) {
  KT_OK(kiln_ensure_initialized());
  size_t count = 0, n = 0;
  KT_OK(kiln_device_count(&count));
  for (size_t i = 0; i < count && n < capacity; i++) {
    kiln_device_t *d = NULL;
    KT_OK(kiln_device_get(i, &d));
    kiln_device_info_t info;
    KT_OK(kiln_device_info(d, &info));
    if (!strcmp(info.backend, "opencl"))
      out[n++] = d;
    else
      kiln_device_release(d);
  }
  return n;
}

static void release_all(kiln_device_t **devices, size_t n) {
  for (size_t i = 0; i < n; i++) kiln_device_release(devices[i]);
}

/* Whether the device should compute `dtype`. */
static bool computes(kiln_dtype_t dtype) { return dtype != KILN_F64 || !no_fp64(); }

/* The refusal an f64 op gets on a device without fp64. */
static void check_refused(kiln_status_t status, const char *what) {
  ck_assert_msg(status == KILN_UNSUPPORTED, "%s on a device without fp64 gave %s: %s", what, kiln_status_name(status),
                kiln_last_error());
  ck_assert_msg(strstr(kiln_last_error(), "cl_khr_fp64") && strstr(kiln_last_error(), "opencl:"),
                "%s: the refusal does not name the device and cl_khr_fp64: %s", what, kiln_last_error());
}

/* got (from an OpenCL device) and want (cpu:0): the same dtype, shape and bits. */
static void check_same(const char *what, kiln_device_t *device, const kiln_tensor_t *got, const kiln_tensor_t *want) {
  ck_assert_int_eq(kiln_tensor_dtype(got), kiln_tensor_dtype(want));
  const size_t n = (size_t)kiln_tensor_numel(want), es = kiln_dtype_size(kiln_tensor_dtype(want));
  ck_assert_int_eq((int64_t)n, kiln_tensor_numel(got));
  unsigned char *a = malloc(n * es + 1), *b = malloc(n * es + 1);
  ck_assert(a && b);
  KT_OK(kiln_tensor_read(got, a, n * es));
  KT_OK(kiln_tensor_read(want, b, n * es));
  for (size_t i = 0; i < n; i++) {
    if (memcmp(a + i * es, b + i * es, es) == 0) continue;
    uint64_t ga = 0, wb = 0;
    memcpy(&ga, a + i * es, es);
    memcpy(&wb, b + i * es, es);
    ck_abort_msg("%s on %s: element %zu is 0x%llx, cpu:0 has 0x%llx (%s)", what, kiln_device_selector(device), i,
                 (unsigned long long)ga, (unsigned long long)wb, kiln_dtype_name(kiln_tensor_dtype(want)));
  }
  free(a);
  free(b);
}

/* Values every cast must get right, as doubles: cast on cpu:0 to the source
 * dtype first, so they are that dtype's values (rounded, saturated). */
static const double specials[] = {
    0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 0.49999997, 127.0, 127.5, 128.0, -128.0, -129.0, 255.0,
    255.9, 256.0, -1.0e-3, 32767.0, 32768.0, -32769.0, 65504.0, 65519.0, 65520.0, 65536.0, 1.0e5, -1.0e5,
    2147483520.0, 2147483647.0, 2147483648.0, -2147483649.0, 4294967296.5, 9.2233720368547758e18,
    -9.2233720368547758e18, 1.8e19, -1.8e19, 1.0e30, -3.4028234e38, 3.5e38, 1.0e300, -1.0e300, 5.96e-8, 2.98e-8,
    6.1e-5, 1.0e-40, -1.4e-45, 1.0e-310, 0.1, 1.0 / 3.0, 16777217.0, 9007199254740993.0, 3.0e-39, 1.0e-39,
    INFINITY, -INFINITY, NAN, -NAN};
#define N_SPECIALS (sizeof specials / sizeof specials[0])
#define N_RANDOM 512

/* Source data of `dtype` on cpu:0: the specials, then raw random bits (NaN
 * payloads, subnormals, every integer range; bool stays 0/1). */
static kiln_tensor_t *source_data(kiln_device_t *cpu, kiln_dtype_t dtype) {
  const int64_t ns = (int64_t)N_SPECIALS, n = ns + N_RANDOM;
  const size_t es = kiln_dtype_size(dtype);
  kiln_tensor_t *sp = NULL, *sc = NULL, *all = NULL;
  KT_OK(kiln_tensor_from_host(cpu, KILN_F64, 1, &ns, specials, &sp));
  KT_OK(kiln_tensor_cast(sp, dtype, &sc));
  unsigned char *host = malloc((size_t)n * es);
  ck_assert(host);
  KT_OK(kiln_tensor_read(sc, host, (size_t)ns * es));
  uint64_t state = 0x9e3779b97f4a7c15ull ^ (uint64_t)dtype;
  for (size_t i = (size_t)ns * es; i < (size_t)n * es; i++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    host[i] = (unsigned char)(state >> 56);
    if (dtype == KILN_BOOL) host[i] &= 1u;
  }
  KT_OK(kiln_tensor_from_host(cpu, dtype, 1, &n, host, &all));
  free(host);
  kiln_tensor_release(sp);
  kiln_tensor_release(sc);
  return all;
}

/* CAST of every pair from a contiguous tensor and from a transposed view,
 * and COPY of each dtype (contiguous() of the view), against cpu:0. */
START_TEST(test_cast_every_pair) {
  kiln_device_t *devices[8], *cpu = cpu_device();
  const size_t nd = opencl_devices(devices, 8);
  for (size_t d = 0; d < nd; d++) {
    for (int s = 0; s < KILN_DTYPE_COUNT_; s++) {
      kiln_tensor_t *src_cpu = source_data(cpu, (kiln_dtype_t)s), *src_dev = NULL;
      KT_OK(kiln_tensor_to(src_cpu, devices[d], &src_dev));
      /* A [rows, 2] view of the data transposed: the strided walk. */
      const int64_t total = kiln_tensor_numel(src_cpu), shape2[2] = {total / 2, 2};
      kiln_tensor_t *cpu2 = NULL, *dev2 = NULL, *cpu_t = NULL, *dev_t = NULL;
      KT_OK(kiln_tensor_reshape(src_cpu, 2, shape2, &cpu2));
      KT_OK(kiln_tensor_reshape(src_dev, 2, shape2, &dev2));
      KT_OK(kiln_tensor_transpose(cpu2, 0, 1, &cpu_t));
      KT_OK(kiln_tensor_transpose(dev2, 0, 1, &dev_t));
      char what[96];
      if (computes((kiln_dtype_t)s)) {
        kiln_tensor_t *want = NULL, *got = NULL;
        KT_OK(kiln_tensor_contiguous(cpu_t, &want));
        KT_OK(kiln_tensor_contiguous(dev_t, &got));
        snprintf(what, sizeof what, "copy of a transposed %s view", kiln_dtype_name((kiln_dtype_t)s));
        check_same(what, devices[d], got, want);
        kiln_tensor_release(want);
        kiln_tensor_release(got);
      }
      for (int t = 0; t < KILN_DTYPE_COUNT_; t++) {
        if (t == s) continue;
        kiln_tensor_t *want = NULL, *got = NULL;
        snprintf(what, sizeof what, "cast %s -> %s", kiln_dtype_name((kiln_dtype_t)s), kiln_dtype_name((kiln_dtype_t)t));
        if (!computes((kiln_dtype_t)s) || !computes((kiln_dtype_t)t)) {
          check_refused(kiln_tensor_cast(src_dev, (kiln_dtype_t)t, &got), what);
          continue;
        }
        KT_OK(kiln_tensor_cast(src_cpu, (kiln_dtype_t)t, &want));
        KT_OK(kiln_tensor_cast(src_dev, (kiln_dtype_t)t, &got));
        check_same(what, devices[d], got, want);
        kiln_tensor_release(want);
        kiln_tensor_release(got);
        KT_OK(kiln_tensor_cast(cpu_t, (kiln_dtype_t)t, &want));
        KT_OK(kiln_tensor_cast(dev_t, (kiln_dtype_t)t, &got));
        strncat(what, " (transposed)", sizeof what - strlen(what) - 1);
        check_same(what, devices[d], got, want);
        kiln_tensor_release(want);
        kiln_tensor_release(got);
      }
      kiln_tensor_release(cpu_t);
      kiln_tensor_release(dev_t);
      kiln_tensor_release(cpu2);
      kiln_tensor_release(dev2);
      kiln_tensor_release(src_cpu);
      kiln_tensor_release(src_dev);
    }
  }
  release_all(devices, nd);
  kiln_device_release(cpu);
}
END_TEST

/* FILL (kiln_tensor_full) and ARANGE of every dtype against cpu:0. */
START_TEST(test_fill_arange_every_dtype) {
  kiln_device_t *devices[8], *cpu = cpu_device();
  const size_t nd = opencl_devices(devices, 8);
  const double values[] = {0.0, -0.0, 1.5, -2.75, 300.7, -70000.0, 1.0e10, 3.0e38, 1.0e-30, INFINITY, NAN};
  /* start, stop, step */
  const double ranges[][3] = {{0.0, 1000.0, 1.0},   {-3.5, 60.0, 0.25},  {0.1, 100.0, 0.1},  {1000.0, -1000.0, -7.3},
                              {-2.0, 2.0, 1.0 / 3.0}, {65000.0, 66000.0, 3.5}, {1.0e9, 1.0e9 + 3000.0, 1.0},
                              {-300.0, 300.0, 1.7}};
  const int64_t shape[2] = {3, 37};
  for (size_t d = 0; d < nd; d++)
    for (int t = 0; t < KILN_DTYPE_COUNT_; t++) {
      const kiln_dtype_t dtype = (kiln_dtype_t)t;
      char what[96];
      for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
        kiln_tensor_t *want = NULL, *got = NULL;
        snprintf(what, sizeof what, "full(%g) of %s", values[v], kiln_dtype_name(dtype));
        if (!computes(dtype)) {
          check_refused(kiln_tensor_full(devices[d], dtype, 2, shape, values[v], &got), what);
          continue;
        }
        KT_OK(kiln_tensor_full(cpu, dtype, 2, shape, values[v], &want));
        KT_OK(kiln_tensor_full(devices[d], dtype, 2, shape, values[v], &got));
        check_same(what, devices[d], got, want);
        kiln_tensor_release(want);
        kiln_tensor_release(got);
      }
      for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        kiln_tensor_t *want = NULL, *got = NULL;
        snprintf(what, sizeof what, "arange(%g, %g, %g) of %s", ranges[r][0], ranges[r][1], ranges[r][2],
                 kiln_dtype_name(dtype));
        if (!computes(dtype)) {
          check_refused(kiln_tensor_arange(devices[d], dtype, ranges[r][0], ranges[r][1], ranges[r][2], &got), what);
          continue;
        }
        KT_OK(kiln_tensor_arange(cpu, dtype, ranges[r][0], ranges[r][1], ranges[r][2], &want));
        KT_OK(kiln_tensor_arange(devices[d], dtype, ranges[r][0], ranges[r][1], ranges[r][2], &got));
        check_same(what, devices[d], got, want);
        kiln_tensor_release(want);
        kiln_tensor_release(got);
      }
    }
  release_all(devices, nd);
  kiln_device_release(cpu);
}
END_TEST

/* What each device says it serves. */
START_TEST(test_dtype_support) {
  kiln_device_t *devices[8];
  const size_t nd = opencl_devices(devices, 8);
  for (size_t d = 0; d < nd; d++) {
    kiln_device_info_t info;
    KT_OK(kiln_device_info(devices[d], &info));
    for (int t = 0; t < KILN_DTYPE_COUNT_; t++) {
      const kiln_dtype_t dtype = (kiln_dtype_t)t;
      const kiln_dtype_support_t want = dtype == KILN_F16 || dtype == KILN_BF16 ? KILN_DTYPE_EMULATED
                                        : dtype == KILN_F64 && (no_fp64() || !info.fp64) ? KILN_DTYPE_UNSUPPORTED
                                                                                          : KILN_DTYPE_NATIVE;
      ck_assert_msg(kiln_device_dtype_support(devices[d], dtype) == want, "%s serves %s as %s, expected %s",
                    kiln_device_selector(devices[d]), kiln_dtype_name(dtype),
                    kiln_dtype_support_name(kiln_device_dtype_support(devices[d], dtype)),
                    kiln_dtype_support_name(want));
    }
  }
  release_all(devices, nd);
}
END_TEST

int main(void) {
  const char *cache_dir = kt_private_cache_dir();
  if (cache_dir && !getenv("POCL_CACHE_DIR")) {
    char pocl[4200];
    snprintf(pocl, sizeof pocl, "%s/pocl", cache_dir);
    setenv("POCL_CACHE_DIR", pocl, 1);
  }
  kiln_device_t *devices[8];
  if (kiln_ensure_initialized() != KILN_OK) {
    printf("skipped: kiln did not start: %s\n", kiln_last_error());
    return 77;
  }
  size_t nd = 0, count = 0;
  if (kiln_device_count(&count) == KILN_OK)
    for (size_t i = 0; i < count; i++) {
      kiln_device_t *d = NULL;
      kiln_device_info_t info;
      if (kiln_device_get(i, &d) != KILN_OK) continue;
      if (kiln_device_info(d, &info) == KILN_OK && !strcmp(info.backend, "opencl")) nd++;
      kiln_device_release(d);
    }
  (void)devices;
  kiln_deinitialize();
  if (nd == 0) {
    printf("skipped: no OpenCL device is visible\n");
    return 77;
  }
  Suite *suite = suite_create("opencl-dtypes");
  TCase *tc = tcase_create("dtypes");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_dtype_support);
  tcase_add_test(tc, test_fill_arange_every_dtype);
  tcase_add_test(tc, test_cast_every_pair);
  suite_add_tcase(suite, tc);
  SRunner *runner = srunner_create(suite);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed ? 1 : 0;
}
