/* kernels/cuda/kiln.cu: kiln's native CUDA kernels, compiled by nvcc into the fatbin the CUDA plugin embeds. */
/*
 * One translation unit on purpose: nvcc then parses the headers once per
 * architecture, which keeps the build short on small machines. Every kernel
 * is extern "C" and takes one argument struct from kiln_cuda_args.cuh.
 * Build without --use_fast_math: the formulas must match the CPU backend's
 * within a few ulps.
 */
#include <math.h>
#include <stdint.h>

#include "kiln_cuda_args.cuh"

/* ---- the shared op table and Philox ---------------------------------------- */

#define KILN_F_EXP(x) expf(x)
#define KILN_F_LOG(x) logf(x)
#define KILN_F_SQRT(x) sqrtf(x)
#define KILN_F_TANH(x) tanhf(x)
#define KILN_F_FABS(x) fabsf(x)
#define KILN_F_COS(x) cosf(x)

#define KILN_U32 unsigned int
#define KILN_U64 unsigned long long
#define KILN_PHILOX_FN __device__ __forceinline__
#include "philox.h"

#define KILN_KERNEL extern "C" __global__ void __launch_bounds__(KILN_CUDA_BLOCK)

/* Grid-stride loop over [0, n): grids are capped on the host, so huge
 * tensors reuse threads instead of overflowing gridDim.x. */
#define KILN_FOR_EACH(i, n)                                                                         \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                          \
       i += (int64_t)gridDim.x * blockDim.x)

/* Offsets of element i of a contiguous output in two strided inputs. */
__device__ __forceinline__ void kiln_offsets(const kiln_cuda_ew_args_t &p, int64_t i, int64_t *o0,
                                             int64_t *o1) {
  int64_t a = 0, b = 0;
  for (int d = p.ndim - 1; d >= 0; d--) {
    const int64_t extent = p.shape[d];
    const int64_t coord = i % extent;
    i /= extent;
    a += coord * p.stride0[d];
    b += coord * p.stride1[d];
  }
  *o0 = a;
  *o1 = b;
}

/* ---- elementwise, expanded from kernels/ops.def ------------------------------ */

#define KILN_UNARY_KERNEL_(T, TNAME, NAME, expr)                                                   \
  KILN_KERNEL kiln_unary_##TNAME##_##NAME(const kiln_cuda_ew_args_t p) {                            \
    const T *__restrict__ in = (const T *)p.in0;                                                   \
    T *__restrict__ out = (T *)p.out;                                                              \
    if (p.ndim == 0) {                                                                             \
      KILN_FOR_EACH(i, p.n) {                                                                      \
        const T x = in[i];                                                                         \
        out[i] = (expr);                                                                           \
      }                                                                                            \
    } else {                                                                                       \
      KILN_FOR_EACH(i, p.n) {                                                                      \
        int64_t o0, o1;                                                                            \
        kiln_offsets(p, i, &o0, &o1);                                                              \
        const T x = in[o0];                                                                        \
        out[i] = (expr);                                                                           \
      }                                                                                            \
    }                                                                                              \
  }

