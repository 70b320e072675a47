/* kernels/cpu/gemm_avx2.c: the 6x16 SGEMM micro-kernel for AVX2 + FMA (built with -mavx2 -mfma). */
#include <immintrin.h>

#include "kernels/cpu/gemm_internal.h"

#if KILN_CPU_GEMM_MR != 6 || KILN_CPU_GEMM_NR != 16
#error "the AVX2 micro-kernel is written for a 6x16 register block"
#endif

/* One k step: two B vectors against six broadcast A values. Twelve
 * independent accumulators cover the FMA latency (4 cycles) times the two FMA
 * pipes of current x86 cores. */
#define KILN_UKR_STEP(AP, BP)                                        \
  do {                                                               \
    const __m256 b0 = _mm256_load_ps(BP);                            \
    const __m256 b1 = _mm256_load_ps((BP) + 8);                      \
    __m256 a = _mm256_broadcast_ss((AP) + 0);                        \
    c00 = _mm256_fmadd_ps(a, b0, c00);                               \
    c01 = _mm256_fmadd_ps(a, b1, c01);                               \
    a = _mm256_broadcast_ss((AP) + 1);                               \
    c10 = _mm256_fmadd_ps(a, b0, c10);                               \
    c11 = _mm256_fmadd_ps(a, b1, c11);                               \
    a = _mm256_broadcast_ss((AP) + 2);                               \
    c20 = _mm256_fmadd_ps(a, b0, c20);                               \
    c21 = _mm256_fmadd_ps(a, b1, c21);                               \
    a = _mm256_broadcast_ss((AP) + 3);                               \
    c30 = _mm256_fmadd_ps(a, b0, c30);                               \
    c31 = _mm256_fmadd_ps(a, b1, c31);                               \
    a = _mm256_broadcast_ss((AP) + 4);                               \
    c40 = _mm256_fmadd_ps(a, b0, c40);                               \
    c41 = _mm256_fmadd_ps(a, b1, c41);                               \
    a = _mm256_broadcast_ss((AP) + 5);                               \
    c50 = _mm256_fmadd_ps(a, b0, c50);                               \
    c51 = _mm256_fmadd_ps(a, b1, c51);                               \
  } while (0)

#define KILN_UKR_ROW(I, LO, HI)                                                    \
  do {                                                                             \
    float *row = c + (I) * ldc;                                                    \
    if (accumulate) {                                                              \
      LO = _mm256_add_ps(LO, _mm256_loadu_ps(row));                                \
      HI = _mm256_add_ps(HI, _mm256_loadu_ps(row + 8));                            \
    }                                                                              \
    _mm256_storeu_ps(row, LO);                                                     \
    _mm256_storeu_ps(row + 8, HI);                                                 \
  } while (0)

void kiln_cpu_gemm_ukernel_avx2(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                                bool accumulate) {
  __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
  __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
  __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
  __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
  __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
  __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();

  /* The C tile is written once at the end; start pulling it in now so the
   * stores (and the loads when accumulating) do not stall. */
  for (int i = 0; i < 6; i++) {
    _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(c + i * ldc + 15), _MM_HINT_T0);
  }

  int64_t l = 0;
  for (; l + 4 <= kc; l += 4) {
    _mm_prefetch((const char *)(bp + 16 * 8), _MM_HINT_T0);
    _mm_prefetch((const char *)(ap + 6 * 8), _MM_HINT_T0);
    KILN_UKR_STEP(ap, bp);
    KILN_UKR_STEP(ap + 6, bp + 16);
    KILN_UKR_STEP(ap + 12, bp + 32);
    KILN_UKR_STEP(ap + 18, bp + 48);
    ap += 24;
    bp += 64;
  }
  for (; l < kc; l++) {
    KILN_UKR_STEP(ap, bp);
    ap += 6;
    bp += 16;
  }

  KILN_UKR_ROW(0, c00, c01);
  KILN_UKR_ROW(1, c10, c11);
  KILN_UKR_ROW(2, c20, c21);
  KILN_UKR_ROW(3, c30, c31);
  KILN_UKR_ROW(4, c40, c41);
  KILN_UKR_ROW(5, c50, c51);
}

