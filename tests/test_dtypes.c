/* tests/test_dtypes.c: every dtype: the list, storage round trips, fill and arange, every cast pair against a host reference, promotion, refusals. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "common.h"

#define KT_NDT KILN_DTYPE_COUNT_

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu:0", &device));
  return device;
}

/* ---- a host reference, written apart from kernels/dtype_convert.h ----------------
 * A value as the reference holds it: floats exactly as long double (x87's 64-bit
 * significand holds every f64 and every i64), integers as int64. */
typedef struct kt_val_t {
  bool is_float;
  long double f;
  int64_t i;
} kt_val_t;

/* f16 (mb 10, bias 15) or bf16 (mb 7, bias 127) bits to their value; inf
 * and NaN are not asked for. */
static long double kt_half_value(uint32_t bits, int mb, int bias) {
  uint32_t exp = (bits >> mb) & ((1u << (15 - mb)) - 1u), frac = bits & ((1u << mb) - 1u);
  long double v = exp ? ldexpl((long double)((1u << mb) + frac), (int)exp - bias - mb)
                      : ldexpl((long double)frac, 1 - bias - mb);
  return (bits & 0x8000u) ? -v : v;
}

/* The nearest f16 / bf16 to x by search over the positive finite patterns
 * (ascending with their bits), ties to the even pattern; past the largest,
 * infinity sits one ulp further as an even candidate. */
static uint16_t kt_ref_half(long double x, int mb, int bias) {
  const uint32_t inf = (uint32_t)(2 * bias + 1) << mb;
  if (isnan(x)) return (uint16_t)((signbit(x) ? 0x8000u : 0u) | inf | (1u << (mb - 1)));
  uint32_t sign = signbit(x) ? 0x8000u : 0u;
  long double a = fabsl(x);
  if (isinf(a)) return (uint16_t)(sign | inf);
  uint32_t lo = 0, hi = inf; /* value(lo) <= a < value(hi); hi == inf means 2^(bias+1) */
  long double top = ldexpl(1.0L, bias + 1);
  if (a >= top) return (uint16_t)(sign | inf);
  while (hi - lo > 1) {
    uint32_t mid = (lo + hi) / 2;
    if (kt_half_value(mid, mb, bias) <= a) lo = mid;
    else hi = mid;
  }
  long double vlo = kt_half_value(lo, mb, bias), vhi = hi == inf ? top : kt_half_value(hi, mb, bias);
  uint32_t pick;
  if (a - vlo < vhi - a) pick = lo;
  else if (a - vlo > vhi - a) pick = hi;
  else pick = (lo & 1u) ? hi : lo;
  return (uint16_t)(sign | pick);
}

static long double kt_half_decode(uint16_t bits, int mb, int bias) {
  const uint32_t inf = (uint32_t)(2 * bias + 1) << mb;
  if ((bits & 0x7fffu) >= inf) {
    if ((bits & 0x7fffu) == inf) return (bits & 0x8000u) ? -INFINITY : INFINITY;
    return (bits & 0x8000u) ? -NAN : NAN;
  }
  return kt_half_value(bits, mb, bias);
}

static int64_t kt_wrap(int64_t x, int bits, bool is_signed) {
  uint64_t m = bits == 64 ? ~UINT64_C(0) : (UINT64_C(1) << bits) - 1u;
  uint64_t u = (uint64_t)x & m;
  if (is_signed && bits < 64 && (u >> (bits - 1)) & 1u) return (int64_t)u - (int64_t)(UINT64_C(1) << bits);
  return (int64_t)u;
}

static int64_t kt_sat(long double f, long double lo, long double hi) {
  if (isnan(f)) return 0;
  if (f >= hi) return (int64_t)hi;
  if (f <= lo) return (int64_t)lo;
  return (int64_t)truncl(f);
}

/* The source element `p` of `dtype` as the reference's value. */
static kt_val_t kt_load(kiln_dtype_t dtype, const void *p) {
  kt_val_t v = {false, 0, 0};
  switch (dtype) {
  case KILN_F32: v.is_float = true; v.f = *(const float *)p; break;
  case KILN_F64: v.is_float = true; v.f = *(const double *)p; break;
  case KILN_F16: v.is_float = true; v.f = kt_half_decode(*(const uint16_t *)p, 10, 15); break;
  case KILN_BF16: v.is_float = true; v.f = kt_half_decode(*(const uint16_t *)p, 7, 127); break;
  case KILN_I32: v.i = *(const int32_t *)p; break;
  case KILN_I64: v.i = *(const int64_t *)p; break;
  case KILN_I16: v.i = *(const int16_t *)p; break;
  case KILN_I8: v.i = *(const int8_t *)p; break;
  case KILN_U8: v.i = *(const uint8_t *)p; break;
  case KILN_BOOL: v.i = *(const uint8_t *)p != 0; break;
  default: break;
  }
  return v;
}

