/* kernels/opencl/elementwise.cl: UNARY, BINARY and BINARY_SCALAR for f32 and i32, expanded from kernels/ops.def. */
/*
 * Kernel names: unary_<f32|i32>_<NAME>, binary_<f32|i32>_<NAME>,
 * binary_scalar_<f32|i32>_<NAME>. Inputs are strided views of the output's
 * shape (stride 0 where broadcast); ndim 0 means all are contiguous.
 */

#define KILN_CL_UNARY_(T, TNAME, NAME, expr)                                                       \
  __kernel void unary_##TNAME##_##NAME(__global T *out, long out_off, __global const T *in, long in_off, long n, \
                                       int ndim, KILN_DIMS_PARAMS(dim_), KILN_DIMS_PARAMS(sa_)) {        \
    out += out_off;                                                                                \
    in += in_off;                                                                                  \
    if (ndim == 0) {                                                                               \
      KILN_FOR_EACH(i, n) {                                                                        \
        const T x = in[i];                                                                         \
        out[i] = (expr);                                                                           \
      }                                                                                            \
      return;                                                                                      \
    }                                                                                              \
    const long shape[8] = KILN_DIMS_ARRAY(dim_), stride[8] = KILN_DIMS_ARRAY(sa_);                      \
    KILN_FOR_EACH(i, n) {                                                                          \
      const T x = in[kiln_offset1(i, ndim, shape, stride)];                                        \
      out[i] = (expr);                                                                             \
    }                                                                                              \
  }

#define KILN_CL_BINARY_(T, TNAME, NAME, expr)                                                      \
  __kernel void binary_##TNAME##_##NAME(__global T *out, long out_off, __global const T *in0, long in0_off,     \
                                        __global const T *in1, long in1_off, long n, int ndim,      \
                                        KILN_DIMS_PARAMS(dim_), KILN_DIMS_PARAMS(sa_), KILN_DIMS_PARAMS(sb_)) { \
    out += out_off;                                                                                \
    in0 += in0_off;                                                                                \
    in1 += in1_off;                                                                                \
    if (ndim == 0) {                                                                               \
      KILN_FOR_EACH(i, n) {                                                                        \
        const T a = in0[i], b = in1[i];                                                            \
        out[i] = (expr);                                                                           \
      }                                                                                            \
      return;                                                                                      \
    }                                                                                              \
    const long shape[8] = KILN_DIMS_ARRAY(dim_), s0[8] = KILN_DIMS_ARRAY(sa_), s1[8] = KILN_DIMS_ARRAY(sb_); \
    KILN_FOR_EACH(i, n) {                                                                          \
      long o0, o1;                                                                                 \
      kiln_offset2(i, ndim, shape, s0, s1, &o0, &o1);                                              \
      const T a = in0[o0], b = in1[o1];                                                            \
      out[i] = (expr);                                                                             \
    }                                                                                              \
  }                                                                                                \
  __kernel void binary_scalar_##TNAME##_##NAME(__global T *out, long out_off, __global const T *in0, long in0_off, \
                                               T b, long n, int ndim, KILN_DIMS_PARAMS(dim_), KILN_DIMS_PARAMS(sa_)) { \
    out += out_off;                                                                                \
    in0 += in0_off;                                                                                \
    if (ndim == 0) {                                                                               \
      KILN_FOR_EACH(i, n) {                                                                        \
        const T a = in0[i];                                                                        \
        out[i] = (expr);                                                                           \
      }                                                                                            \
      return;                                                                                      \
    }                                                                                              \
    const long shape[8] = KILN_DIMS_ARRAY(dim_), s0[8] = KILN_DIMS_ARRAY(sa_);                          \
    KILN_FOR_EACH(i, n) {                                                                          \
      const T a = in0[kiln_offset1(i, ndim, shape, s0)];                                           \
      out[i] = (expr);                                                                             \
    }                                                                                              \
  }

#define KILN_UNARY_F32(NAME, expr) KILN_CL_UNARY_(float, f32, NAME, expr)
#define KILN_UNARY_I32(NAME, expr) KILN_CL_UNARY_(int, i32, NAME, expr)
#define KILN_BINARY_F32(NAME, expr) KILN_CL_BINARY_(float, f32, NAME, expr)
#define KILN_BINARY_I32(NAME, expr) KILN_CL_BINARY_(int, i32, NAME, expr)
#include "ops.def"
