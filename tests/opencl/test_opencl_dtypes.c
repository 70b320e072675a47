/* tests/opencl/test_opencl_dtypes.c: every dtype on every OpenCL device against cpu:0, bit for bit: casts of every pair, fill, arange, copies, the arithmetic; matmul and conv2d in f64, f16 and bf16 within their bounds. */
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

/* Whether `bits` (the low bytes) are a NaN of the float dtype. */
static bool is_nan_bits(kiln_dtype_t dtype, uint64_t bits) {
  switch (dtype) {
  case KILN_F16: return (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu);
  case KILN_BF16: return (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu);
  case KILN_F32: return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu);
  default: return (bits & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (bits & 0xfffffffffffffull);
  }
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
  const kiln_dtype_t dtype = kiln_tensor_dtype(want);
  for (size_t i = 0; i < n; i++) {
    if (memcmp(a + i * es, b + i * es, es) == 0) continue;
    uint64_t ga = 0, wb = 0;
    memcpy(&ga, a + i * es, es);
    memcpy(&wb, b + i * es, es);
    /* A NaN matches a NaN: max returns the element on the CPU (its payload
     * as stored, a signalling one too) and the f32 computation's quiet NaN
     * on OpenCL. */
    if (kiln_dtype_class(dtype) == KILN_DTYPE_CLASS_FLOAT && is_nan_bits(dtype, ga) && is_nan_bits(dtype, wb))
      continue;
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
      for (size_t r = 0; dtype != KILN_BOOL && r < sizeof ranges / sizeof ranges[0]; r++) {
        /* Without fp64 the kernels evaluate start + i*step in double-float,
         * more exactly than the CPU's two double roundings: only steps the
         * double arithmetic holds exactly (dyadic) are sure to agree. */
        const double scaled = ranges[r][2] * 4.0;
        if (no_fp64() && scaled != (double)(int64_t)scaled) continue;
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

/* The ordered position of a float's bits (sign-magnitude to a line), for
 * distances in units in the last place; NaN reported as INT64_MIN. */
static int64_t float_order(uint64_t bits, kiln_dtype_t dtype) {
  const int w = (int)kiln_dtype_size(dtype) * 8;
  const uint64_t sign = 1ull << (w - 1), mag = bits & (sign - 1);
  const uint64_t inf = dtype == KILN_F16 ? 0x7c00u : dtype == KILN_BF16 ? 0x7f80u : dtype == KILN_F32 ? 0x7f800000u
                                                                                                      : 0x7ff0000000000000ull;
  if (mag > inf) return INT64_MIN;
  return bits & sign ? -(int64_t)mag : (int64_t)mag;
}

/* got and want within `ulps` of each other (both NaN counts as equal);
 * ulps 0: the same bits. */
static void check_close(const char *what, kiln_device_t *device, const kiln_tensor_t *got, const kiln_tensor_t *want,
                        int64_t ulps) {
  if (ulps == 0) {
    check_same(what, device, got, want);
    return;
  }
  const kiln_dtype_t dtype = kiln_tensor_dtype(want);
  const size_t n = (size_t)kiln_tensor_numel(want), es = kiln_dtype_size(dtype);
  unsigned char *a = malloc(n * es + 1), *b = malloc(n * es + 1);
  ck_assert(a && b);
  KT_OK(kiln_tensor_read(got, a, n * es));
  KT_OK(kiln_tensor_read(want, b, n * es));
  for (size_t i = 0; i < n; i++) {
    uint64_t ga = 0, wb = 0;
    memcpy(&ga, a + i * es, es);
    memcpy(&wb, b + i * es, es);
    const int64_t oa = float_order(ga, dtype), ob = float_order(wb, dtype);
    const bool ok = (oa == INT64_MIN && ob == INT64_MIN) ||
                    (oa != INT64_MIN && ob != INT64_MIN && (oa > ob ? oa - ob : ob - oa) <= ulps);
    ck_assert_msg(ok, "%s on %s: element %zu is 0x%llx, cpu:0 has 0x%llx (%s, more than %lld ulp apart)", what,
                  kiln_device_selector(device), i, (unsigned long long)ga, (unsigned long long)wb,
                  kiln_dtype_name(dtype), (long long)ulps);
  }
  free(a);
  free(b);
}

/* How far a formula's result may be from the CPU's: none for the exact
 * operations (IEEE arithmetic rounds once; the f16/bf16 ones compute in f32
 * and round once more, the same way on both). The transcendental ones
 * (exp, log, tanh, sigmoid; sqrt and division where the driver may not
 * round correctly) go through each platform's libm: OpenCL C allows up to 3
 * or 4 ulp for them in float and double, so f32 and f64 are allowed 4 ulp,
 * and f16/bf16, whose f32 result is rounded again, one unit of the dtype
 * (a float a few ulp away can land on the other side of a rounding
 * midpoint, never further). */
static int64_t formula_ulps(kiln_dtype_t dtype, bool transcendental) {
  if (!transcendental || kiln_dtype_class(dtype) != KILN_DTYPE_CLASS_FLOAT) return 0;
  return dtype == KILN_F16 || dtype == KILN_BF16 ? 1 : 4;
}

/* Run `call` on cpu:0 and on the device: both refused alike, or both done
 * and compared. */
#define KT_BOTH(what, ulps, served, CALL_CPU, CALL_DEV)                                                     \
  do {                                                                                              \
    kiln_tensor_t *want = NULL, *got = NULL;                                                        \
    const kiln_status_t sc = (CALL_CPU);                                                            \
    if (sc != KILN_OK) {                                                                            \
      const kiln_status_t sd = (CALL_DEV);                                                          \
      ck_assert_msg(sd == sc, "%s: cpu:0 gave %s, %s gave %s: %s", what, kiln_status_name(sc),      \
                    kiln_device_selector(devices[d]), kiln_status_name(sd), kiln_last_error());     \
      break;                                                                                        \
    }                                                                                               \
    if (!(served)) {                                                                                \
      check_refused((CALL_DEV), what);                                                              \
      kiln_tensor_release(want);                                                                    \
      break;                                                                                        \
    }                                                                                               \
    KT_OK(CALL_DEV);                                                                                \
    check_close(what, devices[d], got, want, (ulps));                                               \
    kiln_tensor_release(want);                                                                      \
    kiln_tensor_release(got);                                                                       \
  } while (0)

/* UNARY, BINARY, BINARY_SCALAR, COMPARE and WHERE of every dtype, from the
 * specials and random bits (a) against b, the same data reversed, and a
 * broadcast row, against cpu:0. */
START_TEST(test_elementwise_every_dtype) {
  kiln_device_t *devices[8], *cpu = cpu_device();
  const size_t nd = opencl_devices(devices, 8);
  const double scalars[] = {2.5, -3.0, 0.0, 1.0e-3, 300.0};
  for (size_t d = 0; d < nd; d++)
    for (int t = 0; t < KILN_DTYPE_COUNT_; t++) {
      const kiln_dtype_t dt = (kiln_dtype_t)t;
      kiln_tensor_t *a_cpu = source_data(cpu, dt), *b_cpu = NULL, *a_dev = NULL, *b_dev = NULL;
      const int64_t n = kiln_tensor_numel(a_cpu), two[2] = {2, n / 2};
      /* b: a's rows swapped, so every special meets others. */
      {
        const int64_t shape1[1] = {n};
        unsigned char *host = malloc((size_t)n * kiln_dtype_size(dt));
        KT_OK(kiln_tensor_read(a_cpu, host, (size_t)n * kiln_dtype_size(dt)));
        const size_t es = kiln_dtype_size(dt), half = (size_t)n / 2 * es;
        unsigned char *swapped = malloc((size_t)n * es);
        memcpy(swapped, host + half, half);
        memcpy(swapped + half, host, half);
        KT_OK(kiln_tensor_from_host(cpu, dt, 1, shape1, swapped, &b_cpu));
        free(host);
        free(swapped);
      }
      KT_OK(kiln_tensor_to(a_cpu, devices[d], &a_dev));
      KT_OK(kiln_tensor_to(b_cpu, devices[d], &b_dev));
      char what[128];
      for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
        const bool tr = op == KILN_UNARY_EXP || op == KILN_UNARY_LOG || op == KILN_UNARY_SQRT ||
                        op == KILN_UNARY_SIGMOID || op == KILN_UNARY_TANH;
        snprintf(what, sizeof what, "unary %d of %s", op, kiln_dtype_name(dt));
        KT_BOTH(what, formula_ulps(dt, tr), computes(dt), kiln_tensor_unary((kiln_unary_op_t)op, a_cpu, &want),
                kiln_tensor_unary((kiln_unary_op_t)op, a_dev, &got));
      }
      for (int op = 0; op < KILN_BINARY_COUNT_; op++) {
        const bool tr = op == KILN_BINARY_DIV;
        snprintf(what, sizeof what, "binary %d of %s", op, kiln_dtype_name(dt));
        KT_BOTH(what, formula_ulps(dt, tr), computes(dt), kiln_tensor_binary((kiln_binary_op_t)op, a_cpu, b_cpu, &want),
                kiln_tensor_binary((kiln_binary_op_t)op, a_dev, b_dev, &got));
        for (size_t k = 0; k < sizeof scalars / sizeof scalars[0]; k++) {
          snprintf(what, sizeof what, "binary %d of %s and the scalar %g", op, kiln_dtype_name(dt), scalars[k]);
          KT_BOTH(what, formula_ulps(dt, tr), computes(dt),
                  kiln_tensor_binary_scalar((kiln_binary_op_t)op, a_cpu, scalars[k], &want),
                  kiln_tensor_binary_scalar((kiln_binary_op_t)op, a_dev, scalars[k], &got));
        }
        /* Broadcast: [2, n/2] against its first row [1, n/2] (stride 0). */
        kiln_tensor_t *a2d = NULL, *row_cpu = NULL, *row_dev = NULL, *a2c = NULL;
        const int64_t one[2] = {1, n / 2};
        KT_OK(kiln_tensor_reshape(a_dev, 2, two, &a2d));
        KT_OK(kiln_tensor_reshape(a_cpu, 2, two, &a2c));
        {
          /* the first row of b as its own tensor */
          unsigned char *host = malloc((size_t)n * kiln_dtype_size(dt));
          KT_OK(kiln_tensor_read(b_cpu, host, (size_t)n * kiln_dtype_size(dt)));
          KT_OK(kiln_tensor_from_host(cpu, dt, 2, one, host, &row_cpu));
          KT_OK(kiln_tensor_to(row_cpu, devices[d], &row_dev));
          free(host);
        }
        snprintf(what, sizeof what, "binary %d of %s, broadcast", op, kiln_dtype_name(dt));
        KT_BOTH(what, formula_ulps(dt, tr), computes(dt), kiln_tensor_binary((kiln_binary_op_t)op, a2c, row_cpu, &want),
                kiln_tensor_binary((kiln_binary_op_t)op, a2d, row_dev, &got));
        kiln_tensor_release(a2d);
        kiln_tensor_release(a2c);
        kiln_tensor_release(row_cpu);
        kiln_tensor_release(row_dev);
      }
      for (int op = 0; op < KILN_COMPARE_COUNT_; op++) {
        snprintf(what, sizeof what, "compare %d of %s", op, kiln_dtype_name(dt));
        KT_BOTH(what, 0, computes(dt), kiln_tensor_compare((kiln_compare_op_t)op, a_cpu, b_cpu, &want),
                kiln_tensor_compare((kiln_compare_op_t)op, a_dev, b_dev, &got));
      }
      /* WHERE: a (this dtype) as the condition of its own dtype's values
       * and of f16's (-0 and NaN conditions), and of i64's (8-byte values).
       * (Each pair is a kernel PoCL compiles at its first launch: every
       * pair would take minutes.) */
      const kiln_dtype_t value_dtypes[3] = {dt, KILN_F16, KILN_I64};
      for (int v = 0; v < 3; v++) {
        const kiln_dtype_t vt = value_dtypes[v];
        kiln_tensor_t *x_cpu = source_data(cpu, vt), *x_dev = NULL, *z_cpu = NULL, *z_dev = NULL;
        KT_OK(kiln_tensor_zeros(cpu, vt, 1, &n, &z_cpu));
        KT_OK(kiln_tensor_to(x_cpu, devices[d], &x_dev));
        KT_OK(kiln_tensor_to(z_cpu, devices[d], &z_dev));
        snprintf(what, sizeof what, "where(%s cond, %s, %s)", kiln_dtype_name(dt), kiln_dtype_name(vt),
                 kiln_dtype_name(vt));
        KT_BOTH(what, 0, computes(dt) && computes(vt), kiln_tensor_where(a_cpu, x_cpu, z_cpu, &want),
                kiln_tensor_where(a_dev, x_dev, z_dev, &got));
        kiln_tensor_release(x_cpu);
        kiln_tensor_release(x_dev);
        kiln_tensor_release(z_cpu);
        kiln_tensor_release(z_dev);
      }
      kiln_tensor_release(a_cpu);
      kiln_tensor_release(b_cpu);
      kiln_tensor_release(a_dev);
      kiln_tensor_release(b_dev);
    }
  release_all(devices, nd);
  kiln_device_release(cpu);
}
END_TEST

/* Small quarters (floats) or small integers, whose sums every accumulator
 * holds exactly, as `dtype` on cpu:0: [rows, cols]. */
static kiln_tensor_t *small_values(kiln_device_t *cpu, kiln_dtype_t dtype, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols, shape[2] = {rows, cols};
  double *v = malloc((size_t)n * sizeof *v);
  ck_assert(v);
  const double unit = kiln_dtype_class(dtype) == KILN_DTYPE_CLASS_FLOAT ? 0.25 : 1.0;
  for (int64_t i = 0; i < n; i++) v[i] = dtype == KILN_BOOL ? (double)(i % 3 == 0) : (double)((i * 7) % 17 - 8) * unit;
  kiln_tensor_t *d = NULL, *t = NULL;
  KT_OK(kiln_tensor_from_host(cpu, KILN_F64, 2, shape, v, &d));
  KT_OK(kiln_tensor_cast(d, dtype, &t));
  kiln_tensor_release(d);
  free(v);
  return t;
}

/* REDUCE of every dtype against cpu:0: sums (integers and bool into i64,
 * sum_to keeping the dtype), max and argmax (random bits with NaN: NaN
 * wins, ties go to the first index), mean and norm, over rows (inner 1),
 * columns (inner > 1) and one long row split into chunks. Sums of small
 * values are exact in every accumulator, so they must agree bit for bit;
 * mean and norm divide or take a root once more (1 unit of the dtype). */
START_TEST(test_reduce_every_dtype) {
  kiln_device_t *devices[8], *cpu = cpu_device();
  const size_t nd = opencl_devices(devices, 8);
  for (size_t d = 0; d < nd; d++)
    for (int t = 0; t < KILN_DTYPE_COUNT_; t++) {
      const kiln_dtype_t dt = (kiln_dtype_t)t;
      const int64_t shapes[3][2] = {{6, 37}, {37, 6}, {1, 20000}};
      char what[128];
      for (int sh = 0; sh < 3; sh++) {
        kiln_tensor_t *s_cpu = small_values(cpu, dt, shapes[sh][0], shapes[sh][1]), *s_dev = NULL;
        KT_OK(kiln_tensor_to(s_cpu, devices[d], &s_dev));
        for (int axis = 0; axis < 2; axis++) {
          snprintf(what, sizeof what, "sum of %s [%lld, %lld] axis %d", kiln_dtype_name(dt), (long long)shapes[sh][0],
                   (long long)shapes[sh][1], axis);
          KT_BOTH(what, 0, computes(dt), kiln_tensor_sum(s_cpu, axis, false, &want),
                  kiln_tensor_sum(s_dev, axis, false, &got));
          snprintf(what, sizeof what, "mean of %s axis %d", kiln_dtype_name(dt), axis);
          KT_BOTH(what, formula_ulps(dt, true) ? 1 : 0, computes(dt), kiln_tensor_mean(s_cpu, axis, false, &want),
                  kiln_tensor_mean(s_dev, axis, false, &got));
          const int64_t to_shape[2] = {axis == 0 ? 1 : shapes[sh][0], axis == 0 ? shapes[sh][1] : 1};
          snprintf(what, sizeof what, "sum_to of %s axis %d", kiln_dtype_name(dt), axis);
          KT_BOTH(what, 0, computes(dt), kiln_tensor_sum_to(s_cpu, 2, to_shape, &want),
                  kiln_tensor_sum_to(s_dev, 2, to_shape, &got));
        }
        snprintf(what, sizeof what, "norm of %s", kiln_dtype_name(dt));
        KT_BOTH(what, formula_ulps(dt, true) ? 1 : 0, computes(dt), kiln_tensor_norm(s_cpu, &want),
                kiln_tensor_norm(s_dev, &got));
        kiln_tensor_release(s_cpu);
        kiln_tensor_release(s_dev);
      }
      kiln_tensor_t *a_cpu = source_data(cpu, dt), *a_dev = NULL, *a2_cpu = NULL, *a2_dev = NULL;
      const int64_t n = kiln_tensor_numel(a_cpu), shape2[2] = {2, n / 2};
      KT_OK(kiln_tensor_to(a_cpu, devices[d], &a_dev));
      KT_OK(kiln_tensor_reshape(a_cpu, 2, shape2, &a2_cpu));
      KT_OK(kiln_tensor_reshape(a_dev, 2, shape2, &a2_dev));
      for (int axis = 0; axis < 2; axis++) {
        snprintf(what, sizeof what, "max of %s axis %d", kiln_dtype_name(dt), axis);
        KT_BOTH(what, 0, computes(dt), kiln_tensor_max(a2_cpu, axis, false, &want),
                kiln_tensor_max(a2_dev, axis, false, &got));
        snprintf(what, sizeof what, "argmax of %s axis %d", kiln_dtype_name(dt), axis);
        KT_BOTH(what, 0, computes(dt), kiln_tensor_argmax(a2_cpu, axis, false, &want),
                kiln_tensor_argmax(a2_dev, axis, false, &got));
        if (kiln_dtype_class(dt) != KILN_DTYPE_CLASS_FLOAT) {
          snprintf(what, sizeof what, "sum of random %s axis %d", kiln_dtype_name(dt), axis);
          KT_BOTH(what, 0, computes(dt), kiln_tensor_sum(a2_cpu, axis, false, &want),
                  kiln_tensor_sum(a2_dev, axis, false, &got));
        }
      }
      kiln_tensor_release(a2_cpu);
      kiln_tensor_release(a2_dev);
      kiln_tensor_release(a_cpu);
      kiln_tensor_release(a_dev);
    }
  release_all(devices, nd);
  kiln_device_release(cpu);
}
END_TEST

/* ---- matmul and conv2d in f64, f16 and bf16 ------------------------------------------ */

/* Values of `dtype` on cpu:0 in the shape: quarters in [-2, 2] (`exact`:
 * every sum of their products is exact in f32 and f64, so both devices
 * round the same sum once and must agree bit for bit), or uniform in
 * [-1, 1) from `seed` (sums whose order differs: compared within the
 * dtype's bound). */
static kiln_tensor_t *linear_values(kiln_device_t *cpu, kiln_dtype_t dtype, int ndim, const int64_t *shape, bool exact,
                                    uint64_t seed) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
  ck_assert(v);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < n; i++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = exact ? (double)((i * 7 + (int64_t)seed) % 17 - 8) * 0.25 : (double)(state >> 11) * 0x1p-52 - 1.0;
  }
  kiln_tensor_t *d = NULL, *t = NULL;
  KT_OK(kiln_tensor_from_host(cpu, KILN_F64, ndim, shape, v, &d));
  KT_OK(kiln_tensor_cast(d, dtype, &t));
  kiln_tensor_release(d);
  free(v);
  return t;
}

