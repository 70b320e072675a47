/* kernels/cpu/reduce.c: REDUCE (sum, mean, max, argmax, norm) over the middle axis of [outer, len, inner], every dtype. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_native.h"

/*
 * One set of functions per input dtype, from the list at the bottom:
 * - sums (SUM, MEAN, NORM) accumulate in ACC: f32 in f32 (pairwise, the
 *   original code), f16 and bf16 loaded to f32 and summed the same way, f64
 *   in f64, integers and bool in a wrapping 64-bit integer; partial sums of
 *   a split row are combined in COMB (double for the floats, as f32 always
 *   did; the wrapping integer otherwise);
 * - MAX and ARGMAX compare in CT (f32 for f16 and bf16, the dtype itself
 *   otherwise) and keep the index of the best, so MAX stores the element's
 *   own bits.
 * The op's out dtype says what to store: the accumulator goes through the
 * cast rule (kernels/dtype_convert.h) into it (i64 for the sum of an
 * integer, the input's dtype for kiln_tensor_sum_to, the float itself).
 */

/* Pairwise summation: error grows with log(n) instead of n. The leaves are
 * summed in eight lanes the compiler vectorises. */
enum { LEAF = 256, LANES = 8, TILE = 64 };

/* Loads into the accumulator (or compare) type. */
#define KILN_RED_LD_SAME(x) (x)
#define KILN_RED_LD_F16(x) kiln_dc_f16_to_f32(x)
#define KILN_RED_LD_BF16(x) kiln_dc_bf16_to_f32(x)
#define KILN_RED_LD_INT(x) ((kiln_u64)(kiln_i64)(x))
#define KILN_RED_LD_B8(x) ((kiln_u64)((x) != 0))
/* NaN tests by compare type (an integer is never NaN: no self-compare). */
#define KILN_RED_NAN_F(v) ((v) != (v))
#define KILN_RED_NAN_I(v) 0

typedef struct reduce_job_t {
  const kiln_op_t *op;
  const void *in;
  void *out;
  int64_t outer, len, inner, tiles;
  size_t in_size, out_size;
  /* Split-len mode: one output, partial results per chunk (ACC-typed sums,
   * or the index along the row of each chunk's best). */
  void *partial;
  int64_t *partial_at;
  int64_t base; /* offset of the row being split */
} reduce_job_t;

static bool is_sum_like(kiln_reduce_op_t r) {
  return r == KILN_REDUCE_SUM || r == KILN_REDUCE_MEAN || r == KILN_REDUCE_NORM;
}

/* ---- storing results ----------------------------------------------------------- */

static void store_from_f64(void *out, kiln_dtype_t dtype, int64_t at, double v) {
  switch (dtype) {
#define KILN_RED_STORE_(E, name, T, carrier) \
  case KILN_##E: ((T *)out)[at] = kiln_dc_f64_to_##name(v); break;
    KILN_DC_DTYPES(KILN_RED_STORE_)
#undef KILN_RED_STORE_
  default: break;
  }
}

static void store_from_i64(void *out, kiln_dtype_t dtype, int64_t at, kiln_i64 v) {
  switch (dtype) {
#define KILN_RED_STORE_(E, name, T, carrier) \
  case KILN_##E: ((T *)out)[at] = kiln_dc_i64_to_##name(v); break;
    KILN_DC_DTYPES(KILN_RED_STORE_)
#undef KILN_RED_STORE_
  default: break;
  }
}

/* A sum of f32, f16 or bf16 (f32 accumulation, combined in double): the f32
 * result of the op, then that f32 in the out dtype (f16/bf16: RNE, once). */
static void write_f32_sum(const reduce_job_t *j, int64_t at, double sum) {
  float v;
  switch (j->op->u.reduce.op) {
  case KILN_REDUCE_MEAN: v = (float)(sum / (double)j->len); break; /* len 0: 0/0 = NaN */
  case KILN_REDUCE_NORM: v = sqrtf((float)sum); break;
  default: v = (float)sum; break;
  }
  if (j->op->out.dtype == KILN_F32) ((float *)j->out)[at] = v;
  else store_from_f64(j->out, j->op->out.dtype, at, (double)v);
}

static void write_f64_sum(const reduce_job_t *j, int64_t at, double sum) {
  double v;
  switch (j->op->u.reduce.op) {
  case KILN_REDUCE_MEAN: v = sum / (double)j->len; break;
  case KILN_REDUCE_NORM: v = sqrt(sum); break;
  default: v = sum; break;
  }
  store_from_f64(j->out, j->op->out.dtype, at, v);
}

/* Integers and bool: SUM only (the core refuses MEAN and NORM), wrapped
 * into the out dtype modulo 2^bits (i64; the input's dtype for sum_to). */
