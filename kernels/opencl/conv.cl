/* kernels/opencl/conv.cl: the parts of CONV2D and its gradients around the GEMM (im2col, col2im, bias, the sum over images) and MAX_POOL2D with its gradient, NCHW. */
/* kiln-kinds: max_pool2d */

/* The kernels internal to the planners (backends/opencl/gemm.c, ops_train.c)
 * take KILN_CL_KERNEL's parameters too: the sizes from op.u.conv2d or
 * op.u.pooling, a round's images and element offsets from op.plan.round
 * (never the operands' own offsets, as the planners put scratch buffers in
 * operand places): what a kernel writes is in out's place at out_off, what
 * it reads in in[0]'s at in_off, and a second input in in[1]'s at aux_off. */

/* A convolution's sizes as the kernels' ints (gemm.c checks they fit). */
#define KILN_CONV_SIZES                                                                            \
  const int c = (int)op.u.conv2d.c, h = (int)op.u.conv2d.h, w = (int)op.u.conv2d.w;              \
  const int r = (int)op.u.conv2d.r, s = (int)op.u.conv2d.s, p = (int)op.u.conv2d.p,               \
            q = (int)op.u.conv2d.q;                                                               \
  const int stride_h = op.u.conv2d.stride[0], stride_w = op.u.conv2d.stride[1];                    \
  const int pad_h = op.u.conv2d.pad[0], pad_w = op.u.conv2d.pad[1];                                \
  const int dil_h = op.u.conv2d.dil[0], dil_w = op.u.conv2d.dil[1]

/* A pooling's sizes likewise (ops_train.c checks h*w and p*q fit). */
#define KILN_POOL_SIZES                                                                            \
  const int h = (int)op.u.pooling.h, w = (int)op.u.pooling.w, p = (int)op.u.pooling.p,             \
            q = (int)op.u.pooling.q;                                                              \
  const int kernel_h = op.u.pooling.window[0], kernel_w = op.u.pooling.window[1];                  \
  const int stride_h = op.u.pooling.stride[0], stride_w = op.u.pooling.stride[1];                  \
  const int pad_h = op.u.pooling.pad[0], pad_w = op.u.pooling.pad[1]

/* Columns of im2col are the output positions (pp, qq) of an image and rows
 * its channel-and-tap triples (ch, ri, si). Both kernels run over the global
 * range (q rounded up, p or p + 1, images * c*r*s): every quotient depends
 * only on dimensions 1 and 2, which are fixed within a work-group of
 * (n, 1, 1), so compilers hoist them out of the work-item loop and no
 * work-item divides. Padded cells are zeros. */
KILN_FN float kiln_im2col_cell(__global const float *x, long x_off, int pp, int qq, long plane, int c, int h, int w,
                               int r, int s, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w,
                               int *out_row, long *out_img) {
  const int crs = c * r * s;
  const long img = kiln_udiv(plane, crs);
  const int row = (int)(plane % crs);
  const int r_s = r * s;
  const int ch = (int)((uint)row / (uint)r_s), tap = row % r_s;
  const int ri = (int)((uint)tap / (uint)s), si = tap % s;
  const int hh = pp * stride_h - pad_h + ri * dil_h;
  const int ww = qq * stride_w - pad_w + si * dil_w;
  *out_row = row;
  *out_img = img;
  return hh >= 0 && hh < h && ww >= 0 && ww < w ? x[x_off + ((img * c + ch) * h + hh) * w + ww] : 0.0f;
}

/* [images][c*r*s][p*q] columns of consecutive input images: x in in[0]'s
 * place from in_off, the columns into out's. Global (q rounded up, p,
 * images * c*r*s). */
KILN_CL_KERNEL(im2col_f32) {
  __global const float *x = (__global const float *)in0_;
  __global float *cols = (__global float *)out_;
  const long x_off = op.plan.round.in_off;
  KILN_CONV_SIZES;
  const int qq = (int)get_global_id(0), pp = (int)get_global_id(1);
  const long plane = (long)get_global_id(2);
  if (qq >= q) return;
  int row;
  long img;
  const float v = kiln_im2col_cell(x, x_off, pp, qq, plane, c, h, w, r, s, stride_h, stride_w, pad_h, pad_w, dil_h,
                                   dil_w, &row, &img);
  const long pq = (long)p * q, crs = (long)c * r * s;
  cols[(img * crs + row) * pq + (long)pp * q + qq] = v;
}

