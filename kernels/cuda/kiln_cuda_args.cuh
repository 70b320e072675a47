/* kernels/cuda/kiln_cuda_args.cuh: the argument structs of kiln's CUDA kernels, shared by the kernels and the plugin that launches them. */
#ifndef KILN_KERNELS_CUDA_ARGS_CUH
#define KILN_KERNELS_CUDA_ARGS_CUH

/* Written in the C subset that gcc (the plugin) and nvcc (the kernels) lay
 * out identically: fixed-width members only, device pointers as uint64_t.
 * Every kernel takes exactly one of these structs by value, so a launch packs
 * one pointer into cuLaunchKernel's parameter array and allocates nothing.
 * Kernel names are extern "C" so the plugin finds them with
 * cuModuleGetFunction without C++ mangling. */

#include <stdint.h>

#define KILN_CUDA_MAX_DIMS 8
/* Threads per block of the elementwise, reduction and row kernels. */
#define KILN_CUDA_BLOCK 256
/* The native SGEMM's tile: 128 x 128 outputs per block of 256 threads. */
#define KILN_CUDA_GEMM_TILE 128
#define KILN_CUDA_GEMM_THREADS 256

/* Elementwise, COPY, CAST, FILL, ARANGE, RANDOM. ndim == 0 means every
 * operand is contiguous (element i of each at index i); otherwise the output
 * is contiguous of `shape` and the inputs are walked by their strides
 * (elements; 0 where broadcast). */
typedef struct kiln_cuda_ew_args_t {
  uint64_t out, in0, in1;
  int64_t n;
  int32_t ndim;
  int32_t scalar_i;   /* BINARY_SCALAR i32, FILL's bit pattern */
  float scalar_f;     /* BINARY_SCALAR f32; RANDOM's a */
  float scalar_f2;    /* RANDOM's b */
  double start, step; /* ARANGE */
  uint64_t seed;      /* RANDOM */
  int64_t shape[KILN_CUDA_MAX_DIMS];
  int64_t stride0[KILN_CUDA_MAX_DIMS];
  int64_t stride1[KILN_CUDA_MAX_DIMS];
} kiln_cuda_ew_args_t;

/* One partial result of a reduction (sum and best value with its index). */
typedef struct kiln_cuda_reduce_part_t {
  double sum;      /* f32: sum (or sum of squares for NORM) */
  double best;     /* f32 or i32 value, exact in a double */
  int64_t index;   /* -1: nothing seen yet */
  uint32_t isum;   /* i32 sum, wrapping */
  uint32_t pad_;
} kiln_cuda_reduce_part_t;

/* REDUCE over the middle axis of [outer, len, inner], the axis split into
 * `chunks` chunks of `chunk` elements when there are too few outputs to fill
 * the GPU; with chunks > 1 each block writes parts and the parts kernel
 * finishes each output, merging its chunks in order (deterministic).
 * rows kernel (inner == 1): block b handles chunk (b % chunks) of row
 * (b / chunks), parts[b]. cols kernel (inner > 1, or len == 0): a block is
 * `width` neighbouring columns (a power of two up to 32) times
 * KILN_CUDA_BLOCK / width lanes walking the axis, so a warp reads whole
 * lines of memory; block b handles chunk (b % chunks) of column tile
 * (b / chunks) % ceil(inner / width) of outer row b / chunks / tiles, and
 * writes parts[(row * inner + col) * chunks + chunk], so the parts kernel
 * finishes the outputs as outer * inner rows. */
typedef struct kiln_cuda_reduce_args_t {
  uint64_t in, out, parts;
  int64_t outer, len, inner;
  int64_t chunk, chunks;
  int32_t op;    /* kiln_reduce_op_t */
  int32_t width; /* cols kernel: columns per block */
} kiln_cuda_reduce_args_t;

/* SOFTMAX (one block per row) and CROSS_ENTROPY (rows kernel: one block per
 * row writes a double loss into `work`; mean kernel: one block sums them and
 * writes the label report, i32 [2], into `aux`),
 * and their gradients, one block per row: SOFTMAX_BACKWARD's y in `in` and
 * dy in `aux`; CROSS_ENTROPY_BACKWARD's logits in `in`, labels, and its
 * one-element dloss in `aux` (0: none, 1). */
typedef struct kiln_cuda_rows_args_t {
  uint64_t in, labels, out, work, aux;
  int64_t rows, cols;
  int32_t log;
  int32_t pad_;
} kiln_cuda_rows_args_t;

/* SGEMM, row-major, per batch b (blockIdx.z and beyond):
 * C[b] (m x n, ldc) = op(A[b]) (m x k) @ op(B[b]) (k x n).
 * !trans_a: A(i,l) at a[i*lda + l]; trans_a: a[l*lda + i] (likewise B).
 * Sizes are 64-bit; m and n below 2^38 (the plugin checks), so that tile
 * indices fit in an int. Blocks loop over the m tiles (y) and batches (z)
 * their grid does not cover; x covers every n tile.
 * The _vec kernels load A and B with float4 and need a, b 16-byte aligned
 * and lda, ldb, stride_a, stride_b multiples of 4; c_vec says the same of C
 * for the stores. */
typedef struct kiln_cuda_gemm_args_t {
  uint64_t a, b, c;
  int64_t m, n, k;
  int32_t c_vec;
  int32_t pad_;
  int64_t lda, ldb, ldc;
  int64_t stride_a, stride_b, stride_c;
  int64_t batch;
} kiln_cuda_gemm_args_t;

/* CONV2D's helpers (im2col into [images][c*r*s][p*q], bias over NCHW),
 * MAX_POOL2D, and the gradients' (col2im, the weight gradient's columns and
 * dy, max pooling's two passes). For im2col and friends, `in` and `out`
 * point at the first of `images` images. MAX_POOL2D_BACKWARD: `index` holds
 * each window's cell (int, the first pass's output) and `aux` dy. */
typedef struct kiln_cuda_conv_args_t {
  uint64_t in, out, bias, index, aux;
  int64_t images, n, c, h, w, k, r, s, p, q;
  int32_t stride[2], pad[2], dil[2];
  int32_t kernel[2];
} kiln_cuda_conv_args_t;

/* ACCUMULATE, SGD_UPDATE and ADAM_UPDATE: n contiguous floats in each
 * operand; `param` is the tensor updated (ACCUMULATE's a), `grad` the one
 * only read (ACCUMULATE's b), s1 and s2 the state written too (SGD's
 * momentum buffer when has_buf; Adam's m and v). The host folds the
 * constants in double: keep1 = 1 - dampening (SGD) or 1 - beta1 (Adam),
 * keep2 = 1 - beta2, step_size = lr / bias1, sqrt_bias2 = sqrt(bias2). */
typedef struct kiln_cuda_update_args_t {
  uint64_t param, grad, s1, s2;
  int64_t n;
  float alpha;                                           /* ACCUMULATE */
  float lr, momentum, keep1, weight_decay;               /* SGD; keep1 and weight_decay Adam's too */
  float beta1, beta2, keep2, eps, step_size, sqrt_bias2; /* Adam */
  int32_t has_buf, nesterov;
} kiln_cuda_update_args_t;

#endif /* KILN_KERNELS_CUDA_ARGS_CUH */