static void write_int_sum(const reduce_job_t *j, int64_t at, kiln_u64 sum) {
  store_from_i64(j->out, j->op->out.dtype, at, (kiln_i64)sum);
}

/* MAX stores the best element itself; ARGMAX its index along the axis. */
static void write_best(const reduce_job_t *j, int64_t at, int64_t element, int64_t index) {
  if (j->op->u.reduce.op == KILN_REDUCE_ARGMAX) {
    ((int32_t *)j->out)[at] = (int32_t)index;
    return;
  }
  memcpy((char *)j->out + (size_t)at * j->out_size, (const char *)j->in + (size_t)element * j->in_size, j->out_size);
}

/* ---- the functions of one dtype ----------------------------------------------------
 * name: the dtype's short name; T: its storage; CT, LDC, NANC: compare type,
 * load and NaN test for MAX/ARGMAX; ACC, LDA: accumulator and load for sums;
 * COMB, WRITE: partials' combined type and the writer of a finished sum. */
#define KILN_RED_DTYPE_(name, T, CT, LDC, NANC, ACC, LDA, COMB, WRITE)                                     \
  static ACC sum_##name(const T *x, int64_t n, bool squares) {                                             \
    if (n <= LEAF) {                                                                                       \
      ACC acc[LANES] = {0};                                                                                \
      int64_t i = 0;                                                                                       \
      if (squares) {                                                                                       \
        for (; i + LANES <= n; i += LANES)                                                                 \
          for (int l = 0; l < LANES; l++) acc[l] += LDA(x[i + l]) * LDA(x[i + l]);                         \
        for (; i < n; i++) acc[0] += LDA(x[i]) * LDA(x[i]);                                                \
      } else {                                                                                             \
        for (; i + LANES <= n; i += LANES)                                                                 \
          for (int l = 0; l < LANES; l++) acc[l] += LDA(x[i + l]);                                         \
        for (; i < n; i++) acc[0] += LDA(x[i]);                                                            \
      }                                                                                                    \
      return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));            \
    }                                                                                                      \
    int64_t half = (n / 2 + LANES - 1) / LANES * LANES;                                                    \
    return sum_##name(x, half, squares) + sum_##name(x + half, n - half, squares);                         \
  }                                                                                                        \
                                                                                                           \
  /* Column sums of a [len, inner] block, `w` <= TILE columns, pairwise over len. */                       \
  static void sum_cols_##name(const T *x, int64_t len, int64_t inner, int w, bool squares, ACC *acc) {     \
    if (len <= 32) {                                                                                       \
      for (int c = 0; c < w; c++) acc[c] = 0;                                                              \
      for (int64_t l = 0; l < len; l++) {                                                                  \
        const T *row = x + l * inner;                                                                      \
        if (squares)                                                                                       \
          for (int c = 0; c < w; c++) acc[c] += LDA(row[c]) * LDA(row[c]);                                 \
        else                                                                                               \
          for (int c = 0; c < w; c++) acc[c] += LDA(row[c]);                                               \
      }                                                                                                    \
      return;                                                                                              \
    }                                                                                                      \
    ACC tmp[TILE];                                                                                         \
    int64_t half = len / 2;                                                                                \
    sum_cols_##name(x, half, inner, w, squares, acc);                                                      \
    sum_cols_##name(x + half * inner, len - half, inner, w, squares, tmp);                                 \
    for (int c = 0; c < w; c++) acc[c] += tmp[c];                                                          \
  }                                                                                                        \
                                                                                                           \
  /* NaN wins (the first NaN), else the first maximum, as in the frameworks. */                           \
  static inline bool better_##name(CT v, CT best) { return v > best || (NANC(v) && !NANC(best)); }         \
                                                                                                           \
  /* The index of the best of n (>= 1) elements at `stride`. */                                            \
  static int64_t best_##name(const T *x, int64_t n, int64_t stride) {                                      \
    if (n <= 0) return 0;                                                                                  \
    CT best = LDC(x[0]);                                                                                   \
    int64_t at = 0;                                                                                        \
    for (int64_t l = 1; l < n; l++) {                                                                      \
      CT v = LDC(x[l * stride]);                                                                           \
      if (better_##name(v, best)) {                                                                        \
        best = v;                                                                                          \
        at = l;                                                                                            \
      }                                                                                                    \
    }                                                                                                      \
    return at;                                                                                             \
  }                                                                                                        \
                                                                                                           \
  /* inner == 1: items are rows. */                                                                        \
  static void rows_##name(void *ctx, int64_t begin, int64_t end, int thread) {                             \
    const reduce_job_t *j = ctx;                                                                           \
    const kiln_reduce_op_t r = j->op->u.reduce.op;                                                         \
    const T *in = j->in;                                                                                   \
    for (int64_t o = begin; o < end; o++) {                                                                \
      if (is_sum_like(r)) {                                                                                \
        WRITE(j, o, (COMB)sum_##name(in + o * j->len, j->len, r == KILN_REDUCE_NORM));                     \
      } else {                                                                                             \
        int64_t at = best_##name(in + o * j->len, j->len, 1);                                              \
        write_best(j, o, o * j->len + at, at);                                                             \
      }                                                                                                    \
    }                                                                                                      \
  }                                                                                                        \
                                                                                                           \
  /* inner > 1: items are (outer, tile of TILE columns). */                                                \
  static void tiles_##name(void *ctx, int64_t begin, int64_t end, int thread) {                            \
    const reduce_job_t *j = ctx;                                                                           \
    const kiln_reduce_op_t r = j->op->u.reduce.op;                                                         \
    const T *in = j->in;                                                                                   \
    for (int64_t item = begin; item < end; item++) {                                                       \
      int64_t o = item / j->tiles, c0 = (item % j->tiles) * TILE;                                          \
      int w = (int)(j->inner - c0 < TILE ? j->inner - c0 : TILE);                                          \
      int64_t base = o * j->len * j->inner + c0;                                                           \
      if (is_sum_like(r)) {                                                                                \
        ACC acc[TILE];                                                                                     \
        sum_cols_##name(in + base, j->len, j->inner, w, r == KILN_REDUCE_NORM, acc);                       \
        for (int c = 0; c < w; c++) WRITE(j, o * j->inner + c0 + c, (COMB)acc[c]);                         \
      } else {                                                                                             \
        for (int c = 0; c < w; c++) {                                                                      \
          int64_t at = best_##name(in + base + c, j->len, j->inner);                                       \
          write_best(j, o * j->inner + c0 + c, base + c + at * j->inner, at);                              \
        }                                                                                                  \
      }                                                                                                    \
    }                                                                                                      \
  }                                                                                                        \
                                                                                                           \
  /* One long row split over the par: each chunk writes its partial. */                                    \
  static void split_##name(void *ctx, int64_t begin, int64_t end, int thread) {                            \
    const reduce_job_t *j = ctx;                                                                           \
    const kiln_reduce_op_t r = j->op->u.reduce.op;                                                         \
    const T *in = (const T *)j->in + j->base;                                                              \
    if (is_sum_like(r))                                                                                    \
      ((ACC *)j->partial)[thread] = sum_##name(in + begin, end - begin, r == KILN_REDUCE_NORM);            \
    else                                                                                                   \
      j->partial_at[thread] = begin + best_##name(in + begin, end - begin, 1);                             \
  }                                                                                                        \
                                                                                                           \
  /* The partials of `chunks` chunks, in order, into output o. */                                          \
  static void combine_##name(const reduce_job_t *j, int chunks, int64_t o) {                               \
    const T *in = (const T *)j->in + j->base;                                                              \
    if (is_sum_like(j->op->u.reduce.op)) {                                                                 \
      COMB sum = 0;                                                                                        \
      for (int t = 0; t < chunks; t++) sum += ((const ACC *)j->partial)[t];                                \
      WRITE(j, o, sum);                                                                                    \
      return;                                                                                              \
    }                                                                                                      \
    /* Chunks are in order, so the strictly better later chunk wins and                                   \
     * ties keep the first maximum. */                                                                     \
    int64_t at = j->partial_at[0];                                                                         \
    for (int t = 1; t < chunks; t++) {                                                                     \
      const int64_t p = j->partial_at[t];                                                                  \
      if (p >= 0 && better_##name(LDC(in[p]), LDC(in[at]))) at = p;                                        \
    }                                                                                                      \
    write_best(j, o, j->base + at, at);                                                                    \
  }

