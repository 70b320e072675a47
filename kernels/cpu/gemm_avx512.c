/* kernels/cpu/gemm_avx512.c: the 6x32 SGEMM micro-kernel for AVX-512F + FMA (built with -mavx512f -mfma). */
#include <immintrin.h>

#include "kernels/cpu/gemm_internal.h"

#if KILN_CPU_GEMM_MR != 6 || KILN_CPU_GEMM_NR_MAX != 32
#error "the AVX-512 micro-kernel is written for a 6x32 register block"
#endif

/* One k step: two B vectors of 16 against six broadcast A values, the AVX2
 * kernel's schedule at twice the width. Twelve independent accumulators cover
 * the FMA latency times the two FMA pipes; per 12 FMAs it loads 2 vectors and
 * 6 scalars, well within two loads a cycle. Each element of C is summed in the
 * order of the AVX2 kernel, with the same FMAs, so the two give the same bits
 * (the portable kernel rounds each product before adding it). */
#define KILN_UKR_STEP(AP, BP)                                        \
  do {                                                               \
    const __m512 b0 = _mm512_load_ps(BP);                            \
    const __m512 b1 = _mm512_load_ps((BP) + 16);                     \
    __m512 a = _mm512_set1_ps((AP)[0]);                              \
    c00 = _mm512_fmadd_ps(a, b0, c00);                               \
    c01 = _mm512_fmadd_ps(a, b1, c01);                               \
    a = _mm512_set1_ps((AP)[1]);                                     \
    c10 = _mm512_fmadd_ps(a, b0, c10);                               \
    c11 = _mm512_fmadd_ps(a, b1, c11);                               \
    a = _mm512_set1_ps((AP)[2]);                                     \
    c20 = _mm512_fmadd_ps(a, b0, c20);                               \
    c21 = _mm512_fmadd_ps(a, b1, c21);                               \
    a = _mm512_set1_ps((AP)[3]);                                     \
    c30 = _mm512_fmadd_ps(a, b0, c30);                               \
    c31 = _mm512_fmadd_ps(a, b1, c31);                               \
    a = _mm512_set1_ps((AP)[4]);                                     \
    c40 = _mm512_fmadd_ps(a, b0, c40);                               \
    c41 = _mm512_fmadd_ps(a, b1, c41);                               \
    a = _mm512_set1_ps((AP)[5]);                                     \
    c50 = _mm512_fmadd_ps(a, b0, c50);                               \
    c51 = _mm512_fmadd_ps(a, b1, c51);                               \
  } while (0)

#define KILN_UKR_ROW(I, LO, HI)                                                    \
  do {                                                                             \
    float *row = c + (I) * ldc;                                                    \
    if (accumulate) {                                                              \
      LO = _mm512_add_ps(LO, _mm512_loadu_ps(row));                                \
      HI = _mm512_add_ps(HI, _mm512_loadu_ps(row + 16));                           \
    }                                                                              \
    _mm512_storeu_ps(row, LO);                                                     \
    _mm512_storeu_ps(row + 16, HI);                                                \
  } while (0)

void kiln_cpu_gemm_ukernel_avx512(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                                  bool accumulate) {
  __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps();
  __m512 c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
  __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps();
  __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
  __m512 c40 = _mm512_setzero_ps(), c41 = _mm512_setzero_ps();
  __m512 c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps();

  /* The C tile is written once at the end; start pulling it in now. */
  for (int i = 0; i < 6; i++) {
    _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(c + i * ldc + 31), _MM_HINT_T0);
  }

  int64_t l = 0;
  for (; l + 4 <= kc; l += 4) {
    _mm_prefetch((const char *)(bp + 32 * 8), _MM_HINT_T0);
    _mm_prefetch((const char *)(bp + 32 * 8 + 16), _MM_HINT_T0);
    _mm_prefetch((const char *)(ap + 6 * 8), _MM_HINT_T0);
    KILN_UKR_STEP(ap, bp);
    KILN_UKR_STEP(ap + 6, bp + 32);
    KILN_UKR_STEP(ap + 12, bp + 64);
    KILN_UKR_STEP(ap + 18, bp + 96);
    ap += 24;
    bp += 128;
  }
  for (; l < kc; l++) {
    KILN_UKR_STEP(ap, bp);
    ap += 6;
    bp += 32;
  }

  KILN_UKR_ROW(0, c00, c01);
  KILN_UKR_ROW(1, c10, c11);
  KILN_UKR_ROW(2, c20, c21);
  KILN_UKR_ROW(3, c30, c31);
  KILN_UKR_ROW(4, c40, c41);
  KILN_UKR_ROW(5, c50, c51);
}

/* ---- the 6x16 f64 tile -----------------------------------------------------------
 * The f32 tile's schedule with eight doubles a vector: two B vectors of 8
 * against six broadcast A values, twelve accumulators. */
