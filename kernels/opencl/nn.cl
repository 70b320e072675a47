/* kernels/opencl/nn.cl: SOFTMAX / log-softmax over rows and CROSS_ENTROPY (mean of -log_softmax at the label), max-subtracted, and their gradients. */
/* kiln-kinds: softmax softmax_backward cross_entropy cross_entropy_backward */
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

/* The work-item's share of a row of `cols`: a contiguous run on CPUs
 * (KILN_CL_ROW_RUNS: each work-item runs alone on a core), every wgs-th
 * element on GPUs (neighbours read neighbours). */
typedef struct kiln_share_t {
  long begin, end, step;
} kiln_share_t;

KILN_FN kiln_share_t kiln_share_of(long cols, int contiguous) {
  const long lid = (long)get_local_id(0), wgs = (long)get_local_size(0);
  kiln_share_t sh;
  if (contiguous) {
    const long per = (cols + wgs - 1) / wgs;
    sh.begin = lid * per < cols ? lid * per : cols;
    sh.end = sh.begin + per < cols ? sh.begin + per : cols;
    sh.step = 1;
  } else {
    sh.begin = lid;
    sh.end = cols;
    sh.step = wgs;
  }
  return sh;
}

/* The row's maximum m and sum of exp(x - m), in every work-item; with `e`
 * not NULL, each exp(x - m) is kept there too (the work-item's own share, read
 * back only by itself). */
KILN_FN float2 kiln_row_max_sumexp(__global const float *x, __global float *e, kiln_share_t sh,
                                   __local float *scratch) {
  float m = -INFINITY;
  for (long i = sh.begin; i < sh.end; i += sh.step) m = kiln_max_nan(m, x[i]);
  m = kiln_group_max(m, scratch);
  float sum = 0.0f, comp = 0.0f;
  if (e) {
    for (long i = sh.begin; i < sh.end; i += sh.step) {
      const float v = exp(x[i] - m);
      e[i] = v;
      kiln_nn_kahan_add(&sum, &comp, v);
    }
  } else {
    for (long i = sh.begin; i < sh.end; i += sh.step) kiln_nn_kahan_add(&sum, &comp, exp(x[i] - m));
  }
  sum = kiln_group_sum(sum - comp, scratch);
  return (float2)(m, sum);
}

KILN_CL_KERNEL(softmax_f32_f32) {
  __local float scratch[KILN_CL_REDUCE_WG];
  const long rows = op.u.softmax.rows, cols = op.u.softmax.cols;
  const int log_out = op.u.softmax.log;
  const kiln_share_t sh = kiln_share_of(cols, KILN_CL_ROW_RUNS);
  for (long r = (long)get_group_id(0); r < rows; r += (long)get_num_groups(0)) {
    __global const float *x = KILN_CL_IN(float, 0) + r * cols;
    __global float *y = KILN_CL_OUT(float) + r * cols;
    const float2 ms = kiln_row_max_sumexp(x, log_out ? (__global float *)0 : y, sh, scratch);
    if (log_out) {
      /* (x - max) - log(sum), in that order: see kernels/cpu/nn.c. */
      const float lse = log(ms.y);
      for (long i = sh.begin; i < sh.end; i += sh.step) y[i] = (x[i] - ms.x) - lse;
    } else {
      const float inv = 1.0f / ms.y;
      for (long i = sh.begin; i < sh.end; i += sh.step) y[i] *= inv;
    }
  }
}

/* CROSS_ENTROPY's two passes (its planner's kernels). The first: the loss
 * of each row into work[r], work the scratch buffer given in out's place
 * (from its start); a label out of range gives NaN. */
KILN_CL_KERNEL(xent_rows) {
  __local float scratch[KILN_CL_REDUCE_WG];
  const long rows = op.u.cross_entropy.n, cols = op.u.cross_entropy.c;
  __global float *work = (__global float *)out_;
  __global const int *labels = KILN_CL_IN(int, 1);
  const kiln_share_t sh = kiln_share_of(cols, KILN_CL_ROW_RUNS);
  for (long r = (long)get_group_id(0); r < rows; r += (long)get_num_groups(0)) {
    __global const float *x = KILN_CL_IN(float, 0) + r * cols;
    const int label = labels[r];
    const float2 ms = kiln_row_max_sumexp(x, (__global float *)0, sh, scratch);
    if (get_local_id(0) == 0)
      work[r] = label < 0 || label >= cols ? NAN : -((x[label] - ms.x) - log(ms.y));
  }
}

/* The second, one work-group: the mean of the row losses (rows 0: NaN, the
 * mean of nothing) into out, work given in in[0]'s place (from its start),
 * and the report (in[2]) the core reads at the next synchronisation: {the
 * first row whose label is outside [0, cols), its label} or {-1, 0}. */
