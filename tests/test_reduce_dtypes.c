/* tests/test_reduce_dtypes.c: sum, mean, max, argmax, norm and sum_to of every dtype on cpu:0: result dtypes, exact values, wide accumulators, refusals. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* Long rows: more than twice the CPU kernels' elementwise grain (32768), so
 * a reduction to one value is split over the device's threads. */
enum { KT_LONG = 2 * 32768 + 4465 };

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu:0", &device));
  return device;
}

static kiln_tensor_t *kt_make(kiln_dtype_t dtype, int ndim, const int64_t *shape, const void *data) {
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_from_host(kt_cpu(), dtype, ndim, shape, data, &t));
  return t;
}

static kiln_tensor_t *kt_vec(kiln_dtype_t dtype, int64_t n, const void *data) { return kt_make(dtype, 1, &n, data); }

/* Reads r (of `dtype`, `n` elements) into out, then releases it. */
static void kt_take(kiln_tensor_t *r, kiln_dtype_t dtype, int64_t n, void *out) {
  ck_assert_int_eq(kiln_tensor_dtype(r), dtype);
  ck_assert_int_eq(kiln_tensor_numel(r), n);
  KT_OK(kiln_tensor_read(r, out, (size_t)n * kiln_dtype_size(dtype)));
  kiln_tensor_release(r);
}

typedef kiln_status_t (*kt_reduce_fn)(const kiln_tensor_t *, int, bool, kiln_tensor_t **);

/* The reduction of `a` over all axes, one value of `dtype` into out. */
static void kt_all(kt_reduce_fn fn, kiln_tensor_t *a, kiln_dtype_t dtype, void *out) {
  kiln_tensor_t *r = NULL;
  KT_OK(fn(a, KILN_ALL_AXES, false, &r));
  kt_take(r, dtype, 1, out);
}

static int64_t kt_sum_i64(kiln_tensor_t *a) {
  int64_t v = 0;
  kt_all(kiln_tensor_sum, a, KILN_I64, &v);
  kiln_tensor_release(a);
  return v;
}

static uint16_t kt_half(kt_reduce_fn fn, kiln_tensor_t *a, kiln_dtype_t dtype) {
  uint16_t v = 0;
  kt_all(fn, a, dtype, &v);
  return v;
}

static double kt_f64(kt_reduce_fn fn, kiln_tensor_t *a) {
  double v = 0;
  kt_all(fn, a, KILN_F64, &v);
  return v;
}

static int32_t kt_argmax(kiln_tensor_t *a) {
  int32_t v = -1;
  kt_all(kiln_tensor_argmax, a, KILN_I32, &v);
  return v;
}

static uint16_t kt_norm_half(kiln_tensor_t *a, kiln_dtype_t dtype) {
  kiln_tensor_t *r = NULL;
  uint16_t v = 0;
  KT_OK(kiln_tensor_norm(a, &r));
  kt_take(r, dtype, 1, &v);
  return v;
}

/* ---- integer and bool sums: i64, exact ------------------------------------------------ */

START_TEST(test_sum_integers_is_i64) {
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I8, 4, (const int8_t[]){127, 127, 127, -128})), 253);
  static uint8_t u8s[1000];
  memset(u8s, 255, sizeof u8s);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_U8, 1000, u8s)), 255000);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I16, 3, (const int16_t[]){32767, 32767, -32768})), 32766);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I16, 3, (const int16_t[]){32767, 32767, 32767})), 98301);
  /* Past i32's range, well inside i64's. */
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I32, 3, (const int32_t[]){INT32_MAX, INT32_MAX, 10})), 4294967304LL);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I32, 2, (const int32_t[]){INT32_MIN, INT32_MIN})), -4294967296LL);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I64, 3, (const int64_t[]){1LL << 40, 3, -(1LL << 41)})), -(1LL << 40) + 3);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_BOOL, 5, (const uint8_t[]){1, 0, 1, 1, 0})), 3);
  /* i64 wraps at 2^63, as every integer formula wraps. */
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I64, 2, (const int64_t[]){INT64_MAX, 1})), INT64_MIN);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I64, 2, (const int64_t[]){INT64_MIN, -1})), INT64_MAX);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I64, 3, (const int64_t[]){INT64_MAX, INT64_MAX, 2})), 0);
  /* The sum of nothing is 0, an i64 too. */
  kiln_tensor_t *e = NULL;
  KT_OK(kiln_tensor_zeros(kt_cpu(), KILN_U8, 1, (const int64_t[]){0}, &e));
  ck_assert_int_eq(kt_sum_i64(e), 0);
}
END_TEST

