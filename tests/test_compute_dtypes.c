/* tests/test_compute_dtypes.c: elementwise ops, comparisons and where in every dtype on cpu:0, against host references written here. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "kernels/dtype_convert.h"

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu:0", &device));
  return device;
}

static kiln_tensor_t *kt_make(kiln_dtype_t dtype, int64_t n, const void *data) {
  kiln_tensor_t *t = NULL;
  KT_OK(kiln_tensor_from_host(kt_cpu(), dtype, 1, (const int64_t[]){n}, data, &t));
  return t;
}

static void kt_read(kiln_tensor_t *t, kiln_dtype_t dtype, void *out, size_t bytes) {
  ck_assert_int_eq(kiln_tensor_dtype(t), dtype);
  KT_OK(kiln_tensor_read(t, out, bytes));
  kiln_tensor_release(t);
}

/* ---- integers wrap in their own width ------------------------------------------ */

/* The wrapped value of v in `bits` bits, signed or not. */
static int64_t kt_wrap(int64_t v, int bits, bool is_signed) {
  if (bits == 64) return v;
  uint64_t m = (uint64_t)v & ((1ull << bits) - 1u);
  if (is_signed && (m >> (bits - 1))) return (int64_t)(m | ~((1ull << bits) - 1u));
  return (int64_t)m;
}

START_TEST(test_integer_arithmetic_wraps) {
  static const struct { kiln_dtype_t dtype; int bits; bool is_signed; } types[] = {
      {KILN_I8, 8, true}, {KILN_U8, 8, false}, {KILN_I16, 16, true}, {KILN_I32, 32, true}, {KILN_I64, 64, true}};
  enum { N = 9 };
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
    const int bits = types[t].bits;
    const bool sg = types[t].is_signed;
    const int64_t max = bits == 64 ? INT64_MAX : sg ? (1ll << (bits - 1)) - 1 : (1ll << bits) - 1;
    const int64_t min = bits == 64 ? INT64_MIN : sg ? -(1ll << (bits - 1)) : 0;
    const int64_t a64[N] = {max, min, 7, -7, 0, max, min, 100, 3};
    const int64_t b64[N] = {1, -1, 2, 2, 0, max, 1, -3, 0};
    char abuf[N * 8], bbuf[N * 8];
    const size_t es = kiln_dtype_size(types[t].dtype);
    for (int i = 0; i < N; i++) {
      int64_t a = kt_wrap(a64[i], bits, sg), b = kt_wrap(b64[i], bits, sg);
      memcpy(abuf + i * es, &a, es); /* little-endian: the low bytes */
      memcpy(bbuf + i * es, &b, es);
    }
    kiln_tensor_t *a = kt_make(types[t].dtype, N, abuf), *b = kt_make(types[t].dtype, N, bbuf);
    for (int op = 0; op < 4; op++) {
      kiln_tensor_t *r = NULL;
      KT_OK(kiln_tensor_binary((kiln_binary_op_t)op, a, b, &r));
      char got[N * 8];
      kt_read(r, types[t].dtype, got, N * es);
      for (int i = 0; i < N; i++) {
        int64_t x = 0, y = 0, g = 0;
        memcpy(&x, abuf + i * es, es);
        memcpy(&y, bbuf + i * es, es);
        memcpy(&g, got + i * es, es);
        x = kt_wrap(x, bits, sg);
        y = kt_wrap(y, bits, sg);
        g = kt_wrap(g, bits, sg);
        int64_t want;
        switch (op) {
        case KILN_BINARY_ADD: want = (int64_t)((uint64_t)x + (uint64_t)y); break;
        case KILN_BINARY_SUB: want = (int64_t)((uint64_t)x - (uint64_t)y); break;
        case KILN_BINARY_MUL: want = (int64_t)((uint64_t)x * (uint64_t)y); break;
        default: want = y == 0 ? 0 : y == -1 ? (int64_t)(0 - (uint64_t)x) : x / y; break;
        }
        want = kt_wrap(want, bits, sg);
        ck_assert_msg(g == want, "%s op %d element %d: %lld (op) %lld gave %lld, want %lld",
                      kiln_dtype_name(types[t].dtype), op, i, (long long)x, (long long)y, (long long)g, (long long)want);
      }
    }
    /* neg and abs wrap at the minimum; relu keeps u8 as it is. */
    kiln_tensor_t *r = NULL;
    KT_OK(kiln_tensor_neg(a, &r));
    char got[N * 8];
    kt_read(r, types[t].dtype, got, N * es);
    int64_t g1 = 0;
    memcpy(&g1, got + 1 * es, es);
    ck_assert_int_eq(kt_wrap(g1, bits, sg), sg ? min : 0);
    KT_OK(kiln_tensor_abs(a, &r));
    kt_read(r, types[t].dtype, got, N * es);
    memcpy(&g1, got + 3 * es, es);
    ck_assert_int_eq(kt_wrap(g1, bits, sg), sg ? 7 : kt_wrap(-7, bits, sg));
    /* A scalar is the value in the dtype by the cast rule (saturating). */
    KT_OK(kiln_tensor_add_scalar(a, 1000.0, &r));
    kt_read(r, types[t].dtype, got, N * es);
    memcpy(&g1, got + 4 * es, es);
    ck_assert_int_eq(kt_wrap(g1, bits, sg), max < 1000 ? max : 1000);
    kiln_tensor_release(a);
    kiln_tensor_release(b);
  }
}
END_TEST

