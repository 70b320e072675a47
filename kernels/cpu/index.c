/* kernels/cpu/index.c: GATHER (index_select) and INDEX_ADD (its scatter-add gradient) on the CPU, with the report of an index out of range. */
#include <string.h>

#include "kernels/cpu/cpu_native.h"

/* Rows of `inner` elements each thread takes at least. */
#define KILN_CPU_INDEX_GRAIN 64

static inline int64_t index_at(const void *index, bool i64, int64_t j) {
  return i64 ? ((const int64_t *)index)[j] : (int64_t)((const int32_t *)index)[j];
}

/* The first thread to find an entry out of range writes its position, then
 * its value (both clamped to i32). */
static void report_bad(int32_t *report, int64_t j, int64_t v) {
  int32_t expected = -1;
  const int32_t pos = j > INT32_MAX ? INT32_MAX : (int32_t)j;
  if (__atomic_compare_exchange_n(&report[0], &expected, pos, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    __atomic_store_n(&report[1], (int32_t)(v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : v),
                     __ATOMIC_RELAXED);
}

/* The entry's row in [0, len), or -1 (reported) when it is outside. */
static inline int64_t row_of(const kiln_op_t *op, const void *index, bool i64, int64_t j, int32_t *report) {
  const int64_t v = index_at(index, i64, j), len = op->u.index.len;
  const int64_t k = v < 0 ? v + len : v;
  if (k < 0 || k >= len) {
    report_bad(report, j, v);
    return -1;
  }
  return k;
}

typedef struct index_job_t {
  const kiln_op_t *op;
  const char *src; /* GATHER: x; INDEX_ADD: src */
  char *dst;       /* GATHER: out; INDEX_ADD: x */
  const void *index;
  bool i64;
  int32_t *report;
  size_t es;
  int64_t chunk, chunks; /* INDEX_ADD: inner split into chunks of `chunk` */
} index_job_t;

/* Rows [begin, end) of out, row r = (o, j): a copy of x's row (o, index[j]). */
static void gather_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const index_job_t *jb = ctx;
  const kiln_op_t *op = jb->op;
  const int64_t m = op->u.index.m, len = op->u.index.len;
  const size_t row = (size_t)op->u.index.inner * jb->es;
  for (int64_t r = begin; r < end; r++) {
    const int64_t o = r / m, k = row_of(op, jb->index, jb->i64, r % m, jb->report);
    if (k < 0)
      memset(jb->dst + (size_t)r * row, 0, row);
    else
      memcpy(jb->dst + (size_t)r * row, jb->src + (size_t)(o * len + k) * row, row);
  }
}

void kiln_cpu_gather(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  index_job_t jb = {.op = op, .src = in[0], .dst = out, .index = in[1], .i64 = op->in[1].dtype == KILN_I64,
                    .report = (int32_t *)(uintptr_t)in[2], .es = kiln_backend_dtype_size(op->out.dtype)};
  const int64_t grain = op->u.index.inner >= KILN_CPU_INDEX_GRAIN ? 1 : KILN_CPU_INDEX_GRAIN / op->u.index.inner;
  kiln_cpu_parallel_for(par, op->u.index.outer * op->u.index.m, grain, gather_task, &jb);
}

/* x[o, k, i] += alpha * src[o, j, i] for i in a chunk, j in order: every
 * element's sum in the order of the index, whatever the split. */
#define KILN_INDEX_ADD_LOOP(T, EXPR)                                                                \
  do {                                                                                              \
    T *restrict xr = (T *)jb->dst + (o * len + k) * inner;                                          \
    const T *restrict sr = (const T *)jb->src + (o * m + j) * inner;                                \
    for (int64_t i = i0; i < i1; i++) xr[i] = EXPR;                                                 \
  } while (0)

static void index_add_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const index_job_t *jb = ctx;
  const kiln_op_t *op = jb->op;
  const int64_t m = op->u.index.m, len = op->u.index.len, inner = op->u.index.inner;
  const kiln_scalar_t alpha = op->u.index.alpha;
  for (int64_t t = begin; t < end; t++) {
    const int64_t o = t / jb->chunks, i0 = (t % jb->chunks) * jb->chunk;
    const int64_t i1 = i0 + jb->chunk < inner ? i0 + jb->chunk : inner;
    /* Only the first chunk of a row reports: one report per entry. */
    int32_t scratch[2] = {-1, 0};
    int32_t *report = i0 == 0 ? jb->report : scratch;
    for (int64_t j = 0; j < m; j++) {
      const int64_t k = row_of(op, jb->index, jb->i64, j, report);
      if (k < 0) continue;
      if (op->u.index.copy) {
        memcpy(jb->dst + (size_t)((o * len + k) * inner + i0) * jb->es,
               jb->src + (size_t)((o * m + j) * inner + i0) * jb->es, (size_t)(i1 - i0) * jb->es);
        continue;
      }
      switch (op->out.dtype) {
      case KILN_F32: {
        const float a = alpha.f32;
        KILN_INDEX_ADD_LOOP(float, xr[i] + a * sr[i]);
        break;
      }
      case KILN_F64: {
        const double a = alpha.value;
        KILN_INDEX_ADD_LOOP(double, xr[i] + a * sr[i]);
        break;
      }
      case KILN_I32: {
        const uint32_t a = (uint32_t)alpha.i32;
        KILN_INDEX_ADD_LOOP(int32_t, (int32_t)((uint32_t)xr[i] + a * (uint32_t)sr[i]));
        break;
      }
      case KILN_I64: {
        const uint64_t a = (uint64_t)alpha.bits;
        KILN_INDEX_ADD_LOOP(int64_t, (int64_t)((uint64_t)xr[i] + a * (uint64_t)sr[i]));
        break;
      }
      case KILN_F16: {
        const float a = alpha.f32;
        KILN_INDEX_ADD_LOOP(uint16_t,
                            kiln_dc_f64_to_f16((double)(kiln_dc_f16_to_f32(xr[i]) + a * kiln_dc_f16_to_f32(sr[i]))));
        break;
      }
      case KILN_BF16: {
        const float a = alpha.f32;
        KILN_INDEX_ADD_LOOP(uint16_t, kiln_dc_f64_to_bf16(
                                          (double)(kiln_dc_bf16_to_f32(xr[i]) + a * kiln_dc_bf16_to_f32(sr[i]))));
        break;
      }
      default: return; /* the core passes no other dtype */
      }
    }
  }
}

void kiln_cpu_index_add(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  index_job_t jb = {.op = op, .src = in[0], .dst = out, .index = in[1], .i64 = op->in[1].dtype == KILN_I64,
                    .report = (int32_t *)(uintptr_t)in[2], .es = kiln_backend_dtype_size(op->out.dtype)};
  const int64_t inner = op->u.index.inner;
  /* Enough pieces for the threads when the rows are few (an embedding's
   * gradient: one row of x per entry, outer 1). */
  const int threads = kiln_cpu_par_threads(par);
  jb.chunks = 1;
  if (op->u.index.outer < 2 * threads && inner >= 2 * KILN_CPU_INDEX_GRAIN) {
    jb.chunks = (2 * threads + op->u.index.outer - 1) / op->u.index.outer;
    if (jb.chunks > inner / KILN_CPU_INDEX_GRAIN) jb.chunks = inner / KILN_CPU_INDEX_GRAIN;
  }
  jb.chunk = (inner + jb.chunks - 1) / jb.chunks;
  kiln_cpu_parallel_for(par, op->u.index.outer * jb.chunks, 1, index_add_task, &jb);
}
