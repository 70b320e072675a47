/* kernels/opencl/reduce.cl: REDUCE (sum, mean, max, argmax, norm) over the middle axis of [outer, len, inner], every dtype. */
/* kiln-kinds: reduce */
/*
 * Generic over the element type T, the type CT its values are compared in
 * and the accumulate type ACC: one macro, KILN_CL_REDUCE_(TNAME, T, CT, LOAD,
 * ACC), instantiated once per dtype as a row of KILN_CL_REDUCE_DTYPES_ at
 * the end of this part (f32, f16 and bf16 accumulate in float, f64 in
 * double, integers and bool in long, wrapping). The result goes to out's
 * dtype (op.out.dtype): the input's, i64 for sums of integers, i32 for
 * argmax (kiln_finish_<dtype>).
 * Everything a kernel does with its sum goes through the helpers of its ACC,
 * found by pasting the ACC's name: kiln_acc_<ACC> (the running state, which
 * may carry more than the value), kiln_acc_zero_<ACC>, KILN_ACC_OF_<ACC>
 * (an element, or its square for NORM, as an ACC), kiln_acc_add_<ACC> (into
 * the state), kiln_acc_value_<ACC> (the state's value), kiln_acc_combine_<ACC>
 * (two values, in the tree) and kiln_acc_finish_<ACC> (SUM, MEAN or NORM of
 * a value). Adding an accumulate type is a set of those helpers; adding a
 * dtype a row.
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
 * then the accumulated value (ACC), then best (CT); an ACC is never narrower
 * than its CT, so each array stays aligned (kiln_cl_plan_reduce sizes the
 * buffer). The reduce_*_sum_f32 kernels use the ACC array alone (float).
 * The planner's split arrives in op.plan.reduce (chunk, chunks); the shape
 * in op.u.reduce.
 */

enum { KILN_RED_SUM = 0, KILN_RED_MEAN = 1, KILN_RED_MAX = 2, KILN_RED_ARGMAX = 3, KILN_RED_NORM = 4 };

/* Does (bv, bi) beat (av, ai)? An index < 0 is "nothing yet". One per
 * value type the kernels compare in (float, double, int, long). */
#define KILN_CL_BETTER_FLOAT_(CT)                                                                  \
  KILN_FN bool kiln_better_##CT(CT bv, long bi, CT av, long ai) {                                  \
    if (bi < 0) return false;                                                                      \
    if (ai < 0) return true;                                                                       \
    const bool bn = bv != bv, an = av != av;                                                       \
    if (bn != an) return bn;                                                                       \
    if (bn || bv == av) return bi < ai;                                                            \
    return bv > av;                                                                                \
  }
#define KILN_CL_BETTER_INT_(CT)                                                                    \
  KILN_FN bool kiln_better_##CT(CT bv, long bi, CT av, long ai) {                                  \
    if (bi < 0) return false;                                                                      \
    if (ai < 0) return true;                                                                       \
    if (bv == av) return bi < ai;                                                                  \
    return bv > av;                                                                                \
  }
KILN_CL_BETTER_FLOAT_(float)
KILN_CL_BETTER_INT_(int)
KILN_CL_BETTER_INT_(long)
#ifdef KILN_CL_HAVE_FP64
KILN_CL_BETTER_FLOAT_(double)
#endif

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

/* long: integers and bool, a sum that wraps (two's complement; MEAN and
 * NORM take floats only, so nothing is squared or divided). */
typedef long kiln_acc_long;
KILN_FN kiln_acc_long kiln_acc_zero_long(void) { return 0; }
#define KILN_ACC_OF_long(v, squares) ((long)(v))
KILN_FN void kiln_acc_add_long(kiln_acc_long *a, long v) { *a = (long)((ulong)*a + (ulong)v); }
KILN_FN long kiln_acc_value_long(kiln_acc_long a) { return a; }
KILN_FN long kiln_acc_combine_long(long a, long b) { return (long)((ulong)a + (ulong)b); }
KILN_FN long kiln_acc_finish_long(long sum, int op, long len) { return sum; }

