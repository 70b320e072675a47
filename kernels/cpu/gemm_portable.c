/* kernels/cpu/gemm_portable.c: the SGEMM micro-kernel in plain C, for CPUs without AVX2 + FMA. */
#include <string.h>

#include "kernels/cpu/gemm_internal.h"

enum { MR = KILN_CPU_GEMM_MR, NR = KILN_CPU_GEMM_NR };

void kiln_cpu_gemm_ukernel_portable(int64_t kc, const float *ap, const float *bp, float *c,
                                    int64_t ldc, bool accumulate) {
  /* A fixed-size accumulator with fixed trip counts lets the compiler keep
   * it in vector registers of whatever width the baseline ISA has. */
  float acc[MR][NR];
  memset(acc, 0, sizeof(acc));
  for (int64_t l = 0; l < kc; l++) {
    const float *restrict brow = bp + l * NR;
    const float *restrict acol = ap + l * MR;
    for (int i = 0; i < MR; i++) {
      const float av = acol[i];
      for (int j = 0; j < NR; j++) acc[i][j] += av * brow[j];
    }
  }
  for (int i = 0; i < MR; i++) {
    float *row = c + i * ldc;
    if (accumulate) {
      for (int j = 0; j < NR; j++) row[j] += acc[i][j];
    } else {
      for (int j = 0; j < NR; j++) row[j] = acc[i][j];
    }
  }
}
