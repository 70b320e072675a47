/* kernels/opencl/elementwise.cl: UNARY, BINARY and BINARY_SCALAR of every dtype, UNARY_BACKWARD for f32, expanded from kernels/ops.def (COMPARE and WHERE: select.cl). */
/* kiln-kinds: unary binary binary_scalar unary_backward */
/*
 * Kernel names: unary_<NAME>_<T>_<T>, binary_<NAME>_<T>_<T>,
 * binary_scalar_<NAME>_<T>_<T>, unary_backward_<NAME>_f32_f32. Inputs are strided views
 * of out's shape (stride 0 where broadcast); op.ndim 0 means all are
 * contiguous. One generic body per kind; a dtype is a row of the lists
 * below. f16 and bf16 are loaded into float, computed there and stored
 * rounded to nearest even (the rule of every backend: no half arithmetic);
 * f64 computes in double and exists only with cl_khr_fp64.
 */
/* Bit for bit with the CPU backend: no a*b+c contracted into an fma. */
#pragma OPENCL FP_CONTRACT OFF

/* The float dtypes: X(name, T storage, CT compute type, LOAD, STORE, SCALAR). */
#define KILN_CL_AS_IS_(x) (x)
#define KILN_CL_FLOATS_NO_F64_(X, ...)                                                             \
  X(f32, float, float, KILN_CL_AS_IS_, KILN_CL_AS_IS_, f32, __VA_ARGS__)                           \
  X(f16, ushort, float, KILN_CL_TO_F32_f16, KILN_CL_FROM_F32_f16, f32, __VA_ARGS__)                \
  X(bf16, ushort, float, KILN_CL_TO_F32_bf16, KILN_CL_FROM_F32_bf16, f32, __VA_ARGS__)
#ifdef KILN_CL_HAVE_FP64
#define KILN_CL_FLOATS_(X, ...)                                                                    \
  KILN_CL_FLOATS_NO_F64_(X, __VA_ARGS__) X(f64, double, double, KILN_CL_AS_IS_, KILN_CL_AS_IS_, value, __VA_ARGS__)
#else
#define KILN_CL_FLOATS_(X, ...) KILN_CL_FLOATS_NO_F64_(X, __VA_ARGS__)
#endif
/* The integer dtypes of the _INT formulas: X(name, IT, UT) (UT: unsigned,
 * at least 32 bits and IT's width). */
#define KILN_CL_INTS_(X, ...)                                                                      \
  X(i32, int, uint, __VA_ARGS__) X(i8, char, uint, __VA_ARGS__) X(u8, uchar, uint, __VA_ARGS__)     \
  X(i16, short, uint, __VA_ARGS__) X(i64, long, ulong, __VA_ARGS__)

/* The scalar operand: f32 for f32, f16 and bf16, the double for f64, and
 * the bits of the value in the dtype for the integers. */
#define KILN_CL_SCALAR_f32(s) ((s).f32)
#define KILN_CL_SCALAR_value(s) ((s).value)
#define KILN_CL_SCALAR_bits(s, IT) ((IT)(s).bits)

/* One body per kind over (storage T, compute CT, LOAD, STORE); the integer
 * rows pass T as CT and KILN_CL_AS_IS_ for both, and declare IT and UT. */
#define KILN_CL_UNARY_BODY_(T, CT, LOAD, STORE, expr)                                              \
  __global T *out = KILN_CL_OUT(T);                                                                \
  __global const T *in = KILN_CL_IN(T, 0);                                                         \
  if (op.ndim == 0) {                                                                              \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      const CT x = LOAD(in[i]);                                                                    \
      out[i] = STORE((CT)(expr));                                                                  \
    }                                                                                              \
    return;                                                                                        \
  }                                                                                                \
  KILN_FOR_EACH(i, op.n) {                                                                         \
    const CT x = LOAD(in[kiln_offset1(i, op.ndim, op.shape, op.in[0].strides)]);                   \
    out[i] = STORE((CT)(expr));                                                                    \
  }

