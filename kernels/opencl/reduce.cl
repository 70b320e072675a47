/* kernels/opencl/reduce.cl: REDUCE (sum, mean, max, argmax, norm) over the middle axis of [outer, len, inner], f32 and i32. */
/* kiln-kinds: reduce */
/*
 * Generic over the element type T and the accumulate type ACC: one macro,
 * KILN_CL_REDUCE_(T, ACC, TNAME), instantiated once per dtype as a row at
 * the end of this part (f32 accumulates in float, i32 in uint, wrapping).
 * Everything a kernel does with its sum goes through the helpers of its ACC,
 * found by pasting the ACC's name: kiln_acc_<ACC> (the running state, which
 * may carry more than the value), kiln_acc_zero_<ACC>, KILN_ACC_OF_<ACC>
 * (an element, or its square for NORM, as an ACC), kiln_acc_add_<ACC> (into
 * the state), kiln_acc_value_<ACC> (the state's value), kiln_acc_combine_<ACC>
 * (two values, in the tree) and kiln_acc_finish_<ACC> (SUM, MEAN or NORM of
 * a value). Adding an accumulate type is a set of those helpers; adding a
 * dtype a row of instantiations plus its kiln_better_ and kiln_finish_.
 *
 * float sums are compensated (Kahan) per work-item and then combined by a
 * tree in local memory, so their error does not grow with the row length.
 * Maxima follow the CPU backend: NaN wins, and among equals (or NaNs) the
 * first index, whatever order partial results meet in.
 *
 * Three kernels per dtype, and for f32 SUM, MEAN and NORM three more
 * (reduce_*_sum_f32) that read eight floats at a time into a compensated
 * float8 and track nothing else:
 *   reduce_rows_*   inner == 1: one work-group per (row, chunk); with one chunk
 *                   per row it writes the result, otherwise a partial record
 *   reduce_parts_*  merges the partial records of each row in order
 *   reduce_cols_*   inner > 1 (and len == 0): one work-item per output,
 *                   neighbouring work-items on neighbouring columns
 * Partial records live in a scratch buffer, given in in[1]'s place (from
 * its start), as three arrays of P = outer*chunks entries: index (long),
 * then the accumulated value (ACC), then best (T); an ACC is never narrower
 * than its T, so each array stays aligned (kiln_cl_plan_reduce sizes the
 * buffer). The reduce_*_sum_f32 kernels use the ACC array alone (float).
 * The planner's split arrives in op.plan.reduce (chunk, chunks); the shape
 * in op.u.reduce.
 */

enum { KILN_RED_SUM = 0, KILN_RED_MEAN = 1, KILN_RED_MAX = 2, KILN_RED_ARGMAX = 3, KILN_RED_NORM = 4 };

/* Does (bv, bi) beat (av, ai)? An index < 0 is "nothing yet". */
KILN_FN bool kiln_better_f32(float bv, long bi, float av, long ai) {
  if (bi < 0) return false;
  if (ai < 0) return true;
  const bool bn = bv != bv, an = av != av;
  if (bn != an) return bn;
  if (bn || bv == av) return bi < ai;
  return bv > av;
}

KILN_FN bool kiln_better_i32(int bv, long bi, int av, long ai) {
  if (bi < 0) return false;
  if (ai < 0) return true;
  if (bv == av) return bi < ai;
  return bv > av;
}

/* Add v to a compensated sum (sum, comp); infinities switch the compensation
 * off so that inf - inf never turns it into NaN. */
KILN_FN void kiln_kahan_add(float *sum, float *comp, float v) {
  const float y = v - *comp;
  const float t = *sum + y;
  const float c = (t - *sum) - y;
  *comp = isfinite(t) ? c : 0.0f;
  *sum = t;
}

/* ---- the accumulate types ------------------------------------------------------ */

