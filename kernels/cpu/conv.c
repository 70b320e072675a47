/* kernels/cpu/conv.c: CONV2D on the CPU, lowered to kiln's SGEMM through im2col panels. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_native.h"
#include "kernels/cpu/gemm_internal.h"

/* One im2col panel is kept near this size: large enough that the GEMM runs
 * on wide tiles, small enough to stay in the last-level cache beside the
 * GEMM's own packed panels, one per thread. */
#define KILN_CONV_PANEL_BYTES ((int64_t)2 << 20)
#define KILN_CONV_PANEL_MIN_COLS 64

/* Below this many multiply-adds per thread the par is not woken. */
#define KILN_CONV_MIN_WORK_PER_THREAD ((int64_t)1 << 17)

bool kiln_cpu_conv2d_is_pointwise(const kiln_op_t *op) {
  return op->u.conv2d.r == 1 && op->u.conv2d.s == 1 && op->u.conv2d.stride[0] == 1 &&
         op->u.conv2d.stride[1] == 1 && op->u.conv2d.pad[0] == 0 && op->u.conv2d.pad[1] == 0;
}

int64_t kiln_cpu_conv2d_panel_cols(const kiln_op_t *op) {
  const int64_t crs = op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s;
  const int64_t pq = op->u.conv2d.p * op->u.conv2d.q;
  int64_t cols = crs > 0 ? KILN_CONV_PANEL_BYTES / ((int64_t)sizeof(float) * crs) : pq;
  cols = cols / KILN_CPU_GEMM_NR * KILN_CPU_GEMM_NR;
  if (cols < KILN_CONV_PANEL_MIN_COLS) cols = KILN_CONV_PANEL_MIN_COLS;
  return cols < pq ? cols : pq;
}

void kiln_cpu_conv2d_im2col(const kiln_op_t *op, const float *x, int64_t j0, int64_t cols,
                            float *out_col) {
  kiln_cpu_conv2d_im2col_ld(op, x, j0, cols, out_col, cols);
}

/* The panel for elements of `es` bytes (4: f32, 2: f16 and bf16), written
 * once: inlined with es a constant, each width gets its own copy. */
static inline __attribute__((always_inline)) void im2col_es(const kiln_op_t *op, const void *x_, int64_t j0,
                                                            int64_t cols, void *out_, int64_t ld, const size_t es) {
  const char *x = x_;
  char *out_col = out_;
  const int64_t h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t r = op->u.conv2d.r, s = op->u.conv2d.s, q = op->u.conv2d.q;
  const int64_t c = op->u.conv2d.c;
  const int64_t st0 = op->u.conv2d.stride[0], st1 = op->u.conv2d.stride[1];
  const int64_t pad0 = op->u.conv2d.pad[0], pad1 = op->u.conv2d.pad[1];
  const int64_t dil0 = op->u.conv2d.dil[0], dil1 = op->u.conv2d.dil[1];

  /* Walk the columns one output row (of q cells) at a time: a row shares
   * its input rows, so only the column bounds vary within it, and the
   * division that finds the row is made once per row, not once per row and
   * filter tap (LeNet's first layer has 25 taps of 28-cell rows). */
  if (cols <= 0 || q <= 0) return;
  int64_t jj = 0, pp = j0 / q, qq0 = j0 % q;
  while (jj < cols) {
    const int64_t seg = (q - qq0) < (cols - jj) ? (q - qq0) : (cols - jj);
    for (int64_t ci = 0; ci < c; ci++) {
      for (int64_t ri = 0; ri < r; ri++) {
        const int64_t hh = pp * st0 - pad0 + ri * dil0;
        char *dst = out_col + ((ci * r + ri) * s * ld + jj) * (int64_t)es;
        if (hh < 0 || hh >= h) {
          for (int64_t si = 0; si < s; si++) memset(dst + si * ld * (int64_t)es, 0, es * (size_t)seg);
          continue;
        }
        const char *xrow = x + (ci * h + hh) * w * (int64_t)es;
        for (int64_t si = 0; si < s; si++) {
          char *d = dst + si * ld * (int64_t)es;
          const int64_t ww0 = qq0 * st1 - pad1 + si * dil1;
          if (st1 == 1) {
            /* Contiguous: zeros, one copy of the valid span, zeros. */
            int64_t lo = -ww0, hi = w - ww0;
            if (lo < 0) lo = 0;
            if (lo > seg) lo = seg;
            if (hi > seg) hi = seg;
            if (hi < lo) hi = lo;
            memset(d, 0, es * (size_t)lo);
            if (hi > lo) memcpy(d + lo * (int64_t)es, xrow + (ww0 + lo) * (int64_t)es, es * (size_t)(hi - lo));
            memset(d + hi * (int64_t)es, 0, es * (size_t)(seg - hi));
          } else {
            for (int64_t t = 0; t < seg; t++) {
              const int64_t ww = ww0 + t * st1;
              if (ww >= 0 && ww < w)
                memcpy(d + t * (int64_t)es, xrow + ww * (int64_t)es, es);
              else
                memset(d + t * (int64_t)es, 0, es);
            }
          }
        }
      }
    }
    jj += seg;
    pp++;
    qq0 = 0;
  }
}

