/* kernels/cpu/reduce.c: REDUCE (sum, mean, max, argmax, norm) over the middle axis of [outer, len, inner], f32 and i32. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_native.h"

/* Pairwise summation: error grows with log(n) instead of n. The leaves are
 * summed in eight lanes the compiler vectorises. */
enum { LEAF = 256, LANES = 8, TILE = 64 };

static float sum_f32(const float *x, int64_t n, bool squares) {
  if (n <= LEAF) {
    float acc[LANES] = {0};
    int64_t i = 0;
    if (squares) {
      for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l] * x[i + l];
      for (; i < n; i++) acc[0] += x[i] * x[i];
    } else {
      for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l];
      for (; i < n; i++) acc[0] += x[i];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
  int64_t half = (n / 2 + LANES - 1) / LANES * LANES;
  return sum_f32(x, half, squares) + sum_f32(x + half, n - half, squares);
}

/* Column sums of a [len, inner] block, `w` <= TILE columns, pairwise over len. */
static void sum_cols_f32(const float *x, int64_t len, int64_t inner, int w, bool squares, float *acc) {
  if (len <= 32) {
    for (int c = 0; c < w; c++) acc[c] = 0.0f;
    for (int64_t l = 0; l < len; l++) {
      const float *row = x + l * inner;
      if (squares)
        for (int c = 0; c < w; c++) acc[c] += row[c] * row[c];
      else
        for (int c = 0; c < w; c++) acc[c] += row[c];
    }
    return;
  }
  float tmp[TILE];
  int64_t half = len / 2;
  sum_cols_f32(x, half, inner, w, squares, acc);
  sum_cols_f32(x + half * inner, len - half, inner, w, squares, tmp);
  for (int c = 0; c < w; c++) acc[c] += tmp[c];
}

/* NaN wins (and the first NaN for argmax), as in the frameworks. */
static inline bool f32_better(float v, float best) { return v > best || (v != v && best == best); }

typedef struct best_t {
  double value; /* f32 or i32 value, exact in a double */
  int64_t index;
} best_t;

static best_t max_f32(const float *x, int64_t n, int64_t stride) {
  best_t b = {-INFINITY, 0};
  float best = -INFINITY;
  int64_t at = 0;
  for (int64_t l = 0; l < n; l++) {
    float v = x[l * stride];
    if (l == 0 || f32_better(v, best)) {
      best = v;
      at = l;
    }
  }
  b.value = best;
  b.index = at;
  return b;
}

static best_t max_i32(const int32_t *x, int64_t n, int64_t stride) {
  int32_t best = INT32_MIN;
  int64_t at = 0;
  for (int64_t l = 0; l < n; l++) {
    int32_t v = x[l * stride];
    if (v > best || l == 0) {
      best = v;
      at = l;
    }
  }
  best_t b = {(double)best, at};
  return b;
}

static uint32_t sum_i32(const int32_t *x, int64_t n, int64_t stride) {
  uint32_t acc = 0; /* wraps, like every i32 formula */
  for (int64_t l = 0; l < n; l++) acc += (uint32_t)x[l * stride];
  return acc;
}

typedef struct reduce_job_t {
  const kiln_op_t *op;
  const void *in;
  void *out;
  int64_t outer, len, inner, tiles;
  /* Split-len mode: one output, partial results per chunk. */
  float *partial_f;
  uint32_t *partial_u;
  best_t *partial_b;
  int64_t base; /* offset of the row being split */
} reduce_job_t;

static void write_result(const reduce_job_t *j, int64_t at, double sum, uint32_t isum, best_t b) {
  const kiln_op_t *op = j->op;
  if (op->u.reduce.op == KILN_REDUCE_ARGMAX) {
    ((int32_t *)j->out)[at] = (int32_t)b.index;
    return;
  }
  if (op->out.dtype == KILN_I32) {
    ((int32_t *)j->out)[at] = op->u.reduce.op == KILN_REDUCE_MAX ? (int32_t)b.value : (int32_t)isum;
    return;
  }
  float *y = j->out;
  switch (op->u.reduce.op) {
  case KILN_REDUCE_SUM: y[at] = (float)sum; break;
  case KILN_REDUCE_MEAN: y[at] = (float)(sum / (double)j->len); break; /* len 0: 0/0 = NaN */
  case KILN_REDUCE_NORM: y[at] = sqrtf((float)sum); break;
  case KILN_REDUCE_MAX: y[at] = (float)b.value; break;
  default: break;
  }
}

static bool is_sum_like(kiln_reduce_op_t r) {
  return r == KILN_REDUCE_SUM || r == KILN_REDUCE_MEAN || r == KILN_REDUCE_NORM;
}

/* One output of a row: in + base, len elements at `stride` (f32 sums only
 * with stride 1: strided f32 sums go through sum_cols_f32). */
static void reduce_one(const reduce_job_t *j, int64_t base, int64_t stride, int64_t at) {
  const kiln_reduce_op_t r = j->op->u.reduce.op;
  const bool f32 = j->op->in[0].dtype == KILN_F32;
  best_t b = {0, 0};
  double sum = 0;
  uint32_t isum = 0;
  if (is_sum_like(r)) {
    if (f32)
      sum = sum_f32((const float *)j->in + base, j->len, r == KILN_REDUCE_NORM);
    else
      isum = sum_i32((const int32_t *)j->in + base, j->len, stride);
  } else {
    b = f32 ? max_f32((const float *)j->in + base, j->len, stride)
            : max_i32((const int32_t *)j->in + base, j->len, stride);
  }
  write_result(j, at, sum, isum, b);
}

