/* kernels/cpu/gemm_internal.h: private interface of the CPU GEMM, shared by its ISA variants, conv and the BLAS provider. */
#ifndef KILN_CPU_GEMM_INTERNAL_H
#define KILN_CPU_GEMM_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cpu/cpu_kernels.h"

/* Register block of the micro-kernels: MR rows of C by NR columns. 6x16
 * keeps 12 ymm accumulators plus two B vectors and one A broadcast in the 16
 * AVX2 registers; the portable kernel uses the same shape so that packing is
 * shared. The AVX-512 kernel is 6x32 (12 zmm accumulators): the same rows,
 * twice the columns, so only B's slivers are wider. KILN_CPU_GEMM_NR is the
 * narrowest sliver, KILN_CPU_GEMM_NR_MAX the widest (what scratch and edge
 * tiles are sized for). */
#define KILN_CPU_GEMM_MR 6
#define KILN_CPU_GEMM_NR 16
#define KILN_CPU_GEMM_NR_MAX 32

/* One MR x nr tile: C = Ap (kc x MR, packed) @ Bp (kc x nr, packed), or
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
#if defined(KILN_HAVE_AVX512_KERNEL)
/* 6x32 (nr 32). */
void kiln_cpu_gemm_ukernel_avx512(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                                  bool accumulate);
/* C[m0:m1, n0:n1] (+)= op(A) @ B without packing, B not transposed
 * (B(l, j) = b[l*ldb + j]), for small products with k <= KC (256): the
 * same sums as the packed path. */
void kiln_cpu_gemm_small_avx512(bool trans_a, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t k,
                                const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc,
                                bool accumulate);
#endif

/* Split `threads` into a tm x tn grid of MR-row by NR-column slivers whose
 * largest cell (counted in padded tiles) is smallest; ties go to splitting
 * M, whose slices share nothing. (gemm.c; the bf16 product uses it too.) */
void kiln_cpu_gemm_choose_grid(int64_t m, int64_t n, int NR, int threads, int *out_tm, int *out_tn);

/* The bf16 MATMUL on AVX-512 BF16 (gemm_bf16_avx512.c): the f32 tile's
 * blocking with vdpbf16ps on pairs of k steps, f32 sums, C rounded once.
 * Call it only where kiln_cpu_bf16_gemm_available(); false when it had no
 * memory (C is then partly written: run the product another way). */
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
bool kiln_cpu_matmul_bf16_avx512(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in);
/* One such product on the calling thread: C (m x n, ldc) = op(A) @ op(B),
 * plus row_bias[i] (bf16; NULL: none) on row i before the rounding. False
 * when it had no memory. */
bool kiln_cpu_bgemm_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                           int64_t lda, const uint16_t *b, int64_t ldb, uint16_t *c, int64_t ldc,
                           const uint16_t *row_bias);
/* The same product with C in f32, unrounded: stored, or added to C when
 * `accumulate` (the convolutions' gradients sum over images in f32). */
bool kiln_cpu_bgemm_f32_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                               int64_t lda, const uint16_t *b, int64_t ldb, float *c, int64_t ldc, bool accumulate);
/* Weights this small (LeNet's first layer: 6 x 25) leave the bf16 unit's
 * tiles mostly empty: below it, bf16 convolutions and their gradients run
 * through the f32 kernels, which are faster there (64 GFLOPS against the
 * unit's 43 for [100,1,28,28] * [6,1,5,5] on AMX). */
#define KILN_BCONV_MIN_WEIGHTS 512
/* conv.c's im2col panel of 16-bit elements (rows `ld` elements apart). */
void kiln_cpu_conv2d_im2col_u16(const kiln_op_t *op, const uint16_t *x, int64_t j0, int64_t cols, uint16_t *out_col,
                                int64_t ld);
#endif
/* True when this build and CPU have it (AVX-512F, BW and BF16) and it is
 * the faster way there: with AMX, or on AMD (kiln_cpu_bf16_unit_pays_avx512);
 * elsewhere bf16 runs through the f32 kernels. */
bool kiln_cpu_bf16_gemm_available(void);
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
/* Call only on a CPU with AVX-512F, BW and BF16. */
bool kiln_cpu_bf16_unit_pays_avx512(void);
#endif

/* The f64 tiles (kernels/cpu/dgemm.c): MR rows by 8 columns (portable,
 * AVX2) or 16 (AVX-512), the f32 tiles' shapes at half the lanes. */
#define KILN_CPU_DGEMM_MR 6
#define KILN_CPU_DGEMM_NR_MAX 16
typedef void (*kiln_cpu_dgemm_ukernel_fn)(int64_t kc, const double *ap, const double *bp, double *c, int64_t ldc,
                                          bool accumulate);
void kiln_cpu_dgemm_ukernel_portable(int64_t kc, const double *ap, const double *bp, double *c, int64_t ldc,
                                     bool accumulate);
#if defined(KILN_HAVE_AVX2_KERNEL)
void kiln_cpu_dgemm_ukernel_avx2(int64_t kc, const double *ap, const double *bp, double *c, int64_t ldc,
                                 bool accumulate);
#endif
#if defined(KILN_HAVE_AVX512_KERNEL)
void kiln_cpu_dgemm_ukernel_avx512(int64_t kc, const double *ap, const double *bp, double *c, int64_t ldc,
                                   bool accumulate);
