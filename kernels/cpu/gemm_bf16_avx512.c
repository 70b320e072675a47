/* kernels/cpu/gemm_bf16_avx512.c: the bf16 MATMUL on AMX (tdpbf16ps) or AVX-512 BF16 (vdpbf16ps), whichever the CPU has: pairs of k steps, f32 sums, C rounded once to bf16. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <cpuid.h>
#if defined(KILN_HAVE_AMX_KERNEL)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "kernels/cpu/cpu_native.h"
#include "kernels/cpu/gemm_internal.h"

/* The f32 tile's shape and blocking (gemm.c): 6 rows by 32 columns, 12 zmm
 * sums. Here a k step of the tile is a pair of k: vdpbf16ps multiplies two
 * bf16 of A by two of B in each 32-bit lane and adds both to the f32 sum, so
 * packed A holds, per pair and row, one 32-bit word of two bf16, and packed
 * B, per pair, 32 such words (two zmm). KC is even, so only a product's last
 * pair can be half empty; its missing half is 0.
 *
 * The sums follow the f32 kernel's order as far as the instruction allows:
 * vdpbf16ps adds the product in a lane's high half first, so k step l goes
 * in the high half and l + 1 in the low half; a bf16 product is exact in
 * f32, so each step rounds once as an fma does, and k blocks are added into
 * C as there. Intel documents the two adds of an instruction but not every
 * implementation's order, and the unit flushes subnormal inputs and sums to
 * zero (DAZ, FTZ): the results may differ from the f32 kernel's by a bf16
 * ulp, which is what the tests allow. */
enum { MR = KILN_CPU_GEMM_MR, NR = 32, KC = 256, MC = 144, NC = 4096 };
#define KILN_BGEMM_ALIGN 64
/* gemm.c's figure: below this many multiply-adds per thread a par is not worth waking. */
#define KILN_BGEMM_MIN_WORK_PER_THREAD ((int64_t)1 << 17)

typedef struct bgemm_t {
  bool ta, tb;
  int64_t m, n, k;
  const uint16_t *a;
  int64_t lda;
  const uint16_t *b;
  int64_t ldb;
  uint16_t *c;
  int64_t ldc;
  const uint16_t *bias; /* NULL, or one bf16 per row of C, added before the rounding */
  float *cf;            /* instead of c: C in f32 (ldc), the sums stored (or added: cf_add) unrounded */
  bool cf_add;
  int tm, tn;           /* thread grid */
} bgemm_t;

static inline int64_t min_i64(int64_t x, int64_t y) { return x < y ? x : y; }
static inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* Two k steps of one row or column as a pair word: l high, l + 1 low. */
static inline uint32_t pair(uint16_t first, uint16_t second) { return (uint32_t)first << 16 | second; }

/* The f32 sums of C[m0:m0+bm, n0:n0+bn] (cblk, ldcb) plus the row's bias,
 * rounded into C. */
static void store_c(const bgemm_t *g, float *cblk, int64_t ldcb, int64_t m0, int64_t bm, int64_t n0, int64_t bn) {
  for (int64_t i = 0; i < bm; i++) {
    float *row = cblk + i * ldcb;
    if (g->cf) {
      float *restrict dst = g->cf + (m0 + i) * g->ldc + n0;
      if (g->cf_add)
        for (int64_t j = 0; j < bn; j++) dst[j] += row[j];
      else
        memcpy(dst, row, sizeof(float) * (size_t)bn);
      continue;
    }
    if (g->bias) {
      const float bv = kiln_dc_bf16_to_f32(g->bias[m0 + i]);
      for (int64_t j = 0; j < bn; j++) row[j] += bv;
    }
    kiln_cpu_f32_to_bf16_n(row, g->c + (m0 + i) * g->ldc + n0, bn);
  }
}

/* Rows [i0, i0+mc), k steps [p0, p0+kc) of op(A): MR-row slivers, each kp
 * pairs of MR words; rows past mc are 0. */
