/* kernels/dtype_convert.h: every conversion between kiln's dtypes, written once as small inline functions (kiln_tensor_cast's one rule). */
#ifndef KILN_KERNELS_DTYPE_CONVERT_H
#define KILN_KERNELS_DTYPE_CONVERT_H

/*
 * The rule (include/kiln/tensor.h, kiln_tensor_cast, says it for users):
 * - into f16 / bf16: round to nearest, ties to even, once, from the exact
 *   value (f64 and i64 are never rounded through f32 first); NaN stays a
 *   quiet NaN with its sign and top payload bits, +-inf and -0 stay,
 *   subnormals are kept and made; past the largest finite value: +-inf;
 * - into f32 / f64: the dialect's round-to-nearest-even conversion;
 * - float into an integer: toward zero, NaN -> 0, out of range -> the
 *   nearest limit; integer into integer: modulo 2^bits;
 * - into bool: != 0 (NaN -> true); bool into a number: 0 or 1.
 *
 * Each dtype has a load into one of two exact carriers (double for the
 * floats, int64 for bool and the integers: every value of its class fits
 * exactly) and a store from each carrier, so a conversion between any pair
 * is store(load(x)) with a single rounding.
 *
 * The text keeps to a subset the GPU dialects take later: no libc, fixed-
 * width types through the kiln_* names of kernels/kop.h, f16 and bf16 as
 * their bits (kiln_u16) converted by bit manipulation, so no half type or
 * extension is needed. A dialect defines KILN_DC_FN before including it
 * (default `static inline`) and, if it must, KILN_DC_BITS_OF_F32/F64 and
 * KILN_DC_F32_OF_BITS/F64_OF_BITS (OpenCL: as_uint, as_float, ...).
 */

#include "kernels/kop.h"

#if defined(__OPENCL_VERSION__)
typedef short kiln_i16;
typedef ushort kiln_u16;
typedef char kiln_i8;
typedef uchar kiln_u8;
#else
typedef int16_t kiln_i16;
typedef uint16_t kiln_u16;
typedef int8_t kiln_i8;
typedef uint8_t kiln_u8;
#endif

#ifndef KILN_DC_FN
#define KILN_DC_FN static inline
#endif

/* ---- bits of the IEEE types -------------------------------------------------- */

#ifndef KILN_DC_BITS_OF_F32
KILN_DC_FN kiln_u32 kiln_dc_bits_of_f32(kiln_f32 x) {
  union { kiln_f32 f; kiln_u32 u; } v;
  v.f = x;
  return v.u;
}
KILN_DC_FN kiln_f32 kiln_dc_f32_of_bits(kiln_u32 x) {
  union { kiln_f32 f; kiln_u32 u; } v;
  v.u = x;
  return v.f;
}
KILN_DC_FN kiln_u64 kiln_dc_bits_of_f64(kiln_f64 x) {
  union { kiln_f64 f; kiln_u64 u; } v;
  v.f = x;
  return v.u;
}
KILN_DC_FN kiln_f64 kiln_dc_f64_of_bits(kiln_u64 x) {
  union { kiln_f64 f; kiln_u64 u; } v;
  v.u = x;
  return v.f;
}
#define KILN_DC_BITS_OF_F32(x) kiln_dc_bits_of_f32(x)
#define KILN_DC_F32_OF_BITS(x) kiln_dc_f32_of_bits(x)
#define KILN_DC_BITS_OF_F64(x) kiln_dc_bits_of_f64(x)
#define KILN_DC_F64_OF_BITS(x) kiln_dc_f64_of_bits(x)
#endif

/* ---- packing into a narrow float ---------------------------------------------
 * The value m * 2^e (m > 0) rounded to nearest even into an IEEE format of
 * `mb` fraction bits and exponent bias `bias` (f16: 10, 15; bf16: 7, 127),
 * without its sign: the bits, +inf's bits past the largest finite value. */