/* Along an axis with inner > 1 (the column path), keepdim. */
START_TEST(test_sum_integers_along_axis) {
  int16_t x[2 * 3 * 4];
  int64_t want[2 * 4] = {0};
  for (int o = 0; o < 2; o++)
    for (int l = 0; l < 3; l++)
      for (int c = 0; c < 4; c++) {
        x[(o * 3 + l) * 4 + c] = (int16_t)(30000 - 7 * (o * 12 + l * 4 + c));
        want[o * 4 + c] += x[(o * 3 + l) * 4 + c];
      }
  kiln_tensor_t *a = kt_make(KILN_I16, 3, (const int64_t[]){2, 3, 4}, x), *r = NULL;
  KT_OK(kiln_tensor_sum(a, 1, true, &r));
  ck_assert_int_eq(kiln_tensor_ndim(r), 3);
  ck_assert_int_eq(kiln_tensor_shape(r)[1], 1);
  int64_t got[8];
  kt_take(r, KILN_I64, 8, got);
  for (int i = 0; i < 8; i++) ck_assert_int_eq(got[i], want[i]);
  ck_assert_int_gt(want[0], 32767); /* the point: past i16 */
  kiln_tensor_release(a);

  static int64_t y[3 * 200 * 70];
  uint64_t wy[3 * 70] = {0};
  for (int o = 0; o < 3; o++)
    for (int l = 0; l < 200; l++)
      for (int c = 0; c < 70; c++) {
        int64_t v = (int64_t)((uint64_t)(o * 14000 + l * 70 + c + 1) * 0x9e3779b97f4a7c15ull);
        y[(o * 200 + l) * 70 + c] = v;
        wy[o * 70 + c] += (uint64_t)v;
      }
  a = kt_make(KILN_I64, 3, (const int64_t[]){3, 200, 70}, y);
  KT_OK(kiln_tensor_sum(a, 1, false, &r));
  int64_t gy[3 * 70];
  kt_take(r, KILN_I64, 3 * 70, gy);
  for (int i = 0; i < 3 * 70; i++) ck_assert_int_eq(gy[i], (int64_t)wy[i]);
  kiln_tensor_release(a);
}
END_TEST

/* One long row (split over the threads): wrapping i64 sums, exact. */
START_TEST(test_sum_integers_long_row) {
  int64_t *x = malloc(KT_LONG * sizeof *x);
  int32_t *x32 = malloc(KT_LONG * sizeof *x32);
  ck_assert_ptr_nonnull(x);
  ck_assert_ptr_nonnull(x32);
  uint64_t want = 0;
  int64_t want32 = 0;
  for (int64_t i = 0; i < KT_LONG; i++) {
    x[i] = (int64_t)((uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);
    want += (uint64_t)x[i];
    x32[i] = (int32_t)(INT32_MAX - i);
    want32 += x32[i];
  }
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I64, KT_LONG, x)), (int64_t)want);
  ck_assert_int_eq(kt_sum_i64(kt_vec(KILN_I32, KT_LONG, x32)), want32);
  /* Two rows of half the length. */
  kiln_tensor_t *a = kt_make(KILN_I64, 2, (const int64_t[]){2, KT_LONG / 2}, x), *r = NULL;
  uint64_t w[2] = {0, 0};
  for (int64_t i = 0; i < KT_LONG / 2 * 2; i++) w[i / (KT_LONG / 2)] += (uint64_t)x[i];
  KT_OK(kiln_tensor_sum(a, 1, false, &r));
  int64_t got[2];
  kt_take(r, KILN_I64, 2, got);
  ck_assert_int_eq(got[0], (int64_t)w[0]);
  ck_assert_int_eq(got[1], (int64_t)w[1]);
  kiln_tensor_release(a);
  free(x);
  free(x32);
}
END_TEST

/* ---- f16, bf16: f32 accumulation, one rounding ------------------------------------------ */