#define KILN_BINARY_KERNEL_(T, TNAME, NAME, expr)                                                  \
  KILN_KERNEL kiln_binary_##TNAME##_##NAME(const kiln_cuda_ew_args_t p) {                           \
    const T *__restrict__ in0 = (const T *)p.in0;                                                  \
    const T *__restrict__ in1 = (const T *)p.in1;                                                  \
    T *__restrict__ out = (T *)p.out;                                                              \
    if (p.ndim == 0) {                                                                             \
      KILN_FOR_EACH(i, p.n) {                                                                      \
        const T a = in0[i], b = in1[i];                                                            \
        out[i] = (expr);                                                                           \
      }                                                                                            \
    } else {                                                                                       \
      KILN_FOR_EACH(i, p.n) {                                                                      \
        int64_t o0, o1;                                                                            \
        kiln_offsets(p, i, &o0, &o1);                                                              \
        const T a = in0[o0], b = in1[o1];                                                          \
        out[i] = (expr);                                                                           \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  KILN_KERNEL kiln_binary_scalar_##TNAME##_##NAME(const kiln_cuda_ew_args_t p) {                    \
    const T *__restrict__ in0 = (const T *)p.in0;                                                  \
    T *__restrict__ out = (T *)p.out;                                                              \
    const T b = kiln_scalar_of<T>(p);                                                              \
    if (p.ndim == 0) {                                                                             \
      KILN_FOR_EACH(i, p.n) {                                                                      \
        const T a = in0[i];                                                                        \
        out[i] = (expr);                                                                           \
      }                                                                                            \
    } else {                                                                                       \
      KILN_FOR_EACH(i, p.n) {                                                                      \
        int64_t o0, o1;                                                                            \
        kiln_offsets(p, i, &o0, &o1);                                                              \
        const T a = in0[o0];                                                                       \
        out[i] = (expr);                                                                           \
      }                                                                                            \
    }                                                                                              \
  }

template <typename T> __device__ __forceinline__ T kiln_scalar_of(const kiln_cuda_ew_args_t &p);
template <> __device__ __forceinline__ float kiln_scalar_of<float>(const kiln_cuda_ew_args_t &p) {
  return p.scalar_f;
}
template <> __device__ __forceinline__ int kiln_scalar_of<int>(const kiln_cuda_ew_args_t &p) {
  return p.scalar_i;
}

#define KILN_UNARY_F32(NAME, expr) KILN_UNARY_KERNEL_(float, f32, NAME, expr)
#define KILN_UNARY_I32(NAME, expr) KILN_UNARY_KERNEL_(int, i32, NAME, expr)
#define KILN_BINARY_F32(NAME, expr) KILN_BINARY_KERNEL_(float, f32, NAME, expr)
#define KILN_BINARY_I32(NAME, expr) KILN_BINARY_KERNEL_(int, i32, NAME, expr)
#include "ops.def"

/* ---- generators, COPY and CAST ----------------------------------------------- */

/* FILL: f32 and i32 are both one 32-bit pattern. */
KILN_KERNEL kiln_fill32(const kiln_cuda_ew_args_t p) {
  uint32_t *__restrict__ out = (uint32_t *)p.out;
  const uint32_t v = (uint32_t)p.scalar_i;
  KILN_FOR_EACH(i, p.n) out[i] = v;
}

/* ARANGE in double, rounded once, as the CPU backend does. */
KILN_KERNEL kiln_arange_f32(const kiln_cuda_ew_args_t p) {
  float *__restrict__ out = (float *)p.out;
  KILN_FOR_EACH(i, p.n) out[i] = (float)(p.start + (double)i * p.step);
}

__device__ __forceinline__ int kiln_double_to_i32(double v) {
  if (v != v) return 0;
  if (v >= 2147483647.0) return 2147483647;
  if (v <= -2147483648.0) return (-2147483647 - 1);
  return (int)v;
}

KILN_KERNEL kiln_arange_i32(const kiln_cuda_ew_args_t p) {
  int *__restrict__ out = (int *)p.out;
  KILN_FOR_EACH(i, p.n) out[i] = kiln_double_to_i32(p.start + (double)i * p.step);
}

KILN_KERNEL kiln_random_uniform(const kiln_cuda_ew_args_t p) {
  float *__restrict__ out = (float *)p.out;
  KILN_FOR_EACH(i, p.n) out[i] = kiln_philox_uniform((unsigned long long)i, p.seed, p.scalar_f, p.scalar_f2);
}

KILN_KERNEL kiln_random_normal(const kiln_cuda_ew_args_t p) {
  float *__restrict__ out = (float *)p.out;
  KILN_FOR_EACH(i, p.n) out[i] = kiln_philox_normal((unsigned long long)i, p.seed, p.scalar_f, p.scalar_f2);
}

/* COPY of a strided view into a contiguous output; f32 and i32 alike. */
KILN_KERNEL kiln_copy32_strided(const kiln_cuda_ew_args_t p) {
  const uint32_t *__restrict__ in = (const uint32_t *)p.in0;
  uint32_t *__restrict__ out = (uint32_t *)p.out;
  KILN_FOR_EACH(i, p.n) {
    int64_t o0, o1;
    kiln_offsets(p, i, &o0, &o1);
    out[i] = in[o0];
  }
}

/* CAST f32 -> i32: toward zero, NaN -> 0, saturating at the i32 limits (the
 * rule of every kiln backend, as for scalars). */
__device__ __forceinline__ int kiln_f32_to_i32(float v) {
  if (v != v) return 0;
  if (v >= 2147483648.0f) return 2147483647;
  if (v <= -2147483648.0f) return (-2147483647 - 1);
  return (int)v; /* C's conversion truncates toward zero */
}

/* CAST: a strided view (or, ndim 0, a contiguous run) into a contiguous
 * output of the other dtype. */
KILN_KERNEL kiln_cast_f32_to_i32(const kiln_cuda_ew_args_t p) {
  const float *__restrict__ in = (const float *)p.in0;
  int *__restrict__ out = (int *)p.out;
  if (p.ndim == 0) {
    KILN_FOR_EACH(i, p.n) out[i] = kiln_f32_to_i32(in[i]);
  } else {
    KILN_FOR_EACH(i, p.n) {
      int64_t o0, o1;
      kiln_offsets(p, i, &o0, &o1);
      out[i] = kiln_f32_to_i32(in[o0]);
    }
  }
}

/* i32 -> f32 rounds to the nearest float, ties to even. */
KILN_KERNEL kiln_cast_i32_to_f32(const kiln_cuda_ew_args_t p) {
  const int *__restrict__ in = (const int *)p.in0;
  float *__restrict__ out = (float *)p.out;
  if (p.ndim == 0) {
    KILN_FOR_EACH(i, p.n) out[i] = __int2float_rn(in[i]);
  } else {
    KILN_FOR_EACH(i, p.n) {
      int64_t o0, o1;
      kiln_offsets(p, i, &o0, &o1);
      out[i] = __int2float_rn(in[o0]);
    }
  }
}

/* ---- reductions ------------------------------------------------------------ */

typedef kiln_cuda_reduce_part_t part_t;

__device__ __forceinline__ part_t kiln_part_empty(void) {
  part_t r;
  r.sum = 0.0;
  r.best = 0.0;
  r.index = -1;
  r.isum = 0u;
  r.pad_ = 0u;
  return r;
}

/* Does b beat a? NaN wins, and among equals (or NaNs) the first index, so
 * the order in which partial results meet does not matter. */
__device__ __forceinline__ bool kiln_part_better(const part_t &b, const part_t &a) {
  if (b.index < 0) return false;
  if (a.index < 0) return true;
  const bool bn = b.best != b.best, an = a.best != a.best;
  if (bn != an) return bn;
  if (bn || b.best == a.best) return b.index < a.index;
  return b.best > a.best;
}

__device__ __forceinline__ part_t kiln_part_merge(const part_t &a, const part_t &b) {
  part_t r = kiln_part_better(b, a) ? b : a;
  r.sum = a.sum + b.sum;
  r.isum = a.isum + b.isum;
  return r;
}

/* What the i32 sum adds: the value itself, wrapping; nothing for f32. */
__device__ __forceinline__ uint32_t kiln_isum_of(float v) { return 0u; }
__device__ __forceinline__ uint32_t kiln_isum_of(int v) { return (uint32_t)v; }
template <typename T> struct kiln_is_f32 { static const bool value = false; };
template <> struct kiln_is_f32<float> { static const bool value = true; };

template <typename T>
__device__ __forceinline__ void kiln_part_add(part_t &acc, T v, int64_t index, bool squares) {
  const double d = (double)v;
  acc.sum += squares ? d * d : d;
  acc.isum += kiln_isum_of(v);
  part_t one;
  one.best = d;
  one.index = index;
  if (kiln_part_better(one, acc)) {
    acc.best = d;
    acc.index = index;
  }
}

__device__ part_t kiln_block_reduce(part_t v) {
  __shared__ part_t shared[KILN_CUDA_BLOCK / 32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    part_t o;
    o.sum = __shfl_down_sync(0xffffffffu, v.sum, offset);
    o.best = __shfl_down_sync(0xffffffffu, v.best, offset);
    o.index = __shfl_down_sync(0xffffffffu, v.index, offset);
    o.isum = __shfl_down_sync(0xffffffffu, v.isum, offset);
    v = kiln_part_merge(v, o);
  }
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < blockDim.x / 32 ? shared[lane] : kiln_part_empty();
    for (int offset = 16; offset > 0; offset >>= 1) {
      part_t o;
      o.sum = __shfl_down_sync(0xffffffffu, v.sum, offset);
      o.best = __shfl_down_sync(0xffffffffu, v.best, offset);
      o.index = __shfl_down_sync(0xffffffffu, v.index, offset);
      o.isum = __shfl_down_sync(0xffffffffu, v.isum, offset);
      v = kiln_part_merge(v, o);
    }
  }
  return v; /* valid in thread 0 */
}