static void pack_a(const bgemm_t *g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, int64_t kpp,
                   uint32_t *restrict out) {
  (void)kpp; /* the vdpbf16ps tile pads no pairs: kpp == kp */
  const int64_t kp = (kc + 1) / 2, full = kc / 2;
  for (int64_t ir = 0; ir < mc; ir += MR) {
    const int64_t mr = min_i64(MR, mc - ir);
    uint32_t *restrict dst = out + ir * kp;
    for (int64_t i = 0; i < MR; i++) {
      if (i >= mr) {
        for (int64_t p = 0; p < kp; p++) dst[p * MR + i] = 0;
        continue;
      }
      if (!g->ta) {
        /* A row's k steps are contiguous: a 32-bit load holds l low and l + 1
         * high, turned by a rotation. */
        const uint16_t *src = g->a + (i0 + ir + i) * g->lda + p0;
        for (int64_t p = 0; p < full; p++) {
          uint32_t w;
          memcpy(&w, src + 2 * p, sizeof w);
          dst[p * MR + i] = w << 16 | w >> 16;
        }
        if (kp > full) dst[full * MR + i] = pair(src[2 * full], 0);
      } else {
        const uint16_t *src = g->a + p0 * g->lda + i0 + ir + i;
        const int64_t lda = g->lda;
        for (int64_t p = 0; p < full; p++) dst[p * MR + i] = pair(src[2 * p * lda], src[(2 * p + 1) * lda]);
        if (kp > full) dst[full * MR + i] = pair(src[2 * full * lda], 0);
      }
    }
  }
}

/* Rows [p0, p0+kc) and columns [j0, j0+nc) of op(B): NR-column slivers, each
 * kpp pairs of NR words (kpp >= kp: the pairs past kp are 0, as are the
 * columns past nc). */
static void pack_b(const bgemm_t *g, int64_t j0, int64_t nc, int64_t p0, int64_t kc, uint32_t *restrict out,
                   int64_t kpp) {
  const int64_t kp = (kc + 1) / 2, full = kc / 2;
  /* Word j of a pair: the low half from row l + 1 (the first operand),
   * the high half from row l (the second, indices from 32). */
  _Alignas(64) uint16_t lo_idx[32], hi_idx[32];
  for (int w = 0; w < 32; w++) {
    lo_idx[w] = (uint16_t)((w & 1 ? 32 : 0) + w / 2);
    hi_idx[w] = (uint16_t)((w & 1 ? 32 : 0) + 16 + w / 2);
  }
  const __m512i idx0 = _mm512_load_si512(lo_idx), idx1 = _mm512_load_si512(hi_idx);
  for (int64_t jr = 0; jr < nc; jr += NR) {
    const int64_t nr = min_i64(NR, nc - jr);
    uint32_t *restrict dst = out + jr * kpp;
    memset(dst + kp * NR, 0, sizeof(uint32_t) * (size_t)((kpp - kp) * NR));
    if (!g->tb) {
      const __mmask32 mask = nr == NR ? (__mmask32)0xffffffffu : (__mmask32)((1u << nr) - 1u);
      const uint16_t *src = g->b + p0 * g->ldb + j0 + jr;
      for (int64_t p = 0; p < kp; p++) {
        const __m512i r0 = _mm512_maskz_loadu_epi16(mask, src + 2 * p * g->ldb);
        const __m512i r1 = 2 * p + 1 < kc ? _mm512_maskz_loadu_epi16(mask, src + (2 * p + 1) * g->ldb)
                                          : _mm512_setzero_si512();
        _mm512_store_si512(dst + p * NR, _mm512_permutex2var_epi16(r1, idx0, r0));
        _mm512_store_si512(dst + p * NR + 16, _mm512_permutex2var_epi16(r1, idx1, r0));
      }
    } else {
      /* op(B)(l, j) = b[j*ldb + l]: a column's k steps are contiguous. */
      for (int64_t j = 0; j < NR; j++) {
        if (j >= nr) {
          for (int64_t p = 0; p < kp; p++) dst[p * NR + j] = 0;
          continue;
        }
        const uint16_t *src = g->b + (j0 + jr + j) * g->ldb + p0;
        for (int64_t p = 0; p < full; p++) {
          uint32_t w;
          memcpy(&w, src + 2 * p, sizeof w);
          dst[p * NR + j] = w << 16 | w >> 16;
        }
        if (kp > full) dst[full * NR + j] = pair(src[2 * full], 0);
      }
    }
  }
}