/* ---- floats: f64 natively, f16 and bf16 through f32 ------------------------------- */

START_TEST(test_f64_computes_in_f64) {
  const double x[4] = {1.0 + 0x1p-40, -2.5, 1e-300, 700.0};
  kiln_tensor_t *t = kt_make(KILN_F64, 4, x), *r = NULL;
  double got[4];
  KT_OK(kiln_tensor_mul(t, t, &r));
  kt_read(r, KILN_F64, got, sizeof got);
  for (int i = 0; i < 4; i++) ck_assert(got[i] == x[i] * x[i]);
  KT_OK(kiln_tensor_exp(t, &r));
  kt_read(r, KILN_F64, got, sizeof got);
  for (int i = 0; i < 4; i++) ck_assert(got[i] == exp(x[i]));
  KT_OK(kiln_tensor_sub_scalar(t, 0.1, &r));
  kt_read(r, KILN_F64, got, sizeof got);
  for (int i = 0; i < 4; i++) ck_assert(got[i] == x[i] - 0.1);
  kiln_tensor_release(t);
}
END_TEST

/* Whether 16-bit bits are a NaN of f16 (h == 0) or bf16 (h == 1): which
 * operand's NaN a product keeps is the compiler's choice (it may swap the
 * operands), so a NaN result matches any NaN. */
static bool kt_half_nan(int h, uint16_t x) {
  return h ? (x & 0x7f80u) == 0x7f80u && (x & 0x7fu) : (x & 0x7c00u) == 0x7c00u && (x & 0x3ffu);
}

/* Products of two 16-bit floats are exact in f32, so mul of f16 (bf16) is the
 * exact product rounded once: the same bits as kernels/dtype_convert.h's
 * rounding of it, over random pairs and every special class. */
