/* kernels/opencl/copy.cl: FILL, ARANGE, COPY and CAST (any strided view into a contiguous tensor). */

/* FILL: f32 and i32 are both one 32-bit pattern. */
__kernel void fill32(__global uint *out, long out_off, long n, uint value) {
  out += out_off;
  KILN_FOR_EACH(i, n) out[i] = value;
}

/* COPY and CAST: a strided view (ndim 0: contiguous) into a contiguous
 * output, each element converted by CONVERT; one walk for all three. */
#define KILN_CL_WALK_(NAME, TOUT, TIN, CONVERT)                                                                  \
  __kernel void NAME(__global TOUT *out, long out_off, __global const TIN *in, long in_off, long n, int ndim,  \
                     KILN_DIMS_PARAMS(dim_), KILN_DIMS_PARAMS(sa_)) {                                           \
    out += out_off;                                                                                             \
    in += in_off;                                                                                               \
    if (ndim == 0) {                                                                                            \
      KILN_FOR_EACH(i, n) out[i] = CONVERT(in[i]);                                                              \
      return;                                                                                                   \
    }                                                                                                           \
    const long shape[8] = KILN_DIMS_ARRAY(dim_), stride[8] = KILN_DIMS_ARRAY(sa_);                              \
    KILN_FOR_EACH(i, n) out[i] = CONVERT(in[kiln_offset1(i, ndim, shape, stride)]);                             \
  }

#define KILN_CL_AS_IS_(x) (x)
/* i32 -> f32: OpenCL C's conversion to float rounds to nearest even. */
#define KILN_CL_TO_F32_(x) ((float)(x))

/* COPY: f32 and i32 alike, as 32-bit patterns. */
KILN_CL_WALK_(copy32, uint, uint, KILN_CL_AS_IS_)
/* CAST f32 -> i32: toward zero, NaN -> 0, saturating (kiln_float_to_i32). */
KILN_CL_WALK_(cast_f32_i32, int, float, kiln_float_to_i32)
KILN_CL_WALK_(cast_i32_f32, float, int, KILN_CL_TO_F32_)

/* ARANGE: out[i] = start + i*step computed in double and rounded once, as the
 * CPU backend does. start and step arrive as the bits of their doubles and,
 * for devices without fp64, as pairs of floats (hi + lo) for a double-float
 * evaluation that agrees except in rare double-rounding cases. */
#ifndef KILN_CL_HAVE_FP64
/* hi + lo = a + b exactly. */
KILN_FN float2 kiln_two_sum(float a, float b) {
  const float s = a + b, bb = s - a;
  return (float2)(s, (a - (s - bb)) + (b - bb));
}

KILN_FN float2 kiln_df_arange(long i, float start_hi, float start_lo, float step_hi, float step_lo) {
  const float i_hi = (float)i, i_lo = (float)(i - (long)i_hi);
  const float p = step_hi * i_hi;
  const float p_err = fma(step_hi, i_hi, -p);
  const float2 s = kiln_two_sum(start_hi, p);
  const float lo = s.y + p_err + start_lo + step_hi * i_lo + step_lo * i_hi;
  return kiln_two_sum(s.x, lo);
}
#endif

__kernel void arange_f32(__global float *out, long out_off, long n, ulong start_bits, ulong step_bits,
                         float start_hi, float start_lo, float step_hi, float step_lo) {
  out += out_off;
#ifdef KILN_CL_HAVE_FP64
  const double start = as_double(start_bits), step = as_double(step_bits);
  KILN_FOR_EACH(i, n) out[i] = (float)(start + (double)i * step);
#else
  KILN_FOR_EACH(i, n) out[i] = kiln_df_arange(i, start_hi, start_lo, step_hi, step_lo).x;
#endif
}

__kernel void arange_i32(__global int *out, long out_off, long n, ulong start_bits, ulong step_bits, float start_hi,
                         float start_lo, float step_hi, float step_lo) {
  out += out_off;
#ifdef KILN_CL_HAVE_FP64
  const double start = as_double(start_bits), step = as_double(step_bits);
  KILN_FOR_EACH(i, n) out[i] = kiln_double_to_i32(start + (double)i * step);
#else
  KILN_FOR_EACH(i, n) {
    const float2 v = kiln_df_arange(i, start_hi, start_lo, step_hi, step_lo);
    /* Truncate hi + lo toward zero without losing lo's sign. */
    int r = kiln_float_to_i32(v.x);
    const float frac = (v.x - (float)r) + v.y;
    if (v.x >= 0.0f && frac < 0.0f && r > (-2147483647 - 1)) r -= 1;
    if (v.x < 0.0f && frac > 0.0f && r < 2147483647) r += 1;
    out[i] = r;
  }
#endif
}
