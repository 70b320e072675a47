/* kernels/cpu/elementwise.c: UNARY, BINARY, BINARY_SCALAR, COMPARE for every dtype and UNARY_BACKWARD (f32), expanded from the shared op table kernels/ops.def; WHERE. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_native.h"

/* u8's `x < 0` and `b == -1` in the integer formulas never hold, as meant. */
#pragma GCC diagnostic ignored "-Wtype-limits"

#define KILN_F_EXP(x) _Generic((x), float: expf, default: exp)(x)
#define KILN_F_LOG(x) _Generic((x), float: logf, default: log)(x)
#define KILN_F_SQRT(x) _Generic((x), float: sqrtf, default: sqrt)(x)
#define KILN_F_TANH(x) _Generic((x), float: tanhf, default: tanh)(x)
#define KILN_F_FABS(x) _Generic((x), float: fabsf, default: fabs)(x)

/* Each formula becomes one row function per dtype it has: `n` outputs from
 * inputs with element strides s (0 = broadcast). The unit-stride cases are
 * separate loops so that the compiler vectorises them; the output never
 * aliases an input (the core always writes a fresh tensor). IT and UT are
 * the names kernels/ops.def's integer formulas use. f16 and bf16 run in one
 * pass where elementwise16.c has rows for the CPU, else the f32 rows on runs
 * converted to f32 (see half_* below). */
#define KILN_CPU_TYPES_(T, U) \
  typedef T IT;               \
  typedef U UT;               \
  (void)sizeof(IT);           \
  (void)sizeof(UT);

#define KILN_CPU_UNARY_ROW_(T, U, SUFFIX, NAME, expr)                                           \
  static void unary_##SUFFIX##_##NAME(const void *in_, int64_t s, void *out_, int64_t n) {      \
    KILN_CPU_TYPES_(T, U)                                                                      \
    const T *restrict in = in_;                                                                \
    T *restrict out = out_;                                                                    \
    if (s == 1) {                                                                              \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const T x = in[i];                                                                     \
        out[i] = (T)(expr);                                                                    \
      }                                                                                        \
    } else {                                                                                   \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const T x = in[i * s];                                                                 \
        out[i] = (T)(expr);                                                                    \
      }                                                                                        \
    }                                                                                          \
  }

/* A binary row: out[i] = expr(a, b), OUT_T the result's type (T, or bool's
 * byte for the comparisons), LOAD the compute value of a stored element. */
#define KILN_CPU_BINARY_ROW_(T, U, OUT_T, LOAD, FN, expr)                                       \
  static void FN(const void *pa_, int64_t sa, const void *pb_, int64_t sb, void *out_, int64_t n) { \
    KILN_CPU_TYPES_(T, U)                                                                      \
    const T *restrict pa = pa_;                                                                \
    const T *restrict pb = pb_;                                                                \
    OUT_T *restrict out = out_;                                                                \
    if (sa == 1 && sb == 1) {                                                                  \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const __typeof__(LOAD(pa[0])) a = LOAD(pa[i]), b = LOAD(pb[i]);                        \
        out[i] = (OUT_T)(expr);                                                                \
      }                                                                                        \
    } else if (sa == 1 && sb == 0) {                                                           \
      const __typeof__(LOAD(pa[0])) b = LOAD(pb[0]);                                           \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const __typeof__(LOAD(pa[0])) a = LOAD(pa[i]);                                         \
        out[i] = (OUT_T)(expr);                                                                \
      }                                                                                        \
    } else if (sa == 0 && sb == 1) {                                                           \
      const __typeof__(LOAD(pa[0])) a = LOAD(pa[0]);                                           \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const __typeof__(LOAD(pa[0])) b = LOAD(pb[i]);                                         \
        out[i] = (OUT_T)(expr);                                                                \
      }                                                                                        \
    } else {                                                                                   \
      for (int64_t i = 0; i < n; i++) {                                                        \
        const __typeof__(LOAD(pa[0])) a = LOAD(pa[i * sa]), b = LOAD(pb[i * sb]);              \
        out[i] = (OUT_T)(expr);                                                                \
      }                                                                                        \
    }                                                                                          \
  }