START_TEST(test_half_mul_rounds_once) {
  enum { N = 1 << 16 };
  uint16_t *a = malloc(N * 2), *b = malloc(N * 2), *got = malloc(N * 2);
  ck_assert(a && b && got);
  for (int h = 0; h < 2; h++) {
    const kiln_dtype_t dtype = h ? KILN_BF16 : KILN_F16;
    uint32_t state = 12345u;
    for (int i = 0; i < N; i++) {
      a[i] = (uint16_t)i; /* every pattern once */
      state = state * 1664525u + 1013904223u;
      b[i] = (uint16_t)(state >> 16);
    }
    kiln_tensor_t *ta = kt_make(dtype, N, a), *tb = kt_make(dtype, N, b), *r = NULL;
    KT_OK(kiln_tensor_mul(ta, tb, &r));
    kt_read(r, dtype, got, N * 2);
    for (int i = 0; i < N; i++) {
      const float fa = h ? kiln_dc_bf16_to_f32(a[i]) : kiln_dc_f16_to_f32(a[i]);
      const float fb = h ? kiln_dc_bf16_to_f32(b[i]) : kiln_dc_f16_to_f32(b[i]);
      const float p = fa * fb;
      const uint16_t want = h ? kiln_dc_f64_to_bf16((double)p) : kiln_dc_f64_to_f16((double)p);
      ck_assert_msg(got[i] == want || (kt_half_nan(h, got[i]) && kt_half_nan(h, want)),
                    "%s %04x * %04x: got %04x, want %04x", kiln_dtype_name(dtype), a[i], b[i], got[i], want);
    }
    /* exp rounds expf's result once; a strided (transposed) view too. */
    KT_OK(kiln_tensor_exp(ta, &r));
    kt_read(r, dtype, got, N * 2);
    for (int i = 0; i < N; i += 7) {
      const float fa = h ? kiln_dc_bf16_to_f32(a[i]) : kiln_dc_f16_to_f32(a[i]);
      const uint16_t want = h ? kiln_dc_f64_to_bf16((double)expf(fa)) : kiln_dc_f64_to_f16((double)expf(fa));
      ck_assert_msg(got[i] == want || (kt_half_nan(h, got[i]) && kt_half_nan(h, want)), "exp %s %04x: got %04x, want %04x",
                    kiln_dtype_name(dtype), a[i], got[i], want);
    }
    kiln_tensor_t *m = NULL, *mt = NULL;
    KT_OK(kiln_tensor_reshape(ta, 2, (const int64_t[]){256, 256}, &m));
    KT_OK(kiln_tensor_transpose(m, 0, 1, &mt));
    KT_OK(kiln_tensor_add_scalar(mt, 0.5, &r));
    kt_read(r, dtype, got, N * 2);
    for (int i = 0; i < 256; i++)
      for (int j = 0; j < 256; j++) {
        const uint16_t x = a[j * 256 + i];
        const float fx = h ? kiln_dc_bf16_to_f32(x) : kiln_dc_f16_to_f32(x);
        const uint16_t want = h ? kiln_dc_f64_to_bf16((double)(fx + 0.5f)) : kiln_dc_f64_to_f16((double)(fx + 0.5f));
        ck_assert_msg(got[i * 256 + j] == want || (kt_half_nan(h, got[i * 256 + j]) && kt_half_nan(h, want)),
                      "transposed add %04x: got %04x, want %04x", x, got[i * 256 + j], want);
      }
    kiln_tensor_release(mt);
    kiln_tensor_release(m);
    kiln_tensor_release(ta);
    kiln_tensor_release(tb);
  }
  free(a);
  free(b);
  free(got);
}
END_TEST

/* Every float formula of kernels/ops.def in f16 and bf16, evaluated here on
 * the f32 values of the operands and rounded once: the kernels' bits
 * (whichever path runs them: the CPU's one-pass rows or the widened f32
 * rows), for every 16-bit pattern, in runs whose lengths leave a tail, with
 * either operand broadcast and with a scalar operand. A NaN result is exact
 * too (sign and payload, quiet), except of two NaN operands, where which
 * one survives is the compiler's operand order. */
