/* kernels/cpu/elementwise16.c: UNARY, BINARY and BINARY_SCALAR of f16 and bf16 in one pass (load eight, widen, the f32 formula, round to nearest even, store) with AVX2 + F16C, from kernels/ops.def. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_native.h"

/*
 * elementwise.c runs f16 and bf16 through the f32 rows on runs widened into
 * buffers; a memory-bound op then spends more time converting than moving
 * its (half as many) bytes. Here every float formula of kernels/ops.def gets
 * one fused row per 16-bit dtype: sixteen elements are loaded and widened
 * in registers (vcvtph2ps; bf16 by a shift), the formula is evaluated on
 * them exactly as the f32 row does (the same C expression on floats; no
 * contraction under c11, no FMA in the target), and the results are rounded
 * once to nearest even (vcvtps2ph; bf16 by integer rounding, a NaN kept
 * with its sign and top payload bits and made quiet): the bits of
 * kiln_dc_f64_to_f16/bf16((double)y). A tail shorter than sixteen is padded
 * into a block, so every element takes the same path.
 *
 * The rows are compiled for AVX2 + F16C with target attributes and offered
 * only where the CPU has both (kiln_cpu_half_*_row return NULL otherwise,
 * and elementwise.c keeps its portable path). An AVX-512 variant (sixteen
 * at a time) would fit the same macros; it is not written, since no machine
 * it could be checked on was at hand.
 */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define KILN_F_EXP(x) _Generic((x), float: expf, default: exp)(x)
#define KILN_F_LOG(x) _Generic((x), float: logf, default: log)(x)
#define KILN_F_SQRT(x) _Generic((x), float: sqrtf, default: sqrt)(x)
#define KILN_F_TANH(x) _Generic((x), float: tanhf, default: tanh)(x)
#define KILN_F_FABS(x) _Generic((x), float: fabsf, default: fabs)(x)

#define KILN_CPU_T16_ __attribute__((target("avx2,f16c"), always_inline)) static inline

/* ---- sixteen elements in and out, as two vectors of eight -------------------------- */

typedef struct v16_t {
  __m256 lo, hi;
} v16_t;

KILN_CPU_T16_ v16_t load16_f16(const uint16_t *p) {
  const v16_t v = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)))};
  return v;
}

/* bf16: the bits above 16 zero bits. A signalling NaN is not made quiet here, as
 * kiln_dc_bf16_to_f32 does: every result leaves through store16_bf16,
 * which makes any NaN quiet keeping its sign and payload, and x86
 * arithmetic and the C library keep a NaN operand's sign and payload
 * whether it signals or not (of two NaNs an SSE/AVX instruction returns
 * the first, whichever kind), so the stored bits are the same. */
KILN_CPU_T16_ v16_t load16_bf16(const uint16_t *p) {
  /* Each 16 bits under 16 zero bits, in the order the 128-bit lanes
   * interleave: lo holds elements 0-3 and 8-11, hi 4-7 and 12-15, the order
   * store16_bf16's pack restores (the formula is elementwise). */
  const __m256i raw = _mm256_loadu_si256((const __m256i *)p), zero = _mm256_setzero_si256();
  const v16_t v = {_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, raw)),
                   _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, raw))};
  return v;
}

KILN_CPU_T16_ void store16_f16(uint16_t *p, v16_t y) {
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(y.lo, _MM_FROUND_TO_NEAREST_INT));
  _mm_storeu_si128((__m128i *)(p + 8), _mm256_cvtps_ph(y.hi, _MM_FROUND_TO_NEAREST_INT));
}

/* f32 bits to bf16 bits in 32-bit lanes: to nearest even, a NaN kept with
 * its sign and top payload bits and made quiet (kiln_dc_narrow_f64's rule). */
KILN_CPU_T16_ __m256i round8_bf16(__m256 y) {
  const __m256i u = _mm256_castps_si256(y);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)))), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

KILN_CPU_T16_ void store16_bf16(uint16_t *p, v16_t y) {
  /* 32-bit lanes (each below 2^16) to 16 bits, packed within the 128-bit
   * lanes: lo's 0-3 then hi's 4-7, lo's 8-11 then hi's 12-15 (load16_bf16's order). */
  _mm256_storeu_si256((__m256i *)p, _mm256_packus_epi32(round8_bf16(y.lo), round8_bf16(y.hi)));
}

