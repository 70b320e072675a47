/* kernels/opencl/copy.cl: FILL, ARANGE, COPY and CAST of every dtype (any strided view into a contiguous tensor). */
/* kiln-kinds: fill arange copy cast */
/* Results are compared bit for bit with the CPU backend's: no a*b+c
 * contracted into an fma (OpenCL C allows it by default). */
#pragma OPENCL FP_CONTRACT OFF

/* FILL: fill_<dtype>, the value's bits in the op's dtype (the core's
 * kiln_scalar_t.bits), stored as they are. */
#define KILN_CL_FILL_(name, dc, T, BITS, CLASS)                                                    \
  KILN_CL_KERNEL(fill_##name) {                                                                    \
    __global BITS *out = KILN_CL_OUT(BITS);                                                        \
    const BITS value = (BITS)op.u.fill.value.bits;                                                 \
    KILN_FOR_EACH(i, op.n) out[i] = value;                                                         \
  }
KILN_CL_DTYPES(KILN_CL_FILL_)
#undef KILN_CL_FILL_

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

/* COPY: the bits as they are, by element size. */
#define KILN_CL_COPY_(name, dc, T, BITS, CLASS) KILN_CL_WALK_(copy_##name##_##name, BITS, BITS, KILN_CL_AS_IS_)
KILN_CL_DTYPES(KILN_CL_COPY_)
#undef KILN_CL_COPY_

/* CAST between every pair (the core sends same-dtype casts as copies):
 * kiln_tensor_cast's rule through the source's carrier (prelude.cl). */
#define KILN_CL_CAST_PAIR_(s, sdc, ST, SB, SC, d, ddc, DT, DB, DC)                                 \
  KILN_FN DT kiln_cl_cast_##s##_##d(ST x) { return KILN_CL_CONVERT(SC, sdc, ddc, x); }             \
  KILN_CL_WALK_(cast_##s##_##d, DT, ST, kiln_cl_cast_##s##_##d)
#define KILN_CL_CAST_FROM_(s, sdc, ST, SB, SC) KILN_CL_DTYPES_TO_(KILN_CL_CAST_PAIR_, s, sdc, ST, SB, SC)
KILN_CL_DTYPES(KILN_CL_CAST_FROM_)
#undef KILN_CL_CAST_FROM_
#undef KILN_CL_CAST_PAIR_

/* ARANGE: out[i] = start + i*step computed in double and stored by the
 * cast rule (kiln_dc_f64_to_<dtype>), as the CPU backend does. start and
 * step are the record's doubles; devices without fp64 get their bits and
 * split each into a pair of floats (hi + lo) for a double-float evaluation
 * that agrees except in rare double-rounding cases, stored from the pair by
 * kiln_cl_df_to_<dtype>. */
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

/* hi + lo (|lo| at most half an ulp of hi) toward zero into int64,
 * NaN -> 0, saturating. */
KILN_FN long kiln_cl_df_to_i64(float2 v) {
  const float hi = v.x, lo = v.y;
  if (hi != hi) return 0;
  if (hi >= 0x1p63f) return 0x7fffffffffffffffL;
  if (hi < -0x1p63f || (hi == -0x1p63f && lo <= 0.0f)) return (-0x7fffffffffffffffL - 1);
  const long r = (long)hi, l = (long)lo;          /* toward zero; hi - r and lo - l are exact */
  const long whole = r + l;
  const float frac = (hi - (float)r) + (lo - (float)l); /* in (-1, 1); its sign is exact */
  if (whole > 0 && frac < 0.0f) return whole - 1;
  if (whole < 0 && frac > 0.0f) return whole + 1;
  if (whole == 0) return 0;
  return whole;
}
#define KILN_CL_DF_TO_INT_(NAME, T, LO, HI)                                                        \
  KILN_FN T kiln_cl_df_to_##NAME(float2 v) {                                                       \
    const long x = kiln_cl_df_to_i64(v);                                                           \
    return (T)(x >= (HI) ? (HI) : x <= (LO) ? (LO) : x);                                           \
  }
KILN_CL_DF_TO_INT_(i8, char, -128, 127)
KILN_CL_DF_TO_INT_(u8, uchar, 0, 255)
KILN_CL_DF_TO_INT_(i16, short, -32768, 32767)
KILN_CL_DF_TO_INT_(i32, int, (-2147483647 - 1), 2147483647)
#undef KILN_CL_DF_TO_INT_
KILN_FN float kiln_cl_df_to_f32(float2 v) { return v.x; }
KILN_FN uchar kiln_cl_df_to_b8(float2 v) { return v.x != 0.0f; }

/* hi + lo into a narrow format, rounded once: hi (the float nearest the
 * value) rounds the same way as hi + lo unless hi is exactly the midpoint
 * of two narrow neighbours (midpoints are floats); then lo's sign decides.
 * (The midpoint to infinity, 65520 for f16, is left to hi's rounding.) */
KILN_FN ushort kiln_cl_df_narrow(float2 v, int mb, int bias) {
  const float hi = v.x, lo = v.y;
  const ushort at = kiln_cl_narrow_f32(hi, mb, bias);
  if (lo == 0.0f || hi != hi) return at;
  const ushort up = kiln_cl_narrow_f32(nextafter(hi, INFINITY), mb, bias);
  const ushort down = kiln_cl_narrow_f32(nextafter(hi, -INFINITY), mb, bias);
  if (up == down) return at;
  const float wu = mb == 10 ? kiln_dc_f16_to_f32(up) : kiln_dc_bf16_to_f32(up);
  const float wd = mb == 10 ? kiln_dc_f16_to_f32(down) : kiln_dc_bf16_to_f32(down);
  if (hi - wd == wu - hi) return lo > 0.0f ? up : down;
  return at;
}
KILN_FN ushort kiln_cl_df_to_f16(float2 v) { return kiln_cl_df_narrow(v, 10, 15); }
KILN_FN ushort kiln_cl_df_to_bf16(float2 v) { return kiln_cl_df_narrow(v, 7, 127); }
#endif

#ifdef KILN_CL_HAVE_FP64
#define KILN_CL_ARANGE_(name, dc, T, BITS, CLASS)                                                  \
  KILN_CL_KERNEL(arange_##name) {                                                                  \
    __global T *out = KILN_CL_OUT(T);                                                              \
    const double start = op.u.arange.start, step = op.u.arange.step;                               \
    KILN_FOR_EACH(i, op.n) out[i] = kiln_dc_f64_to_##dc(start + (double)i * step);                 \
  }
#else
#define KILN_CL_ARANGE_(name, dc, T, BITS, CLASS)                                                  \
  KILN_CL_KERNEL(arange_##name) {                                                                  \
    __global T *out = KILN_CL_OUT(T);                                                              \
    const float2 start = kiln_df_of_bits(op.u.arange.start), step = kiln_df_of_bits(op.u.arange.step); \
    KILN_FOR_EACH(i, op.n) out[i] = kiln_cl_df_to_##dc(kiln_df_arange(i, start.x, start.y, step.x, step.y)); \
  }
#endif
KILN_CL_DTYPES(KILN_CL_ARANGE_)
#undef KILN_CL_ARANGE_
