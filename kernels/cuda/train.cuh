/* kernels/cuda/train.cuh: the training kernels: unary, softmax, cross-entropy, convolution and max-pooling gradients, and the fused updates in place. */
/*
 * Included once, by kiln.cu, after its helpers (KILN_KERNEL, KILN_FOR_EACH,
 * kiln_offsets, kiln_max_nan, kiln_block_max, kiln_block_sum). The formulas
 * are backend.h's (kiln_op_t) and the CPU backend's: a gradient that only
 * moves dy (relu, abs, neg, max pooling) gives the CPU's bits, and so do the
 * updates, whose arithmetic is written with explicitly rounded operations
 * (__fmul_rn, __fadd_rn, __fsub_rn) so that nvcc fuses no multiply-add into
 * them: a fused one would round once where the CPU rounds twice. (Division
 * and sqrtf are IEEE's, correctly rounded, without --use_fast_math.)
 *
 * No kernel here writes one place from two threads: the convolution's
 * gradient with respect to its input (col2im) and max pooling's are gathers,
 * each output element summing what reaches it in a fixed order, so results
 * do not depend on timing and need no atomics.
 */

/* ---- unary derivatives, expanded from kernels/ops.def ------------------------------------ */

/* dx = dy * f'(x): x (in0) and dy (in1) walk as a binary op's inputs. */
#define KILN_UNARY_GRAD_KERNEL_(NAME, expr)                                                        \
  KILN_KERNEL kiln_unary_grad_f32_##NAME(const kiln_cuda_ew_args_t p) {                             \
    const float *__restrict__ xs = (const float *)p.in0;                                           \
    const float *__restrict__ dys = (const float *)p.in1;                                          \
    float *__restrict__ out = (float *)p.out;                                                      \
    if (p.ndim == 0) {                                                                             \
      KILN_FOR_EACH(i, p.n) {                                                                      \
        const float x = xs[i], dy = dys[i];                                                        \
        (void)x; /* NEG's derivative does not read it */                                           \
        out[i] = (expr);                                                                           \
      }                                                                                            \
    } else {                                                                                       \
      KILN_FOR_EACH(i, p.n) {                                                                      \
        int64_t o0, o1;                                                                            \
        kiln_offsets(p, i, &o0, &o1);                                                              \
        const float x = xs[o0], dy = dys[o1];                                                      \
        (void)x;                                                                                   \
        out[i] = (expr);                                                                           \
      }                                                                                            \
    }                                                                                              \
  }

#define KILN_UNARY_GRAD_F32(NAME, expr) KILN_UNARY_GRAD_KERNEL_(NAME, expr)
#include "ops.def"

/* ---- softmax and cross-entropy ------------------------------------------------------------- */

/* SOFTMAX_BACKWARD, one block per row, from the forward's result y (in) and
 * dy (aux): softmax dx = y * (dy - sum(dy * y)), log-softmax dx = dy -
 * exp(y) * sum(dy); the sum in double, as the CPU's. */
KILN_KERNEL kiln_softmax_backward_f32(const kiln_cuda_rows_args_t p) {
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float *y = (const float *)p.in + r * p.cols;
    const float *dy = (const float *)p.aux + r * p.cols;
    float *dx = (float *)p.out + r * p.cols;
    double sum = 0.0;
    if (p.log) {
      for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) sum += (double)dy[i];
    } else {
      for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) sum += (double)dy[i] * (double)y[i];
    }
    const float s = (float)kiln_block_sum(sum);
    if (p.log) {
      for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) dx[i] = __fsub_rn(dy[i], __fmul_rn(expf(y[i]), s));
    } else {
      for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) dx[i] = __fmul_rn(y[i], __fsub_rn(dy[i], s));
    }
  }
}