#define KILN_CL_BINARY_BODY_(T, CT, OT, LOAD, STORE, expr)                                         \
  __global OT *out = KILN_CL_OUT(OT);                                                              \
  __global const T *in0 = KILN_CL_IN(T, 0), *in1 = KILN_CL_IN(T, 1);                               \
  if (op.ndim == 0) {                                                                              \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      const CT a = LOAD(in0[i]), b = LOAD(in1[i]);                                                 \
      out[i] = STORE(expr);                                                                        \
    }                                                                                              \
    return;                                                                                        \
  }                                                                                                \
  KILN_FOR_EACH(i, op.n) {                                                                         \
    long o0, o1;                                                                                   \
    kiln_offset2(i, op.ndim, op.shape, op.in[0].strides, op.in[1].strides, &o0, &o1);              \
    const CT a = LOAD(in0[o0]), b = LOAD(in1[o1]);                                                 \
    out[i] = STORE(expr);                                                                          \
  }

#define KILN_CL_SCALAR_BODY_(T, CT, LOAD, STORE, bvalue, expr)                                     \
  __global T *out = KILN_CL_OUT(T);                                                                \
  __global const T *in0 = KILN_CL_IN(T, 0);                                                        \
  const CT b = (bvalue);                                                                           \
  if (op.ndim == 0) {                                                                              \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      const CT a = LOAD(in0[i]);                                                                   \
      out[i] = STORE((CT)(expr));                                                                  \
    }                                                                                              \
    return;                                                                                        \
  }                                                                                                \
  KILN_FOR_EACH(i, op.n) {                                                                         \
    const CT a = LOAD(in0[kiln_offset1(i, op.ndim, op.shape, op.in[0].strides)]);                  \
    out[i] = STORE((CT)(expr));                                                                    \
  }

/* ---- f16 and bf16, eight elements a work-item ----
 * The contiguous path of the 16-bit rows (the host launches (n + 7) / 8
 * work-items then, as for the derivatives below): eight elements loaded as
 * a ushort8 and widened, the formula evaluated lane by lane on floats, the
 * results rounded to nearest even eight at a time, and work-item 0 also
 * takes the last n % 8 through the scalar conversions. The widening and the
 * rounding are written on whole vectors without branches (PoCL vectorises
 * them, where the scalar conversions' loops and branches run at a small
 * fraction of the memory's speed) and give the scalar conversions' bits:
 * - f16 -> float: a normal by rebiasing, a subnormal (at most 1023 units of
 *   2^-24) by an exact product, inf and NaN with the payload, made quiet;
 * - float -> f16: a normal rounded by integer addition (carries reach the
 *   exponent; past 65504 everything is inf), below 2^-14 by the float
 *   addition of 0.5, whose ulp there is 2^-24, the f16 subnormals' step (to
 *   nearest even, as the rounding mode is; an input flushed to zero rounds
 *   to zero in f16 anyway), a NaN keeping its sign and top payload bits, quiet;
 * - bf16 both ways: kernels/dtype_convert.h's shifts, on vectors.
 * f16 goes through vload_half8 / vstore_half8_rte, exact by the standard
 * (round to nearest even) and on PoCL compiled to F16C's conversions, with
 * the same NaN bits as the scalar conversions (checked over every pattern);
 * with KILN_CL_HALF_BUILTINS_ 0 the branch-free integer forms above. */
#ifndef KILN_CL_HALF_BUILTINS_
#define KILN_CL_HALF_BUILTINS_ 1
#endif
KILN_FN float8 kiln_cl_load8_f16(long v, __global const ushort *p) {
#if KILN_CL_HALF_BUILTINS_
  return vload_half8(v, (__global const half *)p);
#else
  const uint8 h = convert_uint8(vload8(v, p));
  const uint8 em = h & 0x7fffu, sign = (h & 0x8000u) << 16;
  const uint8 normal = (em << 13) + 0x38000000u;
  const uint8 special = (em << 13) | 0x7f800000u | (as_uint8(em > 0x7c00u) & 0x400000u);
  const uint8 sub = as_uint8(convert_float8(em) * 0x1p-24f);
  const uint8 bits = select(select(normal, special, as_int8(em >= 0x7c00u)), sub, as_int8(em < 0x400u));
  return as_float8(bits | sign);
#endif
}

