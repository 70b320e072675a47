/* tests/test_philox.c: kernels/philox.h's own log, sqrt and cos, and the normal samples built from them, against libm in long double. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "common.h"

#if defined(__SSE2__)
#include <pmmintrin.h>
#endif

#define KILN_U32 uint32_t
#define KILN_U64 uint64_t
#define KILN_PHILOX_FN static inline
#define KILN_PHILOX_F64 1
#include "philox.h"

/* |got - want| in units in the last place of want in a format of `bits`
 * significant bits (24: float, 53: double). */
static double kt_ulps(long double got, long double want, int bits) {
  if (got == want) return 0.0;
  int e;
  frexpl(want, &e);
  return (double)(fabsl(got - want) / ldexpl(1.0L, e - bits));
}

static const long double kt_half_pi = 1.570796326794896619231321691639751442L;

/* cos(2 pi k 2^-bits) exactly reduced: the quadrant from k's top two bits,
 * cosl or sinl of (pi / 2) t with t exact, of (pi / 2) (1 - t) past t = 1/2
 * (so that the reference keeps its precision near the zeros of cos, where
 * cosl(2 pi u) would not). */
static long double kt_cos_ref(uint64_t k, int bits) {
  const uint64_t q = k >> (bits - 2), r = k & ((1ull << (bits - 2)) - 1);
  const long double t = ldexpl((long double)r, 2 - bits);
  long double c = cosl(kt_half_pi * t), s = sinl(kt_half_pi * t);
  if (t > 0.5L) c = sinl(kt_half_pi * (1.0L - t)), s = cosl(kt_half_pi * (1.0L - t));
  return q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
}

/* A reproducible sequence. */
static uint64_t kt_state = 1;
static uint64_t kt_next(void) {
  kt_state = kt_state * 6364136223846793005ull + 1442695040888963407ull;
  return kt_state ^ (kt_state >> 29);
}

/* log(k 2^-24) for every k in [1, 2^24], log(k 2^-53) for 2^22 k spread
 * over every binade and the ends. Measured: 0.92 ulp (f32), 1.16 ulp (f64). */
START_TEST(test_log) {
  double worst = 0.0;
  for (uint32_t k = 1; k <= (1u << 24); k++) {
    const long double want = logl(ldexpl((long double)k, -24));
    if (k == (1u << 24)) {
      ck_assert(kiln_philox_log_f32(k) == 0.0f);
      continue;
    }
    const double u = kt_ulps(kiln_philox_log_f32(k), want, 24);
    if (u > worst) worst = u;
  }
  printf("log f32: max %.3f ulp\n", worst);
  ck_assert_msg(worst <= 1.0, "log f32: %.3f ulp", worst);
  worst = 0.0;
  for (int i = 0; i < (1 << 22) + 4; i++) {
    uint64_t k;
    if (i < 4) {
      static const uint64_t ends[4] = {1, 2, (1ull << 53) - 1, 3};
      k = ends[i];
    } else {
      k = (kt_next() >> 11) >> (i % 53);
      if (k == 0) k = 1;
    }
    const double u = kt_ulps(kiln_philox_log_f64(k), logl(ldexpl((long double)k, -53)), 53);
    if (u > worst) worst = u;
  }
  ck_assert(kiln_philox_log_f64(1ull << 53) == 0.0);
  printf("log f64: max %.3f ulp\n", worst);
  ck_assert_msg(worst <= 1.5, "log f64: %.3f ulp", worst);
}
END_TEST

/* sqrt over the range the normal feeds it (-2 log u1 in [2^-24, 34] in f32,
 * [2^-53, 74] in f64) and beyond, 0 and a negative giving 0. Measured:
 * 0.76 ulp in both. */
START_TEST(test_sqrt) {
  double worst32 = 0.0, worst64 = 0.0;
  for (int i = 0; i < (1 << 22); i++) {
    const uint64_t r = kt_next();
    const float x = ldexpf((float)(r >> 40) + 1.0f, (int)((r >> 8) % 90u) - 80);
    const double y = ldexp((double)(r >> 11) + 1.0, (int)(r % 140u) - 170);
    const double u32 = kt_ulps(kiln_philox_sqrt_f32(x), sqrtl(x), 24), u64 = kt_ulps(kiln_philox_sqrt_f64(y), sqrtl(y), 53);
    if (u32 > worst32) worst32 = u32;
    if (u64 > worst64) worst64 = u64;
  }
  printf("sqrt: max %.3f ulp (f32), %.3f ulp (f64)\n", worst32, worst64);
  ck_assert_msg(worst32 <= 1.0 && worst64 <= 1.0, "sqrt: %.3f, %.3f ulp", worst32, worst64);
  ck_assert(kiln_philox_sqrt_f32(0.0f) == 0.0f && kiln_philox_sqrt_f32(-0.0f) == 0.0f && kiln_philox_sqrt_f32(-1.0f) == 0.0f);
  ck_assert(kiln_philox_sqrt_f64(0.0) == 0.0 && kiln_philox_sqrt_f64(-1.0) == 0.0);
  ck_assert(kiln_philox_sqrt_f32(4.0f) == 2.0f && kiln_philox_sqrt_f64(0.25) == 0.5);
}
END_TEST

/* cos(2 pi k 2^-24) for every k, cos(2 pi k 2^-53) for 2^22 random k and
 * the quadrants' edges; plus cosl(2 pi u) itself within 1e-15 absolute (the
 * reduction is right). Measured: 1.72 ulp (f32), 1.58 ulp (f64). */
