/* kernels/cpu/pooling.c: MAX_POOL2D and its gradient on the CPU, computed directly over each input plane. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_native.h"

/* Below this many window reads per chunk the par is not woken. */
#define KILN_POOL_MIN_READS_PER_CHUNK ((int64_t)1 << 15)

typedef struct pool_job_t {
  const kiln_op_t *op;
  const float *x;
  const float *dy; /* the gradient's dy (backward only) */
  float *y;        /* y, or the gradient's dx */
} pool_job_t;

/* The common 2x2 window at stride 2 without padding (every CNN of the
 * tutorials): windows tile the plane, so each output reads two rows and no
 * bound is tested. The same comparisons as the general loop, in the same
 * order, written without branches so that the compiler may vectorize them. */
static inline float pool_pick(float best, float v) { return ((v > best) | (v != v)) ? v : best; }

static int pool_is_2x2_tiling(const kiln_op_t *op) {
  return op->u.pooling.window[0] == 2 && op->u.pooling.window[1] == 2 && op->u.pooling.stride[0] == 2 &&
         op->u.pooling.stride[1] == 2 && op->u.pooling.pad[0] == 0 && op->u.pooling.pad[1] == 0 &&
         2 * op->u.pooling.p <= op->u.pooling.h && 2 * op->u.pooling.q <= op->u.pooling.w;
}

static void max_pool_2x2_plane(const float *x, float *y, int64_t w, int64_t p, int64_t q) {
  for (int64_t pp = 0; pp < p; pp++) {
    const float *r0 = x + 2 * pp * w, *r1 = r0 + w;
    float *out = y + pp * q;
    for (int64_t qq = 0; qq < q; qq++) {
      /* Starting from the first cell equals starting from -inf. */
      float best = r0[2 * qq];
      best = pool_pick(best, r0[2 * qq + 1]);
      best = pool_pick(best, r1[2 * qq]);
      best = pool_pick(best, r1[2 * qq + 1]);
      out[qq] = best;
    }
  }
}

/* The gradient over the same tiling: each cell of x is in one window, so
 * each receives its window's dy or zero, written once; no zeroing pass but
 * for the row and column a tiling of an odd plane leaves out. The first
 * maximum in row-major order (the rule of the general loop below) is the
 * first cell equal to the window's maximum, or the first NaN when the
 * maximum is NaN: each row of windows takes two passes, the maxima as in the
 * forward pass, then masks, both free of branches (which real data would
 * mispredict half the time) and vectorized by the compiler. */
#define KILN_POOL_ROW_CHUNK 256
static void max_pool_2x2_backward_plane(const float *x, const float *dy, float *dx, int64_t h, int64_t w, int64_t p,
                                        int64_t q) {
  if (2 * p != h || 2 * q != w) memset(dx, 0, sizeof(float) * (size_t)(h * w));
  float m[KILN_POOL_ROW_CHUNK];
  for (int64_t pp = 0; pp < p; pp++) {
    for (int64_t q0 = 0; q0 < q; q0 += KILN_POOL_ROW_CHUNK) {
      const int64_t n = q - q0 < KILN_POOL_ROW_CHUNK ? q - q0 : KILN_POOL_ROW_CHUNK;
      const float *restrict r0 = x + 2 * pp * w + 2 * q0, *restrict r1 = r0 + w;
      float *restrict d0 = dx + 2 * pp * w + 2 * q0, *restrict d1 = d0 + w;
      const float *restrict g = dy + pp * q + q0;
      for (int64_t i = 0; i < n; i++)
        m[i] = pool_pick(pool_pick(pool_pick(r0[2 * i], r0[2 * i + 1]), r1[2 * i]), r1[2 * i + 1]);
      for (int64_t i = 0; i < n; i++) {
        const float v0 = r0[2 * i], v1 = r0[2 * i + 1], v2 = r1[2 * i];
        const float mi = m[i];
        const _Bool nan_max = mi != mi;
        const _Bool e0 = (v0 == mi) | ((v0 != v0) & nan_max);
        const _Bool e1 = (v1 == mi) | ((v1 != v1) & nan_max);
        const _Bool e2 = (v2 == mi) | ((v2 != v2) & nan_max);
        /* dy goes to the first cell that matches; the last one takes what
         * is left, which is dy when none of the first three matched. */
        float left = g[i];
        d0[2 * i] = e0 ? left : 0.0f;
        left = e0 ? 0.0f : left;
        d0[2 * i + 1] = e1 ? left : 0.0f;
        left = e1 ? 0.0f : left;
        d1[2 * i] = e2 ? left : 0.0f;
        left = e2 ? 0.0f : left;
        d1[2 * i + 1] = left;
      }
    }
  }
}

