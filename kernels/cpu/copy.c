/* kernels/cpu/copy.c: walking strided (and broadcast) views row by row; COPY and CAST of any strided view to a contiguous tensor. */
#include <string.h>

#include "kernels/cpu/cpu_native.h"

void kiln_cpu_walk_init(const kiln_view_t *out, const kiln_view_t *in, int n_in, kiln_cpu_walk_t *out_walk) {
  /* The core merged the dimensions already (runtime/backend.h): the walk is
   * the views' own shape and strides. */
  kiln_cpu_walk_t w;
  memset(&w, 0, sizeof w);
  w.numel = 1;
  w.ndim = out->ndim > 0 ? out->ndim : 1;
  for (int d = 0; d < w.ndim; d++) {
    w.shape[d] = out->ndim > 0 ? out->shape[d] : 1;
    w.numel *= w.shape[d];
    for (int k = 0; k < n_in; k++) w.stride[k][d] = out->ndim > 0 ? in[k].strides[d] : 0;
  }
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

void kiln_cpu_copy(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  copy_job_t j;
  kiln_cpu_walk_init(&op->out, op->in, 1, &j.walk);
  j.in = in[0];
  j.out = out;
  j.esize = kiln_cpu_dtype_size(op->out.dtype);
  kiln_cpu_parallel_for(par, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, copy_task, &j);
}

/* ---- CAST ------------------------------------------------------------------------ */

typedef struct cast_job_t {
  kiln_cpu_walk_t walk;
  const void *in;
  void *out;
  bool to_i32;
} cast_job_t;

/* f32 -> i32: toward zero, NaN -> 0, saturating (every backend's rule). */
static inline int32_t f32_to_i32(float x) {
  if (x != x) return 0;
  if (x >= 2147483648.0f) return INT32_MAX;
  if (x <= -2147483648.0f) return INT32_MIN;
  return (int32_t)x;
}

static void cast_row(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count) {
  const cast_job_t *j = ctx;
  const int64_t s = j->walk.stride[0][j->walk.ndim - 1];
  if (j->to_i32) {
    const float *restrict src = (const float *)j->in + off0;
    int32_t *restrict dst = (int32_t *)j->out + pos;
    for (int64_t i = 0; i < count; i++) dst[i] = f32_to_i32(src[i * s]);
  } else {
    /* i32 -> f32 rounds to nearest, ties to even (the default rounding mode). */
    const int32_t *restrict src = (const int32_t *)j->in + off0;
    float *restrict dst = (float *)j->out + pos;
    for (int64_t i = 0; i < count; i++) dst[i] = (float)src[i * s];
  }
}

static void cast_task(void *ctx, int64_t begin, int64_t end, int thread) {
  cast_job_t *j = ctx;
  kiln_cpu_walk_range(&j->walk, begin, end, cast_row, j);
}

void kiln_cpu_cast(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  cast_job_t j;
  kiln_cpu_walk_init(&op->out, op->in, 1, &j.walk);
  j.in = in[0];
  j.out = out;
  j.to_i32 = op->out.dtype == KILN_I32;
  kiln_cpu_parallel_for(par, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, cast_task, &j);
}