/* The reference's result of casting v to `dtype`, written to `out`. */
static void kt_store(kiln_dtype_t dtype, kt_val_t v, void *out) {
  long double f = v.is_float ? v.f : (long double)v.i;
  switch (dtype) {
  case KILN_F32: { float x = v.is_float ? (float)(double)v.f : (float)v.i; memcpy(out, &x, 4); break; }
  case KILN_F64: { double x = v.is_float ? (double)v.f : (double)v.i; memcpy(out, &x, 8); break; }
  case KILN_F16: { uint16_t x = kt_ref_half(f, 10, 15); memcpy(out, &x, 2); break; }
  case KILN_BF16: { uint16_t x = kt_ref_half(f, 7, 127); memcpy(out, &x, 2); break; }
  case KILN_BOOL: { uint8_t x = v.is_float ? (isnan(f) || f != 0) : v.i != 0; memcpy(out, &x, 1); break; }
#define KT_INT_(E, T, BITS, SIGNED, LO, HI)                                                     \
  case KILN_##E: {                                                                              \
    T x = (T)(v.is_float ? kt_sat(f, (long double)(LO), (long double)(HI)) : kt_wrap(v.i, BITS, SIGNED)); \
    memcpy(out, &x, sizeof x);                                                                  \
    break;                                                                                      \
  }
    KT_INT_(I8, int8_t, 8, true, INT8_MIN, INT8_MAX)
    KT_INT_(U8, uint8_t, 8, false, 0, UINT8_MAX)
    KT_INT_(I16, int16_t, 16, true, INT16_MIN, INT16_MAX)
    KT_INT_(I32, int32_t, 32, true, INT32_MIN, INT32_MAX)
#undef KT_INT_
  case KILN_I64: {
    int64_t x;
    if (!v.is_float) x = v.i;
    else if (isnan(f)) x = 0;
    else if (f >= 9223372036854775808.0L) x = INT64_MAX;
    else if (f <= -9223372036854775808.0L) x = INT64_MIN;
    else x = (int64_t)truncl(f);
    memcpy(out, &x, 8);
    break;
  }
  default: break;
  }
}

/* ---- the source values of each dtype ----------------------------------------------- */

static const double kt_doubles[] = {
    0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 0.1, 1.0 / 3.0, 65504.0, 65519.99, 65520.0, -65520.0, 65536.0,
    5.960464477539063e-8 /* 2^-24 */, 2.9802322387695312e-8 /* 2^-25: a tie to 0 */,
    4.470348358154297e-8 /* 3*2^-26 */, 6.103515625e-5 /* 2^-14 */, 6.100535392761231e-5, 1e-8, 1e-300, 5e-324,
    -5e-324, 127.5, 128.0, -128.5, -129.0, 255.5, 256.0, -0.5, -0.99, 32767.5, 32768.0, -32769.0, 2147483647.5,
    2147483648.0, -2147483649.0, -2147483648.5, 9.3e18, -9.3e18, 9223372036854775807.0, -9223372036854775808.0,
    1.00390625 /* 1 + 2^-8: bf16 tie to 1 */, 1.01171875 /* 1 + 3*2^-8: tie up */, 1.0009765625, 1.00146484375,
    3.0e38, 3.3895313892515355e38 /* bf16 max */, 3.4e38, 3.4028234663852886e38, 3.5e38, 1e300, -1e300,
    1.1754943508222875e-38 /* f32 min normal */, 1.401298464324817e-45, 9.183549615799121e-41 /* bf16 subnormal */,
    16777217.0, 16777219.0, 2049.0, 2051.0, 4097.0, 300.0, -300.0, 1e10, INFINITY, -INFINITY, NAN, -NAN,
};

static const int64_t kt_ints[] = {
    0, 1, -1, 2, 127, 128, -128, -129, 255, 256, -256, 300, -300, 32767, 32768, -32768, -32769, 65504, 65519,
    65520, 65535, 65536, 2049, 2051, 4097, 16777217, 16777219, -16777217, INT32_MAX, (int64_t)INT32_MAX + 1,
    INT32_MIN, (int64_t)INT32_MIN - 1, (INT64_C(1) << 53) + 1, (INT64_C(1) << 60) + (INT64_C(1) << 52) + 1,
    (INT64_C(1) << 60) + (INT64_C(1) << 52), -((INT64_C(1) << 60) + (INT64_C(1) << 52) + 1), INT64_MAX, INT64_MIN,
    INT64_MIN + 1, 0x123456789abcdefLL,
};

#define KT_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The source values of `dtype` into a malloc'ed array; *out_n elements.
 * f16, bf16, i8, u8, i16, bool: every bit pattern; the others the lists
 * above (f32 from the doubles, each converted, plus some of its own). */
