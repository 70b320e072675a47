/* kernels/cpu/via_f32.c: f16 and bf16 ops through their f32 kernels: inputs widened, the f32 kernel run, the result rounded once. */
#include <stdlib.h>

#include "kernels/cpu/cpu_native.h"
#include "kernels/cpu/gemm_internal.h"

static int64_t view_numel(const kiln_view_t *v) {
  int64_t n = 1;
  for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
  return n;
}

typedef struct via_convert_t {
  kiln_dtype_t dtype;
  const uint16_t *half; /* widen: half -> wide */
  float *wide;
  const float *from; /* narrow: from -> to */
  uint16_t *to;
} via_convert_t;

static void widen_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const via_convert_t *c = ctx;
  if (c->dtype == KILN_BF16)
    kiln_cpu_bf16_to_f32_n(c->half + begin, 1, c->wide + begin, end - begin);
  else
    kiln_cpu_f16_to_f32_n(c->half + begin, 1, c->wide + begin, end - begin);
}

static void narrow_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const via_convert_t *c = ctx;
  /* One rounding, to nearest even (convert16.c's runs: dtype_convert.h's bits). */
  if (c->dtype == KILN_BF16)
    kiln_cpu_f32_to_bf16_n(c->from + begin, c->to + begin, end - begin);
  else
    kiln_cpu_f32_to_f16_n(c->from + begin, c->to + begin, end - begin);
}

void kiln_cpu_widen_f32(const kiln_cpu_par_t *par, kiln_dtype_t dtype, const void *src, float *dst, int64_t n) {
  via_convert_t cv = {.dtype = dtype, .half = src, .wide = dst};
  kiln_cpu_parallel_for(par, n, KILN_CPU_GRAIN_ELEMENTWISE, widen_task, &cv);
}

void kiln_cpu_narrow_f32(const kiln_cpu_par_t *par, kiln_dtype_t dtype, const float *src, void *dst, int64_t n) {
  via_convert_t cv = {.dtype = dtype, .from = src, .to = dst};
  kiln_cpu_parallel_for(par, n, KILN_CPU_GRAIN_ELEMENTWISE, narrow_task, &cv);
}

bool kiln_cpu_run_via_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in,
                          kiln_cpu_kernel_fn f32_kernel) {
  /* Inputs of the op's 16-bit dtype are widened; others (none today) pass
   * as they are. Views are dense from their offset (the core made them so). */
  int64_t count[3] = {0, 0, 0}, total = view_numel(&op->out);
  for (int i = 0; i < op->n_in; i++)
    if (op->in[i].dtype == op->out.dtype) total += count[i] = view_numel(&op->in[i]);
  void *own;
  float *wide = kiln_cpu_scratch(KILN_CPU_SCRATCH_WIDEN, sizeof(float) * (size_t)(total > 0 ? total : 1), &own);
  if (!wide) {
    /* Out of memory: a result that is plainly not one (NaN everywhere)
     * rather than stale memory. */
    const uint16_t nan = op->out.dtype == KILN_BF16 ? 0x7fc0u : 0x7e00u;
    uint16_t *y = out;
    for (int64_t i = 0, n = view_numel(&op->out); i < n; i++) y[i] = nan;
    return false;
  }
  kiln_op_t op32 = *op;
  op32.out.dtype = KILN_F32;
  const void *in32[3] = {NULL, NULL, NULL};
  float *next = wide + view_numel(&op->out);
  for (int i = 0; i < op->n_in; i++) {
    in32[i] = in[i];
    if (op->in[i].dtype != op->out.dtype) continue;
    op32.in[i].dtype = KILN_F32;
    kiln_cpu_widen_f32(par, op->out.dtype, in[i], next, count[i]);
    in32[i] = next;
    next += count[i];
  }
  f32_kernel(par, &op32, wide, in32);
  kiln_cpu_narrow_f32(par, op->out.dtype, wide, out, view_numel(&op->out));
  free(own);
  return true;
}
