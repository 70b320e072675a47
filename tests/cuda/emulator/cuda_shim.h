/* tests/cuda/emulator/cuda_shim.h: the CUDA C++ dialect for a host compiler, so kiln's kernels run unchanged on the test driver's fibers. */
/*
 * Included before a .cu file compiled as C++ (g++ -x c++). Every CUDA thread
 * of a block is a fiber of fiber.c; threadIdx and friends read the running
 * fiber's coordinates; __syncthreads and the warp collectives switch fibers
 * and return only when every thread (lane) they wait for has arrived, so a
 * kernel that omits a barrier reads stale data here as it would on a GPU.
 *
 * __shared__ variables are thread_local statics: all fibers of a block run on
 * one OS thread (the stream's worker), so they share them, and blocks on
 * other workers get their own. Consequences: shared memory is not cleared
 * between blocks (nor poisoned); dynamic shared memory (extern __shared__)
 * is not supported and fails to compile.
 *
 * What is not modelled: the GPU's memory model (every access here is a host
 * access, ordered as the host orders it), CUDA's math library (the host's
 * libm answers expf and friends), FMA contraction (nvcc fuses a*b+c, g++
 * here does not), and timing.
 */
#ifndef KILN_FAKECUDA_CUDA_SHIM_H
#define KILN_FAKECUDA_CUDA_SHIM_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <type_traits>

#include "fakecuda_abi.h"

/* ---- qualifiers --------------------------------------------------------------- */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static thread_local
#define __constant__

/* ---- built-in variables --------------------------------------------------------- */

typedef fakecuda_dim3 uint3;
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

#define threadIdx (*fakecuda__thread_idx())
#define blockIdx (*fakecuda__block_idx())
#define blockDim (*fakecuda__block_dim())
#define gridDim (*fakecuda__grid_dim())
constexpr int warpSize = 32;

/* ---- synchronisation ------------------------------------------------------------ */

#define __syncthreads() ((void)fakecuda__syncthreads(0, 0, __FILE__, __LINE__))
#define __syncthreads_count(pred) fakecuda__syncthreads(1, (pred) != 0, __FILE__, __LINE__)
#define __syncthreads_and(pred) fakecuda__syncthreads(2, (pred) != 0, __FILE__, __LINE__)
#define __syncthreads_or(pred) fakecuda__syncthreads(3, (pred) != 0, __FILE__, __LINE__)

inline void __syncwarp(unsigned mask = 0xffffffffu) { (void)fakecuda__vote(mask, 0); }
inline unsigned __ballot_sync(unsigned mask, int pred) { return fakecuda__vote(mask, pred != 0); }
inline int __any_sync(unsigned mask, int pred) { return fakecuda__vote(mask, pred != 0) != 0u; }
inline int __all_sync(unsigned mask, int pred) { return fakecuda__vote(mask, pred != 0) == mask; }
inline unsigned __activemask(void) { return fakecuda__activemask(); }

/* The GPU's shuffles move 32- and 64-bit integers and floats. */
template <typename T> inline T fakecuda_shfl_(unsigned mask, T var, int mode, int arg, int width) {
  static_assert(std::is_arithmetic<T>::value && (sizeof(T) == 4 || sizeof(T) == 8),
                "CUDA shuffles take 32- and 64-bit integer and floating-point values");
  uint64_t bits = 0;
  memcpy(&bits, &var, sizeof var);
  bits = fakecuda__shfl(mask, bits, mode, arg, width);
  T out;
  memcpy(&out, &bits, sizeof out);
  return out;
}
template <typename T> inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return fakecuda_shfl_(mask, var, FAKECUDA_SHFL_IDX, src_lane, width);
}
template <typename T> inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return fakecuda_shfl_(mask, var, FAKECUDA_SHFL_UP, (int)delta, width);
}
template <typename T> inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return fakecuda_shfl_(mask, var, FAKECUDA_SHFL_DOWN, (int)delta, width);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return fakecuda_shfl_(mask, var, FAKECUDA_SHFL_XOR, lane_mask, width);
}

inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

[[noreturn]] inline void __trap(void) { fakecuda__fault(FAKECUDA_ERROR_LAUNCH_FAILED, "__trap() called"); }

/* ---- atomics (relaxed, as CUDA's are); blocks of other streams run on other
 * OS threads, so these are real atomics ------------------------------------------ */

#define FAKECUDA_ATOMIC_INT_(T)                                                                     \
  inline T atomicAdd(T *a, T v) { return __atomic_fetch_add(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicSub(T *a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicExch(T *a, T v) { return __atomic_exchange_n(a, v, __ATOMIC_RELAXED); }            \
  inline T atomicAnd(T *a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicOr(T *a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_RELAXED); }                \
  inline T atomicXor(T *a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_RELAXED); }              \
  inline T atomicCAS(T *a, T expected, T desired) {                                                 \
    __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);  \
    return expected;                                                                                \
  }                                                                                                 \
  inline T atomicMin(T *a, T v) {                                                                   \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                   \
    while (v < old && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
    }                                                                                               \
    return old;                                                                                     \
  }                                                                                                 \
  inline T atomicMax(T *a, T v) {                                                                   \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                   \
    while (v > old && !__atomic_compare_exchange_n(a, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
    }                                                                                               \
    return old;                                                                                     \
  }
FAKECUDA_ATOMIC_INT_(int)
FAKECUDA_ATOMIC_INT_(unsigned)
FAKECUDA_ATOMIC_INT_(unsigned long long)
FAKECUDA_ATOMIC_INT_(long long)
#undef FAKECUDA_ATOMIC_INT_

/* Floating-point adds through compare-and-swap on the bits. */
template <typename F, typename U> inline F fakecuda_atomic_add_float_(F *a, F v) {
  U *bits = reinterpret_cast<U *>(a);
  U old = __atomic_load_n(bits, __ATOMIC_RELAXED), desired;
  F value;
  do {
    memcpy(&value, &old, sizeof value);
    value += v;
    memcpy(&desired, &value, sizeof desired);
  } while (!__atomic_compare_exchange_n(bits, &old, desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  memcpy(&value, &old, sizeof value);
  return value;
}
inline float atomicAdd(float *a, float v) { return fakecuda_atomic_add_float_<float, uint32_t>(a, v); }
inline double atomicAdd(double *a, double v) { return fakecuda_atomic_add_float_<double, uint64_t>(a, v); }
inline float atomicExch(float *a, float v) {
  uint32_t bits;
  memcpy(&bits, &v, sizeof bits);
  bits = __atomic_exchange_n(reinterpret_cast<uint32_t *>(a), bits, __ATOMIC_RELAXED);
  memcpy(&v, &bits, sizeof v);
  return v;
}
inline unsigned atomicInc(unsigned *a, unsigned limit) {
  unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(a, &old, old >= limit ? 0u : old + 1u, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline unsigned atomicDec(unsigned *a, unsigned limit) {
  unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(a, &old, old == 0u || old > limit ? limit : old - 1u, true, __ATOMIC_RELAXED,
                                      __ATOMIC_RELAXED)) {
  }
  return old;
}

/* ---- vector types, aligned as CUDA's ----------------------------------------------- */

#define FAKECUDA_VEC2_(T, NAME, ALIGN)                                                              \
  struct __attribute__((aligned(ALIGN))) NAME {                                                     \
    T x, y;                                                                                         \
  };                                                                                                \
  inline NAME make_##NAME(T x, T y) { return NAME{x, y}; }
#define FAKECUDA_VEC4_(T, NAME, ALIGN)                                                              \
  struct __attribute__((aligned(ALIGN))) NAME {                                                     \
    T x, y, z, w;                                                                                   \
  };                                                                                                \
  inline NAME make_##NAME(T x, T y, T z, T w) { return NAME{x, y, z, w}; }
FAKECUDA_VEC2_(float, float2, 8)
FAKECUDA_VEC4_(float, float4, 16)
FAKECUDA_VEC2_(int, int2, 8)
FAKECUDA_VEC4_(int, int4, 16)
FAKECUDA_VEC2_(unsigned, uint2, 8)
FAKECUDA_VEC4_(unsigned, uint4, 16)
FAKECUDA_VEC2_(double, double2, 16)
#undef FAKECUDA_VEC2_
#undef FAKECUDA_VEC4_

/* __ldg: a plain load, with the alignment check the GPU makes (a misaligned
 * vector load faults there, with CUDA_ERROR_MISALIGNED_ADDRESS). */
template <typename T> inline T fakecuda_ldg_(const T *p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) {
    char message[160];
    snprintf(message, sizeof message, "__ldg of a %zu-byte value at %p, which is not %zu-byte aligned", sizeof(T),
             static_cast<const void *>(p), alignof(T));
    fakecuda__fault(FAKECUDA_ERROR_MISALIGNED_ADDRESS, message);
  }
  return *p;
}
#define FAKECUDA_LDG_(T) \
  inline T __ldg(const T *p) { return fakecuda_ldg_(p); }
FAKECUDA_LDG_(float)
FAKECUDA_LDG_(double)
FAKECUDA_LDG_(int)
FAKECUDA_LDG_(unsigned)
FAKECUDA_LDG_(long long)
FAKECUDA_LDG_(unsigned long long)
FAKECUDA_LDG_(float2)
FAKECUDA_LDG_(float4)
FAKECUDA_LDG_(int2)
FAKECUDA_LDG_(int4)
FAKECUDA_LDG_(uint2)
FAKECUDA_LDG_(uint4)
FAKECUDA_LDG_(double2)
#undef FAKECUDA_LDG_

/* ---- device functions: the host's libm stands in for CUDA's math library -------- */

inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __saturatef(float x) { return x != x ? 0.0f : x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
/* Rounded arithmetic: each operation rounded on its own, as the host does. */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __int2float_rn(int v) { return (float)v; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

template <typename To, typename From> inline To fakecuda_bits_(From v) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To out;
  memcpy(&out, &v, sizeof out);
  return out;
}
inline int __float_as_int(float v) { return fakecuda_bits_<int>(v); }
inline unsigned __float_as_uint(float v) { return fakecuda_bits_<unsigned>(v); }
inline float __int_as_float(int v) { return fakecuda_bits_<float>(v); }
inline float __uint_as_float(unsigned v) { return fakecuda_bits_<float>(v); }
inline long long __double_as_longlong(double v) { return fakecuda_bits_<long long>(v); }
inline double __longlong_as_double(long long v) { return fakecuda_bits_<double>(v); }

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
inline int __clz(int v) { return v ? __builtin_clz((unsigned)v) : 32; }
inline int __clzll(long long v) { return v ? __builtin_clzll((unsigned long long)v) : 64; }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __ffsll(long long v) { return __builtin_ffsll(v); }
inline unsigned __brev(unsigned v) {
  unsigned r = 0;
  for (int i = 0; i < 32; i++, v >>= 1) r = (r << 1) | (v & 1u);
  return r;
}
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

/* ---- the matrix units: nvcuda::wmma, 16x16x16 fragments ----------------------------
 * __half and __nv_bfloat16 are their 16 bits. A fragment here holds its
 * whole tile in every lane (the GPU spreads it over the warp in an order it
 * does not document, which no kernel may rely on), so each lane multiplies
 * on its own, summing over k in order in f32 (fmaf). The calls are warp
 * collectives, as on the GPU: every lane of the warp must reach each one
 * (the __syncwarp of the full mask says so when one does not), pointers must
 * be 32-byte aligned and ldm a multiple of 16 bytes, or the launch fails. */
struct __half {
  uint16_t bits_;
};
struct __nv_bfloat16 {
  uint16_t bits_;
};
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

inline float fakecuda_wmma_in_(float x) { return x; }
inline float fakecuda_wmma_in_(__nv_bfloat16 x) { return __uint_as_float((unsigned)x.bits_ << 16); }
inline float fakecuda_wmma_in_(__half x) {
  const unsigned sign = (unsigned)(x.bits_ & 0x8000u) << 16, exp = (x.bits_ >> 10) & 0x1fu;
  unsigned frac = x.bits_ & 0x3ffu;
  if (exp == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (frac << 13));
  if (exp == 0) {
    if (frac == 0) return __uint_as_float(sign);
    int e = -14;
    while (!(frac & 0x400u)) {
      frac <<= 1;
      e--;
    }
    return __uint_as_float(sign | ((unsigned)(e + 127) << 23) | ((frac & 0x3ffu) << 13));
  }
  return __uint_as_float(sign | ((exp + 112u) << 23) | (frac << 13));
}

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  static constexpr int rows = std::is_same<Use, matrix_b>::value ? K : M;
  static constexpr int cols = std::is_same<Use, matrix_a>::value ? K : N;
  static constexpr int num_elements = rows * cols;
  float x[rows * cols];
};

inline void fakecuda_wmma_check_(const void *ptr, unsigned ldm, size_t element, const char *call) {
  if (reinterpret_cast<uintptr_t>(ptr) % 32 != 0 || (ldm * element) % 16 != 0) {
    char message[200];
    snprintf(message, sizeof message, "%s at %p with ldm %u: the pointer must be 32-byte aligned and ldm a multiple "
             "of 16 bytes", call, ptr, ldm);
    fakecuda__fault(FAKECUDA_ERROR_MISALIGNED_ADDRESS, message);
  }
  __syncwarp(0xffffffffu);
}
inline bool fakecuda_wmma_lane0_(void) {
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return linear % 32u == 0u;
}

template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout> &f, const T *p, unsigned ldm) {
  typedef fragment<Use, M, N, K, T, Layout> F;
  fakecuda_wmma_check_(p, ldm, sizeof(T), "wmma::load_matrix_sync");
  const bool col = std::is_same<Layout, col_major>::value;
  for (int r = 0; r < F::rows; r++)
    for (int c = 0; c < F::cols; c++) f.x[r * F::cols + c] = fakecuda_wmma_in_(col ? p[c * ldm + r] : p[r * ldm + c]);
}
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ldm, layout_t layout) {
  fakecuda_wmma_check_(p, ldm, sizeof(float), "wmma::load_matrix_sync");
  for (int r = 0; r < M; r++)
    for (int c = 0; c < N; c++) f.x[r * N + c] = layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c];
}
template <int M, int N, int K>
inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ldm, layout_t layout) {
  fakecuda_wmma_check_(p, ldm, sizeof(float), "wmma::store_matrix_sync");
  /* Every lane holds the same tile: one writes it. */
  if (fakecuda_wmma_lane0_())
    for (int r = 0; r < M; r++)
      for (int c = 0; c < N; c++) (layout == mem_col_major ? p[c * ldm + r] : p[r * ldm + c]) = f.x[r * N + c];
  __syncwarp(0xffffffffu);
}
template <typename Use, int M, int N, int K, typename T, typename Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout> &f, float v) {
  for (int i = 0; i < fragment<Use, M, N, K, T, Layout>::num_elements; i++) f.x[i] = v;
}
template <int M, int N, int K, typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, T, LA> &a,
                     const fragment<matrix_b, M, N, K, T, LB> &b, const fragment<accumulator, M, N, K, float> &c) {
  __syncwarp(0xffffffffu);
  float out[M * N];
  for (int r = 0; r < M; r++)
    for (int col = 0; col < N; col++) {
      float acc = c.x[r * N + col];
      for (int k = 0; k < K; k++) acc = fmaf(a.x[r * K + k], b.x[k * N + col], acc);
      out[r * N + col] = acc;
    }
  memcpy(d.x, out, sizeof out);
}
} /* namespace wmma */
} /* namespace nvcuda */

#endif /* KILN_FAKECUDA_CUDA_SHIM_H */