/* Write one finished output; the same rules as the CPU backend (sum of
 * nothing 0, mean of nothing NaN, max of nothing -inf / INT_MIN, argmax 0). */
template <typename T>
__device__ __forceinline__ void kiln_reduce_finish(const kiln_cuda_reduce_args_t &p, int64_t at, const part_t &r) {
  if (p.op == 3) { /* ARGMAX */
    ((int *)p.out)[at] = r.index < 0 ? 0 : (int)r.index;
    return;
  }
  if (!kiln_is_f32<T>::value) {
    ((int *)p.out)[at] = p.op == 2 ? (r.index < 0 ? (-2147483647 - 1) : (int)r.best) : (int)r.isum;
    return;
  }
  float *out = (float *)p.out;
  switch (p.op) {
  case 0: out[at] = (float)r.sum; break;                                  /* SUM */
  case 1: out[at] = (float)(r.sum / (double)p.len); break;                /* MEAN: 0/0 is NaN */
  case 2: out[at] = r.index < 0 ? -INFINITY : (float)r.best; break;       /* MAX */
  default: out[at] = (float)sqrt(r.sum); break;                           /* NORM */
  }
}

template <typename T> __device__ void kiln_reduce_rows(const kiln_cuda_reduce_args_t &p) {
  const T *__restrict__ in = (const T *)p.in;
  const bool squares = p.op == 4;
  for (int64_t b = blockIdx.x; b < p.outer * p.chunks; b += gridDim.x) {
    const int64_t row = b / p.chunks, chunk = b % p.chunks;
    const int64_t begin = chunk * p.chunk;
    const int64_t end = begin + p.chunk < p.len ? begin + p.chunk : p.len;
    const T *x = in + row * p.len;
    part_t acc = kiln_part_empty();
    for (int64_t l = begin + threadIdx.x; l < end; l += blockDim.x) kiln_part_add<T>(acc, x[l], l, squares);
    acc = kiln_block_reduce(acc);
    if (threadIdx.x == 0) {
      if (p.chunks == 1)
        kiln_reduce_finish<T>(p, row, acc);
      else
        ((part_t *)p.parts)[b] = acc;
    }
    __syncthreads(); /* the shared scratch of kiln_block_reduce is reused */
  }
}