#define KILN_F_EXP(x) expf(x)
#define KILN_F_LOG(x) logf(x)
#define KILN_F_SQRT(x) sqrtf(x)
#define KILN_F_TANH(x) tanhf(x)
#define KILN_F_FABS(x) fabsf(x)
static float kt_unary_ref(kiln_unary_op_t op, float x) {
  switch (op) {
#define KILN_UNARY_FLOAT(NAME, expr) \
  case KILN_UNARY_##NAME:            \
    return (float)(expr);
#include "kernels/ops.def"
  default: return 0.0f;
  }
}
static float kt_binary_ref(kiln_binary_op_t op, float a, float b) {
  switch (op) {
#define KILN_BINARY_FLOAT(NAME, expr) \
  case KILN_BINARY_##NAME:            \
    return (float)(expr);
#include "kernels/ops.def"
  default: return 0.0f;
  }
}

static float kt_half_load(int h, uint16_t x) { return h ? kiln_dc_bf16_to_f32(x) : kiln_dc_f16_to_f32(x); }
static uint16_t kt_half_store(int h, float y) { return h ? kiln_dc_f64_to_bf16((double)y) : kiln_dc_f64_to_f16((double)y); }

START_TEST(test_half_formulas_bit_exact) {
  enum { N = (1 << 16) + 13 }; /* every pattern, and a tail of 13 */
  uint16_t *a = malloc(N * 2), *b = malloc(N * 2), *got = malloc(N * 2);
  ck_assert(a && b && got);
  for (int h = 0; h < 2; h++) {
    const kiln_dtype_t dtype = h ? KILN_BF16 : KILN_F16;
    uint32_t state = 777u;
    for (int i = 0; i < N; i++) {
      a[i] = (uint16_t)i;
      state = state * 1664525u + 1013904223u;
      b[i] = (uint16_t)(state >> 16);
    }
    kiln_tensor_t *ta = kt_make(dtype, N, a), *tb = kt_make(dtype, N, b), *r = NULL;
    /* One element of b, broadcast; a short run (one block and a tail). */
    const uint16_t one = h ? 0x3fc0u : 0x3e00u; /* 1.5 */
    kiln_tensor_t *t1 = kt_make(dtype, 1, &one), *ts = NULL;
    KT_OK(kiln_tensor_slice(ta, 0, 1000, 1021, 1, &ts)); /* 21 elements from 1000 */
    for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
      KT_OK(kiln_tensor_unary((kiln_unary_op_t)op, ta, &r));
      kt_read(r, dtype, got, N * 2);
      for (int i = 0; i < N; i++) {
        const uint16_t want = kt_half_store(h, kt_unary_ref((kiln_unary_op_t)op, kt_half_load(h, a[i])));
        ck_assert_msg(got[i] == want, "unary %d %s %04x: got %04x, want %04x", op, kiln_dtype_name(dtype), a[i],
                      got[i], want);
      }
      KT_OK(kiln_tensor_unary((kiln_unary_op_t)op, ts, &r));
      kt_read(r, dtype, got, 21 * 2);
      for (int i = 0; i < 21; i++)
        ck_assert(got[i] == kt_half_store(h, kt_unary_ref((kiln_unary_op_t)op, kt_half_load(h, a[1000 + i]))));
    }
    for (int op = 0; op < KILN_BINARY_COUNT_; op++) {
      for (int form = 0; form < 4; form++) {
        /* 0: a op b; 1: a op one (broadcast); 2: one op b; 3: a op 0.75 (a scalar). */
        if (form == 0) KT_OK(kiln_tensor_binary((kiln_binary_op_t)op, ta, tb, &r));
        if (form == 1) KT_OK(kiln_tensor_binary((kiln_binary_op_t)op, ta, t1, &r));
        if (form == 2) KT_OK(kiln_tensor_binary((kiln_binary_op_t)op, t1, tb, &r));
        if (form == 3) KT_OK(kiln_tensor_binary_scalar((kiln_binary_op_t)op, ta, 0.75, &r));
        kt_read(r, dtype, got, N * 2);
        for (int i = 0; i < N; i++) {
          const float fa = form == 2 ? 1.5f : kt_half_load(h, a[i]);
          const float fb = form == 0 || form == 2 ? kt_half_load(h, b[i]) : form == 1 ? 1.5f : 0.75f;
          const uint16_t want = kt_half_store(h, kt_binary_ref((kiln_binary_op_t)op, fa, fb));
          const bool both_nan = fa != fa && fb != fb;
          ck_assert_msg(got[i] == want || (both_nan && kt_half_nan(h, got[i])),
                        "binary %d form %d %s %04x, %04x: got %04x, want %04x", op, form, kiln_dtype_name(dtype),
                        form == 2 ? one : a[i], form == 0 || form == 2 ? b[i] : one, got[i], want);
        }
      }
    }
    kiln_tensor_release(ts);
    kiln_tensor_release(t1);
    kiln_tensor_release(ta);
    kiln_tensor_release(tb);
  }
  free(a);
  free(b);
  free(got);
}
END_TEST

