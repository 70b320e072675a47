/* kernels/cpu/nn.c: SOFTMAX / log-softmax over rows, CROSS_ENTROPY (mean of -log_softmax at the label), and their gradients. */
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/cpu_native.h"

/* Row maximum; NaN wins, so a row holding NaN comes out NaN. */
static float row_max(const float *x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; i++)
    if (x[i] > m || x[i] != x[i]) {
      m = x[i];
      if (m != m) break;
    }
  return m;
}

typedef struct softmax_job_t {
  const kiln_op_t *op;
  const float *in;
  float *out;
  bool avx2;
} softmax_job_t;

static void softmax_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const softmax_job_t *j = ctx;
  const int64_t cols = j->op->u.softmax.cols;
  const bool log_out = j->op->u.softmax.log;
#if defined(KILN_HAVE_AVX2_KERNEL)
  if (j->avx2) {
    for (int64_t r = begin; r < end; r++) kiln_cpu_softmax_row_avx2(j->in + r * cols, j->out + r * cols, cols, log_out);
    return;
  }
#endif
  for (int64_t r = begin; r < end; r++) {
    const float *x = j->in + r * cols;
    float *y = j->out + r * cols;
    const float m = row_max(x, cols);
    /* Subtracting the maximum keeps every exp in (0, 1]; the sum is kept
     * in double so that long rows do not lose their small terms. */
    double sum = 0.0;
    for (int64_t i = 0; i < cols; i++) {
      float e = expf(x[i] - m);
      if (!log_out) y[i] = e;
      sum += e;
    }
    if (log_out) {
      /* (x - max) - log(sum), in that order: x - (max + log(sum)) loses the
       * low bits of log(sum) to a large max (1e-3 relative at 103). */
      const float lse = (float)log(sum);
      for (int64_t i = 0; i < cols; i++) y[i] = (x[i] - m) - lse;
    } else {
      const float inv = (float)(1.0 / sum);
      for (int64_t i = 0; i < cols; i++) y[i] *= inv;
    }
  }
}

void kiln_cpu_softmax(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  softmax_job_t j = {op, in[0], out, false};
#if defined(KILN_HAVE_AVX2_KERNEL)
  /* libgcc also checks that the OS saves the ymm state before it reports avx2. */
  __builtin_cpu_init();
  j.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  const int64_t cols = op->u.softmax.cols;
  const int64_t grain = cols >= 4096 ? 1 : 4096 / (cols + 1) + 1;
  kiln_cpu_parallel_for(par, op->u.softmax.rows, grain, softmax_task, &j);
}

typedef struct ce_job_t {
  const kiln_op_t *op;
  const float *logits;
  const int32_t *labels;
  double *partial;
} ce_job_t;

static void ce_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const ce_job_t *j = ctx;
  const int64_t c = j->op->u.cross_entropy.c;
  double total = 0.0;
  for (int64_t r = begin; r < end; r++) {
    const float *x = j->logits + r * c;
    const int32_t label = j->labels[r];
    if (label < 0 || label >= c) {
      total += NAN; /* a label out of range has no loss: say so with NaN */
      continue;
    }
    const float m = row_max(x, c);
    double sum = 0.0;
    for (int64_t i = 0; i < c; i++) sum += expf(x[i] - m);
    total += -((double)x[label] - (double)m - log(sum));
  }
  j->partial[thread] += total;
}

void kiln_cpu_cross_entropy(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const float *logits = in[0];
  const int32_t *labels = in[1];
  const int64_t n = op->u.cross_entropy.n, c = op->u.cross_entropy.c;
  const int threads = kiln_cpu_par_threads(par);
  double one = 0.0;
  double *partial = threads > 1 ? calloc((size_t)threads, sizeof *partial) : &one;
  ce_job_t j = {op, logits, labels, partial ? partial : &one};
  const int64_t grain = c >= 4096 ? 1 : 4096 / (c + 1) + 1;
  if (partial)
    kiln_cpu_parallel_for(par, n, grain, ce_task, &j);
  else
    ce_task(&j, 0, n, 0); /* no memory for partials: one thread does it */
  double total = 0.0;
  for (int t = 0; t < (partial && partial != &one ? threads : 1); t++) total += j.partial[t];
  if (partial && partial != &one) free(partial);
  *(float *)out = (float)(total / (double)n); /* n == 0: NaN, the mean of nothing */
  /* The report the core reads at the next synchronisation: the first label
   * out of range (a scan of n ints, small beside the n * c logits). */
  int32_t *report = (int32_t *)in[2];
  report[0] = -1;
  report[1] = 0;
  for (int64_t r = 0; r < n; r++) {
    if (labels[r] < 0 || labels[r] >= c) {
      report[0] = (int32_t)(r < INT32_MAX ? r : INT32_MAX);
      report[1] = labels[r];
      break;
    }
  }
}

