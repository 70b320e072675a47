/* kernels/cuda/train.cuh: the training kernels: softmax, cross-entropy, convolution and max-pooling gradients, and the fused updates in place. */
/*
 * Included once, by kiln.cu, after its helpers (KILN_INSTANCE,
 * KILN_FOR_EACH, KILN_CONV_SIZES_, KILN_POOL_WINDOW_, kiln_max_nan,
 * kiln_block_max, kiln_block_sum); the unary derivatives (UNARY_BACKWARD)
 * are kiln.cu's, expanded from kernels/ops.def with the forward formulas.
 * The formulas are backend.h's (kiln_op_t) and the CPU backend's: a
 * gradient that only moves dy (relu, abs, neg, max pooling) gives the CPU's
 * bits, and so do the updates, whose arithmetic is written with explicitly
 * rounded operations (__fmul_rn, __fadd_rn, __fsub_rn) so that nvcc fuses
 * no multiply-add into them: a fused one would round once where the CPU
 * rounds twice. (Division and sqrtf are IEEE's, correctly rounded, without
 * --use_fast_math.)
 *
 * No kernel here writes one place from two threads: the convolution's
 * gradient with respect to its input (col2im) and max pooling's are gathers,
 * each output element summing what reaches it in a fixed order, so results
 * do not depend on timing and need no atomics.
 */

/* ---- softmax and cross-entropy ------------------------------------------------------------- */

/* SOFTMAX_BACKWARD (ROWS), one block per row, from the forward's result y
 * (in[0]) and dy (in[1]): softmax dx = y * (dy - sum(dy * y)), log-softmax
 * dx = dy - exp(y) * sum(dy); the sum in double, as the CPU's. */
__device__ __forceinline__ void kiln_softmax_backward(const kiln_kop_t &op) {
  const int64_t rows = op.u.softmax.rows, cols = op.u.softmax.cols;
  const bool log_softmax = op.u.softmax.log;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *y = (const float *)op.in[0].addr + r * cols;
    const float *dy = (const float *)op.in[1].addr + r * cols;
    float *dx = (float *)op.out.addr + r * cols;
    double sum = 0.0;
    if (log_softmax) {
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += (double)dy[i];
    } else {
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += (double)dy[i] * (double)y[i];
    }
    const float s = (float)kiln_block_sum(sum);
    if (log_softmax) {
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) dx[i] = __fsub_rn(dy[i], __fmul_rn(expf(y[i]), s));
    } else {
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) dx[i] = __fmul_rn(y[i], __fsub_rn(dy[i], s));
    }
  }
}
KILN_INSTANCE(kiln_softmax_backward_f32_f32, kiln_softmax_backward)

/* CROSS_ENTROPY_BACKWARD (ROWS), one block per row: (softmax(x) -
 * onehot(label)) * (dloss / n), the softmax as the forward's (the maximum
 * subtracted, the sum in double); dloss is in[2]'s one element when n_in is
 * 3, else 1. A label outside [0, cols) makes its row NaN, as the forward's
 * loss is. */
__device__ __forceinline__ void kiln_cross_entropy_backward(const kiln_kop_t &op) {
  const int *labels = (const int *)op.in[1].addr;
  const int64_t rows = op.u.cross_entropy.n, cols = op.u.cross_entropy.c;
  const float dloss = op.n_in == 3 ? *(const float *)op.in[2].addr : 1.0f;
  const float scale = dloss / (float)rows;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float *x = (const float *)op.in[0].addr + r * cols;
    float *g = (float *)op.out.addr + r * cols;
    const int label = labels[r];
    if (label < 0 || label >= cols) {
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) g[i] = NAN;
      continue; /* the whole block: the label is the row's */
    }
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = kiln_max_nan(m, x[i]);
    m = kiln_block_max(m);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) sum += (double)expf(x[i] - m);
    const float inv = (float)(1.0 / kiln_block_sum(sum));
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      const float q = __fmul_rn(expf(x[i] - m), inv);
      g[i] = __fmul_rn(i == label ? __fsub_rn(q, 1.0f) : q, scale);
    }
  }
}
KILN_INSTANCE(kiln_cross_entropy_backward_f32_f32, kiln_cross_entropy_backward)

