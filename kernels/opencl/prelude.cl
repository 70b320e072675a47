/* kernels/opencl/prelude.cl: what every kiln OpenCL program starts with: the dialect's math for ops.def and Philox, and shared helpers. */
/*
 * OpenCL C 1.2 is the baseline. Optional features are used only behind the
 * feature macros the compiler defines for the device (cl_khr_fp64), and only
 * where the host's capability macro agrees (-DKILN_CL_FP64=0 turns it off).
 * Nothing here assumes a warp or wavefront width: kernels that share local
 * memory put a barrier between every write and the reads of other
 * work-items, and every work-item checks its bounds (global sizes are
 * rounded up to the work-group size).
 *
 * Every kernel of an op kind takes the same parameters (KILN_CL_KERNEL):
 * the buffers of out and of in[0..2] (NULL where the op has fewer), then
 * the op's record, kiln_kop_t (kernels/kop.h), as one struct argument.
 * Offsets are elements from each buffer's start (op.out.offset,
 * op.in[i].offset): views are not aligned enough for sub-buffers. Kernels
 * internal to a planner (GEMM packing and products, convolution rounds)
 * take the same parameters, with scratch buffers in operand places, and
 * read their offsets and sizes from op.plan (gemm.cl, conv.cl say how).
 */

#if defined(cl_khr_fp64) && (!defined(KILN_CL_FP64) || KILN_CL_FP64)
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define KILN_CL_HAVE_FP64 1
#endif

#include "kop.h"

/* The parameters of every kernel of an op kind: the operands' buffers, then
 * the record. Named `<name>[_<FORMULA>]_<in[0] dtype>_<out dtype>` (no
 * input: `<name>_<out dtype>`), the name the backend looks up. */
#define KILN_CL_KERNEL(name)                                                                       \
  __kernel void name(__global void *out_, __global void *in0_, __global void *in1_, __global void *in2_, \
                     const kiln_kop_t op)
/* The operands as element pointers, their offsets applied. */
#define KILN_CL_OUT(T) ((__global T *)out_ + op.out.offset)
#define KILN_CL_IN(T, i) ((__global T *)in##i##_ + op.in[i].offset)

/* Whether row kernels give each work-item a contiguous run of the row (CPUs,
 * where each runs alone on a core; the host sets it per device) rather than
 * interleaved elements (GPUs, where neighbours reading neighbours coalesce). */
#ifndef KILN_CL_ROW_RUNS
#define KILN_CL_ROW_RUNS 0
#endif

/* kernels/ops.def's math, in OpenCL C's names (full precision: programs are
 * built without -cl-fast-relaxed-math). */
#define KILN_F_EXP(x) exp(x)
#define KILN_F_LOG(x) log(x)
#define KILN_F_SQRT(x) sqrt(x)
#define KILN_F_TANH(x) tanh(x)
#define KILN_F_FABS(x) fabs(x)
#define KILN_F_COS(x) cos(x)

/* kernels/philox.h's types. */
#define KILN_U32 uint
#define KILN_U64 ulong
#define KILN_PHILOX_FN static inline
#define KILN_FN static inline

/* The largest work-group the reductions are written for (their local arrays
 * have this many entries); the host launches a power of two no larger than
 * this and than the kernel's own limit. */
#define KILN_CL_REDUCE_WG 256

/* Grid-stride loop over [0, n): the host caps global sizes, so a huge tensor
 * reuses work-items instead of needing a huge NDRange. */
#define KILN_FOR_EACH(i, n) for (long i = (long)get_global_id(0); i < (n); i += (long)get_global_size(0))

/* The conversion every kiln backend uses from double to i32: NaN -> 0, out of
 * range -> the nearest limit, else truncation toward zero. */
#ifdef KILN_CL_HAVE_FP64
KILN_FN int kiln_double_to_i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return 2147483647;
  if (v <= -2147483648.0) return (-2147483647 - 1);
  return (int)v;
}
#endif

KILN_FN int kiln_float_to_i32(float v) {
  if (v != v) return 0;
  if (v >= 2147483648.0f) return 2147483647;
  if (v <= -2147483648.0f) return (-2147483647 - 1);
  return (int)v;
}

/* NaN wins, so a row holding NaN comes out NaN (as on the CPU). */
KILN_FN float kiln_max_nan(float a, float b) { return ((b > a || b != b) && a == a) ? b : a; }

/* ---- strided walks ------------------------------------------------------------
 * An elementwise kernel walks out's shape (op.shape: dims of extent 1 dropped
 * and mergeable dims merged by the core) with each input's strides
 * (op.in[i].strides); op.ndim 0 means every operand is plainly contiguous. */

/* The quotient of two non-negative longs by an unsigned division, for use beside
 * a signed `%` of the same operands: a division and a remainder of the same
 * kind get paired by the compiler through an LLVM `freeze`, which Oclgrind's
 * uninitialised-value checker cannot follow. */
KILN_FN long kiln_udiv(long a, long b) { return (long)((ulong)a / (ulong)b); }

/* Element offsets, in one or two strided inputs, of element i of the output. */
KILN_FN long kiln_offset1(long i, int ndim, const long *shape, const long *s0) {
  long a = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    const long coord = i % shape[d];
    i = kiln_udiv(i, shape[d]);
    a += coord * s0[d];
  }
  return a;
}

KILN_FN void kiln_offset2(long i, int ndim, const long *shape, const long *s0, const long *s1, long *o0, long *o1) {
  long a = 0, b = 0;
  for (int d = ndim - 1; d >= 0; d--) {
    const long coord = i % shape[d];
    i = kiln_udiv(i, shape[d]);
    a += coord * s0[d];
    b += coord * s1[d];
  }
  *o0 = a;
  *o1 = b;
}