/* ---- the 6x8 f64 tile ---------------------------------------------------------
 * The f32 tile's schedule with four doubles a vector: two B vectors against
 * six broadcast A values, twelve accumulators. */
#define KILN_DUKR_STEP(AP, BP)                                       \
  do {                                                               \
    const __m256d b0 = _mm256_load_pd(BP);                           \
    const __m256d b1 = _mm256_load_pd((BP) + 4);                     \
    __m256d a = _mm256_broadcast_sd((AP) + 0);                       \
    c00 = _mm256_fmadd_pd(a, b0, c00);                               \
    c01 = _mm256_fmadd_pd(a, b1, c01);                               \
    a = _mm256_broadcast_sd((AP) + 1);                               \
    c10 = _mm256_fmadd_pd(a, b0, c10);                               \
    c11 = _mm256_fmadd_pd(a, b1, c11);                               \
    a = _mm256_broadcast_sd((AP) + 2);                               \
    c20 = _mm256_fmadd_pd(a, b0, c20);                               \
    c21 = _mm256_fmadd_pd(a, b1, c21);                               \
    a = _mm256_broadcast_sd((AP) + 3);                               \
    c30 = _mm256_fmadd_pd(a, b0, c30);                               \
    c31 = _mm256_fmadd_pd(a, b1, c31);                               \
    a = _mm256_broadcast_sd((AP) + 4);                               \
    c40 = _mm256_fmadd_pd(a, b0, c40);                               \
    c41 = _mm256_fmadd_pd(a, b1, c41);                               \
    a = _mm256_broadcast_sd((AP) + 5);                               \
    c50 = _mm256_fmadd_pd(a, b0, c50);                               \
    c51 = _mm256_fmadd_pd(a, b1, c51);                               \
  } while (0)

#define KILN_DUKR_ROW(I, LO, HI)                                                   \
  do {                                                                             \
    double *row = c + (I) * ldc;                                                   \
    if (accumulate) {                                                              \
      LO = _mm256_add_pd(LO, _mm256_loadu_pd(row));                                \
      HI = _mm256_add_pd(HI, _mm256_loadu_pd(row + 4));                            \
    }                                                                              \
    _mm256_storeu_pd(row, LO);                                                     \
    _mm256_storeu_pd(row + 4, HI);                                                 \
  } while (0)

void kiln_cpu_dgemm_ukernel_avx2(int64_t kc, const double *ap, const double *bp, double *c, int64_t ldc,
                                 bool accumulate) {
  __m256d c00 = _mm256_setzero_pd(), c01 = _mm256_setzero_pd();
  __m256d c10 = _mm256_setzero_pd(), c11 = _mm256_setzero_pd();
  __m256d c20 = _mm256_setzero_pd(), c21 = _mm256_setzero_pd();
  __m256d c30 = _mm256_setzero_pd(), c31 = _mm256_setzero_pd();
  __m256d c40 = _mm256_setzero_pd(), c41 = _mm256_setzero_pd();
  __m256d c50 = _mm256_setzero_pd(), c51 = _mm256_setzero_pd();
  for (int i = 0; i < 6; i++) {
    _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(c + i * ldc + 7), _MM_HINT_T0);
  }
  int64_t l = 0;
  for (; l + 4 <= kc; l += 4) {
    _mm_prefetch((const char *)(bp + 8 * 8), _MM_HINT_T0);
    _mm_prefetch((const char *)(bp + 8 * 8 + 8), _MM_HINT_T0);
    _mm_prefetch((const char *)(ap + 6 * 8), _MM_HINT_T0);
    KILN_DUKR_STEP(ap, bp);
    KILN_DUKR_STEP(ap + 6, bp + 8);
    KILN_DUKR_STEP(ap + 12, bp + 16);
    KILN_DUKR_STEP(ap + 18, bp + 24);
    ap += 24;
    bp += 32;
  }
  for (; l < kc; l++) {
    KILN_DUKR_STEP(ap, bp);
    ap += 6;
    bp += 8;
  }
  KILN_DUKR_ROW(0, c00, c01);
  KILN_DUKR_ROW(1, c10, c11);
  KILN_DUKR_ROW(2, c20, c21);
  KILN_DUKR_ROW(3, c30, c31);
  KILN_DUKR_ROW(4, c40, c41);
  KILN_DUKR_ROW(5, c50, c51);
}
