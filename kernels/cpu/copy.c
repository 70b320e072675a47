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

/* A strided run gathered by element size (1, 2, 4 or 8 bytes: every dtype). */
#define KILN_CPU_GATHER_(T)                                                    \
  do {                                                                         \
    const T *restrict src = (const T *)j->in + off0;                           \
    T *restrict dst = (T *)j->out + pos;                                       \
    for (int64_t i = 0; i < count; i++) dst[i] = src[i * s];                   \
  } while (0)

static void copy_row(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count) {
  const copy_job_t *j = ctx;
  const int64_t s = j->walk.stride[0][j->walk.ndim - 1];
  if (s == 1) {
    memcpy(j->out + (size_t)pos * j->esize, j->in + (size_t)off0 * j->esize, (size_t)count * j->esize);
    return;
  }
  switch (j->esize) {
  case 1: KILN_CPU_GATHER_(uint8_t); break;
  case 2: KILN_CPU_GATHER_(uint16_t); break;
  case 4: KILN_CPU_GATHER_(uint32_t); break;
  default: KILN_CPU_GATHER_(uint64_t); break;
  }
}
#undef KILN_CPU_GATHER_

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

/* One row function per (source, destination) pair, each
 * store(load(x)) of kernels/dtype_convert.h: the one rule, bit-exact. */
typedef void (*cast_row_fn)(const void *in, int64_t s, void *out, int64_t n);

#define KILN_CPU_CAST_ROW_(SE, sname, ST, scarrier, DE, dname, DT, dcarrier)                 \
  static void cast_##sname##_##dname(const void *in_, int64_t s, void *out_, int64_t n) {   \
    const ST *restrict in = in_;                                                            \
    DT *restrict out = out_;                                                                \
    if (s == 1) {                                                                           \
      for (int64_t i = 0; i < n; i++) out[i] = kiln_dc_##scarrier##_to_##dname(kiln_dc_load_##sname(in[i])); \
    } else {                                                                                \
      for (int64_t i = 0; i < n; i++) out[i] = kiln_dc_##scarrier##_to_##dname(kiln_dc_load_##sname(in[i * s])); \
    }                                                                                       \
  }
/* Expand the rows of one source over every destination. */
#define KILN_CPU_CAST_FROM_(SE, sname, ST, scarrier)                                        \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, F32, f32, kiln_f32, f64)                      \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, I32, i32, kiln_i32, i64)                      \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, F16, f16, kiln_u16, f64)                      \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, BF16, bf16, kiln_u16, f64)                    \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, F64, f64, kiln_f64, f64)                      \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, I64, i64, kiln_i64, i64)                      \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, I8, i8, kiln_i8, i64)                         \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, U8, u8, kiln_u8, i64)                         \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, I16, i16, kiln_i16, i64)                      \
  KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, BOOL, b8, kiln_u8, i64)
#define KILN_CPU_CAST_TO_ KILN_CPU_CAST_ROW_
KILN_DC_DTYPES(KILN_CPU_CAST_FROM_)
#undef KILN_CPU_CAST_TO_

static const cast_row_fn cast_rows[KILN_DTYPE_COUNT_][KILN_DTYPE_COUNT_] = {
#define KILN_CPU_CAST_TO_(SE, sname, ST, scarrier, DE, dname, DT, dcarrier) [KILN_##SE][KILN_##DE] = cast_##sname##_##dname,
    KILN_DC_DTYPES(KILN_CPU_CAST_FROM_)
#undef KILN_CPU_CAST_TO_
};
_Static_assert(KILN_DTYPE_COUNT_ == 10, "a new dtype needs its column in KILN_CPU_CAST_FROM_ and its conversions");

/* f32 <-> f16 and bf16, the casts of mixed-precision training, in runs
 * (convert16.c: F16C and AVX2 where the CPU has them): the same bits as the
 * rows above, several times faster. */
static void cast_run_f16_f32(const void *in, int64_t s, void *out, int64_t n) { kiln_cpu_f16_to_f32_n(in, s, out, n); }
static void cast_run_bf16_f32(const void *in, int64_t s, void *out, int64_t n) {
  kiln_cpu_bf16_to_f32_n(in, s, out, n);
}
static void cast_run_f32_f16(const void *in, int64_t s, void *out, int64_t n) {
  if (s == 1) kiln_cpu_f32_to_f16_n(in, out, n);
  else cast_f32_f16(in, s, out, n);
}
static void cast_run_f32_bf16(const void *in, int64_t s, void *out, int64_t n) {
  if (s == 1) kiln_cpu_f32_to_bf16_n(in, out, n);
  else cast_f32_bf16(in, s, out, n);
}

static cast_row_fn cast_row_of(kiln_dtype_t from, kiln_dtype_t to) {
  if (from == KILN_F16 && to == KILN_F32) return cast_run_f16_f32;
  if (from == KILN_BF16 && to == KILN_F32) return cast_run_bf16_f32;
  if (from == KILN_F32 && to == KILN_F16) return cast_run_f32_f16;
  if (from == KILN_F32 && to == KILN_BF16) return cast_run_f32_bf16;
  return cast_rows[from][to];
}

typedef struct cast_job_t {
  kiln_cpu_walk_t walk;
  const char *in;
  char *out;
  size_t in_size, out_size;
  cast_row_fn row;
} cast_job_t;

static void cast_row(void *ctx, int64_t pos, int64_t off0, int64_t off1, int64_t count) {
  const cast_job_t *j = ctx;
  j->row(j->in + (size_t)off0 * j->in_size, j->walk.stride[0][j->walk.ndim - 1], j->out + (size_t)pos * j->out_size,
         count);
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
  j.in_size = kiln_cpu_dtype_size(op->in[0].dtype);
  j.out_size = kiln_cpu_dtype_size(op->out.dtype);
  j.row = cast_row_of(op->in[0].dtype, op->out.dtype);
  kiln_cpu_parallel_for(par, j.walk.numel, KILN_CPU_GRAIN_ELEMENTWISE, cast_task, &j);
}
