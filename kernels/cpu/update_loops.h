/* kernels/cpu/update_loops.h: the loops of the in-place updates, written once and compiled for each ISA (update.c, update_avx2.c, update_avx512.c). */
/*
 * The includer defines U_NAME(x) (x with the ISA's suffix) and builds with
 * -fno-math-errno (kiln never reads errno: sqrtf stays one vector
 * instruction). Every loop is one pass over contiguous memory, reading each
 * operand once and writing each updated one once; the compiler vectorises it
 * at the width the file is built for. No loop contracts a multiply and an add
 * (ISO C's default), so every ISA gives the same bits.
 */
#include <math.h>
#include <stddef.h>

#include "kernels/cpu/update_internal.h"

static void U_NAME(accumulate)(const kiln_cpu_update_args_t *u, int64_t begin, int64_t end) {
  float *restrict a = u->param;
  const float *restrict b = u->grad;
  const float alpha = u->alpha;
  for (int64_t i = begin; i < end; i++) a[i] += alpha * b[i];
}

/* One loop per combination of the flags, each constant where inlined, so that
 * no element pays for a branch or for a term that is absent (a weight decay of
 * 0 adds nothing, and must not turn an infinite parameter's gradient NaN). */
static inline __attribute__((always_inline)) void U_NAME(sgd_loop)(const kiln_cpu_update_args_t *u, int64_t begin,
                                                                   int64_t end, const bool has_buf, const bool has_wd,
                                                                   const bool nesterov) {
  float *restrict p = u->param;
  const float *restrict g = u->grad;
  float *restrict buf = u->s1;
  const float lr = u->lr, momentum = u->momentum, damp1 = u->damp1, wd = u->wd;
  for (int64_t i = begin; i < end; i++) {
    float gi = g[i];
    if (has_wd) gi += wd * p[i];
    if (!has_buf) {
      p[i] -= lr * gi;
      continue;
    }
    const float b = momentum * buf[i] + damp1 * gi;
    buf[i] = b;
    p[i] -= lr * (nesterov ? gi + momentum * b : b);
  }
}

static void U_NAME(sgd)(const kiln_cpu_update_args_t *u, int64_t begin, int64_t end) {
  const bool has_buf = u->s1 != NULL, has_wd = u->wd != 0.0f, nesterov = u->nesterov;
  if (!has_buf) {
    if (has_wd)
      U_NAME(sgd_loop)(u, begin, end, false, true, false);
    else
      U_NAME(sgd_loop)(u, begin, end, false, false, false);
  } else if (nesterov) {
    if (has_wd)
      U_NAME(sgd_loop)(u, begin, end, true, true, true);
    else
      U_NAME(sgd_loop)(u, begin, end, true, false, true);
  } else {
    if (has_wd)
      U_NAME(sgd_loop)(u, begin, end, true, true, false);
    else
      U_NAME(sgd_loop)(u, begin, end, true, false, false);
  }
}

/* m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 * p -= (lr / bias1) * (m / (sqrt(v) / sqrt(bias2) + eps)): the formula of
 * backend.h in the order torch.optim.Adam evaluates it, the scalars folded
 * once per call. */
static inline __attribute__((always_inline)) void U_NAME(adam_loop)(const kiln_cpu_update_args_t *u, int64_t begin,
                                                                    int64_t end, const bool has_wd) {
  float *restrict p = u->param;
  const float *restrict g = u->grad;
  float *restrict m = u->s1;
  float *restrict v = u->s2;
  const float beta1 = u->beta1, beta2 = u->beta2, omb1 = u->omb1, omb2 = u->omb2, wd = u->wd;
  const float step_size = u->step_size, sqrt_b2 = u->sqrt_b2, eps = u->eps;
  for (int64_t i = begin; i < end; i++) {
    float gi = g[i];
    if (has_wd) gi += wd * p[i];
    const float mi = beta1 * m[i] + omb1 * gi;
    const float vi = beta2 * v[i] + omb2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] -= step_size * (mi / (sqrtf(vi) / sqrt_b2 + eps));
  }
}

static void U_NAME(adam)(const kiln_cpu_update_args_t *u, int64_t begin, int64_t end) {
  if (u->wd != 0.0f)
    U_NAME(adam_loop)(u, begin, end, true);
  else
    U_NAME(adam_loop)(u, begin, end, false);
}
