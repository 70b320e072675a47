/* kernels/cuda/kiln.cu: kiln's native CUDA kernels, compiled by nvcc into the fatbin the CUDA plugin embeds. */
/*
 * One translation unit on purpose: nvcc then parses the headers once per
 * architecture, which keeps the build short on small machines. Every kernel
 * is extern "C" and takes the op's record (kernels/kop.h) by value, its only
 * parameter: operands at op.out.addr and op.in[i].addr, out's shape and the
 * inputs' strides, the kind's parameters in op.u, and what a planner added
 * in op.plan. Bodies are templates over the element type T (and the
 * accumulate type where one is needed); KILN_INSTANCE makes each kernel one
 * of them, named as the plugin looks it up:
 * kiln_<kind>[_<FORMULA>]_<dtype of in[0]>_<dtype of out> (kinds without an
 * input: kiln_<kind>_<dtype of out>); the planners' own kernels (SGEMM,
 * im2col, reduction passes, ...) by descriptive names. Adding a dtype is a
 * line of instantiations and its conversions below.
 * Build without --use_fast_math: the formulas must match the CPU backend's
 * within a few ulps.
 */
#include <math.h>
#include <stdint.h>

#include "kop.h"
#include "launch.h"

/* The matrix units' API (gemm.cuh's WMMA kernels); the test driver's shim
 * provides its own. */
#ifndef KILN_FAKECUDA_CUDA_SHIM_H
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#endif

/* ---- the shared op table and Philox ---------------------------------------- */

/* The math of kernels/ops.def, for float and double. */
#define KILN_MATH_(name, f, d)                                                                      \
  __device__ __forceinline__ float name(float x) { return f(x); }                                   \
  __device__ __forceinline__ double name(double x) { return d(x); }
KILN_MATH_(kiln_m_exp, expf, exp)
KILN_MATH_(kiln_m_log, logf, log)
KILN_MATH_(kiln_m_sqrt, sqrtf, sqrt)
KILN_MATH_(kiln_m_tanh, tanhf, tanh)
KILN_MATH_(kiln_m_fabs, fabsf, fabs)
#undef KILN_MATH_
#define KILN_F_EXP(x) kiln_m_exp(x)
#define KILN_F_LOG(x) kiln_m_log(x)
#define KILN_F_SQRT(x) kiln_m_sqrt(x)
#define KILN_F_TANH(x) kiln_m_tanh(x)
#define KILN_F_FABS(x) kiln_m_fabs(x)

#define KILN_U32 unsigned int
#define KILN_U64 unsigned long long
#define KILN_PHILOX_FN __device__ __forceinline__
#define KILN_PHILOX_F64 1
#include "philox.h"

/* A kernel: extern "C", the record by value, the body a template
 * instantiation (the rest of the arguments, commas and all). */
#define KILN_INSTANCE(NAME, ...)                                                                    \
  extern "C" __global__ void __launch_bounds__(KILN_CUDA_BLOCK) NAME(const kiln_kop_t op) { __VA_ARGS__(op); }

/* Grid-stride loop over [0, n): grids are capped on the host, so huge
 * tensors reuse threads instead of overflowing gridDim.x. */
#define KILN_FOR_EACH(i, n)                                                                         \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
       i += (int64_t)gridDim.x * blockDim.x)

/* ---- the dtypes: C types and conversions ------------------------------------ */

/* Every conversion is kernels/dtype_convert.h's, the one rule of every kiln
 * backend (bit-identical to the CPU's): a dtype loads into an exact carrier
 * (double for the floats, int64 for the integers and bool) and stores from
 * either with one rounding. */
#define KILN_DC_FN __device__ __forceinline__
#include "dtype_convert.h"

/* Storage types the templates tell apart: f16 and bf16 are their 16 bits,
 * bool a byte (0 or 1). */
struct kiln_f16_t { kiln_u16 bits; };
struct kiln_bf16_t { kiln_u16 bits; };
struct kiln_bool_t { kiln_u8 bits; };

/* A dtype's raw value as dtype_convert.h takes it, and back. */
template <typename T> __device__ __forceinline__ T kiln_raw(T x) { return x; }
__device__ __forceinline__ kiln_u16 kiln_raw(kiln_f16_t x) { return x.bits; }
__device__ __forceinline__ kiln_u16 kiln_raw(kiln_bf16_t x) { return x.bits; }
__device__ __forceinline__ kiln_u8 kiln_raw(kiln_bool_t x) { return x.bits; }
template <typename T> struct kiln_box {
  template <typename R> static __device__ __forceinline__ T f(R r) { return (T)r; }
};
#define KILN_BOX_(T)                                                                                \
  template <> struct kiln_box<T> {                                                                  \
    template <typename R> static __device__ __forceinline__ T f(R r) {                              \
      T v;                                                                                          \
      v.bits = r;                                                                                   \
      return v;                                                                                     \
    }                                                                                               \
  };
KILN_BOX_(kiln_f16_t)
KILN_BOX_(kiln_bf16_t)
KILN_BOX_(kiln_bool_t)
#undef KILN_BOX_

/* The dtypes as the kernels name them: X(kernel name, dtype_convert.h name,
 * storage type, carrier, unsigned type of its size, P), P passed through.
 * Adding a dtype is a row here (and its conversions in dtype_convert.h). */
#define KILN_CUDA_DTYPES(X, P)                                                                      \
  X(f32, f32, float, f64, kiln_u32, P) X(i32, i32, int, i64, kiln_u32, P)                           \
  X(f16, f16, kiln_f16_t, f64, kiln_u16, P) X(bf16, bf16, kiln_bf16_t, f64, kiln_u16, P)            \
  X(f64, f64, double, f64, kiln_u64, P) X(i64, i64, kiln_i64, i64, kiln_u64, P)                     \
  X(i8, i8, kiln_i8, i64, kiln_u8, P) X(u8, u8, kiln_u8, i64, kiln_u8, P)                           \
  X(i16, i16, kiln_i16, i64, kiln_u16, P) X(bool, b8, kiln_bool_t, i64, kiln_u8, P)

/* kiln_load(x): the carrier's value; kiln_store<T>::from(carrier): rounded
 * once into T, out of line (the narrowing into f16 and bf16 is long, and
 * one copy of it serves every kernel: the fatbin and nvcc's time stay
 * small); kiln_nonzero(x): x != 0 (NaN is nonzero, -0 is not). */
