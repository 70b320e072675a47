/* kernels/cpu/gemm.c: kiln's CPU SGEMM: Goto/BLIS-style packing and blocking, ISA dispatch, the MATMUL op. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_internal.h"

enum { MR = KILN_CPU_GEMM_MR, NR = KILN_CPU_GEMM_NR };

/* Cache blocking. A KC x NR sliver of B (16 KiB) stays in L1 while the
 * micro-kernel sweeps an MC x KC block of A (144 KiB) held in L2; the KC x NC
 * panel of B (up to 4 MiB) lives in the last-level cache. */
enum { KC = 256, MC = 144, NC = 4096 };

/* Below this many multiply-adds per thread, waking the par costs more than
 * it saves. */
#define KILN_GEMM_MIN_WORK_PER_THREAD ((int64_t)1 << 17)

#define KILN_GEMM_ALIGN 64

typedef struct gemm_problem_t {
  bool trans_a, trans_b;
  int64_t m, n, k;
  const float *a;
  int64_t lda;
  const float *b;
  int64_t ldb;
  float *c;
  int64_t ldc;
  kiln_cpu_gemm_ukernel_fn ukernel;
  int tm, tn; /* thread grid: tm slices of M by tn slices of N */
} gemm_problem_t;

static inline int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

kiln_cpu_gemm_isa_t kiln_cpu_gemm_isa_best(void) {
#if defined(KILN_HAVE_AVX2_KERNEL)
  /* libgcc also checks that the OS saves the ymm state before it reports avx2. */
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KILN_CPU_GEMM_ISA_AVX2;
#endif
  return KILN_CPU_GEMM_ISA_PORTABLE;
}

const char *kiln_cpu_gemm_isa_name(kiln_cpu_gemm_isa_t isa) {
  switch (isa) {
    case KILN_CPU_GEMM_ISA_AUTO: return kiln_cpu_gemm_isa_name(kiln_cpu_gemm_isa_best());
    case KILN_CPU_GEMM_ISA_AVX2: return "avx2+fma";
    case KILN_CPU_GEMM_ISA_PORTABLE: return "portable";
  }
  return "unknown";
}

static kiln_cpu_gemm_ukernel_fn ukernel_for(kiln_cpu_gemm_isa_t isa) {
  if (isa == KILN_CPU_GEMM_ISA_AUTO || isa == KILN_CPU_GEMM_ISA_AVX2) {
#if defined(KILN_HAVE_AVX2_KERNEL)
    if (kiln_cpu_gemm_isa_best() == KILN_CPU_GEMM_ISA_AVX2) return kiln_cpu_gemm_ukernel_avx2;
#endif
  }
  return kiln_cpu_gemm_ukernel_portable;
}

/* Rows [i0, i0+mc) and columns [p0, p0+kc) of op(A) into MR-row slivers, each
 * stored k-major (MR values per k step); rows past mc are zero so edge tiles
 * need no special kernel. */
static void pack_a(const gemm_problem_t *g, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
                   float *restrict out) {
  for (int64_t ir = 0; ir < mc; ir += MR) {
    const int64_t mr = min_i64(MR, mc - ir);
    float *restrict dst = out + ir * kc;
    if (!g->trans_a) {
      const float *src = g->a + (i0 + ir) * g->lda + p0;
      const int64_t lda = g->lda;
      if (mr == MR) {
        for (int64_t l = 0; l < kc; l++)
          for (int i = 0; i < MR; i++) dst[l * MR + i] = src[i * lda + l];
      } else {
        for (int64_t l = 0; l < kc; l++) {
          int i = 0;
          for (; i < mr; i++) dst[l * MR + i] = src[i * lda + l];
          for (; i < MR; i++) dst[l * MR + i] = 0.0f;
        }
      }
    } else {
      /* op(A)(i, l) = a[l*lda + i]: each k step is MR contiguous values. */
      const float *src = g->a + p0 * g->lda + i0 + ir;
      for (int64_t l = 0; l < kc; l++) {
        const float *s = src + l * g->lda;
        int i = 0;
        for (; i < mr; i++) dst[l * MR + i] = s[i];
        for (; i < MR; i++) dst[l * MR + i] = 0.0f;
      }
    }
  }
}

