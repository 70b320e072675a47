/* kernels/opencl/index.cl: GATHER (index_select, every dtype) and INDEX_ADD (its scatter-add gradient, in order of the index), with the report of an index out of range. */
/* kiln-kinds: gather index_add */
#pragma OPENCL FP_CONTRACT OFF

/* Entry j of the index (i32 or i64, in[1]) as a row in [0, len), or -1:
 * when `report` is not NULL, the first work-item to find one swaps its
 * position into report[0] (from -1), then writes its value. */
KILN_FN long kiln_index_row(__global const int *idx32, __global const long *idx64, const long j, const long len,
                            __global int *report) {
  const long v = idx64 ? idx64[j] : (long)idx32[j];
  const long k = v < 0 ? v + len : v;
  if (k >= 0 && k < len) return k;
  if (report) {
    const int pos = j > 2147483647L ? 2147483647 : (int)j;
    if (atomic_cmpxchg((volatile __global int *)report, -1, pos) == -1)
      report[1] = (int)(v > 2147483647L ? 2147483647L : v < -2147483647L - 1 ? -2147483647L - 1 : v);
  }
  return -1;
}

#define KILN_INDEX_OPERANDS                                                                        \
  const int i64 = op.in[1].dtype == KILN_KOP_DT_I64;                                               \
  __global const int *idx32 = i64 ? (__global const int *)0 : KILN_CL_IN(int, 1);                  \
  __global const long *idx64 = i64 ? KILN_CL_IN(long, 1) : (__global const long *)0;               \
  __global int *report = KILN_CL_IN(int, 2);                                                       \
  const long len = op.u.index.len, inner = op.u.index.inner, m = op.u.index.m

/* One work-item per element of out: out[o, j, i] = x[o, index[j], i]. */
#define KILN_GATHER_KERNEL_(name, dc, T, BITS, CLASS)                                              \
  KILN_CL_KERNEL(gather_##name##_##name) {                                                         \
    __global BITS *out = KILN_CL_OUT(BITS);                                                        \
    __global const BITS *x = KILN_CL_IN(BITS, 0);                                                  \
    KILN_INDEX_OPERANDS;                                                                           \
    KILN_FOR_EACH(e, op.n) {                                                                       \
      const long i = e % inner, r = e / inner, j = r % m, o = r / m;                               \
      /* Only the first slice's work-items report, once per entry. */                              \
      const long k = kiln_index_row(idx32, idx64, j, len, (o == 0 && i == 0) ? report : 0);      \
      out[e] = k < 0 ? (BITS)0 : x[(o * len + k) * inner + i];                                     \
    }                                                                                              \
  }
KILN_CL_DTYPES(KILN_GATHER_KERNEL_)

/* One work-item per (o, i) column: x[o, index[j], i] += alpha * src[o, j, i]
 * for j in order, so repeated entries accumulate as on every backend. The
 * host launches numel(x) work-items; those past outer * inner idle. */
#define KILN_INDEX_ADD_KERNEL_(name, T, CT, LOAD, STORE, ALPHA, ADD)                               \
  KILN_CL_KERNEL(index_add_##name##_##name) {                                                      \
    __global T *x = KILN_CL_OUT(T);                                                                \
    __global const T *src = KILN_CL_IN(T, 0);                                                      \
    KILN_INDEX_OPERANDS;                                                                           \
    const CT alpha = ALPHA;                                                                        \
    KILN_FOR_EACH(c, op.u.index.outer * inner) {                                                   \
      const long o = c / inner, i = c % inner;                                                     \
      for (long j = 0; j < m; j++) {                                                               \
        const long k = kiln_index_row(idx32, idx64, j, len, i == 0 ? report : 0);                  \
        if (k < 0) continue;                                                                       \
        const long at = (o * len + k) * inner + i;                                                 \
        if (op.u.index.copy) {                                                                     \
          x[at] = src[(o * m + j) * inner + i];                                                    \
          continue;                                                                                \
        }                                                                                          \
        const CT a = LOAD(x[at]), s = LOAD(src[(o * m + j) * inner + i]);                          \
        x[at] = STORE(ADD(a, alpha, s));                                                           \
      }                                                                                            \
    }                                                                                              \
  }
#define KILN_IDX_ID(v) (v)
#define KILN_IDX_FADD(a, al, s) ((a) + (al) * (s))
#define KILN_IDX_IADD(a, al, s) ((a) + (al) * (s))
KILN_INDEX_ADD_KERNEL_(f32, float, float, KILN_IDX_ID, KILN_IDX_ID, op.u.index.alpha.f32, KILN_IDX_FADD)
KILN_INDEX_ADD_KERNEL_(f16, ushort, float, KILN_CL_TO_F32_f16, KILN_CL_FROM_F32_f16, op.u.index.alpha.f32, KILN_IDX_FADD)
KILN_INDEX_ADD_KERNEL_(bf16, ushort, float, KILN_CL_TO_F32_bf16, KILN_CL_FROM_F32_bf16, op.u.index.alpha.f32,
                       KILN_IDX_FADD)
/* Integers wrap: the sums in the unsigned type of the width. */
KILN_INDEX_ADD_KERNEL_(i32, int, uint, (uint), (int), (uint)op.u.index.alpha.i32, KILN_IDX_IADD)
KILN_INDEX_ADD_KERNEL_(i64, long, ulong, (ulong), (long), (ulong)op.u.index.alpha.bits, KILN_IDX_IADD)
#ifdef KILN_CL_HAVE_FP64
KILN_INDEX_ADD_KERNEL_(f64, double, double, KILN_IDX_ID, KILN_IDX_ID, op.u.index.alpha.value, KILN_IDX_FADD)
#endif
