/* kernels/cpu/gemm.c: kiln's CPU SGEMM: Goto/BLIS-style packing and blocking, ISA dispatch, the MATMUL op. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/gemm_internal.h"

enum { MR = KILN_CPU_GEMM_MR, NR_MAX = KILN_CPU_GEMM_NR_MAX };

/* Cache blocking. A KC x nr sliver of B (16 or 32 KiB) stays in L1 while the
 * micro-kernel sweeps an MC x KC block of A (144 KiB) held in L2; the KC x NC
 * panel of B (up to 4 MiB) lives in the last-level cache. */
enum { KC = 256, MC = 144, NC = 4096 };

/* Below this many multiply-adds per thread, waking the par costs more than
 * it saves. */
#define KILN_GEMM_MIN_WORK_PER_THREAD ((int64_t)1 << 17)

#define KILN_GEMM_ALIGN 64

/* Products with at most this many rows (and a short k) run unpacked where
 * the CPU has the AVX-512 kernel. */
#define KILN_GEMM_SMALL_M 192

typedef struct gemm_problem_t {
  bool trans_a, trans_b;
  bool accumulate; /* C += op(A) op(B) */
  int64_t m, n, k;
  const float *a;
  int64_t lda;
  const float *b;
  int64_t ldb;
  float *c;
  int64_t ldc;
  kiln_cpu_gemm_ukernel_fn ukernel;
  int nr;     /* the micro-kernel's columns: 16 or 32 */
  bool small; /* unpacked (kiln_cpu_gemm_small_avx512) */
  int tm, tn; /* thread grid: tm slices of M by tn slices of N */
} gemm_problem_t;

static inline int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }

typedef float kiln_gemm_v4 __attribute__((vector_size(16)));
typedef int kiln_gemm_i4 __attribute__((vector_size(16)));

/* Lanes of two vectors, picked by index (0-3 from a, 4-7 from b): the
 * compilers' generic vector shuffles, so SSE on x86-64 and NEON on ARM. */
#if defined(__clang__)
#define KILN_GEMM_SHUFFLE(a, b, i0, i1, i2, i3) __builtin_shufflevector((a), (b), i0, i1, i2, i3)
#else
#define KILN_GEMM_SHUFFLE(a, b, i0, i1, i2, i3) __builtin_shuffle((a), (b), (kiln_gemm_i4){i0, i1, i2, i3})
#endif

/* The columns of the 4x4 block whose rows are r0..r3. */
static inline void transpose4(kiln_gemm_v4 r0, kiln_gemm_v4 r1, kiln_gemm_v4 r2, kiln_gemm_v4 r3, kiln_gemm_v4 *c0,
                              kiln_gemm_v4 *c1, kiln_gemm_v4 *c2, kiln_gemm_v4 *c3) {
  const kiln_gemm_v4 t0 = KILN_GEMM_SHUFFLE(r0, r1, 0, 4, 1, 5), t1 = KILN_GEMM_SHUFFLE(r0, r1, 2, 6, 3, 7);
  const kiln_gemm_v4 t2 = KILN_GEMM_SHUFFLE(r2, r3, 0, 4, 1, 5), t3 = KILN_GEMM_SHUFFLE(r2, r3, 2, 6, 3, 7);
  *c0 = KILN_GEMM_SHUFFLE(t0, t2, 0, 1, 4, 5);
  *c1 = KILN_GEMM_SHUFFLE(t0, t2, 2, 3, 6, 7);
  *c2 = KILN_GEMM_SHUFFLE(t1, t3, 0, 1, 4, 5);
  *c3 = KILN_GEMM_SHUFFLE(t1, t3, 2, 3, 6, 7);
}
static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

kiln_cpu_gemm_isa_t kiln_cpu_gemm_isa_best(void) {
  /* libgcc also checks that the OS saves the ymm (zmm) state before it
   * reports avx2 (avx512f). */
#if defined(KILN_HAVE_AVX512_KERNEL) || defined(KILN_HAVE_AVX2_KERNEL)
  __builtin_cpu_init();
#endif
#if defined(KILN_HAVE_AVX512_KERNEL)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return KILN_CPU_GEMM_ISA_AVX512;
#endif
#if defined(KILN_HAVE_AVX2_KERNEL)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KILN_CPU_GEMM_ISA_AVX2;
#endif
  return KILN_CPU_GEMM_ISA_PORTABLE;
}

bool kiln_cpu_bf16_gemm_available(void) {
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16") && kiln_cpu_bf16_unit_pays_avx512();
#else
  return false;
#endif
}