#endif

/* Which micro-kernel kiln_cpu_sgemm_isa runs. */
typedef enum kiln_cpu_gemm_isa_t {
  KILN_CPU_GEMM_ISA_AUTO = 0, /* the widest the CPU has */
  KILN_CPU_GEMM_ISA_PORTABLE,
  KILN_CPU_GEMM_ISA_AVX2,     /* falls back to PORTABLE where the CPU or the build lacks it */
  KILN_CPU_GEMM_ISA_AVX512,   /* AVX-512F + FMA; falls back to AVX2, then PORTABLE */
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

/* kiln_cpu_dgemm with a chosen micro-kernel (par NULL: the calling thread). */
void kiln_cpu_dgemm_isa(const kiln_cpu_par_t *par, kiln_cpu_gemm_isa_t isa, bool trans_a, bool trans_b, int64_t m,
                        int64_t n, int64_t k, const double *a, int64_t lda, const double *b, int64_t ldb, double *c,
                        int64_t ldc);

/* One product for kiln_cpu_sgemm_run: C (m x n, ldc) = op(A) @ op(B), or
 * C += op(A) @ op(B) when `accumulate` (beta 1: C must hold values then; k 0
 * leaves it as it is). op() as for kiln_cpu_sgemm. */
typedef struct kiln_cpu_gemm_t {
  bool trans_a, trans_b, accumulate;
  int64_t m, n, k;
  const float *a;
  int64_t lda;
  const float *b;
  int64_t ldb;
  float *c;
  int64_t ldc;
} kiln_cpu_gemm_t;

/* The packing memory (in floats) that kiln_cpu_sgemm_run needs on one
 * thread for a product of these sizes, whatever the micro-kernel. */
int64_t kiln_cpu_sgemm_scratch_floats(int64_t m, int64_t n, int64_t k);

/* The product with micro-kernel `isa`, split over `par`. With par NULL it
 * runs on the calling thread and packs into `scratch` when that is given (at
 * least kiln_cpu_sgemm_scratch_floats(m, n, k) floats, 64-byte aligned), so
 * that a kernel running many small products allocates nothing per product;
 * otherwise (and with a par) it allocates its packing memory itself. */
void kiln_cpu_sgemm_run(const kiln_cpu_par_t *par, kiln_cpu_gemm_isa_t isa, const kiln_cpu_gemm_t *g,
                        float *scratch);

/* MATMUL in f32 with kiln's SGEMM (gemm.c), and in f64 with its DGEMM
 * (matmul.c); kiln_cpu_matmul_native picks by the op's dtype. */
void kiln_cpu_matmul_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in);
void kiln_cpu_matmul_f64(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in);

/* A MATMUL of f16 or bf16 operands through an f32 kernel: A and B widened to
 * f32 (exactly), `f32_kernel` run on them with the op's own layout, C
 * rounded once to the op's dtype (nearest even). The same bits as the f32
 * op on the widened operands. */
void kiln_cpu_matmul_via_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in,
                             void (*f32_kernel)(const kiln_cpu_par_t *, const kiln_op_t *, void *,
                                                const void *const *));

/* Convolution lowering shared by the native and BLAS conv2d: the im2col panel
 * of image `x` (c x h x w) for output columns [j0, j0 + cols) of the p*q
 * output plane, written as a (c*r*s) x cols row-major matrix into out_col.
 * Padded cells read as 0. */
void kiln_cpu_conv2d_im2col(const kiln_op_t *op, const float *x, int64_t j0, int64_t cols,
                            float *out_col);
/* The same with rows `ld` floats apart (ld >= cols). */
void kiln_cpu_conv2d_im2col_ld(const kiln_op_t *op, const float *x, int64_t j0, int64_t cols, float *out_col,
                               int64_t ld);

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

/* The convolution gradients (conv_backward.c), written once for any GEMM:
 * kiln's own (the native rows) or a CBLAS (the blas rows). `fn` runs one
 * product on the calling thread (par NULL, with `scratch` of
 * kiln_cpu_sgemm_scratch_floats when `packs`) or split over `par`. Panels of
 * the im2col matrix hold about `panel_floats`. */
typedef void (*kiln_cpu_gemm_fn)(void *ctx, const kiln_cpu_par_t *par, const kiln_cpu_gemm_t *g, float *scratch);
typedef struct kiln_cpu_conv_gemm_t {
  kiln_cpu_gemm_fn fn;
  void *ctx;
  bool packs;
  int64_t panel_floats;
} kiln_cpu_conv_gemm_t;

/* dx [N,C,H,W] from dy [N,K,P,Q] and w [K,C,R,S]; dw [K,C,R,S] from x and dy. */
void kiln_cpu_conv2d_backward_input_run(const kiln_cpu_par_t *par, const kiln_op_t *op, float *dx, const float *dy,
                                        const float *w, const kiln_cpu_conv_gemm_t *gemm);
void kiln_cpu_conv2d_backward_weight_run(const kiln_cpu_par_t *par, const kiln_op_t *op, float *dw, const float *x,
                                         const float *dy, const kiln_cpu_conv_gemm_t *gemm);

#endif /* KILN_CPU_GEMM_INTERNAL_H */