/* The same columns written straight in gemm.cl's packed layout for B
 * ([images][ceil(p*q/RN)][c*r*s][RN], zero past p*q), so the GEMM needs no
 * packing pass of its own. Global (q rounded up, p + 1, images * c*r*s): the
 * extra row pp == p writes the zeros past p*q. */
#define KILN_CONV_RN 16 /* KILN_GEMM_RN of gemm.cl */
KILN_CL_KERNEL(im2col_packed_f32) {
  __global const float *x = (__global const float *)in0_;
  __global float *cols = (__global float *)out_;
  const long x_off = op.plan.round.in_off;
  KILN_CONV_SIZES;
  const int qq = (int)get_global_id(0), pp = (int)get_global_id(1);
  const long plane = (long)get_global_id(2);
  const int pq = p * q, nb = (pq + KILN_CONV_RN - 1) / KILN_CONV_RN;
  int row;
  long img;
  float v = kiln_im2col_cell(x, x_off, pp < p ? pp : 0, qq < q ? qq : 0, plane, c, h, w, r, s, stride_h, stride_w,
                             pad_h, pad_w, dil_h, dil_w, &row, &img);
  int col = pp * q + qq;
  if (pp == p) { /* the padding columns past p*q */
    col = pq + qq;
    v = 0.0f;
    if (col >= nb * KILN_CONV_RN) return;
  } else if (qq >= q) {
    return;
  }
  const long crs = (long)c * r * s;
  const uint ucol = (uint)col;
  cols[img * ((long)nb * crs * KILN_CONV_RN) + ((long)(ucol / KILN_CONV_RN) * crs + row) * KILN_CONV_RN +
       ucol % KILN_CONV_RN] = v;
}

/* y[img][k][pq] += bias[k]: y in out's place from out_off, bias in in[1]'s
 * from aux_off. Global (pq rounded up, k, images). */
KILN_CL_KERNEL(bias_nchw_f32) {
  __global float *y = (__global float *)out_;
  __global const float *bias = (__global const float *)in1_;
  const long y_off = op.plan.round.out_off, bias_off = op.plan.round.aux_off;
  const int k = (int)op.u.conv2d.k, pq = (int)(op.u.conv2d.p * op.u.conv2d.q);
  const int col = (int)get_global_id(0), kk = (int)get_global_id(1);
  const long img = (long)get_global_id(2);
  if (col >= pq) return;
  y[y_off + (img * k + kk) * pq + col] += bias[bias_off + kk];
}

/* Padded cells are never candidates; a window wholly in the padding gives
 * -inf; NaN propagates. Written once per storage type: f16 and bf16 compare
 * as f32 and store the maximum rounded back (exact: the cpu:0 bits, a NaN
 * made quiet). */
#define KILN_CL_MAX_POOL_(d, ST, LOAD, STORE)                                                      \
  KILN_CL_KERNEL(max_pool2d_##d##_##d) {                                                           \
    __global const ST *x = KILN_CL_IN(ST, 0);                                                      \
    __global ST *y = KILN_CL_OUT(ST);                                                              \
    const long planes = op.u.pooling.n * op.u.pooling.c, h = op.u.pooling.h, w = op.u.pooling.w;  \
    const long p = op.u.pooling.p, q = op.u.pooling.q;                                             \
    const int kernel_h = op.u.pooling.window[0], kernel_w = op.u.pooling.window[1];                \
    const int stride_h = op.u.pooling.stride[0], stride_w = op.u.pooling.stride[1];                \
    const int pad_h = op.u.pooling.pad[0], pad_w = op.u.pooling.pad[1];                            \
    KILN_FOR_EACH(i, planes * p * q) {                                                             \
      const long qq = i % q, pp = kiln_udiv(i, q) % p, plane = kiln_udiv(i, p * q);                \
      long h0 = pp * stride_h - pad_h, h1 = h0 + kernel_h;                                         \
      long w0 = qq * stride_w - pad_w, w1 = w0 + kernel_w;                                         \
      if (h0 < 0) h0 = 0;                                                                          \
      if (h1 > h) h1 = h;                                                                          \
      if (w0 < 0) w0 = 0;                                                                          \
      if (w1 > w) w1 = w;                                                                          \
      __global const ST *xp = x + plane * h * w;                                                   \
      float best = -INFINITY;                                                                      \
      for (long hh = h0; hh < h1; hh++)                                                            \
        for (long ww = w0; ww < w1; ww++) {                                                        \
          const float v = LOAD(xp[hh * w + ww]);                                                   \
          if (v > best || v != v) best = v;                                                        \
        }                                                                                          \
      y[i] = STORE(best);                                                                          \
    }                                                                                              \
  }