START_TEST(test_cos) {
  double worst = 0.0;
  for (uint32_t k = 0; k < (1u << 24); k++) {
    const float got = kiln_philox_cos_f32(k);
    const double u = kt_ulps(got, kt_cos_ref(k, 24), 24);
    if (u > worst) worst = u;
    if ((k & 0xFFF) == 0)
      ck_assert(fabsl(got - cosl(2.0L * 3.14159265358979323846264338327950288L * ldexpl(k, -24))) < 1e-7L);
  }
  printf("cos f32: max %.3f ulp\n", worst);
  ck_assert_msg(worst <= 2.0, "cos f32: %.3f ulp", worst);
  worst = 0.0;
  for (int i = 0; i < (1 << 22) + 12; i++) {
    uint64_t k;
    if (i < 12) {
      const uint64_t q = (uint64_t)(i / 3) << 51, off[3] = {0, 1, (1ull << 50) + 1};
      k = q + off[i % 3];
    } else {
      k = kt_next() >> 11;
    }
    const double got = kiln_philox_cos_f64(k);
    const double u = kt_ulps(got, kt_cos_ref(k, 53), 53);
    if (u > worst) worst = u;
    ck_assert(fabsl(got - cosl(2.0L * 3.14159265358979323846264338327950288L * ldexpl(k, -53))) < 1e-15L);
  }
  printf("cos f64: max %.3f ulp\n", worst);
  ck_assert_msg(worst <= 2.0, "cos f64: %.3f ulp", worst);
}
END_TEST

/* The standard normal samples of counters 0 .. 2^22 against
 * sqrtl(-2 logl(u1)) cosl(2 pi u2) of the same u1, u2 (exactly reduced):
 * within a few ulps. Measured: 3.61 ulp (f32), 3.58 ulp (f64). */
START_TEST(test_normal) {
  double worst32 = 0.0, worst64 = 0.0;
  for (uint64_t i = 0; i < (1u << 22); i++) {
    uint32_t w[4];
    kiln_philox4x32_10(i, 42, w);
    const long double r32 = sqrtl(-2.0L * logl(ldexpl((long double)((w[0] >> 8) + 1u), -24)));
    const long double want32 = r32 * kt_cos_ref(w[1] >> 8, 24);
    const uint64_t k1 = ((((uint64_t)w[0] << 32) | w[1]) >> 11) + 1, k2 = (((uint64_t)w[2] << 32) | w[3]) >> 11;
    const long double want64 = sqrtl(-2.0L * logl(ldexpl((long double)k1, -53))) * kt_cos_ref(k2, 53);
    const double u32 = kt_ulps(kiln_philox_normal(i, 42, 0.0f, 1.0f), want32, 24);
    const double u64 = kt_ulps(kiln_philox_normal_f64(i, 42, 0.0, 1.0), want64, 53);
    if (u32 > worst32) worst32 = u32;
    if (u64 > worst64) worst64 = u64;
  }
  printf("normal: max %.3f ulp (f32), %.3f ulp (f64)\n", worst32, worst64);
  ck_assert_msg(worst32 <= 4.0 && worst64 <= 4.0, "normal: %.3f, %.3f ulp", worst32, worst64);
}
END_TEST

#if defined(__SSE2__)
/* No intermediate is subnormal (GPUs may flush those to zero in f32): with
 * the SSE unit flushing subnormal results and operands to zero, every
 * sample (f32: every log and cos argument; f64: 2^20 counters) keeps its bits. */
START_TEST(test_no_subnormals) {
  enum { N = 1 << 20 };
  float *f = malloc(sizeof *f * ((1u << 24) + 1) * 2);
  double *d = malloc(sizeof *d * N * 2);
  ck_assert(f && d);
  const unsigned int mode = _mm_getcsr();
  for (int flush = 0; flush < 2; flush++) {
    _mm_setcsr(flush ? mode | 0x8040u /* FTZ, DAZ */ : mode);
    float *fo = f + (size_t)flush * ((1u << 24) + 1);
    for (uint32_t k = 0; k <= (1u << 24); k++) {
      const volatile float x = kiln_philox_log_f32(k ? k : 1u) * -2.0f;
      fo[k] = kiln_philox_sqrt_f32(x) + (k < (1u << 24) ? kiln_philox_cos_f32(k) : 0.0f);
    }
    for (uint64_t i = 0; i < N; i++) d[(size_t)flush * N + i] = kiln_philox_normal_f64(i, 3, 0.0, 1.0);
  }
  _mm_setcsr(mode);
  ck_assert(memcmp(f, f + (1u << 24) + 1, sizeof *f * ((1u << 24) + 1)) == 0);
  ck_assert(memcmp(d, d + N, sizeof *d * N) == 0);
  free(f);
  free(d);
}
END_TEST
#endif

int main(void) {
  kt_private_cache_dir();
  Suite *s = suite_create("philox");
  TCase *tc = tcase_create("philox");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_log);
  tcase_add_test(tc, test_sqrt);
  tcase_add_test(tc, test_cos);
  tcase_add_test(tc, test_normal);
#if defined(__SSE2__)
  tcase_add_test(tc, test_no_subnormals);
#endif
  suite_add_tcase(s, tc);
  return kt_run_suite(s);
}