/* ---- comparisons and logical operations -> bool --------------------------------- */

START_TEST(test_comparisons) {
  const float fa[6] = {1.0f, NAN, -0.0f, 2.0f, -1.0f, 0.0f};
  const float fb[6] = {1.0f, NAN, 0.0f, 3.0f, -2.0f, 5.0f};
  /* Expected, per comparison: equal, not_equal, less, less_equal, greater,
   * greater_equal, and, or, xor. */
  static const uint8_t want[KILN_COMPARE_COUNT_][6] = {
      {1, 0, 1, 0, 0, 0}, {0, 1, 0, 1, 1, 1}, {0, 0, 0, 1, 0, 1}, {1, 0, 1, 1, 0, 1}, {0, 0, 0, 0, 1, 0},
      {1, 0, 1, 0, 1, 0}, {1, 1, 0, 1, 1, 0}, {1, 1, 0, 1, 1, 1}, {0, 0, 0, 0, 0, 1}};
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    kiln_tensor_t *a0 = kt_make(KILN_F32, 6, fa), *b0 = kt_make(KILN_F32, 6, fb), *a = NULL, *b = NULL;
    KT_OK(kiln_tensor_cast(a0, dtypes[d], &a));
    KT_OK(kiln_tensor_cast(b0, dtypes[d], &b));
    for (int op = 0; op < KILN_COMPARE_COUNT_; op++) {
      kiln_tensor_t *r = NULL;
      uint8_t got[6];
      KT_OK(kiln_tensor_compare((kiln_compare_op_t)op, a, b, &r));
      kt_read(r, KILN_BOOL, got, sizeof got);
      for (int i = 0; i < 6; i++)
        ck_assert_msg(got[i] == want[op][i], "%s compare %d element %d: got %d, want %d", kiln_dtype_name(dtypes[d]), op,
                      i, got[i], want[op][i]);
    }
    kiln_tensor_release(a0);
    kiln_tensor_release(b0);
    kiln_tensor_release(a);
    kiln_tensor_release(b);
  }
  /* Integers of two dtypes are promoted (u8 255 with i8 -1 in i16), bool
   * compares as 0/1, and logical_not is == 0. */
  kiln_tensor_t *u = kt_make(KILN_U8, 3, (const uint8_t[]){255, 0, 7}), *s = kt_make(KILN_I8, 3, (const int8_t[]){-1, 0, 7});
  kiln_tensor_t *r = NULL;
  uint8_t got[3];
  KT_OK(kiln_tensor_greater(u, s, &r));
  kt_read(r, KILN_BOOL, got, sizeof got);
  ck_assert(got[0] == 1 && got[1] == 0 && got[2] == 0);
  KT_OK(kiln_tensor_logical_not(u, &r));
  kt_read(r, KILN_BOOL, got, sizeof got);
  ck_assert(got[0] == 0 && got[1] == 1 && got[2] == 0);
  kiln_tensor_t *t = kt_make(KILN_BOOL, 3, (const uint8_t[]){1, 0, 1}), *f = kt_make(KILN_BOOL, 3, (const uint8_t[]){0, 0, 1});
  KT_OK(kiln_tensor_logical_xor(t, f, &r));
  kt_read(r, KILN_BOOL, got, sizeof got);
  ck_assert(got[0] == 1 && got[1] == 0 && got[2] == 0);
  /* i64 beyond 2^53 compares exactly. */
  kiln_tensor_t *l1 = kt_make(KILN_I64, 1, (const int64_t[]){(1ll << 53) + 1}), *l2 = kt_make(KILN_I64, 1, (const int64_t[]){1ll << 53});
  KT_OK(kiln_tensor_not_equal(l1, l2, &r));
  kt_read(r, KILN_BOOL, got, 1);
  ck_assert_int_eq(got[0], 1);
  KT_FAILS(kiln_tensor_compare((kiln_compare_op_t)99, t, f, &r), KILN_INVALID_ARGUMENT, "op 99 is not a kiln_compare_op_t");
  kiln_tensor_release(l1);
  kiln_tensor_release(l2);
  kiln_tensor_release(t);
  kiln_tensor_release(f);
  kiln_tensor_release(u);
  kiln_tensor_release(s);
}
END_TEST