KILN_KERNEL kiln_reduce_rows_f32(const kiln_cuda_reduce_args_t p) { kiln_reduce_rows<float>(p); }
KILN_KERNEL kiln_reduce_rows_i32(const kiln_cuda_reduce_args_t p) { kiln_reduce_rows<int>(p); }

template <typename T> __device__ void kiln_reduce_parts(const kiln_cuda_reduce_args_t &p) {
  const part_t *parts = (const part_t *)p.parts;
  for (int64_t row = blockIdx.x; row < p.outer; row += gridDim.x) {
    part_t acc = kiln_part_empty();
    for (int64_t c = threadIdx.x; c < p.chunks; c += blockDim.x) acc = kiln_part_merge(acc, parts[row * p.chunks + c]);
    acc = kiln_block_reduce(acc);
    if (threadIdx.x == 0) kiln_reduce_finish<T>(p, row, acc);
    __syncthreads();
  }
}

KILN_KERNEL kiln_reduce_parts_f32(const kiln_cuda_reduce_args_t p) { kiln_reduce_parts<float>(p); }
KILN_KERNEL kiln_reduce_parts_i32(const kiln_cuda_reduce_args_t p) { kiln_reduce_parts<int>(p); }

/* inner > 1 (and any len == 0): a block is p.width neighbouring columns by
 * KILN_CUDA_BLOCK / p.width lanes along the axis, so a warp reads whole
 * lines (32 columns of one position, or with 4 columns, 4 of 8 consecutive
 * positions), and a long axis is split over blocks (p.chunks) like a long
 * row: reducing axis 0 of [1e6, 4] runs on hundreds of blocks, not 4
 * threads. The lanes of a column meet in a fixed tree, so the result does
 * not depend on timing. */
