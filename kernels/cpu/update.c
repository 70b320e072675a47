/* kernels/cpu/update.c: the fused in-place updates ACCUMULATE, SGD_UPDATE and ADAM_UPDATE (f16/bf16 gradients and the 16-bit copy of mixed precision in the same pass), and a loss scaler's UNSCALE, one pass over flat memory each. */
#include <math.h>
#include <string.h>

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
  kiln_dtype_t grad_dtype;  /* f32, or f16/bf16 widened block by block */
  kiln_dtype_t copy_dtype;  /* f16/bf16 when `copy` is set */
  const uint16_t *grad16;
  uint16_t *copy;           /* NULL: no copy */
} update_job_t;

/* Elements of a block of the mixed-precision path: its widened gradient
 * stays in the first-level cache between the widening and the f32 loop. */
#define KILN_CPU_UPDATE_BLOCK 1024

static void widen16(kiln_dtype_t dtype, const uint16_t *in, float *out, int64_t n) {
  if (dtype == KILN_F16)
    kiln_cpu_f16_to_f32_n(in, 1, out, n);
  else
    kiln_cpu_bf16_to_f32_n(in, 1, out, n);
}

static void narrow16(kiln_dtype_t dtype, const float *in, uint16_t *out, int64_t n) {
  if (dtype == KILN_F16)
    kiln_cpu_f32_to_f16_n(in, out, n);
  else
    kiln_cpu_f32_to_bf16_n(in, out, n);
}

/* The f32 loop over [begin, end) block by block: a 16-bit gradient widened
 * into a block of the stack first, the updated parameters rounded into the
 * copy after. Each operand is still read and written once from memory, and
 * the arithmetic is the f32 loop's, so the f32 parameters get the bits they
 * would get from the widened gradient. */
static void update_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const update_job_t *j = ctx;
  if (!j->grad16 && !j->copy) {
    j->loop(&j->args, begin, end);
    return;
  }
  float wide[KILN_CPU_UPDATE_BLOCK];
  for (int64_t b = begin; b < end; b += KILN_CPU_UPDATE_BLOCK) {
    const int64_t n = end - b < KILN_CPU_UPDATE_BLOCK ? end - b : KILN_CPU_UPDATE_BLOCK;
    kiln_cpu_update_args_t a = j->args;
    a.param += b;
    if (a.s1) a.s1 += b;
    if (a.s2) a.s2 += b;
    if (j->grad16) {
      widen16(j->grad_dtype, j->grad16 + b, wide, n);
      a.grad = wide;
    } else {
      a.grad += b;
    }
    j->loop(&a, 0, n);
    if (j->copy) narrow16(j->copy_dtype, a.param, j->copy + b, n);
  }
}

/* The gradient and copy operands of an SGD or ADAM op. */
static void mixed_operands(const kiln_op_t *op, const void *const *in, update_job_t *j) {
  j->grad_dtype = op->in[0].dtype;
  j->grad16 = j->grad_dtype == KILN_F32 ? NULL : (const uint16_t *)in[0];
  j->copy = op->u.update.copy ? (uint16_t *)in[3] : NULL;
  j->copy_dtype = op->u.update.copy ? op->in[3].dtype : KILN_F32;
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
      .args = {.param = out, .grad = in[0], .s1 = op->u.update.has_buf ? (float *)in[1] : NULL,
               .lr = op->u.update.lr, .momentum = op->u.update.momentum,
               .damp1 = (float)(1.0 - (double)op->u.update.dampening), .wd = op->u.update.weight_decay,
               .nesterov = op->u.update.nesterov},
      .loop = update_isa()->sgd,
  };
  mixed_operands(op, in, &j);
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
  mixed_operands(op, in, &j);
  run(par, op, &j, KILN_CPU_GRAIN_UPDATE);
}

/* ---- UNSCALE: a loss scaler's check and unscale in one pass ---------------------- */

typedef struct unscale_job_t {
  const void *grad;
  kiln_dtype_t dtype;
  float *out;
  float scale;
  uint32_t *flag; /* the f32 flag's bits */
} unscale_job_t;

static void unscale_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const unscale_job_t *j = ctx;
  uint32_t bad = 0;
  for (int64_t b = begin; b < end; b += KILN_CPU_UPDATE_BLOCK) {
    const int64_t n = end - b < KILN_CPU_UPDATE_BLOCK ? end - b : KILN_CPU_UPDATE_BLOCK;
    float *o = j->out + b;
    if (j->dtype == KILN_F32)
      memcpy(o, (const float *)j->grad + b, (size_t)n * sizeof(float));
    else
      widen16(j->dtype, (const uint16_t *)j->grad + b, o, n);
    const float scale = j->scale;
    for (int64_t i = 0; i < n; i++) {
      uint32_t bits;
      memcpy(&bits, &o[i], sizeof bits);
      /* An infinity or a NaN: every exponent bit set. */
      bad |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
      o[i] *= scale;
    }
  }
  /* Several threads may store the same 1.0f: atomically, so that none is a
   * data race. */
  if (bad) __atomic_store_n(j->flag, 0x3f800000u, __ATOMIC_RELAXED);
}

void kiln_cpu_unscale(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  unscale_job_t j = {.grad = in[0], .dtype = op->in[0].dtype, .out = out, .scale = op->u.update.alpha,
                     .flag = (uint32_t *)(uintptr_t)in[1]};
  kiln_cpu_parallel_for(par, kiln_backend_view_numel(&op->out), KILN_CPU_GRAIN_ELEMENTWISE, unscale_task, &j);
}