/* CROSS_ENTROPY_BACKWARD, one block per row: (softmax(x) - onehot(label)) *
 * (dloss / n), the softmax as the forward's (the maximum subtracted, the sum
 * in double); aux is the one-element dloss, or 0 for 1. A label outside
 * [0, cols) makes its row NaN, as the forward's loss is. */
KILN_KERNEL kiln_xent_backward_f32(const kiln_cuda_rows_args_t p) {
  const int *labels = (const int *)p.labels;
  const float dloss = p.aux ? *(const float *)p.aux : 1.0f;
  const float scale = dloss / (float)p.rows;
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float *x = (const float *)p.in + r * p.cols;
    float *g = (float *)p.out + r * p.cols;
    const int label = labels[r];
    if (label < 0 || label >= p.cols) {
      for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) g[i] = NAN;
      continue; /* the whole block: the label is the row's */
    }
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) m = kiln_max_nan(m, x[i]);
    m = kiln_block_max(m);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) sum += (double)expf(x[i] - m);
    const float inv = (float)(1.0 / kiln_block_sum(sum));
    for (int64_t i = threadIdx.x; i < p.cols; i += blockDim.x) {
      const float q = __fmul_rn(expf(x[i] - m), inv);
      g[i] = __fmul_rn(i == label ? __fsub_rn(q, 1.0f) : q, scale);
    }
  }
}

/* ---- convolution gradients around the GEMM -------------------------------------------------- */

/* CONV2D_BACKWARD_INPUT after its GEMM: dx of `images` images (out) from
 * their columns W^T @ dy (in, [images][c*r*s][p*q], im2col's layout),
 * gathered per element of dx: (ch, hh, ww) sums, taps (ri, si) in order, the
 * column cells of the output positions it fed. */
KILN_KERNEL kiln_col2im_f32(const kiln_cuda_conv_args_t p) {
  const float *__restrict__ cols = (const float *)p.in;
  float *__restrict__ dx = (float *)p.out;
  const int64_t pq = p.p * p.q, rs = p.r * p.s;
  KILN_FOR_EACH(i, p.images * p.c * p.h * p.w) {
    const int64_t ww = i % p.w, hh = (i / p.w) % p.h, plane = i / (p.h * p.w); /* plane: img * c + ch */
    const float *cc = cols + plane * rs * pq;
    float sum = 0.0f;
    for (int64_t ri = 0; ri < p.r; ri++) {
      const int64_t th = hh + p.pad[0] - ri * p.dil[0];
      if (th < 0) break; /* and every later tap */
      const int64_t pp = th / p.stride[0];
      if (pp * p.stride[0] != th || pp >= p.p) continue;
      for (int64_t si = 0; si < p.s; si++) {
        const int64_t tw = ww + p.pad[1] - si * p.dil[1];
        if (tw < 0) break;
        const int64_t qq = tw / p.stride[1];
        if (qq * p.stride[1] != tw || qq >= p.q) continue;
        sum += cc[(ri * p.s + si) * pq + pp * p.q + qq];
      }
    }
    dx[i] = sum;
  }
}

/* CONV2D_BACKWARD_WEIGHT's columns: the im2col of `images` images (in) laid
 * out [c*r*s][images*p*q] (out), so that one GEMM's depth runs over the
 * positions of every image and sums over them. */
KILN_KERNEL kiln_im2col_rows_f32(const kiln_cuda_conv_args_t p) {
  const float *__restrict__ x = (const float *)p.in;
  float *__restrict__ cols = (float *)p.out;
  const int64_t pq = p.p * p.q, rs = p.r * p.s, depth = p.images * pq;
  KILN_FOR_EACH(i, p.c * rs * depth) {
    const int64_t l = i % depth, row = i / depth;
    const int64_t img = l / pq, col = l % pq;
    const int64_t ch = row / rs, ri = (row % rs) / p.s, si = row % p.s;
    const int64_t pp = col / p.q, qq = col % p.q;
    const int64_t hh = pp * p.stride[0] - p.pad[0] + ri * p.dil[0];
    const int64_t ww = qq * p.stride[1] - p.pad[1] + si * p.dil[1];
    cols[i] = hh >= 0 && hh < p.h && ww >= 0 && ww < p.w ? x[((img * p.c + ch) * p.h + hh) * p.w + ww] : 0.0f;
  }
}