KILN_DC_FN kiln_u32 kiln_dc_pack(kiln_u64 m, kiln_i32 e, kiln_i32 mb, kiln_i32 bias) {
  kiln_i32 msb = 63;
  while (!((m >> msb) & 1u)) msb--;
  const kiln_i32 ex = msb + e;                     /* the value is 1.f * 2^ex */
  const kiln_i32 biased = ex + bias;
  const kiln_i32 lsb = biased >= 1 ? ex - mb : 1 - bias - mb; /* the exponent of one unit in the last place */
  const kiln_i32 shift = lsb - e;                  /* bits of m below that unit */
  kiln_u64 q;
  if (shift <= 0) {
    q = m << (kiln_u32)(-shift);
  } else if (shift > 64) {
    q = 0; /* below a quarter of the smallest subnormal */
  } else if (shift == 64) {
    q = m > ((kiln_u64)1 << 63) ? 1u : 0u;
  } else {
    q = m >> (kiln_u32)shift;
    const kiln_u64 rest = m & ((((kiln_u64)1) << (kiln_u32)shift) - 1u);
    const kiln_u64 midway = ((kiln_u64)1) << (kiln_u32)(shift - 1);
    if (rest > midway || (rest == midway && (q & 1u))) q++;
  }
  /* A normal's q holds the implicit bit: adding (biased - 1) << mb carries a
   * rounding overflow (q == 2 << mb) into the exponent by itself; a
   * subnormal's q that rounds up to 1 << mb becomes the smallest normal. */
  const kiln_u64 inf = (kiln_u64)(2 * bias + 1) << (kiln_u32)mb;
  const kiln_u64 bits = biased >= 1 ? ((kiln_u64)(biased - 1) << (kiln_u32)mb) + q : q;
  return (kiln_u32)(bits >= inf ? inf : bits);
}

/* A double into a narrow format (mb, bias): sign, NaN (quiet, top payload
 * bits), inf and zero by hand, everything else through kiln_dc_pack. */
KILN_DC_FN kiln_u16 kiln_dc_narrow_f64(kiln_f64 x, kiln_i32 mb, kiln_i32 bias) {
  const kiln_u64 b = KILN_DC_BITS_OF_F64(x);
  const kiln_u32 sign = (kiln_u32)(b >> 63) << (kiln_u32)(mb + (bias == 15 ? 5 : 8));
  const kiln_u32 exp = (kiln_u32)(b >> 52) & 0x7ffu;
  const kiln_u64 frac = b & 0xfffffffffffffull;
  const kiln_u32 inf = (kiln_u32)(2 * bias + 1) << (kiln_u32)mb;
  if (exp == 0x7ffu) {
    if (frac == 0) return (kiln_u16)(sign | inf);
    return (kiln_u16)(sign | inf | (1u << (kiln_u32)(mb - 1)) | (kiln_u32)(frac >> (kiln_u32)(52 - mb)));
  }
  if (exp == 0 && frac == 0) return (kiln_u16)sign;
  const kiln_u64 m = exp ? (frac | 0x10000000000000ull) : frac;
  const kiln_i32 e = exp ? (kiln_i32)exp - 1075 : -1074;
  return (kiln_u16)(sign | kiln_dc_pack(m, e, mb, bias));
}

/* An int64 into a narrow format (mb, bias). */
KILN_DC_FN kiln_u16 kiln_dc_narrow_i64(kiln_i64 x, kiln_i32 mb, kiln_i32 bias) {
  if (x == 0) return 0;
  const kiln_u32 sign = x < 0 ? 1u << (kiln_u32)(mb + (bias == 15 ? 5 : 8)) : 0u;
  const kiln_u64 m = x < 0 ? (kiln_u64)0 - (kiln_u64)x : (kiln_u64)x;
  return (kiln_u16)(sign | kiln_dc_pack(m, 0, mb, bias));
}

/* ---- f16 and bf16 into f32 (exact) ---------------------------------------------- */