/* X(ENUM, name, T, CT, LDC, NANC, ACC, LDA, COMB, WRITE) for every dtype. */
#define KILN_RED_DTYPES(X)                                                                                  \
  X(F32, f32, float, float, KILN_RED_LD_SAME, KILN_RED_NAN_F, float, KILN_RED_LD_SAME, double, write_f32_sum) \
  X(I32, i32, kiln_i32, kiln_i32, KILN_RED_LD_SAME, KILN_RED_NAN_I, kiln_u64, KILN_RED_LD_INT, kiln_u64,      \
    write_int_sum)                                                                                          \
  X(F16, f16, kiln_u16, float, KILN_RED_LD_F16, KILN_RED_NAN_F, float, KILN_RED_LD_F16, double, write_f32_sum) \
  X(BF16, bf16, kiln_u16, float, KILN_RED_LD_BF16, KILN_RED_NAN_F, float, KILN_RED_LD_BF16, double,          \
    write_f32_sum)                                                                                          \
  X(F64, f64, double, double, KILN_RED_LD_SAME, KILN_RED_NAN_F, double, KILN_RED_LD_SAME, double, write_f64_sum) \
  X(I64, i64, kiln_i64, kiln_i64, KILN_RED_LD_SAME, KILN_RED_NAN_I, kiln_u64, KILN_RED_LD_INT, kiln_u64,      \
    write_int_sum)                                                                                          \
  X(I8, i8, kiln_i8, kiln_i8, KILN_RED_LD_SAME, KILN_RED_NAN_I, kiln_u64, KILN_RED_LD_INT, kiln_u64,          \
    write_int_sum)                                                                                          \
  X(U8, u8, kiln_u8, kiln_u8, KILN_RED_LD_SAME, KILN_RED_NAN_I, kiln_u64, KILN_RED_LD_INT, kiln_u64,          \
    write_int_sum)                                                                                          \
  X(I16, i16, kiln_i16, kiln_i16, KILN_RED_LD_SAME, KILN_RED_NAN_I, kiln_u64, KILN_RED_LD_INT, kiln_u64,      \
    write_int_sum)                                                                                          \
  X(BOOL, b8, kiln_u8, kiln_u8, KILN_RED_LD_SAME, KILN_RED_NAN_I, kiln_u64, KILN_RED_LD_B8, kiln_u64,         \
    write_int_sum)

