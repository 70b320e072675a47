/* kernels/opencl/elementwise.cl: UNARY, BINARY and BINARY_SCALAR for f32 and i32, and UNARY_BACKWARD for f32, expanded from kernels/ops.def; WHERE. */
/* kiln-kinds: unary binary binary_scalar unary_backward where */
/*
 * Kernel names: unary_<NAME>_<T>_<T>, binary_<NAME>_<T>_<T>,
 * binary_scalar_<NAME>_<T>_<T>, unary_backward_<NAME>_f32_f32, T the dtype
 * (f32, i32). Inputs are strided views of out's shape (stride 0 where
 * broadcast); op.ndim 0 means all are contiguous. One generic body per kind
 * over (T, dtype name); a dtype is a line of instantiations below.
 */

/* The binary scalar in each dtype, as the core converted it. */
#define KILN_CL_SCALAR_f32(s) ((s).f32)
#define KILN_CL_SCALAR_i32(s) ((s).i32)

#define KILN_CL_UNARY_(T, TN, NAME, expr)                                                          \
  KILN_CL_KERNEL(unary_##NAME##_##TN##_##TN) {                                                     \
    typedef T IT;                                                                                  \
    typedef uint UT;                                                                               \
    __global T *out = KILN_CL_OUT(T);                                                              \
    __global const T *in = KILN_CL_IN(T, 0);                                                       \
    if (op.ndim == 0) {                                                                            \
      KILN_FOR_EACH(i, op.n) {                                                                     \
        const T x = in[i];                                                                         \
        out[i] = (expr);                                                                           \
      }                                                                                            \
      return;                                                                                      \
    }                                                                                              \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      const T x = in[kiln_offset1(i, op.ndim, op.shape, op.in[0].strides)];                        \
      out[i] = (expr);                                                                             \
    }                                                                                              \
  }

#define KILN_CL_BINARY_(T, TN, NAME, expr)                                                         \
  KILN_CL_KERNEL(binary_##NAME##_##TN##_##TN) {                                                    \
    typedef T IT;                                                                                  \
    typedef uint UT;                                                                               \
    __global T *out = KILN_CL_OUT(T);                                                              \
    __global const T *in0 = KILN_CL_IN(T, 0), *in1 = KILN_CL_IN(T, 1);                             \
    if (op.ndim == 0) {                                                                            \
      KILN_FOR_EACH(i, op.n) {                                                                     \
        const T a = in0[i], b = in1[i];                                                            \
        out[i] = (expr);                                                                           \
      }                                                                                            \
      return;                                                                                      \
    }                                                                                              \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      long o0, o1;                                                                                 \
      kiln_offset2(i, op.ndim, op.shape, op.in[0].strides, op.in[1].strides, &o0, &o1);            \
      const T a = in0[o0], b = in1[o1];                                                            \
      out[i] = (expr);                                                                             \
    }                                                                                              \
  }                                                                                                \
  KILN_CL_KERNEL(binary_scalar_##NAME##_##TN##_##TN) {                                             \
    typedef T IT;                                                                                  \
    typedef uint UT;                                                                               \
    __global T *out = KILN_CL_OUT(T);                                                              \
    __global const T *in0 = KILN_CL_IN(T, 0);                                                      \
    const T b = KILN_CL_SCALAR_##TN(op.u.binary.scalar);                                           \
    if (op.ndim == 0) {                                                                            \
      KILN_FOR_EACH(i, op.n) {                                                                     \
        const T a = in0[i];                                                                        \
        out[i] = (expr);                                                                           \
      }                                                                                            \
      return;                                                                                      \
    }                                                                                              \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      const T a = in0[kiln_offset1(i, op.ndim, op.shape, op.in[0].strides)];                       \
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

#define KILN_UNARY_FLOAT(NAME, expr) KILN_CL_UNARY_(float, f32, NAME, expr)
#define KILN_UNARY_INT(NAME, expr) KILN_CL_UNARY_(int, i32, NAME, expr)
#define KILN_BINARY_FLOAT(NAME, expr) KILN_CL_BINARY_(float, f32, NAME, expr)
#define KILN_BINARY_INT(NAME, expr) KILN_CL_BINARY_(int, i32, NAME, expr)
#define KILN_UNARY_GRAD_FLOAT(NAME, expr) KILN_CL_UNARY_GRAD_(NAME, expr)
#include "ops.def"

/* WHERE: out = cond != 0 ? a : b (NaN is nonzero, -0.0 is not), the
 * condition read as TC, the values copied as their 32-bit patterns (so the
 * value dtype only names the kernel); the three walk out's shape by their
 * strides. Kernel where_<cond dtype>_<out dtype>. */
#define KILN_CL_WHERE_(TC, TCN, TN)                                                                \
  KILN_CL_KERNEL(where_##TCN##_##TN) {                                                             \
    __global uint *out = KILN_CL_OUT(uint);                                                        \
    __global const TC *c = KILN_CL_IN(TC, 0);                                                      \
    __global const uint *a = KILN_CL_IN(uint, 1), *b = KILN_CL_IN(uint, 2);                        \
    if (op.ndim == 0) {                                                                            \
      KILN_FOR_EACH(i, op.n) out[i] = c[i] != 0 ? a[i] : b[i];                                     \
      return;                                                                                      \
    }                                                                                              \
    KILN_FOR_EACH(i, op.n) {                                                                       \
      long oc, oa;                                                                                 \
      kiln_offset2(i, op.ndim, op.shape, op.in[0].strides, op.in[1].strides, &oc, &oa);            \
      const long ob = kiln_offset1(i, op.ndim, op.shape, op.in[2].strides);                        \
      out[i] = c[oc] != 0 ? a[oa] : b[ob];                                                         \
    }                                                                                              \
  }
KILN_CL_WHERE_(float, f32, f32)
KILN_CL_WHERE_(float, f32, i32)
KILN_CL_WHERE_(int, i32, f32)
KILN_CL_WHERE_(int, i32, i32)
#undef KILN_CL_WHERE_