const char *kiln_cpu_gemm_isa_name(kiln_cpu_gemm_isa_t isa) {
  switch (isa) {
    case KILN_CPU_GEMM_ISA_AUTO: return kiln_cpu_gemm_isa_name(kiln_cpu_gemm_isa_best());
    case KILN_CPU_GEMM_ISA_AVX512: return "avx512f+fma";
    case KILN_CPU_GEMM_ISA_AVX2: return "avx2+fma";
    case KILN_CPU_GEMM_ISA_PORTABLE: return "portable";
  }
  return "unknown";
}

/* The micro-kernel for `isa` (the best one the CPU has at most as wide) and
 * its column count. */
static kiln_cpu_gemm_ukernel_fn ukernel_for(kiln_cpu_gemm_isa_t isa, int *out_nr) {
  const kiln_cpu_gemm_isa_t best = kiln_cpu_gemm_isa_best();
  if (isa == KILN_CPU_GEMM_ISA_AUTO || isa > best) isa = best;
  *out_nr = 16;
  switch (isa) {
#if defined(KILN_HAVE_AVX512_KERNEL)
  case KILN_CPU_GEMM_ISA_AVX512: *out_nr = 32; return kiln_cpu_gemm_ukernel_avx512;
#endif
#if defined(KILN_HAVE_AVX2_KERNEL)
  case KILN_CPU_GEMM_ISA_AVX2: return kiln_cpu_gemm_ukernel_avx2;
#endif
  default: return kiln_cpu_gemm_ukernel_portable;
  }
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
      /* op(A)(i, l) = a[l*lda + i]: each k step is MR contiguous values.
       * Loops of constant length (or a select) keep the compiler from
       * calling memcpy and memset for every k step. */
      const float *src = g->a + p0 * g->lda + i0 + ir;
      if (mr == MR) {
        for (int64_t l = 0; l < kc; l++) {
          const float *s = src + l * g->lda;
          for (int i = 0; i < MR; i++) dst[l * MR + i] = s[i];
        }
      } else {
        for (int64_t l = 0; l < kc; l++) {
          const float *s = src + l * g->lda;
          for (int i = 0; i < MR; i++) dst[l * MR + i] = i < mr ? s[i] : 0.0f;
        }
      }
    }
  }
}

/* Rows [p0, p0+kc) and columns [j0, j0+nc) of op(B) into NR-column slivers,
 * each stored k-major (NR values per k step), zero-padded past nc. Written
 * for a constant NR (16 or 32), so each width gets its own unrolled copy. */
static inline __attribute__((always_inline)) void pack_b_nr(const gemm_problem_t *g, int64_t j0, int64_t nc,
                                                            int64_t p0, int64_t kc, float *restrict out,
                                                            const int NR) {
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int64_t nr = min_i64(NR, nc - jr);
    float *restrict dst = out + jr * kc;
    if (!g->trans_b) {
      const float *src = g->b + p0 * g->ldb + j0 + jr;
      if (nr == NR) {
        /* In 16-byte pieces: the compiler keeps these as vector moves,
         * where a plain copy loop becomes a call to memcpy per row, which
         * costs more than the copy of 64 or 128 bytes. */
        for (int64_t l = 0; l < kc; l++) {
          const float *s = src + l * g->ldb;
          float *d = dst + l * NR;
          for (int j = 0; j < NR; j += 4) {
            kiln_gemm_v4 t;
            memcpy(&t, s + j, sizeof t);
            memcpy(d + j, &t, sizeof t);
          }
        }
      } else {
        /* One select per element, likewise kept free of memcpy/memset calls. */
        for (int64_t l = 0; l < kc; l++) {
          const float *s = src + l * g->ldb;
          float *d = dst + l * NR;
          for (int64_t j = 0; j < NR; j++) d[j] = j < nr ? s[j] : 0.0f;
        }
      }
    } else {
      /* op(B)(l, j) = b[j*ldb + l]: rows of b become columns of the
       * sliver. Four rows by four k steps at a time, transposed in vector
       * registers; the rest one element at a time. */
      const float *src = g->b + (j0 + jr) * g->ldb + p0;
      const int64_t ldb = g->ldb;
      int64_t j = 0;
      for (; j + 4 <= nr; j += 4) {
        const float *s = src + j * ldb;
        int64_t l = 0;
        for (; l + 4 <= kc; l += 4) {
          kiln_gemm_v4 r0, r1, r2, r3;
          memcpy(&r0, s + l, sizeof r0);
          memcpy(&r1, s + ldb + l, sizeof r1);
          memcpy(&r2, s + 2 * ldb + l, sizeof r2);
          memcpy(&r3, s + 3 * ldb + l, sizeof r3);
          kiln_gemm_v4 c0, c1, c2, c3;
          transpose4(r0, r1, r2, r3, &c0, &c1, &c2, &c3);
          memcpy(dst + l * NR + j, &c0, sizeof c0);
          memcpy(dst + (l + 1) * NR + j, &c1, sizeof c1);
          memcpy(dst + (l + 2) * NR + j, &c2, sizeof c2);
          memcpy(dst + (l + 3) * NR + j, &c3, sizeof c3);
        }
        for (; l < kc; l++)
          for (int64_t i = 0; i < 4; i++) dst[l * NR + j + i] = s[i * ldb + l];
      }
      for (; j < nr; j++) {
        const float *s = src + j * ldb;
        for (int64_t l = 0; l < kc; l++) dst[l * NR + j] = s[l];
      }
      for (int64_t l = 0; l < kc; l++)
        for (int64_t jj = nr; jj < NR; jj++) dst[l * NR + jj] = 0.0f;
    }
  }
}