/* Rows [p0, p0+kc) and columns [j0, j0+nc) of op(B) into NR-column slivers,
 * each stored k-major (NR values per k step), zero-padded past nc. */
static void pack_b(const gemm_problem_t *g, int64_t j0, int64_t nc, int64_t p0, int64_t kc,
                   float *restrict out) {
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int64_t nr = min_i64(NR, nc - jr);
    float *restrict dst = out + jr * kc;
    if (!g->trans_b) {
      const float *src = g->b + p0 * g->ldb + j0 + jr;
      if (nr == NR) {
        for (int64_t l = 0; l < kc; l++) memcpy(dst + l * NR, src + l * g->ldb, sizeof(float) * NR);
      } else {
        for (int64_t l = 0; l < kc; l++) {
          const float *s = src + l * g->ldb;
          int64_t j = 0;
          for (; j < nr; j++) dst[l * NR + j] = s[j];
          for (; j < NR; j++) dst[l * NR + j] = 0.0f;
        }
      }
    } else {
      /* op(B)(l, j) = b[j*ldb + l]: read each of the NR rows of b
       * sequentially, scatter into the sliver. */
      const float *src = g->b + (j0 + jr) * g->ldb + p0;
      for (int64_t j = 0; j < nr; j++) {
        const float *s = src + j * g->ldb;
        for (int64_t l = 0; l < kc; l++) dst[l * NR + j] = s[l];
      }
      for (int64_t j = nr; j < NR; j++)
        for (int64_t l = 0; l < kc; l++) dst[l * NR + j] = 0.0f;
    }
  }
}

/* The unblocked product, for when no packing memory could be had: slow but
 * correct, and it needs nothing. */
static void gemm_block_direct(const gemm_problem_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t i = m0; i < m1; i++) {
    float *crow = g->c + i * g->ldc;
    for (int64_t j = n0; j < n1; j++) crow[j] = 0.0f;
    for (int64_t l = 0; l < g->k; l++) {
      const float av = g->trans_a ? g->a[l * g->lda + i] : g->a[i * g->lda + l];
      if (!g->trans_b) {
        const float *brow = g->b + l * g->ldb;
        for (int64_t j = n0; j < n1; j++) crow[j] += av * brow[j];
      } else {
        for (int64_t j = n0; j < n1; j++) crow[j] += av * g->b[j * g->ldb + l];
      }
    }
  }
}

static void *alloc_panel(int64_t floats) {
  const size_t bytes = (size_t)round_up(floats * (int64_t)sizeof(float), KILN_GEMM_ALIGN);
  return aligned_alloc(KILN_GEMM_ALIGN, bytes);
}

