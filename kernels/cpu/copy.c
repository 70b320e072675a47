/* kernels/cpu/copy.c: walking strided (and broadcast) views row by row, and COPY of any strided view to a contiguous tensor. */
#include <string.h>

#include "kernels/cpu/cpu_native.h"

void kiln_cpu_walk_init(const kiln_view_t *out, const kiln_view_t *in, int n_in, kiln_cpu_walk_t *out_walk) {
  kiln_cpu_walk_t w;
  memset(&w, 0, sizeof w);
  w.numel = 1;
  int nd = 0;
  /* Size-1 dims contribute nothing to any offset: drop them. */
  for (int d = 0; d < out->ndim; d++) {
    w.numel *= out->shape[d];
    if (out->shape[d] == 1) continue;
    w.shape[nd] = out->shape[d];
    for (int k = 0; k < n_in; k++) w.stride[k][nd] = in[k].strides[d];
    nd++;
  }
  /* Merge a dim into the next inner one where every input steps over both as
   * over one (the output is contiguous, so it always does). */
  int merged = 0;
  for (int d = 0; d < nd; d++) {
    if (merged > 0) {
      int p = merged - 1;
      bool ok = true;
      for (int k = 0; k < n_in; k++)
        if (w.stride[k][p] != w.stride[k][d] * w.shape[d]) ok = false;
      if (ok) {
        w.shape[p] *= w.shape[d];
        for (int k = 0; k < n_in; k++) w.stride[k][p] = w.stride[k][d];
        continue;
      }
    }
    w.shape[merged] = w.shape[d];
    for (int k = 0; k < n_in; k++) w.stride[k][merged] = w.stride[k][d];
    merged++;
  }
  if (merged == 0) {
    w.shape[0] = 1;
    w.stride[0][0] = w.stride[1][0] = 0;
    merged = 1;
  }
  w.ndim = merged;
  *out_walk = w;
}

void kiln_cpu_walk_range(const kiln_cpu_walk_t *walk, int64_t begin, int64_t end, kiln_cpu_row_fn fn,
                         void *ctx) {
  if (begin >= end) return;
  const int inner = walk->ndim - 1;
  int64_t idx[KILN_MAX_DIMS];
  int64_t off0 = 0, off1 = 0;
  int64_t rest = begin;
  for (int d = inner; d >= 0; d--) {
    idx[d] = rest % walk->shape[d];
    rest /= walk->shape[d];
    off0 += idx[d] * walk->stride[0][d];
    off1 += idx[d] * walk->stride[1][d];
  }
  int64_t pos = begin;
  while (pos < end) {
    int64_t count = walk->shape[inner] - idx[inner];
    if (count > end - pos) count = end - pos;
    fn(ctx, pos, off0, off1, count);
    pos += count;
    if (pos >= end) break;
    /* The row ended (a partial row only ends the range): carry into the
     * outer dims. */
    off0 -= idx[inner] * walk->stride[0][inner];
    off1 -= idx[inner] * walk->stride[1][inner];
    idx[inner] = 0;
    for (int d = inner - 1; d >= 0; d--) {
      idx[d]++;
      off0 += walk->stride[0][d];
      off1 += walk->stride[1][d];
      if (idx[d] < walk->shape[d]) break;
      off0 -= idx[d] * walk->stride[0][d];
      off1 -= idx[d] * walk->stride[1][d];
      idx[d] = 0;
    }
  }
}

typedef struct copy_job_t {
  kiln_cpu_walk_t walk;
  const char *in;
  char *out;
  size_t esize;
} copy_job_t;

static void copy_row(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count) {
  const copy_job_t *j = ctx;
  const int64_t s = j->walk.stride[0][j->walk.ndim - 1];
  if (s == 1) {
    memcpy(j->out + (size_t)pos * j->esize, j->in + (size_t)off0 * j->esize, (size_t)count * j->esize);
    return;
  }
  if (j->esize == 4) {
    const uint32_t *restrict src = (const uint32_t *)j->in + off0;
    uint32_t *restrict dst = (uint32_t *)j->out + pos;
    for (int64_t i = 0; i < count; i++) dst[i] = src[i * s];
  } else {
    for (int64_t i = 0; i < count; i++)
      memcpy(j->out + (size_t)(pos + i) * j->esize, j->in + (size_t)(off0 + i * s) * j->esize, j->esize);
  }
}

static void copy_task(void *ctx, int64_t begin, int64_t end, int thread) {
  copy_job_t *j = ctx;
  kiln_cpu_walk_range(&j->walk, begin, end, copy_row, j);
}

void kiln_cpu_copy(kiln_cpu_pool_t *pool, const kiln_op_t *op, const void *in, void *out) {
  copy_job_t j;
  kiln_cpu_walk_init(&op->out, op->in, 1, &j.walk);
  j.in = in;
  j.out = out;
  j.esize = kiln_cpu_dtype_size(op->out.dtype);
  kiln_cpu_parallel_for(pool, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, copy_task, &j);
}