static void *kt_sources(kiln_dtype_t dtype, size_t *out_n) {
  size_t n = 0, size = kiln_dtype_size(dtype);
  void *p = NULL;
  switch (dtype) {
  case KILN_F16:
  case KILN_BF16:
  case KILN_I16: {
    n = 65536;
    uint16_t *v = malloc(n * 2);
    for (size_t i = 0; i < n; i++) v[i] = (uint16_t)i;
    p = v;
    break;
  }
  case KILN_I8:
  case KILN_U8: {
    n = 256;
    uint8_t *v = malloc(n);
    for (size_t i = 0; i < n; i++) v[i] = (uint8_t)i;
    p = v;
    break;
  }
  case KILN_BOOL: {
    n = 2;
    uint8_t *v = malloc(n);
    v[0] = 0;
    v[1] = 1;
    p = v;
    break;
  }
  case KILN_F64: {
    n = KT_COUNT(kt_doubles);
    double *v = malloc(n * size);
    for (size_t i = 0; i < n; i++) v[i] = kt_doubles[i];
    p = v;
    break;
  }
  case KILN_F32: {
    static const uint32_t extra[] = {0x00000001u, 0x007fffffu, 0x33000000u /* 2^-25 */, 0x33000001u,
                                     0x387fc000u /* f16 subnormal tie */, 0x477fefffu, 0x477ff000u /* 65520 */,
                                     0x3f808000u /* bf16 tie */, 0x3f818000u, 0x3f808001u, 0x7f7fffffu,
                                     0x7f7f8000u /* bf16 max + half: to inf */, 0xff800000u, 0x7fc00000u,
                                     0x7f800001u /* signalling NaN */, 0xffc12345u};
    n = KT_COUNT(kt_doubles) + KT_COUNT(extra);
    float *v = malloc(n * size);
    for (size_t i = 0; i < KT_COUNT(kt_doubles); i++) v[i] = (float)kt_doubles[i];
    memcpy(v + KT_COUNT(kt_doubles), extra, sizeof extra);
    p = v;
    break;
  }
  case KILN_I32:
  case KILN_I64: {
    n = KT_COUNT(kt_ints);
    char *v = malloc(n * size);
    for (size_t i = 0; i < n; i++) {
      if (dtype == KILN_I64) memcpy(v + i * 8, &kt_ints[i], 8);
      else { int32_t x = (int32_t)kt_wrap(kt_ints[i], 32, true); memcpy(v + i * 4, &x, 4); }
    }
    p = v;
    break;
  }
  default: break;
  }
  *out_n = n;
  return p;
}

static bool kt_is_nan_bits(kiln_dtype_t dtype, const void *p) {
  switch (dtype) {
  case KILN_F32: return isnan(*(const float *)p);
  case KILN_F64: return isnan(*(const double *)p);
  case KILN_F16: return (*(const uint16_t *)p & 0x7fffu) > 0x7c00u;
  case KILN_BF16: return (*(const uint16_t *)p & 0x7fffu) > 0x7f80u;
  default: return false;
  }
}

/* A NaN result must be a quiet NaN of the source's sign; everything else the
 * reference's bits exactly. */
static bool kt_quiet_nan_of_sign(kiln_dtype_t dtype, const void *p, bool negative) {
  uint64_t bits = 0;
  memcpy(&bits, p, kiln_dtype_size(dtype));
  switch (dtype) {
  case KILN_F32: return ((bits >> 22) & 1u) && (bool)(bits >> 31) == negative;
  case KILN_F64: return ((bits >> 51) & 1u) && (bool)(bits >> 63) == negative;
  case KILN_F16: return ((bits >> 9) & 1u) && (bool)(bits >> 15) == negative;
  case KILN_BF16: return ((bits >> 6) & 1u) && (bool)(bits >> 15) == negative;
  default: return false;
  }
}

/* ---- the list ------------------------------------------------------------------------- */

START_TEST(test_dtype_list) {
  static const struct { kiln_dtype_t dtype; int value; const char *name, *long_name; size_t size; } want[] = {
      {KILN_F32, 0, "f32", "float32", 4}, {KILN_I32, 1, "i32", "int32", 4},   {KILN_F16, 2, "f16", "float16", 2},
      {KILN_BF16, 3, "bf16", "bfloat16", 2}, {KILN_F64, 4, "f64", "float64", 8}, {KILN_I64, 5, "i64", "int64", 8},
      {KILN_I8, 6, "i8", "int8", 1},       {KILN_U8, 7, "u8", "uint8", 1},       {KILN_I16, 8, "i16", "int16", 2},
      {KILN_BOOL, 9, "bool", "bool", 1},
  };
  ck_assert_int_eq(KT_NDT, 10);
  for (size_t i = 0; i < KT_COUNT(want); i++) {
    ck_assert_int_eq((int)want[i].dtype, want[i].value);
    ck_assert_str_eq(kiln_dtype_name(want[i].dtype), want[i].name);
    ck_assert_str_eq(kiln_dtype_long_name(want[i].dtype), want[i].long_name);
    ck_assert_uint_eq(kiln_dtype_size(want[i].dtype), want[i].size);
    kiln_dtype_t got = KILN_F32;
    KT_OK(kiln_dtype_from_name(want[i].name, &got));
    ck_assert_int_eq(got, want[i].dtype);
    got = KILN_F32;
    KT_OK(kiln_dtype_from_name(want[i].long_name, &got));
    ck_assert_int_eq(got, want[i].dtype);
  }
  kiln_dtype_t got;
  KT_FAILS(kiln_dtype_from_name("complex64", &got), KILN_INVALID_ARGUMENT, "\"complex64\" is not a dtype kiln has");
  KT_FAILS(kiln_dtype_from_name(NULL, &got), KILN_INVALID_ARGUMENT, "bf16/bfloat16");
  ck_assert_int_eq(kiln_dtype_class(KILN_BOOL), KILN_DTYPE_CLASS_BOOL);
  ck_assert_int_eq(kiln_dtype_class(KILN_U8), KILN_DTYPE_CLASS_UINT);
  ck_assert_int_eq(kiln_dtype_class(KILN_I16), KILN_DTYPE_CLASS_INT);
  ck_assert_int_eq(kiln_dtype_class(KILN_BF16), KILN_DTYPE_CLASS_FLOAT);
  ck_assert_str_eq(kiln_dtype_name((kiln_dtype_t)10), "?");
  ck_assert_uint_eq(kiln_dtype_size((kiln_dtype_t)10), 0);
}
END_TEST

/* ---- storage --------------------------------------------------------------------------- */

