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
#include "dtype_convert.h"

/* The parameters of every kernel of an op kind: the operands' buffers, then
 * the record. Named `<name>[_<FORMULA>]_<in[0] dtype>_<out dtype>` (no
 * input: `<name>_<out dtype>`), the name the backend looks up. */
#define KILN_CL_KERNEL(name)                                                                       \
  __kernel void name(__global void *out_, __global void *in0_, __global void *in1_, __global void *in2_, \
                     __global void *in3_, const kiln_kop_t op)
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

/* ---- the dtypes ------------------------------------------------------------------
 * Every dtype as the kernels see it, one row each:
 *   X(name, dc, T, BITS, CLASS)
 * name: kiln_dtype_name's (kernel names); dc: kernels/dtype_convert.h's name
 * (bool is b8 there); T: the storage type (f16 and bf16 as their 16 bits);
 * BITS: the unsigned type of T's size (copies, fills, where move bits);
 * CLASS: fc (a float, converted through the float carrier) or ic (an
 * integer or bool, through int64). f64 exists only with cl_khr_fp64.
 * KILN_CL_DTYPES_TO_ is the same list for the inner loop of pairs (a macro
 * cannot expand inside itself): keep the two in step. */
#define KILN_CL_DTYPES_NO_F64_(X)                                                                  \
  X(f32, f32, float, uint, fc) X(i32, i32, int, uint, ic) X(f16, f16, ushort, ushort, fc)          \
  X(bf16, bf16, ushort, ushort, fc) X(i64, i64, long, ulong, ic) X(i8, i8, char, uchar, ic)        \
  X(u8, u8, uchar, uchar, ic) X(i16, i16, short, ushort, ic) X(bool, b8, uchar, uchar, ic)
#define KILN_CL_DTYPES_TO_NO_F64_(X, s, sdc, ST, SB, SC)                                           \
  X(s, sdc, ST, SB, SC, f32, f32, float, uint, fc) X(s, sdc, ST, SB, SC, i32, i32, int, uint, ic)  \
  X(s, sdc, ST, SB, SC, f16, f16, ushort, ushort, fc)                                              \
  X(s, sdc, ST, SB, SC, bf16, bf16, ushort, ushort, fc)                                            \
  X(s, sdc, ST, SB, SC, i64, i64, long, ulong, ic) X(s, sdc, ST, SB, SC, i8, i8, char, uchar, ic)  \
  X(s, sdc, ST, SB, SC, u8, u8, uchar, uchar, ic) X(s, sdc, ST, SB, SC, i16, i16, short, ushort, ic) \
  X(s, sdc, ST, SB, SC, bool, b8, uchar, uchar, ic)
#ifdef KILN_CL_HAVE_FP64
#define KILN_CL_DTYPES(X) KILN_CL_DTYPES_NO_F64_(X) X(f64, f64, double, ulong, fc)
#define KILN_CL_DTYPES_TO_(X, s, sdc, ST, SB, SC)                                                  \
  KILN_CL_DTYPES_TO_NO_F64_(X, s, sdc, ST, SB, SC) X(s, sdc, ST, SB, SC, f64, f64, double, ulong, fc)
#else
#define KILN_CL_DTYPES(X) KILN_CL_DTYPES_NO_F64_(X)
#define KILN_CL_DTYPES_TO_(X, s, sdc, ST, SB, SC) KILN_CL_DTYPES_TO_NO_F64_(X, s, sdc, ST, SB, SC)
#endif

/* ---- conversions (kiln_tensor_cast's rule, bit for bit as the CPU) -------------------
 * A value of class ic goes through int64 (kiln_dc_load_<dc>, then
 * kiln_dc_i64_to_<dc>). A float goes through the float carrier KILN_CL_FC:
 * double where the device has fp64 (kiln_dc_load_<dc>, kiln_dc_f64_to_<dc>);
 * float elsewhere, which holds f32, f16 and bf16 exactly, so every
 * conversion still rounds once from the exact value:
 * kiln_cl_fc_load_<dc> and kiln_cl_fc_to_<dc> below. */
#define KILN_CL_CONVERT_ic(sdc, ddc, x) kiln_dc_i64_to_##ddc(kiln_dc_load_##sdc(x))
#define KILN_CL_CONVERT_fc(sdc, ddc, x) kiln_cl_fc_to_##ddc(kiln_cl_fc_load_##sdc(x))
#define KILN_CL_CONVERT(SC, sdc, ddc, x) KILN_CL_CONVERT_##SC(sdc, ddc, x)