/* One MR x NR tile over kp pairs: c (ldc) = Ap @ Bp, or c += when `accumulate`. */
static void ukernel(int64_t kp, const uint32_t *restrict ap, const uint32_t *restrict bp, float *restrict c,
                    int64_t ldc, bool accumulate) {
  __m512 s[MR][2];
  for (int i = 0; i < MR; i++) s[i][0] = s[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; p++) {
    const __m512bh b0 = (__m512bh)_mm512_load_si512(bp + p * NR);
    const __m512bh b1 = (__m512bh)_mm512_load_si512(bp + p * NR + 16);
    for (int i = 0; i < MR; i++) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[p * MR + i]);
      s[i][0] = _mm512_dpbf16_ps(s[i][0], a, b0);
      s[i][1] = _mm512_dpbf16_ps(s[i][1], a, b1);
    }
  }
  for (int i = 0; i < MR; i++) {
    float *row = c + i * ldc;
    if (accumulate) {
      s[i][0] = _mm512_add_ps(_mm512_loadu_ps(row), s[i][0]);
      s[i][1] = _mm512_add_ps(_mm512_loadu_ps(row + 16), s[i][1]);
    }
    _mm512_storeu_ps(row, s[i][0]);
    _mm512_storeu_ps(row + 16, s[i][1]);
  }
}

/* ---- AMX: 32 x 32 blocks of C in four tiles ----------------------------------------
 * Where the CPU has AMX-BF16 (and Linux lets the process use its tile
 * registers), a tile instruction multiplies 16 rows of A (16 pairs of k
 * each) by a 16-pair x 16-column tile of B into 16 x 16 f32 sums: 16 times
 * the work of one vdpbf16ps. B's packing is the vdpbf16ps kernel's (its 32
 * columns are two tiles 128 bytes a row apart) with the pairs padded to 16;
 * A is packed 32 rows at a time, each row its pairs in order (the same pair
 * words as above). Tiles 0-3 hold C, 4-5 A, 6-7 B. The order of the sums
 * inside a tile instruction is the hardware's; each C element is still
 * summed in f32 and rounded once. */
#if defined(KILN_HAVE_AMX_KERNEL)
enum { AMX_M = 32, AMX_KP = 16, AMX_MC = 128 };

/* Linux hands out the tile registers' state only when asked (the AMX
 * permission, arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), once per
 * process; 1 granted, -1 refused or no AMX, 0 not asked yet. */
static int amx_state;

static bool amx_ready(void) {
  int state = __atomic_load_n(&amx_state, __ATOMIC_ACQUIRE);
  if (state == 0) {
    /* CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE (read directly:
     * not every compiler's __builtin_cpu_supports knows AMX's names). */
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1u) && (d >> 24 & 1u);
    state = -1;
    if (amx && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0)
      state = 1;
    __atomic_store_n(&amx_state, state, __ATOMIC_RELEASE);
  }
  return state == 1;
}

typedef struct amx_config_t {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} amx_config_t;

/* Rows [i0, i0+mc) of op(A), k steps [p0, p0+kc): 32-row blocks, each row
 * kpp pair words (zero past kc and past mc). */
static void amx_pack_a(const bgemm_t *g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, int64_t kpp,
                       uint32_t *restrict out) {
  const int64_t full = kc / 2, kp = (kc + 1) / 2;
  const int64_t rows = round_up(mc, AMX_M);
  for (int64_t r = 0; r < rows; r++) {
    uint32_t *restrict dst = out + r * kpp;
    if (r >= mc) {
      memset(dst, 0, sizeof(uint32_t) * (size_t)kpp);
      continue;
    }
    if (!g->ta) {
      const uint16_t *src = g->a + (i0 + r) * g->lda + p0;
      for (int64_t p = 0; p < full; p++) {
        uint32_t w;
        memcpy(&w, src + 2 * p, sizeof w);
        dst[p] = w << 16 | w >> 16;
      }
      if (kp > full) dst[full] = pair(src[2 * full], 0);
    } else {
      const uint16_t *src = g->a + p0 * g->lda + i0 + r;
      const int64_t lda = g->lda;
      for (int64_t p = 0; p < full; p++) dst[p] = pair(src[2 * p * lda], src[(2 * p + 1) * lda]);
      if (kp > full) dst[full] = pair(src[2 * full * lda], 0);
    }
    for (int64_t p = kp; p < kpp; p++) dst[p] = 0;
  }
}