void kiln_cpu_conv2d_im2col_ld(const kiln_op_t *op, const float *x, int64_t j0, int64_t cols, float *out_col,
                               int64_t ld) {
  im2col_es(op, x, j0, cols, out_col, ld, sizeof(float));
}

bool kiln_cpu_conv2d_native_preferred(const kiln_op_t *op) {
  (void)op; /* every shape, on the evidence so far (cpu_kernels.h) */
  return kiln_cpu_gemm_isa_best() == KILN_CPU_GEMM_ISA_AVX512;
}

typedef struct conv_plan_t {
  const kiln_op_t *op;
  const float *x, *w, *bias;
  float *y;
  int64_t crs, pq, chunk, chunks; /* work item i: image i / chunks, columns (i % chunks) * chunk ... */
  bool pointwise;
} conv_plan_t;

static void add_bias(const conv_plan_t *cp, float *y_cols, int64_t cols) {
  if (!cp->bias) return;
  for (int64_t kk = 0; kk < cp->op->u.conv2d.k; kk++) {
    float *row = y_cols + kk * cp->pq;
    const float bv = cp->bias[kk];
    for (int64_t j = 0; j < cols; j++) row[j] += bv;
  }
}

/* The convolution without any scratch memory, for when none could be had. */
static void conv_direct(const conv_plan_t *cp, int64_t ni, int64_t j0, int64_t cols) {
  const kiln_op_t *op = cp->op;
  const int64_t c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w;
  const int64_t r = op->u.conv2d.r, s = op->u.conv2d.s, q = op->u.conv2d.q;
  const float *x = cp->x + ni * c * h * w;
  for (int64_t kk = 0; kk < op->u.conv2d.k; kk++) {
    float *yrow = cp->y + (ni * op->u.conv2d.k + kk) * cp->pq;
    for (int64_t j = j0; j < j0 + cols; j++) {
      const int64_t pp = j / q, qq = j % q;
      float acc = cp->bias ? cp->bias[kk] : 0.0f;
      for (int64_t ci = 0; ci < c; ci++)
        for (int64_t ri = 0; ri < r; ri++) {
          const int64_t hh = pp * op->u.conv2d.stride[0] - op->u.conv2d.pad[0] + ri * op->u.conv2d.dil[0];
          if (hh < 0 || hh >= h) continue;
          for (int64_t si = 0; si < s; si++) {
            const int64_t ww = qq * op->u.conv2d.stride[1] - op->u.conv2d.pad[1] + si * op->u.conv2d.dil[1];
            if (ww < 0 || ww >= w) continue;
            acc += cp->w[((kk * c + ci) * r + ri) * s + si] * x[(ci * h + hh) * w + ww];
          }
        }
      yrow[j] = acc;
    }
  }
}

/* Work items [begin, end) on one thread, each with a serial GEMM into its
 * own im2col panel. */
