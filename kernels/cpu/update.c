/* kernels/cpu/update.c: the fused in-place updates ACCUMULATE, SGD_UPDATE and ADAM_UPDATE, one pass over flat memory each. */
#include <math.h>

#include "kernels/cpu/cpu_native.h"
#include "kernels/cpu/update_internal.h"

/* The loops (update_loops.h) for any CPU; update_avx2.c and update_avx512.c
 * compile the same loops wider, and the widest the CPU has runs. Each range
 * is split over the thread pool in contiguous chunks: the formulas are
 * elementwise, so the result does not depend on the split. The core
 * guarantees that every operand is one contiguous run (`flat`). */
#define U_NAME(x) x##_portable
#include "kernels/cpu/update_loops.h"

static const kiln_cpu_update_isa_t update_portable = {accumulate_portable, sgd_portable, adam_portable};

static const kiln_cpu_update_isa_t *update_isa(void) {
#if defined(KILN_HAVE_AVX512_KERNEL) || defined(KILN_HAVE_AVX2_KERNEL)
  /* libgcc also checks that the OS saves the vector state. */
  __builtin_cpu_init();
#endif
#if defined(KILN_HAVE_AVX512_KERNEL)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return &kiln_cpu_update_avx512;
#endif
#if defined(KILN_HAVE_AVX2_KERNEL)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &kiln_cpu_update_avx2;
#endif
  return &update_portable;
}

/* Elements each thread takes at least. The updates move 12 to 28 bytes per
 * element, and ADAM divides and takes a root, so they split a little earlier
 * than a plain elementwise op. */
#define KILN_CPU_GRAIN_UPDATE (KILN_CPU_GRAIN_ELEMENTWISE / 2)

typedef struct update_job_t {
  kiln_cpu_update_args_t args;
  kiln_cpu_update_loop_fn loop;
} update_job_t;

static void update_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const update_job_t *j = ctx;
  j->loop(&j->args, begin, end);
}

static void run(const kiln_cpu_par_t *par, const kiln_op_t *op, update_job_t *j, int64_t grain) {
  kiln_cpu_parallel_for(par, kiln_backend_view_numel(&op->out), grain, update_task, j);
}

void kiln_cpu_accumulate(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  update_job_t j = {.args = {.param = out, .grad = in[0], .alpha = op->u.update.alpha}, .loop = update_isa()->accumulate};
  run(par, op, &j, KILN_CPU_GRAIN_ELEMENTWISE);
}

void kiln_cpu_sgd_update(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  update_job_t j = {
      .args = {.param = out, .grad = in[0], .s1 = op->n_in >= 2 ? (float *)in[1] : NULL,
               .lr = op->u.update.lr, .momentum = op->u.update.momentum,
               .damp1 = (float)(1.0 - (double)op->u.update.dampening), .wd = op->u.update.weight_decay,
               .nesterov = op->u.update.nesterov},
      .loop = update_isa()->sgd,
  };
  run(par, op, &j, KILN_CPU_GRAIN_UPDATE);
}

void kiln_cpu_adam_update(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  /* The constants the core folded in double from the caller's values. */
  update_job_t j = {
      .args = {.param = out, .grad = in[0], .s1 = (float *)in[1], .s2 = (float *)in[2],
               .wd = op->u.update.weight_decay, .beta1 = op->u.update.beta1, .beta2 = op->u.update.beta2,
               .omb1 = op->u.update.keep1, .omb2 = op->u.update.keep2, .step_size = op->u.update.step_size,
               .sqrt_b2 = op->u.update.sqrt_bias2, .eps = op->u.update.eps},
      .loop = update_isa()->adam,
  };
  run(par, op, &j, KILN_CPU_GRAIN_UPDATE);
}
