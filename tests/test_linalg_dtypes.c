/* tests/test_linalg_dtypes.c: matmul, conv2d and its gradients, max_pool2d and random in f64, f16 and bf16 on cpu:0, against references and the f32 ops. */
#include <math.h>
#include <stdint.h>

#include "common.h"

/* kiln_philox_normal_f64, the f64 normal's reference (its log, sqrt and cos
 * against libm: tests/test_philox.c). */
#define KILN_U32 uint32_t
#define KILN_U64 uint64_t
#define KILN_PHILOX_FN static inline
#define KILN_PHILOX_F64 1
#include "philox.h"

static kiln_device_t *kt_cpu(void) {
  kiln_device_t *device = NULL;
  KT_OK(kiln_device_find("cpu:0", &device));
  return device;
}

/* The providers of matmul on cpu:0 ("native", and "blas" when kiln was built
 * with a CBLAS). */
static int kt_providers(const char *names[2]) {
  const char *list = kiln_device_providers(kt_cpu(), "matmul");
  int n = 0;
  names[n++] = "native";
  if (list && strstr(list, "blas")) names[n++] = "blas";
  return n;
}

static void kt_force(const char *provider) {
  char spec[64];
  snprintf(spec, sizeof spec, "matmul=%s", provider);
  KT_OK(kiln_set_providers(spec));
}

/* A reproducible sequence: small integers in [-8, 8], or values in [-1, 1). */
static uint64_t kt_state;
static double kt_next(bool integer) {
  kt_state = kt_state * 6364136223846793005ull + 1442695040888963407ull;
  const uint32_t r = (uint32_t)(kt_state >> 33);
  return integer ? (double)(int)(r % 17u) - 8.0 : (double)r / 2147483648.0 - 1.0;
}

/* One product shape: batch (a_batch, b_batch: 0 for a 2-D operand), m, n, k
 * and the transposes. */
typedef struct kt_shape_t {
  int64_t a_batch, b_batch, m, n, k;
  bool ta, tb;
} kt_shape_t;

static const kt_shape_t kt_shapes[] = {
    {0, 0, 13, 37, 300, false, false}, /* edge tiles both ways, two k blocks */
    {0, 0, 64, 48, 32, true, false},   {0, 0, 7, 19, 11, false, true}, {0, 0, 20, 33, 270, true, true},
    {0, 0, 1, 40, 17, false, false},   /* one row */
    {0, 0, 40, 1, 17, false, true},    /* one column */
    {3, 3, 9, 10, 12, false, false},   {3, 0, 6, 17, 5, true, false}, /* b shared by the batch */
    {0, 2, 5, 16, 8, false, true},
};

/* Storage of op's operand: [batch,] rows x cols, rows/cols swapped when
 * transposed, as a 2-D or 3-D tensor. */
static void kt_dims(int64_t batch, int64_t r, int64_t c, bool t, int *ndim, int64_t shape[3]) {
  *ndim = 0;
  if (batch) shape[(*ndim)++] = batch;
  shape[(*ndim)++] = t ? c : r;
  shape[(*ndim)++] = t ? r : c;
}

/* C = op(A) op(B) in double (long double sums), from host copies. */
static void kt_reference(const kt_shape_t *s, const double *a, const double *b, double *c) {
  const int64_t nb = s->a_batch > s->b_batch ? s->a_batch : s->b_batch ? s->b_batch : 1;
  for (int64_t t = 0; t < nb; t++) {
    const double *at = a + (s->a_batch ? t * s->m * s->k : 0), *bt = b + (s->b_batch ? t * s->k * s->n : 0);
    for (int64_t i = 0; i < s->m; i++)
      for (int64_t j = 0; j < s->n; j++) {
        long double sum = 0;
        for (int64_t l = 0; l < s->k; l++) {
          const double x = s->ta ? at[l * s->m + i] : at[i * s->k + l];
          const double y = s->tb ? bt[j * s->k + l] : bt[l * s->n + j];
          sum += (long double)x * y;
        }
        c[(t * s->m + i) * s->n + j] = (double)sum;
      }
  }
}

static int64_t kt_batch(const kt_shape_t *s) {
  const int64_t b = s->a_batch > s->b_batch ? s->a_batch : s->b_batch;
  return b ? b : 1;
}

/* f64 matmul through `provider` against the double reference: exact for
 * small integers (every partial sum is an integer below 2^53), within 1e-12
 * of sum |a||b| otherwise. */
