/* kernels/opencl/conv.cl: the parts of CONV2D around the GEMM (im2col, bias) and MAX_POOL2D, NCHW. */

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

/* [images][c*r*s][p*q] columns of consecutive input images. Global
 * (q rounded up, p, images * c*r*s). */
__kernel void im2col_f32(__global const float *x, long x_off, __global float *cols, int c, int h, int w, int r,
                         int s, int p, int q, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h, int dil_w) {
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
__kernel void im2col_packed_f32(__global const float *x, long x_off, __global float *cols, int c, int h, int w, int r,
                                int s, int p, int q, int stride_h, int stride_w, int pad_h, int pad_w, int dil_h,
                                int dil_w) {
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