/* A matmul (trans_a, trans_b) or, with `conv`, a conv2d (bias when a third
 * operand is given); or, by `grad`, one of the training kinds that take f16
 * and bf16 through f32: conv2d's input gradient (dy, w; `shape` is x's),
 * its weight gradient (x, dy; `shape` is w's), max_pool2d (x) and its
 * gradient (x, dy). */
typedef enum linear_grad_t { LINEAR_NONE, LINEAR_CONV_DX, LINEAR_CONV_DW, LINEAR_POOL, LINEAR_POOL_DX } linear_grad_t;
typedef struct linear_op_t {
  bool conv, trans_a, trans_b;
  kiln_conv2d_params_t params;
  linear_grad_t grad;
  int64_t shape[4];
  kiln_pool2d_params_t pool;
} linear_op_t;

static kiln_status_t linear_run(const linear_op_t *o, kiln_tensor_t *const *in, int n_in, kiln_tensor_t **out) {
  switch (o->grad) {
  case LINEAR_CONV_DX: return kiln_tensor_conv2d_backward_input(in[0], in[1], o->shape, &o->params, out);
  case LINEAR_CONV_DW: return kiln_tensor_conv2d_backward_weight(in[0], in[1], o->shape, &o->params, out);
  case LINEAR_POOL: return kiln_tensor_max_pool2d(in[0], &o->pool, out);
  case LINEAR_POOL_DX: return kiln_tensor_max_pool2d_backward(in[0], in[1], &o->pool, out);
  case LINEAR_NONE: break;
  }
  if (o->conv) return kiln_tensor_conv2d(in[0], in[1], n_in > 2 ? in[2] : NULL, &o->params, out);
  return kiln_tensor_matmul(in[0], in[1], o->trans_a, o->trans_b, out);
}