/* from_host, read, item, copy on the device, a permuted view made contiguous
 * and a reshape, for every dtype: the bytes come back unchanged. */
START_TEST(test_storage_round_trip) {
  kiln_device_t *d = kt_cpu();
  for (int dt = 0; dt < KT_NDT; dt++) {
    const kiln_dtype_t dtype = (kiln_dtype_t)dt;
    const size_t es = kiln_dtype_size(dtype);
    uint8_t src[6 * 8], got[6 * 8], want[6 * 8];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 37 + 11);
    if (dtype == KILN_BOOL)
      for (size_t i = 0; i < 6; i++) src[i] = (uint8_t)(i % 2);
    kiln_tensor_t *t = NULL, *c = NULL, *p = NULL, *pc = NULL, *r = NULL;
    KT_OK(kiln_tensor_from_host(d, dtype, 2, (const int64_t[]){2, 3}, src, &t));
    ck_assert_int_eq(kiln_tensor_dtype(t), dtype);
    memset(got, 0, sizeof got);
    KT_OK(kiln_tensor_read(t, got, 6 * es));
    ck_assert_msg(memcmp(got, src, 6 * es) == 0, "%s: read differs", kiln_dtype_name(dtype));
    KT_OK(kiln_tensor_copy(t, d, &c));
    KT_OK(kiln_tensor_read(c, got, 6 * es));
    ck_assert_msg(memcmp(got, src, 6 * es) == 0, "%s: copy differs", kiln_dtype_name(dtype));
    /* The transpose [3, 2]: element (i, j) is src (j, i). */
    KT_OK(kiln_tensor_transpose(t, 0, 1, &p));
    KT_OK(kiln_tensor_contiguous(p, &pc));
    for (int i = 0; i < 3; i++)
      for (int j = 0; j < 2; j++) memcpy(want + (size_t)(i * 2 + j) * es, src + (size_t)(j * 3 + i) * es, es);
    KT_OK(kiln_tensor_read(pc, got, 6 * es));
    ck_assert_msg(memcmp(got, want, 6 * es) == 0, "%s: transpose differs", kiln_dtype_name(dtype));
    KT_OK(kiln_tensor_reshape(p, 1, (const int64_t[]){6}, &r));
    KT_OK(kiln_tensor_read(r, got, 6 * es));
    ck_assert_msg(memcmp(got, want, 6 * es) == 0, "%s: reshape of the transpose differs", kiln_dtype_name(dtype));
    kiln_tensor_t *one = NULL;
    KT_OK(kiln_tensor_reshape(t, 1, (const int64_t[]){6}, &one));
    kiln_tensor_t *e = NULL;
    KT_OK(kiln_tensor_empty(d, dtype, 1, (const int64_t[]){5}, &e));
    ck_assert_int_eq(kiln_tensor_dtype(e), dtype);
    kiln_tensor_release(e);
    kiln_tensor_release(one);
    kiln_tensor_release(r);
    kiln_tensor_release(pc);
    kiln_tensor_release(p);
    kiln_tensor_release(c);
    kiln_tensor_release(t);
  }
}
END_TEST

/* Between two CPU devices (KILN_CPU_DEVICES=2 in this suite). */
START_TEST(test_copy_between_devices) {
  kiln_device_t *d0 = kt_cpu(), *d1 = NULL;
  KT_OK(kiln_device_find("cpu:1", &d1));
  for (int dt = 0; dt < KT_NDT; dt++) {
    const kiln_dtype_t dtype = (kiln_dtype_t)dt;
    const size_t es = kiln_dtype_size(dtype);
    uint8_t src[4 * 8], got[4 * 8];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(dtype == KILN_BOOL ? i % 2 : i * 13 + 5);
    kiln_tensor_t *t = NULL, *u = NULL;
    KT_OK(kiln_tensor_from_host(d0, dtype, 1, (const int64_t[]){4}, src, &t));
    KT_OK(kiln_tensor_to(t, d1, &u));
    ck_assert_ptr_eq(kiln_tensor_device(u), d1);
    KT_OK(kiln_tensor_read(u, got, 4 * es));
    ck_assert_msg(memcmp(got, src, 4 * es) == 0, "%s: cpu:0 -> cpu:1 differs", kiln_dtype_name(dtype));
    kiln_tensor_release(u);
    kiln_tensor_release(t);
  }
}
END_TEST

