/* kernels/cpu/conv_bwd_avx512.c: the convolution gradients' SIMD kernels for AVX-512F (built with -mavx512f -mfma). */
#include <immintrin.h>

#include "kernels/cpu/conv_internal.h"

#define VL 16
typedef __m512 vf;
typedef __mmask16 vmask;
#define V_ZERO() _mm512_setzero_ps()
#define V_LOADM(p, m) _mm512_maskz_loadu_ps((m), (p))
#define V_STOREM(p, m, v) _mm512_mask_storeu_ps((p), (m), (v))
#define V_ADD(a, b) _mm512_add_ps((a), (b))
#define V_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define V_HSUM(v) _mm512_reduce_add_ps(v)
#define V_MASK(lo, hi) ((vmask)((((uint32_t)1 << (hi)) - 1u) & ~(((uint32_t)1 << (lo)) - 1u)))
#define V_NAME(x) x##_avx512
/* 32 zmm registers: up to 24 accumulators, the rest for operands. */
#define V_DW_MAX_TILE 24

#include "kernels/cpu/conv_bwd_simd.h"

const kiln_cpu_conv_simd_t kiln_cpu_conv_simd_avx512 = {
    .name = "avx512f", .lanes = VL, .col2im = col2im_avx512, .dw_tile = dw_tile_avx512, .dw_max_kb = dw_max_kb_avx512,
};
