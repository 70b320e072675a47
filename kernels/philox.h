/* kernels/philox.h: Philox4x32-10, the counter-based generator every backend uses for random tensors. */
/*
 * Written in the subset of C shared by C11, CUDA C and OpenCL C 1.2. The
 * includer defines KILN_U32 and KILN_U64 (32- and 64-bit unsigned types),
 * KILN_PHILOX_FN (function qualifiers: "static inline", "__device__ inline",
 * "inline"); nothing else: the normal's log, sqrt and cos are written here.
 *
 * Element i of a tensor draws from counter (lo32(i), hi32(i), 0, 0) with key
 * (lo32(seed), hi32(seed)), so the same seed gives the same numbers on every
 * backend, bit for bit, uniform and normal, in every float dtype (the
 * conformance suite checks it on every device): every operation below is an
 * IEEE add, subtract or multiply rounded on its own, or integer arithmetic.
 *
 * Per dtype, element i of a random tensor is:
 *   f32:  kiln_philox_uniform / kiln_philox_normal below.
 *   f16, bf16: that f32 sample rounded to the dtype, nearest even
 *         (kiln_dc_f64_to_f16((double)x) of kernels/dtype_convert.h).
 *   f64:  kiln_philox_uniform_f64 / kiln_philox_normal_f64: the same counter
 *         and key, 53-bit uniforms built from two 32-bit outputs each, the
 *         arithmetic in double. Defined only where the includer defines
 *         KILN_PHILOX_F64 (OpenCL C without cl_khr_fp64 has no double).
 */
#ifndef KILN_KERNELS_PHILOX_H
#define KILN_KERNELS_PHILOX_H

#define KILN_PHILOX_M0 0xD2511F53u
#define KILN_PHILOX_M1 0xCD9E8D57u
#define KILN_PHILOX_W0 0x9E3779B9u
#define KILN_PHILOX_W1 0xBB67AE85u