/* full/zeros/ones convert the value as kiln_tensor_cast does; item reads any dtype. */
START_TEST(test_fill_every_dtype) {
  kiln_device_t *d = kt_cpu();
  static const double values[] = {0.0, 1.0, 2.5, -2.5, 300.0, -1.0, 1e10, -1e10, 65520.0, 1.00390625, NAN, -0.0,
                                  INFINITY, 5.960464477539063e-8};
  for (int dt = 0; dt < KT_NDT; dt++) {
    const kiln_dtype_t dtype = (kiln_dtype_t)dt;
    const size_t es = kiln_dtype_size(dtype);
    for (size_t k = 0; k < KT_COUNT(values); k++) {
      kiln_tensor_t *t = NULL;
      KT_OK(kiln_tensor_full(d, dtype, 1, (const int64_t[]){3}, values[k], &t));
      uint8_t got[3 * 8], want[8];
      kt_store(dtype, (kt_val_t){true, values[k], 0}, want);
      KT_OK(kiln_tensor_read(t, got, 3 * es));
      for (int i = 0; i < 3; i++) {
        if (kt_is_nan_bits(dtype, want))
          ck_assert_msg(kt_quiet_nan_of_sign(dtype, got + i * es, false), "full(%s, NaN) is not a quiet NaN",
                        kiln_dtype_name(dtype));
        else
          ck_assert_msg(memcmp(got + i * es, want, es) == 0, "full(%s, %g) element %d differs", kiln_dtype_name(dtype),
                        values[k], i);
      }
      kiln_tensor_release(t);
    }
    kiln_tensor_t *z = NULL, *o = NULL;
    KT_OK(kiln_tensor_zeros(d, dtype, 0, NULL, &z));
    KT_OK(kiln_tensor_ones(d, dtype, 0, NULL, &o));
    double vz = -1, vo = -1;
    KT_OK(kiln_tensor_item(z, &vz));
    KT_OK(kiln_tensor_item(o, &vo));
    ck_assert_msg(vz == 0.0 && vo == 1.0, "%s: zeros/ones read %g/%g", kiln_dtype_name(dtype), vz, vo);
    kiln_tensor_release(z);
    kiln_tensor_release(o);
  }
}
END_TEST

START_TEST(test_arange_every_dtype) {
  kiln_device_t *d = kt_cpu();
  for (int dt = 0; dt < KT_NDT; dt++) {
    const kiln_dtype_t dtype = (kiln_dtype_t)dt;
    kiln_tensor_t *t = NULL;
    if (dtype == KILN_BOOL) {
      KT_FAILS(kiln_tensor_arange(d, dtype, 0, 2, 1, &t), KILN_DTYPE_MISMATCH, "arange of bool");
      continue;
    }
    KT_OK(kiln_tensor_arange(d, dtype, -3.0, 4.0, 1.5, &t)); /* -3, -1.5, 0, 1.5, 3 */
    ck_assert_int_eq(kiln_tensor_numel(t), 5);
    kiln_tensor_t *f = NULL;
    KT_OK(kiln_tensor_cast(t, KILN_F64, &f));
    double got[5];
    KT_OK(kiln_tensor_read(f, got, sizeof got));
    const bool is_float = kiln_dtype_class(dtype) == KILN_DTYPE_CLASS_FLOAT;
    const double want_f[5] = {-3, -1.5, 0, 1.5, 3}, want_i[5] = {-3, -1, 0, 1, 3}, want_u[5] = {0, 0, 0, 1, 3};
    const double *want = is_float ? want_f : dtype == KILN_U8 ? want_u : want_i;
    for (int i = 0; i < 5; i++)
      ck_assert_msg(got[i] == want[i], "arange %s [%d]: %g, expected %g", kiln_dtype_name(dtype), i, got[i], want[i]);
    kiln_tensor_release(f);
    kiln_tensor_release(t);
  }
}
END_TEST

/* ---- casts ------------------------------------------------------------------------------ */

/* Every pair, every source value, against the reference, bit for bit. */
START_TEST(test_cast_every_pair) {
  kiln_device_t *d = kt_cpu();
  for (int s = 0; s < KT_NDT; s++) {
    const kiln_dtype_t from = (kiln_dtype_t)s;
    size_t n = 0;
    uint8_t *src = kt_sources(from, &n);
    ck_assert_ptr_nonnull(src);
    const size_t ss = kiln_dtype_size(from);
    kiln_tensor_t *t = NULL;
    KT_OK(kiln_tensor_from_host(d, from, 1, (const int64_t[]){(int64_t)n}, src, &t));
    for (int dd = 0; dd < KT_NDT; dd++) {
      const kiln_dtype_t to = (kiln_dtype_t)dd;
      const size_t ds = kiln_dtype_size(to);
      kiln_tensor_t *c = NULL;
      KT_OK(kiln_tensor_cast(t, to, &c));
      ck_assert_int_eq(kiln_tensor_dtype(c), to);
      uint8_t *got = malloc(n * ds);
      KT_OK(kiln_tensor_read(c, got, n * ds));
      size_t bad = 0;
      for (size_t i = 0; i < n; i++) {
        const uint8_t *x = src + i * ss;
        kt_val_t v = kt_load(from, x);
        uint8_t want[8] = {0};
        if (from == to) memcpy(want, x, ss); /* a copy, NaN payloads and all */
        else kt_store(to, v, want);
        bool ok;
        if (from != to && v.is_float && isnan(v.f) && kt_is_nan_bits(to, want))
          ok = kt_quiet_nan_of_sign(to, got + i * ds, signbit(v.f));
        else
          ok = memcmp(got + i * ds, want, ds) == 0;
        if (!ok && bad++ < 3) {
          uint64_t xb = 0, gb = 0, wb = 0;
          memcpy(&xb, x, ss);
          memcpy(&gb, got + i * ds, ds);
          memcpy(&wb, want, ds);
          fprintf(stderr, "cast %s -> %s: source %zu (bits 0x%llx, %.17Lg) gave 0x%llx, expected 0x%llx\n",
                  kiln_dtype_name(from), kiln_dtype_name(to), i, (unsigned long long)xb, v.is_float ? v.f : (long double)v.i,
                  (unsigned long long)gb, (unsigned long long)wb);
        }
      }
      ck_assert_msg(bad == 0, "cast %s -> %s: %zu of %zu elements differ from the reference (first ones on stderr)",
                    kiln_dtype_name(from), kiln_dtype_name(to), bad, n);
      free(got);
      kiln_tensor_release(c);
    }
    kiln_tensor_release(t);
    free(src);
  }
}
END_TEST