START_TEST(test_sum_f16_bf16) {
  /* 2048 + 1 + 1: summed in f16 it would stay 2048 (each +1 a tie to
   * even); in f32 it is 2050, an f16 (0x6801). */
  kiln_tensor_t *a = kt_vec(KILN_F16, 3, (const uint16_t[]){0x6800, 0x3c00, 0x3c00});
  ck_assert_uint_eq(kt_half(kiln_tensor_sum, a, KILN_F16), 0x6801);
  kiln_tensor_release(a);
  /* 2048 + 1 = 2049: a tie between 2048 and 2050, to even 2048. */
  a = kt_vec(KILN_F16, 2, (const uint16_t[]){0x6800, 0x3c00});
  ck_assert_uint_eq(kt_half(kiln_tensor_sum, a, KILN_F16), 0x6800);
  kiln_tensor_release(a);
  /* 65504 + 16 = 65520 rounds to inf in f16 (the first value past the
   * largest finite's half ulp). */
  a = kt_vec(KILN_F16, 2, (const uint16_t[]){0x7bff, 0x4c00});
  ck_assert_uint_eq(kt_half(kiln_tensor_sum, a, KILN_F16), 0x7c00);
  kiln_tensor_release(a);
  /* bf16: 256 + 1 + 1 = 258 (0x4381); 256 + 1 ties to 256. */
  a = kt_vec(KILN_BF16, 3, (const uint16_t[]){0x4380, 0x3f80, 0x3f80});
  ck_assert_uint_eq(kt_half(kiln_tensor_sum, a, KILN_BF16), 0x4381);
  kiln_tensor_release(a);
  a = kt_vec(KILN_BF16, 2, (const uint16_t[]){0x4380, 0x3f80});
  ck_assert_uint_eq(kt_half(kiln_tensor_sum, a, KILN_BF16), 0x4380);
  kiln_tensor_release(a);
  /* Sum of nothing: +0. */
  KT_OK(kiln_tensor_zeros(kt_cpu(), KILN_BF16, 1, (const int64_t[]){0}, &a));
  ck_assert_uint_eq(kt_half(kiln_tensor_sum, a, KILN_BF16), 0);
  kiln_tensor_release(a);
}
END_TEST

START_TEST(test_mean_norm_f16_bf16) {
  /* mean(1, 2, 3, 4) = 2.5; mean(1, 2, 2) = 5/3 = 1.1010101010|10.. in
   * binary: f16 keeps 10 fraction bits and rounds up (0x3eab), bf16 keeps 7
   * and rounds down (0x3fd5). */
  kiln_tensor_t *a = kt_vec(KILN_F16, 4, (const uint16_t[]){0x3c00, 0x4000, 0x4200, 0x4400});
  ck_assert_uint_eq(kt_half(kiln_tensor_mean, a, KILN_F16), 0x4100);
  kiln_tensor_release(a);
  a = kt_vec(KILN_F16, 3, (const uint16_t[]){0x3c00, 0x4000, 0x4000});
  ck_assert_uint_eq(kt_half(kiln_tensor_mean, a, KILN_F16), 0x3eab);
  kiln_tensor_release(a);
  a = kt_vec(KILN_BF16, 3, (const uint16_t[]){0x3f80, 0x4000, 0x4000});
  ck_assert_uint_eq(kt_half(kiln_tensor_mean, a, KILN_BF16), 0x3fd5);
  kiln_tensor_release(a);
  /* The mean of nothing is NaN, in f16 too. */
  KT_OK(kiln_tensor_zeros(kt_cpu(), KILN_F16, 1, (const int64_t[]){0}, &a));
  uint16_t nan16 = kt_half(kiln_tensor_mean, a, KILN_F16);
  ck_assert_uint_eq(nan16 & 0x7c00u, 0x7c00u);
  ck_assert_uint_ne(nan16 & 0x3ffu, 0);
  kiln_tensor_release(a);
  /* norm(3, 4) = 5; norm(1, 1) = sqrt(2) = 1.0110101000|001.. (f16 0x3da8,
   * bf16 1.0110101 = 0x3fb5). */
  a = kt_vec(KILN_F16, 2, (const uint16_t[]){0x4200, 0x4400});
  ck_assert_uint_eq(kt_norm_half(a, KILN_F16), 0x4500);
  kiln_tensor_release(a);
  a = kt_vec(KILN_F16, 2, (const uint16_t[]){0x3c00, 0xbc00});
  ck_assert_uint_eq(kt_norm_half(a, KILN_F16), 0x3da8);
  kiln_tensor_release(a);
  a = kt_vec(KILN_BF16, 2, (const uint16_t[]){0x3f80, 0x3f80});
  ck_assert_uint_eq(kt_norm_half(a, KILN_BF16), 0x3fb5);
  kiln_tensor_release(a);
  /* 300^2 + 400^2 = 250000 overflows f16 (65504) but not the f32 sum. */
  a = kt_vec(KILN_F16, 2, (const uint16_t[]){0x5cb0, 0x5e40});
  ck_assert_uint_eq(kt_norm_half(a, KILN_F16), 0x5fd0); /* 500 */
  kiln_tensor_release(a);
}
END_TEST

