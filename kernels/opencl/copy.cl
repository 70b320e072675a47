/* kernels/opencl/copy.cl: FILL, ARANGE, COPY and CAST (any strided view into a contiguous tensor). */
/* kiln-kinds: fill arange copy cast */

/* FILL: fill_<T>, the value as the core converted it to T. */
#define KILN_CL_FILL_(T, TN)                                                                       \
  KILN_CL_KERNEL(fill_##TN) {                                                                      \
    __global T *out = KILN_CL_OUT(T);                                                              \
    const T value = op.u.fill.value.TN;                                                            \
    KILN_FOR_EACH(i, op.n) out[i] = value;                                                         \
  }
KILN_CL_FILL_(float, f32)
KILN_CL_FILL_(int, i32)

/* COPY and CAST: a strided view (ndim 0: contiguous) into a contiguous
 * output, each element converted by CONVERT; one walk for all of them:
 * <kind>_<in dtype>_<out dtype>. */
#define KILN_CL_WALK_(NAME, TOUT, TIN, CONVERT)                                                    \
  KILN_CL_KERNEL(NAME) {                                                                           \
    __global TOUT *out = KILN_CL_OUT(TOUT);                                                        \
    __global const TIN *in = KILN_CL_IN(TIN, 0);                                                   \
    if (op.ndim == 0) {                                                                            \
      KILN_FOR_EACH(i, op.n) out[i] = CONVERT(in[i]);                                              \
      return;                                                                                      \
    }                                                                                              \
    KILN_FOR_EACH(i, op.n) out[i] = CONVERT(in[kiln_offset1(i, op.ndim, op.shape, op.in[0].strides)]); \
  }

#define KILN_CL_AS_IS_(x) (x)
/* i32 -> f32: OpenCL C's conversion to float rounds to nearest even. */
#define KILN_CL_TO_F32_(x) ((float)(x))

/* COPY, and CAST to the same dtype: 32-bit patterns as they are. */
KILN_CL_WALK_(copy_f32_f32, uint, uint, KILN_CL_AS_IS_)
KILN_CL_WALK_(copy_i32_i32, uint, uint, KILN_CL_AS_IS_)
KILN_CL_WALK_(cast_f32_f32, uint, uint, KILN_CL_AS_IS_)
KILN_CL_WALK_(cast_i32_i32, uint, uint, KILN_CL_AS_IS_)
/* CAST f32 -> i32: toward zero, NaN -> 0, saturating (kiln_float_to_i32). */
KILN_CL_WALK_(cast_f32_i32, int, float, kiln_float_to_i32)
KILN_CL_WALK_(cast_i32_f32, float, int, KILN_CL_TO_F32_)

/* ARANGE: out[i] = start + i*step computed in double and rounded once, as the
 * CPU backend does. start and step are the record's doubles; devices without fp64 get
 * their bits and split each into a pair of floats (hi + lo) for a
 * double-float evaluation that agrees except in rare double-rounding cases. */
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

/* A double's bits as hi + lo floats: hi its top 24 significant bits, lo the
 * next 29 rounded to float (finite values within float range). */
KILN_FN float2 kiln_df_of_bits(ulong bits) {
  const int biased = (int)((bits >> 52) & 0x7ff);
  if (biased == 0) return (float2)(0.0f, 0.0f); /* zero, and doubles far below float range */
  const ulong mant = (bits & 0xfffffffffffffUL) | 0x10000000000000UL; /* 53 bits */
  const int e = biased - 1075;
  const float sign = (bits >> 63) ? -1.0f : 1.0f;
  const float hi = ldexp((float)(uint)(mant >> 29), e + 29);
  const float lo = ldexp((float)(uint)(mant & 0x1fffffffUL), e);
  return (float2)(sign * hi, sign * lo);
}
#endif

KILN_CL_KERNEL(arange_f32) {
  __global float *out = KILN_CL_OUT(float);
#ifdef KILN_CL_HAVE_FP64
  const double start = op.u.arange.start, step = op.u.arange.step;
  KILN_FOR_EACH(i, op.n) out[i] = (float)(start + (double)i * step);
#else
  const float2 start = kiln_df_of_bits(op.u.arange.start), step = kiln_df_of_bits(op.u.arange.step);
  KILN_FOR_EACH(i, op.n) out[i] = kiln_df_arange(i, start.x, start.y, step.x, step.y).x;
#endif
}

KILN_CL_KERNEL(arange_i32) {
  __global int *out = KILN_CL_OUT(int);
#ifdef KILN_CL_HAVE_FP64
  const double start = op.u.arange.start, step = op.u.arange.step;
  KILN_FOR_EACH(i, op.n) out[i] = kiln_double_to_i32(start + (double)i * step);
#else
  const float2 start = kiln_df_of_bits(op.u.arange.start), step = kiln_df_of_bits(op.u.arange.step);
  KILN_FOR_EACH(i, op.n) {
    const float2 v = kiln_df_arange(i, start.x, start.y, step.x, step.y);
    /* Truncate hi + lo toward zero without losing lo's sign. */
    int r = kiln_float_to_i32(v.x);
    const float frac = (v.x - (float)r) + v.y;
    if (v.x >= 0.0f && frac < 0.0f && r > (-2147483647 - 1)) r -= 1;
    if (v.x < 0.0f && frac > 0.0f && r < 2147483647) r += 1;
    out[i] = r;
  }
#endif
}