/* The elements of a tensor as doubles (read through cpu:0). */
static double *linear_doubles(kiln_device_t *cpu, kiln_tensor_t *t) {
  kiln_tensor_t *on_cpu = NULL, *wide = NULL;
  KT_OK(kiln_tensor_to(t, cpu, &on_cpu));
  KT_OK(kiln_tensor_cast(on_cpu, KILN_F64, &wide));
  const size_t n = (size_t)kiln_tensor_numel(t);
  double *v = malloc((n ? n : 1) * sizeof *v);
  ck_assert(v);
  KT_OK(kiln_tensor_read(wide, v, n * sizeof *v));
  kiln_tensor_release(on_cpu);
  kiln_tensor_release(wide);
  return v;
}

/* The op on cpu:0 and on the device: the same dtype and shape exactly; the
 * same bits for exact data; else each element within rtol of the sum of
 * the magnitudes of its terms (the op on |operands| in f64: the bound of a
 * sum whose order differs), plus the dtype's smallest subnormal (f16). f64
 * without cl_khr_fp64 must be refused naming it. */
static void linear_check(const char *what, kiln_device_t *cpu, kiln_device_t *device, const linear_op_t *o,
                         kiln_tensor_t *const *in_cpu, int n_in, bool exact) {
  const kiln_dtype_t dtype = kiln_tensor_dtype(in_cpu[0]);
  kiln_tensor_t *in_dev[3] = {NULL, NULL, NULL}, *want = NULL, *got = NULL;
  for (int i = 0; i < n_in; i++) KT_OK(kiln_tensor_to(in_cpu[i], device, &in_dev[i]));
  KT_OK(linear_run(o, in_cpu, n_in, &want));
  if (!computes(dtype)) {
    check_refused(linear_run(o, in_dev, n_in, &got), what);
  } else {
    const kiln_status_t st = linear_run(o, in_dev, n_in, &got);
    ck_assert_msg(st == KILN_OK, "%s on %s: %s: %s", what, kiln_device_selector(device), kiln_status_name(st),
                  kiln_last_error());
    ck_assert_int_eq(kiln_tensor_dtype(got), dtype);
    ck_assert_int_eq(kiln_tensor_dtype(want), dtype);
    ck_assert_int_eq(kiln_tensor_ndim(got), kiln_tensor_ndim(want));
    for (int i = 0; i < kiln_tensor_ndim(want); i++)
      ck_assert_int_eq(kiln_tensor_shape(got)[i], kiln_tensor_shape(want)[i]);
    if (exact) {
      check_same(what, device, got, want);
    } else {
      kiln_tensor_t *abs_in[3] = {NULL, NULL, NULL}, *mag = NULL;
      for (int i = 0; i < n_in; i++) {
        kiln_tensor_t *wide = NULL;
        /* The convolution's gradients take no f64: their bound in f32. */
        KT_OK(kiln_tensor_cast(in_cpu[i], o->grad == LINEAR_NONE ? KILN_F64 : KILN_F32, &wide));
        KT_OK(kiln_tensor_unary(KILN_UNARY_ABS, wide, &abs_in[i]));
        kiln_tensor_release(wide);
      }
      KT_OK(linear_run(o, abs_in, n_in, &mag));
      const double rtol = dtype == KILN_F64 ? 1e-12 : dtype == KILN_F16 ? 1e-3 : 8e-3;
      const double atol = dtype == KILN_F16 ? 0x1p-24 : 0.0;
      double *g = linear_doubles(cpu, got), *w = linear_doubles(cpu, want), *m = linear_doubles(cpu, mag);
      for (int64_t i = 0; i < kiln_tensor_numel(want); i++)
        ck_assert_msg(fabs(g[i] - w[i]) <= rtol * m[i] + atol,
                      "%s on %s: element %lld is %.17g, cpu:0 has %.17g (%s, bound %g)", what,
                      kiln_device_selector(device), (long long)i, g[i], w[i], kiln_dtype_name(dtype),
                      rtol * m[i] + atol);
      free(g);
      free(w);
      free(m);
      for (int i = 0; i < n_in; i++) kiln_tensor_release(abs_in[i]);
      kiln_tensor_release(mag);
    }
  }
  kiln_tensor_release(want);
  kiln_tensor_release(got);
  for (int i = 0; i < n_in; i++) kiln_tensor_release(in_dev[i]);
}

