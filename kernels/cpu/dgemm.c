/* kernels/cpu/dgemm.c: kiln's CPU DGEMM: the SGEMM's packing, blocking and threading (gemm.c) for f64, with f64 micro-tiles. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_internal.h"

enum { MR = KILN_CPU_DGEMM_MR, NR_MAX = KILN_CPU_DGEMM_NR_MAX };

/* Cache blocking, gemm.c's in bytes: a KC x nr sliver of B (16 or 32 KiB of
 * doubles) stays in L1 while the micro-kernel sweeps an MC x KC block of A
 * (192 KiB) in L2; the KC x NC panel of B (4 MiB) lives in the last-level
 * cache. */
enum { KC = 256, MC = 96, NC = 2048 };

/* Below this many multiply-adds per thread, waking the par costs more than
 * it saves (gemm.c's figure). */
#define KILN_DGEMM_MIN_WORK_PER_THREAD ((int64_t)1 << 17)

#define KILN_DGEMM_ALIGN 64

typedef struct dgemm_problem_t {
  bool trans_a, trans_b;
  int64_t m, n, k;
  const double *a;
  int64_t lda;
  const double *b;
  int64_t ldb;
  double *c;
  int64_t ldc;
  kiln_cpu_dgemm_ukernel_fn ukernel;
  int nr;     /* the micro-kernel's columns: 8 or 16 */
  int tm, tn; /* thread grid: tm slices of M by tn slices of N */
} dgemm_problem_t;

/* Two-lane vectors through the compiler's generic vector extension (SSE2 on
 * x86-64, NEON on ARM). */
typedef double kiln_dv2 __attribute__((vector_size(16)));

static inline kiln_dv2 dv2_load(const double *p) {
  kiln_dv2 v;
  memcpy(&v, p, sizeof(v));
  return v;
}

static inline void dv2_store(double *p, kiln_dv2 v) { memcpy(p, &v, sizeof(v)); }

static inline int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* The micro-kernel for `isa` (the best one the CPU has at most as wide) and
 * its column count: the SGEMM's choice, f64 tiles. */
static kiln_cpu_dgemm_ukernel_fn dukernel_for(kiln_cpu_gemm_isa_t isa, int *out_nr) {
  const kiln_cpu_gemm_isa_t best = kiln_cpu_gemm_isa_best();
  if (isa == KILN_CPU_GEMM_ISA_AUTO || isa > best) isa = best;
  *out_nr = 8;
  switch (isa) {
#if defined(KILN_HAVE_AVX512_KERNEL)
  case KILN_CPU_GEMM_ISA_AVX512: *out_nr = 16; return kiln_cpu_dgemm_ukernel_avx512;
#endif
#if defined(KILN_HAVE_AVX2_KERNEL)
  case KILN_CPU_GEMM_ISA_AVX2: return kiln_cpu_dgemm_ukernel_avx2;
#endif
  default: return kiln_cpu_dgemm_ukernel_portable;
  }
}

/* Rows [i0, i0+mc) and columns [p0, p0+kc) of op(A) into MR-row slivers,
 * k-major, zero past mc (gemm.c's pack_a). */
static void pack_a(const dgemm_problem_t *g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, double *restrict out) {
  for (int64_t ir = 0; ir < mc; ir += MR) {
    const int64_t mr = min_i64(MR, mc - ir);
    double *restrict dst = out + ir * kc;
    if (!g->trans_a) {
      const double *src = g->a + (i0 + ir) * g->lda + p0;
      const int64_t lda = g->lda;
      for (int64_t l = 0; l < kc; l++)
        for (int i = 0; i < MR; i++) dst[l * MR + i] = i < mr ? src[i * lda + l] : 0.0;
    } else {
      const double *src = g->a + p0 * g->lda + i0 + ir;
      for (int64_t l = 0; l < kc; l++) {
        const double *s = src + l * g->lda;
        for (int i = 0; i < MR; i++) dst[l * MR + i] = i < mr ? s[i] : 0.0;
      }
    }
  }
}

/* Rows [p0, p0+kc) and columns [j0, j0+nc) of op(B) into NR-column slivers,
 * k-major, zero past nc; a copy for each constant NR. */