/* The four 32-bit outputs for counter index i; out[0..3]. */
KILN_PHILOX_FN void kiln_philox4x32_10(KILN_U64 i, KILN_U64 seed, KILN_U32 *out) {
  KILN_U32 c0 = (KILN_U32)i, c1 = (KILN_U32)(i >> 32), c2 = 0u, c3 = 0u;
  KILN_U32 k0 = (KILN_U32)seed, k1 = (KILN_U32)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    KILN_U64 p0 = (KILN_U64)KILN_PHILOX_M0 * (KILN_U64)c0;
    KILN_U64 p1 = (KILN_U64)KILN_PHILOX_M1 * (KILN_U64)c2;
    KILN_U32 n0 = (KILN_U32)(p1 >> 32) ^ c1 ^ k0;
    KILN_U32 n1 = (KILN_U32)p1;
    KILN_U32 n2 = (KILN_U32)(p0 >> 32) ^ c3 ^ k1;
    KILN_U32 n3 = (KILN_U32)p0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += KILN_PHILOX_W0;
    k1 += KILN_PHILOX_W1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* The uniform transform below is low + (high - low) * u with the product and
 * the sum each rounded to float, as C evaluates it without contraction.
 * Compilers may fuse such a multiply-add into one FMA (nvcc does by default,
 * OpenCL C allows it unless told otherwise, clang contracts within an
 * expression, GCC in GNU mode across them), which rounds once and changes
 * the last bit of about a third of uniform(-2, 3): so each dialect is told
 * not to. CUDA: the rounding intrinsics, which nvcc never fuses. OpenCL C
 * and clang: FP_CONTRACT OFF inside the function. GCC: contraction is off
 * in ISO C (-std=c11, kiln's build); in GNU C mode the function is
 * compiled with fp-contract=off (it is then not inlined). */
#if defined(__CUDA_ARCH__)
#define KILN_PHILOX_MUL_(a, b) __fmul_rn((a), (b))
#define KILN_PHILOX_ADD_(a, b) __fadd_rn((a), (b))
#else
#define KILN_PHILOX_MUL_(a, b) ((a) * (b))
#define KILN_PHILOX_ADD_(a, b) ((a) + (b))
#endif
#if !defined(__CUDA_ARCH__) && !defined(__OPENCL_VERSION__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__STRICT_ANSI__)
#define KILN_PHILOX_NO_CONTRACT_ __attribute__((optimize("fp-contract=off")))
#else
#define KILN_PHILOX_NO_CONTRACT_
#endif

/* Uniform in [low, high): the top 24 bits of the first output. */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN float kiln_philox_uniform(KILN_U64 i, KILN_U64 seed, float low,
                                                                  float high) {
#if defined(__OPENCL_VERSION__)
#pragma OPENCL FP_CONTRACT OFF
#elif defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
  KILN_U32 w[4];
  kiln_philox4x32_10(i, seed, w);
  float u = (float)(w[0] >> 8) * (1.0f / 16777216.0f);
  return KILN_PHILOX_ADD_(low, KILN_PHILOX_MUL_(high - low, u));
}

/* Normal numbers: Box-Muller, mean + stddev * sqrt(-2 log u1) * cos(2 pi u2),
 * with kiln's own log, sqrt and cos below rather than the dialect's (whose
 * results differ by an ulp or more between libm, OpenCL implementations and
 * CUDA's libdevice; OpenCL even allows 3 ulps for f32 sqrt). They use only
 * +, - and *, each rounded on its own (the macros above; no FMA, no
 * division), integer operations and comparisons: IEEE 754 rounds each of
 * those correctly in every dialect, so the same sequence gives the same bits
 * everywhere. Range reductions are exact, in integers from the Philox words;
 * no intermediate is subnormal (GPUs may flush those in f32). Accuracy
 * against libm: tests/test_philox.c. The polynomial constants:
 * scripts/philox_fit.py. */
#if defined(__OPENCL_VERSION__)
#define KILN_PHILOX_EXACT_ _Pragma("OPENCL FP_CONTRACT OFF")
#elif defined(__clang__)
#define KILN_PHILOX_EXACT_ _Pragma("STDC FP_CONTRACT OFF")
#else
#define KILN_PHILOX_EXACT_
#endif
#if defined(__CUDA_ARCH__)
#define KILN_PHILOX_DMUL_(a, b) __dmul_rn((a), (b))
#define KILN_PHILOX_DADD_(a, b) __dadd_rn((a), (b))
#else
#define KILN_PHILOX_DMUL_(a, b) ((a) * (b))
#define KILN_PHILOX_DADD_(a, b) ((a) + (b))
#endif

/* floor(log2(k)) for k >= 1, by halving (no count-leading-zeros builtin is
 * common to the dialects). */
KILN_PHILOX_FN int kiln_philox_ilog2(KILN_U64 k) {
  int n = 0;
  if (k >> 32) { k >>= 32; n += 32; }
  if (k >> 16) { k >>= 16; n += 16; }
  if (k >> 8) { k >>= 8; n += 8; }
  if (k >> 4) { k >>= 4; n += 4; }
  if (k >> 2) { k >>= 2; n += 2; }
  if (k >> 1) n += 1;
  return n;
}

/* log(k * 2^-24) for k in [1, 2^24]: k * 2^-24 = m * 2^e with m in
 * [sqrt(1/2), sqrt(2)] (exact: k's bits shifted, a float of 24 bits), then
 * e ln2 + log1p(f), f = m - 1 (exact), log1p(f) = f + f^2 R(f). ln2 is split
 * so that e * ln2_hi is exact (|e| <= 24, ln2_hi has 17 bits). */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN float kiln_philox_log_f32(KILN_U32 k) {
  KILN_PHILOX_EXACT_
  const int n = kiln_philox_ilog2(k);
  const KILN_U32 s = n <= 23 ? k << (23 - n) : k >> (n - 23);
  float m = KILN_PHILOX_MUL_((float)s, 1.0f / 8388608.0f); /* [1, 2) */
  int e = n - 24;
  if (m > 1.41421354f) {
    m = KILN_PHILOX_MUL_(m, 0.5f);
    e += 1;
  }
  const float f = KILN_PHILOX_ADD_(m, -1.0f);
  float r = 0.0676903427f;
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), -0.115573041f);
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), 0.118121408f);
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), -0.124208122f);
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), 0.142323166f);
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), -0.166675374f);
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), 0.200014472f);
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), -0.250000119f);
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), 0.333333224f);
  r = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(r, f), -0.5f);
  const float l = KILN_PHILOX_ADD_(f, KILN_PHILOX_MUL_(KILN_PHILOX_MUL_(f, f), r));
  const float ef = (float)e;
  return KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(ef, 6.93138123e-01f),
                          KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(ef, 9.05800061e-06f), l));
}