#define KILN_DUKR_STEP(AP, BP)                                       \
  do {                                                               \
    const __m512d b0 = _mm512_load_pd(BP);                           \
    const __m512d b1 = _mm512_load_pd((BP) + 8);                     \
    __m512d a = _mm512_set1_pd((AP)[0]);                             \
    c00 = _mm512_fmadd_pd(a, b0, c00);                               \
    c01 = _mm512_fmadd_pd(a, b1, c01);                               \
    a = _mm512_set1_pd((AP)[1]);                                     \
    c10 = _mm512_fmadd_pd(a, b0, c10);                               \
    c11 = _mm512_fmadd_pd(a, b1, c11);                               \
    a = _mm512_set1_pd((AP)[2]);                                     \
    c20 = _mm512_fmadd_pd(a, b0, c20);                               \
    c21 = _mm512_fmadd_pd(a, b1, c21);                               \
    a = _mm512_set1_pd((AP)[3]);                                     \
    c30 = _mm512_fmadd_pd(a, b0, c30);                               \
    c31 = _mm512_fmadd_pd(a, b1, c31);                               \
    a = _mm512_set1_pd((AP)[4]);                                     \
    c40 = _mm512_fmadd_pd(a, b0, c40);                               \
    c41 = _mm512_fmadd_pd(a, b1, c41);                               \
    a = _mm512_set1_pd((AP)[5]);                                     \
    c50 = _mm512_fmadd_pd(a, b0, c50);                               \
    c51 = _mm512_fmadd_pd(a, b1, c51);                               \
  } while (0)

#define KILN_DUKR_ROW(I, LO, HI)                                                   \
  do {                                                                             \
    double *row = c + (I) * ldc;                                                   \
    if (accumulate) {                                                              \
      LO = _mm512_add_pd(LO, _mm512_loadu_pd(row));                                \
      HI = _mm512_add_pd(HI, _mm512_loadu_pd(row + 8));                            \
    }                                                                              \
    _mm512_storeu_pd(row, LO);                                                     \
    _mm512_storeu_pd(row + 8, HI);                                                 \
  } while (0)

void kiln_cpu_dgemm_ukernel_avx512(int64_t kc, const double *ap, const double *bp, double *c, int64_t ldc,
                                   bool accumulate) {
  __m512d c00 = _mm512_setzero_pd(), c01 = _mm512_setzero_pd();
  __m512d c10 = _mm512_setzero_pd(), c11 = _mm512_setzero_pd();
  __m512d c20 = _mm512_setzero_pd(), c21 = _mm512_setzero_pd();
  __m512d c30 = _mm512_setzero_pd(), c31 = _mm512_setzero_pd();
  __m512d c40 = _mm512_setzero_pd(), c41 = _mm512_setzero_pd();
  __m512d c50 = _mm512_setzero_pd(), c51 = _mm512_setzero_pd();
  for (int i = 0; i < 6; i++) {
    _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch((const char *)(c + i * ldc + 15), _MM_HINT_T0);
  }
  int64_t l = 0;
  for (; l + 4 <= kc; l += 4) {
    _mm_prefetch((const char *)(bp + 16 * 8), _MM_HINT_T0);
    _mm_prefetch((const char *)(bp + 16 * 8 + 8), _MM_HINT_T0);
    _mm_prefetch((const char *)(ap + 6 * 8), _MM_HINT_T0);
    KILN_DUKR_STEP(ap, bp);
    KILN_DUKR_STEP(ap + 6, bp + 16);
    KILN_DUKR_STEP(ap + 12, bp + 32);
    KILN_DUKR_STEP(ap + 18, bp + 48);
    ap += 24;
    bp += 64;
  }
  for (; l < kc; l++) {
    KILN_DUKR_STEP(ap, bp);
    ap += 6;
    bp += 16;
  }
  KILN_DUKR_ROW(0, c00, c01);
  KILN_DUKR_ROW(1, c10, c11);
  KILN_DUKR_ROW(2, c20, c21);
  KILN_DUKR_ROW(3, c30, c31);
  KILN_DUKR_ROW(4, c40, c41);
  KILN_DUKR_ROW(5, c50, c51);
}

/* ---- products too small to pack ------------------------------------------------
 * Packing B pays when each sliver is used by many row blocks; with few rows
 * (a conv gradient's W^T of 25 or 150 rows) it costs about as much as the
 * multiply-adds, and the edge tiles' detour through a scratch tile adds more.
 * This kernel reads B's rows in place (masked at the right edge) and
 * broadcasts A's elements where they lie. Each element of C is summed over
 * l = 0 .. k-1 in order, as the packed FMA kernels do for k <= KC, so the
 * bits are theirs. Measured on a conv gradient's products (LeNet's second
 * layer, 150 x 100 x 16 per image): 0.51 ms per op packed, 0.41 unpacked. */