/* C (ldc floats) = or += the 32 x 32 block of packed A rows (kpp words
 * each) by a 32-column sliver of packed B (kpp pairs of 32 words). */
static void amx_tile(int64_t kpp, const uint32_t *ap, const uint32_t *bp, float *c, int64_t ldc, bool accumulate) {
  const size_t cs = sizeof(float) * (size_t)ldc, as = sizeof(uint32_t) * (size_t)kpp;
  if (accumulate) {
    _tile_loadd(0, c, cs);
    _tile_loadd(1, c + 16, cs);
    _tile_loadd(2, c + 16 * ldc, cs);
    _tile_loadd(3, c + 16 * ldc + 16, cs);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t p = 0; p < kpp; p += AMX_KP) {
    _tile_loadd(4, ap + p, as);
    _tile_loadd(5, ap + 16 * kpp + p, as);
    _tile_loadd(6, bp + p * NR, sizeof(uint32_t) * NR);
    _tile_loadd(7, bp + p * NR + 16, sizeof(uint32_t) * NR);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, cs);
  _tile_stored(1, c + 16, cs);
  _tile_stored(2, c + 16 * ldc, cs);
  _tile_stored(3, c + 16 * ldc + 16, cs);
}

#endif

/* ---- the blocked product, for either unit ------------------------------------------ */

/* What the blocking needs of a unit: its tile's rows of C, the rows of A
 * packed at a time, the pairs of k rounded up to a multiple of pair_pad,
 * A's packer and the tile (C (ldc) = or += packed A rows by a 32-column
 * sliver of packed B, kpp pairs). */
typedef struct bgemm_unit_t {
  int64_t rows, mc, pair_pad;
  void (*pack_a)(const bgemm_t *g, int64_t i0, int64_t mc, int64_t p0, int64_t kc, int64_t kpp, uint32_t *out);
  void (*tile)(int64_t kpp, const uint32_t *ap, const uint32_t *bp, float *c, int64_t ldc, bool accumulate);
} bgemm_unit_t;

static const bgemm_unit_t unit_vdp = {MR, MC, 1, pack_a, ukernel};

/* C[m0:m1, n0:n1] on the calling thread with `u`: the f32 sums in a block of
 * their own (kept per thread, kiln_cpu_scratch), rounded into C at the end.
 * False when no memory could be had. */