template <typename T> __device__ void kiln_reduce_cols(const kiln_cuda_reduce_args_t &p) {
  __shared__ part_t shared[KILN_CUDA_BLOCK];
  const T *__restrict__ in = (const T *)p.in;
  const bool squares = p.op == 4;
  const int width = p.width, lanes = KILN_CUDA_BLOCK / p.width;
  const int tx = (int)threadIdx.x % width, ty = (int)threadIdx.x / width;
  const int64_t tiles = (p.inner + width - 1) / width;
  for (int64_t b = blockIdx.x; b < p.outer * tiles * p.chunks; b += gridDim.x) {
    const int64_t chunk = b % p.chunks, tile = (b / p.chunks) % tiles, row = b / p.chunks / tiles;
    const int64_t col = tile * width + tx;
    const int64_t begin = chunk * p.chunk;
    const int64_t end = begin + p.chunk < p.len ? begin + p.chunk : p.len;
    part_t acc = kiln_part_empty();
    if (col < p.inner) {
      const T *x = in + row * p.len * p.inner + col;
      for (int64_t l = begin + ty; l < end; l += lanes) kiln_part_add<T>(acc, x[l * p.inner], l, squares);
    }
    shared[threadIdx.x] = acc;
    __syncthreads();
    for (int half = lanes / 2; half > 0; half /= 2) {
      if (ty < half) shared[threadIdx.x] = kiln_part_merge(shared[threadIdx.x], shared[threadIdx.x + half * width]);
      __syncthreads();
    }
    if (ty == 0 && col < p.inner) {
      const int64_t o = row * p.inner + col;
      if (p.chunks == 1)
        kiln_reduce_finish<T>(p, o, shared[tx]);
      else
        ((part_t *)p.parts)[o * p.chunks + chunk] = shared[tx];
    }
    __syncthreads(); /* shared is written again by the next block's items */
  }
}

KILN_KERNEL kiln_reduce_cols_f32(const kiln_cuda_reduce_args_t p) { kiln_reduce_cols<float>(p); }
KILN_KERNEL kiln_reduce_cols_i32(const kiln_cuda_reduce_args_t p) { kiln_reduce_cols<int>(p); }

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

/* One block per row; the maximum is subtracted so every exp is in (0, 1]. */
KILN_KERNEL kiln_softmax_f32(const kiln_cuda_rows_args_t p) {
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float *x = (const float *)p.in + r * p.cols;
    float *y = (float *)p.out + r * p.cols;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) m = kiln_max_nan(m, x[i]);
    m = kiln_block_max(m);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) sum += (double)expf(x[i] - m);
    sum = kiln_block_sum(sum);
    if (p.log) {
      /* (x - max) - log(sum), in that order: see kernels/cpu/nn.c. */
      const float lse = (float)log(sum);
      for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) y[i] = __fsub_rn(__fsub_rn(x[i], m), lse);
    } else {
      const float inv = (float)(1.0 / sum);
      for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) y[i] = expf(x[i] - m) * inv;
    }
  }
}

/* Loss of each row into work[r] (double); a label out of range gives NaN. */
KILN_KERNEL kiln_xent_rows(const kiln_cuda_rows_args_t p) {
  const int *labels = (const int *)p.labels;
  double *work = (double *)p.work;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float *x = (const float *)p.in + r * p.cols;
    const int label = labels[r];
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) m = kiln_max_nan(m, x[i]);
    m = kiln_block_max(m);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) sum += (double)expf(x[i] - m);
    sum = kiln_block_sum(sum);
    if (threadIdx.x == 0)
      work[r] = label < 0 || label >= p.cols ? (double)NAN : -((double)x[label] - (double)m - log(sum));
  }
}