START_TEST(test_max_argmax_f16_bf16) {
  /* First maximum; -0 and 0 compare equal. */
  kiln_tensor_t *a = kt_vec(KILN_F16, 5, (const uint16_t[]){0xc000, 0x4200, 0x3c00, 0x4200, 0xfc00});
  ck_assert_uint_eq(kt_half(kiln_tensor_max, a, KILN_F16), 0x4200);
  ck_assert_int_eq(kt_argmax(a), 1);
  kiln_tensor_release(a);
  a = kt_vec(KILN_F16, 3, (const uint16_t[]){0x8000, 0x0000, 0xbc00});
  ck_assert_uint_eq(kt_half(kiln_tensor_max, a, KILN_F16), 0x8000);
  ck_assert_int_eq(kt_argmax(a), 0);
  kiln_tensor_release(a);
  /* NaN wins, the first NaN; MAX gives the element's own bits. */
  a = kt_vec(KILN_F16, 4, (const uint16_t[]){0x3c00, 0x7e01, 0x7c00, 0xfe00});
  ck_assert_uint_eq(kt_half(kiln_tensor_max, a, KILN_F16), 0x7e01);
  ck_assert_int_eq(kt_argmax(a), 1);
  kiln_tensor_release(a);
  a = kt_vec(KILN_BF16, 4, (const uint16_t[]){0xc2f7, 0x42f7, 0x42f6, 0xff80});
  ck_assert_uint_eq(kt_half(kiln_tensor_max, a, KILN_BF16), 0x42f7);
  ck_assert_int_eq(kt_argmax(a), 1);
  kiln_tensor_release(a);
  /* Along an axis with inner > 1 (strided), keepdim off: [2, 3, 2]. */
  a = kt_make(KILN_F16, 3, (const int64_t[]){2, 3, 2},
              (const uint16_t[]){0x3c00, 0x4000, 0x4200, 0x7e00, 0x4200, 0x3c00,  /* o = 0 */
                                 0xc000, 0xc400, 0xbc00, 0xc200, 0xbc00, 0xc000}); /* o = 1 */
  kiln_tensor_t *r = NULL;
  uint16_t m[4];
  int32_t am[4];
  KT_OK(kiln_tensor_max(a, 1, false, &r));
  kt_take(r, KILN_F16, 4, m);
  KT_OK(kiln_tensor_argmax(a, 1, false, &r));
  kt_take(r, KILN_I32, 4, am);
  ck_assert_uint_eq(m[0], 0x4200);
  ck_assert_uint_eq(m[1], 0x7e00);
  ck_assert_uint_eq(m[2], 0xbc00);
  ck_assert_uint_eq(m[3], 0xc000);
  ck_assert_int_eq(am[0], 1);
  ck_assert_int_eq(am[1], 1);
  ck_assert_int_eq(am[2], 1);
  ck_assert_int_eq(am[3], 2);
  kiln_tensor_release(a);
}
END_TEST

/* Long f16 rows: the split path sums in f32 and rounds once; across chunks
 * the first maximum and the first NaN win. */