/* ... and dy of the same images (in, [images][k][p*q]) as [k][images*p*q]
 * (out), the GEMM's other operand. */
KILN_KERNEL kiln_pack_dy_f32(const kiln_cuda_conv_args_t p) {
  const float *__restrict__ dy = (const float *)p.in;
  float *__restrict__ out = (float *)p.out;
  const int64_t pq = p.p * p.q, depth = p.images * pq;
  KILN_FOR_EACH(i, p.k * depth) {
    const int64_t l = i % depth, kk = i / depth;
    out[i] = dy[((l / pq) * p.k + kk) * pq + l % pq];
  }
}

/* ---- max pooling's gradient ------------------------------------------------------------------- */

/* First pass: for every window, where in its plane (y * w + x) its first
 * maximum in row-major order is, NaN above every number (so the first NaN):
 * the cell whose value the forward took. Padded cells are never candidates;
 * a window with no cell (impossible with padding at most half the kernel)
 * gets -1. in = x, index = the windows' cells (int). */
KILN_KERNEL kiln_max_pool2d_argmax_f32(const kiln_cuda_conv_args_t p) {
  const float *__restrict__ x = (const float *)p.in;
  int *__restrict__ index = (int *)p.index;
  KILN_FOR_EACH(i, p.n * p.c * p.p * p.q) {
    const int64_t qq = i % p.q, pp = (i / p.q) % p.p, plane = i / (p.p * p.q);
    int64_t h0 = pp * p.stride[0] - p.pad[0], h1 = h0 + p.kernel[0];
    int64_t w0 = qq * p.stride[1] - p.pad[1], w1 = w0 + p.kernel[1];
    if (h0 < 0) h0 = 0;
    if (h1 > p.h) h1 = p.h;
    if (w0 < 0) w0 = 0;
    if (w1 > p.w) w1 = p.w;
    const float *xp = x + plane * p.h * p.w;
    int64_t best_at = -1;
    float best = 0.0f;
    for (int64_t hh = h0; hh < h1; hh++)
      for (int64_t ww = w0; ww < w1; ww++) {
        const float v = xp[hh * p.w + ww];
        if (best_at < 0 || (best == best && (v > best || v != v))) {
          best = v;
          best_at = hh * p.w + ww;
        }
      }
    index[i] = (int)best_at;
  }
}

/* Second pass, gathered per element of dx (out): the sum of dy over the
 * windows whose first maximum the cell is, windows in row-major order (the
 * order the CPU adds them in). */
KILN_KERNEL kiln_max_pool2d_backward_f32(const kiln_cuda_conv_args_t p) {
  const int *__restrict__ index = (const int *)p.index;
  const float *__restrict__ dy = (const float *)p.aux;
  float *__restrict__ dx = (float *)p.out;
  KILN_FOR_EACH(i, p.n * p.c * p.h * p.w) {
    const int64_t ww = i % p.w, hh = (i / p.w) % p.h, plane = i / (p.h * p.w);
    const int *ip = index + plane * p.p * p.q;
    const float *dyp = dy + plane * p.p * p.q;
    const int self = (int)(hh * p.w + ww);
    /* The windows covering the cell: pp * stride - pad <= hh < that + kernel. */
    const int64_t th = hh + p.pad[0], tw = ww + p.pad[1];
    const int64_t p0 = th < p.kernel[0] ? 0 : (th - p.kernel[0]) / p.stride[0] + 1;
    const int64_t q0 = tw < p.kernel[1] ? 0 : (tw - p.kernel[1]) / p.stride[1] + 1;
    int64_t p1 = th / p.stride[0], q1 = tw / p.stride[1];
    if (p1 > p.p - 1) p1 = p.p - 1;
    if (q1 > p.q - 1) q1 = p.q - 1;
    float sum = 0.0f;
    for (int64_t pp = p0; pp <= p1; pp++)
      for (int64_t qq = q0; qq <= q1; qq++)
        if (ip[pp * p.q + qq] == self) sum += dyp[pp * p.q + qq];
    dx[i] = sum;
  }
}

