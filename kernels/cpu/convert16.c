/* kernels/cpu/convert16.c: f16 and bf16 to and from f32 in runs, with F16C where the CPU has it: the same bits as kernels/dtype_convert.h. */
#include <string.h>

#include "kernels/cpu/cpu_native.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KILN_CPU_HAVE_F16C_KERNEL 1
#endif

/* ---- bf16: bit shifts, eight at a time with AVX2 ---------------------------------- */

#if KILN_CPU_HAVE_F16C_KERNEL
__attribute__((target("avx2"))) static void bf16_to_f32_avx2(const uint16_t *in, float *out, int64_t n) {
  const __m256i exp = _mm256_set1_epi32(0x7f800000), frac = _mm256_set1_epi32(0x7fffff);
  const __m256i quiet = _mm256_set1_epi32(0x400000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i b = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(in + i))), 16);
    /* A NaN (all exponent bits, some fraction) made quiet. */
    const __m256i nan = _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(b, frac), _mm256_setzero_si256()),
                                            _mm256_cmpeq_epi32(_mm256_and_si256(b, exp), exp));
    b = _mm256_or_si256(b, _mm256_and_si256(nan, quiet));
    _mm256_storeu_si256((__m256i *)(out + i), b);
  }
  for (; i < n; i++) out[i] = kiln_dc_bf16_to_f32(in[i]);
}

__attribute__((target("avx2"))) static void f32_to_bf16_avx2(const float *in, uint16_t *out, int64_t n) {
  const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_loadu_si256((const __m256i *)(in + i));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(u, 16), one))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet), nan);
    /* 32-bit lanes to 16 bits: pack within 128-bit halves, then order them. */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)(out + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; i++) {
    uint32_t v;
    memcpy(&v, &in[i], sizeof v);
    out[i] = (uint16_t)((v & 0x7fffffffu) > 0x7f800000u ? (v >> 16) | 0x40u : (v + 0x7fffu + ((v >> 16) & 1u)) >> 16);
  }
}

static bool have_avx2(void) {
  static int known = -1; /* a benign race: every thread computes the same */
  if (known < 0) known = __builtin_cpu_supports("avx2");
  return known != 0;
}
#endif

void kiln_cpu_bf16_to_f32_n(const uint16_t *in, int64_t stride, float *out, int64_t n) {
#if KILN_CPU_HAVE_F16C_KERNEL
  if (stride == 1 && have_avx2()) {
    bf16_to_f32_avx2(in, out, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; i++) {
    uint32_t b = (uint32_t)in[i * stride] << 16;
    if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu)) b |= 0x400000u; /* a quiet NaN */
    memcpy(&out[i], &b, sizeof b);
  }
}

void kiln_cpu_f32_to_bf16_n(const float *in, uint16_t *out, int64_t n) {
#if KILN_CPU_HAVE_F16C_KERNEL
  if (have_avx2()) {
    f32_to_bf16_avx2(in, out, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &in[i], sizeof u);
    /* Round to nearest even on the dropped half; a NaN keeps its sign and
     * top payload bits and is made quiet (kiln_dc_narrow_f64's rule). */
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    out[i] = (uint16_t)(nan ? (u >> 16) | 0x40u : rounded);
  }
}

/* ---- f16: F16C (vcvtph2ps / vcvtps2ph, round to nearest even), else the
 * portable conversions ----------------------------------------------------------- */

#if KILN_CPU_HAVE_F16C_KERNEL
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *in, float *out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
  for (; i < n; i++) out[i] = kiln_dc_f16_to_f32(in[i]);
}

__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *in, uint16_t *out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++) out[i] = kiln_dc_f64_to_f16((double)in[i]);
}

static bool have_f16c(void) {
  static int known = -1; /* a benign race: every thread computes the same */
  if (known < 0) known = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return known != 0;
}
#endif

void kiln_cpu_f16_to_f32_n(const uint16_t *in, int64_t stride, float *out, int64_t n) {
#if KILN_CPU_HAVE_F16C_KERNEL
  if (stride == 1 && have_f16c()) {
    f16_to_f32_f16c(in, out, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; i++) out[i] = kiln_dc_f16_to_f32(in[i * stride]);
}

void kiln_cpu_f32_to_f16_n(const float *in, uint16_t *out, int64_t n) {
#if KILN_CPU_HAVE_F16C_KERNEL
  if (have_f16c()) {
    f32_to_f16_f16c(in, out, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; i++) out[i] = kiln_dc_f64_to_f16((double)in[i]);
}
