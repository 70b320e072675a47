/* kernels/opencl/conv.cl: the parts of CONV2D around the GEMM (im2col, bias) and MAX_POOL2D, NCHW. */

/* The input cell that column `col` (an output position) of row `row` (a
 * channel and filter tap) reads; 0 in the padding. */
KILN_FN float kiln_im2col_at(__global const float *x, int col, int row, int h, int w, int r_s, int s,
                             int q, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w) {
  /* Unsigned quotients beside signed remainders: see kiln_udiv. */
  const int ch = (int)((uint)row / (uint)r_s), tap = row % r_s;
  const int ri = (int)((uint)tap / (uint)s), si = tap % s;
  const int pp = (int)((uint)col / (uint)q), qq = col % q;
  const int hh = pp * stride_h - pad_h + ri * dil_h;
  const int ww = qq * stride_w - pad_w + si * dil_w;
  return hh >= 0 && hh < h && ww >= 0 && ww < w ? x[((long)ch * h + hh) * w + ww] : 0.0f;
}

/* [images][c*r*s][p*q] columns of consecutive input images. Global
 * (p*q rounded up, c*r*s, images). */
__kernel void im2col_f32(__global const float *x, long x_off, __global float *cols, int c, int h, int w, int r,
                         int s, int p, int q, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w) {
  const int col = (int)get_global_id(0), row = (int)get_global_id(1);
  const long img = (long)get_global_id(2);
  const int pq = p * q, crs = c * r * s;
  if (col >= pq) return;
  cols[(img * crs + row) * pq + col] = kiln_im2col_at(x + x_off + img * c * h * w, col, row, h, w, r * s, s, q,
                                                      stride_h, stride_w, pad_h, pad_w, dil_h, dil_w);
}

/* The same columns written straight in gemm.cl's packed layout for B
 * ([images][ceil(p*q/RN)][c*r*s][RN], zero past p*q), so the GEMM needs no
 * packing pass of its own. Global (ceil(p*q/RN)*RN rounded up, c*r*s, images). */
#define KILN_CONV_RN 16 /* KILN_GEMM_RN of gemm.cl */
__kernel void im2col_packed_f32(__global const float *x, long x_off, __global float *cols, int c, int h, int w, int r,
                                int s, int p, int q, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h,
                                int dil_w) {
  const int col = (int)get_global_id(0), row = (int)get_global_id(1);
  const long img = (long)get_global_id(2);
  const int pq = p * q, crs = c * r * s, nb = (pq + KILN_CONV_RN - 1) / KILN_CONV_RN;
  if (col >= nb * KILN_CONV_RN) return;
  const long at = img * ((long)nb * crs * KILN_CONV_RN) + ((long)((uint)col / KILN_CONV_RN) * crs + row) * KILN_CONV_RN +
                  (uint)col % KILN_CONV_RN;
  cols[at] = col < pq ? kiln_im2col_at(x + x_off + img * c * h * w, col, row, h, w, r * s, s, q, stride_h, stride_w,
                                       pad_h, pad_w, dil_h, dil_w)
                      : 0.0f;
}

/* y[img][k][pq] += bias[k]. Global (pq rounded up, k, images). */
__kernel void bias_nchw_f32(__global float *y, long y_off, __global const float *bias, long bias_off, int k, int pq) {
  const int col = (int)get_global_id(0), kk = (int)get_global_id(1);
  const long img = (long)get_global_id(2);
  if (col >= pq) return;
  y[y_off + (img * k + kk) * pq + col] += bias[bias_off + kk];
}

/* Padded cells are never candidates; a window wholly in the padding gives
 * -inf; NaN propagates. */
__kernel void max_pool2d_f32(__global const float *x, long x_off, __global float *y, long y_off, long planes, long h,
                             long w, long p, long q, int kernel_h, int kernel_w, int stride_h, int stride_w,
                             int pad_h, int pad_w) {
  x += x_off;
  y += y_off;
  KILN_FOR_EACH(i, planes * p * q) {
    const long qq = i % q, pp = kiln_udiv(i, q) % p, plane = kiln_udiv(i, p * q);
    long h0 = pp * stride_h - pad_h, h1 = h0 + kernel_h;
    long w0 = qq * stride_w - pad_w, w1 = w0 + kernel_w;
    if (h0 < 0) h0 = 0;
    if (h1 > h) h1 = h;
    if (w0 < 0) w0 = 0;
    if (w1 > w) w1 = w;
    __global const float *xp = x + plane * h * w;
    float best = -INFINITY;
    for (long hh = h0; hh < h1; hh++)
      for (long ww = w0; ww < w1; ww++) {
        const float v = xp[hh * w + ww];
        if (v > best || v != v) best = v;
      }
    y[i] = best;
  }
}
