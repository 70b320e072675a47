/* kernels/cpu/pool.c: MAX_POOL2D on the CPU, computed directly over each input plane. */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"

/* Below this many window reads per chunk the pool is not woken. */
#define KILN_POOL_MIN_READS_PER_CHUNK ((int64_t)1 << 15)

typedef struct pool_job_t {
  const kiln_op_t *op;
  const float *x;
  float *y;
} pool_job_t;

/* Planes [begin, end) of the n*c input planes. */
static void max_pool_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const pool_job_t *job = ctx;
  const kiln_op_t *op = job->op;
  const int64_t h = op->u.pool2d.h, w = op->u.pool2d.w, p = op->u.pool2d.p, q = op->u.pool2d.q;
  const int64_t kh = op->u.pool2d.kernel[0], kw = op->u.pool2d.kernel[1];
  const int64_t st0 = op->u.pool2d.stride[0], st1 = op->u.pool2d.stride[1];
  const int64_t pad0 = op->u.pool2d.pad[0], pad1 = op->u.pool2d.pad[1];
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

void kiln_cpu_max_pool2d_native(kiln_cpu_pool_t *pool, const kiln_op_t *op, const float *x, float *y) {
  const int64_t planes = op->u.pool2d.n * op->u.pool2d.c;
  if (planes <= 0 || op->u.pool2d.p <= 0 || op->u.pool2d.q <= 0) return;
  pool_job_t job = {.op = op, .x = x, .y = y};
  const int64_t reads = op->u.pool2d.p * op->u.pool2d.q * op->u.pool2d.kernel[0] * op->u.pool2d.kernel[1];
  int64_t grain = reads > 0 ? KILN_POOL_MIN_READS_PER_CHUNK / reads : planes;
  if (grain < 1) grain = 1;
  if (pool && planes > grain) {
    kiln_cpu_parallel_for(pool, planes, grain, max_pool_task, &job);
  } else {
    max_pool_task(&job, 0, planes, 0);
  }
}