/* C[m0:m1, n0:n1] on the calling thread, with its own packing buffers. */
static void gemm_block(const gemm_problem_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m1 <= m0 || n1 <= n0) return;
  const int64_t kc_max = min_i64(KC, g->k);
  const int64_t mc_max = min_i64(MC, round_up(m1 - m0, MR));
  const int64_t nc_max = min_i64(NC, round_up(n1 - n0, NR));
  float *apack = alloc_panel(mc_max * kc_max);
  float *bpack = alloc_panel(nc_max * kc_max);
  if (!apack || !bpack) {
    free(apack);
    free(bpack);
    gemm_block_direct(g, m0, m1, n0, n1);
    return;
  }
  _Alignas(KILN_GEMM_ALIGN) float edge[MR * NR];
  const kiln_cpu_gemm_ukernel_fn ukernel = g->ukernel;

  for (int64_t jc = n0; jc < n1; jc += NC) {
    const int64_t nc = min_i64(NC, n1 - jc);
    for (int64_t pc = 0; pc < g->k; pc += KC) {
      const int64_t kc = min_i64(KC, g->k - pc);
      const bool accumulate = pc > 0; /* beta = 0: the first k block overwrites C */
      pack_b(g, jc, nc, pc, kc, bpack);
      for (int64_t ic = m0; ic < m1; ic += MC) {
        const int64_t mc = min_i64(MC, m1 - ic);
        pack_a(g, ic, mc, pc, kc, apack);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int64_t nr = min_i64(NR, nc - jr);
          const float *bp = bpack + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int64_t mr = min_i64(MR, mc - ir);
            const float *ap = apack + ir * kc;
            float *ct = g->c + (ic + ir) * g->ldc + jc + jr;
            if (mr == MR && nr == NR) {
              ukernel(kc, ap, bp, ct, g->ldc, accumulate);
            } else {
              ukernel(kc, ap, bp, edge, NR, false);
              for (int64_t i = 0; i < mr; i++) {
                float *crow = ct + i * g->ldc;
                const float *erow = edge + i * NR;
                if (accumulate) {
                  for (int64_t j = 0; j < nr; j++) crow[j] += erow[j];
                } else {
                  for (int64_t j = 0; j < nr; j++) crow[j] = erow[j];
                }
              }
            }
          }
        }
      }
    }
  }
  free(apack);
  free(bpack);
}

/* One cell (ti, tj) of the thread grid: whole MR/NR slivers, so every thread
 * but the last gets only full tiles. */
static void gemm_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gemm_problem_t *g = ctx;
  const int64_t m_slivers = (g->m + MR - 1) / MR;
  const int64_t n_slivers = (g->n + NR - 1) / NR;
  for (int64_t t = begin; t < end; t++) {
    const int64_t ti = t / g->tn, tj = t % g->tn;
    const int64_t m0 = min_i64(g->m, m_slivers * ti / g->tm * MR);
    const int64_t m1 = min_i64(g->m, m_slivers * (ti + 1) / g->tm * MR);
    const int64_t n0 = min_i64(g->n, n_slivers * tj / g->tn * NR);
    const int64_t n1 = min_i64(g->n, n_slivers * (tj + 1) / g->tn * NR);
    gemm_block(g, m0, m1, n0, n1);
  }
}

/* ---- matrix-vector products (m == 1 or n == 1) ------------------------------------
 * A register tile would waste 15 of its 16 columns (or 5 of 6 rows) here, and
 * the product is bound by reading the matrix once, so stream it instead. */

typedef float kiln_gemv_v4 __attribute__((vector_size(16)));

typedef struct gemv_problem_t {
  bool axpy;          /* false: out[i] = dot(mat + i*ld, vec); true: out[j] = sum_l vec[l] * mat[l*ld + j] */
  int64_t len, k;     /* outputs, reduction length */
  const float *mat;
  int64_t ld;
  const float *vec;
  int64_t vec_stride;
  float *out;
  int64_t out_stride;
} gemv_problem_t;

static float dot_contiguous(const float *restrict x, const float *restrict y, int64_t k) {
  kiln_gemv_v4 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, t0, t1;
  int64_t l = 0;
  for (; l + 16 <= k; l += 16) {
    memcpy(&t0, x + l, 16), memcpy(&t1, y + l, 16), s0 += t0 * t1;
    memcpy(&t0, x + l + 4, 16), memcpy(&t1, y + l + 4, 16), s1 += t0 * t1;
    memcpy(&t0, x + l + 8, 16), memcpy(&t1, y + l + 8, 16), s2 += t0 * t1;
    memcpy(&t0, x + l + 12, 16), memcpy(&t1, y + l + 12, 16), s3 += t0 * t1;
  }
  s0 = (s0 + s1) + (s2 + s3);
  float sum = (s0[0] + s0[1]) + (s0[2] + s0[3]);
  for (; l < k; l++) sum += x[l] * y[l];
  return sum;
}