/* MATMUL and CONV2D of f64, f16 and bf16 against cpu:0: transposes, a
 * batch over a shared B, k = 0 (zeros), 1 x 1 convolutions, strides,
 * padding, dilation and bias, each with exact and with random data. */
START_TEST(test_matmul_conv2d_every_float_dtype) {
  kiln_device_t *devices[8], *cpu = cpu_device();
  const size_t nd = opencl_devices(devices, 8);
  const kiln_dtype_t dtypes[3] = {KILN_F64, KILN_F16, KILN_BF16};
  static const struct {
    int na;
    int64_t a[3];
    int nb;
    int64_t b[3];
    bool ta, tb;
  } mm[] = {
      {2, {5, 37}, 2, {37, 6}, false, false},
      {2, {37, 5}, 2, {6, 37}, true, true},
      {2, {5, 37}, 2, {6, 37}, false, true},
      {3, {3, 5, 37}, 2, {37, 6}, false, false}, /* B shared by the batch */
      {3, {2, 4, 9}, 3, {2, 9, 3}, false, false},
      {2, {2, 0}, 2, {0, 3}, false, false},      /* k = 0: zeros */
  };
  static const struct {
    int64_t x[4], w[4];
    int stride[2], pad[2], dil[2];
    bool bias;
  } cv[] = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, {2, 1}, {1, 1}, {1, 1}, true},
      {{1, 5, 4, 4}, {3, 5, 1, 1}, {1, 1}, {0, 0}, {1, 1}, false}, /* pointwise */
      {{1, 2, 9, 8}, {3, 2, 3, 2}, {1, 2}, {0, 2}, {2, 1}, true},  /* dilation */
  };
  for (size_t d = 0; d < nd; d++)
    for (int t = 0; t < 3; t++) {
      const kiln_dtype_t dt = dtypes[t];
      char what[160];
      for (int exact = 0; exact < 2; exact++) {
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
          linear_op_t o = {.conv = false, .trans_a = mm[i].ta, .trans_b = mm[i].tb};
          kiln_tensor_t *in[2] = {linear_values(cpu, dt, mm[i].na, mm[i].a, exact, 2 * i + 1),
                                  linear_values(cpu, dt, mm[i].nb, mm[i].b, exact, 2 * i + 2)};
          snprintf(what, sizeof what, "matmul %zu of %s (%s data)", i, kiln_dtype_name(dt), exact ? "exact" : "random");
          linear_check(what, cpu, devices[d], &o, in, 2, exact);
          kiln_tensor_release(in[0]);
          kiln_tensor_release(in[1]);
        }
        for (size_t i = 0; i < sizeof cv / sizeof cv[0]; i++) {
          linear_op_t o = {.conv = true, .params = kiln_conv2d_params_default()};
          for (int a = 0; a < 2; a++) {
            o.params.stride[a] = cv[i].stride[a];
            o.params.padding[a] = cv[i].pad[a];
            o.params.dilation[a] = cv[i].dil[a];
          }
          const int64_t bias_shape[1] = {cv[i].w[0]};
          kiln_tensor_t *in[3] = {linear_values(cpu, dt, 4, cv[i].x, exact, 3 * i + 11),
                                  linear_values(cpu, dt, 4, cv[i].w, exact, 3 * i + 12),
                                  linear_values(cpu, dt, 1, bias_shape, exact, 3 * i + 13)};
          snprintf(what, sizeof what, "conv2d %zu of %s (%s data)", i, kiln_dtype_name(dt), exact ? "exact" : "random");
          linear_check(what, cpu, devices[d], &o, in, cv[i].bias ? 3 : 2, exact);
          for (int k = 0; k < 3; k++) kiln_tensor_release(in[k]);
        }
      }
    }
  release_all(devices, nd);
  kiln_device_release(cpu);
}
END_TEST