/* sqrt(x) for x >= 0 (0 for x <= 0): x = a * 4^j with a in [1/4, 1) by exact
 * scaling, y ~ 1/sqrt(a) from a quadratic (3% off) and three Newton steps
 * y (3/2 - a y^2 / 2), then r = a y corrected once by y (a - r^2) / 2, times
 * 2^j. */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN float kiln_philox_sqrt_f32(float x) {
  KILN_PHILOX_EXACT_
  if (!(x > 0.0f)) return 0.0f;
  float a = x, scale = 1.0f;
  while (a >= 1.0f) {
    a = KILN_PHILOX_MUL_(a, 0.25f);
    scale = KILN_PHILOX_MUL_(scale, 2.0f);
  }
  while (a < 0.25f) {
    a = KILN_PHILOX_MUL_(a, 4.0f);
    scale = KILN_PHILOX_MUL_(scale, 0.5f);
  }
  float y = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(1.52318417f, a), -3.13397082f), a),
                             2.62864901f);
  for (int it = 0; it < 3; it++) {
    const float h = KILN_PHILOX_MUL_(KILN_PHILOX_MUL_(KILN_PHILOX_MUL_(a, y), y), 0.5f);
    y = KILN_PHILOX_MUL_(y, KILN_PHILOX_ADD_(1.5f, -h));
  }
  float r = KILN_PHILOX_MUL_(a, y);
  r = KILN_PHILOX_ADD_(r, KILN_PHILOX_MUL_(KILN_PHILOX_MUL_(y, 0.5f), KILN_PHILOX_ADD_(a, -KILN_PHILOX_MUL_(r, r))));
  return KILN_PHILOX_MUL_(r, scale);
}

/* cos(2 pi k 2^-24) for k in [0, 2^24): the quadrant q is k's top 2 bits,
 * the angle within it (pi / 2) t with t = (k mod 2^22) 2^-22, exact; past
 * t = 1/2 the complement 1 - t (exact) turns cos into sin and back, so
 * t <= 1/2. cos((pi / 2) t) and sin((pi / 2) t) by Taylor polynomials in t. */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN float kiln_philox_cos_f32(KILN_U32 k) {
  KILN_PHILOX_EXACT_
  const KILN_U32 q = (k >> 22) & 3u;
  KILN_U32 r = k & 0x3FFFFFu;
  int use_sin = (int)(q & 1u);
  if (r > 0x200000u) {
    r = 0x400000u - r;
    use_sin ^= 1;
  }
  const float t = KILN_PHILOX_MUL_((float)r, 1.0f / 4194304.0f);
  const float t2 = KILN_PHILOX_MUL_(t, t);
  float p;
  if (use_sin) {
    p = 0.000160441181f;
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), -0.00468175393f);
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), 0.0796926245f);
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), -0.645964086f);
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), 1.57079637f);
    p = KILN_PHILOX_MUL_(p, t);
  } else {
    p = -2.52020418e-05f;
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), 0.000919260259f);
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), -0.0208634809f);
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), 0.2536695f);
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), -1.23370051f);
    p = KILN_PHILOX_ADD_(KILN_PHILOX_MUL_(p, t2), 1.0f);
  }
  return q == 1u || q == 2u ? -p : p;
}

/* Normal(mean, stddev) by Box-Muller on the first two outputs: u1 = (top 24
 * bits of w[0] + 1) 2^-24 in (0, 1] so that log is finite, u2 = (top 24 bits
 * of w[1]) 2^-24 in [0, 1). */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN float kiln_philox_normal(KILN_U64 i, KILN_U64 seed, float mean, float stddev) {
  KILN_PHILOX_EXACT_
  KILN_U32 w[4];
  kiln_philox4x32_10(i, seed, w);
  const float radius = kiln_philox_sqrt_f32(KILN_PHILOX_MUL_(-2.0f, kiln_philox_log_f32((w[0] >> 8) + 1u)));
  const float c = kiln_philox_cos_f32(w[1] >> 8);
  return KILN_PHILOX_ADD_(mean, KILN_PHILOX_MUL_(KILN_PHILOX_MUL_(stddev, radius), c));
}
#if defined(KILN_PHILOX_F64)
/* A double in [0, 1) from two outputs: the top 53 bits of the 64-bit word
 * hi:lo, times 2^-53 (exact). */