#define KILN_CPU_SAME_(x) (x)
#define KILN_CPU_LOAD_F16_(x) kiln_dc_f16_to_f32(x)
#define KILN_CPU_LOAD_BF16_(x) kiln_dc_bf16_to_f32(x)

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

#define KILN_UNARY_FLOAT(NAME, expr)                                                      \
  KILN_CPU_UNARY_ROW_(float, uint32_t, f32, NAME, expr)                                   \
  KILN_CPU_UNARY_ROW_(double, uint64_t, f64, NAME, expr)
#define KILN_UNARY_INT(NAME, expr)                                                        \
  KILN_CPU_UNARY_ROW_(int8_t, uint32_t, i8, NAME, expr)                                   \
  KILN_CPU_UNARY_ROW_(uint8_t, uint32_t, u8, NAME, expr)                                  \
  KILN_CPU_UNARY_ROW_(int16_t, uint32_t, i16, NAME, expr)                                 \
  KILN_CPU_UNARY_ROW_(int32_t, uint32_t, i32, NAME, expr)                                 \
  KILN_CPU_UNARY_ROW_(int64_t, uint64_t, i64, NAME, expr)
#define KILN_CPU_BINARY_OF_(E, SUFFIX, T, U, NAME, expr) \
  KILN_CPU_BINARY_ROW_(T, U, T, KILN_CPU_SAME_, binary_##SUFFIX##_##NAME, expr)
#define KILN_BINARY_FLOAT(NAME, expr)                                                     \
  KILN_CPU_BINARY_OF_(F32, f32, float, uint32_t, NAME, expr)                              \
  KILN_CPU_BINARY_OF_(F64, f64, double, uint64_t, NAME, expr)
#define KILN_BINARY_INT(NAME, expr)                                                       \
  KILN_CPU_BINARY_OF_(I8, i8, int8_t, uint32_t, NAME, expr)                               \
  KILN_CPU_BINARY_OF_(U8, u8, uint8_t, uint32_t, NAME, expr)                              \
  KILN_CPU_BINARY_OF_(I16, i16, int16_t, uint32_t, NAME, expr)                            \
  KILN_CPU_BINARY_OF_(I32, i32, int32_t, uint32_t, NAME, expr)                            \
  KILN_CPU_BINARY_OF_(I64, i64, int64_t, uint64_t, NAME, expr)
#define KILN_UNARY_GRAD_FLOAT(NAME, expr) KILN_CPU_GRAD_ROW_(NAME, expr)
#include "ops.def"

/* The comparison rows: one per (dtype, comparison). */
#define KILN_CPU_COMPARE_ROW_(E, SUFFIX, T, U, LOAD, NAME, expr) \
  KILN_CPU_BINARY_ROW_(T, U, uint8_t, LOAD, compare_##SUFFIX##_##NAME, expr)
#define KILN_COMPARE(NAME, expr)                                                                          \
  KILN_CPU_COMPARE_ROW_(F32, f32, float, uint32_t, KILN_CPU_SAME_, NAME, expr)                            \
  KILN_CPU_COMPARE_ROW_(F64, f64, double, uint64_t, KILN_CPU_SAME_, NAME, expr)                           \
  KILN_CPU_COMPARE_ROW_(F16, f16, uint16_t, uint32_t, KILN_CPU_LOAD_F16_, NAME, expr)                     \
  KILN_CPU_COMPARE_ROW_(BF16, bf16, uint16_t, uint32_t, KILN_CPU_LOAD_BF16_, NAME, expr)                  \
  KILN_CPU_COMPARE_ROW_(I8, i8, int8_t, uint32_t, KILN_CPU_SAME_, NAME, expr)                             \
  KILN_CPU_COMPARE_ROW_(U8, u8, uint8_t, uint32_t, KILN_CPU_SAME_, NAME, expr)                            \
  KILN_CPU_COMPARE_ROW_(I16, i16, int16_t, uint32_t, KILN_CPU_SAME_, NAME, expr)                          \
  KILN_CPU_COMPARE_ROW_(I32, i32, int32_t, uint32_t, KILN_CPU_SAME_, NAME, expr)                          \
  KILN_CPU_COMPARE_ROW_(I64, i64, int64_t, uint64_t, KILN_CPU_SAME_, NAME, expr)                          \
  KILN_CPU_COMPARE_ROW_(BOOL, b8, uint8_t, uint32_t, KILN_CPU_SAME_, NAME, expr)
#include "ops.def"

/* The row functions by dtype and op. NULL: no formula for that dtype (the
 * core refused it). f16 and bf16 point at the f32 rows: their runs are
 * converted around them. */
typedef void (*unary_row_fn)(const void *in, int64_t s, void *out, int64_t n);
typedef void (*binary_row_fn)(const void *a, int64_t sa, const void *b, int64_t sb, void *out, int64_t n);

static const unary_row_fn unary_table[KILN_DTYPE_COUNT_][KILN_UNARY_COUNT_] = {
#define KILN_UNARY_FLOAT(NAME, expr)                                                                       \
  [KILN_F32][KILN_UNARY_##NAME] = unary_f32_##NAME, [KILN_F64][KILN_UNARY_##NAME] = unary_f64_##NAME,     \
  [KILN_F16][KILN_UNARY_##NAME] = unary_f32_##NAME, [KILN_BF16][KILN_UNARY_##NAME] = unary_f32_##NAME,
#define KILN_UNARY_INT(NAME, expr)                                                                         \
  [KILN_I8][KILN_UNARY_##NAME] = unary_i8_##NAME, [KILN_U8][KILN_UNARY_##NAME] = unary_u8_##NAME,         \
  [KILN_I16][KILN_UNARY_##NAME] = unary_i16_##NAME, [KILN_I32][KILN_UNARY_##NAME] = unary_i32_##NAME,     \
  [KILN_I64][KILN_UNARY_##NAME] = unary_i64_##NAME,
#include "ops.def"
};
static const binary_row_fn binary_table[KILN_DTYPE_COUNT_][KILN_BINARY_COUNT_] = {
#define KILN_BINARY_FLOAT(NAME, expr)                                                                      \
  [KILN_F32][KILN_BINARY_##NAME] = binary_f32_##NAME, [KILN_F64][KILN_BINARY_##NAME] = binary_f64_##NAME, \
  [KILN_F16][KILN_BINARY_##NAME] = binary_f32_##NAME, [KILN_BF16][KILN_BINARY_##NAME] = binary_f32_##NAME,
#define KILN_BINARY_INT(NAME, expr)                                                                        \
  [KILN_I8][KILN_BINARY_##NAME] = binary_i8_##NAME, [KILN_U8][KILN_BINARY_##NAME] = binary_u8_##NAME,     \
  [KILN_I16][KILN_BINARY_##NAME] = binary_i16_##NAME, [KILN_I32][KILN_BINARY_##NAME] = binary_i32_##NAME, \
  [KILN_I64][KILN_BINARY_##NAME] = binary_i64_##NAME,
#include "ops.def"
};
static const binary_row_fn compare_table[KILN_DTYPE_COUNT_][KILN_COMPARE_COUNT_] = {
#define KILN_COMPARE(NAME, expr)                                                                           \
  [KILN_F32][KILN_COMPARE_##NAME] = compare_f32_##NAME, [KILN_F64][KILN_COMPARE_##NAME] = compare_f64_##NAME, \
  [KILN_F16][KILN_COMPARE_##NAME] = compare_f16_##NAME, [KILN_BF16][KILN_COMPARE_##NAME] = compare_bf16_##NAME, \
  [KILN_I8][KILN_COMPARE_##NAME] = compare_i8_##NAME, [KILN_U8][KILN_COMPARE_##NAME] = compare_u8_##NAME,     \
  [KILN_I16][KILN_COMPARE_##NAME] = compare_i16_##NAME, [KILN_I32][KILN_COMPARE_##NAME] = compare_i32_##NAME, \
  [KILN_I64][KILN_COMPARE_##NAME] = compare_i64_##NAME, [KILN_BOOL][KILN_COMPARE_##NAME] = compare_b8_##NAME,
#include "ops.def"
};

/* The derivatives have the binary rows' shape: (x, dy) -> dx. */
static const binary_row_fn grad_f32[KILN_UNARY_COUNT_] = {
#define KILN_UNARY_GRAD_FLOAT(NAME, expr) [KILN_UNARY_##NAME] = grad_f32_##NAME,
#include "ops.def"
};

/* ---- running the rows ------------------------------------------------------------ */

typedef struct elementwise_job_t {
  kiln_cpu_walk_t walk;
  unary_row_fn unary;
  binary_row_fn binary;
  const char *in0, *in1;
  char *out;
  size_t in_size, out_size; /* bytes per element of the inputs and of out */
  kiln_dtype_t half;        /* F16 or BF16: runs converted around an f32 row; else F32 */
  bool in1_f32;             /* the second operand is already f32 (a scalar) */
  /* f16/bf16 rows in one pass (elementwise16.c), for runs of stride 0 or 1; NULL: none here. */
  kiln_cpu_half_unary_fn half_unary;
  kiln_cpu_half_binary_fn half_binary;
} elementwise_job_t;

/* f16 and bf16 runs go through f32 in chunks of this many elements. */
enum { HALF_CHUNK = 512 };

static void half_load(kiln_dtype_t dtype, const char *in, int64_t stride, float *out, int64_t n) {
  if (dtype == KILN_F16) kiln_cpu_f16_to_f32_n((const uint16_t *)in, stride, out, n);
  else kiln_cpu_bf16_to_f32_n((const uint16_t *)in, stride, out, n);
}

static void half_store(kiln_dtype_t dtype, const float *in, char *out, int64_t n) {
  if (dtype == KILN_F16) kiln_cpu_f32_to_f16_n(in, (uint16_t *)out, n);
  else kiln_cpu_f32_to_bf16_n(in, (uint16_t *)out, n);
}

static void unary_rows(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count) {
  const elementwise_job_t *j = ctx;
  const int64_t s = j->walk.stride[0][j->walk.ndim - 1];
  const char *in = j->in0 + off0 * (int64_t)j->in_size;
  char *out = j->out + pos * (int64_t)j->out_size;
  if (j->half == KILN_F32) {
    j->unary(in, s, out, count);
    return;
  }
  if (j->half_unary && (s == 0 || s == 1)) {
    j->half_unary((const uint16_t *)in, s, (uint16_t *)out, count);
    return;
  }
  float x[HALF_CHUNK], y[HALF_CHUNK];
  for (int64_t c = 0; c < count; c += HALF_CHUNK) {
    const int64_t m = count - c < HALF_CHUNK ? count - c : HALF_CHUNK;
    half_load(j->half, in + c * s * 2, s, x, s == 0 ? 1 : m);
    j->unary(x, s == 0 ? 0 : 1, y, m);
    half_store(j->half, y, out + c * 2, m);
  }
}

static void binary_rows(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count) {
  const elementwise_job_t *j = ctx;
  const int inner = j->walk.ndim - 1;
  const int64_t sa = j->walk.stride[0][inner], sb = j->walk.stride[1][inner];
  const char *a = j->in0 + off0 * (int64_t)j->in_size;
  const char *b = j->in1 + off1 * (int64_t)(j->in1_f32 ? 4 : j->in_size);
  char *out = j->out + pos * (int64_t)j->out_size;
  if (j->half == KILN_F32) {
    j->binary(a, sa, b, sb, out, count);
    return;
  }
  if (j->half_binary && (sa == 0 || sa == 1) && (sb == 0 || sb == 1)) {
    j->half_binary((const uint16_t *)a, sa, b, sb, j->in1_f32, (uint16_t *)out, count);
    return;
  }
  float xa[HALF_CHUNK], xb[HALF_CHUNK], y[HALF_CHUNK];
  for (int64_t c = 0; c < count; c += HALF_CHUNK) {
    const int64_t m = count - c < HALF_CHUNK ? count - c : HALF_CHUNK;
    half_load(j->half, a + c * sa * 2, sa, xa, sa == 0 ? 1 : m);
    const float *pb = (const float *)b;
    if (!j->in1_f32) {
      half_load(j->half, b + c * sb * 2, sb, xb, sb == 0 ? 1 : m);
      pb = xb;
    }
    j->binary(xa, sa == 0 ? 0 : 1, pb, sb == 0 ? 0 : 1, y, m);
    half_store(j->half, y, out + c * 2, m);
  }
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

/* A job over `n_in` views of `op` (in[1] of `views` when given), elements
 * of `dtype` in and `out_dtype` out. */
static void job_init(elementwise_job_t *j, const kiln_op_t *op, const kiln_view_t *views, int n_in, kiln_dtype_t dtype,
                     kiln_dtype_t out_dtype, void *out, const void *const *in) {
  kiln_cpu_walk_init(&op->out, views, n_in, &j->walk);
  j->unary = NULL;
  j->binary = NULL;
  j->in0 = in[0];
  j->in1 = n_in > 1 && in[1] ? in[1] : NULL;
  j->out = out;
  j->in_size = kiln_cpu_dtype_size(dtype);
  j->out_size = kiln_cpu_dtype_size(out_dtype);
  j->half = dtype == KILN_F16 || dtype == KILN_BF16 ? dtype : KILN_F32;
  j->in1_f32 = false;
  j->half_unary = NULL;
  j->half_binary = NULL;
}

void kiln_cpu_unary(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  elementwise_job_t j;
  const kiln_dtype_t dtype = op->out.dtype;
  job_init(&j, op, op->in, 1, dtype, dtype, out, in);
  j.unary = unary_table[dtype][op->u.unary.op];
  j.half_unary = kiln_cpu_half_unary_row(dtype, (int)op->u.unary.op);
  kiln_cpu_parallel_for(par, j.walk.numel, unary_grain(op->u.unary.op), unary_task, &j);
}

void kiln_cpu_binary(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  elementwise_job_t j;
  const kiln_dtype_t dtype = op->out.dtype;
  job_init(&j, op, op->in, 2, dtype, dtype, out, in);
  j.binary = binary_table[dtype][op->u.binary.op];
  j.half_binary = kiln_cpu_half_binary_row(dtype, (int)op->u.binary.op);
  kiln_cpu_parallel_for(par, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, binary_task, &j);
}

void kiln_cpu_compare(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  elementwise_job_t j;
  const kiln_dtype_t dtype = op->in[0].dtype;
  job_init(&j, op, op->in, 2, dtype, KILN_BOOL, out, in);
  j.half = KILN_F32; /* the comparison rows load f16 and bf16 themselves */
  j.binary = compare_table[dtype][op->u.binary.op];
  kiln_cpu_parallel_for(par, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, binary_task, &j);
}

void kiln_cpu_binary_scalar(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const kiln_dtype_t dtype = op->out.dtype;
  const kiln_scalar_t *scalar = &op->u.binary.scalar;
  /* The scalar is a second operand broadcast over every dim: f32 for the
   * f32 rows (f16 and bf16 too: their formulas compute in f32), the double
   * for f64, and the value in the integer dtype from its bits. */
  const void *b = &scalar->bits;
  if (dtype == KILN_F32 || dtype == KILN_F16 || dtype == KILN_BF16) b = &scalar->f32;
  else if (dtype == KILN_F64) b = &scalar->value;
  kiln_view_t views[2];
  views[0] = op->in[0];
  memset(&views[1], 0, sizeof views[1]);
  views[1].ndim = op->out.ndim;
  elementwise_job_t j;
  const void *const operands[2] = {in[0], b};
  job_init(&j, op, views, 2, dtype, dtype, out, operands);
  j.in1_f32 = j.half != KILN_F32;
  j.binary = binary_table[dtype][op->u.binary.op];
  j.half_binary = kiln_cpu_half_binary_row(dtype, (int)op->u.binary.op);
  kiln_cpu_parallel_for(par, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, binary_task, &j);
}

void kiln_cpu_unary_backward(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  /* x and dy are walked like the two operands of a binary op. */
  elementwise_job_t j;
  job_init(&j, op, op->in, 2, KILN_F32, KILN_F32, out, in);
  j.binary = (unsigned)op->u.unary.op < KILN_UNARY_COUNT_ ? grad_f32[op->u.unary.op] : NULL;
  kiln_cpu_parallel_for(par, j.walk.numel, unary_grain(op->u.unary.op), binary_task, &j);
}

/* ---- where ------------------------------------------------------------------------------ */

/* WHERE: out = cond != 0 ? a : b over out's merged dimensions, each input
 * by its strides. a and b are copied as bit patterns of their size, whatever
 * their dtype; the condition is read in its own (NaN is true, -0.0 false). */
typedef struct where_job_t {
  const kiln_op_t *op;
  const char *in[3];
  char *out;
} where_job_t;

/* Whether element k of the condition run c (stride sc) holds. */
static inline bool where_holds(kiln_dtype_t dtype, const char *c, int64_t k) {
  switch (dtype) {
  case KILN_F32: return ((const float *)c)[k] != 0.0f;
  case KILN_F64: return ((const double *)c)[k] != 0.0;
  case KILN_F16:
  case KILN_BF16: return (((const uint16_t *)c)[k] & 0x7fffu) != 0; /* not +-0 */
  case KILN_I64: return ((const int64_t *)c)[k] != 0;
  case KILN_I32: return ((const int32_t *)c)[k] != 0;
  case KILN_I16: return ((const int16_t *)c)[k] != 0;
  default: return ((const uint8_t *)c)[k] != 0; /* i8, u8, bool */
  }
}

#define KILN_CPU_WHERE_RUN_(T)                                                                       \
  for (int64_t k = 0; k < run; k++)                                                                  \
    ((T *)out)[k] = where_holds(cdt, c, k * sc) ? ((const T *)a)[k * sa] : ((const T *)b)[k * sb];

static void where_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const where_job_t *j = ctx;
  const kiln_op_t *op = j->op;
  const int nd = op->out.ndim, inner = nd - 1;
  const kiln_dtype_t cdt = op->in[0].dtype;
  const int64_t csize = (int64_t)kiln_cpu_dtype_size(cdt), vsize = (int64_t)kiln_cpu_dtype_size(op->out.dtype);
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
    const char *c = j->in[0] + off[0] * csize, *a = j->in[1] + off[1] * vsize, *b = j->in[2] + off[2] * vsize;
    char *out = j->out + i * vsize;
    switch (vsize) {
    case 8: KILN_CPU_WHERE_RUN_(uint64_t) break;
    case 4: KILN_CPU_WHERE_RUN_(uint32_t) break;
    case 2: KILN_CPU_WHERE_RUN_(uint16_t) break;
    default: KILN_CPU_WHERE_RUN_(uint8_t) break;
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
