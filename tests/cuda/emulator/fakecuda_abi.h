/* tests/cuda/emulator/fakecuda_abi.h: what the test driver (C) and the host build of the kernels (C++) share: the launch table and the shim's entry points. */
#ifndef KILN_FAKECUDA_ABI_H
#define KILN_FAKECUDA_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fakecuda_dim3 {
  unsigned x, y, z;
} fakecuda_dim3;

#define FAKECUDA_MAX_PARAMS 16

/* One kernel of the launch table, from gen_kernel_table.py's list: what
 * ptxas said it needs on sm_90, and how to call its host build. */
typedef struct fakecuda_kernel_t {
  const char *name;
  /* Calls the kernel with params[i] pointing at the value of parameter i. */
  void (*invoke)(void *const *params);
  unsigned param_count;         /* at most FAKECUDA_MAX_PARAMS */
  const unsigned *param_size;   /* [param_count], as the host and the PTX agree */
  const unsigned *param_align;
  unsigned max_threads;   /* .maxntid / .reqntid product; 0: no bound declared */
  unsigned static_shared; /* bytes of __shared__ variables */
  unsigned registers;     /* per thread */
  unsigned stack_bytes;   /* per thread (local memory) */
} fakecuda_kernel_t;

extern const fakecuda_kernel_t fakecuda__kernels[];
extern const unsigned fakecuda__kernel_count;

/* The CUresult values kernel code raises (checked against cuda.h by the
 * driver, which the shim does not include). */
#define FAKECUDA_ERROR_ASSERT 710
#define FAKECUDA_ERROR_MISALIGNED_ADDRESS 716
#define FAKECUDA_ERROR_LAUNCH_FAILED 719

/* ---- the shim's entry points (fiber.c), called by kernel code only ---------- */

const fakecuda_dim3 *fakecuda__thread_idx(void);
const fakecuda_dim3 *fakecuda__block_idx(void);
const fakecuda_dim3 *fakecuda__block_dim(void);
const fakecuda_dim3 *fakecuda__grid_dim(void);

/* __syncthreads and its reducing forms: every thread of the block must reach
 * the same call site (file and line). op 0: plain, 1: count, 2: and, 3: or;
 * returns the reduction of pred over the block. */
int fakecuda__syncthreads(int op, int pred, const char *file, int line);

/* Warp collectives. Every lane named in mask must make the same call with
 * the same mask. */
enum { FAKECUDA_SHFL_IDX, FAKECUDA_SHFL_UP, FAKECUDA_SHFL_DOWN, FAKECUDA_SHFL_XOR };
uint64_t fakecuda__shfl(unsigned mask, uint64_t value, int mode, int arg, int width);
/* Returns the ballot of pred over mask (bit i: lane i's pred). */
unsigned fakecuda__vote(unsigned mask, int pred);
unsigned fakecuda__activemask(void);

/* A kernel fault (misaligned vector access, __trap): ends the launch with
 * `result` (a CUresult) and the message. Does not return. */
void fakecuda__fault(int result, const char *message) __attribute__((noreturn));

#ifdef __cplusplus
}
#endif

#endif /* KILN_FAKECUDA_ABI_H */
