/* kernels/cuda/launch.h: the launch shapes kiln's CUDA kernels are written for, shared by the kernels and the plugin that launches them. */
#ifndef KILN_KERNELS_CUDA_LAUNCH_H
#define KILN_KERNELS_CUDA_LAUNCH_H

/* Every kernel takes the op's record (kernels/kop.h) by value, its only
 * parameter, and is extern "C" so that the plugin finds it by name with
 * cuModuleGetFunction. What is left to agree on is the launch: */

#include <stdint.h>

/* Threads per block of the elementwise, reduction and row kernels. */
#define KILN_CUDA_BLOCK 256
/* The native SGEMM's tile: 128 x 128 outputs per block of 256 threads. */
#define KILN_CUDA_GEMM_TILE 128
#define KILN_CUDA_GEMM_THREADS 256

/* One partial result of a reduction (sum and best value with its index),
 * as the reduction's first pass writes them to plan.reduce.parts when the
 * reduced axis is split into chunks (the plugin sizes that scratch). */
typedef struct kiln_cuda_reduce_part_t {
  double sum;      /* f32: sum (or sum of squares for NORM) */
  double best;     /* f32 or i32 value, exact in a double */
  int64_t index;   /* -1: nothing seen yet */
  uint32_t isum;   /* i32 sum, wrapping */
  uint32_t pad_;
} kiln_cuda_reduce_part_t;

#endif /* KILN_KERNELS_CUDA_LAUNCH_H */
