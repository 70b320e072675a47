/* kernels/cpu/elementwise.c: UNARY, BINARY, BINARY_SCALAR (f32, i32) and UNARY_BACKWARD (f32), expanded from the shared op table kernels/ops.def. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_native.h"

#define KILN_F_EXP(x) expf(x)
#define KILN_F_LOG(x) logf(x)
#define KILN_F_SQRT(x) sqrtf(x)
#define KILN_F_TANH(x) tanhf(x)
#define KILN_F_FABS(x) fabsf(x)

/* Each formula becomes one row function: `n` outputs from inputs with element
 * strides s (0 = broadcast). The unit-stride cases are separate loops so that
 * the compiler vectorises them; the output never aliases an input (the core
 * always writes a fresh tensor). */
#define KILN_CPU_UNARY_ROW_(T, SUFFIX, NAME, expr)                                              \
  static void unary_##SUFFIX##_##NAME(const void *in_, int64_t s, void *out_, int64_t n) {      \
    const T *restrict in = in_;                                                                \
    T *restrict out = out_;                                                                    \
    if (s == 1) {                                                                              \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const T x = in[i];                                                                     \
        out[i] = expr;                                                                         \
      }                                                                                        \
    } else {                                                                                   \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const T x = in[i * s];                                                                 \
        out[i] = expr;                                                                         \
      }                                                                                        \
    }                                                                                          \
  }

#define KILN_CPU_BINARY_ROW_(T, SUFFIX, NAME, expr)                                             \
  static void binary_##SUFFIX##_##NAME(const void *pa_, int64_t sa, const void *pb_, int64_t sb,  \
                                       void *out_, int64_t n) {                                \
    const T *restrict pa = pa_;                                                                \
    const T *restrict pb = pb_;                                                                \
    T *restrict out = out_;                                                                    \
    if (sa == 1 && sb == 1) {                                                                  \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const T a = pa[i], b = pb[i];                                                          \
        out[i] = expr;                                                                         \
      }                                                                                        \
    } else if (sa == 1 && sb == 0) {                                                           \
      const T b = pb[0];                                                                       \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const T a = pa[i];                                                                     \
        out[i] = expr;                                                                         \
      }                                                                                        \
    } else if (sa == 0 && sb == 1) {                                                           \
      const T a = pa[0];                                                                       \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const T b = pb[i];                                                                     \
        out[i] = expr;                                                                         \
      }                                                                                        \
    } else {                                                                                   \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const T a = pa[i * sa], b = pb[i * sb];                                                \
        out[i] = expr;                                                                         \
      }                                                                                        \
    }                                                                                          \
  }

/* A derivative dy * f'(x) from x (px, stride sx) and dy (pdy, stride sdy). */
#define KILN_CPU_GRAD_ROW_(NAME, expr)                                                          \
  static void grad_f32_##NAME(const void *px_, int64_t sx, const void *pdy_, int64_t sdy,       \
                              void *out_, int64_t n) {                                         \
    const float *restrict px = px_;                                                            \
    const float *restrict pdy = pdy_;                                                          \
    float *restrict out = out_;                                                                \
    if (sx == 1 && sdy == 1) {                                                                 \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const float x = px[i], dy = pdy[i];                                                    \
        (void)x; /* NEG's derivative does not read it */                                       \
        out[i] = expr;                                                                         \
      }                                                                                        \
    } else {                                                                                   \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const float x = px[i * sx], dy = pdy[i * sdy];                                         \
        (void)x;                                                                               \
        out[i] = expr;                                                                         \
      }                                                                                        \
    }                                                                                          \
  }

#define KILN_UNARY_F32(NAME, expr) KILN_CPU_UNARY_ROW_(float, f32, NAME, expr)
#define KILN_UNARY_I32(NAME, expr) KILN_CPU_UNARY_ROW_(int, i32, NAME, expr)
#define KILN_BINARY_F32(NAME, expr) KILN_CPU_BINARY_ROW_(float, f32, NAME, expr)
#define KILN_BINARY_I32(NAME, expr) KILN_CPU_BINARY_ROW_(int, i32, NAME, expr)
#define KILN_UNARY_GRAD_F32(NAME, expr) KILN_CPU_GRAD_ROW_(NAME, expr)
#include "ops.def"

