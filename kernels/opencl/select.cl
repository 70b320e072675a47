/* kernels/opencl/select.cl: COMPARE of every dtype (kernels/ops.def's KILN_COMPARE rows) and WHERE of every pair; a program of its own, so that a process using neither does not build them. */
/* kiln-kinds: compare where */
/* Bit for bit with the CPU backend: no a*b+c contracted into an fma. */
#pragma OPENCL FP_CONTRACT OFF

#define KILN_CL_AS_IS_(x) (x)

/* a and b read as CT from two strided inputs of out's shape, out[i] = expr
 * (elementwise.cl's binary walk). */
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


/* ---- COMPARE: compare_<NAME>_<T>_bool, a and b in T's compute type
 * (f32 for f16 and bf16; bool as its byte 0/1), out 1 or 0. Every dtype of
 * prelude.cl's list, read through KILN_CL_CMP_LOAD_<name>. */
#define KILN_CL_CMP_LOAD_f32(x) (x)
#define KILN_CL_CMP_LOAD_f64(x) (x)
#define KILN_CL_CMP_LOAD_f16(x) kiln_dc_f16_to_f32(x)
#define KILN_CL_CMP_LOAD_bf16(x) kiln_dc_bf16_to_f32(x)
#define KILN_CL_CMP_LOAD_i32(x) (x)
#define KILN_CL_CMP_LOAD_i64(x) (x)
#define KILN_CL_CMP_LOAD_i8(x) (x)
#define KILN_CL_CMP_LOAD_u8(x) (x)
#define KILN_CL_CMP_LOAD_i16(x) (x)
#define KILN_CL_CMP_LOAD_bool(x) ((x) != 0)
#define KILN_CL_CMP_ONE_(name, dc, T, BITS, CLASS, NAME, expr)                                     \
  KILN_CL_KERNEL(compare_##NAME##_##name##_bool) {                                                 \
    KILN_CL_BINARY_BODY_(T, KILN_CL_CT_##name, uchar, KILN_CL_CMP_LOAD_##name, KILN_CL_AS_IS_,      \
                         (uchar)((expr) ? 1 : 0))                                                  \
  }
#define KILN_CL_CT_f32 float
#define KILN_CL_CT_f64 double
#define KILN_CL_CT_f16 float
#define KILN_CL_CT_bf16 float
#define KILN_CL_CT_i32 int
#define KILN_CL_CT_i64 long
#define KILN_CL_CT_i8 char
#define KILN_CL_CT_u8 uchar
#define KILN_CL_CT_i16 short
#define KILN_CL_CT_bool int
#define KILN_COMPARE(NAME, expr)                                                                   \
  KILN_CL_DTYPES_TO_(KILN_CL_CMP_FORMULA_, NAME, expr, x, x, x)
#define KILN_CL_CMP_FORMULA_(NAME, expr, x1, x2, x3, name, dc, T, BITS, CLASS)                     \
  KILN_CL_CMP_ONE_(name, dc, T, BITS, CLASS, NAME, expr)
#include "ops.def"

/* ---- WHERE: out = cond != 0 ? a : b (NaN is nonzero, -0.0 is not), the
 * condition of any dtype, the values moved as their bits (so the value
 * dtype only names the kernel); the three walk out's shape by their
 * strides. Kernel where_<cond dtype>_<out dtype>. */
#define KILN_CL_NONZERO_f32(x) ((x) != 0.0f)
#define KILN_CL_NONZERO_f64(x) ((x) != 0.0)
#define KILN_CL_NONZERO_f16(x) (((x) & 0x7fffu) != 0)
#define KILN_CL_NONZERO_bf16(x) (((x) & 0x7fffu) != 0)
#define KILN_CL_NONZERO_i32(x) ((x) != 0)
#define KILN_CL_NONZERO_i64(x) ((x) != 0)
#define KILN_CL_NONZERO_i8(x) ((x) != 0)
#define KILN_CL_NONZERO_u8(x) ((x) != 0)
#define KILN_CL_NONZERO_i16(x) ((x) != 0)
#define KILN_CL_NONZERO_bool(x) ((x) != 0)
#define KILN_CL_WHERE_(cn, cdc, CT, CB, CC, name, dc, T, BITS, CLASS)                              \
  KILN_CL_KERNEL(where_##cn##_##name) {                                                            \
    __global BITS *out = KILN_CL_OUT(BITS);                                                        \
    __global const CT *c = KILN_CL_IN(CT, 0);                                                      \
    __global const BITS *a = KILN_CL_IN(BITS, 1), *b = KILN_CL_IN(BITS, 2);                        \
    if (op.ndim == 0) {                                                                            \
      KILN_FOR_EACH(i, op.n) out[i] = KILN_CL_NONZERO_##cn(c[i]) ? a[i] : b[i];                    \
      return;                                                                                      \
    }                                                                                              \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      long oc, oa;                                                                                 \
      kiln_offset2(i, op.ndim, op.shape, op.in[0].strides, op.in[1].strides, &oc, &oa);            \
      const long ob = kiln_offset1(i, op.ndim, op.shape, op.in[2].strides);                        \
      out[i] = KILN_CL_NONZERO_##cn(c[oc]) ? a[oa] : b[ob];                                        \
    }                                                                                              \
  }
#define KILN_CL_WHERE_FROM_(cn, cdc, CT, CB, CC) KILN_CL_DTYPES_TO_(KILN_CL_WHERE_, cn, cdc, CT, CB, CC)
KILN_CL_DTYPES(KILN_CL_WHERE_FROM_)
#undef KILN_CL_WHERE_FROM_
#undef KILN_CL_WHERE_