KILN_DC_FN kiln_f32 kiln_dc_f16_to_f32(kiln_u16 h) {
  const kiln_u32 sign = (kiln_u32)(h & 0x8000u) << 16;
  const kiln_u32 exp = (h >> 10) & 0x1fu;
  kiln_u32 frac = h & 0x3ffu;
  if (exp == 0x1fu) return KILN_DC_F32_OF_BITS(sign | 0x7f800000u | (frac << 13) | (frac ? 0x400000u : 0u));
  if (exp == 0) {
    if (frac == 0) return KILN_DC_F32_OF_BITS(sign);
    /* A subnormal: normalise it (exactly representable in f32). */
    kiln_i32 e = -14;
    while (!(frac & 0x400u)) {
      frac <<= 1;
      e--;
    }
    return KILN_DC_F32_OF_BITS(sign | ((kiln_u32)(e + 127) << 23) | ((frac & 0x3ffu) << 13));
  }
  return KILN_DC_F32_OF_BITS(sign | ((exp + 112u) << 23) | (frac << 13));
}

KILN_DC_FN kiln_f32 kiln_dc_bf16_to_f32(kiln_u16 h) {
  kiln_u32 b = (kiln_u32)h << 16;
  if ((b & 0x7f800000u) == 0x7f800000u && (b & 0x7fffffu)) b |= 0x400000u; /* a quiet NaN */
  return KILN_DC_F32_OF_BITS(b);
}

/* ---- loads into the carriers ------------------------------------------------------ */

KILN_DC_FN kiln_f64 kiln_dc_load_f32(kiln_f32 x) { return (kiln_f64)x; }
KILN_DC_FN kiln_f64 kiln_dc_load_f64(kiln_f64 x) { return x; }
KILN_DC_FN kiln_f64 kiln_dc_load_f16(kiln_u16 x) { return (kiln_f64)kiln_dc_f16_to_f32(x); }
KILN_DC_FN kiln_f64 kiln_dc_load_bf16(kiln_u16 x) { return (kiln_f64)kiln_dc_bf16_to_f32(x); }
KILN_DC_FN kiln_i64 kiln_dc_load_i8(kiln_i8 x) { return (kiln_i64)x; }
KILN_DC_FN kiln_i64 kiln_dc_load_u8(kiln_u8 x) { return (kiln_i64)x; }
KILN_DC_FN kiln_i64 kiln_dc_load_i16(kiln_i16 x) { return (kiln_i64)x; }
KILN_DC_FN kiln_i64 kiln_dc_load_i32(kiln_i32 x) { return (kiln_i64)x; }
KILN_DC_FN kiln_i64 kiln_dc_load_i64(kiln_i64 x) { return x; }
KILN_DC_FN kiln_i64 kiln_dc_load_b8(kiln_u8 x) { return x != 0; }

/* ---- stores from a double ------------------------------------------------------------ */

KILN_DC_FN kiln_f32 kiln_dc_f64_to_f32(kiln_f64 x) { return (kiln_f32)x; }
KILN_DC_FN kiln_f64 kiln_dc_f64_to_f64(kiln_f64 x) { return x; }
KILN_DC_FN kiln_u16 kiln_dc_f64_to_f16(kiln_f64 x) { return kiln_dc_narrow_f64(x, 10, 15); }
KILN_DC_FN kiln_u16 kiln_dc_f64_to_bf16(kiln_f64 x) { return kiln_dc_narrow_f64(x, 7, 127); }
KILN_DC_FN kiln_u8 kiln_dc_f64_to_b8(kiln_f64 x) { return x != 0.0; }

/* Toward zero, NaN -> 0, saturating at [lo, hi] (both exact in a double,
 * except 2^63 for i64's hi, which the comparison with >= handles). */
#define KILN_DC_F64_TO_INT_(NAME, T, LO, HI)                  \
  KILN_DC_FN T kiln_dc_f64_to_##NAME(kiln_f64 x) {            \
    if (x != x) return (T)0;                                  \
    if (x >= (kiln_f64)(HI)) return (T)(HI);                  \
    if (x <= (kiln_f64)(LO)) return (T)(LO);                  \
    return (T)x;                                              \
  }