/* float: a Kahan-compensated sum. */
typedef struct kiln_acc_float {
  float sum, comp;
} kiln_acc_float;
KILN_FN kiln_acc_float kiln_acc_zero_float(void) {
  kiln_acc_float a;
  a.sum = 0.0f;
  a.comp = 0.0f;
  return a;
}
#define KILN_ACC_OF_float(v, squares) ((squares) ? (float)(v) * (float)(v) : (float)(v))
KILN_FN void kiln_acc_add_float(kiln_acc_float *a, float v) { kiln_kahan_add(&a->sum, &a->comp, v); }
KILN_FN float kiln_acc_value_float(kiln_acc_float a) { return a.sum - a.comp; }
KILN_FN float kiln_acc_combine_float(float a, float b) { return a + b; }
KILN_FN float kiln_acc_finish_float(float sum, int op, long len) {
  switch (op) {
  case KILN_RED_MEAN: return sum / (float)len; /* len 0: 0/0 is NaN */
  case KILN_RED_NORM: return sqrt(sum);
  default: return sum;
  }
}

/* uint: a sum that wraps (integers; MEAN and NORM are f32 only, so nothing
 * is squared or divided). */
typedef uint kiln_acc_uint;
KILN_FN kiln_acc_uint kiln_acc_zero_uint(void) { return 0u; }
#define KILN_ACC_OF_uint(v, squares) ((uint)(v))
KILN_FN void kiln_acc_add_uint(kiln_acc_uint *a, uint v) { *a += v; }
KILN_FN uint kiln_acc_value_uint(kiln_acc_uint a) { return a; }
KILN_FN uint kiln_acc_combine_uint(uint a, uint b) { return a + b; }
KILN_FN uint kiln_acc_finish_uint(uint sum, int op, long len) { return sum; }

/* ---- the kernels --------------------------------------------------------------- */

/* Write one output (out is the bits of T): MAX and ARGMAX from (best,
 * index), SUM, MEAN and NORM from the finished accumulator `sum`. */
KILN_FN void kiln_finish_f32(__global uint *out, long at, int op, float sum, float best, long index) {
  switch (op) {
  case KILN_RED_MAX: out[at] = as_uint(index < 0 ? -INFINITY : best); break;
  case KILN_RED_ARGMAX: out[at] = (uint)(index < 0 ? 0 : (int)index); break;
  default: out[at] = as_uint(sum); break;
  }
}

KILN_FN void kiln_finish_i32(__global uint *out, long at, int op, uint sum, int best, long index) {
  switch (op) {
  case KILN_RED_MAX: out[at] = (uint)(index < 0 ? (-2147483647 - 1) : best); break;
  case KILN_RED_ARGMAX: out[at] = (uint)(index < 0 ? 0 : (int)index); break;
  default: out[at] = sum; break; /* SUM wraps */
  }
}

/* Each work-item's partial (accumulated value, best value and its index)
 * into local memory, then a tree over the work-group: work-item 0 ends with
 * the group's result. wgs is a power of two. */
#define KILN_RED_COMBINE_(ACC, TNAME)                                                           \
  l_acc[lid] = kiln_acc_value_##ACC(acc);                                                       \
  l_best[lid] = best;                                                                           \
  l_index[lid] = index;                                                                         \
  barrier(CLK_LOCAL_MEM_FENCE);                                                                 \
  for (int s = wgs / 2; s > 0; s >>= 1) {                                                       \
    if (lid < s) {                                                                              \
      l_acc[lid] = kiln_acc_combine_##ACC(l_acc[lid], l_acc[lid + s]);                          \
      if (kiln_better_##TNAME(l_best[lid + s], l_index[lid + s], l_best[lid], l_index[lid])) {  \
        l_best[lid] = l_best[lid + s];                                                          \
        l_index[lid] = l_index[lid + s];                                                        \
      }                                                                                         \
    }                                                                                           \
    barrier(CLK_LOCAL_MEM_FENCE);                                                               \
  }