START_TEST(test_f16_long_row) {
  uint16_t *x = malloc(KT_LONG * sizeof *x);
  ck_assert_ptr_nonnull(x);
  static const uint16_t quarters[4] = {0x0000, 0x3400, 0x3800, 0x3a00}; /* 0, .25, .5, .75 */
  double exact = 0;
  for (int64_t i = 0; i < KT_LONG; i++) {
    x[i] = quarters[i % 4];
    exact += (double)(i % 4) * 0.25;
  }
  /* 70001 elements: 17500 * 1.5 + 0 = 26250, not an f16 (ulp 16 there):
   * to nearest, 26256 = 0x7669. */
  ck_assert(exact == 26250.0);
  kiln_tensor_t *a = kt_vec(KILN_F16, KT_LONG, x);
  ck_assert_uint_eq(kt_half(kiln_tensor_sum, a, KILN_F16), 0x7669);
  /* The mean, 26250 / 70001 = 0.374994..: f16 0.375 (0x3600). */
  ck_assert_uint_eq(kt_half(kiln_tensor_mean, a, KILN_F16), 0x3600);
  kiln_tensor_release(a);

  /* Two equal maxima far apart: the first; then a NaN in the later part. */
  for (int64_t i = 0; i < KT_LONG; i++) x[i] = 0x3c00;
  x[10] = 0x4500;
  x[KT_LONG - 10] = 0x4500;
  a = kt_vec(KILN_F16, KT_LONG, x);
  ck_assert_uint_eq(kt_half(kiln_tensor_max, a, KILN_F16), 0x4500);
  ck_assert_int_eq(kt_argmax(a), 10);
  kiln_tensor_release(a);
  x[KT_LONG - 5] = 0xfe00;
  a = kt_vec(KILN_F16, KT_LONG, x);
  ck_assert_uint_eq(kt_half(kiln_tensor_max, a, KILN_F16), 0xfe00);
  ck_assert_int_eq(kt_argmax(a), KT_LONG - 5);
  kiln_tensor_release(a);

  /* Along axis 0 of [KT_LONG, 3] (inner > 1): column sums of ones, of 2
   * and -1 in turn, and of the quarters, exact in f32, each rounded once. */
  uint16_t *y = malloc(KT_LONG * 3 * sizeof *y);
  ck_assert_ptr_nonnull(y);
  for (int64_t i = 0; i < KT_LONG; i++) {
    y[i * 3 + 0] = 0x3c00;                 /* 1 */
    y[i * 3 + 1] = i % 2 ? 0xbc00 : 0x4000; /* 2, -1, 2, -1, ... */
    y[i * 3 + 2] = quarters[i % 4];
  }
  a = kt_make(KILN_F16, 2, (const int64_t[]){KT_LONG, 3}, y);
  kiln_tensor_t *r = NULL;
  uint16_t s[3];
  KT_OK(kiln_tensor_sum(a, 0, false, &r));
  kt_take(r, KILN_F16, 3, s);
  /* 70001 is past f16's largest finite (65504): inf. */
  ck_assert_uint_eq(s[0], 0x7c00);
  /* 35001 * 2 - 35000 = 35002: ulp 32, 35002 / 32 = 1093.8 -> 35008 = 0x7846. */
  ck_assert_uint_eq(s[1], 0x7846);
  ck_assert_uint_eq(s[2], 0x7669);
  kiln_tensor_release(a);
  free(y);
  free(x);
}
END_TEST

/* ---- f64: f64 accumulation ------------------------------------------------------------ */