KILN_DC_F64_TO_INT_(i8, kiln_i8, -128, 127)
KILN_DC_F64_TO_INT_(u8, kiln_u8, 0, 255)
KILN_DC_F64_TO_INT_(i16, kiln_i16, -32768, 32767)
KILN_DC_F64_TO_INT_(i32, kiln_i32, (-2147483647 - 1), 2147483647)
#undef KILN_DC_F64_TO_INT_
KILN_DC_FN kiln_i64 kiln_dc_f64_to_i64(kiln_f64 x) {
  if (x != x) return 0;
  if (x >= 9223372036854775808.0) return (kiln_i64)0x7fffffffffffffffll;
  if (x <= -9223372036854775808.0) return (kiln_i64)(-0x7fffffffffffffffll - 1);
  return (kiln_i64)x;
}

/* ---- stores from an int64 --------------------------------------------------------------- */

KILN_DC_FN kiln_f32 kiln_dc_i64_to_f32(kiln_i64 x) { return (kiln_f32)x; }
KILN_DC_FN kiln_f64 kiln_dc_i64_to_f64(kiln_i64 x) { return (kiln_f64)x; }
KILN_DC_FN kiln_u16 kiln_dc_i64_to_f16(kiln_i64 x) { return kiln_dc_narrow_i64(x, 10, 15); }
KILN_DC_FN kiln_u16 kiln_dc_i64_to_bf16(kiln_i64 x) { return kiln_dc_narrow_i64(x, 7, 127); }
KILN_DC_FN kiln_u8 kiln_dc_i64_to_b8(kiln_i64 x) { return x != 0; }
/* Modulo 2^bits: through the unsigned type, then reinterpreted. */
KILN_DC_FN kiln_i8 kiln_dc_i64_to_i8(kiln_i64 x) {
  const kiln_u8 u = (kiln_u8)(kiln_u64)x;
  return (kiln_i8)(u >= 0x80u ? (kiln_i32)u - 0x100 : (kiln_i32)u);
}
KILN_DC_FN kiln_u8 kiln_dc_i64_to_u8(kiln_i64 x) { return (kiln_u8)(kiln_u64)x; }
KILN_DC_FN kiln_i16 kiln_dc_i64_to_i16(kiln_i64 x) {
  const kiln_u16 u = (kiln_u16)(kiln_u64)x;
  return (kiln_i16)(u >= 0x8000u ? (kiln_i32)u - 0x10000 : (kiln_i32)u);
}
KILN_DC_FN kiln_i32 kiln_dc_i64_to_i32(kiln_i64 x) {
  const kiln_u32 u = (kiln_u32)(kiln_u64)x;
  return u >= 0x80000000u ? (kiln_i32)(u - 0x80000000u) + (-2147483647 - 1) : (kiln_i32)u;
}
KILN_DC_FN kiln_i64 kiln_dc_i64_to_i64(kiln_i64 x) { return x; }

/* ---- the dtypes as the conversions see them -------------------------------------------
 * X(ENUM, name, storage type, carrier: f64 or i64), in the order of
 * include/kiln/tensor.h's KILN_DTYPES (bool is `b8` here: `bool` is a macro
 * in C). A conversion from S to D is
 * kiln_dc_<carrier of S>_to_<D>(kiln_dc_load_<S>(x)). */
#define KILN_DC_DTYPES(X)                                                                            \
  X(F32, f32, kiln_f32, f64) X(I32, i32, kiln_i32, i64) X(F16, f16, kiln_u16, f64)                   \
  X(BF16, bf16, kiln_u16, f64) X(F64, f64, kiln_f64, f64) X(I64, i64, kiln_i64, i64)                 \
  X(I8, i8, kiln_i8, i64) X(U8, u8, kiln_u8, i64) X(I16, i16, kiln_i16, i64) X(BOOL, b8, kiln_u8, i64)

#endif /* KILN_KERNELS_DTYPE_CONVERT_H */
