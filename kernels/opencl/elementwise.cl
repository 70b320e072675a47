/* kernels/opencl/elementwise.cl: UNARY, BINARY and BINARY_SCALAR for f32 and i32, and UNARY_BACKWARD for f32, expanded from kernels/ops.def. */
/*
 * Kernel names: unary_<f32|i32>_<NAME>, binary_<f32|i32>_<NAME>,
 * binary_scalar_<f32|i32>_<NAME>, unary_grad_f32_<NAME>. Inputs are strided
 * views of the output's shape (stride 0 where broadcast); ndim 0 means all
 * are contiguous.
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

/* dy * f'(x): the derivative written under each unary formula; x and dy
 * walk like a binary op's two inputs. The contiguous path takes eight
 * elements a work-item (the host launches (n + 7) / 8 of them then): the
 * formula evaluated on float8 (a comparison's vector ?: is a select), and
 * work-item 0 also takes the last n % 8 one by one. A driver that
 * vectorises across work-items (PoCL) does not through the grid-stride loop,
 * and the scalar loop it leaves runs at a fraction of the memory's speed. */
#define KILN_CL_UNARY_GRAD_(NAME, expr)                                                            \
  __kernel void unary_grad_f32_##NAME(__global float *out, long out_off, __global const float *xs, long x_off,   \
                                      __global const float *dys, long dy_off, long n, int ndim,    \
                                      KILN_DIMS_PARAMS(dim_), KILN_DIMS_PARAMS(sa_), KILN_DIMS_PARAMS(sb_)) { \
    out += out_off;                                                                                \
    xs += x_off;                                                                                   \
    dys += dy_off;                                                                                 \
    if (ndim == 0) {                                                                               \
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
    const long shape[8] = KILN_DIMS_ARRAY(dim_), s0[8] = KILN_DIMS_ARRAY(sa_), s1[8] = KILN_DIMS_ARRAY(sb_); \
    KILN_FOR_EACH(i, n) {                                                                          \
      long o0, o1;                                                                                 \
      kiln_offset2(i, ndim, shape, s0, s1, &o0, &o1);                                              \
      const float x = xs[o0], dy = dys[o1];                                                        \
      out[i] = (expr);                                                                             \
    }                                                                                              \
  }

#define KILN_UNARY_F32(NAME, expr) KILN_CL_UNARY_(float, f32, NAME, expr)
#define KILN_UNARY_I32(NAME, expr) KILN_CL_UNARY_(int, i32, NAME, expr)
#define KILN_BINARY_F32(NAME, expr) KILN_CL_BINARY_(float, f32, NAME, expr)
#define KILN_BINARY_I32(NAME, expr) KILN_CL_BINARY_(int, i32, NAME, expr)
#define KILN_UNARY_GRAD_F32(NAME, expr) KILN_CL_UNARY_GRAD_(NAME, expr)
#include "ops.def"
