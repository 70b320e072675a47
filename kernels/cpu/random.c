/* kernels/cpu/random.c: the generating ops: FILL, ARANGE and RANDOM (Philox4x32-10, the same numbers as every backend). */
#include <string.h>

#include "kernels/cpu/cpu_native.h"

#define KILN_U32 uint32_t
#define KILN_U64 uint64_t
#define KILN_PHILOX_FN static inline
#define KILN_PHILOX_F64 1
#include "philox.h"

typedef struct gen_job_t {
  const kiln_op_t *op;
  void *out;
  uint64_t bits; /* FILL: the value's bits in out's dtype */
} gen_job_t;

static int64_t numel_of(const kiln_view_t *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

/* A value of a double in `dtype` (kernels/dtype_convert.h's rule), as the
 * low bytes of a uint64 in the machine's order. */
static uint64_t value_bits(kiln_dtype_t dtype, double v) {
  union { uint64_t u; float f32; double f64; int32_t i32; int64_t i64; int16_t i16; uint16_t u16; int8_t i8; uint8_t u8; } b;
  b.u = 0;
  switch (dtype) {
#define KILN_CPU_VALUE_BITS_(E, name, T, carrier) \
  case KILN_##E: { const T x = kiln_dc_f64_to_##name(v); memcpy(&b, &x, sizeof x); break; }
    KILN_DC_DTYPES(KILN_CPU_VALUE_BITS_)
#undef KILN_CPU_VALUE_BITS_
  default: break;
  }
  return b.u;
}

#define KILN_CPU_FILL_(T)                                      \
  do {                                                         \
    T v;                                                       \
    memcpy(&v, &j->bits, sizeof v);                            \
    T *restrict y = j->out;                                    \
    for (int64_t e = begin; e < end; e++) y[e] = v;            \
  } while (0)

static void fill_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gen_job_t *j = ctx;
  switch (kiln_cpu_dtype_size(j->op->out.dtype)) {
  case 1: KILN_CPU_FILL_(uint8_t); break;
  case 2: KILN_CPU_FILL_(uint16_t); break;
  case 4: KILN_CPU_FILL_(uint32_t); break;
  default: KILN_CPU_FILL_(uint64_t); break;
  }
}
#undef KILN_CPU_FILL_

void kiln_cpu_fill(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  /* f32 and i32 take the core's converted scalar (the same rule). */
  gen_job_t j = {op, out, value_bits(op->out.dtype, op->u.fill.value.value)};
  kiln_cpu_parallel_for(par, numel_of(&op->out), KILN_CPU_GRAIN_ELEMENTWISE, fill_task, &j);
}

/* Computed in double and rounded once, so that long ranges do not drift. */
static void arange_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gen_job_t *j = ctx;
  const double start = j->op->u.arange.start, step = j->op->u.arange.step;
  switch (j->op->out.dtype) {
#define KILN_CPU_ARANGE_(E, name, T, carrier)                                                        \
  case KILN_##E: {                                                                                   \
    T *restrict y = j->out;                                                                          \
    for (int64_t e = begin; e < end; e++) y[e] = kiln_dc_f64_to_##name(start + (double)e * step);    \
    break;                                                                                           \
  }
    KILN_DC_DTYPES(KILN_CPU_ARANGE_)
#undef KILN_CPU_ARANGE_
  default: break;
  }
}

void kiln_cpu_arange(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  gen_job_t j = {op, out, 0};
  kiln_cpu_parallel_for(par, numel_of(&op->out), KILN_CPU_GRAIN_ELEMENTWISE, arange_task, &j);
}

/* The dtype's sample of element e (kernels/philox.h says it per dtype). */
#define KILN_CPU_RANDOM_LOOP_(T, EXPR)                             \
  do {                                                             \
    T *restrict y = j->out;                                        \
    for (int64_t e = begin; e < end; e++) y[e] = (EXPR);           \
  } while (0)

static void random_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gen_job_t *j = ctx;
  const uint64_t seed = j->op->u.random.seed;
  const float a = j->op->u.random.a, b = j->op->u.random.b;
  const bool normal = j->op->u.random.normal;
  switch (j->op->out.dtype) {
  case KILN_F64:
    if (normal)
      KILN_CPU_RANDOM_LOOP_(double, kiln_philox_normal_f64((uint64_t)e, seed, a, b));
    else
      KILN_CPU_RANDOM_LOOP_(double, kiln_philox_uniform_f64((uint64_t)e, seed, a, b));
    break;
  case KILN_F16:
    if (normal)
      KILN_CPU_RANDOM_LOOP_(uint16_t, kiln_dc_f64_to_f16((double)kiln_philox_normal((uint64_t)e, seed, a, b)));
    else
      KILN_CPU_RANDOM_LOOP_(uint16_t, kiln_dc_f64_to_f16((double)kiln_philox_uniform((uint64_t)e, seed, a, b)));
    break;
  case KILN_BF16:
    if (normal)
      KILN_CPU_RANDOM_LOOP_(uint16_t, kiln_dc_f64_to_bf16((double)kiln_philox_normal((uint64_t)e, seed, a, b)));
    else
      KILN_CPU_RANDOM_LOOP_(uint16_t, kiln_dc_f64_to_bf16((double)kiln_philox_uniform((uint64_t)e, seed, a, b)));
    break;
  default:
    if (normal)
      KILN_CPU_RANDOM_LOOP_(float, kiln_philox_normal((uint64_t)e, seed, a, b));
    else
      KILN_CPU_RANDOM_LOOP_(float, kiln_philox_uniform((uint64_t)e, seed, a, b));
    break;
  }
}
#undef KILN_CPU_RANDOM_LOOP_

void kiln_cpu_random(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  gen_job_t j = {op, out, 0};
  /* Ten Philox rounds per element: worth splitting early. */
  kiln_cpu_parallel_for(par, numel_of(&op->out), KILN_CPU_GRAIN_ELEMENTWISE / 16, random_task, &j);
}