static void conv_items_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const conv_plan_t *cp = ctx;
  const kiln_op_t *op = cp->op;
  const int64_t chw = op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w;
  float *col = NULL;
  if (!cp->pointwise) {
    const size_t bytes = sizeof(float) * (size_t)(cp->crs * cp->chunk) + 64;
    col = aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  for (int64_t i = begin; i < end; i++) {
    const int64_t ni = i / cp->chunks;
    const int64_t j0 = (i % cp->chunks) * cp->chunk;
    const int64_t cols = cp->pq - j0 < cp->chunk ? cp->pq - j0 : cp->chunk;
    const float *x = cp->x + ni * chw;
    float *y = cp->y + ni * op->u.conv2d.k * cp->pq + j0;
    if (cp->pointwise) {
      kiln_cpu_sgemm_isa(NULL, KILN_CPU_GEMM_ISA_AUTO, false, false, op->u.conv2d.k, cols, cp->crs,
                         cp->w, cp->crs, x + j0, cp->pq, y, cp->pq);
    } else if (col) {
      kiln_cpu_conv2d_im2col(op, x, j0, cols, col);
      kiln_cpu_sgemm_isa(NULL, KILN_CPU_GEMM_ISA_AUTO, false, false, op->u.conv2d.k, cols, cp->crs,
                         cp->w, cp->crs, col, cols, y, cp->pq);
    } else {
      conv_direct(cp, ni, j0, cols);
      continue;
    }
    add_bias(cp, y, cols);
  }
  free(col);
}

typedef struct im2col_job_t {
  const kiln_op_t *op;
  const float *x;
  int64_t j0, cols;
  float *col;
} im2col_job_t;

/* Splits one panel's im2col across the par by input channel. */
static void im2col_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const im2col_job_t *job = ctx;
  kiln_op_t sub = *job->op;
  const int64_t rs = job->op->u.conv2d.r * job->op->u.conv2d.s;
  const int64_t hw = job->op->u.conv2d.h * job->op->u.conv2d.w;
  sub.u.conv2d.c = end - begin;
  kiln_cpu_conv2d_im2col(&sub, job->x + begin * hw, job->j0, job->cols, job->col + begin * rs * job->cols);
}

void kiln_cpu_conv2d_im2col_parallel(const kiln_cpu_par_t *par, const kiln_op_t *op, const float *x,
                                     int64_t j0, int64_t cols, float *out_col) {
  im2col_job_t job = {.op = op, .x = x, .j0 = j0, .cols = cols, .col = out_col};
  const int64_t per_channel = op->u.conv2d.r * op->u.conv2d.s * cols;
  int64_t grain = per_channel > 0 ? (1 << 15) / per_channel : 1;
  if (grain < 1) grain = 1;
  if (par && op->u.conv2d.c > grain) {
    kiln_cpu_parallel_for(par, op->u.conv2d.c, grain, im2col_task, &job);
  } else {
    kiln_cpu_conv2d_im2col(op, x, j0, cols, out_col);
  }
}