/* Planes [begin, end) of the n*c input planes. */
static void max_pool_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const pool_job_t *job = ctx;
  const kiln_op_t *op = job->op;
  const int64_t h = op->u.pooling.h, w = op->u.pooling.w, p = op->u.pooling.p, q = op->u.pooling.q;
  const int64_t kh = op->u.pooling.window[0], kw = op->u.pooling.window[1];
  const int64_t st0 = op->u.pooling.stride[0], st1 = op->u.pooling.stride[1];
  const int64_t pad0 = op->u.pooling.pad[0], pad1 = op->u.pooling.pad[1];
  if (pool_is_2x2_tiling(op)) {
    for (int64_t plane = begin; plane < end; plane++)
      max_pool_2x2_plane(job->x + plane * h * w, job->y + plane * p * q, w, p, q);
    return;
  }
  for (int64_t plane = begin; plane < end; plane++) {
    const float *x = job->x + plane * h * w;
    float *y = job->y + plane * p * q;
    for (int64_t pp = 0; pp < p; pp++) {
      /* Clip the window to the plane instead of testing each cell: padded
       * cells are never candidates, so they can never win. */
      int64_t h0 = pp * st0 - pad0, h1 = h0 + kh;
      if (h0 < 0) h0 = 0;
      if (h1 > h) h1 = h;
      for (int64_t qq = 0; qq < q; qq++) {
        int64_t w0 = qq * st1 - pad1, w1 = w0 + kw;
        if (w0 < 0) w0 = 0;
        if (w1 > w) w1 = w;
        /* A window wholly in the padding has no candidate: -inf, the
         * identity of max. NaN propagates, as in the frameworks. */
        float best = -INFINITY;
        for (int64_t hh = h0; hh < h1; hh++) {
          const float *row = x + hh * w;
          for (int64_t ww = w0; ww < w1; ww++) {
            const float v = row[ww];
            if (v > best || isnan(v)) best = v;
          }
        }
        y[pp * q + qq] = best;
      }
    }
  }
}

static void max_pool2d_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const float *x = in[0];
  float *y = out;
  const int64_t planes = op->u.pooling.n * op->u.pooling.c;
  if (planes <= 0 || op->u.pooling.p <= 0 || op->u.pooling.q <= 0) return;
  pool_job_t job = {.op = op, .x = x, .y = y};
  /* Reads per plane, in double: huge windows would overflow an int64. */
  const double reads = (double)op->u.pooling.p * (double)op->u.pooling.q * op->u.pooling.window[0] *
                       op->u.pooling.window[1];
  int64_t grain = reads >= 1 ? (int64_t)(KILN_POOL_MIN_READS_PER_CHUNK / reads) : planes;
  if (grain < 1) grain = 1;
  if (par && planes > grain) {
    kiln_cpu_parallel_for(par, planes, grain, max_pool_task, &job);
  } else {
    max_pool_task(&job, 0, planes, 0);
  }
}

/* Planes [begin, end) of dx. Each plane belongs to one task, which zeroes it
 * and then visits the windows in row-major order, adding each window's dy to
 * its first maximum: no two threads touch one element, and where windows
 * overlap an element receives its terms in the order of the windows, the
 * same sum a gather over the windows covering it would make. */