/* ---- updates in place --------------------------------------------------------------------------
 * One kernel per call, one pass over contiguous f32 tensors of n elements
 * each (none overlapping another): every element read once and written once,
 * the rounding of each operation the CPU's. */

/* ACCUMULATE: out += alpha * in (grad). */
KILN_KERNEL kiln_accumulate_f32(const kiln_cuda_update_args_t p) {
  float *__restrict__ a = (float *)p.param;
  const float *__restrict__ b = (const float *)p.grad;
  KILN_FOR_EACH(i, p.n) a[i] = __fadd_rn(a[i], __fmul_rn(p.alpha, b[i]));
}

/* SGD_UPDATE: g = grad + weight_decay * param (no term when weight_decay is
 * 0, so an infinite parameter does not make its gradient NaN); with a buffer
 * (s1), buf = momentum * buf + (1 - dampening) * g, else the step is g;
 * param -= lr * (nesterov ? g + momentum * buf : buf). */
KILN_KERNEL kiln_sgd_f32(const kiln_cuda_update_args_t p) {
  float *__restrict__ w = (float *)p.param;
  const float *__restrict__ grad = (const float *)p.grad;
  float *__restrict__ buf = (float *)p.s1;
  const bool has_wd = p.weight_decay != 0.0f;
  KILN_FOR_EACH(i, p.n) {
    const float wi = w[i];
    float g = grad[i];
    if (has_wd) g = __fadd_rn(g, __fmul_rn(p.weight_decay, wi));
    float step = g;
    if (p.has_buf) {
      const float b = __fadd_rn(__fmul_rn(p.momentum, buf[i]), __fmul_rn(p.keep1, g));
      buf[i] = b;
      step = p.nesterov ? __fadd_rn(g, __fmul_rn(p.momentum, b)) : b;
    }
    w[i] = __fsub_rn(wi, __fmul_rn(p.lr, step));
  }
}

/* ADAM_UPDATE (m in s1, v in s2): g as SGD's; m = beta1 m + (1 - beta1) g;
 * v = beta2 v + (1 - beta2) g^2; param -= step_size * (m / (sqrt(v) /
 * sqrt(bias2) + eps)), step_size = lr / bias1: torch.optim.Adam's order, the
 * scalars (1 - beta too) folded once by the core, in double. */
KILN_KERNEL kiln_adam_f32(const kiln_cuda_update_args_t p) {
  float *__restrict__ w = (float *)p.param;
  const float *__restrict__ grad = (const float *)p.grad;
  float *__restrict__ m = (float *)p.s1;
  float *__restrict__ v = (float *)p.s2;
  const bool has_wd = p.weight_decay != 0.0f;
  KILN_FOR_EACH(i, p.n) {
    const float wi = w[i];
    float g = grad[i];
    if (has_wd) g = __fadd_rn(g, __fmul_rn(p.weight_decay, wi));
    const float mi = __fadd_rn(__fmul_rn(p.beta1, m[i]), __fmul_rn(p.keep1, g));
    const float vi = __fadd_rn(__fmul_rn(p.beta2, v[i]), __fmul_rn(p.keep2, __fmul_rn(g, g)));
    m[i] = mi;
    v[i] = vi;
    w[i] = __fsub_rn(wi, __fmul_rn(p.step_size, mi / __fadd_rn(sqrtf(vi) / p.sqrt_bias2, p.eps)));
  }
}
