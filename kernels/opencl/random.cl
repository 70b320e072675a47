/* kernels/opencl/random.cl: RANDOM, uniform and normal, from Philox4x32-10: the same numbers as every kiln backend. */
/* kiln-kinds: random */
#include "philox.h"

/* op.u.random.normal 0: uniform [a, b); 1: normal(mean a, stddev b). */
KILN_CL_KERNEL(random_f32) {
  __global float *out = KILN_CL_OUT(float);
  const ulong seed = op.u.random.seed;
  const float a = op.u.random.a, b = op.u.random.b;
  if (op.u.random.normal) {
    KILN_FOR_EACH(i, op.n) out[i] = kiln_philox_normal((ulong)i, seed, a, b);
  } else {
    KILN_FOR_EACH(i, op.n) out[i] = kiln_philox_uniform((ulong)i, seed, a, b);
  }
}
