/* kernels/cpu/blas.c: the CPU backend's `blas` provider: MATMUL, CONV2D and its gradients through a CBLAS (OpenBLAS), split over the device's thread pool. */
#include <stdlib.h>

#include "kernels/cpu/gemm_internal.h"

#if defined(KILN_HAVE_BLAS)
#include <cblas.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

/* A conv panel for the BLAS is allowed to be larger than kiln's own: the
 * library blocks for the cache itself and runs faster on wider products. */
#define KILN_BLAS_CONV_PANEL_BYTES ((int64_t)16 << 20)

/* Multiply-adds each par thread takes at least (about 20 us of work):
 * below it, the product stays on the queue's worker. Splitting a product of a
 * few microseconds pays on an idle machine, but each split ends in a barrier,
 * and on a busy one a thread that is descheduled holds the others up for a
 * whole time slice; one thread degrades gracefully instead. */
#define KILN_BLAS_MIN_WORK_PER_THREAD ((int64_t)1 << 22)

/* How the library's calls are threaded.
 *
 * kiln runs OpenBLAS one call per thread, on the device's own par, with the
 * product split into one block of C per thread: then a device uses exactly its
 * share of the cores (KILN_CPU_DEVICES splits them), two devices run their
 * products at once (OpenBLAS serialises its own threaded calls behind one
 * lock), nothing wakes OpenBLAS's helper threads (which spin with sched_yield
 * for a long while after each call and take cores from kiln's threads), and a
 * small product stays on the queue's worker.
 *
 * OpenBLAS 0.3.21 (pthreads) has no per-call thread count, only the process-
 * wide openblas_set_num_threads. While any kiln call is in flight, kiln sets
 * it to 1 and afterwards restores the value it found (counted across devices,
 * so overlapping calls restore it once). An application calling OpenBLAS
 * itself during that window runs single-threaded; outside it, nothing changes.
 * A device uses at most as many threads as OpenBLAS was configured for
 * (OPENBLAS_NUM_THREADS=1 keeps kiln's calls on one thread too). */
typedef enum blas_threading_t {
  BLAS_THREADING_SEQUENTIAL, /* the library never threads: split freely */
  BLAS_THREADING_PTHREADS,   /* OpenBLAS with its own pthreads: split, with the count held at 1 */
  BLAS_THREADING_LIBRARY,    /* OpenMP OpenBLAS or another CBLAS: leave the threading to it */
} blas_threading_t;

static blas_threading_t g_threading; /* decided once, on first use */
static pthread_once_t g_threading_once = PTHREAD_ONCE_INIT;

#if defined(KILN_HAVE_OPENBLAS)
static pthread_mutex_t g_count_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_count_users;       /* kiln calls in flight */
static int g_count_saved = 1;   /* the count found before the first of them */
static bool g_sets_affinity;    /* this OpenBLAS resets the caller's affinity when set to 1 thread */
#endif

static void blas_threading_decide(void) {
#if defined(KILN_HAVE_OPENBLAS)
  switch (openblas_get_parallel()) {
  case 0: g_threading = BLAS_THREADING_SEQUENTIAL; break;
  case 1: g_threading = BLAS_THREADING_PTHREADS; break;
  default: g_threading = BLAS_THREADING_LIBRARY; break;
  }
  const char *config = openblas_get_config();
  g_sets_affinity = config && !strstr(config, "NO_AFFINITY");
#else
  g_threading = BLAS_THREADING_LIBRARY;
#endif
}

static blas_threading_t blas_threading(void) {
  pthread_once(&g_threading_once, blas_threading_decide);
  return g_threading;
}

/* Hold the library at one thread per call while kiln calls it; returns how
 * many threads one kiln product may use at most. */