static void kt_check_f64(const char *provider, const kt_shape_t *s, bool integer) {
  kiln_device_t *d = kt_cpu();
  const int64_t na = (s->a_batch ? s->a_batch : 1) * s->m * s->k, nb = (s->b_batch ? s->b_batch : 1) * s->k * s->n;
  const int64_t nc = kt_batch(s) * s->m * s->n;
  double *a = malloc(sizeof(double) * (size_t)na), *b = malloc(sizeof(double) * (size_t)nb);
  double *ref = malloc(sizeof(double) * (size_t)nc), *got = malloc(sizeof(double) * (size_t)nc);
  double *aa = malloc(sizeof(double) * (size_t)na), *ab = malloc(sizeof(double) * (size_t)nb);
  double *bound = malloc(sizeof(double) * (size_t)nc);
  for (int64_t i = 0; i < na; i++) aa[i] = fabs(a[i] = kt_next(integer));
  for (int64_t i = 0; i < nb; i++) ab[i] = fabs(b[i] = kt_next(integer));
  kt_reference(s, a, b, ref);
  kt_reference(s, aa, ab, bound);
  int ndim;
  int64_t shape[3];
  kiln_tensor_t *ta = NULL, *tb = NULL, *tc = NULL;
  kt_dims(s->a_batch, s->m, s->k, s->ta, &ndim, shape);
  KT_OK(kiln_tensor_from_host(d, KILN_F64, ndim, shape, a, &ta));
  kt_dims(s->b_batch, s->k, s->n, s->tb, &ndim, shape);
  KT_OK(kiln_tensor_from_host(d, KILN_F64, ndim, shape, b, &tb));
  kt_force(provider);
  KT_OK(kiln_tensor_matmul(ta, tb, s->ta, s->tb, &tc));
  ck_assert_str_eq(kiln_last_provider(), provider);
  ck_assert_int_eq(kiln_tensor_dtype(tc), KILN_F64);
  KT_OK(kiln_tensor_read(tc, got, sizeof(double) * (size_t)nc));
  for (int64_t i = 0; i < nc; i++) {
    if (integer)
      ck_assert_msg(got[i] == ref[i], "%s f64 %lldx%lldx%lld: C[%lld] = %.17g, expected %.17g", provider,
                    (long long)s->m, (long long)s->n, (long long)s->k, (long long)i, got[i], ref[i]);
    else
      ck_assert_msg(fabs(got[i] - ref[i]) <= 1e-12 * bound[i], "%s f64: C[%lld] = %.17g, expected %.17g", provider,
                    (long long)i, got[i], ref[i]);
  }
  kiln_tensor_release(tc);
  kiln_tensor_release(tb);
  kiln_tensor_release(ta);
  free(a), free(b), free(ref), free(got), free(aa), free(ab), free(bound);
}

START_TEST(test_matmul_f64) {
  const char *providers[2];
  const int np = kt_providers(providers);
  kt_state = 1;
  for (int p = 0; p < np; p++)
    for (size_t i = 0; i < sizeof kt_shapes / sizeof kt_shapes[0]; i++) {
      kt_check_f64(providers[p], &kt_shapes[i], true);
      kt_check_f64(providers[p], &kt_shapes[i], false);
    }
  /* Large enough to be split across the device's threads and the k blocks. */
  const kt_shape_t big = {0, 0, 203, 170, 530, false, false};
  for (int p = 0; p < np; p++) {
    kt_check_f64(providers[p], &big, true);
    kt_check_f64(providers[p], &big, false);
  }
  KT_OK(kiln_set_providers(""));
}
END_TEST

/* A 16-bit float's bits as an integer that counts ulps (-0 and +0 both 0). */
static int kt_ord16(uint16_t bits) { return bits & 0x8000u ? -(int)(bits & 0x7fffu) : (int)bits; }

/* f16 and bf16: the f32 product of the widened operands, rounded once to
 * the dtype (the f32 op run here gives the expectation). f16 is that very
 * computation, bit for bit. bf16 runs on the CPU's own bf16 unit where it
 * has one (AMX, AVX-512 BF16): f32 sums in the hardware's order, so a sum
 * near a rounding boundary of bf16 may land one ulp away, and no more; with
 * `integer` operands every sum is exact in f32 and the bits are the same.
 * The `blas` provider has no 16-bit GEMM: forcing it runs `native`. */
static void kt_check_lowp(kiln_dtype_t dtype, const kt_shape_t *s, bool integer) {
  kiln_device_t *d = kt_cpu();
  const int64_t na = (s->a_batch ? s->a_batch : 1) * s->m * s->k, nb = (s->b_batch ? s->b_batch : 1) * s->k * s->n;
  const int64_t nc = kt_batch(s) * s->m * s->n;
  float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
  for (int64_t i = 0; i < na; i++) a[i] = (float)(kt_next(integer) * (integer ? 1.0 : 3.0));
  for (int64_t i = 0; i < nb; i++) b[i] = (float)(kt_next(integer) * (integer ? 1.0 : 3.0));
  int ndim;
  int64_t shape[3];
  kiln_tensor_t *fa = NULL, *fb = NULL, *ha = NULL, *hb = NULL, *wa = NULL, *wb = NULL;
  kt_dims(s->a_batch, s->m, s->k, s->ta, &ndim, shape);
  KT_OK(kiln_tensor_from_host(d, KILN_F32, ndim, shape, a, &fa));
  kt_dims(s->b_batch, s->k, s->n, s->tb, &ndim, shape);
  KT_OK(kiln_tensor_from_host(d, KILN_F32, ndim, shape, b, &fb));
  KT_OK(kiln_tensor_cast(fa, dtype, &ha));
  KT_OK(kiln_tensor_cast(fb, dtype, &hb));
  KT_OK(kiln_tensor_cast(ha, KILN_F32, &wa));
  KT_OK(kiln_tensor_cast(hb, KILN_F32, &wb));
  kiln_tensor_t *want32 = NULL, *want = NULL;
  KT_OK(kiln_set_providers("matmul=native"));
  KT_OK(kiln_tensor_matmul(wa, wb, s->ta, s->tb, &want32));
  KT_OK(kiln_tensor_cast(want32, dtype, &want));
  uint16_t *expect = malloc(sizeof(uint16_t) * (size_t)nc), *got = malloc(sizeof(uint16_t) * (size_t)nc);
  KT_OK(kiln_tensor_read(want, expect, sizeof(uint16_t) * (size_t)nc));
  const char *providers[2];
  const int np = kt_providers(providers);
  for (int p = 0; p < np; p++) {
    kiln_tensor_t *c = NULL;
    kt_force(providers[p]);
    KT_OK(kiln_tensor_matmul(ha, hb, s->ta, s->tb, &c));
    ck_assert_str_eq(kiln_last_provider(), "native");
    ck_assert_int_eq(kiln_tensor_dtype(c), dtype);
    KT_OK(kiln_tensor_read(c, got, sizeof(uint16_t) * (size_t)nc));
    const int ulps = dtype == KILN_BF16 && !integer ? 1 : 0;
    int64_t off = 0;
    for (int64_t i = 0; i < nc; i++) {
      ck_assert_msg(abs(kt_ord16(got[i]) - kt_ord16(expect[i])) <= ulps,
                    "%s %s %lldx%lldx%lld: C[%lld] = 0x%04x, expected 0x%04x (%d ulp allowed)",
                    kiln_dtype_name(dtype), providers[p], (long long)s->m, (long long)s->n, (long long)s->k,
                    (long long)i, got[i], expect[i], ulps);
      off += got[i] != expect[i];
    }
    /* One ulp off only near a rounding boundary: rare. */
    ck_assert_msg(off * 100 <= nc, "%s %lldx%lldx%lld: %lld of %lld elements one ulp off", kiln_dtype_name(dtype),
                  (long long)s->m, (long long)s->n, (long long)s->k, (long long)off, (long long)nc);
    kiln_tensor_release(c);
  }
  KT_OK(kiln_set_providers(""));
  kiln_tensor_release(want);
  kiln_tensor_release(want32);
  kiln_tensor_release(wb);
  kiln_tensor_release(wa);
  kiln_tensor_release(hb);
  kiln_tensor_release(ha);
  kiln_tensor_release(fb);
  kiln_tensor_release(fa);
  free(a), free(b), free(expect), free(got);
}