static void conv2d_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const float *x = in[0], *w = in[1], *bias = op->u.conv2d.has_bias ? in[2] : NULL;
  float *y = out;
  const int64_t n = op->u.conv2d.n, k = op->u.conv2d.k;
  conv_plan_t cp = {
      .op = op, .x = x, .w = w, .bias = op->u.conv2d.has_bias ? bias : NULL, .y = y,
      .crs = op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s,
      .pq = op->u.conv2d.p * op->u.conv2d.q,
      .pointwise = kiln_cpu_conv2d_is_pointwise(op),
  };
  if (n <= 0 || k <= 0 || cp.pq <= 0) return;
  cp.chunk = cp.pointwise ? cp.pq : kiln_cpu_conv2d_panel_cols(op);
  const int threads = kiln_cpu_par_threads(par);
  const int64_t work = n * k * cp.pq * (cp.crs > 0 ? cp.crs : 1);

  if (threads <= 1 || work < 2 * KILN_CONV_MIN_WORK_PER_THREAD) {
    cp.chunks = (cp.pq + cp.chunk - 1) / cp.chunk;
    conv_items_task(&cp, 0, n * cp.chunks, 0);
    return;
  }
  /* Enough images (or panels) to give every thread several: each thread
   * runs whole GEMMs on its own panels, nothing shared. */
  int64_t chunks = (cp.pq + cp.chunk - 1) / cp.chunk;
  if (n * chunks < 2 * threads && !cp.pointwise) {
    /* Few images: cut each plane finer, down to one panel per thread, as
     * long as the panels stay wide enough for the GEMM. */
    int64_t want = (2 * threads + n - 1) / n;
    int64_t cols = (cp.pq + want - 1) / want;
    cols = (cols + KILN_CPU_GEMM_NR - 1) / KILN_CPU_GEMM_NR * KILN_CPU_GEMM_NR;
    if (cols >= KILN_CONV_PANEL_MIN_COLS && cols < cp.chunk) {
      cp.chunk = cols;
      chunks = (cp.pq + cp.chunk - 1) / cp.chunk;
    }
  }
  cp.chunks = chunks;
  /* Panels are equal work, so they share out evenly when they divide among
   * the threads or are many. */
  if (n * chunks % threads == 0 || n * chunks >= 4 * threads) {
    kiln_cpu_parallel_for(par, n * chunks, 1, conv_items_task, &cp);
    return;
  }
  /* Too few panels to share out: one panel at a time, each GEMM split across
   * the par. */
  float *col = NULL;
  if (!cp.pointwise) {
    const size_t bytes = sizeof(float) * (size_t)(cp.crs * cp.chunk) + 64;
    col = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!col) {
      conv_items_task(&cp, 0, n * chunks, 0);
      return;
    }
  }
  const int64_t chw = op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w;
  for (int64_t i = 0; i < n * chunks; i++) {
    const int64_t ni = i / chunks, j0 = (i % chunks) * cp.chunk;
    const int64_t cols = cp.pq - j0 < cp.chunk ? cp.pq - j0 : cp.chunk;
    const float *xi = x + ni * chw;
    float *yi = y + ni * k * cp.pq + j0;
    if (cp.pointwise) {
      kiln_cpu_sgemm(par, false, false, k, cols, cp.crs, w, cp.crs, xi + j0, cp.pq, yi, cp.pq);
    } else {
      kiln_cpu_conv2d_im2col_parallel(par, op, xi, j0, cols, col);
      kiln_cpu_sgemm(par, false, false, k, cols, cp.crs, w, cp.crs, col, cols, yi, cp.pq);
    }
    add_bias(&cp, yi, cols);
  }
  free(col);
}

/* ---- f64 ------------------------------------------------------------------------
 * The f32 lowering, plainly: per image, im2col panels of doubles into kiln's
 * DGEMM, each product split across the par. */

/* Column panel [j0, j0 + cols) of image x (c x h x w) as a (c*r*s) x cols
 * matrix; padded cells are 0. */
static void im2col_f64(const kiln_op_t *op, const double *x, int64_t j0, int64_t cols, double *col) {
  const int64_t h = op->u.conv2d.h, w = op->u.conv2d.w, q = op->u.conv2d.q;
  const int64_t r = op->u.conv2d.r, s = op->u.conv2d.s;
  for (int64_t ci = 0; ci < op->u.conv2d.c; ci++)
    for (int64_t ri = 0; ri < r; ri++)
      for (int64_t si = 0; si < s; si++) {
        double *row = col + ((ci * r + ri) * s + si) * cols;
        for (int64_t t = 0; t < cols; t++) {
          const int64_t pp = (j0 + t) / q, qq = (j0 + t) % q;
          const int64_t hh = pp * op->u.conv2d.stride[0] - op->u.conv2d.pad[0] + ri * op->u.conv2d.dil[0];
          const int64_t ww = qq * op->u.conv2d.stride[1] - op->u.conv2d.pad[1] + si * op->u.conv2d.dil[1];
          row[t] = hh >= 0 && hh < h && ww >= 0 && ww < w ? x[(ci * h + hh) * w + ww] : 0.0;
        }
      }
}

