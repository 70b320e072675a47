/* kernels/cuda/index.cuh: GATHER (index_select, every dtype) and INDEX_ADD (its scatter-add gradient, in order of the index), with the report of an index out of range. */
/* Included once, by kiln.cu. The same rules as the CPU's and OpenCL's
 * kernels: a negative entry counts from the end; one outside [-len, len)
 * reads as zeros (GATHER) or adds nothing (INDEX_ADD), and the first thread
 * to find one swaps its position into report[0] (from -1), then writes its
 * value, for the core to read at the next synchronisation. */

__device__ __forceinline__ int64_t kiln_index_row(const kiln_kop_t &op, int64_t j, int *report) {
  const int64_t v = op.in[1].dtype == KILN_KOP_DT_I64 ? ((const int64_t *)op.in[1].addr)[j]
                                                       : (int64_t)((const int *)op.in[1].addr)[j];
  const int64_t len = op.u.index.len, k = v < 0 ? v + len : v;
  if (k >= 0 && k < len) return k;
  if (report) {
    const int pos = j > 2147483647LL ? 2147483647 : (int)j;
    if (atomicCAS(report, -1, pos) == -1)
      report[1] = (int)(v > 2147483647LL ? 2147483647LL : v < -2147483648LL ? -2147483648LL : v);
  }
  return -1;
}

/* One thread per element of out: out[o, j, i] = x[o, index[j], i], the
 * element's bits copied. */
template <typename BITS> __device__ __forceinline__ void kiln_gather(const kiln_kop_t &op) {
  BITS *__restrict__ out = (BITS *)op.out.addr;
  const BITS *__restrict__ x = (const BITS *)op.in[0].addr;
  int *report = (int *)op.in[2].addr;
  const int64_t len = op.u.index.len, inner = op.u.index.inner, m = op.u.index.m;
  KILN_FOR_EACH(e, op.n) {
    const int64_t i = e % inner, r = e / inner, j = r % m, o = r / m;
    /* Only the first slice's threads report, once per entry. */
    const int64_t k = kiln_index_row(op, j, o == 0 && i == 0 ? report : (int *)0);
    out[e] = k < 0 ? (BITS)0 : x[(o * len + k) * inner + i];
  }
}
#define KILN_GATHER_INSTANCE_(NAME, DC, T, CARRIER, BITS, P) \
  KILN_INSTANCE(kiln_gather_##NAME##_##NAME, kiln_gather<BITS>)
KILN_CUDA_DTYPES(KILN_GATHER_INSTANCE_, ~)
#undef KILN_GATHER_INSTANCE_

/* The add of INDEX_ADD in each dtype: floats as the dtype's formulas (f16
 * and bf16 in f32, rounded once), integers wrapping. */
template <typename T> struct kiln_index_add_op;
template <> struct kiln_index_add_op<float> {
  static __device__ __forceinline__ float f(float a, const kiln_scalar_t &al, float s) {
    return __fadd_rn(a, __fmul_rn(al.f32, s));
  }
};
template <> struct kiln_index_add_op<double> {
  static __device__ __forceinline__ double f(double a, const kiln_scalar_t &al, double s) {
    return __dadd_rn(a, __dmul_rn(al.value, s));
  }
};
template <> struct kiln_index_add_op<int> {
  static __device__ __forceinline__ int f(int a, const kiln_scalar_t &al, int s) {
    return (int)((unsigned)a + (unsigned)al.i32 * (unsigned)s);
  }
};
template <> struct kiln_index_add_op<kiln_i64> {
  static __device__ __forceinline__ kiln_i64 f(kiln_i64 a, const kiln_scalar_t &al, kiln_i64 s) {
    return (kiln_i64)((kiln_u64)a + (kiln_u64)al.bits * (kiln_u64)s);
  }
};
template <typename H> struct kiln_index_add_half {
  static __device__ __forceinline__ H f(H a, const kiln_scalar_t &al, H s) {
    return kiln_cx<H>::out(__fadd_rn(kiln_cx<H>::in(a), __fmul_rn(al.f32, kiln_cx<H>::in(s))));
  }
};
template <> struct kiln_index_add_op<kiln_f16_t> : kiln_index_add_half<kiln_f16_t> {};
template <> struct kiln_index_add_op<kiln_bf16_t> : kiln_index_add_half<kiln_bf16_t> {};

/* One thread per (o, i) column, the entries in order: repeated ones add up
 * in the same order as on every backend. The host launches numel(x) threads;
 * those past outer * inner idle. */
template <typename T> __device__ __forceinline__ void kiln_index_add(const kiln_kop_t &op) {
  T *__restrict__ x = (T *)op.out.addr;
  const T *__restrict__ src = (const T *)op.in[0].addr;
  int *report = (int *)op.in[2].addr;
  const int64_t len = op.u.index.len, inner = op.u.index.inner, m = op.u.index.m;
  KILN_FOR_EACH(c, op.u.index.outer * inner) {
    const int64_t o = c / inner, i = c % inner;
    for (int64_t j = 0; j < m; j++) {
      const int64_t k = kiln_index_row(op, j, i == 0 ? report : (int *)0);
      if (k < 0) continue;
      const int64_t at = (o * len + k) * inner + i;
      x[at] = op.u.index.copy ? src[(o * m + j) * inner + i]
                              : kiln_index_add_op<T>::f(x[at], op.u.index.alpha, src[(o * m + j) * inner + i]);
    }
  }
}
KILN_INSTANCE(kiln_index_add_f32_f32, kiln_index_add<float>)
KILN_INSTANCE(kiln_index_add_f64_f64, kiln_index_add<double>)
KILN_INSTANCE(kiln_index_add_f16_f16, kiln_index_add<kiln_f16_t>)
KILN_INSTANCE(kiln_index_add_bf16_bf16, kiln_index_add<kiln_bf16_t>)
KILN_INSTANCE(kiln_index_add_i32_i32, kiln_index_add<int>)
KILN_INSTANCE(kiln_index_add_i64_i64, kiln_index_add<kiln_i64>)
