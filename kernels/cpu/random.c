/* kernels/cpu/random.c: the generating ops: FILL, ARANGE and RANDOM (Philox4x32-10, the same numbers as every backend). */
#include <math.h>

#include "kernels/cpu/cpu_native.h"

#define KILN_U32 uint32_t
#define KILN_U64 uint64_t
#define KILN_PHILOX_FN static inline
#define KILN_F_LOG(x) logf(x)
#define KILN_F_SQRT(x) sqrtf(x)
#define KILN_F_COS(x) cosf(x)
#include "philox.h"

typedef struct gen_job_t {
  const kiln_op_t *op;
  void *out;
  float f;
  int32_t i;
} gen_job_t;

static void fill_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gen_job_t *j = ctx;
  if (j->op->out.dtype == KILN_F32) {
    float *restrict y = j->out;
    const float v = j->f;
    for (int64_t e = begin; e < end; e++) y[e] = v;
  } else {
    int32_t *restrict y = j->out;
    const int32_t v = j->i;
    for (int64_t e = begin; e < end; e++) y[e] = v;
  }
}

static int64_t numel_of(const kiln_view_t *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

void kiln_cpu_fill(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  gen_job_t j = {op, out, op->u.fill.value.f32, op->u.fill.value.i32};
  kiln_cpu_parallel_for(par, numel_of(&op->out), KILN_CPU_GRAIN_ELEMENTWISE, fill_task, &j);
}

/* Computed in double and rounded once, so that long ranges do not drift. */
static void arange_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gen_job_t *j = ctx;
  const double start = j->op->u.arange.start, step = j->op->u.arange.step;
  if (j->op->out.dtype == KILN_F32) {
    float *restrict y = j->out;
    for (int64_t e = begin; e < end; e++) y[e] = (float)(start + (double)e * step);
  } else {
    int32_t *restrict y = j->out;
    for (int64_t e = begin; e < end; e++) y[e] = kiln_cpu_double_to_i32(start + (double)e * step);
  }
}

void kiln_cpu_arange(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  gen_job_t j = {op, out, 0.0f, 0};
  kiln_cpu_parallel_for(par, numel_of(&op->out), KILN_CPU_GRAIN_ELEMENTWISE, arange_task, &j);
}

static void random_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gen_job_t *j = ctx;
  const uint64_t seed = j->op->u.random.seed;
  const float a = j->op->u.random.a, b = j->op->u.random.b;
  float *restrict y = j->out;
  if (j->op->u.random.normal) {
    for (int64_t e = begin; e < end; e++) y[e] = kiln_philox_normal((uint64_t)e, seed, a, b);
  } else {
    for (int64_t e = begin; e < end; e++) y[e] = kiln_philox_uniform((uint64_t)e, seed, a, b);
  }
}

void kiln_cpu_random(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  gen_job_t j = {op, out, 0.0f, 0};
  /* Ten Philox rounds per element: worth splitting early. */
  kiln_cpu_parallel_for(par, numel_of(&op->out), KILN_CPU_GRAIN_ELEMENTWISE / 16, random_task, &j);
}