#define KILN_CL_POOL_AS_IS_(x) (x)
KILN_CL_MAX_POOL_(f32, float, KILN_CL_POOL_AS_IS_, KILN_CL_POOL_AS_IS_)
KILN_CL_MAX_POOL_(f16, ushort, KILN_CL_TO_F32_f16, KILN_CL_FROM_F32_f16)
KILN_CL_MAX_POOL_(bf16, ushort, KILN_CL_TO_F32_bf16, KILN_CL_FROM_F32_bf16)

/* ---- the gradients' parts ------------------------------------------------------ */

/* CONV2D_BACKWARD_INPUT after its GEMM: dx from the columns W^T @ dy
 * ([images][c*r*s][p*q], im2col's layout), gathered per input element so no
 * two work-items write one place (no atomics): element (ch, hh, ww) sums,
 * taps in order, the cells of the taps (ri, si) whose output position it
 * fed. The columns in in[0]'s place (from 0), dx in out's from out_off.
 * Global (w rounded up, h rounded up, images * c). */
KILN_CL_KERNEL(col2im_f32) {
  __global const float *cols = (__global const float *)in0_;
  __global float *dx = (__global float *)out_;
  const long dx_off = op.plan.round.out_off;
  KILN_CONV_SIZES;
  (void)c;
  const int ww = (int)get_global_id(0), hh = (int)get_global_id(1);
  const long plane = (long)get_global_id(2);
  if (ww >= w || hh >= h) return;
  const int pq = p * q;
  /* The rows of channel ch of image img start at row img * c*r*s + ch * r*s. */
  __global const float *cc = cols + plane * ((long)r * s * pq);
  float sum = 0.0f;
  for (int ri = 0; ri < r; ri++) {
    const int th = hh + pad_h - ri * dil_h;
    if (th < 0) break; /* and every later tap */
    const int pp = stride_h == 1 ? th : (int)((uint)th / (uint)stride_h);
    if (pp * stride_h != th || pp >= p) continue;
    for (int si = 0; si < s; si++) {
      const int tw = ww + pad_w - si * dil_w;
      if (tw < 0) break;
      const int qq = stride_w == 1 ? tw : (int)((uint)tw / (uint)stride_w);
      if (qq * stride_w != tw || qq >= q) continue;
      sum += cc[(long)(ri * s + si) * pq + pp * q + qq];
    }
  }
  dx[dx_off + (plane * h + hh) * w + ww] = sum;
}

/* CONV2D_BACKWARD_WEIGHT on the packed GEMM: dW[k, crs] = dy[k, l] @
 * columns[crs, l]^T where the depth l runs over the positions of `per`
 * consecutive images (a slice), so the GEMM itself sums over them. The two
 * kernels below write its operands straight in gemm.cl's packed layouts
 * (no packing pass): B, the transposed columns, [slices][ceil(crs/RN)]
 * [per*p*q][RN], and A, dy, [slices][ceil(k/RM)][per*p*q][RM]; zeros past
 * crs and k, and for the images of the last slice past `count`. Dimension 2
 * of the range is (image of the round, block): its quotients are fixed within
 * a work-group, so no work-item divides, and neighbouring work-items write
 * neighbouring rows of a block.
 *
 * `count` is the round's images (plan.round.images), `per` the images of a
 * slice (plan.round.per).
 *
 * Columns: x in in[0]'s place from in_off, the panel into out's; global (q
 * and p rounded up, slices*per * ceil(crs/RN)); work-item (qq, pp) writes
 * the RN rows of its block at that position. */