/* A few of the rule's cases spelled out (the reference above agrees). */
START_TEST(test_cast_named_cases) {
  kiln_device_t *d = kt_cpu();
  const float f[] = {NAN, INFINITY, -0.0f, 65520.0f, 1.00390625f, 5.9604644775390625e-8f, 2.98023223876953125e-8f,
                     -1.5f, 300.0f};
  kiln_tensor_t *t = NULL, *h = NULL, *b = NULL, *u = NULL, *z = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_F32, 1, (const int64_t[]){9}, f, &t));
  KT_OK(kiln_tensor_cast(t, KILN_F16, &h));
  KT_OK(kiln_tensor_cast(t, KILN_BF16, &b));
  KT_OK(kiln_tensor_cast(t, KILN_U8, &u));
  KT_OK(kiln_tensor_cast(t, KILN_BOOL, &z));
  uint16_t hb[9], bb[9];
  uint8_t ub[9], zb[9];
  KT_OK(kiln_tensor_read(h, hb, sizeof hb));
  KT_OK(kiln_tensor_read(b, bb, sizeof bb));
  KT_OK(kiln_tensor_read(u, ub, sizeof ub));
  KT_OK(kiln_tensor_read(z, zb, sizeof zb));
  const uint16_t want_h[9] = {0x7e00, 0x7c00, 0x8000, 0x7c00, 0x3c04, 0x0001, 0x0000, 0xbe00, 0x5cb0};
  const uint16_t want_b[9] = {0x7fc0, 0x7f80, 0x8000, 0x4780 /* 65536 */, 0x3f80, 0x3380, 0x3300, 0xbfc0, 0x4396};
  const uint8_t want_u[9] = {0, 255, 0, 255, 1, 0, 0, 0, 255};
  const uint8_t want_z[9] = {1, 1, 0, 1, 1, 1, 1, 1, 1};
  for (int i = 0; i < 9; i++) {
    ck_assert_msg(hb[i] == want_h[i], "f32 %g -> f16: 0x%04x, expected 0x%04x", (double)f[i], hb[i], want_h[i]);
    ck_assert_msg(bb[i] == want_b[i], "f32 %g -> bf16: 0x%04x, expected 0x%04x", (double)f[i], bb[i], want_b[i]);
    ck_assert_msg(ub[i] == want_u[i], "f32 %g -> u8: %u, expected %u", (double)f[i], ub[i], want_u[i]);
    ck_assert_msg(zb[i] == want_z[i], "f32 %g -> bool: %u, expected %u", (double)f[i], zb[i], want_z[i]);
  }
  kiln_tensor_release(z);
  kiln_tensor_release(u);
  kiln_tensor_release(b);
  kiln_tensor_release(h);
  kiln_tensor_release(t);
}
END_TEST

/* ---- promotion ---------------------------------------------------------------------------- */

START_TEST(test_promotion_table) {
  static const struct { kiln_dtype_t a, b, want; } rows[] = {
      {KILN_BOOL, KILN_BOOL, KILN_BOOL}, {KILN_BOOL, KILN_I8, KILN_I8},     {KILN_BOOL, KILN_U8, KILN_U8},
      {KILN_BOOL, KILN_F16, KILN_F16},  {KILN_I8, KILN_U8, KILN_I16},      {KILN_U8, KILN_I16, KILN_I16},
      {KILN_U8, KILN_I32, KILN_I32},    {KILN_U8, KILN_I64, KILN_I64},     {KILN_I8, KILN_I16, KILN_I16},
      {KILN_I16, KILN_I32, KILN_I32},   {KILN_I32, KILN_I64, KILN_I64},    {KILN_F16, KILN_F32, KILN_F32},
      {KILN_BF16, KILN_F32, KILN_F32},  {KILN_F16, KILN_BF16, KILN_F32},   {KILN_F32, KILN_F64, KILN_F64},
      {KILN_BF16, KILN_F64, KILN_F64},  {KILN_I64, KILN_F16, KILN_F16},    {KILN_I32, KILN_F32, KILN_F32},
      {KILN_U8, KILN_BF16, KILN_BF16},  {KILN_I64, KILN_F64, KILN_F64},    {KILN_F32, KILN_F32, KILN_F32},
  };
  for (size_t i = 0; i < KT_COUNT(rows); i++) {
    kiln_dtype_t got = KILN_BOOL, back = KILN_BOOL;
    KT_OK(kiln_result_dtype(rows[i].a, rows[i].b, &got));
    KT_OK(kiln_result_dtype(rows[i].b, rows[i].a, &back));
    ck_assert_msg(got == rows[i].want && back == rows[i].want, "%s with %s: %s / %s, expected %s",
                  kiln_dtype_name(rows[i].a), kiln_dtype_name(rows[i].b), kiln_dtype_name(got),
                  kiln_dtype_name(back), kiln_dtype_name(rows[i].want));
  }
  /* Symmetric everywhere, and idempotent. */
  for (int a = 0; a < KT_NDT; a++) {
    kiln_dtype_t same;
    KT_OK(kiln_result_dtype((kiln_dtype_t)a, (kiln_dtype_t)a, &same));
    ck_assert_int_eq(same, a);
    for (int b = 0; b < KT_NDT; b++) {
      kiln_dtype_t x, y;
      KT_OK(kiln_result_dtype((kiln_dtype_t)a, (kiln_dtype_t)b, &x));
      KT_OK(kiln_result_dtype((kiln_dtype_t)b, (kiln_dtype_t)a, &y));
      ck_assert_int_eq(x, y);
    }
  }
  kiln_dtype_t got;
  KT_FAILS(kiln_result_dtype((kiln_dtype_t)42, KILN_F32, &got), KILN_INVALID_ARGUMENT, "dtype 42 is not a kiln_dtype_t");
}
END_TEST