/* The row functions by op and dtype (void pointers: f32 and i32 are both
 * four bytes, so the walk is the same). NULL: no formula for that dtype. */
typedef void (*unary_row_fn)(const void *in, int64_t s, void *out, int64_t n);
typedef void (*binary_row_fn)(const void *a, int64_t sa, const void *b, int64_t sb, void *out, int64_t n);

static const unary_row_fn unary_f32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_F32(NAME, expr) [KILN_UNARY_##NAME] = unary_f32_##NAME,
#include "ops.def"
};
static const unary_row_fn unary_i32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_I32(NAME, expr) [KILN_UNARY_##NAME] = unary_i32_##NAME,
#include "ops.def"
};
static const binary_row_fn binary_f32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_F32(NAME, expr) [KILN_BINARY_##NAME] = binary_f32_##NAME,
#include "ops.def"
};
static const binary_row_fn binary_i32[KILN_BINARY_COUNT_] = {
#define KILN_BINARY_I32(NAME, expr) [KILN_BINARY_##NAME] = binary_i32_##NAME,
#include "ops.def"
};

/* The derivatives have the binary rows' shape: (x, dy) -> dx. */
static const binary_row_fn grad_f32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_GRAD_F32(NAME, expr) [KILN_UNARY_##NAME] = grad_f32_##NAME,
#include "ops.def"
};

static unary_row_fn unary_row(kiln_unary_op_t op, kiln_dtype_t dtype) {
  if ((unsigned)op >= KILN_UNARY_COUNT_) return NULL;
  if (dtype == KILN_F32) return unary_f32[op];
  if (dtype == KILN_I32) return unary_i32[op];
  return NULL;
}

static binary_row_fn binary_row(kiln_binary_op_t op, kiln_dtype_t dtype) {
  if ((unsigned)op >= KILN_BINARY_COUNT_) return NULL;
  if (dtype == KILN_F32) return binary_f32[op];
  if (dtype == KILN_I32) return binary_i32[op];
  return NULL;
}

typedef struct elementwise_job_t {
  kiln_cpu_walk_t walk;
  unary_row_fn unary;
  binary_row_fn binary;
  const char *in0, *in1;
  char *out;
} elementwise_job_t;

enum { ESIZE = 4 };

static void unary_rows(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count) {
  const elementwise_job_t *j = ctx;
  j->unary(j->in0 + off0 * ESIZE, j->walk.stride[0][j->walk.ndim - 1], j->out + pos * ESIZE, count);
}

static void binary_rows(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count) {
  const elementwise_job_t *j = ctx;
  const int inner = j->walk.ndim - 1;
  j->binary(j->in0 + off0 * ESIZE, j->walk.stride[0][inner], j->in1 + off1 * ESIZE, j->walk.stride[1][inner],
            j->out + pos * ESIZE, count);
}

static void unary_task(void *ctx, int64_t begin, int64_t end, int thread) {
  elementwise_job_t *j = ctx;
  kiln_cpu_walk_range(&j->walk, begin, end, unary_rows, j);
}

static void binary_task(void *ctx, int64_t begin, int64_t end, int thread) {
  elementwise_job_t *j = ctx;
  kiln_cpu_walk_range(&j->walk, begin, end, binary_rows, j);
}

/* Transcendentals cost tens of cycles per element, so they split earlier
 * (and so do the derivatives that divide or take a square root). */
static int64_t unary_grain(kiln_unary_op_t op) {
  switch (op) {
  case KILN_UNARY_EXP:
  case KILN_UNARY_LOG:
  case KILN_UNARY_SQRT:
  case KILN_UNARY_SIGMOID:
  case KILN_UNARY_TANH:
    return KILN_CPU_GRAIN_ELEMENTWISE / 8;
  default:
    return KILN_CPU_GRAIN_ELEMENTWISE;
  }
}

void kiln_cpu_unary(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  elementwise_job_t j;
  kiln_cpu_walk_init(&op->out, op->in, 1, &j.walk);
  j.unary = unary_row(op->u.unary.op, op->out.dtype);
  j.binary = NULL;
  j.in0 = in[0];
  j.in1 = NULL;
  j.out = out;
  kiln_cpu_parallel_for(par, j.walk.numel, unary_grain(op->u.unary.op), unary_task, &j);
}

