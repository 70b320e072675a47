/* tests/cuda/emulator/selftest.cu: kernels that test the test driver's shim itself: barriers and warp collectives that work, and the misuse it must report. */
/*
 * Built into the test driver beside kiln's kernels (nvcc reads it too, for
 * the launch table) and launched by test_fakecuda.c. Each misuse kernel is
 * a bug a GPU would turn into a hang or a wrong result; the test driver must
 * fail its launch instead.
 */
#include "selftest_args.h"

#define FAKECUDA_TEST_KERNEL extern "C" __global__ void __launch_bounds__(256)

/* out[block] = sum of in[block * blockDim.x ...] (n values in all), by a
 * shared-memory tree: correct only if every __syncthreads holds. */
FAKECUDA_TEST_KERNEL fakecuda_test_block_sum(const fakecuda_test_args_t a) {
  __shared__ int partial[256];
  const unsigned t = threadIdx.x;
  const unsigned i = blockIdx.x * blockDim.x + t;
  partial[t] = i < (unsigned)a.n ? ((const int *)a.in)[i] : 0;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) partial[t] += partial[t + half];
    __syncthreads();
  }
  if (t == 0) ((int *)a.out)[blockIdx.x] = partial[0];
}

/* The same exchange without its barrier: each thread reads its neighbour's
 * slot, which the neighbour may not have written yet. */
FAKECUDA_TEST_KERNEL fakecuda_test_missing_barrier(const fakecuda_test_args_t a) {
  __shared__ int slot[256];
  const unsigned t = threadIdx.x;
  slot[t] = ((const int *)a.in)[t];
  ((int *)a.out)[t] = slot[(t + 1) % blockDim.x];
}

/* Per lane, FAKECUDA_TEST_WARP_VALUES results of warp collectives on
 * v = in[thread]. */
FAKECUDA_TEST_KERNEL fakecuda_test_warp(const fakecuda_test_args_t a) {
  const unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
  const int v = ((const int *)a.in)[t];
  int *out = (int *)a.out + t * FAKECUDA_TEST_WARP_VALUES;
  out[0] = __shfl_down_sync(0xffffffffu, v, 1);
  out[1] = __shfl_up_sync(0xffffffffu, v, 3);
  out[2] = __shfl_xor_sync(0xffffffffu, v, 5);
  out[3] = __shfl_sync(0xffffffffu, v, 7);
  out[4] = __shfl_down_sync(0xffffffffu, v, 2, 8);
  out[5] = (int)__ballot_sync(0xffffffffu, v & 1);
  out[6] = __any_sync(0xffffffffu, v == 100) + 2 * __all_sync(0xffffffffu, v >= 0);
  const double d = __shfl_xor_sync(0xffffffffu, (double)v * 0.5, 16);
  out[7] = (int)(d * 2.0);
  /* Half warps apart: lanes 0-15 and 16-31 each with their own mask. */
  const unsigned half = (threadIdx.x & 16u) ? 0xffff0000u : 0x0000ffffu;
  out[8] = __shfl_sync(half, v, (int)(threadIdx.x & 16u));
}

/* Misuse: half the block returns, the rest waits at a barrier. */
FAKECUDA_TEST_KERNEL fakecuda_test_divergent_barrier(const fakecuda_test_args_t a) {
  if (threadIdx.x < (unsigned)a.n) return;
  __syncthreads();
  ((int *)a.out)[threadIdx.x] = 1;
}

/* Misuse: odd and even threads wait at different barriers. */
FAKECUDA_TEST_KERNEL fakecuda_test_two_barriers(const fakecuda_test_args_t a) {
  if (threadIdx.x & 1u) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  ((int *)a.out)[threadIdx.x] = 1;
}

/* Misuse: a full-mask shuffle after half of each warp returned. */
FAKECUDA_TEST_KERNEL fakecuda_test_shfl_exited(const fakecuda_test_args_t a) {
  if (threadIdx.x % 32u < 16u) return;
  ((int *)a.out)[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x, 1);
}

/* Misuse: a float4 load from an address that is not 16-byte aligned. */
FAKECUDA_TEST_KERNEL fakecuda_test_misaligned(const fakecuda_test_args_t a) {
  const float4 v = __ldg(reinterpret_cast<const float4 *>(a.in + 4));
  ((float *)a.out)[threadIdx.x] = v.x;
}

/* Spins until *flag (host memory) is non-zero: a gate the host opens, to
 * order work across streams deterministically in tests. */
FAKECUDA_TEST_KERNEL fakecuda_test_wait_flag(const fakecuda_test_args_t a) {
  while (*(volatile int *)a.flag == 0) {
  }
  if (threadIdx.x == 0) ((int *)a.out)[0] = 1;
}