static int blas_calls_begin(blas_threading_t threading) {
#if defined(KILN_HAVE_OPENBLAS)
  if (threading != BLAS_THREADING_PTHREADS) return threading == BLAS_THREADING_SEQUENTIAL ? CPU_SETSIZE : 1;
  pthread_mutex_lock(&g_count_lock);
  if (g_count_users++ == 0) {
    g_count_saved = openblas_get_num_threads();
    if (g_count_saved != 1) {
      /* Builds with affinity support put the calling thread back on the
       * process's original CPUs when going to one thread: keep the worker's. */
      cpu_set_t mine;
      const bool have = g_sets_affinity && pthread_getaffinity_np(pthread_self(), sizeof mine, &mine) == 0;
      openblas_set_num_threads(1);
      if (have) pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);
    }
  }
  const int limit = g_count_saved > 1 ? g_count_saved : 1;
  pthread_mutex_unlock(&g_count_lock);
  return limit;
#else
  return threading == BLAS_THREADING_SEQUENTIAL ? CPU_SETSIZE : 1;
#endif
}

static void blas_calls_end(blas_threading_t threading) {
#if defined(KILN_HAVE_OPENBLAS)
  if (threading != BLAS_THREADING_PTHREADS) return;
  pthread_mutex_lock(&g_count_lock);
  /* Restore the count unless the application changed it meanwhile. */
  if (--g_count_users == 0 && g_count_saved != 1 && openblas_get_num_threads() == 1)
    openblas_set_num_threads(g_count_saved);
  pthread_mutex_unlock(&g_count_lock);
#else
  (void)threading;
#endif
}

bool kiln_cpu_blas_available(void) { return true; }

/* ---- one product split over the par ------------------------------------------ */

typedef struct blas_gemm_t {
  bool trans_a, trans_b, accumulate;
  int64_t m, n, k;
  const float *a;
  int64_t lda;
  const float *b;
  int64_t ldb;
  float *c;
  int64_t ldc;
  int tm, tn; /* the grid of C blocks, one per thread */
  /* f64 products (cblas_dgemm) read these instead of a, b, c. */
  const double *da, *db;
  double *dc;
} blas_gemm_t;

static int clamp_ld(int64_t ld) { return ld > 0 ? (int)ld : 1; }

static void blas_sgemm_block(const blas_gemm_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m1 <= m0 || n1 <= n0) return;
  if (g->dc) {
    const double *a = g->trans_a ? g->da + m0 : g->da + m0 * g->lda;
    const double *b = g->trans_b ? g->db + n0 * g->ldb : g->db + n0;
    cblas_dgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans,
                (int)(m1 - m0), (int)(n1 - n0), (int)g->k, 1.0, a, clamp_ld(g->lda), b, clamp_ld(g->ldb),
                g->accumulate ? 1.0 : 0.0, g->dc + m0 * g->ldc + n0, clamp_ld(g->ldc));
    return;
  }
  const float *a = g->trans_a ? g->a + m0 : g->a + m0 * g->lda;
  const float *b = g->trans_b ? g->b + n0 * g->ldb : g->b + n0;
  /* CBLAS insists on ld >= 1 even where nothing is read; the core keeps the
   * sizes within int for this provider. */
  cblas_sgemm(CblasRowMajor, g->trans_a ? CblasTrans : CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans,
              (int)(m1 - m0), (int)(n1 - n0), (int)g->k, 1.0f, a, clamp_ld(g->lda), b, clamp_ld(g->ldb),
              g->accumulate ? 1.0f : 0.0f, g->c + m0 * g->ldc + n0, clamp_ld(g->ldc));
}

/* Blocks start on multiples of these, so that every block but the last is
 * made of the library's whole register tiles. */
enum { BLAS_ROW_ALIGN = 8, BLAS_COL_ALIGN = 16 };

static void blas_gemm_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const blas_gemm_t *g = ctx;
  const int64_t mu = (g->m + BLAS_ROW_ALIGN - 1) / BLAS_ROW_ALIGN;
  const int64_t nu = (g->n + BLAS_COL_ALIGN - 1) / BLAS_COL_ALIGN;
  for (int64_t t = begin; t < end; t++) {
    const int64_t ti = t / g->tn, tj = t % g->tn;
    int64_t m0 = mu * ti / g->tm * BLAS_ROW_ALIGN, m1 = mu * (ti + 1) / g->tm * BLAS_ROW_ALIGN;
    int64_t n0 = nu * tj / g->tn * BLAS_COL_ALIGN, n1 = nu * (tj + 1) / g->tn * BLAS_COL_ALIGN;
    blas_sgemm_block(g, m0 < g->m ? m0 : g->m, m1 < g->m ? m1 : g->m, n0 < g->n ? n0 : g->n,
                     n1 < g->n ? n1 : g->n);
  }
}

