/* kernels/cpu/gemm_portable.c: the SGEMM micro-kernel in plain C, for CPUs without AVX2 + FMA. */
#include <string.h>

#include "kernels/cpu/gemm_internal.h"

#if KILN_CPU_GEMM_MR != 6 || KILN_CPU_GEMM_NR != 16
#error "the portable micro-kernel is written for a 6x16 register block"
#endif

/* Four-lane vectors through the compiler's generic vector extension: SSE on
 * x86-64, NEON on ARM, scalar code elsewhere; no ISA-specific intrinsics. */
typedef float kiln_v4 __attribute__((vector_size(16)));

static inline kiln_v4 v4_load(const float *p) {
  kiln_v4 v;
  memcpy(&v, p, sizeof(v));
  return v;
}

static inline void v4_store(float *p, kiln_v4 v) { memcpy(p, &v, sizeof(v)); }

/* Columns [j0, j0+8) of the tile. A 6x8 half needs 12 vector accumulators
 * plus three temporaries, which fits the 16 registers of SSE; the full 6x16
 * tile would spill on every step. */
static inline void half_tile(int64_t kc, const float *ap, const float *bp, int j0, float *c,
                             int64_t ldc, bool accumulate) {
  kiln_v4 acc[6][2];
  memset(acc, 0, sizeof(acc));
  for (int64_t l = 0; l < kc; l++) {
    const kiln_v4 b0 = v4_load(bp + l * 16 + j0);
    const kiln_v4 b1 = v4_load(bp + l * 16 + j0 + 4);
    const float *a = ap + l * 6;
    for (int i = 0; i < 6; i++) {
      const kiln_v4 av = {a[i], a[i], a[i], a[i]};
      acc[i][0] += av * b0;
      acc[i][1] += av * b1;
    }
  }
  for (int i = 0; i < 6; i++) {
    float *row = c + i * ldc + j0;
    if (accumulate) {
      acc[i][0] += v4_load(row);
      acc[i][1] += v4_load(row + 4);
    }
    v4_store(row, acc[i][0]);
    v4_store(row + 4, acc[i][1]);
  }
}

void kiln_cpu_gemm_ukernel_portable(int64_t kc, const float *ap, const float *bp, float *c,
                                    int64_t ldc, bool accumulate) {
  half_tile(kc, ap, bp, 0, c, ldc, accumulate);
  half_tile(kc, ap, bp, 8, c, ldc, accumulate);
}