/* One MR x 32 tile at rows i0 (mr of them valid), columns j0 (masks lo, hi). */
static inline void small_tile(int64_t k, const float *a, int64_t a_row, int64_t a_col, const float *b, int64_t ldb,
                              float *c, int64_t ldc, int mr, __mmask16 lo, __mmask16 hi, bool accumulate) {
  __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps();
  __m512 c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps();
  __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps();
  __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps();
  __m512 c40 = _mm512_setzero_ps(), c41 = _mm512_setzero_ps();
  __m512 c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps();
  /* Rows past mr read row mr - 1 (valid memory); their sums are dropped. */
  const int64_t r1 = (mr > 1 ? 1 : 0) * a_row, r2 = (mr > 2 ? 2 : mr - 1) * a_row;
  const int64_t r3 = (mr > 3 ? 3 : mr - 1) * a_row, r4 = (mr > 4 ? 4 : mr - 1) * a_row;
  const int64_t r5 = (mr > 5 ? 5 : mr - 1) * a_row;
  for (int64_t l = 0; l < k; l++) {
    const float *bl = b + l * ldb, *al = a + l * a_col;
    const __m512 b0 = _mm512_maskz_loadu_ps(lo, bl);
    const __m512 b1 = _mm512_maskz_loadu_ps(hi, bl + 16);
    __m512 x = _mm512_set1_ps(al[0]);
    c00 = _mm512_fmadd_ps(x, b0, c00);
    c01 = _mm512_fmadd_ps(x, b1, c01);
    x = _mm512_set1_ps(al[r1]);
    c10 = _mm512_fmadd_ps(x, b0, c10);
    c11 = _mm512_fmadd_ps(x, b1, c11);
    x = _mm512_set1_ps(al[r2]);
    c20 = _mm512_fmadd_ps(x, b0, c20);
    c21 = _mm512_fmadd_ps(x, b1, c21);
    x = _mm512_set1_ps(al[r3]);
    c30 = _mm512_fmadd_ps(x, b0, c30);
    c31 = _mm512_fmadd_ps(x, b1, c31);
    x = _mm512_set1_ps(al[r4]);
    c40 = _mm512_fmadd_ps(x, b0, c40);
    c41 = _mm512_fmadd_ps(x, b1, c41);
    x = _mm512_set1_ps(al[r5]);
    c50 = _mm512_fmadd_ps(x, b0, c50);
    c51 = _mm512_fmadd_ps(x, b1, c51);
  }
#define KILN_SMALL_ROW(I, LO, HI)                                                          \
  if ((I) < mr) {                                                                          \
    float *row = c + (I) * ldc;                                                            \
    if (accumulate) {                                                                      \
      LO = _mm512_add_ps(LO, _mm512_maskz_loadu_ps(lo, row));                              \
      HI = _mm512_add_ps(HI, _mm512_maskz_loadu_ps(hi, row + 16));                         \
    }                                                                                      \
    _mm512_mask_storeu_ps(row, lo, LO);                                                    \
    _mm512_mask_storeu_ps(row + 16, hi, HI);                                               \
  }
  KILN_SMALL_ROW(0, c00, c01)
  KILN_SMALL_ROW(1, c10, c11)
  KILN_SMALL_ROW(2, c20, c21)
  KILN_SMALL_ROW(3, c30, c31)
  KILN_SMALL_ROW(4, c40, c41)
  KILN_SMALL_ROW(5, c50, c51)
#undef KILN_SMALL_ROW
}

void kiln_cpu_gemm_small_avx512(bool trans_a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t k,
                                const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                                bool accumulate) {
  /* op(A)(i, l): trans_a at a[l*lda + i], else at a[i*lda + l]. */
  const int64_t a_row = trans_a ? 1 : lda, a_col = trans_a ? lda : 1;
  /* Column blocks outside: a k x 32 block of B (32 KiB at most) stays in L1
   * while every block of rows uses it; A's few rows stay in L2. */
  for (int64_t j0 = n0; j0 < n1; j0 += 32) {
    const int64_t nr = n1 - j0 < 32 ? n1 - j0 : 32;
    const __mmask16 lo = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1u);
    const __mmask16 hi = (__mmask16)(nr >= 32 ? 0xffff : nr > 16 ? (1u << (nr - 16)) - 1u : 0u);
    for (int64_t i0 = m0; i0 < m1; i0 += KILN_CPU_GEMM_MR) {
      const int mr = (int)(m1 - i0 < KILN_CPU_GEMM_MR ? m1 - i0 : KILN_CPU_GEMM_MR);
      small_tile(k, a + i0 * a_row, a_row, a_col, b + j0, ldb, c + i0 * ldc + j0, ldc, mr, lo, hi, accumulate);
    }
  }
}