#define KILN_CL_REDUCE_(T, ACC, TNAME)                                                             \
  KILN_CL_KERNEL(reduce_rows_##TNAME) {                                                            \
    __local ACC l_acc[KILN_CL_REDUCE_WG];                                                          \
    __local T l_best[KILN_CL_REDUCE_WG];                                                           \
    __local long l_index[KILN_CL_REDUCE_WG];                                                       \
    __global const T *in = KILN_CL_IN(T, 0);                                                       \
    __global uint *out = KILN_CL_OUT(uint);                                                        \
    __global long *parts = (__global long *)in1_;                                                  \
    const long outer = op.u.reduce.outer, len = op.u.reduce.len;                                   \
    const long chunk = op.plan.reduce.chunk, chunks = op.plan.reduce.chunks;                       \
    const int rop = op.u.reduce.op;                                                                \
    const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);                           \
    const bool squares = rop == KILN_RED_NORM;                                                     \
    const long items = outer * chunks;                                                             \
    for (long b = (long)get_group_id(0); b < items; b += (long)get_num_groups(0)) {                \
      const long row = kiln_udiv(b, chunks), begin = (b % chunks) * chunk;                         \
      const long end = begin + chunk < len ? begin + chunk : len;                                  \
      __global const T *x = in + row * len;                                                        \
      kiln_acc_##ACC acc = kiln_acc_zero_##ACC();                                                  \
      T best = 0;                                                                                  \
      long index = -1;                                                                             \
      for (long l = begin + lid; l < end; l += wgs) {                                              \
        const T v = x[l];                                                                          \
        kiln_acc_add_##ACC(&acc, KILN_ACC_OF_##ACC(v, squares));                                   \
        if (kiln_better_##TNAME(v, l, best, index)) {                                              \
          best = v;                                                                                \
          index = l;                                                                               \
        }                                                                                          \
      }                                                                                            \
      KILN_RED_COMBINE_(ACC, TNAME);                                                               \
      if (lid == 0) {                                                                              \
        if (chunks == 1) {                                                                         \
          kiln_finish_##TNAME(out, row, rop, kiln_acc_finish_##ACC(l_acc[0], rop, len), l_best[0], \
                              l_index[0]);                                                         \
        } else {                                                                                   \
          __global ACC *p_acc = (__global ACC *)(parts + items);                                   \
          p_acc[b] = l_acc[0];                                                                     \
          ((__global T *)(p_acc + items))[b] = l_best[0];                                          \
          parts[b] = l_index[0];                                                                   \
        }                                                                                          \
      }                                                                                            \
      barrier(CLK_LOCAL_MEM_FENCE); /* the local arrays are reused by the next row */              \
    }                                                                                              \
  }                                                                                                \
  KILN_CL_KERNEL(reduce_parts_##TNAME) {                                                           \
    __local ACC l_acc[KILN_CL_REDUCE_WG];                                                          \
    __local T l_best[KILN_CL_REDUCE_WG];                                                           \
    __local long l_index[KILN_CL_REDUCE_WG];                                                       \
    __global uint *out = KILN_CL_OUT(uint);                                                        \
    __global const long *parts = (__global const long *)in1_;                                      \
    const long outer = op.u.reduce.outer, len = op.u.reduce.len, chunks = op.plan.reduce.chunks;   \
    const int rop = op.u.reduce.op;                                                                \
    const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);                           \
    const long items = outer * chunks;                                                             \
    __global const ACC *p_acc = (__global const ACC *)(parts + items);                            \
    __global const T *p_best = (__global const T *)(p_acc + items);                               \
    for (long row = (long)get_group_id(0); row < outer; row += (long)get_num_groups(0)) {          \
      kiln_acc_##ACC acc = kiln_acc_zero_##ACC();                                                  \
      T best = 0;                                                                                  \
      long index = -1;                                                                             \
      for (long c = lid; c < chunks; c += wgs) {                                                   \
        const long at = row * chunks + c;                                                          \
        kiln_acc_add_##ACC(&acc, p_acc[at]);                                                       \
        if (kiln_better_##TNAME(p_best[at], parts[at], best, index)) {                             \
          best = p_best[at];                                                                       \
          index = parts[at];                                                                       \
        }                                                                                          \
      }                                                                                            \
      KILN_RED_COMBINE_(ACC, TNAME);                                                               \
      if (lid == 0)                                                                                \
        kiln_finish_##TNAME(out, row, rop, kiln_acc_finish_##ACC(l_acc[0], rop, len), l_best[0],   \
                            l_index[0]);                                                           \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                \
    }                                                                                              \
  }                                                                                                \
  KILN_CL_KERNEL(reduce_cols_##TNAME) {                                                            \
    __global const T *in = KILN_CL_IN(T, 0);                                                       \
    __global uint *out = KILN_CL_OUT(uint);                                                        \
    const long outer = op.u.reduce.outer, len = op.u.reduce.len, inner = op.u.reduce.inner;        \
    const int rop = op.u.reduce.op;                                                                \
    const bool squares = rop == KILN_RED_NORM;                                                     \
    KILN_FOR_EACH(o, outer * inner) {                                                              \
      const long row = kiln_udiv(o, inner), col = o % inner;                                       \
      __global const T *x = in + row * len * inner + col;                                          \
      kiln_acc_##ACC acc = kiln_acc_zero_##ACC();                                                  \
      T best = 0;                                                                                  \
      long index = -1;                                                                             \
      for (long l = 0; l < len; l++) {                                                             \
        const T v = x[l * inner];                                                                  \
        kiln_acc_add_##ACC(&acc, KILN_ACC_OF_##ACC(v, squares));                                   \
        if (kiln_better_##TNAME(v, l, best, index)) {                                              \
          best = v;                                                                                \
          index = l;                                                                               \
        }                                                                                          \
      }                                                                                            \
      const ACC sum = kiln_acc_finish_##ACC(kiln_acc_value_##ACC(acc), rop, len);                  \
      kiln_finish_##TNAME(out, o, rop, sum, best, index);                                          \
    }                                                                                              \
  }