static bool run_block(const bgemm_unit_t *u, const bgemm_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (m1 <= m0 || n1 <= n0) return true;
  const int64_t bm = m1 - m0, bn = n1 - n0;
  const int64_t kpp_max = round_up((min_i64(KC, g->k) + 1) / 2, u->pair_pad);
  const int64_t words_a = round_up(min_i64(u->mc, round_up(bm, u->rows)) * kpp_max, 16);
  const int64_t words_b = round_up(min_i64(NC, round_up(bn, NR)) * kpp_max, 16);
  const int64_t ldcb = round_up(bn, 16);
  const size_t bytes = sizeof(uint32_t) * (size_t)(words_a + words_b) + sizeof(float) * (size_t)(bm * ldcb);
  void *own;
  void *mem = kiln_cpu_scratch(KILN_CPU_SCRATCH_BGEMM, bytes, &own);
  if (!mem) return false;
  uint32_t *apack = mem, *bpack = apack + words_a;
  float *cblk = (float *)(bpack + words_b);
  _Alignas(KILN_BGEMM_ALIGN) float edge[32 * NR]; /* the tallest tile's */

  for (int64_t jc = n0; jc < n1; jc += NC) {
    const int64_t nc = min_i64(NC, n1 - jc);
    for (int64_t pc = 0; pc < g->k; pc += KC) {
      const int64_t kc = min_i64(KC, g->k - pc), kpp = round_up((kc + 1) / 2, u->pair_pad);
      const bool accumulate = pc > 0;
      pack_b(g, jc, nc, pc, kc, bpack, kpp);
      for (int64_t ic = m0; ic < m1; ic += u->mc) {
        const int64_t mc = min_i64(u->mc, m1 - ic);
        u->pack_a(g, ic, mc, pc, kc, kpp, apack);
        for (int64_t jr = 0; jr < nc; jr += NR) {
          const int64_t nr = min_i64(NR, nc - jr);
          const uint32_t *bp = bpack + jr * kpp;
          for (int64_t ir = 0; ir < mc; ir += u->rows) {
            const int64_t mr = min_i64(u->rows, mc - ir);
            float *ct = cblk + (ic + ir - m0) * ldcb + (jc + jr - n0);
            if (mr == u->rows && nr == NR) {
              u->tile(kpp, apack + ir * kpp, bp, ct, ldcb, accumulate);
              continue;
            }
            u->tile(kpp, apack + ir * kpp, bp, edge, NR, false);
            for (int64_t i = 0; i < mr; i++)
              for (int64_t j = 0; j < nr; j++)
                ct[i * ldcb + j] = accumulate ? ct[i * ldcb + j] + edge[i * NR + j] : edge[i * NR + j];
          }
        }
      }
    }
  }
  store_c(g, cblk, ldcb, m0, bm, n0, bn);
  free(own);
  return true;
}

bool kiln_cpu_bf16_unit_pays_avx512(void) {
#if defined(KILN_HAVE_AMX_KERNEL)
  if (amx_ready()) return true;
#endif
  /* Without AMX, vdpbf16ps beats the f32 SGEMM only where it issues at the
   * FMA rate: AMD's (Zen 4 on: two bf16 products per lane at the rate of
   * one f32 fma). Intel's issues once per cycle against two FMAs, so there
   * the f32 kernels are the faster (208 against 321 GFLOPS at 2048^3 on a
   * Sapphire Rapids without its tiles). */
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
}

/* The block on the best unit the CPU has. AMX's tiles are configured on the
 * calling thread around it (every tile 16 rows of 64 bytes). */
static bool block(const bgemm_t *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
#if defined(KILN_HAVE_AMX_KERNEL)
  if (amx_ready()) {
    static const bgemm_unit_t unit_amx = {AMX_M, AMX_MC, AMX_KP, amx_pack_a, amx_tile};
    amx_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    const bool ok = run_block(&unit_amx, g, m0, m1, n0, n1);
    _tile_release();
    return ok;
  }
#endif
  return run_block(&unit_vdp, g, m0, m1, n0, n1);
}

typedef struct bgemm_batch_t {
  const kiln_op_t *op;
  const uint16_t *a, *b;
  uint16_t *c;
  bgemm_t g;       /* one product split over the par: its grid */
  int failed;      /* set (to 1) by a task that had no memory */
} bgemm_batch_t;

static bgemm_t product(const kiln_op_t *op, const uint16_t *a, const uint16_t *b, uint16_t *c, int64_t t) {
  return (bgemm_t){
      .ta = op->u.matmul.trans_a, .tb = op->u.matmul.trans_b,
      .m = op->u.matmul.m, .n = op->u.matmul.n, .k = op->u.matmul.k,
      .a = a + t * op->u.matmul.stride_a, .lda = op->u.matmul.lda,
      .b = b + t * op->u.matmul.stride_b, .ldb = op->u.matmul.ldb,
      .c = c + t * op->u.matmul.stride_c, .ldc = op->u.matmul.ldc, .tm = 1, .tn = 1,
  };
}

/* Whole products, one per task. */
static void batch_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  bgemm_batch_t *bb = ctx;
  for (int64_t t = begin; t < end; t++) {
    const bgemm_t g = product(bb->op, bb->a, bb->b, bb->c, t);
    if (!block(&g, 0, g.m, 0, g.n)) __atomic_store_n(&bb->failed, 1, __ATOMIC_RELAXED);
  }
}