START_TEST(test_matmul_f16_bf16) {
  kt_state = 2;
  for (size_t i = 0; i < sizeof kt_shapes / sizeof kt_shapes[0]; i++)
    for (int integer = 0; integer < 2; integer++) {
      kt_check_lowp(KILN_F16, &kt_shapes[i], integer);
      kt_check_lowp(KILN_BF16, &kt_shapes[i], integer);
    }
  /* Large enough for the thread grid, k blocks, partial tiles and an odd k;
   * each transpose. */
  const kt_shape_t big[] = {{0, 0, 130, 97, 400, false, true}, {0, 0, 70, 301, 517, true, false},
                            {2, 0, 33, 65, 31, true, true},
                            /* many small products: one per thread */
                            {8, 8, 64, 64, 64, false, false}};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
    for (int integer = 0; integer < 2; integer++) {
      kt_check_lowp(KILN_F16, &big[i], integer);
      kt_check_lowp(KILN_BF16, &big[i], integer);
    }
}
END_TEST

/* Mixed float operands promote as binary ops do: f64 with anything is f64,
 * f16 with bf16 is f32. */
START_TEST(test_matmul_promotes) {
  kiln_device_t *d = kt_cpu();
  const int64_t shape[2] = {2, 2};
  kiln_tensor_t *x64 = NULL, *x32 = NULL, *x16 = NULL, *xb = NULL, *r = NULL;
  KT_OK(kiln_tensor_from_host(d, KILN_F64, 2, shape, (const double[]){1, 2, 3, 4}, &x64));
  KT_OK(kiln_tensor_from_host(d, KILN_F32, 2, shape, (const float[]){0.5f, -1, 2, 0.25f}, &x32));
  KT_OK(kiln_tensor_cast(x32, KILN_F16, &x16));
  KT_OK(kiln_tensor_cast(x32, KILN_BF16, &xb));
  KT_OK(kiln_tensor_matmul(x64, x32, false, false, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_F64);
  double c64[4];
  KT_OK(kiln_tensor_read(r, c64, sizeof c64));
  ck_assert(c64[0] == 4.5 && c64[1] == -0.5 && c64[2] == 9.5 && c64[3] == -2.0);
  kiln_tensor_release(r);
  r = NULL;
  KT_OK(kiln_tensor_matmul(x16, xb, false, false, &r));
  ck_assert_int_eq(kiln_tensor_dtype(r), KILN_F32);
  float c32[4];
  KT_OK(kiln_tensor_read(r, c32, sizeof c32));
  ck_assert(c32[0] == -1.75f && c32[1] == -0.75f && c32[2] == 1.5f && c32[3] == -1.9375f);
  kiln_tensor_release(r);
  kiln_tensor_release(xb);
  kiln_tensor_release(x16);
  kiln_tensor_release(x32);
  kiln_tensor_release(x64);
}
END_TEST

START_TEST(test_matmul_refusals) {
  kiln_device_t *d = kt_cpu();
  kiln_tensor_t *i = NULL, *m = NULL, *f = NULL, *r = NULL;
  KT_OK(kiln_tensor_zeros(d, KILN_I32, 2, (const int64_t[]){2, 2}, &i));
  KT_OK(kiln_tensor_zeros(d, KILN_BOOL, 2, (const int64_t[]){2, 2}, &m));
  KT_OK(kiln_tensor_zeros(d, KILN_F32, 2, (const int64_t[]){2, 2}, &f));
  KT_FAILS(kiln_tensor_matmul(i, i, false, false, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_matmul: matmul does not support dtype i32 (a); use f32, f16, bf16 or f64: cast to "
           "f32 first (kiln_tensor_cast(a, KILN_F32, &a2))");
  KT_FAILS(kiln_tensor_matmul(f, m, false, false, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_matmul: matmul does not support dtype bool (b); use f32, f16, bf16 or f64: cast to "
           "f32 first (kiln_tensor_cast(b, KILN_F32, &b2))");
  ck_assert_ptr_null(r);
  kiln_tensor_release(f);
  kiln_tensor_release(m);
  kiln_tensor_release(i);
}
END_TEST


/* ---- random ------------------------------------------------------------------------ */

/* Philox4x32-10 written out again (Salmon et al. 2011), checked against
 * Random123's known answer below: counter (lo(i), hi(i), 0, 0), key seed. */
static void kt_philox(uint64_t i, uint64_t seed, uint32_t w[4]) {
  uint32_t c[4] = {(uint32_t)i, (uint32_t)(i >> 32), 0, 0}, k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    const uint64_t p0 = (uint64_t)0xD2511F53u * c[0], p1 = (uint64_t)0xCD9E8D57u * c[2];
    const uint32_t n[4] = {(uint32_t)(p1 >> 32) ^ c[1] ^ k0, (uint32_t)p1, (uint32_t)(p0 >> 32) ^ c[3] ^ k1,
                           (uint32_t)p0};
    memcpy(c, n, sizeof c);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  memcpy(w, c, sizeof c);
}

static double kt_u53(uint32_t hi, uint32_t lo) { return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53; }

static kiln_tensor_t *kt_random(kiln_dtype_t dtype, bool normal, int64_t n, uint64_t seed, float a, float b) {
  kiln_tensor_t *t = NULL;
  const int64_t shape[1] = {n};
  if (normal)
    KT_OK(kiln_tensor_normal_dtype(kt_cpu(), dtype, 1, shape, seed, a, b, &t));
  else
    KT_OK(kiln_tensor_uniform_dtype(kt_cpu(), dtype, 1, shape, seed, a, b, &t));
  ck_assert_int_eq(kiln_tensor_dtype(t), dtype);
  return t;
}

/* Every float dtype: the same seed gives the same bits; f16 and bf16 are the
 * f32 numbers rounded (kiln_tensor_cast rounds to nearest even); f64 is the
 * scheme of kernels/philox.h, the uniform recomputed here, the normal the
 * header's function (whose Box-Muller it checks against libm's within 1e-12). */
START_TEST(test_random_dtypes) {
  enum { N = 70001 }; /* split over the device's threads, odd tail */
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
  uint8_t *x = malloc(8 * N), *y = malloc(8 * N);
  for (int normal = 0; normal < 2; normal++) {
    const float a = normal ? 0.5f : -2.0f, b = normal ? 3.0f : 3.0f;
    kiln_tensor_t *f32 = kt_random(KILN_F32, normal, N, 99, a, b);
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
      const size_t bytes = kiln_dtype_size(dtypes[d]) * N;
      kiln_tensor_t *t = kt_random(dtypes[d], normal, N, 99, a, b), *u = kt_random(dtypes[d], normal, N, 99, a, b);
      KT_OK(kiln_tensor_read(t, x, bytes));
      KT_OK(kiln_tensor_read(u, y, bytes));
      ck_assert_msg(memcmp(x, y, bytes) == 0, "%s %s is not reproducible", kiln_dtype_name(dtypes[d]),
                    normal ? "normal" : "uniform");
      kiln_tensor_release(u);
      u = kt_random(dtypes[d], normal, N, 100, a, b);
      KT_OK(kiln_tensor_read(u, y, bytes));
      ck_assert_msg(memcmp(x, y, bytes) != 0, "another seed gave the same numbers");
      kiln_tensor_release(u);
      if (dtypes[d] == KILN_F16 || dtypes[d] == KILN_BF16) {
        kiln_tensor_t *want = NULL;
        KT_OK(kiln_tensor_cast(f32, dtypes[d], &want));
        KT_OK(kiln_tensor_read(want, y, bytes));
        for (int64_t i = 0; i < N; i++)
          ck_assert_msg(((uint16_t *)x)[i] == ((uint16_t *)y)[i], "%s %s[%lld] = 0x%04x, rounded f32 0x%04x",
                        kiln_dtype_name(dtypes[d]), normal ? "normal" : "uniform", (long long)i,
                        ((uint16_t *)x)[i], ((uint16_t *)y)[i]);
        kiln_tensor_release(want);
      }
      if (dtypes[d] == KILN_F64) {
        const double *v = (const double *)x;
        bool low_bits = false;
        for (int64_t i = 0; i < N; i++) {
          uint32_t w[4];
          kt_philox((uint64_t)i, 99, w);
          double want;
          if (normal) {
            const double u1 = kt_u53(w[0], w[1]) + 0x1p-53, u2 = kt_u53(w[2], w[3]);
            want = kiln_philox_normal_f64((uint64_t)i, 99, a, b);
            const double libm = (double)a + (double)b * sqrt(-2.0 * log(u1)) * cos(6.28318530717958647692 * u2);
            ck_assert_msg(fabs(want - libm) <= 1e-12, "f64 normal[%lld]: %.17g, libm %.17g",
                          (long long)i, want, libm);
          } else {
            volatile double span = (double)b - (double)a, scaled = span * kt_u53(w[0], w[1]);
            want = (double)a + scaled;
            ck_assert(v[i] >= a && v[i] < b);
          }
          ck_assert_msg(v[i] == want, "f64 %s[%lld] = %.17g, expected %.17g", normal ? "normal" : "uniform",
                        (long long)i, v[i], want);
          /* More than f32's 24 bits reach the result. */
          if (!normal && (float)v[i] != v[i]) low_bits = true;
        }
        if (!normal) ck_assert(low_bits);
      }
      kiln_tensor_release(t);
    }
    kiln_tensor_release(f32);
  }
  free(x);
  free(y);
  /* Random123's known answer for Philox4x32-10, counter 0, key 0. */
  uint32_t w[4];
  kt_philox(0, 0, w);
  ck_assert(w[0] == 0x6627e8d5u && w[1] == 0xe169c58du && w[2] == 0xbc57ac4cu && w[3] == 0x9b00dbd8u);
  kiln_tensor_t *t = kt_random(KILN_F64, false, 1, 0, 0.0f, 1.0f);
  double v;
  KT_OK(kiln_tensor_read(t, &v, sizeof v));
  ck_assert(v == (double)((0x6627e8d5e169c58dull) >> 11) * 0x1p-53);
  kiln_tensor_release(t);
}
END_TEST

START_TEST(test_random_refusals) {
  kiln_tensor_t *t = NULL;
  const int64_t shape[1] = {4};
  KT_FAILS(kiln_tensor_uniform_dtype(kt_cpu(), KILN_I32, 1, shape, 1, 0.0f, 1.0f, &t), KILN_DTYPE_MISMATCH,
           "kiln_tensor_uniform_dtype: uniform does not support dtype i32; random tensors are f32, f16, bf16 or f64: "
           "draw f32 and cast it to i32 (kiln_tensor_cast)");
  KT_FAILS(kiln_tensor_normal_dtype(kt_cpu(), KILN_BOOL, 1, shape, 1, 0.0f, 1.0f, &t), KILN_DTYPE_MISMATCH,
           "kiln_tensor_normal_dtype: normal does not support dtype bool");
  ck_assert_ptr_null(t);
}
END_TEST

/* ---- conv2d, its gradients, max_pool2d ---------------------------------------------- */

/* A tensor of `dtype` holding vals (f32 values, cast by kiln_tensor_cast). */
static kiln_tensor_t *kt_make(kiln_dtype_t dtype, const float *vals, int ndim, const int64_t *shape) {
  kiln_tensor_t *f = NULL, *t = NULL;
  KT_OK(kiln_tensor_from_host(kt_cpu(), KILN_F32, ndim, shape, vals, &f));
  if (dtype == KILN_F32) return f;
  KT_OK(kiln_tensor_cast(f, dtype, &t));
  kiln_tensor_release(f);
  return t;
}

static kiln_tensor_t *kt_cast(kiln_tensor_t *t, kiln_dtype_t dtype) {
  kiln_tensor_t *r = NULL;
  KT_OK(kiln_tensor_cast(t, dtype, &r));
  return r;
}

/* got and want (both of got's dtype) hold the same bits. */
static void kt_same_bits(const char *what, kiln_tensor_t *got, kiln_tensor_t *want) {
  ck_assert_int_eq(kiln_tensor_dtype(got), kiln_tensor_dtype(want));
  const int64_t n = kiln_tensor_numel(got);
  ck_assert_int_eq(n, kiln_tensor_numel(want));
  const size_t bytes = (size_t)n * kiln_dtype_size(kiln_tensor_dtype(got));
  uint16_t *a = malloc(bytes), *b = malloc(bytes);
  KT_OK(kiln_tensor_read(got, a, bytes));
  KT_OK(kiln_tensor_read(want, b, bytes));
  for (size_t i = 0; i < bytes / 2; i++)
    ck_assert_msg(a[i] == b[i], "%s %s: element %zu is 0x%04x, expected 0x%04x", what,
                  kiln_dtype_name(kiln_tensor_dtype(got)), i, a[i], b[i]);
  free(a);
  free(b);
}

/* got and want (bf16) at most one ulp apart, and few of them apart at all. */
static void kt_close_bf16(const char *what, kiln_tensor_t *got, kiln_tensor_t *want) {
  const int64_t n = kiln_tensor_numel(got);
  ck_assert_int_eq(n, kiln_tensor_numel(want));
  uint16_t *a = malloc(sizeof(uint16_t) * (size_t)n), *b = malloc(sizeof(uint16_t) * (size_t)n);
  KT_OK(kiln_tensor_read(got, a, sizeof(uint16_t) * (size_t)n));
  KT_OK(kiln_tensor_read(want, b, sizeof(uint16_t) * (size_t)n));
  int64_t off = 0;
  for (int64_t i = 0; i < n; i++) {
    ck_assert_msg(abs(kt_ord16(a[i]) - kt_ord16(b[i])) <= 1, "%s bf16: element %lld is 0x%04x, expected 0x%04x",
                  what, (long long)i, a[i], b[i]);
    off += a[i] != b[i];
  }
  ck_assert_msg(off * 100 <= n, "%s bf16: %lld of %lld elements one ulp off", what, (long long)off, (long long)n);
  free(a);
  free(b);
}

/* bf16 conv2d and its two gradients with weights enough for the CPU's bf16
 * unit (at least 512, and for the gradients at least 32 output channels;
 * smaller ones run through f32; where the CPU has no unit that pays, all
 * do): within one ulp of the f32 ops of the widened
 * operands; padded, strided and dilated in both directions, an odd c*r*s,
 * with a bias, pointwise, one image cut into panels, and more images than
 * dW's shares of the sum. */
START_TEST(test_conv_bf16_unit) {
  static const struct {
    int64_t xs[4], ws[4];
    kiln_conv2d_params_t cp;
  } cases[] = {
      {{2, 8, 9, 11}, {9, 8, 3, 3}, {{2, 1}, {1, 2}, {1, 1}}},
      {{3, 16, 12, 10}, {40, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},
      {{2, 64, 5, 7}, {24, 64, 1, 1}, {{1, 1}, {0, 0}, {1, 1}}},
      /* an odd c*r*s (27: a half-empty last pair), a column stride and dilation */
      {{2, 3, 13, 15}, {32, 3, 3, 3}, {{1, 2}, {1, 1}, {2, 2}}},
      /* one image: its plane cut into panels for the threads */
      {{1, 16, 30, 30}, {48, 16, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},
      /* more images than dW's 8 shares */
      {{11, 8, 6, 7}, {40, 8, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}},
  };
  KT_OK(kiln_set_providers("conv2d=native,conv2d_backward_input=native,conv2d_backward_weight=native"));
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int64_t *xs = cases[c].xs, *ws = cases[c].ws;
    const int64_t nx = xs[0] * xs[1] * xs[2] * xs[3], nw = ws[0] * ws[1] * ws[2] * ws[3];
    float *xv = malloc(sizeof(float) * (size_t)nx), *wv = malloc(sizeof(float) * (size_t)nw), bv[64];
    kt_state = 11 + c;
    for (int64_t i = 0; i < nx; i++) xv[i] = (float)kt_next(false);
    for (int64_t i = 0; i < nw; i++) wv[i] = (float)(kt_next(false) * 0.3);
    for (int64_t i = 0; i < ws[0]; i++) bv[i] = (float)kt_next(false);
    const int64_t bs[1] = {ws[0]};
    kiln_tensor_t *x = kt_make(KILN_BF16, xv, 4, xs), *w = kt_make(KILN_BF16, wv, 4, ws);
    kiln_tensor_t *b = kt_make(KILN_BF16, bv, 1, bs);
    kiln_tensor_t *x32 = kt_cast(x, KILN_F32), *w32 = kt_cast(w, KILN_F32), *b32 = kt_cast(b, KILN_F32);
    kiln_tensor_t *y = NULL, *y32 = NULL;
    KT_OK(kiln_tensor_conv2d(x, w, b, &cases[c].cp, &y));
    KT_OK(kiln_tensor_conv2d(x32, w32, b32, &cases[c].cp, &y32));
    kiln_tensor_t *want = kt_cast(y32, KILN_BF16);
    kt_close_bf16("conv2d", y, want);
    kiln_tensor_release(want);
    /* The gradients, from a dy of y's shape. */
    const int64_t ny = kiln_tensor_numel(y);
    float *dyv = malloc(sizeof(float) * (size_t)ny);
    for (int64_t i = 0; i < ny; i++) dyv[i] = (float)kt_next(false);
    kiln_tensor_t *dy = kt_make(KILN_BF16, dyv, 4, kiln_tensor_shape(y)), *dy32 = kt_cast(dy, KILN_F32);
    kiln_tensor_t *g = NULL, *g32 = NULL;
    KT_OK(kiln_tensor_conv2d_backward_input(dy, w, xs, &cases[c].cp, &g));
    KT_OK(kiln_tensor_conv2d_backward_input(dy32, w32, xs, &cases[c].cp, &g32));
    want = kt_cast(g32, KILN_BF16);
    kt_close_bf16("conv2d_backward_input", g, want);
    kiln_tensor_release(want), kiln_tensor_release(g), kiln_tensor_release(g32);
    KT_OK(kiln_tensor_conv2d_backward_weight(x, dy, ws, &cases[c].cp, &g));
    KT_OK(kiln_tensor_conv2d_backward_weight(x32, dy32, ws, &cases[c].cp, &g32));
    want = kt_cast(g32, KILN_BF16);
    kt_close_bf16("conv2d_backward_weight", g, want);
    kiln_tensor_release(want), kiln_tensor_release(g), kiln_tensor_release(g32);
    kiln_tensor_release(dy), kiln_tensor_release(dy32);
    free(dyv);
    kiln_tensor_release(y), kiln_tensor_release(y32);
    kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(b);
    kiln_tensor_release(x32), kiln_tensor_release(w32), kiln_tensor_release(b32);
    free(xv), free(wv);
  }
  KT_OK(kiln_set_providers(""));
}
END_TEST

/* f16 and bf16: the f32 op (native) of the widened operands, cast back, bit
 * for bit; for conv2d, both gradients, max_pool2d and its gradient. */
START_TEST(test_conv_pool_f16_bf16) {
  static const kiln_dtype_t dtypes[] = {KILN_F16, KILN_BF16};
  const int64_t xs[4] = {2, 3, 9, 11}, ws[4] = {5, 3, 3, 3}, bs[1] = {5};
  const kiln_conv2d_params_t cp = {{2, 1}, {1, 2}, {1, 1}};
  const kiln_pool2d_params_t pp = {{3, 2}, {2, 2}, {1, 0}};
  float xv[2 * 3 * 9 * 11], wv[5 * 3 * 3 * 3], bv[5], dyv[2 * 5 * 5 * 13], dpv[2 * 3 * 5 * 5];
  kt_state = 3;
  for (size_t i = 0; i < sizeof xv / sizeof xv[0]; i++) xv[i] = (float)(kt_next(false) * 4.0);
  for (size_t i = 0; i < sizeof wv / sizeof wv[0]; i++) wv[i] = (float)kt_next(false);
  for (size_t i = 0; i < sizeof bv / sizeof bv[0]; i++) bv[i] = (float)kt_next(false);
  for (size_t i = 0; i < sizeof dyv / sizeof dyv[0]; i++) dyv[i] = (float)kt_next(false);
  for (size_t i = 0; i < sizeof dpv / sizeof dpv[0]; i++) dpv[i] = (float)kt_next(false);
  /* The f32 expectations from kiln's own f32 kernels. */
  KT_OK(kiln_set_providers("conv2d=native,conv2d_backward_input=native,conv2d_backward_weight=native"));
  for (size_t d = 0; d < 2; d++) {
    const kiln_dtype_t dt = dtypes[d];
    kiln_tensor_t *x = kt_make(dt, xv, 4, xs), *w = kt_make(dt, wv, 4, ws), *b = kt_make(dt, bv, 1, bs);
    kiln_tensor_t *x32 = kt_cast(x, KILN_F32), *w32 = kt_cast(w, KILN_F32), *b32 = kt_cast(b, KILN_F32);
    kiln_tensor_t *y = NULL, *y32 = NULL, *want = NULL;
    KT_OK(kiln_tensor_conv2d(x, w, b, &cp, &y));
    KT_OK(kiln_tensor_conv2d(x32, w32, b32, &cp, &y32));
    ck_assert_int_eq(kiln_tensor_shape(y)[2], 5);
    ck_assert_int_eq(kiln_tensor_shape(y)[3], 13);
    want = kt_cast(y32, dt);
    kt_same_bits("conv2d", y, want);
    kiln_tensor_release(want);
    const int64_t ys[4] = {2, 5, 5, 13};
    kiln_tensor_t *dy = kt_make(dt, dyv, 4, ys), *dy32 = kt_cast(dy, KILN_F32), *g = NULL, *g32 = NULL;
    KT_OK(kiln_tensor_conv2d_backward_input(dy, w, xs, &cp, &g));
    KT_OK(kiln_tensor_conv2d_backward_input(dy32, w32, xs, &cp, &g32));
    want = kt_cast(g32, dt);
    kt_same_bits("conv2d_backward_input", g, want);
    kiln_tensor_release(want), kiln_tensor_release(g), kiln_tensor_release(g32);
    KT_OK(kiln_tensor_conv2d_backward_weight(x, dy, ws, &cp, &g));
    KT_OK(kiln_tensor_conv2d_backward_weight(x32, dy32, ws, &cp, &g32));
    want = kt_cast(g32, dt);
    kt_same_bits("conv2d_backward_weight", g, want);
    kiln_tensor_release(want), kiln_tensor_release(g), kiln_tensor_release(g32);
    KT_OK(kiln_tensor_max_pool2d(x, &pp, &g));
    KT_OK(kiln_tensor_max_pool2d(x32, &pp, &g32));
    ck_assert_int_eq(kiln_tensor_shape(g)[2], 5);
    ck_assert_int_eq(kiln_tensor_shape(g)[3], 5);
    want = kt_cast(g32, dt);
    kt_same_bits("max_pool2d", g, want);
    kiln_tensor_release(want), kiln_tensor_release(g), kiln_tensor_release(g32);
    const int64_t ps[4] = {2, 3, 5, 5};
    kiln_tensor_t *dp = kt_make(dt, dpv, 4, ps), *dp32 = kt_cast(dp, KILN_F32);
    KT_OK(kiln_tensor_max_pool2d_backward(x, dp, &pp, &g));
    KT_OK(kiln_tensor_max_pool2d_backward(x32, dp32, &pp, &g32));
    want = kt_cast(g32, dt);
    kt_same_bits("max_pool2d_backward", g, want);
    kiln_tensor_release(want), kiln_tensor_release(g), kiln_tensor_release(g32);
    kiln_tensor_release(dp), kiln_tensor_release(dp32);
    kiln_tensor_release(dy), kiln_tensor_release(dy32);
    kiln_tensor_release(y), kiln_tensor_release(y32);
    kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(b);
    kiln_tensor_release(x32), kiln_tensor_release(w32), kiln_tensor_release(b32);
  }
  KT_OK(kiln_set_providers(""));
}
END_TEST

/* f64 conv2d against a double reference: exact on small integers. */
static void kt_conv_f64(const int64_t xs[4], const int64_t ws[4], const kiln_conv2d_params_t *cp, bool with_bias) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], K = ws[0], R = ws[2], S = ws[3];
  const int64_t P = (H + 2 * cp->padding[0] - cp->dilation[0] * (R - 1) - 1) / cp->stride[0] + 1;
  const int64_t Q = (W + 2 * cp->padding[1] - cp->dilation[1] * (S - 1) - 1) / cp->stride[1] + 1;
  double *x = malloc(sizeof(double) * (size_t)(N * C * H * W)), *w = malloc(sizeof(double) * (size_t)(K * C * R * S));
  double b[64], *ref = malloc(sizeof(double) * (size_t)(N * K * P * Q)), *got = malloc(sizeof(double) * (size_t)(N * K * P * Q));
  for (int64_t i = 0; i < N * C * H * W; i++) x[i] = kt_next(true);
  for (int64_t i = 0; i < K * C * R * S; i++) w[i] = kt_next(true);
  for (int64_t i = 0; i < K; i++) b[i] = kt_next(true);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++)
      for (int64_t p = 0; p < P; p++)
        for (int64_t q = 0; q < Q; q++) {
          double sum = with_bias ? b[k] : 0.0;
          for (int64_t c = 0; c < C; c++)
            for (int64_t r = 0; r < R; r++)
              for (int64_t s = 0; s < S; s++) {
                const int64_t h = p * cp->stride[0] - cp->padding[0] + r * cp->dilation[0];
                const int64_t ww = q * cp->stride[1] - cp->padding[1] + s * cp->dilation[1];
                if (h >= 0 && h < H && ww >= 0 && ww < W)
                  sum += w[((k * C + c) * R + r) * S + s] * x[((n * C + c) * H + h) * W + ww];
              }
          ref[((n * K + k) * P + p) * Q + q] = sum;
        }
  kiln_tensor_t *tx = NULL, *tw = NULL, *tb = NULL, *ty = NULL;
  KT_OK(kiln_tensor_from_host(kt_cpu(), KILN_F64, 4, xs, x, &tx));
  KT_OK(kiln_tensor_from_host(kt_cpu(), KILN_F64, 4, ws, w, &tw));
  KT_OK(kiln_tensor_from_host(kt_cpu(), KILN_F64, 1, &ws[0], b, &tb));
  KT_OK(kiln_tensor_conv2d(tx, tw, with_bias ? tb : NULL, cp, &ty));
  ck_assert_int_eq(kiln_tensor_dtype(ty), KILN_F64);
  KT_OK(kiln_tensor_read(ty, got, sizeof(double) * (size_t)(N * K * P * Q)));
  for (int64_t i = 0; i < N * K * P * Q; i++)
    ck_assert_msg(got[i] == ref[i], "f64 conv2d: y[%lld] = %.17g, expected %.17g", (long long)i, got[i], ref[i]);
  kiln_tensor_release(ty), kiln_tensor_release(tb), kiln_tensor_release(tw), kiln_tensor_release(tx);
  free(x), free(w), free(ref), free(got);
}

