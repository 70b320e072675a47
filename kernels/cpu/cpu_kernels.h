/* kernels/cpu/cpu_kernels.h: kiln's CPU kernels as the CPU backend sees them: one signature for every op, and the parallel-for they are given. */
#ifndef KILN_CPU_KERNELS_H
#define KILN_CPU_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/backend.h"

/* ---- running in parallel -------------------------------------------------------
 * Kernels know nothing of threads: the backend hands each one a parallel-for
 * (its device's thread pool). */

/* fn runs over [begin, end) on thread `thread` (0 .. threads-1). */
typedef void (*kiln_cpu_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

typedef struct kiln_cpu_par_t {
  /* Run fn over [0, n) split into at most `threads` contiguous chunks of at
   * least `grain` items (grain >= 1), the caller running one of them; blocks
   * until every chunk is done. Not reentrant: never call it from inside a
   * task (pass NULL as `par` there: the work stays on the calling thread). */
  void (*parallel_for)(void *team, int64_t n, int64_t grain, kiln_cpu_task_fn fn, void *ctx);
  void *team;
  int threads;
} kiln_cpu_par_t;

/* par NULL (or one thread) runs fn(ctx, 0, n, 0) on the calling thread. */
static inline void kiln_cpu_parallel_for(const kiln_cpu_par_t *par, int64_t n, int64_t grain, kiln_cpu_task_fn fn,
                                         void *ctx) {
  if (n <= 0) return;
  if (!par || par->threads <= 1 || n <= grain) {
    fn(ctx, 0, n, 0);
    return;
  }
  par->parallel_for(par->team, n, grain, fn, ctx);
}

static inline int kiln_cpu_par_threads(const kiln_cpu_par_t *par) { return par && par->threads > 0 ? par->threads : 1; }

/* ---- the kernels ----------------------------------------------------------------
 * Every op kernel has this signature: the op as the core resolved it, the
 * address of element 0 of the output view and of each input view (in[i] for
 * op->in[i], at its offset). It runs on the calling thread (a queue's
 * worker), spreading large work with `par`, and cannot fail: the core
 * validated the op, and kernels fall back to allocation-free paths when
 * memory is short. */
typedef void (*kiln_cpu_kernel_fn)(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in);

#define KILN_CPU_KERNELS(X)                                                                                  \
  X(fill) X(arange) X(random) X(copy) X(cast) X(unary) X(binary) X(binary_scalar) X(reduce) X(softmax)       \
  X(cross_entropy) X(matmul_native) X(conv2d_native) X(max_pool2d_native) X(matmul_blas) X(conv2d_blas)      \
  X(unary_backward) X(softmax_backward) X(cross_entropy_backward) X(conv2d_backward_input_native)            \
  X(conv2d_backward_weight_native) X(max_pool2d_backward_native) X(accumulate) X(sgd_update) X(adam_update)   \
  X(conv2d_backward_input_blas) X(conv2d_backward_weight_blas) X(where) X(compare) X(unscale) X(gather) X(index_add)
#define KILN_CPU_KERNEL_DECL_(name) \
  void kiln_cpu_##name(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in);
KILN_CPU_KERNELS(KILN_CPU_KERNEL_DECL_)
#undef KILN_CPU_KERNEL_DECL_

/* The `blas` kernels (kernels/cpu/blas.c) are real only when kiln was built
 * with a CBLAS; kiln_cpu_blas_available() says so, and the backend offers the
 * provider only then. Both split each product over `par`, one
 * single-threaded library call per thread. */
bool kiln_cpu_blas_available(void);

/* Whether conv2d's weight gradient of `op` runs kiln's direct kernel (a
 * vector ISA, unit column stride, at most 32 output channels), which needs
 * no im2col and beats the GEMM there (LeNet's dW: 0.26 against 0.60 ms
 * through OpenBLAS); the `blas` provider declines those. */
bool kiln_cpu_conv2d_backward_weight_direct(const kiln_op_t *op);

/* Whether kiln's own conv2d (im2col panels into its AVX-512 GEMM tile) is
 * the faster one for `op`: where that tile runs it beats im2col plus
 * OpenBLAS at every shape measured (LeNet's layers 1.7-1.8x, the ResNet-like
 * layer of kiln-bench 1.2x), so the `blas` provider declines the forward
 * conv2d there, as it declines the weight gradient above. */
bool kiln_cpu_conv2d_native_preferred(const kiln_op_t *op);

/* kiln's own SGEMM, row-major, beta = 0:
 * C (m x n, ldc) = op(A) (m x k) @ op(B) (k x n), with
 * !trans_a: A(i,l) = a[i*lda + l];  trans_a: A(i,l) = a[l*lda + i]; likewise B.
 * k == 0 writes zeros. Parallel with `par`; picks the widest ISA the CPU has
 * (AVX-512F, else AVX2+FMA, else portable C) at run time. */
void kiln_cpu_sgemm(const kiln_cpu_par_t *par, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc);

/* The same in f64 (kernels/cpu/dgemm.c): kiln's own DGEMM, f64 tiles for
 * AVX-512F, AVX2+FMA or portable C, chosen at run time. */
void kiln_cpu_dgemm(const kiln_cpu_par_t *par, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    const double *a, int64_t lda, const double *b, int64_t ldb, double *c, int64_t ldc);

#endif /* KILN_CPU_KERNELS_H */