/* The training kinds whose OpenCL kernels are f32 (conv2d's two gradients,
 * max_pool2d's gradient) take f16 and bf16 through them, and max_pool2d
 * has 16-bit kernels: each against cpu:0, bit for bit on exact data and
 * within the dtype's bound on random data (the max_pool2d pair on exact
 * data: the sums of its gradient are few and exact there). */
START_TEST(test_training_kinds_16bit) {
  kiln_device_t *devices[8], *cpu = cpu_device();
  const size_t nd = opencl_devices(devices, 8);
  const kiln_dtype_t dtypes[2] = {KILN_F16, KILN_BF16};
  const int64_t xs[4] = {2, 3, 9, 8}, ws[4] = {4, 3, 3, 2}, ys[4] = {2, 4, 5, 8};
  const kiln_pool2d_params_t pool = {{3, 2}, {2, 2}, {1, 0}};
  const int64_t ps[4] = {2, 3, 5, 4};
  for (size_t d = 0; d < nd; d++)
    for (int t = 0; t < 2; t++) {
      const kiln_dtype_t dt = dtypes[t];
      for (int exact = 0; exact < 2; exact++) {
        char what[160];
        linear_op_t o = {.params = {{2, 1}, {1, 1}, {1, 2}}};
        /* conv2d x [2,3,9,8] * w [4,3,3,2], stride 2x1, padding 1x1, dilation 1x2: y [2,4,5,8]. */
        o.grad = LINEAR_CONV_DX;
        memcpy(o.shape, xs, sizeof xs);
        kiln_tensor_t *in[2] = {linear_values(cpu, dt, 4, ys, exact, 41), linear_values(cpu, dt, 4, ws, exact, 42)};
        snprintf(what, sizeof what, "conv2d_backward_input of %s (%s data)", kiln_dtype_name(dt), exact ? "exact" : "random");
        linear_check(what, cpu, devices[d], &o, in, 2, exact);
        kiln_tensor_release(in[0]), kiln_tensor_release(in[1]);
        o.grad = LINEAR_CONV_DW;
        memcpy(o.shape, ws, sizeof ws);
        in[0] = linear_values(cpu, dt, 4, xs, exact, 43);
        in[1] = linear_values(cpu, dt, 4, ys, exact, 44);
        snprintf(what, sizeof what, "conv2d_backward_weight of %s (%s data)", kiln_dtype_name(dt), exact ? "exact" : "random");
        linear_check(what, cpu, devices[d], &o, in, 2, exact);
        kiln_tensor_release(in[0]), kiln_tensor_release(in[1]);
        if (!exact) continue;
        o.grad = LINEAR_POOL;
        o.pool = pool;
        in[0] = linear_values(cpu, dt, 4, xs, true, 45);
        in[1] = linear_values(cpu, dt, 4, ps, true, 46);
        snprintf(what, sizeof what, "max_pool2d of %s", kiln_dtype_name(dt));
        linear_check(what, cpu, devices[d], &o, in, 1, true);
        o.grad = LINEAR_POOL_DX;
        snprintf(what, sizeof what, "max_pool2d_backward of %s", kiln_dtype_name(dt));
        linear_check(what, cpu, devices[d], &o, in, 2, true);
        kiln_tensor_release(in[0]), kiln_tensor_release(in[1]);
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
  /* Probe in a child: PoCL started here would have no worker threads in the
   * children check forks for the tests, and they would wait forever. */
  pid_t pid = fork();
  if (pid == 0) {
    size_t nd = 0, count = 0;
    if (kiln_ensure_initialized() != KILN_OK) _exit(2);
    if (kiln_device_count(&count) == KILN_OK)
      for (size_t i = 0; i < count; i++) {
        kiln_device_t *d = NULL;
        kiln_device_info_t info;
        if (kiln_device_get(i, &d) != KILN_OK) continue;
        if (kiln_device_info(d, &info) == KILN_OK && !strcmp(info.backend, "opencl")) nd++;
        kiln_device_release(d);
      }
    _exit(nd ? 0 : 1);
  }
  int wstatus = 0;
  if (pid < 0 || waitpid(pid, &wstatus, 0) != pid || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
    printf("skipped: %s\n", WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 2 ? "kiln did not start"
                                                                           : "no OpenCL device is visible");
    return 77;
  }
  Suite *suite = suite_create("opencl-dtypes");
  TCase *tc = tcase_create("dtypes");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_dtype_support);
  tcase_add_test(tc, test_fill_arange_every_dtype);
  tcase_add_test(tc, test_cast_every_pair);
  tcase_add_test(tc, test_elementwise_every_dtype);
  tcase_add_test(tc, test_reduce_every_dtype);
  suite_add_tcase(suite, tc);
  /* Its own case (CK_RUN_CASE=linear runs it alone). */
  TCase *linear = tcase_create("linear");
  tcase_set_timeout(linear, 600);
  tcase_add_test(linear, test_matmul_conv2d_every_float_dtype);
  tcase_add_test(linear, test_training_kinds_16bit);
  suite_add_tcase(suite, linear);
  SRunner *runner = srunner_create(suite);
  srunner_run_all(runner, CK_NORMAL);
  const int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  return failed ? 1 : 0;
}
