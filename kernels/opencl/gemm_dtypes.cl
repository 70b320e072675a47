/* kernels/opencl/gemm_dtypes.cl: MATMUL and CONV2D in f64, f16 and bf16: one direct kernel per op, written once and instantiated per dtype from its storage type, compute type, load and store. */
/*
 * Numerics (the rule of every backend): f16 and bf16 are stored as their 16
 * bits, widened to f32 exactly (prelude.cl's KILN_CL_TO_F32_<d>), the
 * products summed in f32, and the sum (with the bias, for conv2d) rounded
 * once to nearest even into the dtype (KILN_CL_FROM_F32_<d>, the CPU's
 * bits). f64 computes in double and exists only where the device has
 * cl_khr_fp64 (KILN_CL_HAVE_FP64): backends/opencl/gemm.c refuses f64 on
 * other devices before any launch, naming the device and the extension.
 *
 * f32 keeps gemm.cl's packed and tiled GEMMs and conv.cl's im2col. These
 * kernels are direct: one work-item per element of the result, its sum
 * over k (over channel, tap row, tap column for conv2d) in order. Correct
 * for every size, transpose, batch broadcast and offset, and small enough
 * that PoCL compiles the program in seconds; not fast (the tuned 16-bit
 * and f64 paths are later work).
 *
 * Kernel names `<op>_<in dtype>_<out dtype>`: matmul_f16_f16,
 * conv2d_bf16_bf16, ...; every operand has the one dtype (the core
 * promotes before dispatch).
 *
 * matmul_<d>_<d>: the GEMM from op.plan.gemm (C in out's place, A in
 * in[0]'s, B in in[1]'s, element offsets a_off, b_off, c_off: the host
 * advances them per launch of at most 65535 batches); global (n, m,
 * batches), rounded up (the kernel checks).
 * conv2d_<d>_<d>: NCHW x in in[0]'s place, weight [K, C, R, S] in in[1]'s,
 * the bias [K] in in[2]'s when op.u.conv2d.has_bias, every operand
 * contiguous from its own offset; grid-stride over the N*K*P*Q outputs.
 */

/* A value's load into the compute type, and the compute type's store. */
#define KILN_DT_LOAD_f16(x) KILN_CL_TO_F32_f16(x)
#define KILN_DT_LOAD_bf16(x) KILN_CL_TO_F32_bf16(x)
#define KILN_DT_STORE_f16(x) KILN_CL_FROM_F32_f16(x)
#define KILN_DT_STORE_bf16(x) KILN_CL_FROM_F32_bf16(x)
#define KILN_DT_LOAD_f64(x) (x)
#define KILN_DT_STORE_f64(x) (x)

#define KILN_GEMM_DTYPE_KERNELS(d, ST, CT)                                                         \
  KILN_CL_KERNEL(matmul_##d##_##d) {                                                               \
    const long m = op.plan.gemm.m, n = op.plan.gemm.n, k = op.plan.gemm.k;                         \
    const long lda = op.plan.gemm.lda, ldb = op.plan.gemm.ldb, ldc = op.plan.gemm.ldc;             \
    const long j = (long)get_global_id(0), i = (long)get_global_id(1);                             \
    const long batch = (long)get_global_id(2);                                                     \
    if (i >= m || j >= n) return;                                                                  \
    __global const ST *ap = (__global const ST *)in0_ + op.plan.gemm.a_off +                       \
                            batch * op.plan.gemm.stride_a + (op.plan.gemm.trans_a ? i : i * lda);  \
    __global const ST *bp = (__global const ST *)in1_ + op.plan.gemm.b_off +                       \
                            batch * op.plan.gemm.stride_b + (op.plan.gemm.trans_b ? j * ldb : j);  \
    const long a_step = op.plan.gemm.trans_a ? lda : 1, b_step = op.plan.gemm.trans_b ? 1 : ldb;   \
    CT acc = (CT)0;                                                                                \
    for (long l = 0; l < k; l++) acc += KILN_DT_LOAD_##d(ap[l * a_step]) * KILN_DT_LOAD_##d(bp[l * b_step]); \
    __global ST *c = (__global ST *)out_ + op.plan.gemm.c_off + batch * op.plan.gemm.stride_c;      \
    c[i * ldc + j] = KILN_DT_STORE_##d(acc);                                                       \
  }                                                                                                \
  KILN_CL_KERNEL(conv2d_##d##_##d) {                                                               \
    __global const ST *x = KILN_CL_IN(ST, 0);                                                      \
    __global const ST *wt = KILN_CL_IN(ST, 1);                                                     \
    __global ST *y = KILN_CL_OUT(ST);                                                              \
    const long n = op.u.conv2d.n, c = op.u.conv2d.c, h = op.u.conv2d.h, w = op.u.conv2d.w;         \
    const long kk = op.u.conv2d.k, r = op.u.conv2d.r, s = op.u.conv2d.s;                           \
    const long p = op.u.conv2d.p, q = op.u.conv2d.q;                                               \
    const long stride_h = op.u.conv2d.stride[0], stride_w = op.u.conv2d.stride[1];                 \
    const long pad_h = op.u.conv2d.pad[0], pad_w = op.u.conv2d.pad[1];                             \
    const long dil_h = op.u.conv2d.dil[0], dil_w = op.u.conv2d.dil[1];                             \
    KILN_FOR_EACH(at, n * kk * p * q) {                                                            \
      const long pos = kiln_udiv(at, q), qq = at - pos * q;                                        \
      const long plane = kiln_udiv(pos, p), pp = pos - plane * p;                                  \
      const long img = kiln_udiv(plane, kk), f = plane - img * kk;                                 \
      CT acc = (CT)0;                                                                              \
      for (long ch = 0; ch < c; ch++) {                                                            \
        __global const ST *xc = x + (img * c + ch) * h * w;                                        \
        __global const ST *wc = wt + (f * c + ch) * r * s;                                         \
        for (long ri = 0; ri < r; ri++) {                                                          \
          const long hh = pp * stride_h - pad_h + ri * dil_h;                                      \
          if (hh < 0 || hh >= h) continue;                                                         \
          for (long si = 0; si < s; si++) {                                                        \
            const long ww = qq * stride_w - pad_w + si * dil_w;                                    \
            if (ww < 0 || ww >= w) continue;                                                       \
            acc += KILN_DT_LOAD_##d(xc[hh * w + ww]) * KILN_DT_LOAD_##d(wc[ri * s + si]);          \
          }                                                                                        \
        }                                                                                          \
      }                                                                                            \
      if (op.u.conv2d.has_bias) acc += KILN_DT_LOAD_##d(((__global const ST *)in2_)[op.in[2].offset + f]); \
      y[at] = KILN_DT_STORE_##d(acc);                                                              \
    }                                                                                              \
  }

KILN_GEMM_DTYPE_KERNELS(f16, ushort, float)
KILN_GEMM_DTYPE_KERNELS(bf16, ushort, float)
#ifdef KILN_CL_HAVE_FP64
KILN_GEMM_DTYPE_KERNELS(f64, double, double)
#endif