KILN_CPU_T16_ float load1_f16(uint16_t h) { return kiln_dc_f16_to_f32(h); }
KILN_CPU_T16_ float load1_bf16(uint16_t h) { return kiln_dc_bf16_to_f32(h); }

/* ---- the rows ----------------------------------------------------------------------
 * Binary: a (stride sa), b (stride sb), each 0 (one element, broadcast) or 1;
 * b_f32: b is one f32 (a scalar operand), not a 16-bit element. The stride
 * cases are separate instances of one inlined body, so that a broadcast
 * operand is widened once. The formula runs on arrays of sixteen floats,
 * which the compiler keeps in registers (and vectorises where the formula
 * lets it). */

#define KILN_CPU_HALF_BINARY_(DT, NAME, expr)                                                                   \
  KILN_CPU_T16_ void hbin_block_##DT##_##NAME(v16_t va, v16_t vb, uint16_t *out) {                              \
    float A[16], B[16], Y[16];                                                                                 \
    _mm256_storeu_ps(A, va.lo);                                                                                \
    _mm256_storeu_ps(A + 8, va.hi);                                                                            \
    _mm256_storeu_ps(B, vb.lo);                                                                                \
    _mm256_storeu_ps(B + 8, vb.hi);                                                                            \
    for (int k = 0; k < 16; k++) {                                                                             \
      const float a = A[k], b = B[k];                                                                          \
      Y[k] = (float)(expr);                                                                                    \
    }                                                                                                          \
    const v16_t y = {_mm256_loadu_ps(Y), _mm256_loadu_ps(Y + 8)};                                              \
    store16_##DT(out, y);                                                                                      \
  }                                                                                                            \
  KILN_CPU_T16_ void hbin_run_##DT##_##NAME(const uint16_t *pa, bool a_run, const uint16_t *pb, bool b_run,    \
                                            v16_t va1, v16_t vb1, uint16_t *out, int64_t n) {                  \
    int64_t i = 0;                                                                                             \
    for (; i + 16 <= n; i += 16)                                                                               \
      hbin_block_##DT##_##NAME(a_run ? load16_##DT(pa + i) : va1, b_run ? load16_##DT(pb + i) : vb1, out + i); \
    if (i < n) {                                                                                               \
      uint16_t ta[16] = {0}, tb[16] = {0}, ty[16];                                                             \
      const int64_t m = n - i;                                                                                 \
      if (a_run) memcpy(ta, pa + i, (size_t)m * 2);                                                            \
      if (b_run) memcpy(tb, pb + i, (size_t)m * 2);                                                            \
      hbin_block_##DT##_##NAME(a_run ? load16_##DT(ta) : va1, b_run ? load16_##DT(tb) : vb1, ty);               \
      memcpy(out + i, ty, (size_t)m * 2);                                                                      \
    }                                                                                                          \
  }                                                                                                            \
  __attribute__((target("avx2,f16c"))) static void hbin_##DT##_##NAME(const uint16_t *pa, int64_t sa,         \
                                                                      const void *pb_, int64_t sb, bool b_f32, \
                                                                      uint16_t *out, int64_t n) {              \
    const uint16_t *pb = pb_;                                                                                  \
    const __m256 a1 = _mm256_set1_ps(sa == 0 ? load1_##DT(pa[0]) : 0.0f);                                      \
    const __m256 b1 = _mm256_set1_ps(sb != 0 ? 0.0f : b_f32 ? *(const float *)pb_ : load1_##DT(pb[0]));        \
    const v16_t va1 = {a1, a1}, vb1 = {b1, b1};                                                                \
    if (sa && sb) hbin_run_##DT##_##NAME(pa, true, pb, true, va1, vb1, out, n);                                \
    else if (sa) hbin_run_##DT##_##NAME(pa, true, pb, false, va1, vb1, out, n);                                \
    else if (sb) hbin_run_##DT##_##NAME(pa, false, pb, true, va1, vb1, out, n);                                \
    else hbin_run_##DT##_##NAME(pa, false, pb, false, va1, vb1, out, n);                                       \
  }

#define KILN_CPU_HALF_UNARY_(DT, NAME, expr)                                                                    \
  KILN_CPU_T16_ void hun_block_##DT##_##NAME(v16_t vx, uint16_t *out) {                                        \
    float X[16], Y[16];                                                                                        \
    _mm256_storeu_ps(X, vx.lo);                                                                                \
    _mm256_storeu_ps(X + 8, vx.hi);                                                                            \
    for (int k = 0; k < 16; k++) {                                                                             \
      const float x = X[k];                                                                                    \
      Y[k] = (float)(expr);                                                                                    \
    }                                                                                                          \
    const v16_t y = {_mm256_loadu_ps(Y), _mm256_loadu_ps(Y + 8)};                                              \
    store16_##DT(out, y);                                                                                      \
  }                                                                                                            \
  __attribute__((target("avx2,f16c"))) static void hun_##DT##_##NAME(const uint16_t *in, int64_t s,          \
                                                                     uint16_t *out, int64_t n) {               \
    int64_t i = 0;                                                                                             \
    if (s == 0) {                                                                                              \
      /* One element repeated: computed once, stored n times. */                                               \
      uint16_t y[16];                                                                                          \
      const __m256 x1 = _mm256_set1_ps(load1_##DT(in[0]));                                                     \
      const v16_t vx1 = {x1, x1};                                                                              \
      hun_block_##DT##_##NAME(vx1, y);                                                                         \
      for (; i < n; i++) out[i] = y[0];                                                                        \
      return;                                                                                                  \
    }                                                                                                          \
    for (; i + 16 <= n; i += 16) hun_block_##DT##_##NAME(load16_##DT(in + i), out + i);                        \
    if (i < n) {                                                                                               \
      uint16_t tx[16] = {0}, ty[16];                                                                           \
      const int64_t m = n - i;                                                                                 \
      memcpy(tx, in + i, (size_t)m * 2);                                                                       \
      hun_block_##DT##_##NAME(load16_##DT(tx), ty);                                                            \
      memcpy(out + i, ty, (size_t)m * 2);                                                                      \
    }                                                                                                          \
  }

#define KILN_BINARY_FLOAT(NAME, expr) KILN_CPU_HALF_BINARY_(f16, NAME, expr) KILN_CPU_HALF_BINARY_(bf16, NAME, expr)
#define KILN_UNARY_FLOAT(NAME, expr) KILN_CPU_HALF_UNARY_(f16, NAME, expr) KILN_CPU_HALF_UNARY_(bf16, NAME, expr)
#include "ops.def"

static const kiln_cpu_half_binary_fn half_binary[2][KILN_BINARY_COUNT_] = {
#define KILN_BINARY_FLOAT(NAME, expr) [0][KILN_BINARY_##NAME] = hbin_f16_##NAME, [1][KILN_BINARY_##NAME] = hbin_bf16_##NAME,
#include "ops.def"
};
static const kiln_cpu_half_unary_fn half_unary[2][KILN_UNARY_COUNT_] = {
#define KILN_UNARY_FLOAT(NAME, expr) [0][KILN_UNARY_##NAME] = hun_f16_##NAME, [1][KILN_UNARY_##NAME] = hun_bf16_##NAME,
#include "ops.def"
};

static bool have_avx2_f16c(void) {
  static int known = -1; /* a benign race: every thread computes the same */
  if (known < 0) known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return known != 0;
}

kiln_cpu_half_binary_fn kiln_cpu_half_binary_row(kiln_dtype_t dtype, int op) {
  if ((dtype != KILN_F16 && dtype != KILN_BF16) || op < 0 || op >= KILN_BINARY_COUNT_ || !have_avx2_f16c())
    return NULL;
  return half_binary[dtype == KILN_BF16][op];
}

kiln_cpu_half_unary_fn kiln_cpu_half_unary_row(kiln_dtype_t dtype, int op) {
  if ((dtype != KILN_F16 && dtype != KILN_BF16) || op < 0 || op >= KILN_UNARY_COUNT_ || !have_avx2_f16c())
    return NULL;
  return half_unary[dtype == KILN_BF16][op];
}

#else /* not x86: the portable path of elementwise.c */

kiln_cpu_half_binary_fn kiln_cpu_half_binary_row(kiln_dtype_t dtype, int op) {
  (void)dtype;
  (void)op;
  return NULL;
}

kiln_cpu_half_unary_fn kiln_cpu_half_unary_row(kiln_dtype_t dtype, int op) {
  (void)dtype;
  (void)op;
  return NULL;
}

#endif
