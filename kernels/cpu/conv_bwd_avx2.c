/* kernels/cpu/conv_bwd_avx2.c: the convolution gradients' SIMD kernels for AVX2 + FMA (built with -mavx2 -mfma). */
#include <immintrin.h>

#include "kernels/cpu/conv_internal.h"

#define VL 8
typedef __m256 vf;
typedef __m256i vmask;
#define V_ZERO() _mm256_setzero_ps()
#define V_LOADM(p, m) _mm256_maskload_ps((p), (m))
#define V_STOREM(p, m, v) _mm256_maskstore_ps((p), (m), (v))
#define V_ADD(a, b) _mm256_add_ps((a), (b))
#define V_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define V_HSUM(v) hsum_avx2(v)
#define V_MASK(lo, hi) mask_avx2((lo), (hi))
#define V_NAME(x) x##_avx2
/* 16 ymm registers: up to 12 accumulators. */
#define V_DW_MAX_TILE 12

static inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* Lanes [lo, hi) as the sign bits maskload and maskstore read. */
static inline __m256i mask_avx2(int lo, int hi) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_and_si256(_mm256_cmpgt_epi32(lane, _mm256_set1_epi32(lo - 1)),
                          _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), lane));
}

#include "kernels/cpu/conv_bwd_simd.h"

const kiln_cpu_conv_simd_t kiln_cpu_conv_simd_avx2 = {
    .name = "avx2", .lanes = VL, .col2im = col2im_avx2, .dw_tile = dw_tile_avx2, .dw_max_kb = dw_max_kb_avx2,
};
