/* backends/cpu/blas_provider.c: the CPU backend's `blas` provider: MATMUL and CONV2D through a CBLAS (OpenBLAS). */
#include <stdlib.h>

#include "kernels/cpu/gemm_internal.h"

#if defined(KILN_HAVE_BLAS)
#include <cblas.h>

/* A conv panel for the BLAS is allowed to be larger than kiln's own: the
 * library blocks for the cache itself and runs faster on wider products. */
#define KILN_BLAS_CONV_PANEL_BYTES ((int64_t)16 << 20)

bool kiln_cpu_blas_available(void) { return true; }

void kiln_cpu_matmul_blas(const kiln_op_t *op, const float *a_base, const float *b_base, float *c_base) {
  const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
  const float *a = a_base + op->in[0].offset;
  const float *b = b_base + op->in[1].offset;
  float *c = c_base + op->out.offset;
  if (m <= 0 || n <= 0) return;
  /* CBLAS takes int dimensions and insists on ld >= 1 even where nothing is
   * read; the core keeps shapes within int for this provider (a larger one
   * is not a product a CBLAS can express). */
  const int lda = op->u.matmul.lda > 0 ? (int)op->u.matmul.lda : 1;
  const int ldb = op->u.matmul.ldb > 0 ? (int)op->u.matmul.ldb : 1;
  for (int64_t i = 0; i < op->u.matmul.batch; i++) {
    cblas_sgemm(CblasRowMajor, op->u.matmul.trans_a ? CblasTrans : CblasNoTrans,
                op->u.matmul.trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f,
                a + i * op->u.matmul.stride_a, lda, b + i * op->u.matmul.stride_b, ldb, 0.0f,
                c + i * op->u.matmul.stride_c, (int)op->u.matmul.ldc);
  }
}

void kiln_cpu_conv2d_blas(kiln_cpu_pool_t *pool, const kiln_op_t *op, const float *x, const float *w,
                          const float *bias, float *y) {
  const int64_t n = op->u.conv2d.n, k = op->u.conv2d.k;
  const int64_t crs = op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s;
  const int64_t pq = op->u.conv2d.p * op->u.conv2d.q;
  const int64_t chw = op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w;
  if (n <= 0 || k <= 0 || pq <= 0) return;
  const bool pointwise = kiln_cpu_conv2d_is_pointwise(op);

  int64_t chunk = pq;
  float *col = NULL;
  if (!pointwise) {
    int64_t cols = crs > 0 ? KILN_BLAS_CONV_PANEL_BYTES / ((int64_t)sizeof(float) * crs) : pq;
    const int64_t native_cols = kiln_cpu_conv2d_panel_cols(op);
    if (cols < native_cols) cols = native_cols;
    chunk = cols < pq ? cols : pq;
    const size_t bytes = sizeof(float) * (size_t)(crs * chunk) + 64;
    col = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!col) {
      /* kiln's own path needs only small per-thread panels (or none). */
      kiln_cpu_conv2d_native(pool, op, x, w, bias, y);
      return;
    }
  }
  /* One panel at a time: the library threads each product itself, so the
   * pool only lays out the panels, and the two never run at once. */
  for (int64_t ni = 0; ni < n; ni++) {
    const float *xi = x + ni * chw;
    for (int64_t j0 = 0; j0 < pq; j0 += chunk) {
      const int64_t cols = pq - j0 < chunk ? pq - j0 : chunk;
      float *yi = y + ni * k * pq + j0;
      const float *b = xi + j0;
      int64_t ldb = pq;
      if (!pointwise) {
        kiln_cpu_conv2d_im2col_parallel(pool, op, xi, j0, cols, col);
        b = col;
        ldb = cols;
      }
      if (crs > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)k, (int)cols, (int)crs, 1.0f, w,
                    (int)crs, b, ldb > 0 ? (int)ldb : 1, 0.0f, yi, (int)pq);
      } else {
        for (int64_t kk = 0; kk < k; kk++)
          for (int64_t j = 0; j < cols; j++) yi[kk * pq + j] = 0.0f;
      }
      if (op->u.conv2d.has_bias && bias) {
        for (int64_t kk = 0; kk < k; kk++) {
          float *row = yi + kk * pq;
          for (int64_t j = 0; j < cols; j++) row[j] += bias[kk];
        }
      }
    }
  }
  free(col);
}

#else /* !KILN_HAVE_BLAS */

bool kiln_cpu_blas_available(void) { return false; }

/* Never called (the backend offers the provider only when it is available);
 * they compute the same result through kiln's own kernels all the same, so a
 * caller that forgets the check gets right answers, not a crash. */
void kiln_cpu_matmul_blas(const kiln_op_t *op, const float *a_base, const float *b_base, float *c_base) {
  kiln_cpu_matmul_native(NULL, op, a_base, b_base, c_base);
}

void kiln_cpu_conv2d_blas(kiln_cpu_pool_t *pool, const kiln_op_t *op, const float *x, const float *w,
                          const float *bias, float *y) {
  kiln_cpu_conv2d_native(pool, op, x, w, bias, y);
}

#endif /* KILN_HAVE_BLAS */
