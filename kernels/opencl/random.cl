/* kernels/opencl/random.cl: RANDOM, uniform and normal, from Philox4x32-10: the same numbers as every kiln backend. */
/* kiln-kinds: random */
#ifdef KILN_CL_HAVE_FP64
#define KILN_PHILOX_F64 1
#endif
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

/* f16 and bf16: the f32 sample rounded to nearest even (the rule of every
 * backend). f64: kernels/philox.h's double scheme, with cl_khr_fp64 only. */
#define KILN_CL_RANDOM_16_(TN, STORE)                                                              \
  KILN_CL_KERNEL(random_##TN) {                                                                    \
    __global ushort *out = KILN_CL_OUT(ushort);                                                    \
    const ulong seed = op.u.random.seed;                                                           \
    const float a = op.u.random.a, b = op.u.random.b;                                              \
    if (op.u.random.normal) {                                                                      \
      KILN_FOR_EACH(i, op.n) out[i] = STORE(kiln_philox_normal((ulong)i, seed, a, b));             \
    } else {                                                                                       \
      KILN_FOR_EACH(i, op.n) out[i] = STORE(kiln_philox_uniform((ulong)i, seed, a, b));            \
    }                                                                                              \
  }
KILN_CL_RANDOM_16_(f16, KILN_CL_FROM_F32_f16)
KILN_CL_RANDOM_16_(bf16, KILN_CL_FROM_F32_bf16)
#undef KILN_CL_RANDOM_16_

#ifdef KILN_CL_HAVE_FP64
KILN_CL_KERNEL(random_f64) {
  __global double *out = KILN_CL_OUT(double);
  const ulong seed = op.u.random.seed;
  const double a = (double)op.u.random.a, b = (double)op.u.random.b;
  if (op.u.random.normal) {
    KILN_FOR_EACH(i, op.n) out[i] = kiln_philox_normal_f64((ulong)i, seed, a, b);
  } else {
    KILN_FOR_EACH(i, op.n) out[i] = kiln_philox_uniform_f64((ulong)i, seed, a, b);
  }
}
#endif
