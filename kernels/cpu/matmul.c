/* kernels/cpu/matmul.c: the MATMUL op in every float dtype: f32 and f64 through kiln's own GEMMs, bf16 on AVX-512 BF16 where the CPU has it, f16 (and bf16 elsewhere) through the f32 one. */
#include <stdlib.h>

#include "kernels/cpu/cpu_native.h"
#include "kernels/cpu/gemm_internal.h"

/* Below this many multiply-adds per thread, a par is not worth waking
 * (gemm.c's figure). */
#define KILN_MATMUL_MIN_WORK_PER_THREAD ((int64_t)1 << 17)

/* ---- f64 ------------------------------------------------------------------------ */

typedef struct dmatmul_batch_t {
  const kiln_op_t *op;
  const double *a, *b;
  double *c;
} dmatmul_batch_t;

static void dmatmul_batch_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const dmatmul_batch_t *mb = ctx;
  const kiln_op_t *op = mb->op;
  for (int64_t i = begin; i < end; i++)
    kiln_cpu_dgemm_isa(NULL, KILN_CPU_GEMM_ISA_AUTO, op->u.matmul.trans_a, op->u.matmul.trans_b, op->u.matmul.m,
                       op->u.matmul.n, op->u.matmul.k, mb->a + i * op->u.matmul.stride_a, op->u.matmul.lda,
                       mb->b + i * op->u.matmul.stride_b, op->u.matmul.ldb, mb->c + i * op->u.matmul.stride_c,
                       op->u.matmul.ldc);
}

/* gemm.c's kiln_cpu_matmul_f32 in f64: many small products one per thread,
 * large ones each split across the par. */
void kiln_cpu_matmul_f64(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const int64_t batch = op->u.matmul.batch;
  const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
  dmatmul_batch_t mb = {op, in[0], in[1], out};
  if (batch <= 0 || m <= 0 || n <= 0) return;
  const int threads = kiln_cpu_par_threads(par);
  const int64_t work = m * n * k;
  if (threads > 1 && batch > 1 && work < (int64_t)threads * 4 * KILN_MATMUL_MIN_WORK_PER_THREAD &&
      work * batch >= 2 * KILN_MATMUL_MIN_WORK_PER_THREAD) {
    kiln_cpu_parallel_for(par, batch, 1, dmatmul_batch_task, &mb);
    return;
  }
  for (int64_t i = 0; i < batch; i++)
    kiln_cpu_dgemm(par, op->u.matmul.trans_a, op->u.matmul.trans_b, m, n, k, mb.a + i * op->u.matmul.stride_a,
                   op->u.matmul.lda, mb.b + i * op->u.matmul.stride_b, op->u.matmul.ldb,
                   mb.c + i * op->u.matmul.stride_c, op->u.matmul.ldc);
}

/* ---- f16 and bf16 through f32 ------------------------------------------------------ */

/* The elements an operand's products read, counted from its first: `rows` x
 * `cols` storage with leading dimension ld, `count` of them stride apart
 * (stride 0: one shared by every product). */
static int64_t operand_span(int64_t rows, int64_t cols, int64_t ld, int64_t count, int64_t stride) {
  const int64_t one = (rows - 1) * ld + cols;
  return stride > 0 && count > 1 ? (count - 1) * stride + one : one;
}

static float lowp_load(kiln_dtype_t dtype, const uint16_t *p, int64_t i) {
  return dtype == KILN_BF16 ? kiln_dc_bf16_to_f32(p[i]) : kiln_dc_f16_to_f32(p[i]);
}

/* Without memory for the widened copies: each element of C summed in f32 in
 * order of l and rounded once. Correct, slow, and needs nothing. */
static void matmul_lowp_direct(const kiln_op_t *op, uint16_t *c, const uint16_t *a, const uint16_t *b) {
  const kiln_dtype_t dtype = op->out.dtype;
  const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
  const int64_t lda = op->u.matmul.lda, ldb = op->u.matmul.ldb, ldc = op->u.matmul.ldc;
  for (int64_t t = 0; t < op->u.matmul.batch; t++) {
    const uint16_t *at = a + t * op->u.matmul.stride_a, *bt = b + t * op->u.matmul.stride_b;
    uint16_t *ct = c + t * op->u.matmul.stride_c;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float sum = 0.0f;
        for (int64_t l = 0; l < k; l++) {
          const float x = lowp_load(dtype, at, op->u.matmul.trans_a ? l * lda + i : i * lda + l);
          const float y = lowp_load(dtype, bt, op->u.matmul.trans_b ? j * ldb + l : l * ldb + j);
          sum += x * y;
        }
        ct[i * ldc + j] = dtype == KILN_BF16 ? kiln_dc_f64_to_bf16((double)sum) : kiln_dc_f64_to_f16((double)sum);
      }
  }
}

void kiln_cpu_matmul_via_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in,
                             void (*f32_kernel)(const kiln_cpu_par_t *, const kiln_op_t *, void *,
                                                const void *const *)) {
  const int64_t batch = op->u.matmul.batch, m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
  if (batch <= 0 || m <= 0 || n <= 0) return;
  const bool ta = op->u.matmul.trans_a, tb = op->u.matmul.trans_b;
  /* The operands keep their layout (lda, ldb, the batch strides), so the f32
   * kernel sees the very products the f32 op on widened tensors would. */
  const int64_t span_a = operand_span(ta ? k : m, ta ? m : k, op->u.matmul.lda, batch, op->u.matmul.stride_a);
  const int64_t span_b = operand_span(tb ? n : k, tb ? k : n, op->u.matmul.ldb, batch, op->u.matmul.stride_b);
  const int64_t span_c = (batch - 1) * op->u.matmul.stride_c + (m - 1) * op->u.matmul.ldc + n;
  void *own;
  float *wide = kiln_cpu_scratch(KILN_CPU_SCRATCH_WIDEN, sizeof(float) * (size_t)(span_a + span_b + span_c), &own);
  if (!wide) {
    matmul_lowp_direct(op, out, in[0], in[1]);
    return;
  }
  float *fa = wide, *fb = wide + span_a, *fc = fb + span_b;
  kiln_cpu_widen_f32(par, op->out.dtype, in[0], fa, span_a);
  kiln_cpu_widen_f32(par, op->out.dtype, in[1], fb, span_b);
  const void *const f32_in[2] = {fa, fb};
  f32_kernel(par, op, fc, f32_in);
  kiln_cpu_narrow_f32(par, op->out.dtype, fc, out, span_c);
  free(own);
}

/* ---- the op ---------------------------------------------------------------------- */

void kiln_cpu_matmul_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  switch (op->out.dtype) {
  case KILN_F64: kiln_cpu_matmul_f64(par, op, out, in); return;
  case KILN_BF16:
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
    if (kiln_cpu_bf16_gemm_available() && kiln_cpu_matmul_bf16_avx512(par, op, out, in)) return;
#endif
    kiln_cpu_matmul_via_f32(par, op, out, in, kiln_cpu_matmul_f32);
    return;
  case KILN_F16: kiln_cpu_matmul_via_f32(par, op, out, in, kiln_cpu_matmul_f32); return;
  default: kiln_cpu_matmul_f32(par, op, out, in); return;
  }
}