/* inner == 1: items are rows. */
static void rows_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const reduce_job_t *j = ctx;
  for (int64_t o = begin; o < end; o++) reduce_one(j, o * j->len, 1, o);
}

/* inner > 1: items are (outer, tile of TILE columns). */
static void tiles_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const reduce_job_t *j = ctx;
  const kiln_reduce_op_t r = j->op->u.reduce.op;
  const bool f32 = j->op->in[0].dtype == KILN_F32;
  for (int64_t item = begin; item < end; item++) {
    int64_t o = item / j->tiles, c0 = (item % j->tiles) * TILE;
    int w = (int)(j->inner - c0 < TILE ? j->inner - c0 : TILE);
    int64_t base = o * j->len * j->inner + c0;
    if (f32 && is_sum_like(r)) {
      float acc[TILE];
      sum_cols_f32((const float *)j->in + base, j->len, j->inner, w, r == KILN_REDUCE_NORM, acc);
      best_t none = {0, 0};
      for (int c = 0; c < w; c++) write_result(j, o * j->inner + c0 + c, acc[c], 0, none);
    } else {
      for (int c = 0; c < w; c++) reduce_one(j, base + c, j->inner, o * j->inner + c0 + c);
    }
  }
}

/* One long row split over the par: each chunk writes its partial. */
static void split_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const reduce_job_t *j = ctx;
  const kiln_reduce_op_t r = j->op->u.reduce.op;
  const bool f32 = j->op->in[0].dtype == KILN_F32;
  int64_t n = end - begin;
  if (is_sum_like(r)) {
    if (f32)
      j->partial_f[thread] = sum_f32((const float *)j->in + j->base + begin, n, r == KILN_REDUCE_NORM);
    else
      j->partial_u[thread] = sum_i32((const int32_t *)j->in + j->base + begin, n, 1);
  } else {
    best_t b = f32 ? max_f32((const float *)j->in + j->base + begin, n, 1)
                   : max_i32((const int32_t *)j->in + j->base + begin, n, 1);
    b.index += begin;
    j->partial_b[thread] = b;
  }
}

void kiln_cpu_reduce(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  reduce_job_t j = {0};
  j.op = op;
  j.in = in[0];
  j.out = out;
  j.outer = op->u.reduce.outer;
  j.len = op->u.reduce.len;
  j.inner = op->u.reduce.inner;
  const int64_t outputs = j.outer * j.inner;
  if (outputs == 0) return;
  const int threads = kiln_cpu_par_threads(par);
  const int64_t grain_elems = KILN_CPU_GRAIN_ELEMENTWISE;

  if (j.inner > 1) {
    j.tiles = (j.inner + TILE - 1) / TILE;
    int64_t per_item = j.len * TILE;
    kiln_cpu_parallel_for(par, j.outer * j.tiles, per_item >= grain_elems ? 1 : grain_elems / (per_item + 1) + 1,
                          tiles_task, &j);
    return;
  }
  /* Few long rows: split each row over the par rather than idle threads. */
  if (threads > 1 && j.outer < threads && j.len >= 2 * grain_elems) {
    j.partial_f = calloc((size_t)threads, sizeof *j.partial_f);
    j.partial_u = calloc((size_t)threads, sizeof *j.partial_u);
    j.partial_b = calloc((size_t)threads, sizeof *j.partial_b);
    if (j.partial_f && j.partial_u && j.partial_b) {
      const bool f32 = op->in[0].dtype == KILN_F32;
      for (int64_t o = 0; o < j.outer; o++) {
        j.base = o * j.len;
        int64_t max_chunks = j.len / grain_elems;
        int chunks = max_chunks < threads ? (int)max_chunks : threads;
        for (int t = 0; t < threads; t++) {
          j.partial_f[t] = 0.0f;
          j.partial_u[t] = 0;
          j.partial_b[t].value = f32 ? -INFINITY : (double)INT32_MIN;
          j.partial_b[t].index = -1;
        }
        kiln_cpu_parallel_for(par, j.len, grain_elems, split_task, &j);
        double sum = 0;
        uint32_t isum = 0;
        best_t b = j.partial_b[0];
        for (int t = 0; t < chunks; t++) {
          sum += j.partial_f[t];
          isum += j.partial_u[t];
          /* Chunks are in order, so the strictly better later chunk wins
           * and ties keep the first maximum. */
          const best_t *p = &j.partial_b[t];
          if (t > 0 && p->index >= 0 &&
              (f32 ? f32_better((float)p->value, (float)b.value) : p->value > b.value))
            b = *p;
        }
        write_result(&j, o, sum, isum, b);
      }
      free(j.partial_f);
      free(j.partial_u);
      free(j.partial_b);
      return;
    }
    free(j.partial_f);
    free(j.partial_u);
    free(j.partial_b);
  }
  int64_t grain = j.len >= grain_elems ? 1 : grain_elems / (j.len + 1) + 1;
  kiln_cpu_parallel_for(par, j.outer, grain, rows_task, &j);
}