/* ---- convolution gradients around the GEMM (plan.round: a round of images) ------------------- */

/* CONV2D_BACKWARD_INPUT after its GEMM: dx of plan.round.images images
 * (plan.round.out) from their columns W^T @ dy (plan.round.in,
 * [images][c*r*s][p*q], im2col's layout), gathered per element of dx:
 * (ch, hh, ww) sums, taps (ri, si) in order, the column cells of the output
 * positions it fed. */
__device__ __forceinline__ void kiln_col2im(const kiln_kop_t &op) {
  KILN_CONV_SIZES_(op);
  const float *__restrict__ cols = (const float *)op.plan.round.in;
  float *__restrict__ dx = (float *)op.plan.round.out;
  const int64_t pq = p * q, rs = r * s;
  KILN_FOR_EACH(i, op.plan.round.images * c * h * w) {
    const int64_t ww = i % w, hh = (i / w) % h, plane = i / (h * w); /* plane: img * c + ch */
    const float *cc = cols + plane * rs * pq;
    float sum = 0.0f;
    for (int64_t ri = 0; ri < r; ri++) {
      const int64_t th = hh + pad[0] - ri * dil[0];
      if (th < 0) break; /* and every later tap */
      const int64_t pp = th / stride[0];
      if (pp * stride[0] != th || pp >= p) continue;
      for (int64_t si = 0; si < s; si++) {
        const int64_t tw = ww + pad[1] - si * dil[1];
        if (tw < 0) break;
        const int64_t qq = tw / stride[1];
        if (qq * stride[1] != tw || qq >= q) continue;
        sum += cc[(ri * s + si) * pq + pp * q + qq];
      }
    }
    dx[i] = sum;
  }
}
KILN_INSTANCE(kiln_col2im_f32, kiln_col2im)

/* CONV2D_BACKWARD_WEIGHT's columns: the im2col of plan.round.images images
 * (plan.round.in) laid out [c*r*s][images*p*q] (plan.round.out), so that
 * one GEMM's depth runs over the positions of every image and sums over
 * them. */
__device__ __forceinline__ void kiln_im2col_rows(const kiln_kop_t &op) {
  KILN_CONV_SIZES_(op);
  const float *__restrict__ x = (const float *)op.plan.round.in;
  float *__restrict__ cols = (float *)op.plan.round.out;
  const int64_t pq = p * q, rs = r * s, depth = op.plan.round.images * pq;
  KILN_FOR_EACH(i, c * rs * depth) {
    const int64_t l = i % depth, row = i / depth;
    const int64_t img = l / pq, col = l % pq;
    const int64_t ch = row / rs, ri = (row % rs) / s, si = row % s;
    const int64_t pp = col / q, qq = col % q;
    const int64_t hh = pp * stride[0] - pad[0] + ri * dil[0];
    const int64_t ww = qq * stride[1] - pad[1] + si * dil[1];
    cols[i] = hh >= 0 && hh < h && ww >= 0 && ww < w ? x[((img * c + ch) * h + hh) * w + ww] : 0.0f;
  }
}
KILN_INSTANCE(kiln_im2col_rows_f32, kiln_im2col_rows)

/* ... and dy of the same images (plan.round.in, [images][k][p*q]) as
 * [k][images*p*q] (plan.round.out), the GEMM's other operand. */
__device__ __forceinline__ void kiln_pack_dy(const kiln_kop_t &op) {
  KILN_CONV_SIZES_(op);
  const float *__restrict__ dy = (const float *)op.plan.round.in;
  float *__restrict__ out = (float *)op.plan.round.out;
  const int64_t pq = p * q, depth = op.plan.round.images * pq;
  KILN_FOR_EACH(i, k * depth) {
    const int64_t l = i % depth, kk = i / depth;
    out[i] = dy[((l / pq) * k + kk) * pq + l % pq];
  }
}
KILN_INSTANCE(kiln_pack_dy_f32, kiln_pack_dy)