KILN_CL_KERNEL(im2col_packed_t_f32) {
  /* The block's RN rows as offsets from a position's corner: computed once
   * per work-group, so the loop below neither divides nor steps through
   * (channel, tap). A row past crs gets an offset no position reaches. */
  __local int tap_h[KILN_CONV_RN], tap_w[KILN_CONV_RN], tap_x[KILN_CONV_RN];
  __global const float *x = (__global const float *)in0_;
  __global float *cols = (__global float *)out_;
  const long x_off = op.plan.round.in_off;
  const int count = (int)op.plan.round.images, per = (int)op.plan.round.per;
  KILN_CONV_SIZES;
  const int qq = (int)get_global_id(0), pp = (int)get_global_id(1);
  const int crs = c * r * s, nbj = (crs + KILN_CONV_RN - 1) / KILN_CONV_RN;
  const int plane = (int)get_global_id(2), jb = plane % nbj, img_r = (int)((uint)plane / (uint)nbj);
  const int slice = (int)((uint)img_r / (uint)per), local_img = img_r % per; /* img_r: the image of the round */
  for (int t = (int)get_local_id(0); t < KILN_CONV_RN; t += (int)get_local_size(0)) {
    const int j = jb * KILN_CONV_RN + t, r_s = r * s;
    const int ch = (int)((uint)j / (uint)r_s), tap = j - ch * r_s;
    const int ri = (int)((uint)tap / (uint)s), si = tap - ri * s;
    tap_h[t] = j < crs ? ri * dil_h : -h - 1;
    tap_w[t] = si * dil_w;
    tap_x[t] = j < crs ? (ch * h + ri * dil_h) * w + si * dil_w : 0;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (qq >= q || pp >= p) return;
  const int pq = p * q;
  const long depth = (long)per * pq, l = (long)local_img * pq + pp * q + qq;
  const int h0 = pp * stride_h - pad_h, w0 = qq * stride_w - pad_w;
  const bool live = img_r < count;
  /* The position's corner (h0, w0), which may lie in the padding: only
   * in-bounds cells are read. */
  const long corner = x_off + (long)(live ? img_r : 0) * c * h * w + (h0 * w + w0);
  float v[KILN_CONV_RN];
  for (int jj = 0; jj < KILN_CONV_RN; jj++) {
    const int hh = h0 + tap_h[jj], ww = w0 + tap_w[jj];
    v[jj] = live && hh >= 0 && hh < h && ww >= 0 && ww < w ? x[corner + tap_x[jj]] : 0.0f;
  }
  vstore16(vload16(0, v), 0, cols + (((long)slice * nbj + jb) * depth + l) * KILN_CONV_RN);
}

/* dy: in in[0]'s place from in_off, the panel into out's; global (p*q
 * rounded up, 1, slices*per * ceil(k/RM)); work-item pos writes the RM rows
 * of its block at that position. */
#define KILN_CONV_RM 8 /* KILN_GEMM_RM of gemm.cl */
KILN_CL_KERNEL(pack_dy_f32) {
  __global const float *dy = (__global const float *)in0_;
  __global float *out = (__global float *)out_;
  const long dy_off = op.plan.round.in_off;
  const int count = (int)op.plan.round.images, per = (int)op.plan.round.per;
  const int k = (int)op.u.conv2d.k, pq = (int)(op.u.conv2d.p * op.u.conv2d.q);
  const int pos = (int)get_global_id(0), mb = (k + KILN_CONV_RM - 1) / KILN_CONV_RM;
  const int plane = (int)get_global_id(2), ib = plane % mb, img_r = (int)((uint)plane / (uint)mb);
  const int slice = (int)((uint)img_r / (uint)per), local_img = img_r % per; /* img_r: the image of the round */
  if (pos >= pq) return;
  const long depth = (long)per * pq, l = (long)local_img * pq + pos;
  float v[KILN_CONV_RM];
  for (int ii = 0; ii < KILN_CONV_RM; ii++) {
    const int i = ib * KILN_CONV_RM + ii;
    v[ii] = img_r < count && i < k ? dy[dy_off + ((long)img_r * k + i) * pq + pos] : 0.0f;
  }
  vstore8(vload8(0, v), 0, out + (((long)slice * mb + ib) * depth + l) * KILN_CONV_RM);
}

/* CONV2D_BACKWARD_WEIGHT's sum over the images of a round: out[i] = (out[i]
 * when accumulate, else 0) + parts[0][i] + parts[1][i] + ..., in image order;
 * `count` parts (plan.round.images) of len = k*c*r*s, in in[0]'s place from
 * 0; out from out_off; accumulate past the first round (plan.round.first). */
KILN_CL_KERNEL(sum_batches_f32) {
  __global const float *parts = (__global const float *)in0_;
  __global float *out = (__global float *)out_ + op.plan.round.out_off;
  const long len = op.u.conv2d.k * op.u.conv2d.c * op.u.conv2d.r * op.u.conv2d.s;
  const int count = (int)op.plan.round.images, accumulate = op.plan.round.first > 0;
  KILN_FOR_EACH(i, len) {
    float acc = accumulate ? out[i] : 0.0f;
    for (int b = 0; b < count; b++) acc += parts[b * len + i];
    out[i] = acc;
  }
}

/* MAX_POOL2D_BACKWARD, first pass: for every window, where in its plane
 * (y * w + x) its first maximum in row-major order is, NaN above every number
 * (so the first NaN): the cell whose value the forward took. Padded cells
 * are never candidates. One work-item per window, as the forward: x in
 * in[0]'s place from in_off, the indices into out's from out_off. */
KILN_CL_KERNEL(max_pool2d_argmax_f32) {
  __global const float *x = (__global const float *)in0_ + op.plan.round.in_off;
  __global int *arg = (__global int *)out_ + op.plan.round.out_off;
  const long planes = op.u.pooling.n * op.u.pooling.c;
  KILN_POOL_SIZES;
  KILN_FOR_EACH(i, planes * p * q) {
    const int qq = (int)(i % q), pp = (int)(kiln_udiv(i, q) % p);
    const long plane = kiln_udiv(i, (long)p * q);
    __global const float *xp = x + plane * h * w;
    const int h0 = max(pp * stride_h - pad_h, 0), h1 = min(pp * stride_h - pad_h + kernel_h, h);
    const int w0 = max(qq * stride_w - pad_w, 0), w1 = min(qq * stride_w - pad_w + kernel_w, w);
    int best_at = h0 * w + w0;
    float best = xp[best_at];
    for (int y = h0; y < h1; y++)
      for (int xx = w0; xx < w1; xx++) {
        const int at = y * w + xx;
        const float c = xp[at];
        const bool take = c > best || (c != c && best == best);
        best = take ? c : best;
        best_at = take ? at : best_at;
      }
    arg[i] = best_at;
  }
}

/* Second pass, gathered per input element (no atomics): dx at a cell is the
 * sum of dy over the windows whose first maximum it is, windows in row-major
 * order: the indices in in[0]'s place from in_off, dy in in[1]'s from
 * aux_off, dx in out's from out_off. Global (w and h rounded up, planes):
 * the windows' rows depend on dimension 1 only. */
KILN_CL_KERNEL(max_pool2d_backward_f32) {
  __global const int *arg = (__global const int *)in0_;
  __global const float *dy = (__global const float *)in1_;
  __global float *dx = (__global float *)out_;
  const long arg_off = op.plan.round.in_off, dy_off = op.plan.round.aux_off, dx_off = op.plan.round.out_off;
  KILN_POOL_SIZES;
  const int ww = (int)get_global_id(0), hh = (int)get_global_id(1);
  const long plane = (long)get_global_id(2);
  if (ww >= w || hh >= h) return;
  __global const int *argp = arg + arg_off + plane * p * q;
  __global const float *dyp = dy + dy_off + plane * p * q;
  const int self = hh * w + ww;
  /* The windows covering the cell: pp * stride - pad <= hh < that + kernel. */
  const uint th = (uint)(hh + pad_h), tw = (uint)(ww + pad_w);
  const int p0 = th < (uint)kernel_h ? 0 : (int)((th - kernel_h + stride_h) / (uint)stride_h);
  const int q0 = tw < (uint)kernel_w ? 0 : (int)((tw - kernel_w + stride_w) / (uint)stride_w);
  const int p1 = min((int)(th / (uint)stride_h), p - 1), q1 = min((int)(tw / (uint)stride_w), q - 1);
  float sum = 0.0f;
  for (int pp = p0; pp <= p1; pp++)
    for (int qq = q0; qq <= q1; qq++)
      if (argp[pp * q + qq] == self) sum += dyp[pp * q + qq];
  dx[dx_off + (plane * h + hh) * w + ww] = sum;
}

/* The same when windows do not overlap (strides no shorter than the kernel):
 * a cell lies in at most one window, found by one division per axis, and
 * the work-item neither loops nor branches. Operands as above. */
KILN_CL_KERNEL(max_pool2d_backward_disjoint_f32) {
  __global const int *arg = (__global const int *)in0_;
  __global const float *dy = (__global const float *)in1_;
  __global float *dx = (__global float *)out_;
  const long arg_off = op.plan.round.in_off, dy_off = op.plan.round.aux_off, dx_off = op.plan.round.out_off;
  KILN_POOL_SIZES;
  const int ww = (int)get_global_id(0), hh = (int)get_global_id(1);
  const long plane = (long)get_global_id(2);
  if (ww >= w || hh >= h) return;
  const uint th = (uint)(hh + pad_h), tw = (uint)(ww + pad_w);
  const uint pp = th / (uint)stride_h, qq = tw / (uint)stride_w;
  const bool inside = th - pp * stride_h < (uint)kernel_h && tw - qq * stride_w < (uint)kernel_w && pp < (uint)p &&
                      qq < (uint)q;
  const long at = plane * p * q + (inside ? (long)pp * q + qq : 0);
  dx[dx_off + (plane * h + hh) * w + ww] = inside && arg[arg_off + at] == hh * w + ww ? dy[dy_off + at] : 0.0f;
}