KILN_PHILOX_FN double kiln_philox_u53(KILN_U32 hi, KILN_U32 lo) {
  KILN_U64 word = ((KILN_U64)hi << 32) | (KILN_U64)lo;
  return (double)(word >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform in [low, high) in double: u = kiln_philox_u53(w[0], w[1]) of
 * counter i, then low + (high - low) * u, each operation rounded (no FMA:
 * the f32 function's reasons). */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN double kiln_philox_uniform_f64(KILN_U64 i, KILN_U64 seed, double low,
                                                                       double high) {
#if defined(__OPENCL_VERSION__)
#pragma OPENCL FP_CONTRACT OFF
#elif defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
  KILN_U32 w[4];
  kiln_philox4x32_10(i, seed, w);
  double u = kiln_philox_u53(w[0], w[1]);
#if defined(__CUDA_ARCH__)
  return __dadd_rn(low, __dmul_rn(high - low, u));
#else
  return low + (high - low) * u;
#endif
}

/* log(k * 2^-53) for k in [1, 2^53]: kiln_philox_log_f32's scheme in double
 * (|e| <= 53, ln2_hi has 32 bits). */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN double kiln_philox_log_f64(KILN_U64 k) {
  KILN_PHILOX_EXACT_
  /* R(f) = (log1p(f) - f) / f^2, lowest degree first. */
  const double c[21] = {-0.5, 0.3333333333333337, -0.24999999999999434, 0.19999999999975535,
                        -0.16666666666809157, 0.14285714290226625, -0.12499999988229563, 0.11111110729946601,
                        -0.10000000293631836, 0.090909265201664355, -0.083333418608208601, 0.076918462383121902,
                        -0.071421781082395455, 0.066737465762498782, -0.062668716983921041, 0.058250696992863137,
                        -0.053492348383115444, 0.054081358976565325, -0.062075073403738155, 0.056478326464475079,
                        -0.024326255062599576};
  const int n = kiln_philox_ilog2(k);
  const KILN_U64 s = n <= 52 ? k << (52 - n) : k >> (n - 52);
  double m = KILN_PHILOX_DMUL_((double)s, 1.0 / 4503599627370496.0); /* [1, 2) */
  int e = n - 53;
  if (m > 1.4142135623730951) {
    m = KILN_PHILOX_DMUL_(m, 0.5);
    e += 1;
  }
  const double f = KILN_PHILOX_DADD_(m, -1.0);
  double r = c[20];
  for (int j = 19; j >= 0; j--) r = KILN_PHILOX_DADD_(KILN_PHILOX_DMUL_(r, f), c[j]);
  const double l = KILN_PHILOX_DADD_(f, KILN_PHILOX_DMUL_(KILN_PHILOX_DMUL_(f, f), r));
  const double ef = (double)e;
  return KILN_PHILOX_DADD_(KILN_PHILOX_DMUL_(ef, 6.93147180369123816490e-01),
                           KILN_PHILOX_DADD_(KILN_PHILOX_DMUL_(ef, 1.90821492927058770002e-10), l));
}

/* sqrt(x) in double: kiln_philox_sqrt_f32's scheme with four Newton steps. */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN double kiln_philox_sqrt_f64(double x) {
  KILN_PHILOX_EXACT_
  if (!(x > 0.0)) return 0.0;
  double a = x, scale = 1.0;
  while (a >= 1.0) {
    a = KILN_PHILOX_DMUL_(a, 0.25);
    scale = KILN_PHILOX_DMUL_(scale, 2.0);
  }
  while (a < 0.25) {
    a = KILN_PHILOX_DMUL_(a, 4.0);
    scale = KILN_PHILOX_DMUL_(scale, 0.5);
  }
  double y = KILN_PHILOX_DADD_(KILN_PHILOX_DMUL_(KILN_PHILOX_DADD_(KILN_PHILOX_DMUL_(1.52318417, a), -3.13397082), a),
                               2.62864901);
  for (int it = 0; it < 4; it++) {
    const double h = KILN_PHILOX_DMUL_(KILN_PHILOX_DMUL_(KILN_PHILOX_DMUL_(a, y), y), 0.5);
    y = KILN_PHILOX_DMUL_(y, KILN_PHILOX_DADD_(1.5, -h));
  }
  double r = KILN_PHILOX_DMUL_(a, y);
  r = KILN_PHILOX_DADD_(r, KILN_PHILOX_DMUL_(KILN_PHILOX_DMUL_(y, 0.5), KILN_PHILOX_DADD_(a, -KILN_PHILOX_DMUL_(r, r))));
  return KILN_PHILOX_DMUL_(r, scale);
}

/* cos(2 pi k 2^-53) for k in [0, 2^53): kiln_philox_cos_f32's scheme, the
 * angle within the quadrant (pi / 2) (k mod 2^51) 2^-51. */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN double kiln_philox_cos_f64(KILN_U64 k) {
  KILN_PHILOX_EXACT_
  const double cc[10] = {1.0, -1.2337005501361697, 0.25366950790104803, -0.020863480763352961,
                         0.00091926027483942659, -2.5202042373060607e-05, 4.7108747788181717e-07,
                         -6.3866030837918521e-09, 6.5659631149794728e-11, -5.2944002007346235e-13};
  const double sc[10] = {1.5707963267948966, -0.64596409750624628, 0.079692626246167048, -0.0046817541353186883,
                         0.00016044118478735983, -3.5988432352120852e-06, 5.6921729219679267e-08,
                         -6.6880351098114677e-10, 6.0669357311061955e-12, -4.3770654673137423e-14};
  const KILN_U32 q = (KILN_U32)(k >> 51) & 3u;
  KILN_U64 r = k & (((KILN_U64)1 << 51) - 1);
  int use_sin = (int)(q & 1u);
  if (r > ((KILN_U64)1 << 50)) {
    r = ((KILN_U64)1 << 51) - r;
    use_sin ^= 1;
  }
  const double t = KILN_PHILOX_DMUL_((double)r, 1.0 / 2251799813685248.0);
  const double t2 = KILN_PHILOX_DMUL_(t, t);
  double p;
  if (use_sin) {
    p = sc[9];
    for (int j = 8; j >= 0; j--) p = KILN_PHILOX_DADD_(KILN_PHILOX_DMUL_(p, t2), sc[j]);
    p = KILN_PHILOX_DMUL_(p, t);
  } else {
    p = cc[9];
    for (int j = 8; j >= 0; j--) p = KILN_PHILOX_DADD_(KILN_PHILOX_DMUL_(p, t2), cc[j]);
  }
  return q == 1u || q == 2u ? -p : p;
}

/* Normal(mean, stddev) in double by Box-Muller: u1 = u53(w[0], w[1]) +
 * 2^-53, in (0, 1] so that log is finite; u2 = u53(w[2], w[3]) in [0, 1);
 * mean + stddev * sqrt(-2 log u1) * cos(2 pi u2), with the functions above
 * on the integers u1 2^53 and u2 2^53. */
KILN_PHILOX_NO_CONTRACT_ KILN_PHILOX_FN double kiln_philox_normal_f64(KILN_U64 i, KILN_U64 seed, double mean,
                                                                      double stddev) {
  KILN_PHILOX_EXACT_
  KILN_U32 w[4];
  kiln_philox4x32_10(i, seed, w);
  const KILN_U64 k1 = ((((KILN_U64)w[0] << 32) | (KILN_U64)w[1]) >> 11) + 1u;
  const KILN_U64 k2 = (((KILN_U64)w[2] << 32) | (KILN_U64)w[3]) >> 11;
  const double radius = kiln_philox_sqrt_f64(KILN_PHILOX_DMUL_(-2.0, kiln_philox_log_f64(k1)));
  const double c = kiln_philox_cos_f64(k2);
  return KILN_PHILOX_DADD_(mean, KILN_PHILOX_DMUL_(KILN_PHILOX_DMUL_(stddev, radius), c));
}
#endif /* KILN_PHILOX_F64 */

#endif /* KILN_KERNELS_PHILOX_H */