/* The rows: (element type, accumulate type, dtype name). */
KILN_CL_REDUCE_(float, float, f32)
KILN_CL_REDUCE_(int, uint, i32)

/* ---- f32 SUM, MEAN, NORM ------------------------------------------------------ */

/* Compensated float8 sum; infinities switch the compensation off. */
KILN_FN void kiln_kahan_add8(float8 *sum, float8 *comp, float8 v) {
  const float8 y = v - *comp;
  const float8 t = *sum + y;
  *comp = select((float8)(0.0f), (t - *sum) - y, isfinite(t));
  *sum = t;
}

KILN_FN float kiln_sum8(float8 s) { return ((s.s0 + s.s1) + (s.s2 + s.s3)) + ((s.s4 + s.s5) + (s.s6 + s.s7)); }

/* The compensated sum (of squares with `squares`) of x[begin, end) shared by
 * the work-items of a group: blocks of eight floats, each work-item taking a
 * contiguous run of blocks (`contiguous`, for CPUs, where a work-item runs
 * alone on a core) or every wgs-th block (GPUs: neighbours read neighbouring
 * blocks); the tail past the last whole block one float per work-item. */
KILN_FN float kiln_partial_sum(__global const float *x, long begin, long end, bool squares, int contiguous) {
  const long lid = (long)get_local_id(0), wgs = (long)get_local_size(0);
  const long blocks = (end - begin) / 8;
  long j0 = lid, j1 = blocks, step = wgs;
  if (contiguous) {
    const long per = (blocks + wgs - 1) / wgs;
    j0 = lid * per;
    j1 = j0 + per < blocks ? j0 + per : blocks;
    step = 1;
  }
  float8 sum = (float8)(0.0f), comp = (float8)(0.0f);
  for (long j = j0; j < j1; j += step) {
    float8 v = vload8(0, x + begin + j * 8);
    if (squares) v = v * v;
    kiln_kahan_add8(&sum, &comp, v);
  }
  float tail = 0.0f, tail_comp = 0.0f;
  for (long l = begin + blocks * 8 + lid; l < end; l += wgs) {
    const float v = x[l];
    kiln_kahan_add(&tail, &tail_comp, squares ? v * v : v);
  }
  return kiln_sum8(sum - comp) + (tail - tail_comp);
}

KILN_FN void kiln_finish_sum(__global float *out, long at, int op, long len, float sum) {
  out[at] = op == KILN_RED_MEAN ? sum / (float)len : op == KILN_RED_NORM ? sqrt(sum) : sum;
}