#ifdef KILN_CL_HAVE_FP64
/* double: f64, a Kahan-compensated sum as float's. */
typedef struct kiln_acc_double {
  double sum, comp;
} kiln_acc_double;
KILN_FN kiln_acc_double kiln_acc_zero_double(void) {
  kiln_acc_double a;
  a.sum = 0.0;
  a.comp = 0.0;
  return a;
}
#define KILN_ACC_OF_double(v, squares) ((squares) ? (double)(v) * (double)(v) : (double)(v))
KILN_FN void kiln_acc_add_double(kiln_acc_double *a, double v) {
  const double y = v - a->comp;
  const double t = a->sum + y;
  const double c = (t - a->sum) - y;
  a->comp = isfinite(t) ? c : 0.0;
  a->sum = t;
}
KILN_FN double kiln_acc_value_double(kiln_acc_double a) { return a.sum - a.comp; }
KILN_FN double kiln_acc_combine_double(double a, double b) { return a + b; }
KILN_FN double kiln_acc_finish_double(double sum, int op, long len) {
  switch (op) {
  case KILN_RED_MEAN: return sum / (double)len;
  case KILN_RED_NORM: return sqrt(sum);
  default: return sum;
  }
}
#endif

/* ---- the kernels --------------------------------------------------------------- */

/* kiln_dtype_t's i64 (include/kiln/tensor.h's order): the out dtype of a
 * sum of integers or bool (sum_to keeps the input's dtype instead). */
#define KILN_CL_DTYPE_I64 5

/* Write one output: ARGMAX as i32, MAX as the dtype, SUM, MEAN and NORM
 * from the finished accumulator into out's dtype (i64, or the input's). */
#define KILN_CL_FINISH_(TNAME, T, CT, ACC, STORE, LOWEST)                                          \
  KILN_FN void kiln_finish_##TNAME(__global void *out_, int out_dtype, long at, int op, ACC sum, CT best, \
                                   long index) {                                                   \
    switch (op) {                                                                                  \
    case KILN_RED_MAX: ((__global T *)out_)[at] = STORE(index < 0 ? (LOWEST) : best); break;       \
    case KILN_RED_ARGMAX: ((__global int *)out_)[at] = index < 0 ? 0 : (int)index; break;          \
    default:                                                                                       \
      if (out_dtype == KILN_CL_DTYPE_I64)                                                          \
        ((__global long *)out_)[at] = (long)sum;                                                   \
      else                                                                                         \
        ((__global T *)out_)[at] = STORE(sum);                                                     \
      break;                                                                                       \
    }                                                                                              \
  }

/* Each work-item's partial (accumulated value, best value and its index)
 * into local memory, then a tree over the work-group: work-item 0 ends with
 * the group's result. wgs is a power of two. */
#define KILN_RED_COMBINE_(ACC, CT)                                                           \
  l_acc[lid] = kiln_acc_value_##ACC(acc);                                                       \
  l_best[lid] = best;                                                                           \
  l_index[lid] = index;                                                                         \
  barrier(CLK_LOCAL_MEM_FENCE);                                                                 \
  for (int s = wgs / 2; s > 0; s >>= 1) {                                                       \
    if (lid < s) {                                                                              \
      l_acc[lid] = kiln_acc_combine_##ACC(l_acc[lid], l_acc[lid + s]);                          \
      if (kiln_better_##CT(l_best[lid + s], l_index[lid + s], l_best[lid], l_index[lid])) {  \
        l_best[lid] = l_best[lid + s];                                                          \
        l_index[lid] = l_index[lid + s];                                                        \
      }                                                                                         \
    }                                                                                           \
    barrier(CLK_LOCAL_MEM_FENCE);                                                               \
  }