static inline __attribute__((always_inline)) void pack_b_nr(const dgemm_problem_t *g, int64_t j0, int64_t nc,
                                                            int64_t p0, int64_t kc, double *restrict out,
                                                            const int NR) {
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int64_t nr = min_i64(NR, nc - jr);
    double *restrict dst = out + jr * kc;
    if (!g->trans_b) {
      const double *src = g->b + p0 * g->ldb + j0 + jr;
      if (nr == NR) {
        /* In 16-byte pieces, which stay vector moves (a plain loop becomes
         * a memcpy call per row; gemm.c). */
        for (int64_t l = 0; l < kc; l++) {
          const double *s = src + l * g->ldb;
          double *d = dst + l * NR;
          for (int j = 0; j < NR; j += 2) dv2_store(d + j, dv2_load(s + j));
        }
      } else {
        for (int64_t l = 0; l < kc; l++) {
          const double *s = src + l * g->ldb;
          double *d = dst + l * NR;
          for (int64_t j = 0; j < NR; j++) d[j] = j < nr ? s[j] : 0.0;
        }
      }
    } else {
      /* op(B)(l, j) = b[j*ldb + l]: each row of b becomes a column. */
      const double *src = g->b + (j0 + jr) * g->ldb + p0;
      for (int64_t j = 0; j < NR; j++) {
        if (j < nr) {
          const double *s = src + j * g->ldb;
          for (int64_t l = 0; l < kc; l++) dst[l * NR + j] = s[l];
        } else {
          for (int64_t l = 0; l < kc; l++) dst[l * NR + j] = 0.0;
        }
      }
    }
  }
}

static void pack_b(const dgemm_problem_t *g, int64_t j0, int64_t nc, int64_t p0, int64_t kc, double *restrict out) {
  if (g->nr == 16)
    pack_b_nr(g, j0, nc, p0, kc, out, 16);
  else
    pack_b_nr(g, j0, nc, p0, kc, out, 8);
}

/* The unblocked product, for when no packing memory could be had. */
static void dgemm_block_direct(const dgemm_problem_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t i = m0; i < m1; i++) {
    double *crow = g->c + i * g->ldc;
    for (int64_t j = n0; j < n1; j++) crow[j] = 0.0;
    for (int64_t l = 0; l < g->k; l++) {
      const double av = g->trans_a ? g->a[l * g->lda + i] : g->a[i * g->lda + l];
      for (int64_t j = n0; j < n1; j++) crow[j] += av * (g->trans_b ? g->b[j * g->ldb + l] : g->b[l * g->ldb + j]);
    }
  }
}