KILN_CL_KERNEL(xent_mean) {
  const long rows = op.u.cross_entropy.n, cols = op.u.cross_entropy.c;
  __global const float *work = (__global const float *)in0_;
  __global const int *labels = KILN_CL_IN(int, 1);
  __global int *report = KILN_CL_IN(int, 2);
  __local float scratch[KILN_CL_REDUCE_WG];
  __local int first;
  const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);
  if (lid == 0) first = INT_MAX;
  barrier(CLK_LOCAL_MEM_FENCE);
  float sum = 0.0f, comp = 0.0f;
  for (long r = lid; r < rows; r += wgs) kiln_nn_kahan_add(&sum, &comp, work[r]);
  for (long r = lid; r < rows && r < INT_MAX; r += wgs) {
    const int label = labels[r];
    if (label < 0 || label >= cols) {
      atomic_min(&first, (int)r);
      break; /* this item's later rows come after it */
    }
  }
  sum = kiln_group_sum(sum - comp, scratch); /* its barriers also publish `first` */
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lid == 0) {
    KILN_CL_OUT(float)[0] = sum / (float)rows;
    report[0] = first == INT_MAX ? -1 : first;
    report[1] = first == INT_MAX ? 0 : labels[first];
  }
}

/* ---- gradients ------------------------------------------------------------------ */

/* SOFTMAX_BACKWARD from the forward's result y: softmax dx = y * (dy -
 * sum(dy * y)), log-softmax dx = dy - exp(y) * sum(dy); one row per
 * work-group as the forward. */
KILN_CL_KERNEL(softmax_backward_f32_f32) {
  __local float scratch[KILN_CL_REDUCE_WG];
  const long rows = op.u.softmax.rows, cols = op.u.softmax.cols;
  const int log_in = op.u.softmax.log;
  const kiln_share_t sh = kiln_share_of(cols, KILN_CL_ROW_RUNS);
  for (long r = (long)get_group_id(0); r < rows; r += (long)get_num_groups(0)) {
    __global const float *y = KILN_CL_IN(float, 0) + r * cols;
    __global const float *dy = KILN_CL_IN(float, 1) + r * cols;
    __global float *dx = KILN_CL_OUT(float) + r * cols;
    float sum = 0.0f, comp = 0.0f;
    if (log_in) {
      for (long i = sh.begin; i < sh.end; i += sh.step) kiln_nn_kahan_add(&sum, &comp, dy[i]);
    } else {
      for (long i = sh.begin; i < sh.end; i += sh.step) kiln_nn_kahan_add(&sum, &comp, dy[i] * y[i]);
    }
    sum = kiln_group_sum(sum - comp, scratch);
    if (log_in) {
      for (long i = sh.begin; i < sh.end; i += sh.step) dx[i] = dy[i] - exp(y[i]) * sum;
    } else {
      for (long i = sh.begin; i < sh.end; i += sh.step) dx[i] = y[i] * (dy[i] - sum);
    }
  }
}

/* CROSS_ENTROPY_BACKWARD: row r of the result is (softmax(x_r) -
 * onehot(label_r)) / rows, times dloss (in[2]) when op.n_in is 3; a label outside
 * [0, cols) makes the row NaN. The exps go straight into the result, each
 * work-item reading back only its own share. */
KILN_CL_KERNEL(cross_entropy_backward_f32_f32) {
  __local float scratch[KILN_CL_REDUCE_WG];
  const long rows = op.u.cross_entropy.n, cols = op.u.cross_entropy.c;
  __global const int *labels = KILN_CL_IN(int, 1);
  const kiln_share_t sh = kiln_share_of(cols, KILN_CL_ROW_RUNS);
  const float scale = op.n_in == 3 ? KILN_CL_IN(float, 2)[0] : 1.0f, count = (float)rows;
  for (long r = (long)get_group_id(0); r < rows; r += (long)get_num_groups(0)) {
    __global const float *x = KILN_CL_IN(float, 0) + r * cols;
    __global float *g = KILN_CL_OUT(float) + r * cols;
    const int label = labels[r];
    const float2 ms = kiln_row_max_sumexp(x, g, sh, scratch);
    if (label < 0 || label >= cols) {
      for (long i = sh.begin; i < sh.end; i += sh.step) g[i] = NAN;
      continue; /* the whole group: the label is the row's */
    }
    const float inv = 1.0f / ms.y;
    for (long i = sh.begin; i < sh.end; i += sh.step)
      g[i] = ((g[i] * inv - (i == label ? 1.0f : 0.0f)) / count) * scale;
  }
}
