/* kernels/cpu/update_avx2.c: the in-place updates' loops for AVX2 + FMA (built with -mavx2 -mfma). */
#include "kernels/cpu/update_internal.h"

#define U_NAME(x) x##_avx2
#include "kernels/cpu/update_loops.h"

const kiln_cpu_update_isa_t kiln_cpu_update_avx2 = {accumulate_avx2, sgd_avx2, adam_avx2};
