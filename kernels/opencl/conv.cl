/* kernels/opencl/conv.cl: the parts of CONV2D around the GEMM (im2col, bias) and MAX_POOL2D, NCHW. */

/* [images][c*r*s][p*q] columns of `images` consecutive input images; padded
 * cells are zeros. */
__kernel void im2col_f32(__global const float *x, long x_off, __global float *cols, long images, long c, long h,
                         long w, long r, long s, long p, long q, int stride_h, int stride_w, int pad_h, int pad_w,
                         int dil_h, int dil_w) {
  x += x_off;
  const long pq = p * q, rs = r * s, crs = c * rs;
  KILN_FOR_EACH(i, images * crs * pq) {
    const long col = i % pq, row = kiln_udiv(i, pq) % crs, img = kiln_udiv(i, pq * crs);
    const long ch = kiln_udiv(row, rs), ri = kiln_udiv(row % rs, s), si = row % s;
    const long pp = kiln_udiv(col, q), qq = col % q;
    const long hh = pp * stride_h - pad_h + ri * dil_h;
    const long ww = qq * stride_w - pad_w + si * dil_w;
    cols[i] = hh >= 0 && hh < h && ww >= 0 && ww < w ? x[((img * c + ch) * h + hh) * w + ww] : 0.0f;
  }
}

/* y[img][k][pq] += bias[k] over `images` images. */
__kernel void bias_nchw_f32(__global float *y, long y_off, __global const float *bias, long bias_off, long images,
                            long k, long pq) {
  y += y_off;
  bias += bias_off;
  KILN_FOR_EACH(i, images * k * pq) y[i] += bias[(i / pq) % k];
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