/* A later round's part of dW (plan.round.aux) added to dW (out): the
 * rounds' sum in order, rounded as ACCUMULATE with alpha 1. */
__device__ __forceinline__ void kiln_conv_weight_add(const kiln_kop_t &op) {
  KILN_CONV_SIZES_(op);
  float *__restrict__ dw = (float *)op.out.addr;
  const float *__restrict__ part = (const float *)op.plan.round.aux;
  KILN_FOR_EACH(i, k * c * r * s) dw[i] = __fadd_rn(dw[i], part[i]);
}
KILN_INSTANCE(kiln_conv_weight_add_f32, kiln_conv_weight_add)

/* ---- max pooling's gradient (plan.round.aux: each window's cell) -------------------------------- */

/* First pass: for every window, where in its plane (y * w + x) its first
 * maximum in row-major order is, NaN above every number (so the first NaN):
 * the cell whose value the forward took. Padded cells are never candidates;
 * a window with no cell (impossible with padding at most half the kernel)
 * gets -1. in[0] = x; the windows' cells (int) into plan.round.aux. */
__device__ __forceinline__ void kiln_max_pool2d_argmax(const kiln_kop_t &op) {
  const float *__restrict__ x = (const float *)op.in[0].addr;
  int *__restrict__ index = (int *)op.plan.round.aux;
  const int64_t h = op.u.pooling.h, w = op.u.pooling.w, p = op.u.pooling.p, q = op.u.pooling.q;
  KILN_POOL_WINDOW_(op);
  KILN_FOR_EACH(i, op.u.pooling.n * op.u.pooling.c * p * q) {
    const int64_t qq = i % q, pp = (i / q) % p, plane = i / (p * q);
    int64_t h0 = pp * stride[0] - pad[0], h1 = h0 + kernel[0];
    int64_t w0 = qq * stride[1] - pad[1], w1 = w0 + kernel[1];
    if (h0 < 0) h0 = 0;
    if (h1 > h) h1 = h;
    if (w0 < 0) w0 = 0;
    if (w1 > w) w1 = w;
    const float *xp = x + plane * h * w;
    int64_t best_at = -1;
    float best = 0.0f;
    for (int64_t hh = h0; hh < h1; hh++)
      for (int64_t ww = w0; ww < w1; ww++) {
        const float v = xp[hh * w + ww];
        if (best_at < 0 || (best == best && (v > best || v != v))) {
          best = v;
          best_at = hh * w + ww;
        }
      }
    index[i] = (int)best_at;
  }
}
KILN_INSTANCE(kiln_max_pool2d_argmax_f32, kiln_max_pool2d_argmax)

/* Second pass, gathered per element of dx (out): the sum of dy (in[1]) over
 * the windows whose first maximum the cell is, windows in row-major order
 * (the order the CPU adds them in). */