static void gemv_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gemv_problem_t *g = ctx;
  /* The vector is read once per output (dot) or per row (axpy): make it
   * contiguous first when it is a strided column. */
  const float *vec = g->vec;
  float *gathered = NULL;
  if (g->vec_stride != 1) {
    gathered = malloc(sizeof(float) * (size_t)g->k);
    if (gathered) {
      for (int64_t l = 0; l < g->k; l++) gathered[l] = g->vec[l * g->vec_stride];
      vec = gathered;
    }
  }
  const int64_t vs = gathered || g->vec_stride == 1 ? 1 : g->vec_stride;
  if (!g->axpy) {
    for (int64_t i = begin; i < end; i++) {
      const float *row = g->mat + i * g->ld;
      float sum = 0.0f;
      if (vs == 1) {
        sum = dot_contiguous(row, vec, g->k);
      } else {
        for (int64_t l = 0; l < g->k; l++) sum += row[l] * vec[l * vs];
      }
      g->out[i * g->out_stride] = sum;
    }
  } else {
    /* Outputs in chunks that stay in L1 while every row of the matrix
     * streams past them. */
    enum { CHUNK = 512 };
    float acc[CHUNK];
    for (int64_t j0 = begin; j0 < end; j0 += CHUNK) {
      const int64_t len = min_i64(CHUNK, end - j0);
      memset(acc, 0, sizeof(acc));
      for (int64_t l = 0; l < g->k; l++) {
        const float v = vec[l * vs];
        const float *restrict row = g->mat + l * g->ld + j0;
        for (int64_t j = 0; j < len; j++) acc[j] += v * row[j];
      }
      for (int64_t j = 0; j < len; j++) g->out[(j0 + j) * g->out_stride] = acc[j];
    }
  }
  free(gathered);
}

static void gemv(const kiln_cpu_par_t *par, const gemm_problem_t *p) {
  gemv_problem_t g;
  if (p->n == 1) {
    g = (gemv_problem_t){
        .axpy = p->trans_a, .len = p->m, .k = p->k, .mat = p->a, .ld = p->lda, .vec = p->b,
        .vec_stride = p->trans_b ? 1 : p->ldb, .out = p->c, .out_stride = p->ldc,
    };
  } else {
    g = (gemv_problem_t){
        .axpy = !p->trans_b, .len = p->n, .k = p->k, .mat = p->b, .ld = p->ldb, .vec = p->a,
        .vec_stride = p->trans_a ? p->lda : 1, .out = p->c, .out_stride = 1,
    };
  }
  const int threads = kiln_cpu_par_threads(par);
  if (threads > 1 && g.len * g.k >= 2 * KILN_GEMM_MIN_WORK_PER_THREAD) {
    int64_t grain = KILN_GEMM_MIN_WORK_PER_THREAD / g.k;
    if (grain < 1) grain = 1;
    kiln_cpu_parallel_for(par, g.len, grain, gemv_task, &g);
  } else {
    gemv_task(&g, 0, g.len, 0);
  }
}

/* Split `threads` into a tm x tn grid whose largest cell (counted in padded
 * tiles) is smallest; ties go to splitting M, whose slices share nothing. */
static void choose_grid(int64_t m, int64_t n, int threads, int *out_tm, int *out_tn) {
  const int64_t m_slivers = (m + MR - 1) / MR;
  const int64_t n_slivers = (n + NR - 1) / NR;
  int best_tm = 1, best_tn = threads;
  int64_t best_cost = INT64_MAX;
  for (int tm = threads; tm >= 1; tm--) {
    if (threads % tm != 0) continue;
    const int tn = threads / tm;
    if (tm > m_slivers || tn > n_slivers) continue;
    const int64_t cost = (m_slivers + tm - 1) / tm * MR * ((n_slivers + tn - 1) / tn * NR);
    if (cost < best_cost) {
      best_cost = cost;
      best_tm = tm;
      best_tn = tn;
    }
  }
  if (best_cost == INT64_MAX) { /* fewer slivers than threads both ways */
    best_tm = 1;
    best_tn = 1;
  }
  *out_tm = best_tm;
  *out_tn = best_tn;
}