/* C[m0:m1, n0:n1] on the calling thread. */
static void dgemm_block(const dgemm_problem_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m1 <= m0 || n1 <= n0) return;
  const int64_t kc_max = min_i64(KC, g->k);
  const int64_t fa = round_up(min_i64(MC, round_up(m1 - m0, MR)) * kc_max, KILN_DGEMM_ALIGN / (int64_t)sizeof(double));
  const int64_t fb = round_up(min_i64(NC, round_up(n1 - n0, NR_MAX)) * kc_max,
                              KILN_DGEMM_ALIGN / (int64_t)sizeof(double));
  double *scratch = aligned_alloc(KILN_DGEMM_ALIGN, (size_t)(fa + fb) * sizeof(double));
  if (!scratch) {
    dgemm_block_direct(g, m0, m1, n0, n1);
    return;
  }
  double *apack = scratch, *bpack = scratch + fa;
  _Alignas(KILN_DGEMM_ALIGN) double edge[MR * NR_MAX];
  const kiln_cpu_dgemm_ukernel_fn ukernel = g->ukernel;
  const int64_t NR = g->nr;

  for (int64_t jc = n0; jc < n1; jc += NC) {
    const int64_t nc = min_i64(NC, n1 - jc);
    for (int64_t pc = 0; pc < g->k; pc += KC) {
      const int64_t kc = min_i64(KC, g->k - pc);
      const bool accumulate = pc > 0;
      pack_b(g, jc, nc, pc, kc, bpack);
      for (int64_t ic = m0; ic < m1; ic += MC) {
        const int64_t mc = min_i64(MC, m1 - ic);
        pack_a(g, ic, mc, pc, kc, apack);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int64_t nr = min_i64(NR, nc - jr);
          const double *bp = bpack + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += MR) {
            const int64_t mr = min_i64(MR, mc - ir);
            const double *ap = apack + ir * kc;
            double *ct = g->c + (ic + ir) * g->ldc + jc + jr;
            if (mr == MR && nr == NR) {
              ukernel(kc, ap, bp, ct, g->ldc, accumulate);
            } else {
              ukernel(kc, ap, bp, edge, NR, false);
              for (int64_t i = 0; i < mr; i++) {
                double *crow = ct + i * g->ldc;
                const double *erow = edge + i * NR;
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
  free(scratch);
}

static void dgemm_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const dgemm_problem_t *g = ctx;
  const int64_t m_slivers = (g->m + MR - 1) / MR;
  const int64_t n_slivers = (g->n + g->nr - 1) / g->nr;
  for (int64_t t = begin; t < end; t++) {
    const int64_t ti = t / g->tn, tj = t % g->tn;
    const int64_t m0 = min_i64(g->m, m_slivers * ti / g->tm * MR);
    const int64_t m1 = min_i64(g->m, m_slivers * (ti + 1) / g->tm * MR);
    const int64_t n0 = min_i64(g->n, n_slivers * tj / g->tn * g->nr);
    const int64_t n1 = min_i64(g->n, n_slivers * (tj + 1) / g->tn * g->nr);
    dgemm_block(g, m0, m1, n0, n1);
  }
}

/* gemm.c's choose_grid: the tm x tn split whose largest cell is smallest. */
static void choose_grid(int64_t m, int64_t n, int NR, int threads, int *out_tm, int *out_tn) {
  const int64_t m_slivers = (m + MR - 1) / MR;
  const int64_t n_slivers = (n + NR - 1) / NR;
  int best_tm = 1, best_tn = 1;
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
  *out_tm = best_tm;
  *out_tn = best_tn;
}

void kiln_cpu_dgemm_isa(const kiln_cpu_par_t *par, kiln_cpu_gemm_isa_t isa, bool trans_a, bool trans_b, int64_t m,
                        int64_t n, int64_t k, const double *a, int64_t lda, const double *b, int64_t ldb, double *c,
                        int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, sizeof(double) * (size_t)n);
    return;
  }
  dgemm_problem_t g = {
      .trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k, .a = a, .lda = lda, .b = b, .ldb = ldb,
      .c = c, .ldc = ldc, .tm = 1, .tn = 1,
  };
  g.ukernel = dukernel_for(isa, &g.nr);
  int threads = kiln_cpu_par_threads(par);
  const int64_t work = m * n * k;
  if (threads > 1 && work / threads < KILN_DGEMM_MIN_WORK_PER_THREAD) {
    threads = (int)(work / KILN_DGEMM_MIN_WORK_PER_THREAD);
    if (threads < 1) threads = 1;
  }
  if (threads > 1) choose_grid(m, n, g.nr, threads, &g.tm, &g.tn);
  if (g.tm * g.tn <= 1) {
    dgemm_block(&g, 0, m, 0, n);
    return;
  }
  kiln_cpu_parallel_for(par, g.tm * g.tn, 1, dgemm_task, &g);
}

void kiln_cpu_dgemm(const kiln_cpu_par_t *par, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    const double *a, int64_t lda, const double *b, int64_t ldb, double *c, int64_t ldc) {
  kiln_cpu_dgemm_isa(par, KILN_CPU_GEMM_ISA_AUTO, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

/* ---- the f64 tile in plain C ---------------------------------------------------- */

/* A 6x4 quarter of the 6x8 tile is 12 two-lane accumulators, which fit
 * SSE's 16 registers. */
static inline void dquarter_tile(int64_t kc, const double *ap, const double *bp, int j0, double *c, int64_t ldc,
                                 bool accumulate) {
  kiln_dv2 acc[6][2];
  memset(acc, 0, sizeof(acc));
  for (int64_t l = 0; l < kc; l++) {
    const kiln_dv2 b0 = dv2_load(bp + l * 8 + j0);
    const kiln_dv2 b1 = dv2_load(bp + l * 8 + j0 + 2);
    const double *a = ap + l * 6;
    for (int i = 0; i < 6; i++) {
      const kiln_dv2 av = {a[i], a[i]};
      acc[i][0] += av * b0;
      acc[i][1] += av * b1;
    }
  }
  for (int i = 0; i < 6; i++) {
    double *row = c + i * ldc + j0;
    if (accumulate) {
      acc[i][0] += dv2_load(row);
      acc[i][1] += dv2_load(row + 2);
    }
    dv2_store(row, acc[i][0]);
    dv2_store(row + 2, acc[i][1]);
  }
}

void kiln_cpu_dgemm_ukernel_portable(int64_t kc, const double *ap, const double *bp, double *c, int64_t ldc,
                                     bool accumulate) {
  dquarter_tile(kc, ap, bp, 0, c, ldc, accumulate);
  dquarter_tile(kc, ap, bp, 4, c, ldc, accumulate);
}