__device__ __forceinline__ void kiln_max_pool2d_gather(const kiln_kop_t &op) {
  const int *__restrict__ index = (const int *)op.plan.round.aux;
  const float *__restrict__ dy = (const float *)op.in[1].addr;
  float *__restrict__ dx = (float *)op.out.addr;
  const int64_t h = op.u.pooling.h, w = op.u.pooling.w, p = op.u.pooling.p, q = op.u.pooling.q;
  KILN_POOL_WINDOW_(op);
  KILN_FOR_EACH(i, op.u.pooling.n * op.u.pooling.c * h * w) {
    const int64_t ww = i % w, hh = (i / w) % h, plane = i / (h * w);
    const int *ip = index + plane * p * q;
    const float *dyp = dy + plane * p * q;
    const int self = (int)(hh * w + ww);
    /* The windows covering the cell: pp * stride - pad <= hh < that + kernel. */
    const int64_t th = hh + pad[0], tw = ww + pad[1];
    const int64_t p0 = th < kernel[0] ? 0 : (th - kernel[0]) / stride[0] + 1;
    const int64_t q0 = tw < kernel[1] ? 0 : (tw - kernel[1]) / stride[1] + 1;
    int64_t p1 = th / stride[0], q1 = tw / stride[1];
    if (p1 > p - 1) p1 = p - 1;
    if (q1 > q - 1) q1 = q - 1;
    float sum = 0.0f;
    for (int64_t pp = p0; pp <= p1; pp++)
      for (int64_t qq = q0; qq <= q1; qq++)
        if (ip[pp * q + qq] == self) sum += dyp[pp * q + qq];
    dx[i] = sum;
  }
}
KILN_INSTANCE(kiln_max_pool2d_gather_f32, kiln_max_pool2d_gather)

/* ---- updates in place --------------------------------------------------------------------------
 * FLAT kinds over op.n contiguous f32 elements of each operand (none
 * overlapping another), out the tensor updated: every element read once and
 * written once, the rounding of each operation the CPU's. */

/* ACCUMULATE: out += alpha * in[0]. */
__device__ __forceinline__ void kiln_accumulate(const kiln_kop_t &op) {
  float *__restrict__ a = (float *)op.out.addr;
  const float *__restrict__ b = (const float *)op.in[0].addr;
  const float alpha = op.u.update.alpha;
  KILN_FOR_EACH(i, op.n) a[i] = __fadd_rn(a[i], __fmul_rn(alpha, b[i]));
}
KILN_INSTANCE(kiln_accumulate_f32_f32, kiln_accumulate)

/* The 16-bit copy of mixed precision (in[3] when op.u.update.copy): the
 * updated parameter rounded to nearest even, into f16 or bf16. */
__device__ __forceinline__ void kiln_update_copy(const kiln_kop_t &op, const int64_t i, const float w) {
  if (!op.u.update.copy) return;
  if (op.in[3].dtype == KILN_KOP_DT_BF16)
    ((kiln_bf16_t *)op.in[3].addr)[i] = kiln_cx<kiln_bf16_t>::out(w);
  else
    ((kiln_f16_t *)op.in[3].addr)[i] = kiln_cx<kiln_f16_t>::out(w);
}

/* SGD_UPDATE: g = grad + weight_decay * param (no term when weight_decay is
 * 0, so an infinite parameter does not make its gradient NaN); with a buffer
 * (in[1], u.update.has_buf), buf = momentum * buf + (1 - dampening) * g,
 * else the step is g; param -= lr * (nesterov ? g + momentum * buf : buf).
 * 1 - dampening is folded in double and rounded once, as the CPU folds it.
 * The gradient TG is f32, f16 or bf16 (widened exactly). */
template <typename TG> __device__ __forceinline__ void kiln_sgd_update(const kiln_kop_t &op) {
  float *__restrict__ w = (float *)op.out.addr;
  const TG *__restrict__ grad = (const TG *)op.in[0].addr;
  const bool has_buf = op.u.update.has_buf != 0;
  float *__restrict__ buf = has_buf ? (float *)op.in[1].addr : (float *)0;
  const float lr = op.u.update.lr, momentum = op.u.update.momentum, weight_decay = op.u.update.weight_decay;
  const float keep1 = (float)(1.0 - (double)op.u.update.dampening);
  const bool has_wd = weight_decay != 0.0f, nesterov = op.u.update.nesterov;
  KILN_FOR_EACH(i, op.n) {
    const float wi = w[i];
    float g = kiln_cx<TG>::in(grad[i]);
    if (has_wd) g = __fadd_rn(g, __fmul_rn(weight_decay, wi));
    float step = g;
    if (has_buf) {
      const float b = __fadd_rn(__fmul_rn(momentum, buf[i]), __fmul_rn(keep1, g));
      buf[i] = b;
      step = nesterov ? __fadd_rn(g, __fmul_rn(momentum, b)) : b;
    }
    const float nw = __fsub_rn(wi, __fmul_rn(lr, step));
    w[i] = nw;
    kiln_update_copy(op, i, nw);
  }
}
KILN_INSTANCE(kiln_sgd_update_f32_f32, kiln_sgd_update<float>)
KILN_INSTANCE(kiln_sgd_update_f16_f32, kiln_sgd_update<kiln_f16_t>)
KILN_INSTANCE(kiln_sgd_update_bf16_f32, kiln_sgd_update<kiln_bf16_t>)

