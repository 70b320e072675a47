/* kernels/philox.h: Philox4x32-10, the counter-based generator every backend uses for random tensors. */
/*
 * Written in the subset of C shared by C11, CUDA C and OpenCL C 1.2. The
 * includer defines KILN_U32 and KILN_U64 (32- and 64-bit unsigned types),
 * KILN_PHILOX_FN (function qualifiers: "static inline", "__device__ inline",
 * "inline") and, for kiln_philox_normal, KILN_F_LOG, KILN_F_SQRT, KILN_F_COS.
 *
 * Element i of a tensor draws from counter (lo32(i), hi32(i), 0, 0) with key
 * (lo32(seed), hi32(seed)), so the same seed gives the same numbers on every
 * backend: bit for bit for uniform (the conformance suite checks it on every
 * device), within a few ulps for normal (log, sqrt and cos are the dialect's
 * own).
 *
 * Per dtype, element i of a random tensor is:
 *   f32:  kiln_philox_uniform / kiln_philox_normal below.
 *   f16, bf16: that f32 sample rounded to the dtype, nearest even
 *         (kiln_dc_f64_to_f16((double)x) of kernels/dtype_convert.h).
 *   f64:  kiln_philox_uniform_f64 / kiln_philox_normal_f64: the same counter
 *         and key, 53-bit uniforms built from two 32-bit outputs each, the
 *         arithmetic in double. Defined only where the includer defines
 *         KILN_PHILOX_F64 (OpenCL C without cl_khr_fp64 has no double);
 *         KILN_F_LOG, KILN_F_SQRT, KILN_F_COS must then take a double and
 *         return one (C: _Generic over log/logf; OpenCL, CUDA: overloads).
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

/* Normal(mean, stddev) by Box-Muller on the first two outputs. */
KILN_PHILOX_FN float kiln_philox_normal(KILN_U64 i, KILN_U64 seed, float mean, float stddev) {
  KILN_U32 w[4];
  kiln_philox4x32_10(i, seed, w);
  float u1 = (float)((w[0] >> 8) + 1u) * (1.0f / 16777216.0f); /* (0, 1] so log is finite */
  float u2 = (float)(w[1] >> 8) * (1.0f / 16777216.0f);
  float radius = KILN_F_SQRT(-2.0f * KILN_F_LOG(u1));
  return mean + stddev * radius * KILN_F_COS(6.28318530717958647692f * u2);
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

/* Normal(mean, stddev) in double by Box-Muller: u1 = u53(w[0], w[1]) +
 * 2^-53, in (0, 1] so that log is finite; u2 = u53(w[2], w[3]) in [0, 1);
 * mean + stddev * sqrt(-2 log u1) * cos(2 pi u2). */
KILN_PHILOX_FN double kiln_philox_normal_f64(KILN_U64 i, KILN_U64 seed, double mean, double stddev) {
  KILN_U32 w[4];
  kiln_philox4x32_10(i, seed, w);
  double u1 = kiln_philox_u53(w[0], w[1]) + (1.0 / 9007199254740992.0);
  double u2 = kiln_philox_u53(w[2], w[3]);
  double radius = KILN_F_SQRT(-2.0 * KILN_F_LOG(u1));
  return mean + stddev * radius * KILN_F_COS(6.28318530717958647692 * u2);
}
#endif /* KILN_PHILOX_F64 */

#endif /* KILN_KERNELS_PHILOX_H */