/* ---- where: a bool condition, values of any dtype, promotion ------------------------ */

START_TEST(test_where_every_dtype) {
  kiln_tensor_t *c = kt_make(KILN_BOOL, 4, (const uint8_t[]){1, 0, 0, 1}), *r = NULL;
  kiln_tensor_t *a = kt_make(KILN_I64, 4, (const int64_t[]){1ll << 40, 2, 3, -4});
  kiln_tensor_t *b = kt_make(KILN_I64, 4, (const int64_t[]){5, 6, 7, 8});
  int64_t gl[4];
  KT_OK(kiln_tensor_where(c, a, b, &r));
  kt_read(r, KILN_I64, gl, sizeof gl);
  ck_assert(gl[0] == 1ll << 40 && gl[1] == 6 && gl[2] == 7 && gl[3] == -4);
  /* f16 values, an f16 condition (-0 is false, NaN true). */
  kiln_tensor_t *h = kt_make(KILN_F16, 4, (const uint16_t[]){0x3c00, 0x8000, 0x7e00, 0x0000});
  kiln_tensor_t *hv = kt_make(KILN_F16, 4, (const uint16_t[]){0x4000, 0x4000, 0x4000, 0x4000});
  kiln_tensor_t *hz = kt_make(KILN_F16, 4, (const uint16_t[]){0x1111, 0x1111, 0x1111, 0x1111});
  uint16_t gh[4];
  KT_OK(kiln_tensor_where(h, hv, hz, &r));
  kt_read(r, KILN_F16, gh, sizeof gh);
  ck_assert(gh[0] == 0x4000 && gh[1] == 0x1111 && gh[2] == 0x4000 && gh[3] == 0x1111);
  /* i64 with f16 promotes to f16. */
  KT_OK(kiln_tensor_where(c, b, hv, &r));
  kt_read(r, KILN_F16, gh, sizeof gh);
  ck_assert(gh[0] == 0x4500 && gh[1] == 0x4000 && gh[2] == 0x4000 && gh[3] == 0x4800); /* 5, 2, 2, 8 */
  kiln_tensor_release(h);
  kiln_tensor_release(hv);
  kiln_tensor_release(hz);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_tensor_release(c);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  setenv("KILN_BACKEND", "cpu", 1);
  Suite *s = suite_create("compute_dtypes");
  TCase *tc = tcase_create("compute_dtypes");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_integer_arithmetic_wraps);
  tcase_add_test(tc, test_f64_computes_in_f64);
  tcase_add_test(tc, test_half_mul_rounds_once);
  tcase_add_test(tc, test_half_formulas_bit_exact);
  tcase_add_test(tc, test_comparisons);
  tcase_add_test(tc, test_where_every_dtype);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