START_TEST(test_f64_reductions) {
  /* 1 + 2^-30 is lost in f32, kept in f64. */
  kiln_tensor_t *a = kt_vec(KILN_F64, 2, (const double[]){1.0, ldexp(1.0, -30)});
  ck_assert(kt_f64(kiln_tensor_sum, a) == 1.0 + ldexp(1.0, -30));
  kiln_tensor_release(a);
  double *x = malloc(KT_LONG * sizeof *x);
  ck_assert_ptr_nonnull(x);
  for (int64_t i = 0; i < KT_LONG; i++) x[i] = ldexp((double)i, -10) + ldexp(1.0, 20);
  /* Every partial sum is a multiple of 2^-10 below 2^37: exact in f64
   * (47 bits), whatever the order; f32 would keep 24. */
  double want = ldexp((double)KT_LONG * (KT_LONG - 1) / 2, -10) + ldexp((double)KT_LONG, 20);
  a = kt_vec(KILN_F64, KT_LONG, x);
  ck_assert(kt_f64(kiln_tensor_sum, a) == want);
  ck_assert(kt_f64(kiln_tensor_mean, a) == want / (double)KT_LONG);
  ck_assert(kt_f64(kiln_tensor_max, a) == x[KT_LONG - 1]);
  ck_assert_int_eq(kt_argmax(a), KT_LONG - 1);
  kiln_tensor_release(a);
  free(x);
  a = kt_vec(KILN_F64, 3, (const double[]){1.0, 2.0, 2.0});
  ck_assert(kt_f64(kiln_tensor_mean, a) == 5.0 / 3.0);
  kiln_tensor_release(a);
  a = kt_vec(KILN_F64, 2, (const double[]){1.0, 1.0});
  kiln_tensor_t *r = NULL;
  double v = 0;
  KT_OK(kiln_tensor_norm(a, &r));
  kt_take(r, KILN_F64, 1, &v);
  ck_assert(v == sqrt(2.0));
  kiln_tensor_release(a);
  /* NaN wins, first; -inf loses to everything else. */
  a = kt_vec(KILN_F64, 4, (const double[]){-INFINITY, 1.0, NAN, NAN});
  ck_assert(isnan(kt_f64(kiln_tensor_max, a)));
  ck_assert_int_eq(kt_argmax(a), 2);
  kiln_tensor_release(a);
  a = kt_vec(KILN_F64, 2, (const double[]){-INFINITY, -1e300});
  ck_assert(kt_f64(kiln_tensor_max, a) == -1e300);
  ck_assert_int_eq(kt_argmax(a), 1);
  kiln_tensor_release(a);
}
END_TEST

/* ---- max and argmax of the integers keep the dtype ------------------------------------------ */

START_TEST(test_max_integers) {
  kiln_tensor_t *a = kt_vec(KILN_I8, 4, (const int8_t[]){-128, -5, 100, 100});
  int8_t m8 = 0;
  kt_all(kiln_tensor_max, a, KILN_I8, &m8);
  ck_assert_int_eq(m8, 100);
  ck_assert_int_eq(kt_argmax(a), 2);
  kiln_tensor_release(a);
  a = kt_vec(KILN_U8, 3, (const uint8_t[]){0, 255, 3});
  uint8_t mu = 0;
  kt_all(kiln_tensor_max, a, KILN_U8, &mu);
  ck_assert_int_eq(mu, 255);
  ck_assert_int_eq(kt_argmax(a), 1);
  kiln_tensor_release(a);
  a = kt_vec(KILN_I16, 3, (const int16_t[]){-32768, -32767, -32768});
  int16_t m16 = 0;
  kt_all(kiln_tensor_max, a, KILN_I16, &m16);
  ck_assert_int_eq(m16, -32767);
  kiln_tensor_release(a);
  a = kt_vec(KILN_I64, 3, (const int64_t[]){INT64_MIN, INT64_MAX, INT64_MAX - 1});
  int64_t m64 = 0;
  kt_all(kiln_tensor_max, a, KILN_I64, &m64);
  ck_assert_int_eq(m64, INT64_MAX);
  ck_assert_int_eq(kt_argmax(a), 1);
  kiln_tensor_release(a);
  /* Two values an f64 cannot tell apart. */
  a = kt_vec(KILN_I64, 2, (const int64_t[]){(1LL << 60), (1LL << 60) + 1});
  kt_all(kiln_tensor_max, a, KILN_I64, &m64);
  ck_assert_int_eq(m64, (1LL << 60) + 1);
  ck_assert_int_eq(kt_argmax(a), 1);
  kiln_tensor_release(a);
}
END_TEST

/* ---- sum_to keeps the dtype --------------------------------------------------------------- */