static void max_pool_backward_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const pool_job_t *job = ctx;
  const kiln_op_t *op = job->op;
  const int64_t h = op->u.pooling.h, w = op->u.pooling.w, p = op->u.pooling.p, q = op->u.pooling.q;
  const int64_t kh = op->u.pooling.window[0], kw = op->u.pooling.window[1];
  const int64_t st0 = op->u.pooling.stride[0], st1 = op->u.pooling.stride[1];
  const int64_t pad0 = op->u.pooling.pad[0], pad1 = op->u.pooling.pad[1];
  if (pool_is_2x2_tiling(op)) {
    for (int64_t plane = begin; plane < end; plane++)
      max_pool_2x2_backward_plane(job->x + plane * h * w, job->dy + plane * p * q, job->y + plane * h * w, h, w, p, q);
    return;
  }
  for (int64_t plane = begin; plane < end; plane++) {
    const float *x = job->x + plane * h * w;
    const float *dy = job->dy + plane * p * q;
    float *dx = job->y + plane * h * w;
    memset(dx, 0, sizeof(float) * (size_t)(h * w));
    for (int64_t pp = 0; pp < p; pp++) {
      int64_t h0 = pp * st0 - pad0, h1 = h0 + kh;
      if (h0 < 0) h0 = 0;
      if (h1 > h) h1 = h;
      for (int64_t qq = 0; qq < q; qq++) {
        int64_t w0 = qq * st1 - pad1, w1 = w0 + kw;
        if (w0 < 0) w0 = 0;
        if (w1 > w) w1 = w;
        if (h0 >= h1 || w0 >= w1) continue; /* no cell of x: nothing to route */
        /* The first maximum in row-major order: later cells win only when
         * strictly greater; the first NaN wins and keeps the window. A window
         * of -inf (or the identity) routes to its first cell, as PyTorch. */
        int64_t at = h0 * w + w0;
        float best = x[at];
        for (int64_t hh = h0; hh < h1; hh++) {
          const float *row = x + hh * w;
          for (int64_t ww = w0; ww < w1; ww++) {
            const float v = row[ww];
            if (v > best || (v != v && best == best)) {
              best = v;
              at = hh * w + ww;
            }
          }
        }
        dx[at] += dy[pp * q + qq];
      }
    }
  }
}

static void max_pool2d_backward_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out,
                                    const void *const *in) {
  const int64_t planes = op->u.pooling.n * op->u.pooling.c;
  if (planes <= 0) return;
  pool_job_t job = {.op = op, .x = in[0], .dy = in[1], .y = out};
  /* The windows' reads plus the plane's zeroing, per plane, in double. */
  const double work = (double)op->u.pooling.p * (double)op->u.pooling.q * op->u.pooling.window[0] *
                          op->u.pooling.window[1] +
                      (double)op->u.pooling.h * (double)op->u.pooling.w;
  int64_t grain = work >= 1 ? (int64_t)(KILN_POOL_MIN_READS_PER_CHUNK / work) : planes;
  if (grain < 1) grain = 1;
  kiln_cpu_parallel_for(par, planes, grain, max_pool_backward_task, &job);
}

/* f32, or f16/bf16 through f32 (the core refuses f64 here): the maximum of
 * widened values rounds back to itself; the gradient's sums where windows
 * overlap are rounded once. */
void kiln_cpu_max_pool2d_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  if (op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16)
    kiln_cpu_run_via_f32(par, op, out, in, max_pool2d_f32);
  else
    max_pool2d_f32(par, op, out, in);
}

void kiln_cpu_max_pool2d_backward_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out,
                                         const void *const *in) {
  if (op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16)
    kiln_cpu_run_via_f32(par, op, out, in, max_pool2d_backward_f32);
  else
    max_pool2d_backward_f32(par, op, out, in);
}