#define KILN_CL_REDUCE_(TNAME, T, CT, LOAD, ACC)                                                             \
  KILN_CL_KERNEL(reduce_rows_##TNAME) {                                                            \
    __local ACC l_acc[KILN_CL_REDUCE_WG];                                                          \
    __local CT l_best[KILN_CL_REDUCE_WG];                                                           \
    __local long l_index[KILN_CL_REDUCE_WG];                                                       \
    __global const T *in = KILN_CL_IN(T, 0);                                                       \
    __global void *out = KILN_CL_OUT(T);                                                           \
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
      CT best = 0;                                                                                  \
      long index = -1;                                                                             \
      for (long l = begin + lid; l < end; l += wgs) {                                              \
        const CT v = LOAD(x[l]);                                                                          \
        kiln_acc_add_##ACC(&acc, KILN_ACC_OF_##ACC(v, squares));                                   \
        if (kiln_better_##CT(v, l, best, index)) {                                              \
          best = v;                                                                                \
          index = l;                                                                               \
        }                                                                                          \
      }                                                                                            \
      KILN_RED_COMBINE_(ACC, CT);                                                               \
      if (lid == 0) {                                                                              \
        if (chunks == 1) {                                                                         \
          kiln_finish_##TNAME(out, op.out.dtype, row, rop, kiln_acc_finish_##ACC(l_acc[0], rop, len), l_best[0], \
                              l_index[0]);                                                         \
        } else {                                                                                   \
          __global ACC *p_acc = (__global ACC *)(parts + items);                                   \
          p_acc[b] = l_acc[0];                                                                     \
          ((__global CT *)(p_acc + items))[b] = l_best[0];                                          \
          parts[b] = l_index[0];                                                                   \
        }                                                                                          \
      }                                                                                            \
      barrier(CLK_LOCAL_MEM_FENCE); /* the local arrays are reused by the next row */              \
    }                                                                                              \
  }                                                                                                \
  KILN_CL_KERNEL(reduce_parts_##TNAME) {                                                           \
    __local ACC l_acc[KILN_CL_REDUCE_WG];                                                          \
    __local CT l_best[KILN_CL_REDUCE_WG];                                                           \
    __local long l_index[KILN_CL_REDUCE_WG];                                                       \
    __global void *out = KILN_CL_OUT(T);                                                           \
    __global const long *parts = (__global const long *)in1_;                                      \
    const long outer = op.u.reduce.outer, len = op.u.reduce.len, chunks = op.plan.reduce.chunks;   \
    const int rop = op.u.reduce.op;                                                                \
    const int lid = (int)get_local_id(0), wgs = (int)get_local_size(0);                           \
    const long items = outer * chunks;                                                             \
    __global const ACC *p_acc = (__global const ACC *)(parts + items);                            \
    __global const CT *p_best = (__global const CT *)(p_acc + items);                               \
    for (long row = (long)get_group_id(0); row < outer; row += (long)get_num_groups(0)) {          \
      kiln_acc_##ACC acc = kiln_acc_zero_##ACC();                                                  \
      CT best = 0;                                                                                  \
      long index = -1;                                                                             \
      for (long c = lid; c < chunks; c += wgs) {                                                   \
        const long at = row * chunks + c;                                                          \
        kiln_acc_add_##ACC(&acc, p_acc[at]);                                                       \
        if (kiln_better_##CT(p_best[at], parts[at], best, index)) {                             \
          best = p_best[at];                                                                       \
          index = parts[at];                                                                       \
        }                                                                                          \
      }                                                                                            \
      KILN_RED_COMBINE_(ACC, CT);                                                               \
      if (lid == 0)                                                                                \
        kiln_finish_##TNAME(out, op.out.dtype, row, rop, kiln_acc_finish_##ACC(l_acc[0], rop, len), l_best[0],   \
                            l_index[0]);                                                           \
      barrier(CLK_LOCAL_MEM_FENCE);                                                                \
    }                                                                                              \
  }                                                                                                \
  KILN_CL_KERNEL(reduce_cols_##TNAME) {                                                            \
    __global const T *in = KILN_CL_IN(T, 0);                                                       \
    __global void *out = KILN_CL_OUT(T);                                                           \
    const long outer = op.u.reduce.outer, len = op.u.reduce.len, inner = op.u.reduce.inner;        \
    const int rop = op.u.reduce.op;                                                                \
    const bool squares = rop == KILN_RED_NORM;                                                     \
    KILN_FOR_EACH(o, outer * inner) {                                                              \
      const long row = kiln_udiv(o, inner), col = o % inner;                                       \
      __global const T *x = in + row * len * inner + col;                                          \
      kiln_acc_##ACC acc = kiln_acc_zero_##ACC();                                                  \
      CT best = 0;                                                                                  \
      long index = -1;                                                                             \
      for (long l = 0; l < len; l++) {                                                             \
        const CT v = LOAD(x[l * inner]);                                                                  \
        kiln_acc_add_##ACC(&acc, KILN_ACC_OF_##ACC(v, squares));                                   \
        if (kiln_better_##CT(v, l, best, index)) {                                              \
          best = v;                                                                                \
          index = l;                                                                               \
        }                                                                                          \
      }                                                                                            \
      const ACC sum = kiln_acc_finish_##ACC(kiln_acc_value_##ACC(acc), rop, len);                  \
      kiln_finish_##TNAME(out, op.out.dtype, o, rop, sum, best, index);                                          \
    }                                                                                              \
  }