#ifdef KILN_CL_HAVE_FP64
#define KILN_CL_FC double
#define kiln_cl_fc_load_f32 kiln_dc_load_f32
#define kiln_cl_fc_load_f16 kiln_dc_load_f16
#define kiln_cl_fc_load_bf16 kiln_dc_load_bf16
#define kiln_cl_fc_load_f64 kiln_dc_load_f64
#define kiln_cl_fc_to_f32 kiln_dc_f64_to_f32
#define kiln_cl_fc_to_f64 kiln_dc_f64_to_f64
#define kiln_cl_fc_to_i32 kiln_dc_f64_to_i32
#define kiln_cl_fc_to_i64 kiln_dc_f64_to_i64
#define kiln_cl_fc_to_i8 kiln_dc_f64_to_i8
#define kiln_cl_fc_to_u8 kiln_dc_f64_to_u8
#define kiln_cl_fc_to_i16 kiln_dc_f64_to_i16
#define kiln_cl_fc_to_b8 kiln_dc_f64_to_b8
#else
#define KILN_CL_FC float
KILN_FN float kiln_cl_fc_load_f32(float x) { return x; }
KILN_FN float kiln_cl_fc_load_f16(ushort x) { return kiln_dc_f16_to_f32(x); }
KILN_FN float kiln_cl_fc_load_bf16(ushort x) { return kiln_dc_bf16_to_f32(x); }
KILN_FN float kiln_cl_fc_to_f32(float x) { return x; }
KILN_FN uchar kiln_cl_fc_to_b8(float x) { return x != 0.0f; }
/* Toward zero, NaN -> 0, out of range -> the nearest limit: for a float x,
 * x >= (float)HI exactly when x >= HI (no float lies between HI and the
 * float nearest it above). */
#define KILN_CL_FC_TO_INT_(NAME, T, LO, HI)                                                        \
  KILN_FN T kiln_cl_fc_to_##NAME(float x) {                                                        \
    if (x != x) return (T)0;                                                                       \
    if (x >= (float)(HI)) return (T)(HI);                                                          \
    if (x <= (float)(LO)) return (T)(LO);                                                          \
    return (T)x;                                                                                   \
  }
KILN_CL_FC_TO_INT_(i8, char, -128, 127)
KILN_CL_FC_TO_INT_(u8, uchar, 0, 255)
KILN_CL_FC_TO_INT_(i16, short, -32768, 32767)
KILN_CL_FC_TO_INT_(i32, int, (-2147483647 - 1), 2147483647)
KILN_CL_FC_TO_INT_(i64, long, (-0x7fffffffffffffffL - 1), 0x7fffffffffffffffL)
#undef KILN_CL_FC_TO_INT_
#endif

/* A float into a narrow format (mb fraction bits, exponent bias: f16 10,
 * 15; bf16 7, 127), rounded once to nearest even: kiln_dc_narrow_f64's rule
 * on a float's bits (NaN quiet with its sign and top payload bits). */
KILN_FN ushort kiln_cl_narrow_f32(float x, int mb, int bias) {
  const uint b = as_uint(x);
  const uint sign = (b >> 31) << (uint)(mb + (bias == 15 ? 5 : 8));
  const uint exp = (b >> 23) & 0xffu;
  const uint frac = b & 0x7fffffu;
  const uint inf = (uint)(2 * bias + 1) << (uint)mb;
  if (exp == 0xffu) {
    if (frac == 0) return (ushort)(sign | inf);
    return (ushort)(sign | inf | (1u << (uint)(mb - 1)) | (frac >> (uint)(23 - mb)));
  }
  if (exp == 0 && frac == 0) return (ushort)sign;
  const ulong m = exp ? (frac | 0x800000u) : frac;
  const int e = exp ? (int)exp - 150 : -149;
  return (ushort)(sign | kiln_dc_pack(m, e, mb, bias));
}
#ifndef KILN_CL_HAVE_FP64
KILN_FN ushort kiln_cl_fc_to_f16(float x) { return kiln_cl_narrow_f32(x, 10, 15); }
KILN_FN ushort kiln_cl_fc_to_bf16(float x) { return kiln_cl_narrow_f32(x, 7, 127); }
#else
/* A double into f16 or bf16 through a float rounded to odd (toward zero,
 * then its lowest bit set when inexact): 24 bits are more than the 11 (8)
 * plus two that make the second rounding, to nearest even, give the
 * once-rounded result (subnormals included: the float grid is finer).
 * kiln_dc_narrow_f64's 53-bit path compiles to what Oclgrind cannot take (a
 * 128-bit constant). A NaN keeps its sign and top payload bits, quiet. */
KILN_FN ushort kiln_cl_narrow_f64(double x, int mb, int bias) {
  if (x != x) {
    const ulong b = as_ulong(x);
    const uint sign = (uint)(b >> 63) << (uint)(mb + (bias == 15 ? 5 : 8));
    const uint inf = (uint)(2 * bias + 1) << (uint)mb;
    return (ushort)(sign | inf | (1u << (uint)(mb - 1)) | (uint)((b & 0xfffffffffffffUL) >> (uint)(52 - mb)));
  }
  float f = convert_float_rtz(x);
  if ((double)f != x) f = as_float(as_uint(f) | 1u);
  return kiln_cl_narrow_f32(f, mb, bias);
}
KILN_FN ushort kiln_cl_fc_to_f16(double x) { return kiln_cl_narrow_f64(x, 10, 15); }
KILN_FN ushort kiln_cl_fc_to_bf16(double x) { return kiln_cl_narrow_f64(x, 7, 127); }
#endif

/* f16 and bf16 compute in f32: a value's load into its compute type, and
 * the store back (rounded to nearest even). */
#define KILN_CL_TO_F32_f16(x) kiln_dc_f16_to_f32(x)
#define KILN_CL_TO_F32_bf16(x) kiln_dc_bf16_to_f32(x)
#define KILN_CL_FROM_F32_f16(x) kiln_cl_narrow_f32((x), 10, 15)
#define KILN_CL_FROM_F32_bf16(x) kiln_cl_narrow_f32((x), 7, 127)
