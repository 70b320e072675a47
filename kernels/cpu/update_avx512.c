/* kernels/cpu/update_avx512.c: the in-place updates' loops for AVX-512F (built with -mavx512f -mfma). */
#include "kernels/cpu/update_internal.h"

#define U_NAME(x) x##_avx512
#include "kernels/cpu/update_loops.h"

const kiln_cpu_update_isa_t kiln_cpu_update_avx512 = {accumulate_avx512, sgd_avx512, adam_avx512};