template <typename T> struct kiln_store;
#define KILN_DTYPE_CONV_(NAME, DC, T, CARRIER, BITS, P)                                             \
  __device__ __forceinline__ kiln_##CARRIER kiln_load(const T x) { return kiln_dc_load_##DC(kiln_raw(x)); } \
  template <> struct kiln_store<T> {                                                                \
    static __device__ __noinline__ T from(kiln_f64 v) { return kiln_box<T>::f(kiln_dc_f64_to_##DC(v)); } \
    static __device__ __noinline__ T from(kiln_i64 v) { return kiln_box<T>::f(kiln_dc_i64_to_##DC(v)); } \
  };
KILN_CUDA_DTYPES(KILN_DTYPE_CONV_, ~)
#undef KILN_DTYPE_CONV_
template <typename T> __device__ __forceinline__ bool kiln_nonzero(T x) { return x != 0; }
__device__ __forceinline__ bool kiln_nonzero(kiln_f16_t x) { return (x.bits & 0x7fffu) != 0; }
__device__ __forceinline__ bool kiln_nonzero(kiln_bf16_t x) { return (x.bits & 0x7fffu) != 0; }
__device__ __forceinline__ bool kiln_nonzero(kiln_bool_t x) { return x.bits != 0; }

/* CAST, WHERE and COMPARE read and write every dtype (pair): one kernel
 * each (per formula), the dtypes read from the record (a uniform branch
 * per element, against 90 or 100 instantiations each that would multiply
 * nvcc's time and the fatbin, for memory-bound kernels). The switches come from KILN_CUDA_DTYPES, whose
 * order is include/kiln/tensor.h's KILN_DTYPES (the kiln_dtype_t values). */
enum {
#define KILN_DT_ENUM_(NAME, DC, T, CARRIER, BITS, P) KILN_CUDA_DT_##NAME,
  KILN_CUDA_DTYPES(KILN_DT_ENUM_, ~)
#undef KILN_DT_ENUM_
};

/* A value in its carrier (kernels/dtype_convert.h), either kind. */
struct kiln_carried {
  kiln_f64 f;
  kiln_i64 i;
  int is_float;
};
__device__ __forceinline__ void kiln_carry(kiln_carried &c, kiln_f64 v) { c.f = v, c.is_float = 1; }
__device__ __forceinline__ void kiln_carry(kiln_carried &c, kiln_i64 v) { c.i = v, c.is_float = 0; }

__device__ __forceinline__ kiln_carried kiln_load_dyn(int dtype, kiln_u64 addr, int64_t at) {
  kiln_carried c;
  c.f = 0.0, c.i = 0, c.is_float = 0;
  switch (dtype) {
#define KILN_LOAD_CASE_(NAME, DC, T, CARRIER, BITS, P)                                             \
  case KILN_CUDA_DT_##NAME: kiln_carry(c, kiln_load(((const T *)addr)[at])); break;
    KILN_CUDA_DTYPES(KILN_LOAD_CASE_, ~)
#undef KILN_LOAD_CASE_
  default: break;
  }
  return c;
}

__device__ __forceinline__ void kiln_store_dyn(int dtype, kiln_u64 addr, int64_t at, const kiln_carried &c) {
  switch (dtype) {
#define KILN_STORE_CASE_(NAME, DC, T, CARRIER, BITS, P)                                            \
  case KILN_CUDA_DT_##NAME: ((T *)addr)[at] = c.is_float ? kiln_store<T>::from(c.f) : kiln_store<T>::from(c.i); break;
    KILN_CUDA_DTYPES(KILN_STORE_CASE_, ~)
#undef KILN_STORE_CASE_
  default: break;
  }
}

__device__ __forceinline__ bool kiln_nonzero_dyn(int dtype, kiln_u64 addr, int64_t at) {
  switch (dtype) {
#define KILN_NONZERO_CASE_(NAME, DC, T, CARRIER, BITS, P)                                          \
  case KILN_CUDA_DT_##NAME: return kiln_nonzero(((const T *)addr)[at]);
    KILN_CUDA_DTYPES(KILN_NONZERO_CASE_, ~)
#undef KILN_NONZERO_CASE_
  default: return false;
  }
}

__device__ __forceinline__ int kiln_dtype_bytes(int dtype) {
  switch (dtype) {
#define KILN_BYTES_CASE_(NAME, DC, T, CARRIER, BITS, P) case KILN_CUDA_DT_##NAME: return (int)sizeof(T);
    KILN_CUDA_DTYPES(KILN_BYTES_CASE_, ~)
#undef KILN_BYTES_CASE_
  default: return 0;
  }
}

/* ---- elementwise --------------------------------------------------------------- */

/* Offsets of element i of out (contiguous, of op.shape) in the first N
 * inputs, walked by their strides (0 where broadcast). */
template <int N> __device__ __forceinline__ void kiln_offsets(const kiln_kop_t &op, int64_t i, int64_t (&o)[N]) {
#pragma unroll
  for (int j = 0; j < N; j++) o[j] = 0;
  for (int d = op.ndim - 1; d >= 0; d--) {
    const int64_t extent = op.shape[d];
    const int64_t coord = i % extent;
    i /= extent;
#pragma unroll
    for (int j = 0; j < N; j++) o[j] += coord * op.in[j].strides[d];
  }
}

/* The compute type of each storage type (kernels/ops.def's rule): f16 and
 * bf16 compute in f32, loaded exactly and stored rounded once to nearest
 * even; every other dtype is its own. */
template <typename T> struct kiln_cx {
  typedef T type;
  static __device__ __forceinline__ T in(const T x) { return x; }
  static __device__ __forceinline__ T out(const T c) { return c; }
};
template <> struct kiln_cx<kiln_f16_t> {
  typedef float type;
  static __device__ __forceinline__ float in(const kiln_f16_t x) { return kiln_dc_f16_to_f32(x.bits); }
  static __device__ __forceinline__ kiln_f16_t out(const float c) { return kiln_store<kiln_f16_t>::from((kiln_f64)c); }
};
template <> struct kiln_cx<kiln_bf16_t> {
  typedef float type;
  static __device__ __forceinline__ float in(const kiln_bf16_t x) { return kiln_dc_bf16_to_f32(x.bits); }
  static __device__ __forceinline__ kiln_bf16_t out(const float c) { return kiln_store<kiln_bf16_t>::from((kiln_f64)c); }
};

/* The walk of every elementwise kernel: out[i] = F::f(the elements of the
 * N inputs for i, in their compute type), one contiguous run when ndim is
 * 0 (the fast path). */
template <typename TIN, typename TOUT, int N, typename F> __device__ __forceinline__ void kiln_map(const kiln_kop_t &op) {
  typedef kiln_cx<TIN> CI;
  typedef kiln_cx<TOUT> CO;
  const TIN *__restrict__ in0 = (const TIN *)op.in[0].addr;
  const TIN *__restrict__ in1 = (const TIN *)op.in[N > 1 ? 1 : 0].addr;
  TOUT *__restrict__ out = (TOUT *)op.out.addr;
  if (op.ndim == 0) {
    KILN_FOR_EACH(i, op.n) out[i] = CO::out(F::f(op, CI::in(in0[i]), CI::in(N > 1 ? in1[i] : in0[i])));
  } else {
    KILN_FOR_EACH(i, op.n) {
      int64_t o[N];
      kiln_offsets<N>(op, i, o);
      out[i] = CO::out(F::f(op, CI::in(in0[o[0]]), CI::in(N > 1 ? in1[o[N - 1]] : in0[o[0]])));
    }
  }
}

/* The core's scalar (kernels/kop.h) in a formula's compute type: f32 for
 * f32, f16 and bf16, the value for f64, its bits for the integers. */
template <typename T> __device__ __forceinline__ typename kiln_cx<T>::type kiln_scalar(const kiln_scalar_t &s) {
  return (T)s.bits;
}
template <> __device__ __forceinline__ float kiln_scalar<float>(const kiln_scalar_t &s) { return s.f32; }
template <> __device__ __forceinline__ float kiln_scalar<kiln_f16_t>(const kiln_scalar_t &s) { return s.f32; }
template <> __device__ __forceinline__ float kiln_scalar<kiln_bf16_t>(const kiln_scalar_t &s) { return s.f32; }
template <> __device__ __forceinline__ double kiln_scalar<double>(const kiln_scalar_t &s) { return s.value; }

/* UT of the integer formulas: unsigned, at least 32 bits and IT's width. */
template <bool WIDE> struct kiln_ut_ { typedef kiln_u32 type; };
template <> struct kiln_ut_<true> { typedef kiln_u64 type; };

/* The formulas of kernels/ops.def as functors of (op, first, second) in
 * the compute type C of storage type T; the integer formulas name their
 * type IT and wrap through UT. u8's `x < 0` is always false, on purpose. */
#if defined(__CUDACC__)
#pragma nv_diag_suppress 186, 514
#else
#pragma GCC diagnostic ignored "-Wtype-limits"
#endif
#define KILN_IT_UT_(C)                                                                              \
  typedef C IT;                                                                                     \
  typedef kiln_ut_<(sizeof(C) > 4)>::type UT;                                                       \
  (void)sizeof(IT);                                                                                 \
  (void)sizeof(UT);
#define KILN_UNARY_FN_(TNAME, T, NAME, expr)                                                       \
  struct kiln_unary_##NAME##_##TNAME {                                                             \
    typedef kiln_cx<T>::type C;                                                                    \
    static __device__ __forceinline__ C f(const kiln_kop_t &, const C x, const C) { KILN_IT_UT_(C) return (expr); } \
  };                                                                                               \
  KILN_INSTANCE(kiln_unary_##NAME##_##TNAME##_##TNAME, kiln_map<T, T, 1, kiln_unary_##NAME##_##TNAME>)
#define KILN_BINARY_FN_(TNAME, T, NAME, expr)                                                      \
  struct kiln_binary_##NAME##_##TNAME {                                                            \
    typedef kiln_cx<T>::type C;                                                                    \
    static __device__ __forceinline__ C f(const kiln_kop_t &, const C a, const C b) { KILN_IT_UT_(C) return (expr); } \
  };                                                                                               \
  struct kiln_binary_scalar_##NAME##_##TNAME {                                                     \
    typedef kiln_cx<T>::type C;                                                                    \
    static __device__ __forceinline__ C f(const kiln_kop_t &op, const C a, const C) {              \
      const C b = kiln_scalar<T>(op.u.binary.scalar);                                              \
      KILN_IT_UT_(C)                                                                               \
      return (expr);                                                                               \
    }                                                                                              \
  };                                                                                               \
  KILN_INSTANCE(kiln_binary_##NAME##_##TNAME##_##TNAME, kiln_map<T, T, 2, kiln_binary_##NAME##_##TNAME>) \
  KILN_INSTANCE(kiln_binary_scalar_##NAME##_##TNAME##_##TNAME,                                      \
                kiln_map<T, T, 1, kiln_binary_scalar_##NAME##_##TNAME>)
/* UNARY_BACKWARD: dx = dy * f'(x), x (in[0]) and dy (in[1]) walked as a
 * binary op's inputs. */
#define KILN_UNARY_GRAD_FN_(TNAME, T, NAME, expr)                                                  \
  struct kiln_unary_backward_##NAME##_##TNAME {                                                    \
    typedef kiln_cx<T>::type C;                                                                    \
    static __device__ __forceinline__ C f(const kiln_kop_t &, const C x, const C dy) {             \
      (void)x; /* NEG's derivative does not read it */                                             \
      return (expr);                                                                               \
    }                                                                                              \
  };                                                                                               \
  KILN_INSTANCE(kiln_unary_backward_##NAME##_##TNAME##_##TNAME,                                     \
                kiln_map<T, T, 2, kiln_unary_backward_##NAME##_##TNAME>)

/* The dtypes of each family (rows of KILN_CUDA_DTYPES): X(name, storage
 * type, the family row's arguments). */
#define KILN_CUDA_FLOAT_DTYPES(X, ...)                                                              \
  X(f32, float, __VA_ARGS__) X(f16, kiln_f16_t, __VA_ARGS__) X(bf16, kiln_bf16_t, __VA_ARGS__)      \
  X(f64, double, __VA_ARGS__)
#define KILN_CUDA_INT_DTYPES(X, ...)                                                                \
  X(i32, int, __VA_ARGS__) X(i64, kiln_i64, __VA_ARGS__) X(i8, kiln_i8, __VA_ARGS__)                \
  X(u8, kiln_u8, __VA_ARGS__) X(i16, kiln_i16, __VA_ARGS__)

/* COMPARE (kernel `kiln_compare_<FORMULA>`, every dtype, out bool): a and
 * b of one dtype, read from the record, compared in their carrier (double
 * for the floats, int64 for the integers and bool: exact, so every answer
 * is the compute type's). */
template <typename F> __device__ __forceinline__ void kiln_compare_any(const kiln_kop_t &op) {
  const int dtype = op.in[0].dtype;
  kiln_u8 *__restrict__ out = (kiln_u8 *)op.out.addr;
  KILN_FOR_EACH(i, op.n) {
    int64_t o[2] = {i, i};
    if (op.ndim != 0) kiln_offsets<2>(op, i, o);
    const kiln_carried a = kiln_load_dyn(dtype, op.in[0].addr, o[0]);
    const kiln_carried b = kiln_load_dyn(dtype, op.in[1].addr, o[1]);
    out[i] = (a.is_float ? F::f(a.f, b.f) : F::f(a.i, b.i)) ? 1u : 0u;
  }
}
#define KILN_COMPARE_FN_(NAME, expr)                                                               \
  struct kiln_cmp_##NAME {                                                                     \
    template <typename C> static __device__ __forceinline__ bool f(const C a, const C b) { return (expr); } \
  };                                                                                               \
  KILN_INSTANCE(kiln_compare_##NAME, kiln_compare_any<kiln_cmp_##NAME>)

#define KILN_UNARY_FLOAT(NAME, expr) KILN_CUDA_FLOAT_DTYPES(KILN_UNARY_FN_, NAME, expr)
#define KILN_UNARY_INT(NAME, expr) KILN_CUDA_INT_DTYPES(KILN_UNARY_FN_, NAME, expr)
#define KILN_BINARY_FLOAT(NAME, expr) KILN_CUDA_FLOAT_DTYPES(KILN_BINARY_FN_, NAME, expr)
#define KILN_BINARY_INT(NAME, expr) KILN_CUDA_INT_DTYPES(KILN_BINARY_FN_, NAME, expr)
#define KILN_UNARY_GRAD_FLOAT(NAME, expr) KILN_UNARY_GRAD_FN_(f32, float, NAME, expr)
#define KILN_COMPARE(NAME, expr) KILN_COMPARE_FN_(NAME, expr)
#include "ops.def"


/* ---- dtype-dispatched kinds: CAST and WHERE ------------------------------------- */

/* CAST (kernel `kiln_cast`, every pair): kernels/dtype_convert.h's rule,
 * load into the carrier then one rounding into out's dtype; in[0] a strided
 * view (or, ndim 0, a contiguous run). */
__device__ __forceinline__ void kiln_cast_any(const kiln_kop_t &op) {
  const int from = op.in[0].dtype, to = op.out.dtype;
  KILN_FOR_EACH(i, op.n) {
    int64_t o[1] = {i};
    if (op.ndim != 0) kiln_offsets<1>(op, i, o);
    kiln_store_dyn(to, op.out.addr, i, kiln_load_dyn(from, op.in[0].addr, o[0]));
  }
}

/* WHERE (kernel `kiln_where`, any condition dtype, any value dtype): out =
 * cond != 0 ? a : b (NaN is nonzero, -0.0 is not), the values copied as
 * bits of their size; the three walk out's shape by their strides. */
template <typename BITS> __device__ __forceinline__ void kiln_where_bits(const kiln_kop_t &op) {
  const int cond = op.in[0].dtype;
  const BITS *__restrict__ a = (const BITS *)op.in[1].addr;
  const BITS *__restrict__ b = (const BITS *)op.in[2].addr;
  BITS *__restrict__ out = (BITS *)op.out.addr;
  KILN_FOR_EACH(i, op.n) {
    int64_t o[3] = {i, i, i};
    if (op.ndim != 0) kiln_offsets<3>(op, i, o);
    out[i] = kiln_nonzero_dyn(cond, op.in[0].addr, o[0]) ? a[o[1]] : b[o[2]];
  }
}
__device__ __forceinline__ void kiln_where_any(const kiln_kop_t &op) {
  switch (kiln_dtype_bytes(op.out.dtype)) {
  case 1: kiln_where_bits<kiln_u8>(op); break;
  case 2: kiln_where_bits<kiln_u16>(op); break;
  case 4: kiln_where_bits<kiln_u32>(op); break;
  default: kiln_where_bits<kiln_u64>(op); break;
  }
}

/* COPY: the element's bits. */
template <typename T> struct kiln_copy_fn {
  static __device__ __forceinline__ T f(const kiln_kop_t &, const T x, const T) { return x; }
};
template <typename BITS> __device__ __forceinline__ void kiln_copy(const kiln_kop_t &op) {
  kiln_map<BITS, BITS, 1, kiln_copy_fn<BITS> >(op);
}

/* ---- generators ------------------------------------------------------------------ */

/* FILL: the scalar's bits in the dtype (kiln_scalar_t.bits), by size. */
template <typename BITS> __device__ __forceinline__ void kiln_fill(const kiln_kop_t &op) {
  BITS *__restrict__ out = (BITS *)op.out.addr;
  const BITS v = (BITS)op.u.fill.value.bits;
  KILN_FOR_EACH(i, op.n) out[i] = v;
}

/* ARANGE: start + i * step in double, not fused (as the CPU computes it),
 * rounded once into the dtype. */
template <typename T> __device__ __forceinline__ void kiln_arange(const kiln_kop_t &op) {
  T *__restrict__ out = (T *)op.out.addr;
  KILN_FOR_EACH(i, op.n)
  out[i] = kiln_store<T>::from(__dadd_rn(op.u.arange.start, __dmul_rn((double)i, op.u.arange.step)));
}

/* The uniform transform on its own (not inlined), so that the build's
 * check (tests/cuda/kernel_checks.py) can see that it holds no fused
 * multiply-add: uniform numbers are bit-identical on every backend. */
extern "C" __device__ __noinline__ float kiln_random_uniform_f32(unsigned long long i, unsigned long long seed,
                                                                 float low, float high) {
  return kiln_philox_uniform(i, seed, low, high);
}

/* RANDOM: uniform [a, b), or normal(a, b) when op.u.random.normal; element
 * i of every float dtype as kernels/philox.h defines it: f32 the sample
 * itself, f16 and bf16 that f32 sample rounded once to nearest even, f64
 * from the same counter's words in double (kiln_random<double>). */
template <typename T> __device__ __forceinline__ void kiln_random(const kiln_kop_t &op) {
  T *__restrict__ out = (T *)op.out.addr;
  const unsigned long long seed = op.u.random.seed;
  const float a = op.u.random.a, b = op.u.random.b;
  if (op.u.random.normal) {
    KILN_FOR_EACH(i, op.n) out[i] = kiln_cx<T>::out(kiln_philox_normal((unsigned long long)i, seed, a, b));
  } else {
    KILN_FOR_EACH(i, op.n) out[i] = kiln_cx<T>::out(kiln_random_uniform_f32((unsigned long long)i, seed, a, b));
  }
}
template <> __device__ __forceinline__ void kiln_random<double>(const kiln_kop_t &op) {
  double *__restrict__ out = (double *)op.out.addr;
  const unsigned long long seed = op.u.random.seed;
  const double a = op.u.random.a, b = op.u.random.b;
  if (op.u.random.normal) {
    KILN_FOR_EACH(i, op.n) out[i] = kiln_philox_normal_f64((unsigned long long)i, seed, a, b);
  } else {
    KILN_FOR_EACH(i, op.n) out[i] = kiln_philox_uniform_f64((unsigned long long)i, seed, a, b);
  }
}

/* ---- the instances of the dtype-generic kinds --------------------------------------- */

/* FILL, ARANGE (the core refuses bool's) and COPY per dtype (FILL and COPY
 * move the element's bits); CAST and WHERE one kernel each. */
#define KILN_GEN_INSTANCES_(NAME, DC, T, CARRIER, BITS, P)                                         \
  KILN_INSTANCE(kiln_fill_##NAME, kiln_fill<BITS>)                                                  \
  KILN_INSTANCE(kiln_arange_##NAME, kiln_arange<T>)                                                 \
  KILN_INSTANCE(kiln_copy_##NAME##_##NAME, kiln_copy<BITS>)
KILN_CUDA_DTYPES(KILN_GEN_INSTANCES_, ~)
#undef KILN_GEN_INSTANCES_
KILN_INSTANCE(kiln_cast, kiln_cast_any)
KILN_INSTANCE(kiln_where, kiln_where_any)
KILN_INSTANCE(kiln_random_f32, kiln_random<float>)
KILN_INSTANCE(kiln_random_f16, kiln_random<kiln_f16_t>)
KILN_INSTANCE(kiln_random_bf16, kiln_random<kiln_bf16_t>)
KILN_INSTANCE(kiln_random_f64, kiln_random<double>)

/* ---- reductions ------------------------------------------------------------ */

/* REDUCE over the middle axis of [outer, len, inner] (op.u.reduce), the axis
 * split by the planner into plan.reduce.chunks chunks of plan.reduce.chunk
 * elements when there are too few outputs to fill the GPU; with chunks > 1
 * each block writes partial results to plan.reduce.parts and the parts
 * kernel finishes each output, merging its chunks in order (deterministic).
 * plan.reduce.rows is the rows a pass covers (outer; the parts pass: the
 * outputs). rows kernel (inner == 1): block b handles chunk (b % chunks) of
 * row (b / chunks), parts[b]. cols kernel (inner > 1, or len == 0): a block
 * is plan.reduce.width neighbouring columns (a power of two up to 32) times
 * KILN_CUDA_BLOCK / width lanes walking the axis, so a warp reads whole
 * lines of memory; block b handles chunk (b % chunks) of column tile
 * (b / chunks) % ceil(inner / width) of outer row b / chunks / tiles, and
 * writes parts[(row * inner + col) * chunks + chunk], so the parts kernel
 * finishes the outputs as outer * inner rows.
 *
 * The kernels are templates over the storage type T of the input, one
 * instance per dtype (kiln_reduce_{rows,cols,parts}_<in dtype>); kiln_red<T>
 * names what T computes in (the design's rule, as kernels/cpu/reduce.c):
 * ACC, the accumulator of SUM, MEAN and NORM (double for f32 as before and
 * for f64; float for f16 and bf16; a 64-bit integer wrapping modulo 2^64
 * for the integers and bool, bool counting its nonzero bytes) and CT, the
 * type MAX and ARGMAX compare in (float for f32, f16 and bf16; double; a
 * 64-bit integer). kiln_acc_finish makes SUM, MEAN or NORM of a sum in the
 * accumulator's own way (f16 and bf16 through the f32 result, as the CPU),
 * and the finished value is stored in the out dtype the core chose (sum of
 * an integer -> i64, sum_to keeps the input's dtype, a float its own)
 * through its carrier, with kernels/dtype_convert.h's rule. MAX stores the
 * best element itself, read again from the input by its index, so its bits
 * are the element's (NaN payloads included) whatever CT is. A partial
 * result is kiln_part<CT, ACC> (the sum, the best value and its index),
 * which is also the record of plan.reduce.parts; KILN_CUDA_REDUCE_PART_BYTES
 * (launch.h) bounds every instance. */

template <typename CT, typename ACC> struct kiln_part {
  ACC sum;       /* the sum (of squares for NORM) */
  CT best;       /* the best value so far, in the compare type */
  int64_t index; /* its index along the axis; -1: nothing seen yet */
};

/* What each dtype reduces in. */
template <typename T> struct kiln_red;
#define KILN_RED_FLOAT_(T, CTYPE, ACCT, LOAD)                                                       \
  template <> struct kiln_red<T> {                                                                  \
    typedef CTYPE CT;                                                                               \
    typedef ACCT ACC;                                                                               \
    static __device__ __forceinline__ CT cmp(const T x) { return LOAD; }                            \
    static __device__ __forceinline__ ACC acc(const T x, bool squares) {                            \
      const ACC d = (ACC)cmp(x);                                                                    \
      return squares ? d * d : d;                                                                   \
    }                                                                                               \
  };
KILN_RED_FLOAT_(float, float, double, x)
KILN_RED_FLOAT_(double, double, double, x)
KILN_RED_FLOAT_(kiln_f16_t, float, float, kiln_dc_f16_to_f32(x.bits))
KILN_RED_FLOAT_(kiln_bf16_t, float, float, kiln_dc_bf16_to_f32(x.bits))
#undef KILN_RED_FLOAT_
/* Integers and bool: SUM only (MEAN and NORM are floats only), modulo 2^64. */
#define KILN_RED_INT_(T, LOAD)                                                                      \
  template <> struct kiln_red<T> {                                                                  \
    typedef long long CT;                                                                           \
    typedef unsigned long long ACC;                                                                 \
    static __device__ __forceinline__ CT cmp(const T x) { return LOAD; }                            \
    static __device__ __forceinline__ ACC acc(const T x, bool) { return (ACC)cmp(x); }              \
  };
KILN_RED_INT_(int, (long long)x)
KILN_RED_INT_(kiln_i64, (long long)x)
KILN_RED_INT_(kiln_i8, (long long)x)
KILN_RED_INT_(kiln_u8, (long long)x)
KILN_RED_INT_(kiln_i16, (long long)x)
KILN_RED_INT_(kiln_bool_t, x.bits != 0 ? 1ll : 0ll)
#undef KILN_RED_INT_
static_assert(sizeof(kiln_part<float, double>) <= KILN_CUDA_REDUCE_PART_BYTES, "f32 parts outgrow the scratch");
static_assert(sizeof(kiln_part<double, double>) <= KILN_CUDA_REDUCE_PART_BYTES, "f64 parts outgrow the scratch");
static_assert(sizeof(kiln_part<long long, unsigned long long>) <= KILN_CUDA_REDUCE_PART_BYTES,
              "integer parts outgrow the scratch");

/* SUM, MEAN or NORM of a finished sum, in the carrier out's dtype is
 * stored from. double: f32 (as before) and f64. float: f16 and bf16, the
 * f32 result of the op as the CPU computes it, rounded into the dtype
 * once by the store. The integer: SUM. */
__device__ __forceinline__ kiln_carried kiln_acc_finish(double sum, int op, int64_t len) {
  kiln_carried c;
  c.i = 0;
  switch (op) {
  case 1: kiln_carry(c, (kiln_f64)(sum / (double)len)); break; /* MEAN: 0/0 is NaN */
  case 4: kiln_carry(c, (kiln_f64)sqrt(sum)); break;           /* NORM */
  default: kiln_carry(c, (kiln_f64)sum); break;                /* SUM */
  }
  return c;
}
__device__ __forceinline__ kiln_carried kiln_acc_finish(float sum, int op, int64_t len) {
  float v;
  switch (op) {
  case 1: v = (float)((double)sum / (double)len); break;
  case 4: v = sqrtf(sum); break;
  default: v = sum; break;
  }
  kiln_carried c;
  c.i = 0;
  kiln_carry(c, (kiln_f64)v);
  return c;
}
__device__ __forceinline__ kiln_carried kiln_acc_finish(unsigned long long sum, int, int64_t) {
  kiln_carried c;
  c.f = 0.0;
  kiln_carry(c, (kiln_i64)sum);
  return c;
}

template <typename CT, typename ACC> __device__ __forceinline__ kiln_part<CT, ACC> kiln_part_empty(void) {
  kiln_part<CT, ACC> r;
  r.sum = (ACC)0;
  r.best = (CT)0;
  r.index = -1;
  return r;
}

/* Does b beat a? NaN wins, and among equals (or NaNs) the first index, so
 * the order in which partial results meet does not matter. */
template <typename CT, typename ACC>
__device__ __forceinline__ bool kiln_part_better(const kiln_part<CT, ACC> &b, const kiln_part<CT, ACC> &a) {
  if (b.index < 0) return false;
  if (a.index < 0) return true;
  const bool bn = b.best != b.best, an = a.best != a.best;
  if (bn != an) return bn;
  if (bn || b.best == a.best) return b.index < a.index;
  return b.best > a.best;
}

template <typename CT, typename ACC>
__device__ __forceinline__ kiln_part<CT, ACC> kiln_part_merge(const kiln_part<CT, ACC> &a,
                                                              const kiln_part<CT, ACC> &b) {
  kiln_part<CT, ACC> r = kiln_part_better(b, a) ? b : a;
  r.sum = a.sum + b.sum;
  return r;
}

template <typename T>
__device__ __forceinline__ void kiln_part_add(kiln_part<typename kiln_red<T>::CT, typename kiln_red<T>::ACC> &acc,
                                              const T v, int64_t index, bool squares) {
  typedef kiln_red<T> R;
  acc.sum += R::acc(v, squares);
  kiln_part<typename R::CT, typename R::ACC> one;
  one.best = R::cmp(v);
  one.index = index;
  if (kiln_part_better(one, acc)) {
    acc.best = one.best;
    acc.index = index;
  }
}

template <typename CT, typename ACC>
__device__ __forceinline__ kiln_part<CT, ACC> kiln_part_shfl_down(const kiln_part<CT, ACC> &v, int offset) {
  kiln_part<CT, ACC> o;
  o.sum = __shfl_down_sync(0xffffffffu, v.sum, offset);
  o.best = __shfl_down_sync(0xffffffffu, v.best, offset);
  o.index = __shfl_down_sync(0xffffffffu, v.index, offset);
  return o;
}

template <typename CT, typename ACC> __device__ kiln_part<CT, ACC> kiln_block_reduce(kiln_part<CT, ACC> v) {
  __shared__ kiln_part<CT, ACC> shared[KILN_CUDA_BLOCK / 32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) v = kiln_part_merge(v, kiln_part_shfl_down(v, offset));
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / 32 ? shared[lane] : kiln_part_empty<CT, ACC>();
    for (int offset = 16; offset > 0; offset >>= 1) v = kiln_part_merge(v, kiln_part_shfl_down(v, offset));
  }
  return v; /* valid in thread 0 */
}

/* Write output `at` (row * inner + col); the same rules as the CPU backend
 * (sum of nothing 0, mean of nothing NaN; the core refuses MAX and ARGMAX
 * of an empty axis, and MAX of nothing would store -inf, or the integer's
 * lowest, by the cast rule). */
template <typename T>
__device__ __forceinline__ void kiln_reduce_finish(const kiln_kop_t &p, int64_t at,
                                                   const kiln_part<typename kiln_red<T>::CT, typename kiln_red<T>::ACC> &r) {
  switch (p.u.reduce.op) {
  case 3: ((int *)p.out.addr)[at] = r.index < 0 ? 0 : (int)r.index; break; /* ARGMAX */
  case 2: {                                                                  /* MAX: the element itself */
    const int64_t inner = p.u.reduce.inner;
    const int64_t element = (at / inner) * p.u.reduce.len * inner + r.index * inner + at % inner;
    ((T *)p.out.addr)[at] = r.index < 0 ? kiln_store<T>::from((kiln_f64)-INFINITY) : ((const T *)p.in[0].addr)[element];
    break;
  }
  default: /* SUM, MEAN, NORM */
    kiln_store_dyn(p.out.dtype, p.out.addr, at, kiln_acc_finish(r.sum, p.u.reduce.op, p.u.reduce.len));
    break;
  }
}

template <typename T> __device__ void kiln_reduce_rows(const kiln_kop_t &p) {
  typedef kiln_part<typename kiln_red<T>::CT, typename kiln_red<T>::ACC> P;
  const T *__restrict__ in = (const T *)p.in[0].addr;
  const bool squares = p.u.reduce.op == 4;
  for (int64_t b = blockIdx.x; b < p.plan.reduce.rows * p.plan.reduce.chunks; b += gridDim.x) {
    const int64_t row = b / p.plan.reduce.chunks, chunk = b % p.plan.reduce.chunks;
    const int64_t begin = chunk * p.plan.reduce.chunk;
    const int64_t end = begin + p.plan.reduce.chunk < p.u.reduce.len ? begin + p.plan.reduce.chunk : p.u.reduce.len;
    const T *x = in + row * p.u.reduce.len;
    P acc = kiln_part_empty<typename kiln_red<T>::CT, typename kiln_red<T>::ACC>();
    for (int64_t l = begin + threadIdx.x; l < end; l += blockDim.x) kiln_part_add<T>(acc, x[l], l, squares);
    acc = kiln_block_reduce(acc);
    if (threadIdx.x == 0) {
      if (p.plan.reduce.chunks == 1)
        kiln_reduce_finish<T>(p, row, acc);
      else
        ((P *)p.plan.reduce.parts)[b] = acc;
    }
    __syncthreads(); /* the shared scratch of kiln_block_reduce is reused */
  }
}

template <typename T> __device__ void kiln_reduce_parts(const kiln_kop_t &p) {
  typedef kiln_part<typename kiln_red<T>::CT, typename kiln_red<T>::ACC> P;
  const P *parts = (const P *)p.plan.reduce.parts;
  for (int64_t row = blockIdx.x; row < p.plan.reduce.rows; row += gridDim.x) {
    P acc = kiln_part_empty<typename kiln_red<T>::CT, typename kiln_red<T>::ACC>();
    for (int64_t c = threadIdx.x; c < p.plan.reduce.chunks; c += blockDim.x)
      acc = kiln_part_merge(acc, parts[row * p.plan.reduce.chunks + c]);
    acc = kiln_block_reduce(acc);
    if (threadIdx.x == 0) kiln_reduce_finish<T>(p, row, acc);
    __syncthreads();
  }
}

/* inner > 1 (and any len == 0): a block is p.plan.reduce.width neighbouring columns by
 * KILN_CUDA_BLOCK / p.plan.reduce.width lanes along the axis, so a warp reads whole
 * lines (32 columns of one position, or with 4 columns, 4 of 8 consecutive
 * positions), and a long axis is split over blocks (p.plan.reduce.chunks) like a long
 * row: reducing axis 0 of [1e6, 4] runs on hundreds of blocks, not 4
 * threads. The lanes of a column meet in a fixed tree, so the result does
 * not depend on timing. */
template <typename T> __device__ void kiln_reduce_cols(const kiln_kop_t &p) {
  typedef kiln_part<typename kiln_red<T>::CT, typename kiln_red<T>::ACC> P;
  __shared__ P shared[KILN_CUDA_BLOCK];
  const T *__restrict__ in = (const T *)p.in[0].addr;
  const bool squares = p.u.reduce.op == 4;
  const int width = p.plan.reduce.width, lanes = KILN_CUDA_BLOCK / p.plan.reduce.width;
  const int tx = (int)threadIdx.x % width, ty = (int)threadIdx.x / width;
  const int64_t tiles = (p.u.reduce.inner + width - 1) / width;
  for (int64_t b = blockIdx.x; b < p.plan.reduce.rows * tiles * p.plan.reduce.chunks; b += gridDim.x) {
    const int64_t chunk = b % p.plan.reduce.chunks, tile = (b / p.plan.reduce.chunks) % tiles, row = b / p.plan.reduce.chunks / tiles;
    const int64_t col = tile * width + tx;
    const int64_t begin = chunk * p.plan.reduce.chunk;
    const int64_t end = begin + p.plan.reduce.chunk < p.u.reduce.len ? begin + p.plan.reduce.chunk : p.u.reduce.len;
    P acc = kiln_part_empty<typename kiln_red<T>::CT, typename kiln_red<T>::ACC>();
    if (col < p.u.reduce.inner) {
      const T *x = in + row * p.u.reduce.len * p.u.reduce.inner + col;
      for (int64_t l = begin + ty; l < end; l += lanes) kiln_part_add<T>(acc, x[l * p.u.reduce.inner], l, squares);
    }
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (int half = lanes / 2; half > 0; half /= 2) {
      if (ty < half) shared[threadIdx.x] = kiln_part_merge(shared[threadIdx.x], shared[threadIdx.x + half * width]);
      __syncthreads();
    }
    if (ty == 0 && col < p.u.reduce.inner) {
      const int64_t o = row * p.u.reduce.inner + col;
      if (p.plan.reduce.chunks == 1)
        kiln_reduce_finish<T>(p, o, shared[tx]);
      else
        ((P *)p.plan.reduce.parts)[o * p.plan.reduce.chunks + chunk] = shared[tx];
    }
    __syncthreads(); /* shared is written again by the next block's items */
  }
}

/* kiln_reduce_{rows,cols,parts}_<dtype of in[0]>, every dtype. */
#define KILN_REDUCE_INSTANCES_(NAME, DC, T, CARRIER, BITS, P)                                      \
  KILN_INSTANCE(kiln_reduce_rows_##NAME, kiln_reduce_rows<T>)                                       \
  KILN_INSTANCE(kiln_reduce_cols_##NAME, kiln_reduce_cols<T>)                                       \
  KILN_INSTANCE(kiln_reduce_parts_##NAME, kiln_reduce_parts<T>)
KILN_CUDA_DTYPES(KILN_REDUCE_INSTANCES_, ~)
#undef KILN_REDUCE_INSTANCES_

/* ---- softmax and cross-entropy --------------------------------------------- */

/* NaN wins, so a row holding NaN comes out NaN (as on the CPU). */
__device__ __forceinline__ float kiln_max_nan(float a, float b) { return (b > a || b != b) && a == a ? b : a; }

__device__ float kiln_block_max(float v) {
  __shared__ float shared[KILN_CUDA_BLOCK / 32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = kiln_max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / 32 ? shared[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) v = kiln_max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v; /* every thread */
}

__device__ double kiln_block_sum(double v) {
  __shared__ double shared[KILN_CUDA_BLOCK / 32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < blockDim.x / 32 ? shared[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v; /* every thread */
}

/* SOFTMAX (ROWS): one block per row of u.softmax; the maximum is subtracted
 * so every exp is in (0, 1]; the sum in double. */
__device__ __forceinline__ void kiln_softmax(const kiln_kop_t &op) {
  const int64_t rows = op.u.softmax.rows, cols = op.u.softmax.cols;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *x = (const float *)op.in[0].addr + r * cols;
    float *y = (float *)op.out.addr + r * cols;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = kiln_max_nan(m, x[i]);
    m = kiln_block_max(m);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += (double)expf(x[i] - m);
    sum = kiln_block_sum(sum);
    if (op.u.softmax.log) {
      /* (x - max) - log(sum), in that order: see kernels/cpu/nn.c. */
      const float lse = (float)log(sum);
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) y[i] = __fsub_rn(__fsub_rn(x[i], m), lse);
    } else {
      const float inv = (float)(1.0 / sum);
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) y[i] = expf(x[i] - m) * inv;
    }
  }
}
KILN_INSTANCE(kiln_softmax_f32_f32, kiln_softmax)

/* CROSS_ENTROPY's first pass: the loss of each row into plan.reduce.parts
 * (a double per row); a label out of range gives NaN. */
__device__ __forceinline__ void kiln_xent_rows(const kiln_kop_t &op) {
  const int *labels = (const int *)op.in[1].addr;
  double *work = (double *)op.plan.reduce.parts;
  const int64_t rows = op.u.cross_entropy.n, cols = op.u.cross_entropy.c;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *x = (const float *)op.in[0].addr + r * cols;
    const int label = labels[r];
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = kiln_max_nan(m, x[i]);
    m = kiln_block_max(m);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += (double)expf(x[i] - m);
    sum = kiln_block_sum(sum);
    if (threadIdx.x == 0)
      work[r] = label < 0 || label >= cols ? (double)NAN : -((double)x[label] - (double)m - log(sum));
  }
}
KILN_INSTANCE(kiln_xent_rows_f32, kiln_xent_rows)

/* Its second pass, one block: the mean of the row losses in a fixed order
 * (deterministic), and the report in in[2] that the core reads at the next
 * synchronisation: {the first row whose label is outside [0, cols), its
 * label} or {-1, 0}. */
__device__ __forceinline__ void kiln_xent_mean(const kiln_kop_t &op) {
  __shared__ int first;
  const double *work = (const double *)op.plan.reduce.parts;
  const int *labels = (const int *)op.in[1].addr;
  const int64_t rows = op.u.cross_entropy.n, cols = op.u.cross_entropy.c;
  if (threadIdx.x == 0) first = INT32_MAX;
  __syncthreads();
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) sum += work[r];
  for (int64_t r = threadIdx.x; r < rows && r < INT32_MAX; r += blockDim.x) {
    if (labels[r] < 0 || labels[r] >= cols) {
      atomicMin(&first, (int)r);
      break; /* this thread's later rows come after it */
    }
  }
  sum = kiln_block_sum(sum);
  __syncthreads();
  if (threadIdx.x == 0) {
    int *report = (int *)op.in[2].addr;
    ((float *)op.out.addr)[0] = (float)(sum / (double)rows); /* rows 0: NaN */
    report[0] = first == INT32_MAX ? -1 : first;
    report[1] = first == INT32_MAX ? 0 : labels[first];
  }
}
KILN_INSTANCE(kiln_xent_mean_f32, kiln_xent_mean)

/* ---- convolution helpers and pooling ---------------------------------------- */

/* The sizes of u.conv2d (CONV2D and its gradients) as the kernels read them. */
#define KILN_CONV_SIZES_(op)                                                                         \
  const int64_t c = op.u.conv2d.c, h = op.u.conv2d.h, w = op.u.conv2d.w, k = op.u.conv2d.k;           \
  const int64_t r = op.u.conv2d.r, s = op.u.conv2d.s, p = op.u.conv2d.p, q = op.u.conv2d.q;           \
  const int64_t stride[2] = {op.u.conv2d.stride[0], op.u.conv2d.stride[1]};                          \
  const int64_t pad[2] = {op.u.conv2d.pad[0], op.u.conv2d.pad[1]};                                   \
  const int64_t dil[2] = {op.u.conv2d.dil[0], op.u.conv2d.dil[1]};                                   \
  (void)c, (void)h, (void)w, (void)k, (void)r, (void)s, (void)p, (void)q, (void)stride, (void)pad, (void)dil

/* [images][c*r*s][p*q] columns of plan.round.images consecutive input
 * images starting at plan.round.in, into plan.round.out: the elements'
 * bits (BITS of the dtype's size), zeros in the padding. */
template <typename BITS> __device__ __forceinline__ void kiln_im2col(const kiln_kop_t &op) {
  KILN_CONV_SIZES_(op);
  const BITS *__restrict__ x = (const BITS *)op.plan.round.in;
  BITS *__restrict__ cols = (BITS *)op.plan.round.out;
  const int64_t pq = p * q, rs = r * s, crs = c * rs;
  KILN_FOR_EACH(i, op.plan.round.images * crs * pq) {
    const int64_t col = i % pq, row = (i / pq) % crs, img = i / (pq * crs);
    const int64_t ch = row / rs, ri = (row % rs) / s, si = row % s;
    const int64_t pp = col / q, qq = col % q;
    const int64_t hh = pp * stride[0] - pad[0] + ri * dil[0];
    const int64_t ww = qq * stride[1] - pad[1] + si * dil[1];
    cols[i] = hh >= 0 && hh < h && ww >= 0 && ww < w ? x[((img * c + ch) * h + hh) * w + ww] : (BITS)0;
  }
}
KILN_INSTANCE(kiln_im2col_f32, kiln_im2col<kiln_u32>)
KILN_INSTANCE(kiln_im2col_f64, kiln_im2col<kiln_u64>)

/* CONV2D's bias: y[img][k][pq] += bias[k] (in[2]) over every image of out
 * (f32, f64). */
template <typename T> __device__ __forceinline__ void kiln_conv_bias(const kiln_kop_t &op) {
  KILN_CONV_SIZES_(op);
  T *__restrict__ y = (T *)op.out.addr;
  const T *__restrict__ bias = (const T *)op.in[2].addr;
  const int64_t pq = p * q;
  KILN_FOR_EACH(i, op.u.conv2d.n * k * pq) y[i] += bias[(i / pq) % k];
}
KILN_INSTANCE(kiln_conv_bias_f32, kiln_conv_bias<float>)
KILN_INSTANCE(kiln_conv_bias_f64, kiln_conv_bias<double>)

/* The window of u.pooling as the kernels read it. */
#define KILN_POOL_WINDOW_(op)                                                                        \
  const int64_t kernel[2] = {op.u.pooling.window[0], op.u.pooling.window[1]};                        \
  const int64_t stride[2] = {op.u.pooling.stride[0], op.u.pooling.stride[1]};                        \
  const int64_t pad[2] = {op.u.pooling.pad[0], op.u.pooling.pad[1]}

/* MAX_POOL2D (FLAT over out): padded cells are never candidates; a window
 * wholly in the padding gives -inf; NaN propagates. */
__device__ __forceinline__ void kiln_max_pool2d(const kiln_kop_t &op) {
  const float *__restrict__ x = (const float *)op.in[0].addr;
  float *__restrict__ y = (float *)op.out.addr;
  const int64_t h = op.u.pooling.h, w = op.u.pooling.w, p = op.u.pooling.p, q = op.u.pooling.q;
  KILN_POOL_WINDOW_(op);
  KILN_FOR_EACH(i, op.u.pooling.n * op.u.pooling.c * p * q) {
    const int64_t qq = i % q, pp = (i / q) % p, plane = i / (p * q);
    int64_t h0 = pp * stride[0] - pad[0], h1 = h0 + kernel[0];
    int64_t w0 = qq * stride[1] - pad[1], w1 = w0 + kernel[1];
    if (h0 < 0) h0 = 0;
    if (h1 > h) h1 = h;
    if (w0 < 0) w0 = 0;
    if (w1 > w) w1 = w;
    const float *plane_x = x + plane * h * w;
    float best = -INFINITY;
    for (int64_t hh = h0; hh < h1; hh++)
      for (int64_t ww = w0; ww < w1; ww++) {
        const float v = plane_x[hh * w + ww];
        if (v > best || v != v) best = v;
      }
    y[i] = best;
  }
}
KILN_INSTANCE(kiln_max_pool2d_f32_f32, kiln_max_pool2d)

#include "train.cuh"
#include "index.cuh"
#include "gemm.cuh"