/* One cell of one product's thread grid: whole slivers. */
static void grid_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  bgemm_batch_t *bb = ctx;
  const bgemm_t *g = &bb->g;
  const int64_t ms = (g->m + MR - 1) / MR, ns = (g->n + NR - 1) / NR;
  for (int64_t t = begin; t < end; t++) {
    const int64_t ti = t / g->tn, tj = t % g->tn;
    const int64_t m0 = min_i64(g->m, ms * ti / g->tm * MR), m1 = min_i64(g->m, ms * (ti + 1) / g->tm * MR);
    const int64_t n0 = min_i64(g->n, ns * tj / g->tn * NR), n1 = min_i64(g->n, ns * (tj + 1) / g->tn * NR);
    if (!block(g, m0, m1, n0, n1)) __atomic_store_n(&bb->failed, 1, __ATOMIC_RELAXED);
  }
}

bool kiln_cpu_bgemm_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                           int64_t lda, const uint16_t *b, int64_t ldb, uint16_t *c, int64_t ldc,
                           const uint16_t *row_bias) {
  if (m <= 0 || n <= 0) return true;
  const bgemm_t g = {.ta = trans_a, .tb = trans_b, .m = m, .n = n, .k = k, .a = a, .lda = lda, .b = b, .ldb = ldb,
                     .c = c, .ldc = ldc, .bias = row_bias, .tm = 1, .tn = 1};
  if (k <= 0) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] = row_bias ? row_bias[i] : 0;
    return true;
  }
  return block(&g, 0, m, 0, n);
}

bool kiln_cpu_bgemm_f32_avx512(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                               int64_t lda, const uint16_t *b, int64_t ldb, float *c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return true;
  if (k <= 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; i++) memset(c + i * ldc, 0, sizeof(float) * (size_t)n);
    return true;
  }
  const bgemm_t g = {.ta = trans_a, .tb = trans_b, .m = m, .n = n, .k = k, .a = a, .lda = lda, .b = b, .ldb = ldb,
                     .cf = c, .cf_add = accumulate, .ldc = ldc, .tm = 1, .tn = 1};
  return block(&g, 0, m, 0, n);
}

bool kiln_cpu_matmul_bf16_avx512(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  const int64_t batch = op->u.matmul.batch, m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k;
  if (batch <= 0 || m <= 0 || n <= 0) return true;
  bgemm_batch_t bb = {.op = op, .a = in[0], .b = in[1], .c = out};
  if (k <= 0) {
    for (int64_t t = 0; t < batch; t++)
      for (int64_t i = 0; i < m; i++)
        memset(bb.c + t * op->u.matmul.stride_c + i * op->u.matmul.ldc, 0, sizeof(uint16_t) * (size_t)n);
    return true;
  }
  const int threads = kiln_cpu_par_threads(par);
  const int64_t work = m * n * k;
  /* Many small products: one whole product per thread. */
  if (threads > 1 && batch > 1 && work < (int64_t)threads * 4 * KILN_BGEMM_MIN_WORK_PER_THREAD &&
      work * batch >= 2 * KILN_BGEMM_MIN_WORK_PER_THREAD) {
    kiln_cpu_parallel_for(par, batch, 1, batch_task, &bb);
    return !bb.failed;
  }
  int use = threads;
  if (use > 1 && work / use < KILN_BGEMM_MIN_WORK_PER_THREAD) use = (int)(work / KILN_BGEMM_MIN_WORK_PER_THREAD);
  for (int64_t t = 0; t < batch && !bb.failed; t++) {
    bb.g = product(op, bb.a, bb.b, bb.c, t);
    if (use > 1) kiln_cpu_gemm_choose_grid(m, n, NR, use, &bb.g.tm, &bb.g.tn);
    if (bb.g.tm * bb.g.tn > 1)
      kiln_cpu_parallel_for(par, bb.g.tm * bb.g.tn, 1, grid_task, &bb);
    else if (!block(&bb.g, 0, m, 0, n))
      bb.failed = 1;
  }
  return !bb.failed;
}