static void pack_b(const gemm_problem_t *g, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float *restrict out) {
  if (g->nr == 32)
    pack_b_nr(g, j0, nc, p0, kc, out, 32);
  else
    pack_b_nr(g, j0, nc, p0, kc, out, 16);
}

/* The unblocked product, for when no packing memory could be had: slow but
 * correct, and it needs nothing. */
static void gemm_block_direct(const gemm_problem_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  for (int64_t i = m0; i < m1; i++) {
    float *crow = g->c + i * g->ldc;
    if (!g->accumulate)
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

/* The packed panels of A (MC x KC at most) and B (KC x NC at most) for a
 * block of these sizes, each rounded to whole cache lines. */
static void panel_floats(int64_t m, int64_t n, int64_t k, int64_t *out_a, int64_t *out_b) {
  const int64_t kc_max = min_i64(KC, k);
  *out_a = round_up(min_i64(MC, round_up(m, MR)) * kc_max, KILN_GEMM_ALIGN / (int64_t)sizeof(float));
  *out_b = round_up(min_i64(NC, round_up(n, NR_MAX)) * kc_max, KILN_GEMM_ALIGN / (int64_t)sizeof(float));
}

int64_t kiln_cpu_sgemm_scratch_floats(int64_t m, int64_t n, int64_t k) {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  int64_t fa, fb;
  panel_floats(m, n, k, &fa, &fb);
  return fa + fb;
}

/* C[m0:m1, n0:n1] on the calling thread, packing into `scratch` (or memory
 * of its own when NULL). */
static void gemm_block(const gemm_problem_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1, float *scratch) {
  if (m1 <= m0 || n1 <= n0) return;
#if defined(KILN_HAVE_AVX512_KERNEL)
  if (g->small) {
    kiln_cpu_gemm_small_avx512(g->trans_a, m0, m1, n0, n1, g->k, g->a, g->lda, g->b, g->ldb, g->c, g->ldc,
                               g->accumulate);
    return;
  }
#endif
  int64_t fa, fb;
  panel_floats(m1 - m0, n1 - n0, g->k, &fa, &fb);
  float *own = NULL;
  if (!scratch) {
    own = aligned_alloc(KILN_GEMM_ALIGN, (size_t)(fa + fb) * sizeof(float));
    if (!own) {
      gemm_block_direct(g, m0, m1, n0, n1);
      return;
    }
    scratch = own;
  }
  float *apack = scratch, *bpack = scratch + fa;
  _Alignas(KILN_GEMM_ALIGN) float edge[MR * NR_MAX];
  const kiln_cpu_gemm_ukernel_fn ukernel = g->ukernel;
  const int64_t NR = g->nr;

  for (int64_t jc = n0; jc < n1; jc += NC) {
    const int64_t nc = min_i64(NC, n1 - jc);
    for (int64_t pc = 0; pc < g->k; pc += KC) {
      const int64_t kc = min_i64(KC, g->k - pc);
      /* The first k block overwrites C unless the caller asked to add. */
      const bool accumulate = g->accumulate || pc > 0;
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
  free(own);
}

/* One cell (ti, tj) of the thread grid: whole MR/NR slivers, so every thread
 * but the last gets only full tiles. */
static void gemm_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const gemm_problem_t *g = ctx;
  const int64_t m_slivers = (g->m + MR - 1) / MR;
  const int64_t n_slivers = (g->n + g->nr - 1) / g->nr;
  for (int64_t t = begin; t < end; t++) {
    const int64_t ti = t / g->tn, tj = t % g->tn;
    const int64_t m0 = min_i64(g->m, m_slivers * ti / g->tm * MR);
    const int64_t m1 = min_i64(g->m, m_slivers * (ti + 1) / g->tm * MR);
    const int64_t n0 = min_i64(g->n, n_slivers * tj / g->tn * g->nr);
    const int64_t n1 = min_i64(g->n, n_slivers * (tj + 1) / g->tn * g->nr);
    gemm_block(g, m0, m1, n0, n1, NULL);
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
  bool accumulate;    /* out += ... */
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
      if (g->accumulate)
        g->out[i * g->out_stride] += sum;
      else
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
      if (g->accumulate)
        for (int64_t j = 0; j < len; j++) g->out[(j0 + j) * g->out_stride] += acc[j];
      else
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
        .vec_stride = p->trans_b ? 1 : p->ldb, .out = p->c, .out_stride = p->ldc, .accumulate = p->accumulate,
    };
  } else {
    g = (gemv_problem_t){
        .axpy = !p->trans_b, .len = p->n, .k = p->k, .mat = p->b, .ld = p->ldb, .vec = p->a,
        .vec_stride = p->trans_a ? p->lda : 1, .out = p->c, .out_stride = 1, .accumulate = p->accumulate,
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

void kiln_cpu_gemm_choose_grid(int64_t m, int64_t n, int NR, int threads, int *out_tm, int *out_tn) {
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

void kiln_cpu_sgemm_run(const kiln_cpu_par_t *par, kiln_cpu_gemm_isa_t isa, const kiln_cpu_gemm_t *p,
                        float *scratch) {
  const int64_t m = p->m, n = p->n, k = p->k;
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!p->accumulate)
      for (int64_t i = 0; i < m; i++) memset(p->c + i * p->ldc, 0, sizeof(float) * (size_t)n);
    return;
  }
  gemm_problem_t g = {
      .trans_a = p->trans_a, .trans_b = p->trans_b, .accumulate = p->accumulate, .m = m, .n = n, .k = k,
      .a = p->a, .lda = p->lda, .b = p->b, .ldb = p->ldb, .c = p->c, .ldc = p->ldc, .tm = 1, .tn = 1,
  };
  g.ukernel = ukernel_for(isa, &g.nr);
  if (m == 1 || n == 1) {
    gemv(par, &g);
    return;
  }
  /* Few rows of C and a short k: each packed sliver of B would serve only
   * m/6 tiles, and packing costs about as much as the multiply-adds (a conv
   * gradient's 25 or 150 rows of W^T times K = 6 or 16); the unpacked kernel
   * reads B in place. Measured here (CPU us, unpacked vs packed): 150x100x16
   * per image of a conv gradient 0.41 vs 0.51 ms per op, 16x4096x64 56 vs 65;
   * but 64x1024x256 195 vs 160, where the long k favours packed A. Within one
   * KC-deep block, so that the sums are the packed path's. */
  g.small = g.nr == 32 && !p->trans_b && m <= KILN_GEMM_SMALL_M && (k <= 64 || (m <= 32 && k <= KC));

  int threads = kiln_cpu_par_threads(par);
  const int64_t work = m * n * k;
  if (threads > 1 && work / threads < KILN_GEMM_MIN_WORK_PER_THREAD) {
    threads = (int)(work / KILN_GEMM_MIN_WORK_PER_THREAD);
    if (threads < 1) threads = 1;
  }
  if (threads > 1) kiln_cpu_gemm_choose_grid(m, n, g.nr, threads, &g.tm, &g.tn);
  const int cells = g.tm * g.tn;
  if (cells <= 1) {
    gemm_block(&g, 0, m, 0, n, par ? NULL : scratch);
    return;
  }
  kiln_cpu_parallel_for(par, cells, 1, gemm_task, &g);
}

void kiln_cpu_sgemm_isa(const kiln_cpu_par_t *par, kiln_cpu_gemm_isa_t isa, bool trans_a, bool trans_b,
                        int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float *c, int64_t ldc) {
  const kiln_cpu_gemm_t g = {
      .trans_a = trans_a, .trans_b = trans_b, .accumulate = false, .m = m, .n = n, .k = k,
      .a = a, .lda = lda, .b = b, .ldb = ldb, .c = c, .ldc = ldc,
  };
  kiln_cpu_sgemm_run(par, isa, &g, NULL);
}

void kiln_cpu_sgemm(const kiln_cpu_par_t *par, bool trans_a, bool trans_b, int64_t m, int64_t n,
                    int64_t k, const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
                    int64_t ldc) {
  kiln_cpu_sgemm_isa(par, KILN_CPU_GEMM_ISA_AUTO, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc);
}

/* ---- the MATMUL op in f32 (kernels/cpu/matmul.c dispatches by dtype) ------------------------------------------------------------ */

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

void kiln_cpu_matmul_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
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