void kiln_cpu_sgemm_isa(const kiln_cpu_par_t *par, kiln_cpu_gemm_isa_t isa, bool trans_a, bool trans_b,
                        int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, sizeof(float) * (size_t)n);
    return;
  }
  gemm_problem_t g = {
      .trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k,
      .a = a, .lda = lda, .b = b, .ldb = ldb, .c = c, .ldc = ldc,
      .ukernel = ukernel_for(isa), .tm = 1, .tn = 1,
  };
  if (m == 1 || n == 1) {
    gemv(par, &g);
    return;
  }

  int threads = kiln_cpu_par_threads(par);
  const int64_t work = m * n * k;
  if (threads > 1 && work / threads < KILN_GEMM_MIN_WORK_PER_THREAD) {
    threads = (int)(work / KILN_GEMM_MIN_WORK_PER_THREAD);
    if (threads < 1) threads = 1;
  }
  if (threads > 1) choose_grid(m, n, threads, &g.tm, &g.tn);
  const int cells = g.tm * g.tn;
  if (cells <= 1) {
    gemm_block(&g, 0, m, 0, n);
    return;
  }
  kiln_cpu_parallel_for(par, cells, 1, gemm_task, &g);
}

void kiln_cpu_sgemm(const kiln_cpu_par_t *par, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                    int64_t ldc) {
  kiln_cpu_sgemm_isa(par, KILN_CPU_GEMM_ISA_AUTO, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

/* ---- the MATMUL op ------------------------------------------------------------ */

typedef struct matmul_batch_t {
  const kiln_op_t *op;
  const float *a, *b;
  float *c;
} matmul_batch_t;

static void matmul_batch_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const matmul_batch_t *mb = ctx;
  const kiln_op_t *op = mb->op;
  for (int64_t i = begin; i < end; i++) {
    kiln_cpu_sgemm_isa(NULL, KILN_CPU_GEMM_ISA_AUTO, op->u.matmul.trans_a, op->u.matmul.trans_b,
                       op->u.matmul.m, op->u.matmul.n, op->u.matmul.k,
                       mb->a + i * op->u.matmul.stride_a, op->u.matmul.lda,
                       mb->b + i * op->u.matmul.stride_b, op->u.matmul.ldb,
                       mb->c + i * op->u.matmul.stride_c, op->u.matmul.ldc);
  }
}

void kiln_cpu_matmul_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const int64_t batch = op->u.matmul.batch;
  const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
  matmul_batch_t mb = {
      .op = op,
      .a = in[0],
      .b = in[1],
      .c = out,
  };
  if (batch <= 0 || m <= 0 || n <= 0) return;
  const int threads = kiln_cpu_par_threads(par);
  /* Many small products: one whole product per thread beats splitting each
   * one. Large products: each is split across the par in turn. */
  const int64_t work = m * n * k;
  if (threads > 1 && batch > 1 && work < (int64_t)threads * 4 * KILN_GEMM_MIN_WORK_PER_THREAD &&
      work * batch >= 2 * KILN_GEMM_MIN_WORK_PER_THREAD) {
    kiln_cpu_parallel_for(par, batch, 1, matmul_batch_task, &mb);
    return;
  }
  for (int64_t i = 0; i < batch; i++) {
    kiln_cpu_sgemm(par, op->u.matmul.trans_a, op->u.matmul.trans_b, m, n, k,
                   mb.a + i * op->u.matmul.stride_a, op->u.matmul.lda,
                   mb.b + i * op->u.matmul.stride_b, op->u.matmul.ldb,
                   mb.c + i * op->u.matmul.stride_c, op->u.matmul.ldc);
  }
}
