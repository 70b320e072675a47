/* kernels/cpu/cpu_native.h: what the CPU kernels share among themselves: strided walks, grains, conversions (private to kernels/cpu). */
#ifndef KILN_CPU_NATIVE_H
#define KILN_CPU_NATIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/dtype_convert.h"

/* Items each thread takes at least, for memory-bound elementwise work: below
 * it, waking helpers costs more than it saves. */
#define KILN_CPU_GRAIN_ELEMENTWISE 32768

#if defined(KILN_HAVE_AVX2_KERNEL)
/* One row of SOFTMAX (log_out: log-softmax) with AVX2 + FMA (nn_avx2.c); call
 * only where the CPU has both. */
void kiln_cpu_softmax_row_avx2(const float *x, float *y, int64_t cols, bool log_out);
/* One row of SOFTMAX_BACKWARD from y and dy (log_in: y is log-softmax), the
 * sums in double in the lanes of kiln_cpu_dot_f64 / kiln_cpu_sum_f64. */
void kiln_cpu_softmax_backward_row_avx2(const float *y, const float *dy, float *dx, int64_t cols, bool log_in);
#endif

/* sum(a * b) and sum(a) in double, in eight lanes of a fixed order (nn.c):
 * the same bits from the scalar and the vector rows. */
double kiln_cpu_dot_f64(const float *a, const float *b, int64_t n);
double kiln_cpu_sum_f64(const float *a, int64_t n);

/* Bytes per element (the core's kiln_dtype_size, from the same list). */
static inline size_t kiln_cpu_dtype_size(kiln_dtype_t dtype) { return kiln_backend_dtype_size(dtype); }

/* Convert a double to i32 the way every kiln backend does: NaN -> 0, out of
 * range -> the nearest limit, else truncation toward zero. */
static inline int32_t kiln_cpu_double_to_i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return 2147483647;
  if (v <= -2147483648.0) return (-2147483647 - 1);
  return (int32_t)v;
}

/* ---- scratch kept per thread (scratch.c) -----------------------------------------
 * At least `bytes` of 64-byte aligned memory that this thread keeps for its
 * next op in the same slot (up to 64 MiB; freed when the thread ends: kiln's
 * own threads end at kiln_shutdown), so that large ops do not fault in fresh
 * pages each time (30% of a 2048^3 bf16 product's time on AMX). *own is set
 * to memory the caller must free (a block too large to keep); NULL without
 * memory. Each slot has one user at a time on a thread. */
typedef enum kiln_cpu_scratch_slot_t {
  KILN_CPU_SCRATCH_BGEMM,  /* the bf16 product's panels and f32 sums (gemm_bf16_avx512.c) */
  KILN_CPU_SCRATCH_WIDEN,  /* f16/bf16 operands widened to f32 (matmul.c, via_f32.c) */
  KILN_CPU_SCRATCH_SLOTS
} kiln_cpu_scratch_slot_t;
void *kiln_cpu_scratch(kiln_cpu_scratch_slot_t slot, size_t bytes, void **own);

/* ---- f16 and bf16 in runs (convert16.c) -----------------------------------------
 * n elements, the 16-bit side every `stride` elements (0: one element
 * repeated) when reading, contiguous when writing; f32 -> 16 bits rounds to
 * nearest even. The same bits as kernels/dtype_convert.h's functions, faster
 * (F16C where the CPU has it, loops the compiler vectorises). */
void kiln_cpu_f16_to_f32_n(const uint16_t *in, int64_t stride, float *out, int64_t n);
void kiln_cpu_bf16_to_f32_n(const uint16_t *in, int64_t stride, float *out, int64_t n);
void kiln_cpu_f32_to_f16_n(const float *in, uint16_t *out, int64_t n);
void kiln_cpu_f32_to_bf16_n(const float *in, uint16_t *out, int64_t n);

/* ---- f16 and bf16 elementwise rows in one pass (elementwise16.c) ----------------
 * The float formulas of kernels/ops.def on 16-bit elements: loaded, computed
 * in f32, stored rounded to nearest even, the same bits as the rows of
 * elementwise.c. Strides 0 (broadcast) or 1 only; b_f32: b is one f32 (a
 * scalar operand). NULL where the CPU lacks what they are compiled for
 * (AVX2 + F16C) or the op has no float formula. */
typedef void (*kiln_cpu_half_binary_fn)(const uint16_t *a, int64_t sa, const void *b, int64_t sb, bool b_f32,
                                        uint16_t *out, int64_t n);
typedef void (*kiln_cpu_half_unary_fn)(const uint16_t *in, int64_t s, uint16_t *out, int64_t n);
kiln_cpu_half_binary_fn kiln_cpu_half_binary_row(kiln_dtype_t dtype, int op);
kiln_cpu_half_unary_fn kiln_cpu_half_unary_row(kiln_dtype_t dtype, int op);

/* ---- walking strided views --------------------------------------------------
 * An output of `ndim` dims (contiguous) and up to two strided inputs, as the
 * core merged them (runtime/backend.h), row by row along the innermost. */
typedef struct kiln_cpu_walk_t {
  int ndim;                        /* >= 1 */
  int64_t shape[KILN_MAX_DIMS];
  int64_t stride[2][KILN_MAX_DIMS];
  int64_t numel;
} kiln_cpu_walk_t;

/* Build the walk of `out`'s shape for `n_in` inputs (1 or 2). */
void kiln_cpu_walk_init(const kiln_view_t *out, const kiln_view_t *in, int n_in, kiln_cpu_walk_t *out_walk);

/* Called for each run of the innermost dim: `count` output elements starting
 * at linear index `pos`, inputs at element offsets off0/off1 with inner
 * strides s0/s1. */
typedef void (*kiln_cpu_row_fn)(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count);

/* Visit linear output indices [begin, end) row by row. */
void kiln_cpu_walk_range(const kiln_cpu_walk_t *walk, int64_t begin, int64_t end, kiln_cpu_row_fn fn,
                         void *ctx);

/* ---- f16 and bf16 through f32 (via_f32.c) --------------------------------------
 * The numerics rule for the 16-bit floats: load to f32 exactly, compute the
 * f32 formula, round once to nearest even. */

/* n elements of `dtype` (f16 or bf16) at src to f32, and back. */
void kiln_cpu_widen_f32(const kiln_cpu_par_t *par, kiln_dtype_t dtype, const void *src, float *dst, int64_t n);
void kiln_cpu_narrow_f32(const kiln_cpu_par_t *par, kiln_dtype_t dtype, const float *src, void *dst, int64_t n);

/* Run `op` (out and the inputs of out's dtype, f16 or bf16, dense) through
 * its f32 kernel: the inputs widened into f32 copies, the kernel run on an op
 * that says f32, its result rounded into `out`. The bits of the f32 op on
 * the widened inputs, cast back. False when the copies could not be
 * allocated: `out` is then NaN throughout. */
bool kiln_cpu_run_via_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in,
                          kiln_cpu_kernel_fn f32_kernel);

#endif /* KILN_CPU_NATIVE_H */