START_TEST(test_conv_f64) {
  kt_state = 4;
  const kiln_conv2d_params_t plain = {{1, 1}, {0, 0}, {1, 1}}, odd = {{2, 1}, {1, 2}, {1, 2}};
  kt_conv_f64((const int64_t[]){2, 3, 9, 11}, (const int64_t[]){5, 3, 3, 3}, &odd, true);
  kt_conv_f64((const int64_t[]){2, 3, 9, 11}, (const int64_t[]){5, 3, 3, 3}, &plain, false);
  kt_conv_f64((const int64_t[]){1, 8, 12, 12}, (const int64_t[]){7, 8, 1, 1}, &plain, true); /* pointwise */
  kt_conv_f64((const int64_t[]){1, 16, 40, 40}, (const int64_t[]){20, 16, 5, 5}, &plain, true); /* several panels */
}
END_TEST

START_TEST(test_conv_refusals) {
  kiln_tensor_t *x = NULL, *w = NULL, *h = NULL, *r = NULL;
  const int64_t xs[4] = {1, 2, 4, 4}, ws[4] = {3, 2, 3, 3};
  KT_OK(kiln_tensor_zeros(kt_cpu(), KILN_F64, 4, xs, &x));
  KT_OK(kiln_tensor_zeros(kt_cpu(), KILN_F64, 4, ws, &w));
  KT_OK(kiln_tensor_zeros(kt_cpu(), KILN_F16, 4, ws, &h));
  KT_FAILS(kiln_tensor_conv2d(x, h, NULL, NULL, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_conv2d: x is f64 but weight is f16; conv2d takes operands of one dtype: cast weight to f64 "
           "first (kiln_tensor_cast(weight, KILN_F64, &weight2))");
  const int64_t ys[4] = {1, 3, 2, 2};
  kiln_tensor_t *dy = NULL;
  KT_OK(kiln_tensor_zeros(kt_cpu(), KILN_F64, 4, ys, &dy));
  KT_FAILS(kiln_tensor_conv2d_backward_input(dy, w, xs, NULL, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_conv2d_backward_input: conv2d_backward_input does not support dtype f64 (dy); "
           "use f32, f16 or bf16: cast to f32 first (kiln_tensor_cast(dy, KILN_F32, &dy2))");
  const kiln_pool2d_params_t pp = {{2, 2}, {0, 0}, {0, 0}};
  KT_FAILS(kiln_tensor_max_pool2d(x, &pp, &r), KILN_DTYPE_MISMATCH,
           "kiln_tensor_max_pool2d: max_pool2d does not support dtype f64 (x); use f32, f16 or bf16: "
           "cast to f32 first (kiln_tensor_cast(x, KILN_F32, &x2))");
  ck_assert_ptr_null(r);
  kiln_tensor_release(dy), kiln_tensor_release(h), kiln_tensor_release(w), kiln_tensor_release(x);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  setenv("KILN_BACKEND", "cpu", 1);
  Suite *s = suite_create("linalg_dtypes");
  TCase *tc = tcase_create("linalg_dtypes");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_matmul_f64);
  tcase_add_test(tc, test_matmul_f16_bf16);
  tcase_add_test(tc, test_matmul_promotes);
  tcase_add_test(tc, test_matmul_refusals);
  tcase_add_test(tc, test_random_dtypes);
  tcase_add_test(tc, test_random_refusals);
  tcase_add_test(tc, test_conv_pool_f16_bf16);
  tcase_add_test(tc, test_conv_bf16_unit);
  tcase_add_test(tc, test_conv_f64);
  tcase_add_test(tc, test_conv_refusals);
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