/* ADAM_UPDATE (m in[1], v in[2]): g as SGD's; m = beta1 m + (1 - beta1) g;
 * v = beta2 v + (1 - beta2) g^2; param -= step_size * (m / (sqrt(v) /
 * sqrt(bias2) + eps)), step_size = lr / bias1: torch.optim.Adam's order, the
 * scalars (1 - beta too) folded once by the core, in double. */
template <typename TG> __device__ __forceinline__ void kiln_adam_update(const kiln_kop_t &op) {
  float *__restrict__ w = (float *)op.out.addr;
  const TG *__restrict__ grad = (const TG *)op.in[0].addr;
  float *__restrict__ m = (float *)op.in[1].addr;
  float *__restrict__ v = (float *)op.in[2].addr;
  const float beta1 = op.u.update.beta1, beta2 = op.u.update.beta2, keep1 = op.u.update.keep1;
  const float keep2 = op.u.update.keep2, eps = op.u.update.eps, weight_decay = op.u.update.weight_decay;
  const float step_size = op.u.update.step_size, sqrt_bias2 = op.u.update.sqrt_bias2;
  const bool has_wd = weight_decay != 0.0f;
  KILN_FOR_EACH(i, op.n) {
    const float wi = w[i];
    float g = kiln_cx<TG>::in(grad[i]);
    if (has_wd) g = __fadd_rn(g, __fmul_rn(weight_decay, wi));
    const float mi = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(keep1, g));
    const float vi = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(keep2, __fmul_rn(g, g)));
    m[i] = mi;
    v[i] = vi;
    const float nw = __fsub_rn(wi, __fmul_rn(step_size, mi / __fadd_rn(sqrtf(vi) / sqrt_bias2, eps)));
    w[i] = nw;
    kiln_update_copy(op, i, nw);
  }
}
KILN_INSTANCE(kiln_adam_update_f32_f32, kiln_adam_update<float>)
KILN_INSTANCE(kiln_adam_update_f16_f32, kiln_adam_update<kiln_f16_t>)
KILN_INSTANCE(kiln_adam_update_bf16_f32, kiln_adam_update<kiln_bf16_t>)

/* UNSCALE: out = grad * alpha in f32; the flag in[1] (one f32) set to 1.0
 * when an element of grad is an infinity or a NaN, by an atomic exchange so
 * that any number of threads may set it. */
template <typename TG> __device__ __forceinline__ void kiln_unscale(const kiln_kop_t &op) {
  float *__restrict__ out = (float *)op.out.addr;
  const TG *__restrict__ grad = (const TG *)op.in[0].addr;
  const float scale = op.u.update.alpha;
  bool bad = false;
  KILN_FOR_EACH(i, op.n) {
    const float x = kiln_cx<TG>::in(grad[i]);
    bad = bad || !isfinite(x);
    out[i] = __fmul_rn(x, scale);
  }
  if (bad) atomicExch((float *)op.in[1].addr, 1.0f);
}
KILN_INSTANCE(kiln_unscale_f32_f32, kiln_unscale<float>)
KILN_INSTANCE(kiln_unscale_f16_f32, kiln_unscale<kiln_f16_t>)
KILN_INSTANCE(kiln_unscale_bf16_f32, kiln_unscale<kiln_bf16_t>)