/* The rows: X(dtype, storage T, compare/value type CT, LOAD into CT,
 * accumulate type, STORE from CT or ACC into T, MAX of nothing). f16 and
 * bf16 accumulate in float, f64 in double, integers and bool in long. */
#define KILN_CL_RED_AS_IS_(x) (x)
#define KILN_CL_RED_F16_(x) KILN_CL_FROM_F32_f16((float)(x))
#define KILN_CL_RED_BF16_(x) KILN_CL_FROM_F32_bf16((float)(x))
#define KILN_CL_RED_i8_(x) kiln_dc_i64_to_i8((long)(x))
#define KILN_CL_RED_u8_(x) kiln_dc_i64_to_u8((long)(x))
#define KILN_CL_RED_i16_(x) kiln_dc_i64_to_i16((long)(x))
#define KILN_CL_RED_i32_(x) kiln_dc_i64_to_i32((long)(x))
#define KILN_CL_RED_b8_(x) ((uchar)((x) != 0))
#define KILN_CL_REDUCE_DTYPES_NO_F64_(X)                                                           \
  X(f32, float, float, KILN_CL_RED_AS_IS_, float, (float), -INFINITY)                              \
  X(f16, ushort, float, KILN_CL_TO_F32_f16, float, KILN_CL_RED_F16_, -INFINITY)                    \
  X(bf16, ushort, float, KILN_CL_TO_F32_bf16, float, KILN_CL_RED_BF16_, -INFINITY)                 \
  X(i32, int, int, KILN_CL_RED_AS_IS_, long, KILN_CL_RED_i32_, (-2147483647 - 1))                  \
  X(i64, long, long, KILN_CL_RED_AS_IS_, long, (long), (-0x7fffffffffffffffL - 1))                 \
  X(i8, char, int, KILN_CL_RED_AS_IS_, long, KILN_CL_RED_i8_, -128)                                \
  X(u8, uchar, int, KILN_CL_RED_AS_IS_, long, KILN_CL_RED_u8_, 0)                                  \
  X(i16, short, int, KILN_CL_RED_AS_IS_, long, KILN_CL_RED_i16_, -32768)                           \
  X(bool, uchar, int, KILN_CL_RED_AS_IS_, long, KILN_CL_RED_b8_, 0)
#ifdef KILN_CL_HAVE_FP64
#define KILN_CL_REDUCE_DTYPES_(X)                                                                  \
  KILN_CL_REDUCE_DTYPES_NO_F64_(X) X(f64, double, double, KILN_CL_RED_AS_IS_, double, (double), -INFINITY)
#else
#define KILN_CL_REDUCE_DTYPES_(X) KILN_CL_REDUCE_DTYPES_NO_F64_(X)
#endif
#define KILN_CL_REDUCE_ROW_(TNAME, T, CT, LOAD, ACC, STORE, LOWEST)                                \
  KILN_CL_FINISH_(TNAME, T, CT, ACC, STORE, LOWEST)                                                \
  KILN_CL_REDUCE_(TNAME, T, CT, LOAD, ACC)
KILN_CL_REDUCE_DTYPES_(KILN_CL_REDUCE_ROW_)
#undef KILN_CL_REDUCE_ROW_

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
