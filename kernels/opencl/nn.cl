/* kernels/opencl/nn.cl: SOFTMAX / log-softmax over rows and CROSS_ENTROPY (mean of -log_softmax at the label), max-subtracted. */
/*
 * One work-group per row (a power of two no larger than KILN_CL_REDUCE_WG,
 * any width: nothing assumes a warp or wavefront). The row maximum is
 * subtracted so every exp is in (0, 1]; sums are compensated per work-item
 * and combined by a tree in local memory.
 */

/* Every work-item of the group gets the maximum (NaN wins) of their v. */
KILN_FN float kiln_group_max(float v, __local float *scratch) {
  const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = wgs / 2; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] = kiln_max_nan(scratch[lid], scratch[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE); /* everyone read it before scratch is reused */
  return r;
}

/* Every work-item of the group gets the sum of their v. */
KILN_FN float kiln_group_sum(float v, __local float *scratch) {
  const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = wgs / 2; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] += scratch[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

/* Compensated sum; infinities switch the compensation off. */
KILN_FN void kiln_nn_kahan_add(float *sum, float *comp, float v) {
  const float y = v - *comp;
  const float t = *sum + y;
  const float c = (t - *sum) - y;
  *comp = isfinite(t) ? c : 0.0f;
  *sum = t;
}

/* The row's maximum m and sum of exp(x - m), in every work-item. */
KILN_FN float2 kiln_row_max_sumexp(__global const float *x, long cols, __local float *scratch) {
  const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);
  float m = -INFINITY;
  for (long i = lid; i < cols; i += wgs) m = kiln_max_nan(m, x[i]);
  m = kiln_group_max(m, scratch);
  float sum = 0.0f, comp = 0.0f;
  for (long i = lid; i < cols; i += wgs) kiln_nn_kahan_add(&sum, &comp, exp(x[i] - m));
  sum = kiln_group_sum(sum - comp, scratch);
  return (float2)(m, sum);
}

__kernel void softmax_f32(__global const float *in, long in_off, __global float *out, long out_off, long rows,
                          long cols, int log_out) {
  __local float scratch[KILN_CL_REDUCE_WG];
  const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);
  for (long r = (long)get_group_id(0); r < rows; r += (long)get_num_groups(0)) {
    __global const float *x = in + in_off + r * cols;
    __global float *y = out + out_off + r * cols;
    const float2 ms = kiln_row_max_sumexp(x, cols, scratch);
    if (log_out) {
      const float shift = ms.x + log(ms.y);
      for (long i = lid; i < cols; i += wgs) y[i] = x[i] - shift;
    } else {
      const float inv = 1.0f / ms.y;
      for (long i = lid; i < cols; i += wgs) y[i] = exp(x[i] - ms.x) * inv;
    }
  }
}

/* The loss of each row into work[r]; a label out of range gives NaN. */
__kernel void xent_rows(__global const float *logits, long logits_off, __global const int *labels, long labels_off,
                        __global float *work, long rows, long cols) {
  __local float scratch[KILN_CL_REDUCE_WG];
  for (long r = (long)get_group_id(0); r < rows; r += (long)get_num_groups(0)) {
    __global const float *x = logits + logits_off + r * cols;
    const int label = labels[labels_off + r];
    const float2 ms = kiln_row_max_sumexp(x, cols, scratch);
    if (get_local_id(0) == 0)
      work[r] = label < 0 || label >= cols ? NAN : -((x[label] - ms.x) - log(ms.y));
  }
}

/* One work-group: the mean of the row losses (rows 0: NaN, the mean of nothing). */
__kernel void xent_mean(__global const float *work, __global float *out, long out_off, long rows) {
  __local float scratch[KILN_CL_REDUCE_WG];
  const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);
  float sum = 0.0f, comp = 0.0f;
  for (long r = lid; r < rows; r += wgs) kiln_nn_kahan_add(&sum, &comp, work[r]);
  sum = kiln_group_sum(sum - comp, scratch);
  if (lid == 0) out[out_off] = sum / (float)rows;
}
