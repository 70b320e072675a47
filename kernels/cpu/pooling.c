/* kernels/cpu/pooling.c: MAX_POOL2D and its gradient on the CPU, computed directly over each input plane. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

/* Below this many window reads per chunk the par is not woken. */
#define KILN_POOL_MIN_READS_PER_CHUNK ((int64_t)1 << 15)

typedef struct pool_job_t {
  const kiln_op_t *op;
  const float *x;
  const float *dy; /* the gradient's dy (backward only) */
  float *y;        /* y, or the gradient's dx */
} pool_job_t;

/* Planes [begin, end) of the n*c input planes. */
static void max_pool_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const pool_job_t *job = ctx;
  const kiln_op_t *op = job->op;
  const int64_t h = op->u.pooling.h, w = op->u.pooling.w, p = op->u.pooling.p, q = op->u.pooling.q;
  const int64_t kh = op->u.pooling.kernel[0], kw = op->u.pooling.kernel[1];
  const int64_t st0 = op->u.pooling.stride[0], st1 = op->u.pooling.stride[1];
  const int64_t pad0 = op->u.pooling.pad[0], pad1 = op->u.pooling.pad[1];
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

void kiln_cpu_max_pool2d_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const float *x = in[0];
  float *y = out;
  const int64_t planes = op->u.pooling.n * op->u.pooling.c;
  if (planes <= 0 || op->u.pooling.p <= 0 || op->u.pooling.q <= 0) return;
  pool_job_t job = {.op = op, .x = x, .y = y};
  /* Reads per plane, in double: huge windows would overflow an int64. */
  const double reads = (double)op->u.pooling.p * (double)op->u.pooling.q * op->u.pooling.kernel[0] *
                       op->u.pooling.kernel[1];
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
  const int64_t kh = op->u.pooling.kernel[0], kw = op->u.pooling.kernel[1];
  const int64_t st0 = op->u.pooling.stride[0], st1 = op->u.pooling.stride[1];
  const int64_t pad0 = op->u.pooling.pad[0], pad1 = op->u.pooling.pad[1];
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

void kiln_cpu_max_pool2d_backward_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out,
                                         const void *const *in) {
  const int64_t planes = op->u.pooling.n * op->u.pooling.c;
  if (planes <= 0) return;
  pool_job_t job = {.op = op, .x = in[0], .dy = in[1], .y = out};
  /* The windows' reads plus the plane's zeroing, per plane, in double. */
  const double work = (double)op->u.pooling.p * (double)op->u.pooling.q * op->u.pooling.kernel[0] *
                          op->u.pooling.kernel[1] +
                      (double)op->u.pooling.h * (double)op->u.pooling.w;
  int64_t grain = work >= 1 ? (int64_t)(KILN_POOL_MIN_READS_PER_CHUNK / work) : planes;
  if (grain < 1) grain = 1;
  kiln_cpu_parallel_for(par, planes, grain, max_pool_backward_task, &job);
}