START_TEST(test_sum_to_keeps_dtype) {
  kiln_tensor_t *a = kt_make(KILN_I32, 2, (const int64_t[]){3, 2},
                             (const int32_t[]){INT32_MAX, 1, 1, 2, 0, 3}), *r = NULL;
  KT_OK(kiln_tensor_sum_to(a, 1, (const int64_t[]){2}, &r));
  int32_t g32[2];
  kt_take(r, KILN_I32, 2, g32);
  ck_assert_int_eq(g32[0], INT32_MIN); /* wraps, as i32 does */
  ck_assert_int_eq(g32[1], 6);
  kiln_tensor_release(a);
  a = kt_make(KILN_U8, 2, (const int64_t[]){2, 2}, (const uint8_t[]){255, 7, 255, 8});
  KT_OK(kiln_tensor_sum_to(a, 2, (const int64_t[]){1, 2}, &r));
  uint8_t gu[2];
  kt_take(r, KILN_U8, 2, gu);
  ck_assert_int_eq(gu[0], 254);
  ck_assert_int_eq(gu[1], 15);
  kiln_tensor_release(a);
  a = kt_make(KILN_BOOL, 2, (const int64_t[]){2, 3}, (const uint8_t[]){1, 0, 1, 1, 0, 0});
  KT_OK(kiln_tensor_sum_to(a, 1, (const int64_t[]){3}, &r));
  uint8_t gb[3];
  kt_take(r, KILN_BOOL, 3, gb);
  ck_assert_int_eq(gb[0], 1);
  ck_assert_int_eq(gb[1], 0);
  ck_assert_int_eq(gb[2], 1);
  kiln_tensor_release(a);
  a = kt_make(KILN_BF16, 2, (const int64_t[]){3, 1}, (const uint16_t[]){0x4380, 0x3f80, 0x3f80});
  KT_OK(kiln_tensor_sum_to(a, 1, (const int64_t[]){1}, &r));
  uint16_t gh = 0;
  kt_take(r, KILN_BF16, 1, &gh);
  ck_assert_uint_eq(gh, 0x4381);
  kiln_tensor_release(a);
  /* broadcast_to of another dtype: a copy. */
  a = kt_vec(KILN_I64, 2, (const int64_t[]){INT64_MIN, 5});
  KT_OK(kiln_tensor_broadcast_to(a, 2, (const int64_t[]){2, 2}, &r));
  int64_t gi[4];
  kt_take(r, KILN_I64, 4, gi);
  ck_assert_int_eq(gi[0], INT64_MIN);
  ck_assert_int_eq(gi[3], 5);
  kiln_tensor_release(a);
}
END_TEST

/* ---- refusals ----------------------------------------------------------------------------- */

START_TEST(test_refusals) {
  kiln_tensor_t *i = kt_vec(KILN_I32, 2, (const int32_t[]){1, 2}), *b = kt_vec(KILN_BOOL, 2, (const uint8_t[]){1, 0});
  kiln_tensor_t *l = kt_vec(KILN_I64, 2, (const int64_t[]){1, 2}), *r = NULL;
  KT_FAILS(kiln_tensor_mean(i, 0, false, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_mean: mean does not support dtype i32 (a); use f32, f16, bf16 or f64: cast to f32 "
           "first (kiln_tensor_cast(a, KILN_F32, &a2))");
  KT_FAILS(kiln_tensor_max(b, 0, false, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_max: max does not support dtype bool (a); use f32, i32, f16, bf16, f64, i64, i8, u8 or "
           "i16: cast to i32 first (kiln_tensor_cast(a, KILN_I32, &a2))");
  KT_FAILS(kiln_tensor_argmax(b, 0, false, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_argmax: argmax does not support dtype bool (a)");
  KT_FAILS(kiln_tensor_norm(l, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_norm: norm does not support dtype i64 (a); use f32, f16, bf16 or f64: cast to f32 "
           "first");
  ck_assert_ptr_null(r);
  kiln_tensor_release(i);
  kiln_tensor_release(b);
  kiln_tensor_release(l);
}
END_TEST

int main(void) {
  Suite *s = suite_create("reduce_dtypes");
  TCase *tc = tcase_create("reduce_dtypes");
  tcase_add_test(tc, test_sum_integers_is_i64);
  tcase_add_test(tc, test_sum_integers_along_axis);
  tcase_add_test(tc, test_sum_integers_long_row);
  tcase_add_test(tc, test_sum_f16_bf16);
  tcase_add_test(tc, test_mean_norm_f16_bf16);
  tcase_add_test(tc, test_max_argmax_f16_bf16);
  tcase_add_test(tc, test_f16_long_row);
  tcase_add_test(tc, test_f64_reductions);
  tcase_add_test(tc, test_max_integers);
  tcase_add_test(tc, test_sum_to_keeps_dtype);
  tcase_add_test(tc, test_refusals);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