void kiln_cpu_binary(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const void *a = in[0], *b = in[1];
  elementwise_job_t j;
  kiln_cpu_walk_init(&op->out, op->in, 2, &j.walk);
  j.unary = NULL;
  j.binary = binary_row(op->u.binary.op, op->out.dtype);
  j.in0 = a;
  j.in1 = b;
  j.out = out;
  kiln_cpu_parallel_for(par, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, binary_task, &j);
}

void kiln_cpu_binary_scalar(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const void *a = in[0];
  union { float f; int32_t i; } scalar;
  if (op->out.dtype == KILN_F32)
    scalar.f = op->u.binary.scalar.f32;
  else
    scalar.i = op->u.binary.scalar.i32;
  /* The scalar is a second operand broadcast over every dim. */
  kiln_view_t views[2];
  views[0] = op->in[0];
  memset(&views[1], 0, sizeof views[1]);
  views[1].ndim = op->out.ndim;
  elementwise_job_t j;
  kiln_cpu_walk_init(&op->out, views, 2, &j.walk);
  j.unary = NULL;
  j.binary = binary_row(op->u.binary.op, op->out.dtype);
  j.in0 = a;
  j.in1 = (const char *)&scalar;
  j.out = out;
  kiln_cpu_parallel_for(par, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, binary_task, &j);
}

void kiln_cpu_unary_backward(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  /* x and dy are walked like the two operands of a binary op. */
  elementwise_job_t j;
  kiln_cpu_walk_init(&op->out, op->in, 2, &j.walk);
  j.unary = NULL;
  j.binary = (unsigned)op->u.unary.op < KILN_UNARY_COUNT_ ? grad_f32[op->u.unary.op] : NULL;
  j.in0 = in[0];
  j.in1 = in[1];
  j.out = out;
  kiln_cpu_parallel_for(par, j.walk.numel, unary_grain(op->u.unary.op), binary_task, &j);
}

/* ---- where ------------------------------------------------------------------------------ */

/* WHERE: out = cond != 0 ? a : b over out's merged dimensions, each input
 * by its strides. a and b are copied as 32-bit patterns, whatever their
 * dtype; the condition is read in its own. */
typedef struct where_job_t {
  const kiln_op_t *op;
  const char *in[3];
  uint32_t *out;
} where_job_t;

#define KILN_CPU_WHERE_RUN_(T)                                                                     \
  for (int64_t k = 0; k < run; k++)                                                                \
    out[k] = ((const T *)c)[k * sc] != 0 ? ((const uint32_t *)a)[k * sa] : ((const uint32_t *)b)[k * sb];

static void where_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const where_job_t *j = ctx;
  const kiln_op_t *op = j->op;
  const int nd = op->out.ndim, inner = nd - 1;
  int64_t idx[KILN_MAX_DIMS], off[3] = {0, 0, 0};
  int64_t rest = begin;
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = rest % op->out.shape[d];
    rest /= op->out.shape[d];
    for (int v = 0; v < 3; v++) off[v] += idx[d] * op->in[v].strides[d];
  }
  const int64_t sc = op->in[0].strides[inner], sa = op->in[1].strides[inner], sb = op->in[2].strides[inner];
  for (int64_t i = begin; i < end;) {
    int64_t run = op->out.shape[inner] - idx[inner];
    if (run > end - i) run = end - i;
    const char *c = j->in[0] + off[0] * 4, *a = j->in[1] + off[1] * 4, *b = j->in[2] + off[2] * 4;
    uint32_t *out = j->out + i;
    if (op->in[0].dtype == KILN_F32) {
      KILN_CPU_WHERE_RUN_(float)
    } else {
      KILN_CPU_WHERE_RUN_(int32_t)
    }
    i += run;
    idx[inner] += run;
    for (int v = 0; v < 3; v++) off[v] += run * op->in[v].strides[inner];
    /* Carry into the outer dimensions. */
    for (int d = inner; d > 0 && idx[d] == op->out.shape[d]; d--) {
      for (int v = 0; v < 3; v++) off[v] += op->in[v].strides[d - 1] - idx[d] * op->in[v].strides[d];
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}
#undef KILN_CPU_WHERE_RUN_

void kiln_cpu_where(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  where_job_t j = {op, {in[0], in[1], in[2]}, out};
  kiln_cpu_parallel_for(par, kiln_backend_view_numel(&op->out), KILN_CPU_GRAIN_ELEMENTWISE, where_task, &j);
}