#define KILN_RED_EXPAND_(E, name, T, CT, LDC, NANC, ACC, LDA, COMB, WRITE) \
  KILN_RED_DTYPE_(name, T, CT, LDC, NANC, ACC, LDA, COMB, WRITE)
KILN_RED_DTYPES(KILN_RED_EXPAND_)
#undef KILN_RED_EXPAND_

typedef struct reduce_fns_t {
  kiln_cpu_task_fn rows, tiles, split;
  void (*combine)(const reduce_job_t *j, int chunks, int64_t o);
  size_t acc_size;
} reduce_fns_t;

static const reduce_fns_t reduce_fns[KILN_DTYPE_COUNT_] = {
#define KILN_RED_ROW_(E, name, T, CT, LDC, NANC, ACC, LDA, COMB, WRITE) \
  [KILN_##E] = {rows_##name, tiles_##name, split_##name, combine_##name, sizeof(ACC)},
    KILN_RED_DTYPES(KILN_RED_ROW_)
#undef KILN_RED_ROW_
};
_Static_assert(KILN_DTYPE_COUNT_ == 10, "a new dtype needs its row in KILN_RED_DTYPES");

void kiln_cpu_reduce(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  reduce_job_t j = {0};
  j.op = op;
  j.in = in[0];
  j.out = out;
  j.outer = op->u.reduce.outer;
  j.len = op->u.reduce.len;
  j.inner = op->u.reduce.inner;
  j.in_size = kiln_cpu_dtype_size(op->in[0].dtype);
  j.out_size = kiln_cpu_dtype_size(op->out.dtype);
  const int64_t outputs = j.outer * j.inner;
  if (outputs == 0 || (unsigned)op->in[0].dtype >= KILN_DTYPE_COUNT_) return;
  const reduce_fns_t *fns = &reduce_fns[op->in[0].dtype];
  const int threads = kiln_cpu_par_threads(par);
  const int64_t grain_elems = KILN_CPU_GRAIN_ELEMENTWISE;

  if (j.inner > 1) {
    j.tiles = (j.inner + TILE - 1) / TILE;
    int64_t per_item = j.len * TILE;
    kiln_cpu_parallel_for(par, j.outer * j.tiles, per_item >= grain_elems ? 1 : grain_elems / (per_item + 1) + 1,
                          fns->tiles, &j);
    return;
  }
  /* Few long rows: split each row over the par rather than idle threads. */
  if (threads > 1 && j.outer < threads && j.len >= 2 * grain_elems) {
    j.partial = calloc((size_t)threads, fns->acc_size);
    j.partial_at = calloc((size_t)threads, sizeof *j.partial_at);
    if (j.partial && j.partial_at) {
      for (int64_t o = 0; o < j.outer; o++) {
        j.base = o * j.len;
        int64_t max_chunks = j.len / grain_elems;
        int chunks = max_chunks < threads ? (int)max_chunks : threads;
        memset(j.partial, 0, (size_t)threads * fns->acc_size);
        for (int t = 0; t < threads; t++) j.partial_at[t] = -1;
        kiln_cpu_parallel_for(par, j.len, grain_elems, fns->split, &j);
        fns->combine(&j, chunks, o);
      }
      free(j.partial);
      free(j.partial_at);
      return;
    }
    free(j.partial);
    free(j.partial_at);
  }
  int64_t grain = j.len >= grain_elems ? 1 : grain_elems / (j.len + 1) + 1;
  kiln_cpu_parallel_for(par, j.outer, grain, fns->rows, &j);
}