/* The tm x tn split of `threads` whose largest block is smallest; ties go to
 * splitting M (blocks of whole rows of C share no cache lines). */
static void blas_choose_grid(int64_t m, int64_t n, int threads, int *out_tm, int *out_tn) {
  const int64_t mu = (m + BLAS_ROW_ALIGN - 1) / BLAS_ROW_ALIGN;
  const int64_t nu = (n + BLAS_COL_ALIGN - 1) / BLAS_COL_ALIGN;
  int best_tm = 1, best_tn = 1;
  int64_t best = INT64_MAX;
  for (int tm = threads; tm >= 1; tm--) {
    if (threads % tm) continue;
    const int tn = threads / tm;
    if (tm > mu || tn > nu) continue;
    const int64_t cost = (mu + tm - 1) / tm * BLAS_ROW_ALIGN * ((nu + tn - 1) / tn * BLAS_COL_ALIGN);
    if (cost < best) {
      best = cost;
      best_tm = tm;
      best_tn = tn;
    }
  }
  *out_tm = best_tm;
  *out_tn = best_tn;
}

/* C = op(A) op(B) (C += ... when accumulate) with at most `limit` threads of
 * `par` (par NULL: this thread alone), each running one single-threaded
 * library call. */
static void blas_gemm_split(const kiln_cpu_par_t *par, int limit, blas_gemm_t g) {
  const int64_t m = g.m, n = g.n, k = g.k;
  if (m <= 0 || n <= 0) return;
  int threads = kiln_cpu_par_threads(par);
  if (threads > limit) threads = limit;
  const int64_t work = m * n * (k > 0 ? k : 1);
  if (threads > 1 && work / threads < KILN_BLAS_MIN_WORK_PER_THREAD)
    threads = (int)(work / KILN_BLAS_MIN_WORK_PER_THREAD);
  if (threads > 1) blas_choose_grid(m, n, threads, &g.tm, &g.tn);
  if (g.tm * g.tn <= 1) {
    blas_sgemm_block(&g, 0, m, 0, n);
    return;
  }
  kiln_cpu_parallel_for(par, g.tm * g.tn, 1, blas_gemm_task, &g);
}

static void blas_sgemm_acc(const kiln_cpu_par_t *par, int limit, bool trans_a, bool trans_b, bool accumulate,
                           int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb,
                           float *c, int64_t ldc) {
  const blas_gemm_t g = {trans_a, trans_b, accumulate, m, n, k, a, lda, b, ldb, c, ldc, 1, 1, NULL, NULL, NULL};
  blas_gemm_split(par, limit, g);
}

/* The same in f64, split alike: cblas_dgemm per block of C. */
static void blas_dgemm(const kiln_cpu_par_t *par, int limit, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, const double *a, int64_t lda, const double *b, int64_t ldb, double *c, int64_t ldc) {
  const blas_gemm_t g = {trans_a, trans_b, false, m, n, k, NULL, lda, NULL, ldb, NULL, ldc, 1, 1, a, b, c};
  blas_gemm_split(par, limit, g);
}

static void blas_sgemm(const kiln_cpu_par_t *par, int limit, bool trans_a, bool trans_b, int64_t m, int64_t n,
                       int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc) {
  blas_sgemm_acc(par, limit, trans_a, trans_b, false, m, n, k, a, lda, b, ldb, c, ldc);
}

/* ---- MATMUL ---------------------------------------------------------------------- */

typedef struct blas_batch_t {
  const kiln_op_t *op;
  const float *a, *b; /* f32 */
  float *c;
  const double *da, *db; /* f64 */
  double *dc;
} blas_batch_t;