/* Operands of two dtypes are promoted before the op. */
START_TEST(test_binary_promotes) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *i = NULL, *f = NULL, *h = NULL, *u = NULL, *r = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_I32, 1, (const int64_t[]){3}, (const int32_t[]){1, 2, 16777217}, &i));
  KT_OK(kiln_tensor_from_host(d, KILN_F32, 1, (const int64_t[]){3}, (const float[]){0.5f, -4.0f, 0.0f}, &f));
  KT_OK(kiln_tensor_add(i, f, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_F32);
  float got[3];
  KT_OK(kiln_tensor_read(r, got, sizeof got));
  ck_assert(got[0] == 1.5f && got[1] == -2.0f && got[2] == 16777216.0f);
  kiln_tensor_release(r);
  /* f16 with f32 computes in f32; bool with i32 in i32. */
  KT_OK(kiln_tensor_full(d, KILN_F16, 1, (const int64_t[]){3}, 0.25, &h));
  KT_OK(kiln_tensor_mul(f, h, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_F32);
  KT_OK(kiln_tensor_read(r, got, sizeof got));
  ck_assert(got[0] == 0.125f && got[1] == -1.0f && got[2] == 0.0f);
  kiln_tensor_release(r);
  KT_OK(kiln_tensor_full(d, KILN_BOOL, 1, (const int64_t[]){3}, 1.0, &u));
  KT_OK(kiln_tensor_sub(i, u, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_I32);
  int32_t gi[3];
  KT_OK(kiln_tensor_read(r, gi, sizeof gi));
  ck_assert(gi[0] == 0 && gi[1] == 1 && gi[2] == 16777216);
  kiln_tensor_release(r);
  r = NULL;
  /* f16 with bf16 promotes to f32 (which has kernels). */
  kiln_tensor_t *b = NULL;
  KT_OK(kiln_tensor_full(d, KILN_BF16, 1, (const int64_t[]){3}, 2.0, &b));
  KT_OK(kiln_tensor_add(h, b, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_F32);
  kiln_tensor_release(r);
  r = NULL;
  /* i32 with i64 computes in i64 (no wrap at 2^31); bool with bool has no
   * arithmetic (refused before anything runs). */
  kiln_tensor_t *l = NULL;
  KT_OK(kiln_tensor_full(d, KILN_I64, 1, (const int64_t[]){3}, 2147483647.0, &l));
  KT_OK(kiln_tensor_add(i, l, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_I64);
  int64_t gl[3];
  KT_OK(kiln_tensor_read(r, gl, sizeof gl));
  ck_assert(gl[0] == 2147483648LL && gl[1] == 2147483649LL && gl[2] == 2164260864LL);
  kiln_tensor_release(r);
  r = NULL;
  KT_FAILS(kiln_tensor_add(u, u, &r), KILN_DTYPE_MISMATCH, "add does not support dtype bool");
  ck_assert_ptr_null(r);
  kiln_tensor_release(l);
  kiln_tensor_release(b);
  kiln_tensor_release(u);
  kiln_tensor_release(h);
  kiln_tensor_release(f);
  kiln_tensor_release(i);
}
END_TEST

/* ---- refusals ----------------------------------------------------------------------------- */

START_TEST(test_compute_refusals) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *l = NULL, *x = NULL, *m = NULL, *r = NULL, *h = NULL;
  KT_OK(kiln_tensor_zeros(d, KILN_I64, 1, (const int64_t[]){4}, &l));
  KT_OK(kiln_tensor_zeros(d, KILN_F64, 2, (const int64_t[]){2, 2}, &x));
  KT_OK(kiln_tensor_zeros(d, KILN_BOOL, 2, (const int64_t[]){2, 2}, &m));
  KT_OK(kiln_tensor_zeros(d, KILN_F16, 1, (const int64_t[]){4}, &h));
  KT_FAILS(kiln_tensor_sqrt(l, &r), KILN_DTYPE_MISMATCH, "sqrt does not support dtype i64 (a); use f32, f16, bf16 or f64: cast to f32 first");
  KT_FAILS(kiln_tensor_matmul(x, x, false, false, &r), KILN_DTYPE_MISMATCH,
           "matmul does not support dtype f64 (a); use f32: cast to f32 first (kiln_tensor_cast(a, KILN_F32, &a2))");
  KT_FAILS(kiln_tensor_matmul(m, m, false, false, &r), KILN_DTYPE_MISMATCH, "matmul does not support dtype bool");
  KT_FAILS(kiln_tensor_mean(l, KILN_ALL_AXES, false, &r), KILN_DTYPE_MISMATCH, "mean does not support dtype i64");
  KT_FAILS(kiln_tensor_add_scalar(m, 1.0, &r), KILN_DTYPE_MISMATCH,
           "add does not support dtype bool (a); use f32, i32, f16, bf16, f64, i64, i8, u8 or i16: cast to i32 first");
  /* A check of two operands names them both, and its example a placeholder. */
  KT_FAILS(kiln_tensor_add(m, m, &r), KILN_DTYPE_MISMATCH,
           "add does not support dtype bool (a and b); use f32, i32, f16, bf16, f64, i64, i8, u8 or i16: cast to i32 "
           "first (kiln_tensor_cast(x, KILN_I32, &x2))");
  KT_FAILS(kiln_tensor_relu(m, &r), KILN_DTYPE_MISMATCH, "relu does not support dtype bool");
  KT_FAILS(kiln_tensor_exp(l, &r), KILN_DTYPE_MISMATCH, "exp does not support dtype i64 (a); use f32, f16, bf16 or f64");
  KT_FAILS(kiln_tensor_softmax(x, &r), KILN_DTYPE_MISMATCH, "softmax does not support dtype f64");
  ck_assert_ptr_null(r);
  KT_FAILS(kiln_tensor_cast(x, (kiln_dtype_t)10, &r), KILN_INVALID_ARGUMENT, "dtype 10 is not a kiln_dtype_t");
  kiln_tensor_release(h);
  kiln_tensor_release(m);
  kiln_tensor_release(x);
  kiln_tensor_release(l);
}
END_TEST

/* A backend that does not say which dtypes it serves gets f32 and i32 ops
 * only: storage of the others works, every op of them is refused. */
START_TEST(test_device_without_kernels) {
  kiln_deinitialize();
  setenv("KILN_BACKEND", "stub,cpu", 1);
  unsetenv("KILN_CPU_DEVICES");
  kiln_device_t *stub = NULL, *cpu = NULL;
  KT_OK(kiln_device_find("stub:0", &stub));
  KT_OK(kiln_device_find("cpu:0", &cpu));
  ck_assert_int_eq(kiln_device_dtype_support(stub, KILN_F32), KILN_DTYPE_NATIVE);
  ck_assert_int_eq(kiln_device_dtype_support(stub, KILN_I32), KILN_DTYPE_NATIVE);
  ck_assert_int_eq(kiln_device_dtype_support(stub, KILN_F16), KILN_DTYPE_UNSUPPORTED);
  ck_assert_int_eq(kiln_device_dtype_support(stub, KILN_F64), KILN_DTYPE_UNSUPPORTED);
  ck_assert_int_eq(kiln_device_dtype_support(cpu, KILN_F16), KILN_DTYPE_EMULATED);
  ck_assert_int_eq(kiln_device_dtype_support(cpu, KILN_BF16), KILN_DTYPE_EMULATED);
  ck_assert_int_eq(kiln_device_dtype_support(cpu, KILN_F64), KILN_DTYPE_NATIVE);
  ck_assert_int_eq(kiln_device_dtype_support(cpu, KILN_BOOL), KILN_DTYPE_NATIVE);
  ck_assert_int_eq(kiln_device_dtype_support(NULL, KILN_F32), KILN_DTYPE_UNSUPPORTED);
  ck_assert_str_eq(kiln_dtype_support_name(KILN_DTYPE_EMULATED), "emulated");
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_zeros(stub, KILN_F32, 1, (const int64_t[]){4}, &t));
  kiln_tensor_release(t);
  t = NULL;
  KT_FAILS(kiln_tensor_zeros(stub, KILN_F16, 1, (const int64_t[]){4}, &t), KILN_UNSUPPORTED, "has no kernels for f16 yet");
  ck_assert_ptr_null(t);
  /* Storage: an empty tensor, and host data in and out. */
  KT_OK(kiln_tensor_empty(stub, KILN_F64, 1, (const int64_t[]){2}, &t));
  kiln_tensor_release(t);
  kiln_tensor_t *c = NULL;
  KT_OK(kiln_tensor_from_host(cpu, KILN_F64, 1, (const int64_t[]){2}, (const double[]){1.5, -2.0}, &c));
  KT_OK(kiln_tensor_from_host(stub, KILN_F64, 1, (const int64_t[]){2}, (const double[]){1.5, -2.0}, &t));
  kiln_tensor_t *r = NULL;
  KT_FAILS(kiln_tensor_cast(t, KILN_F32, &r), KILN_UNSUPPORTED, "stub:0");
  KT_FAILS(kiln_tensor_cast(t, KILN_F32, &r), KILN_UNSUPPORTED, "f64");
  ck_assert_ptr_null(r);
  kiln_tensor_release(t);
  kiln_tensor_release(c);
  kiln_deinitialize();
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_CPU_DEVICES", "2", 1);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  setenv("KILN_BACKEND", "cpu", 1);
  setenv("KILN_CPU_DEVICES", "2", 1);
  Suite *s = suite_create("dtypes");
  TCase *tc = tcase_create("dtypes");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_dtype_list);
  tcase_add_test(tc, test_storage_round_trip);
  tcase_add_test(tc, test_copy_between_devices);
  tcase_add_test(tc, test_fill_every_dtype);
  tcase_add_test(tc, test_arange_every_dtype);
  tcase_add_test(tc, test_cast_every_pair);
  tcase_add_test(tc, test_cast_named_cases);
  tcase_add_test(tc, test_promotion_table);
  tcase_add_test(tc, test_binary_promotes);
  tcase_add_test(tc, test_compute_refusals);
  tcase_add_test(tc, test_device_without_kernels);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
