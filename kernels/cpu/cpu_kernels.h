/* kernels/cpu/cpu_kernels.h: the compute-heavy CPU kernels (GEMM, convolution) the CPU backend calls. */
#ifndef KILN_CPU_KERNELS_H
#define KILN_CPU_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "backends/cpu/threadpool.h"
#include "runtime/backend.h"

/* kiln's own SGEMM, row-major, beta = 0:
 * C (m x n, ldc) = op(A) (m x k) @ op(B) (k x n), with
 * !trans_a: A(i,l) = a[i*lda + l];  trans_a: A(i,l) = a[l*lda + i]; likewise B.
 * k == 0 writes zeros. Parallel over the pool; picks the widest ISA the CPU
 * has (AVX2+FMA, else portable C) at run time. */
void kiln_cpu_sgemm(kiln_cpu_pool_t *pool, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                    int64_t ldc);

/* The whole MATMUL op (every batch) with kiln_cpu_sgemm; pointers are the
 * element-0 addresses of the buffers (offsets not yet applied). */
void kiln_cpu_matmul_native(kiln_cpu_pool_t *pool, const kiln_op_t *op, const float *a_base,
                            const float *b_base, float *c_base);

/* CONV2D, native: x, w, bias (NULL when !has_bias), y are at their views'
 * offsets already. Uses kiln_cpu_sgemm on im2col tiles. */
void kiln_cpu_conv2d_native(kiln_cpu_pool_t *pool, const kiln_op_t *op, const float *x,
                            const float *w, const float *bias, float *y);

/* MAX_POOL2D, native. */
void kiln_cpu_max_pool2d_native(kiln_cpu_pool_t *pool, const kiln_op_t *op, const float *x, float *y);

/* The `blas` provider (backends/cpu/blas_provider.c): present only when kiln
 * was built with a CBLAS. kiln_cpu_blas_available() is false otherwise and
 * the other two must not be called. Both split each product over `pool`,
 * one single-threaded library call per thread. */
bool kiln_cpu_blas_available(void);
void kiln_cpu_matmul_blas(kiln_cpu_pool_t *pool, const kiln_op_t *op, const float *a_base, const float *b_base,
                          float *c_base);
void kiln_cpu_conv2d_blas(kiln_cpu_pool_t *pool, const kiln_op_t *op, const float *x, const float *w,
                          const float *bias, float *y);

#endif /* KILN_CPU_KERNELS_H */
