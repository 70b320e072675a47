/* kernels/opencl/random.cl: RANDOM, uniform and normal, from Philox4x32-10: the same numbers as every kiln backend. */
#include "philox.h"

__kernel void random_uniform(__global float *out, long out_off, long n, ulong seed, float low, float high) {
  out += out_off;
  KILN_FOR_EACH(i, n) out[i] = kiln_philox_uniform((ulong)i, seed, low, high);
}

__kernel void random_normal(__global float *out, long out_off, long n, ulong seed, float mean, float stddev) {
  out += out_off;
  KILN_FOR_EACH(i, n) out[i] = kiln_philox_normal((ulong)i, seed, mean, stddev);
}