/* One product of the batch, f32 or f64 as the op says. */
static void blas_batch_one(const kiln_cpu_par_t *par, int limit, const blas_batch_t *bb, int64_t i) {
  const kiln_op_t *op = bb->op;
  if (op->out.dtype == KILN_F64) {
    blas_dgemm(par, limit, op->u.matmul.trans_a, op->u.matmul.trans_b, op->u.matmul.m, op->u.matmul.n,
               op->u.matmul.k, (const double *)bb->da + i * op->u.matmul.stride_a, op->u.matmul.lda,
               (const double *)bb->db + i * op->u.matmul.stride_b, op->u.matmul.ldb,
               bb->dc + i * op->u.matmul.stride_c, op->u.matmul.ldc);
    return;
  }
  blas_sgemm(par, limit, op->u.matmul.trans_a, op->u.matmul.trans_b, op->u.matmul.m, op->u.matmul.n,
             op->u.matmul.k, bb->a + i * op->u.matmul.stride_a, op->u.matmul.lda, bb->b + i * op->u.matmul.stride_b,
             op->u.matmul.ldb, bb->c + i * op->u.matmul.stride_c, op->u.matmul.ldc);
}

static void blas_batch_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const blas_batch_t *bb = ctx;
  for (int64_t i = begin; i < end; i++) blas_batch_one(NULL, 1, bb, i);
}

void kiln_cpu_matmul_blas(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const int64_t batch = op->u.matmul.batch;
  const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
  if (batch <= 0 || m <= 0 || n <= 0) return;
  const blas_threading_t threading = blas_threading();
  const int limit = blas_calls_begin(threading);
  blas_batch_t bb = {op, NULL, NULL, NULL, NULL, NULL, NULL};
  if (op->out.dtype == KILN_F64) {
    bb.da = in[0];
    bb.db = in[1];
    bb.dc = out;
  } else {
    bb.a = in[0];
    bb.b = in[1];
    bb.c = out;
  }
  const int threads = kiln_cpu_par_threads(par);
  const int64_t work = m * n * (k > 0 ? k : 1);
  if (limit > 1 && threads > 1 && batch > 1 && work < (int64_t)threads * 4 * KILN_BLAS_MIN_WORK_PER_THREAD &&
      work * batch >= 2 * KILN_BLAS_MIN_WORK_PER_THREAD) {
    /* Many small products: whole products per thread. */
    kiln_cpu_parallel_for(par, batch, 1, blas_batch_task, &bb);
  } else {
    for (int64_t i = 0; i < batch; i++) blas_batch_one(par, limit, &bb, i);
  }
  blas_calls_end(threading);
}

/* ---- CONV2D ---------------------------------------------------------------------- */

void kiln_cpu_conv2d_blas(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const float *x = in[0], *w = in[1], *bias = op->u.conv2d.has_bias ? in[2] : NULL;
  float *y = out;
  const int64_t n = op->u.conv2d.n, k = op->u.conv2d.k;
  const int64_t crs = op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s;
  const int64_t pq = op->u.conv2d.p * op->u.conv2d.q;
  const int64_t chw = op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w;
  if (n <= 0 || k <= 0 || pq <= 0) return;
  const bool pointwise = kiln_cpu_conv2d_is_pointwise(op);

  int64_t chunk = pq;
  float *col = NULL;
  if (!pointwise) {
    int64_t cols = crs > 0 ? KILN_BLAS_CONV_PANEL_BYTES / ((int64_t)sizeof(float) * crs) : pq;
    const int64_t native_cols = kiln_cpu_conv2d_panel_cols(op);
    if (cols < native_cols) cols = native_cols;
    chunk = cols < pq ? cols : pq;
    const size_t bytes = sizeof(float) * (size_t)(crs * chunk) + 64;
    col = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!col) {
      /* kiln's own path needs only small per-thread panels (or none). */
      kiln_cpu_conv2d_native(par, op, out, in);
      return;
    }
  }
  const blas_threading_t threading = blas_threading();
  const int limit = blas_calls_begin(threading);
  /* One panel at a time: the par lays out the panel, then splits its
   * product. */
  for (int64_t ni = 0; ni < n; ni++) {
    const float *xi = x + ni * chw;
    for (int64_t j0 = 0; j0 < pq; j0 += chunk) {
      const int64_t cols = pq - j0 < chunk ? pq - j0 : chunk;
      float *yi = y + ni * k * pq + j0;
      const float *b = xi + j0;
      int64_t ldb = pq;
      if (!pointwise) {
        kiln_cpu_conv2d_im2col_parallel(par, op, xi, j0, cols, col);
        b = col;
        ldb = cols;
      }
      if (crs > 0) {
        blas_sgemm(par, limit, false, false, k, cols, crs, w, crs, b, ldb, yi, pq);
      } else {
        for (int64_t kk = 0; kk < k; kk++)
          for (int64_t j = 0; j < cols; j++) yi[kk * pq + j] = 0.0f;
      }
      if (op->u.conv2d.has_bias && bias) {
        for (int64_t kk = 0; kk < k; kk++) {
          float *row = yi + kk * pq;
          for (int64_t j = 0; j < cols; j++) row[j] += bias[kk];
        }
      }
    }
  }
  blas_calls_end(threading);
  free(col);
}