/* Every work-item gets the group's total of v (a tree in local memory). */
KILN_FN float kiln_reduce_group_sum(float v, __local float *scratch) {
  const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);
  scratch[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = wgs / 2; s > 0; s >>= 1) {
    if (lid < s) scratch[lid] += scratch[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = scratch[0];
  barrier(CLK_LOCAL_MEM_FENCE); /* everyone read it before scratch is reused */
  return r;
}

KILN_CL_KERNEL(reduce_rows_sum_f32) {
  __local float scratch[KILN_CL_REDUCE_WG];
  __global const float *in = KILN_CL_IN(float, 0);
  __global float *out = KILN_CL_OUT(float);
  __global long *parts = (__global long *)in1_;
  const long outer = op.u.reduce.outer, len = op.u.reduce.len;
  const long chunk = op.plan.reduce.chunk, chunks = op.plan.reduce.chunks;
  const int rop = op.u.reduce.op;
  const long items = outer * chunks;
  for (long b = (long)get_group_id(0); b < items; b += (long)get_num_groups(0)) {
    const long row = kiln_udiv(b, chunks), begin = (b % chunks) * chunk;
    const long end = begin + chunk < len ? begin + chunk : len;
    const float sum =
        kiln_reduce_group_sum(kiln_partial_sum(in + row * len, begin, end, rop == KILN_RED_NORM, KILN_CL_ROW_RUNS), scratch);
    if (get_local_id(0) == 0) {
      if (chunks == 1)
        kiln_finish_sum(out, row, rop, len, sum);
      else
        ((__global float *)(parts + items))[b] = sum;
    }
  }
}

KILN_CL_KERNEL(reduce_parts_sum_f32) {
  __local float scratch[KILN_CL_REDUCE_WG];
  __global float *out = KILN_CL_OUT(float);
  __global const long *parts = (__global const long *)in1_;
  const long outer = op.u.reduce.outer, len = op.u.reduce.len, chunks = op.plan.reduce.chunks;
  const int rop = op.u.reduce.op;
  const long items = outer * chunks;
  __global const float *p_sum = (__global const float *)(parts + items);
  for (long row = (long)get_group_id(0); row < outer; row += (long)get_num_groups(0)) {
    float sum = 0.0f, comp = 0.0f;
    for (long c = get_local_id(0); c < chunks; c += get_local_size(0)) kiln_kahan_add(&sum, &comp, p_sum[row * chunks + c]);
    sum = kiln_reduce_group_sum(sum - comp, scratch);
    if (get_local_id(0) == 0) kiln_finish_sum(out, row, rop, len, sum);
  }
}

/* inner > 1: one work-item per eight neighbouring columns of a row (fewer at
 * the row's end), summed down len as one compensated float8. */
KILN_CL_KERNEL(reduce_cols_sum_f32) {
  __global const float *in = KILN_CL_IN(float, 0);
  __global float *out = KILN_CL_OUT(float);
  const long outer = op.u.reduce.outer, len = op.u.reduce.len, inner = op.u.reduce.inner;
  const int rop = op.u.reduce.op;
  const bool squares = rop == KILN_RED_NORM;
  const long blocks = (inner + 7) / 8;
  KILN_FOR_EACH(o, outer * blocks) {
    const long row = kiln_udiv(o, blocks), col = (o % blocks) * 8;
    __global const float *x = in + row * len * inner + col;
    __global float *y = out + row * inner + col;
    if (col + 8 <= inner) {
      float8 sum = (float8)(0.0f), comp = (float8)(0.0f);
      for (long l = 0; l < len; l++) {
        float8 v = vload8(0, x + l * inner);
        if (squares) v = v * v;
        kiln_kahan_add8(&sum, &comp, v);
      }
      sum -= comp;
      if (rop == KILN_RED_MEAN) sum = sum / (float8)((float)len);
      else if (rop == KILN_RED_NORM) sum = sqrt(sum);
      vstore8(sum, 0, y);
    } else {
      for (long c = 0; c < inner - col; c++) {
        float sum = 0.0f, comp = 0.0f;
        for (long l = 0; l < len; l++) {
          const float v = x[l * inner + c];
          kiln_kahan_add(&sum, &comp, squares ? v * v : v);
        }
        kiln_finish_sum(y, c, rop, len, sum - comp);
      }
    }
  }
}