/* ---- gradients ------------------------------------------------------------------ */

/* Whether the AVX2 + FMA rows may run here. */
static bool use_avx2(void) {
#if defined(KILN_HAVE_AVX2_KERNEL)
  /* libgcc also checks that the OS saves the ymm state before it reports avx2. */
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

double kiln_cpu_dot_f64(const float *a, const float *b, int64_t n) {
  /* Eight lanes in a fixed order (the AVX2 rows use the same), products and
   * sums in double: a row's gradient does not depend on its length's
   * rounding or on the ISA. */
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) acc[l] += (double)a[i + l] * (double)b[i + l];
  for (; i < n; i++) acc[0] += (double)a[i] * (double)b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

double kiln_cpu_sum_f64(const float *a, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; l++) acc[l] += (double)a[i + l];
  for (; i < n; i++) acc[0] += (double)a[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

typedef struct softmax_backward_job_t {
  const kiln_op_t *op;
  const float *y, *dy;
  float *dx;
  bool avx2;
} softmax_backward_job_t;

static void softmax_backward_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const softmax_backward_job_t *j = ctx;
  const int64_t cols = j->op->u.softmax.cols;
  const bool log_in = j->op->u.softmax.log;
  for (int64_t r = begin; r < end; r++) {
    const float *y = j->y + r * cols, *dy = j->dy + r * cols;
    float *dx = j->dx + r * cols;
#if defined(KILN_HAVE_AVX2_KERNEL)
    if (j->avx2) {
      kiln_cpu_softmax_backward_row_avx2(y, dy, dx, cols, log_in);
      continue;
    }
#endif
    if (!log_in) {
      /* dx = y * (dy - sum(dy * y)) */
      const float s = (float)kiln_cpu_dot_f64(dy, y, cols);
      for (int64_t i = 0; i < cols; i++) dx[i] = y[i] * (dy[i] - s);
    } else {
      /* dx = dy - exp(y) * sum(dy) */
      const float s = (float)kiln_cpu_sum_f64(dy, cols);
      for (int64_t i = 0; i < cols; i++) dx[i] = dy[i] - expf(y[i]) * s;
    }
  }
}

void kiln_cpu_softmax_backward(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  softmax_backward_job_t j = {op, in[0], in[1], out, use_avx2()};
  const int64_t cols = op->u.softmax.cols;
  const int64_t grain = cols >= 4096 ? 1 : 4096 / (cols + 1) + 1;
  kiln_cpu_parallel_for(par, op->u.softmax.rows, grain, softmax_backward_task, &j);
}

typedef struct ce_backward_job_t {
  const kiln_op_t *op;
  const float *logits;
  const int32_t *labels;
  float *out;
  float scale; /* dloss / n */
  bool avx2;
} ce_backward_job_t;

static void ce_backward_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const ce_backward_job_t *j = ctx;
  const int64_t c = j->op->u.cross_entropy.c;
  const float scale = j->scale;
  for (int64_t r = begin; r < end; r++) {
    const float *x = j->logits + r * c;
    float *g = j->out + r * c;
    const int32_t label = j->labels[r];
    if (label < 0 || label >= c) {
      /* The forward's loss is NaN for this row: so is its gradient. */
      for (int64_t i = 0; i < c; i++) g[i] = NAN;
      continue;
    }
#if defined(KILN_HAVE_AVX2_KERNEL)
    if (j->avx2) {
      kiln_cpu_softmax_row_avx2(x, g, c, false);
    } else
#endif
    {
      /* The forward's softmax: max-subtracted, the sum in double. A row
       * holding NaN or +inf, or only -inf, comes out NaN. */
      const float m = row_max(x, c);
      double sum = 0.0;
      for (int64_t i = 0; i < c; i++) {
        const float e = expf(x[i] - m);
        g[i] = e;
        sum += e;
      }
      const float inv = (float)(1.0 / sum);
      for (int64_t i = 0; i < c; i++) g[i] *= inv;
    }
    /* (softmax - onehot) * dloss / n */
    g[label] -= 1.0f;
    for (int64_t i = 0; i < c; i++) g[i] *= scale;
  }
}

void kiln_cpu_cross_entropy_backward(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out,
                                     const void *const *in) {
  const int64_t n = op->u.cross_entropy.n, c = op->u.cross_entropy.c;
  const double dloss = op->n_in >= 3 && in[2] ? (double)*(const float *)in[2] : 1.0;
  ce_backward_job_t j = {op, in[0], in[1], out, (float)(dloss / (double)n), use_avx2()};
  const int64_t grain = c >= 4096 ? 1 : 4096 / (c + 1) + 1;
  kiln_cpu_parallel_for(par, n, grain, ce_backward_task, &j);
}