/* ---- CONV2D's gradients ------------------------------------------------------------ */

/* The drivers of conv_backward.c with the library's GEMM: one single-threaded
 * call per product where the items are shared out over the par, or each
 * product split over the par where they run one at a time. The library
 * blocks for the caches itself, so its panels may be larger than kiln's. */
#define KILN_BLAS_CONV_BWD_PANEL_FLOATS ((int64_t)(2 << 20) / (int64_t)sizeof(float))

static void blas_conv_gemm(void *ctx, const kiln_cpu_par_t *par, const kiln_cpu_gemm_t *g, float *scratch) {
  const int limit = *(const int *)ctx;
  if (g->k <= 0) {
    if (!g->accumulate)
      for (int64_t i = 0; i < g->m; i++) memset(g->c + i * g->ldc, 0, sizeof(float) * (size_t)g->n);
    return;
  }
  blas_sgemm_acc(par, limit, g->trans_a, g->trans_b, g->accumulate, g->m, g->n, g->k, g->a, g->lda, g->b, g->ldb,
                 g->c, g->ldc);
}

void kiln_cpu_conv2d_backward_input_blas(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out,
                                         const void *const *in) {
  const blas_threading_t threading = blas_threading();
  int limit = blas_calls_begin(threading);
  /* A library that threads itself is called from one thread only. */
  const kiln_cpu_par_t *use = limit > 1 ? par : NULL;
  const kiln_cpu_conv_gemm_t gemm = {blas_conv_gemm, &limit, false, KILN_BLAS_CONV_BWD_PANEL_FLOATS};
  kiln_cpu_conv2d_backward_input_run(use, op, out, in[0], in[1], &gemm);
  blas_calls_end(threading);
}

void kiln_cpu_conv2d_backward_weight_blas(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out,
                                          const void *const *in) {
  const blas_threading_t threading = blas_threading();
  int limit = blas_calls_begin(threading);
  const kiln_cpu_par_t *use = limit > 1 ? par : NULL;
  const kiln_cpu_conv_gemm_t gemm = {blas_conv_gemm, &limit, false, KILN_BLAS_CONV_BWD_PANEL_FLOATS};
  kiln_cpu_conv2d_backward_weight_run(use, op, out, in[0], in[1], &gemm);
  blas_calls_end(threading);
}

#else /* !KILN_HAVE_BLAS */

bool kiln_cpu_blas_available(void) { return false; }

/* Never called (the backend offers the provider only when it is available);
 * they compute the same result through kiln's own kernels all the same, so a
 * caller that forgets the check gets right answers, not a crash. */
void kiln_cpu_matmul_blas(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) { kiln_cpu_matmul_native(par, op, out, in); }

void kiln_cpu_conv2d_blas(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) { kiln_cpu_conv2d_native(par, op, out, in); }

void kiln_cpu_conv2d_backward_input_blas(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) { kiln_cpu_conv2d_backward_input_native(par, op, out, in); }

void kiln_cpu_conv2d_backward_weight_blas(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) { kiln_cpu_conv2d_backward_weight_native(par, op, out, in); }

#endif /* KILN_HAVE_BLAS */