/* One block: the mean of the row losses in a fixed order (deterministic),
 * and the report in `aux` that the core reads at the next synchronisation:
 * {the first row whose label is outside [0, cols), its label} or {-1, 0}. */
KILN_KERNEL kiln_xent_mean(const kiln_cuda_rows_args_t p) {
  __shared__ int first;
  const double *work = (const double *)p.work;
  const int *labels = (const int *)p.labels;
  if (threadIdx.x == 0) first = INT32_MAX;
  __syncthreads();
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < p.rows; r += blockDim.x) sum += work[r];
  for (int64_t r = threadIdx.x; r < p.rows && r < INT32_MAX; r += blockDim.x) {
    if (labels[r] < 0 || labels[r] >= p.cols) {
      atomicMin(&first, (int)r);
      break; /* this thread's later rows come after it */
    }
  }
  sum = kiln_block_sum(sum);
  __syncthreads();
  if (threadIdx.x == 0) {
    int *report = (int *)p.aux;
    ((float *)p.out)[0] = (float)(sum / (double)p.rows); /* rows 0: NaN */
    report[0] = first == INT32_MAX ? -1 : first;
    report[1] = first == INT32_MAX ? 0 : labels[first];
  }
}

/* ---- convolution helpers and pooling ---------------------------------------- */

/* [images][c*r*s][p*q] columns of `images` consecutive input images. */
KILN_KERNEL kiln_im2col_f32(const kiln_cuda_conv_args_t p) {
  const float *__restrict__ x = (const float *)p.in;
  float *__restrict__ cols = (float *)p.out;
  const int64_t pq = p.p * p.q, rs = p.r * p.s, crs = p.c * rs;
  KILN_FOR_EACH(i, p.images * crs * pq) {
    const int64_t col = i % pq, row = (i / pq) % crs, img = i / (pq * crs);
    const int64_t ch = row / rs, ri = (row % rs) / p.s, si = row % p.s;
    const int64_t pp = col / p.q, qq = col % p.q;
    const int64_t hh = pp * p.stride[0] - p.pad[0] + ri * p.dil[0];
    const int64_t ww = qq * p.stride[1] - p.pad[1] + si * p.dil[1];
    cols[i] = hh >= 0 && hh < p.h && ww >= 0 && ww < p.w ? x[((img * p.c + ch) * p.h + hh) * p.w + ww] : 0.0f;
  }
}

/* y[img][k][pq] += bias[k] over `images` images. */
KILN_KERNEL kiln_bias_nchw_f32(const kiln_cuda_conv_args_t p) {
  float *__restrict__ y = (float *)p.out;
  const float *__restrict__ bias = (const float *)p.bias;
  const int64_t pq = p.p * p.q;
  KILN_FOR_EACH(i, p.images * p.k * pq) y[i] += bias[(i / pq) % p.k];
}

/* Padded cells are never candidates; a window wholly in the padding gives
 * -inf; NaN propagates. */
KILN_KERNEL kiln_max_pool2d_f32(const kiln_cuda_conv_args_t p) {
  const float *__restrict__ x = (const float *)p.in;
  float *__restrict__ y = (float *)p.out;
  KILN_FOR_EACH(i, p.n * p.c * p.p * p.q) {
    const int64_t qq = i % p.q, pp = (i / p.q) % p.p, plane = i / (p.p * p.q);
    int64_t h0 = pp * p.stride[0] - p.pad[0], h1 = h0 + p.kernel[0];
    int64_t w0 = qq * p.stride[1] - p.pad[1], w1 = w0 + p.kernel[1];
    if (h0 < 0) h0 = 0;
    if (h1 > p.h) h1 = p.h;
    if (w0 < 0) w0 = 0;
    if (w1 > p.w) w1 = p.w;
    const float *plane_x = x + plane * p.h * p.w;
    float best = -INFINITY;
    for (int64_t hh = h0; hh < h1; hh++)
      for (int64_t ww = w0; ww < w1; ww++) {
        const float v = plane_x[hh * p.w + ww];
        if (v > best || v != v) best = v;
      }
    y[i] = best;
  }
}

#include "train.cuh"
#include "gemm.cuh"
