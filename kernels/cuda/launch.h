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

/* Bytes of one partial result of a reduction, as the reduction's first
 * pass writes them to plan.reduce.parts when the reduced axis is split into
 * chunks (the plugin sizes that scratch): the kernels' kiln_part<T, ACC>,
 * { ACC sum; T best; int64_t index; }, T and ACC 8 bytes at most, so 24 bounds
 * every instance (checked in kiln.cu). */
#define KILN_CUDA_REDUCE_PART_BYTES 24

#endif /* KILN_KERNELS_CUDA_LAUNCH_H */