/* Without memory for a panel: each output summed directly. */
static void conv2d_f64_direct(const kiln_op_t *op, double *y, const double *x, const double *wt,
                              const double *bias) {
  const int64_t c = op->u.conv2d.c, h = op->u.conv2d.h, w = op->u.conv2d.w, k = op->u.conv2d.k;
  const int64_t r = op->u.conv2d.r, s = op->u.conv2d.s, p = op->u.conv2d.p, q = op->u.conv2d.q;
  for (int64_t ni = 0; ni < op->u.conv2d.n; ni++)
    for (int64_t kk = 0; kk < k; kk++)
      for (int64_t pp = 0; pp < p; pp++)
        for (int64_t qq = 0; qq < q; qq++) {
          double sum = 0.0;
          for (int64_t ci = 0; ci < c; ci++)
            for (int64_t ri = 0; ri < r; ri++)
              for (int64_t si = 0; si < s; si++) {
                const int64_t hh = pp * op->u.conv2d.stride[0] - op->u.conv2d.pad[0] + ri * op->u.conv2d.dil[0];
                const int64_t ww = qq * op->u.conv2d.stride[1] - op->u.conv2d.pad[1] + si * op->u.conv2d.dil[1];
                if (hh >= 0 && hh < h && ww >= 0 && ww < w)
                  sum += wt[((kk * c + ci) * r + ri) * s + si] * x[((ni * c + ci) * h + hh) * w + ww];
              }
          y[((ni * k + kk) * p + pp) * q + qq] = sum + (bias ? bias[kk] : 0.0);
        }
}

static void conv2d_f64(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const double *x = in[0], *w = in[1], *bias = op->u.conv2d.has_bias ? in[2] : NULL;
  double *y = out;
  const int64_t n = op->u.conv2d.n, k = op->u.conv2d.k;
  const int64_t crs = op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s, pq = op->u.conv2d.p * op->u.conv2d.q;
  const int64_t chw = op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w;
  if (n <= 0 || k <= 0 || pq <= 0) return;
  const bool pointwise = kiln_cpu_conv2d_is_pointwise(op);
  int64_t chunk = pq;
  double *col = NULL;
  if (!pointwise) {
    chunk = crs > 0 ? KILN_CONV_PANEL_BYTES / ((int64_t)sizeof(double) * crs) : pq;
    if (chunk < KILN_CONV_PANEL_MIN_COLS) chunk = KILN_CONV_PANEL_MIN_COLS;
    if (chunk > pq) chunk = pq;
    col = malloc(sizeof(double) * (size_t)(crs * chunk));
    if (!col) {
      conv2d_f64_direct(op, y, x, w, bias);
      return;
    }
  }
  for (int64_t ni = 0; ni < n; ni++)
    for (int64_t j0 = 0; j0 < pq; j0 += chunk) {
      const int64_t cols = pq - j0 < chunk ? pq - j0 : chunk;
      const double *xi = x + ni * chw;
      double *yi = y + ni * k * pq + j0;
      if (pointwise) {
        kiln_cpu_dgemm(par, false, false, k, cols, crs, w, crs, xi + j0, pq, yi, pq);
      } else {
        im2col_f64(op, xi, j0, cols, col);
        kiln_cpu_dgemm(par, false, false, k, cols, crs, w, crs, col, cols, yi, pq);
      }
      if (bias)
        for (int64_t kk = 0; kk < k; kk++)
          for (int64_t j = 0; j < cols; j++) yi[kk * pq + j] += bias[kk];
    }
  free(col);
}

/* ---- bf16 on the CPU's bf16 unit --------------------------------------------------
 * The f32 lowering with bf16 panels: im2col copies the 16-bit elements as
 * they are, and kiln_cpu_bgemm_avx512 multiplies W by the panel on AMX or
 * vdpbf16ps, sums in f32, adds the bias and rounds each output once. Work
 * items as in conv2d_f32 (an image's panel each), one per task. */
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
void kiln_cpu_conv2d_im2col_u16(const kiln_op_t *op, const uint16_t *x, int64_t j0, int64_t cols, uint16_t *out_col,
                                int64_t ld) {
  im2col_es(op, x, j0, cols, out_col, ld, sizeof(uint16_t));
}

static void im2col_u16(const kiln_op_t *op, const uint16_t *x, int64_t j0, int64_t cols, uint16_t *col) {
  kiln_cpu_conv2d_im2col_u16(op, x, j0, cols, col, cols);
}