KILN_FN void kiln_cl_store8_f16(float8 y, long v, __global ushort *p) {
#if KILN_CL_HALF_BUILTINS_
  vstore_half8_rte(y, v, (__global half *)p);
#else
  const uint8 u = as_uint8(y), a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
  const uint8 normal = min((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13, (uint8)0x7c00u);
  const uint8 sub = as_uint8(as_float8(a) + 0.5f) - 0x3f000000u;
  const uint8 nan = 0x7e00u | ((a >> 13) & 0x3ffu);
  const uint8 h = select(select(normal, sub, as_int8(a < 0x38800000u)), nan, as_int8(a > 0x7f800000u));
  vstore8(convert_ushort8(h | sign), v, p);
#endif
}

/* A signalling NaN is not made quiet here (kiln_dc_bf16_to_f32 does): every
 * result leaves through kiln_cl_store8_bf16, which makes a NaN quiet keeping
 * its sign and payload, and the formulas keep a NaN operand's sign and
 * payload whether it signals or not, so the stored bits are the same. */
KILN_FN float8 kiln_cl_load8_bf16(long v, __global const ushort *p) {
  return as_float8(convert_uint8(vload8(v, p)) << 16);
}

KILN_FN void kiln_cl_store8_bf16(float8 y, long v, __global ushort *p) {
  const uint8 u = as_uint8(y);
  const uint8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint8 h = select(rounded, (u >> 16) | 0x40u, as_int8((u & 0x7fffffffu) > 0x7f800000u));
  /* Where the eight are 16-byte aligned (a whole tensor's buffer, for one),
   * one vector store: PoCL splits vstore8 of ushort into eight. */
  __global ushort *q = p + v * 8;
  if (((ulong)q & 15u) == 0) *(__global ushort8 *)q = convert_ushort8(h);
  else vstore8(convert_ushort8(h), v, p);
}

/* The formula on lane k of x8 (unary), a8 and b8 (binary) into y. */
#define KILN_CL_LANE1_(k, expr)                                                                    \
  {                                                                                                \
    const float x = x8.s##k;                                                                       \
    y.s##k = (float)(expr);                                                                        \
  }
#define KILN_CL_LANE2_(k, expr)                                                                    \
  {                                                                                                \
    const float a = a8.s##k, b = b8.s##k;                                                          \
    y.s##k = (float)(expr);                                                                        \
  }
#define KILN_CL_LANES_(L, expr) L(0, expr) L(1, expr) L(2, expr) L(3, expr) L(4, expr) L(5, expr) L(6, expr) L(7, expr)

/* The contiguous eight-wide path for TN (f16, bf16; nothing for the others):
 * b8 from in1 (IN) or the scalar (SCALAR). */
#define KILN_CL_VEC8_UNARY_f32(expr)
#define KILN_CL_VEC8_UNARY_f64(expr)
#define KILN_CL_VEC8_BINARY_f32(B, expr)
#define KILN_CL_VEC8_BINARY_f64(B, expr)
#define KILN_CL_VEC8_UNARY_HALF_(TN, expr)                                                         \
  if (op.ndim == 0) {                                                                              \
    __global ushort *out = KILN_CL_OUT(ushort);                                                    \
    __global const ushort *in = KILN_CL_IN(ushort, 0);                                             \
    const long vectors = op.n / 8;                                                                 \
    KILN_FOR_EACH(v, vectors) {                                                                    \
      const float8 x8 = kiln_cl_load8_##TN(v, in);                                                 \
      float8 y;                                                                                    \
      KILN_CL_LANES_(KILN_CL_LANE1_, expr)                                                         \
      kiln_cl_store8_##TN(y, v, out);                                                              \
    }                                                                                              \
    if (get_global_id(0) == 0)                                                                     \
      for (long i = vectors * 8; i < op.n; i++) {                                                  \
        const float x = KILN_CL_TO_F32_##TN(in[i]);                                                \
        out[i] = KILN_CL_FROM_F32_##TN((float)(expr));                                             \
      }                                                                                            \
    return;                                                                                        \
  }
#define KILN_CL_VEC8_UNARY_f16(expr) KILN_CL_VEC8_UNARY_HALF_(f16, expr)
#define KILN_CL_VEC8_UNARY_bf16(expr) KILN_CL_VEC8_UNARY_HALF_(bf16, expr)
#define KILN_CL_B8_IN_(TN) kiln_cl_load8_##TN(v, KILN_CL_IN(ushort, 1))
#define KILN_CL_B1_IN_(TN) KILN_CL_TO_F32_##TN(KILN_CL_IN(ushort, 1)[i])
#define KILN_CL_B8_SCALAR_(TN) ((float8)(op.u.binary.scalar.f32))
#define KILN_CL_B1_SCALAR_(TN) (op.u.binary.scalar.f32)
#define KILN_CL_VEC8_BINARY_HALF_(TN, B, expr)                                                     \
  if (op.ndim == 0) {                                                                              \
    __global ushort *out = KILN_CL_OUT(ushort);                                                    \
    __global const ushort *in0 = KILN_CL_IN(ushort, 0);                                            \
    const long vectors = op.n / 8;                                                                 \
    KILN_FOR_EACH(v, vectors) {                                                                    \
      const float8 a8 = kiln_cl_load8_##TN(v, in0), b8 = KILN_CL_B8_##B##_(TN);                    \
      float8 y;                                                                                    \
      KILN_CL_LANES_(KILN_CL_LANE2_, expr)                                                         \
      kiln_cl_store8_##TN(y, v, out);                                                              \
    }                                                                                              \
    if (get_global_id(0) == 0)                                                                     \
      for (long i = vectors * 8; i < op.n; i++) {                                                  \
        const float a = KILN_CL_TO_F32_##TN(in0[i]), b = KILN_CL_B1_##B##_(TN);                    \
        out[i] = KILN_CL_FROM_F32_##TN((float)(expr));                                             \
      }                                                                                            \
    return;                                                                                        \
  }
#define KILN_CL_VEC8_BINARY_f16(B, expr) KILN_CL_VEC8_BINARY_HALF_(f16, B, expr)
#define KILN_CL_VEC8_BINARY_bf16(B, expr) KILN_CL_VEC8_BINARY_HALF_(bf16, B, expr)

/* ---- the _FLOAT and _INT formulas ---- */
#define KILN_CL_UNARY_F_(TN, T, CT, LOAD, STORE, SC, NAME, expr)                                   \
  KILN_CL_KERNEL(unary_##NAME##_##TN##_##TN) {                                                     \
    KILN_CL_VEC8_UNARY_##TN(expr)                                                                  \
    KILN_CL_UNARY_BODY_(T, CT, LOAD, STORE, expr)                                                  \
  }
#define KILN_CL_BINARY_F_(TN, T, CT, LOAD, STORE, SC, NAME, expr)                                  \
  KILN_CL_KERNEL(binary_##NAME##_##TN##_##TN) {                                                    \
    KILN_CL_VEC8_BINARY_##TN(IN, expr)                                                             \
    KILN_CL_BINARY_BODY_(T, CT, T, LOAD, STORE, (CT)(expr))                                        \
  }                                                                                                \
  KILN_CL_KERNEL(binary_scalar_##NAME##_##TN##_##TN) {                                             \
    KILN_CL_VEC8_BINARY_##TN(SCALAR, expr)                                                         \
    KILN_CL_SCALAR_BODY_(T, CT, LOAD, STORE, (CT)KILN_CL_SCALAR_##SC(op.u.binary.scalar), expr)    \
  }
#define KILN_CL_UNARY_I_(TN, IT_, UT_, NAME, expr)                                                 \
  KILN_CL_KERNEL(unary_##NAME##_##TN##_##TN) {                                                     \
    typedef IT_ IT;                                                                                \
    typedef UT_ UT;                                                                                \
    KILN_CL_UNARY_BODY_(IT, IT, KILN_CL_AS_IS_, KILN_CL_AS_IS_, expr)                              \
  }
#define KILN_CL_BINARY_I_(TN, IT_, UT_, NAME, expr)                                                \
  KILN_CL_KERNEL(binary_##NAME##_##TN##_##TN) {                                                    \
    typedef IT_ IT;                                                                                \
    typedef UT_ UT;                                                                                \
    KILN_CL_BINARY_BODY_(IT, IT, IT, KILN_CL_AS_IS_, KILN_CL_AS_IS_, (IT)(expr))                   \
  }                                                                                                \
  KILN_CL_KERNEL(binary_scalar_##NAME##_##TN##_##TN) {                                             \
    typedef IT_ IT;                                                                                \
    typedef UT_ UT;                                                                                \
    KILN_CL_SCALAR_BODY_(IT, IT, KILN_CL_AS_IS_, KILN_CL_AS_IS_, KILN_CL_SCALAR_bits(op.u.binary.scalar, IT), expr) \
  }

/* dy * f'(x): the derivative written under each unary formula; x and dy
 * walk like a binary op's two inputs. The contiguous path takes eight
 * elements a work-item (the host launches (n + 7) / 8 of them then): the
 * formula evaluated on float8 (a comparison's vector ?: is a select), and
 * work-item 0 also takes the last n % 8 one by one. A driver that
 * vectorises across work-items (PoCL) does not through the grid-stride loop,
 * and the scalar loop it leaves runs at a fraction of the memory's speed. */
#define KILN_CL_UNARY_GRAD_(NAME, expr)                                                            \
  KILN_CL_KERNEL(unary_backward_##NAME##_f32_f32) {                                                \
    __global float *out = KILN_CL_OUT(float);                                                      \
    __global const float *xs = KILN_CL_IN(float, 0), *dys = KILN_CL_IN(float, 1);                  \
    const long n = op.n;                                                                           \
    if (op.ndim == 0) {                                                                            \
      const long vectors = n / 8;                                                                  \
      KILN_FOR_EACH(v, vectors) {                                                                  \
        const float8 x = vload8(v, xs), dy = vload8(v, dys);                                       \
        vstore8((expr), v, out);                                                                   \
      }                                                                                            \
      if (get_global_id(0) == 0)                                                                   \
        for (long i = vectors * 8; i < n; i++) {                                                   \
          const float x = xs[i], dy = dys[i];                                                      \
          out[i] = (expr);                                                                         \
        }                                                                                          \
      return;                                                                                      \
    }                                                                                              \
    KILN_FOR_EACH(i, n) {                                                                          \
      long o0, o1;                                                                                 \
      kiln_offset2(i, op.ndim, op.shape, op.in[0].strides, op.in[1].strides, &o0, &o1);            \
      const float x = xs[o0], dy = dys[o1];                                                        \
      out[i] = (expr);                                                                             \
    }                                                                                              \
  }

#define KILN_UNARY_FLOAT(NAME, expr) KILN_CL_FLOATS_(KILN_CL_UNARY_F_, NAME, expr)
#define KILN_UNARY_INT(NAME, expr) KILN_CL_INTS_(KILN_CL_UNARY_I_, NAME, expr)
#define KILN_BINARY_FLOAT(NAME, expr) KILN_CL_FLOATS_(KILN_CL_BINARY_F_, NAME, expr)
#define KILN_BINARY_INT(NAME, expr) KILN_CL_INTS_(KILN_CL_BINARY_I_, NAME, expr)
#define KILN_UNARY_GRAD_FLOAT(NAME, expr) KILN_CL_UNARY_GRAD_(NAME, expr)
#include "ops.def"

