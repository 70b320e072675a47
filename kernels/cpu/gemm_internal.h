/* kernels/cpu/gemm_internal.h: private interface of the CPU GEMM, shared by its ISA variants, conv and the BLAS provider. */
#ifndef KILN_CPU_GEMM_INTERNAL_H
#define KILN_CPU_GEMM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cpu/cpu_kernels.h"

/* Register block of every micro-kernel: MR rows of C by NR columns. 6x16
 * keeps 12 ymm accumulators plus two B vectors and one A broadcast in the 16
 * AVX2 registers; the portable kernel uses the same shape so that packing is
 * shared. */
#define KILN_CPU_GEMM_MR 6
#define KILN_CPU_GEMM_NR 16

/* One MR x NR tile: C = Ap (kc x MR, packed) @ Bp (kc x NR, packed), or
 * C += ... when `accumulate`. c is row-major with leading dimension ldc; the
 * whole tile is written (edge tiles go through a scratch tile). */
typedef void (*kiln_cpu_gemm_ukernel_fn)(int64_t kc, const float *ap, const float *bp, float *c,
                                         int64_t ldc, bool accumulate);

void kiln_cpu_gemm_ukernel_portable(int64_t kc, const float *ap, const float *bp, float *c,
                                    int64_t ldc, bool accumulate);
#if defined(KILN_HAVE_AVX2_KERNEL)
void kiln_cpu_gemm_ukernel_avx2(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                                bool accumulate);
#endif

/* Which micro-kernel kiln_cpu_sgemm_isa runs. */
typedef enum kiln_cpu_gemm_isa_t {
  KILN_CPU_GEMM_ISA_AUTO = 0, /* the widest the CPU has */
  KILN_CPU_GEMM_ISA_PORTABLE,
  KILN_CPU_GEMM_ISA_AVX2,     /* falls back to PORTABLE where the CPU or the build lacks it */
} kiln_cpu_gemm_isa_t;

/* The ISA that AUTO resolves to on this CPU, and its name ("avx2+fma", "portable"). */
kiln_cpu_gemm_isa_t kiln_cpu_gemm_isa_best(void);
const char *kiln_cpu_gemm_isa_name(kiln_cpu_gemm_isa_t isa);

/* kiln_cpu_sgemm with a chosen micro-kernel; par NULL runs on the calling
 * thread alone (the form to call from inside a parallel_for task, since the
 * par is not reentrant). */
void kiln_cpu_sgemm_isa(const kiln_cpu_par_t *par, kiln_cpu_gemm_isa_t isa, bool trans_a, bool trans_b,
                        int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float *c, int64_t ldc);

/* Convolution lowering shared by the native and BLAS conv2d: the im2col panel
 * of image `x` (c x h x w) for output columns [j0, j0 + cols) of the p*q
 * output plane, written as a (c*r*s) x cols row-major matrix into out_col.
 * Padded cells read as 0. */
void kiln_cpu_conv2d_im2col(const kiln_op_t *op, const float *x, int64_t j0, int64_t cols,
                            float *out_col);

/* The same panel, split across the par by input channel (par NULL: on the
 * calling thread). */
void kiln_cpu_conv2d_im2col_parallel(const kiln_cpu_par_t *par, const kiln_op_t *op, const float *x,
                                     int64_t j0, int64_t cols, float *out_col);

/* True when the convolution is a plain matrix product over the input plane
 * (1x1 kernel, stride 1, no padding): then x itself is the c x (h*w) panel. */
bool kiln_cpu_conv2d_is_pointwise(const kiln_op_t *op);

/* How many output columns one im2col panel holds, bounding the scratch to a
 * size that stays in the last-level cache while keeping the GEMM wide. */
int64_t kiln_cpu_conv2d_panel_cols(const kiln_op_t *op);

#endif /* KILN_CPU_GEMM_INTERNAL_H */