typedef struct bconv_plan_t {
  const kiln_op_t *op;
  const uint16_t *x, *w, *bias;
  uint16_t *y;
  int64_t crs, pq, chunk, chunks;
  bool pointwise;
  int failed; /* a task had no memory */
} bconv_plan_t;

static void bconv_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  bconv_plan_t *cp = ctx;
  const kiln_op_t *op = cp->op;
  const int64_t chw = op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w, k = op->u.conv2d.k;
  uint16_t *col = cp->pointwise ? NULL : malloc(sizeof(uint16_t) * (size_t)(cp->crs * cp->chunk));
  if (!cp->pointwise && !col) {
    __atomic_store_n(&cp->failed, 1, __ATOMIC_RELAXED);
    return;
  }
  for (int64_t i = begin; i < end; i++) {
    const int64_t ni = i / cp->chunks, j0 = (i % cp->chunks) * cp->chunk;
    const int64_t cols = cp->pq - j0 < cp->chunk ? cp->pq - j0 : cp->chunk;
    const uint16_t *x = cp->x + ni * chw;
    uint16_t *y = cp->y + ni * k * cp->pq + j0;
    bool ok;
    if (cp->pointwise) {
      ok = kiln_cpu_bgemm_avx512(false, false, k, cols, cp->crs, cp->w, cp->crs, x + j0, cp->pq, y, cp->pq, cp->bias);
    } else {
      im2col_u16(op, x, j0, cols, col);
      ok = kiln_cpu_bgemm_avx512(false, false, k, cols, cp->crs, cp->w, cp->crs, col, cols, y, cp->pq, cp->bias);
    }
    if (!ok) __atomic_store_n(&cp->failed, 1, __ATOMIC_RELAXED);
  }
  free(col);
}

/* False when memory ran short (the output is then partly written). */
static bool conv2d_bf16(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  bconv_plan_t cp = {
      .op = op, .x = in[0], .w = in[1], .bias = op->u.conv2d.has_bias ? in[2] : NULL, .y = out,
      .crs = op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s, .pq = op->u.conv2d.p * op->u.conv2d.q,
      .pointwise = kiln_cpu_conv2d_is_pointwise(op),
  };
  const int64_t n = op->u.conv2d.n;
  if (n <= 0 || op->u.conv2d.k <= 0 || cp.pq <= 0) return true;
  cp.chunk = cp.pointwise ? cp.pq : kiln_cpu_conv2d_panel_cols(op);
  cp.chunks = (cp.pq + cp.chunk - 1) / cp.chunk;
  /* Few images: cut each plane finer, down to about two panels per thread,
   * as long as the panels stay wide enough for the tiles (conv2d_f32's rule). */
  const int threads = kiln_cpu_par_threads(par);
  if (threads > 1 && n * cp.chunks < 2 * threads) {
    const int64_t want = (2 * threads + n - 1) / n;
    int64_t cols = (cp.pq + want - 1) / want;
    cols = (cols + 31) / 32 * 32;
    if (cols >= KILN_CONV_PANEL_MIN_COLS && cols < cp.chunk) {
      cp.chunk = cols;
      cp.chunks = (cp.pq + cp.chunk - 1) / cp.chunk;
    }
  }
  kiln_cpu_parallel_for(par, n * cp.chunks, 1, bconv_task, &cp);
  return !cp.failed;
}
#endif

/* f32 and f64 natively; bf16 on the CPU's bf16 unit where it has one; f16
 * (and bf16 elsewhere) through f32, rounded once. */
void kiln_cpu_conv2d_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  switch (op->out.dtype) {
  case KILN_F64: conv2d_f64(par, op, out, in); return;
  case KILN_BF16:
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
    if (kiln_cpu_bf16_gemm_available() &&
        op->u.conv2d.k * op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s >= KILN_BCONV_MIN_WEIGHTS &&
        conv2d_bf16(par, op, out, in))
      return;
#endif
    kiln_cpu_run_via_f32(par, op, out, in, conv2d_f32);
    return;
  case KILN_F16: kiln_cpu_run_via_f32(par, op, out, in, conv2d_f32); return;
  default: conv2d_f32(par, op, out, in); return;
  }
}
