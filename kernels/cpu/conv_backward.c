/* kernels/cpu/conv_backward.c: CONV2D_BACKWARD_INPUT and CONV2D_BACKWARD_WEIGHT on the CPU: kiln's SGEMM over panels, col2im as a gather. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/conv_internal.h"
#include "kernels/cpu/cpu_native.h"
#include "kernels/cpu/gemm_internal.h"

/* Both gradients are GEMMs against the im2col matrix of the forward
 * (kernels/cpu/conv.c), taken a panel of output positions at a time so that
 * the panel stays in the L2 cache between the step that writes it and the one
 * that reads it:
 *
 *   dx: cols (C*R*S x P*Q) = W^T (C*R*S x K) @ dY (K x P*Q), per image, then
 *       col2im: every row of dx gathers the R*S (or fewer) entries of cols
 *       that came from it, summed in registers and stored once (the SIMD
 *       kernels of conv_bwd_simd.h; a scalar loop adding panel rows into the
 *       planes where those are missing or the width stride is not 1). Each
 *       task owns whole planes of dx, so no two threads write one element
 *       and nothing needs atomics.
 *   dW: dW (K x C*R*S) = sum over images of dY (K x P*Q) @ cols^T, the GEMM
 *       accumulating into dW panel after panel, the reduction shared among
 *       threads with a partial sum each; with few output channels, direct
 *       SIMD kernels instead (below), which need no im2col at all.
 *
 * Panels are cut by the geometry alone, never by the thread count, so every
 * element of dx (and of a direct dW) is summed in the same order however the
 * work is shared out; a GEMM dW adds its shares' partial sums in share order,
 * the same bits for a given thread count. */

/* The target size of one panel for kiln's GEMM: the GEMM writes it and
 * col2im reads it back (dx), or im2col writes it and the GEMM packs it (dW),
 * while the GEMM's own packed blocks (up to 144 KiB of A) sit beside it in a
 * 1 MiB L2. */
#define KILN_CONV_BWD_PANEL_FLOATS ((int64_t)(384 << 10) / (int64_t)sizeof(float))

/* Below this many multiply-adds per thread the par is not woken. */
#define KILN_CONV_BWD_MIN_WORK_PER_THREAD ((int64_t)1 << 18)

/* dW's partial sums (one per share of the reduction but the first, which is
 * the output itself) may take at most this much memory. */
#define KILN_CONV_BWD_PARTIAL_BYTES ((int64_t)64 << 20)

static inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
/* ceil(a / b) for b > 0 and any a. */
static inline int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

/* Whole cache lines: the GEMM's packing memory follows the panel in one
 * allocation and must stay 64-byte aligned. */
static inline int64_t round_floats(int64_t floats) { return (floats + 15) / 16 * 16; }

static void *alloc_floats(int64_t floats) {
  if (floats <= 0) floats = 1;
  const size_t bytes = ((size_t)floats * sizeof(float) + 63) / 64 * 64;
  return aligned_alloc(64, bytes);
}

typedef kiln_cpu_conv_geom_t conv_geom_t;

static conv_geom_t geom_of(const kiln_op_t *op) {
  conv_geom_t g = {
      .n = op->u.conv2d.n, .c = op->u.conv2d.c, .h = op->u.conv2d.h, .w = op->u.conv2d.w,
      .k = op->u.conv2d.k, .r = op->u.conv2d.r, .s = op->u.conv2d.s, .p = op->u.conv2d.p, .q = op->u.conv2d.q,
      .st0 = op->u.conv2d.stride[0], .st1 = op->u.conv2d.stride[1],
      .pad0 = op->u.conv2d.pad[0], .pad1 = op->u.conv2d.pad[1],
      .dil0 = op->u.conv2d.dil[0], .dil1 = op->u.conv2d.dil[1],
  };
  g.rs = g.r * g.s;
  g.crs = g.c * g.rs;
  g.pq = g.p * g.q;
  g.hw = g.h * g.w;
  g.chw = g.c * g.hw;
  g.kpq = g.k * g.pq;
  return g;
}

/* The widest SIMD kernels this CPU runs (NULL: the scalar paths). */
static const kiln_cpu_conv_simd_t *simd_best(void) {
#if defined(KILN_HAVE_AVX512_KERNEL) || defined(KILN_HAVE_AVX2_KERNEL)
  /* libgcc also checks that the OS saves the vector state. */
  __builtin_cpu_init();
#endif
#if defined(KILN_HAVE_AVX512_KERNEL)
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) return &kiln_cpu_conv_simd_avx512;
#endif
#if defined(KILN_HAVE_AVX2_KERNEL)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &kiln_cpu_conv_simd_avx2;
#endif
  return NULL;
}

/* The SIMD kernels read along the width with unit stride. */
static bool simd_fits(const conv_geom_t *g) { return g->st1 == 1 && g->s <= KILN_CPU_CONV_SIMD_MAX_S; }

/* How many items of `units` each (images, say) to cut `count` of them into,
 * times a split of `parts` (channels), so that `threads` share them evenly:
 * the smallest split giving every thread work and an even share (a multiple
 * of the threads, or at least four items each). 0 when even all `parts`
 * leave a thread idle. */
static int64_t choose_split(int64_t count, int64_t parts, int threads) {
  for (int64_t b = 1; b <= parts; b++) {
    const int64_t items = count * b;
    if (items >= threads && (items % threads == 0 || items >= 4 * (int64_t)threads)) return b;
  }
  return count * parts >= threads ? parts : 0;
}

/* ---- dx ------------------------------------------------------------------------ */

typedef struct dx_plan_t {
  conv_geom_t g;
  const float *dy, *w;
  float *dx;
  int64_t blocks;     /* channel blocks per image: items are (image, block) */
  int64_t rows;       /* output rows per panel */
  int64_t panel_floats, gemm_floats;
  const kiln_cpu_par_t *gemm_par; /* the par for each GEMM when items run one at a time */
  const kiln_cpu_conv_gemm_t *gemm;
  kiln_cpu_col2im_fn col2im;      /* the SIMD gather, or NULL for the scalar col2im_add */
} dx_plan_t;

/* Add panel `cols` (rows (c, r, s) for channels [c0, c1), columns the output
 * positions of rows [p0, p1)) into the planes of dx_image they came from. */
static void col2im_add(const conv_geom_t *g, const float *panel, int64_t cols, float *dx_image, int64_t c0,
                       int64_t c1, int64_t p0, int64_t p1) {
  for (int64_t c = c0; c < c1; c++) {
    float *dxc = dx_image + c * g->hw;
    for (int64_t r = 0; r < g->r; r++) {
      for (int64_t p = p0; p < p1; p++) {
        const int64_t h = p * g->st0 - g->pad0 + r * g->dil0;
        if (h < 0 || h >= g->h) continue;
        float *restrict dxrow = dxc + h * g->w;
        const float *base = panel + ((c - c0) * g->rs + r * g->s) * cols + (p - p0) * g->q;
        for (int64_t s = 0; s < g->s; s++) {
          const float *restrict colrow = base + s * cols;
          /* Output column q lands on w = q*stride + w0. */
          const int64_t w0 = s * g->dil1 - g->pad1;
          const int64_t q_lo = w0 < 0 ? ceil_div(-w0, g->st1) : 0;
          const int64_t q_hi = min_i64(g->q, ceil_div(g->w - w0, g->st1));
          if (g->st1 == 1) {
            for (int64_t q = q_lo; q < q_hi; q++) dxrow[q + w0] += colrow[q];
          } else {
            for (int64_t q = q_lo; q < q_hi; q++) dxrow[q * g->st1 + w0] += colrow[q];
          }
        }
      }
    }
  }
}

/* dx of channels [c0, c1) of image ni straight from the definition, for when
 * no scratch memory could be had. */
static void dx_by_definition(const dx_plan_t *pl, int64_t ni, int64_t c0, int64_t c1) {
  const conv_geom_t *g = &pl->g;
  const float *dy = pl->dy + ni * g->kpq;
  float *dx = pl->dx + ni * g->chw;
  for (int64_t c = c0; c < c1; c++)
    for (int64_t h = 0; h < g->h; h++)
      for (int64_t x = 0; x < g->w; x++) {
        float acc = 0.0f;
        for (int64_t r = 0; r < g->r; r++) {
          const int64_t tp = h + g->pad0 - r * g->dil0;
          if (tp < 0 || tp % g->st0) continue;
          const int64_t p = tp / g->st0;
          if (p >= g->p) continue;
          for (int64_t s = 0; s < g->s; s++) {
            const int64_t tq = x + g->pad1 - s * g->dil1;
            if (tq < 0 || tq % g->st1) continue;
            const int64_t q = tq / g->st1;
            if (q >= g->q) continue;
            for (int64_t k = 0; k < g->k; k++)
              acc += dy[(k * g->p + p) * g->q + q] * pl->w[((k * g->c + c) * g->r + r) * g->s + s];
          }
        }
        dx[(c * g->h + h) * g->w + x] = acc;
      }
}

static void dx_item(const dx_plan_t *pl, int64_t item, float *panel, float *gemm_scratch) {
  const conv_geom_t *g = &pl->g;
  const int64_t ni = item / pl->blocks, b = item % pl->blocks;
  const int64_t c0 = g->c * b / pl->blocks, c1 = g->c * (b + 1) / pl->blocks;
  if (c1 <= c0) return;
  if (!panel) {
    dx_by_definition(pl, ni, c0, c1);
    return;
  }
  float *dx_image = pl->dx + ni * g->chw;
  /* One panel for the whole plane: the gather writes every row the panel
   * reaches, so only the rows no window reaches (strides past the kernel)
   * need zeros. Otherwise the planes start at zero and panels add. */
  const bool one_panel = pl->col2im && pl->rows >= g->p;
  if (one_panel) {
    /* The last row a window reaches (the first is row 0: paddings are >= 0). */
    const int64_t h_hi = max_i64(0, (g->p - 1) * g->st0 - g->pad0 + (g->r - 1) * g->dil0 + 1);
    if (h_hi < g->h)
      for (int64_t c = c0; c < c1; c++)
        memset(dx_image + c * g->hw + h_hi * g->w, 0, sizeof(float) * (size_t)((g->h - h_hi) * g->w));
  } else {
    memset(dx_image + c0 * g->hw, 0, sizeof(float) * (size_t)((c1 - c0) * g->hw));
  }
  for (int64_t p0 = 0; p0 < g->p; p0 += pl->rows) {
    const int64_t p1 = min_i64(g->p, p0 + pl->rows), cols = (p1 - p0) * g->q;
    /* The rows of W^T for these channels: W^T(i, l) = w[l*CRS + c0*RS + i]. */
    const kiln_cpu_gemm_t gemm = {
        .trans_a = true, .trans_b = false, .accumulate = false,
        .m = (c1 - c0) * g->rs, .n = cols, .k = g->k,
        .a = pl->w + c0 * g->rs, .lda = g->crs,
        .b = pl->dy + ni * g->kpq + p0 * g->q, .ldb = g->pq,
        .c = panel, .ldc = cols,
    };
    pl->gemm->fn(pl->gemm->ctx, pl->gemm_par, &gemm, gemm_scratch);
    if (pl->col2im)
      pl->col2im(g, panel, cols, dx_image, c0, c1, p0, p1, one_panel);
    else
      col2im_add(g, panel, cols, dx_image, c0, c1, p0, p1);
  }
}

static void dx_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const dx_plan_t *pl = ctx;
  /* One allocation per task for all its items; none at all leaves the slow
   * direct path, which needs nothing. */
  float *scratch = alloc_floats(pl->panel_floats + pl->gemm_floats);
  float *panel = scratch, *gemm_scratch = scratch ? scratch + pl->panel_floats : NULL;
  for (int64_t i = begin; i < end; i++) dx_item(pl, i, panel, pl->gemm_par ? NULL : gemm_scratch);
  free(scratch);
}

void kiln_cpu_conv2d_backward_input_run(const kiln_cpu_par_t *par, const kiln_op_t *op, float *dx, const float *dy,
                                        const float *w, const kiln_cpu_conv_gemm_t *gemm) {
  dx_plan_t pl = {.g = geom_of(op), .dy = dy, .w = w, .dx = dx, .blocks = 1, .gemm = gemm};
  const conv_geom_t *g = &pl.g;
  if (g->n <= 0 || g->chw <= 0) return;
  const kiln_cpu_conv_simd_t *simd = simd_best();
  if (simd && simd_fits(g)) pl.col2im = simd->col2im;
  /* Rows per panel from the whole of C*R*S (not from a channel block): the
   * same panels, so the same sums, on any number of threads. Near the target
   * size, the count whose columns fill the GEMM's widest register tiles
   * best (2 rows of 56 are 3.5 tiles of 32, 4 rows exactly 7). */
  const int64_t target = max_i64(1, min_i64(g->p, gemm->panel_floats / max_i64(1, g->crs * g->q)));
  pl.rows = target;
  double best = 2.0;
  for (int64_t rows = max_i64(1, target / 2); rows <= min_i64(g->p, 2 * target); rows++) {
    const int64_t cols = rows * g->q, padded = ceil_div(cols, KILN_CPU_GEMM_NR_MAX) * KILN_CPU_GEMM_NR_MAX;
    /* The share of padding, and a little for each GEMM call (fewer, wider ones). */
    const double cost = (double)(padded - cols) / (double)cols + 0.02 / (double)rows;
    if (cost < best - 1e-9) {
      best = cost;
      pl.rows = rows;
    }
  }
  const int threads = kiln_cpu_par_threads(par);
  const int64_t work = g->n * g->crs * g->pq * max_i64(1, g->k);
  int64_t items;
  if (threads <= 1 || work < 2 * KILN_CONV_BWD_MIN_WORK_PER_THREAD) {
    pl.blocks = 1;
    items = g->n;
    par = NULL;
  } else {
    pl.blocks = choose_split(g->n, g->c, threads);
    if (pl.blocks == 0) {
      /* Fewer (image, channel) pairs than threads: one item at a time, each
       * GEMM split over the par instead. */
      pl.blocks = g->c;
      pl.gemm_par = par;
    }
    items = g->n * pl.blocks;
  }
  const int64_t m_max = ceil_div(g->c, pl.blocks) * g->rs;
  const int64_t cols_max = pl.rows * g->q;
  pl.panel_floats = round_floats(m_max * cols_max);
  pl.gemm_floats = pl.gemm_par || !gemm->packs ? 0 : kiln_cpu_sgemm_scratch_floats(m_max, cols_max, g->k);
  if (pl.gemm_par || !par)
    dx_task(&pl, 0, items, 0);
  else
    kiln_cpu_parallel_for(par, items, 1, dx_task, &pl);
}

/* ---- dW ------------------------------------------------------------------------ */

typedef struct dw_plan_t {
  conv_geom_t g;
  const kiln_op_t *op;
  const float *x, *dy;
  float *dw;
  float *partials;     /* shares 1 .. groups-1 (share 0 is dw itself) */
  int64_t groups;      /* shares of the reduction over the N*P*Q output positions */
  int64_t blocks;      /* channel blocks: items are (share, block) */
  int64_t cols;        /* output positions per panel */
  int64_t panel_floats, gemm_floats;
  const kiln_cpu_par_t *gemm_par;
  const kiln_cpu_conv_gemm_t *gemm;
} dw_plan_t;

/* dW of channels [c0, c1) over positions [j0, j1) of the flattened N*P*Q
 * into dst (ldc C*R*S) straight from the definition, when no scratch memory
 * could be had. */
static void dw_by_definition(const dw_plan_t *pl, float *dst, int64_t c0, int64_t c1, int64_t j0, int64_t j1) {
  const conv_geom_t *g = &pl->g;
  for (int64_t k = 0; k < g->k; k++)
    for (int64_t c = c0; c < c1; c++)
      for (int64_t r = 0; r < g->r; r++)
        for (int64_t s = 0; s < g->s; s++) {
          float acc = 0.0f;
          for (int64_t j = j0; j < j1; j++) {
            const int64_t ni = j / g->pq, pq = j % g->pq, p = pq / g->q, q = pq % g->q;
            const int64_t h = p * g->st0 - g->pad0 + r * g->dil0, x = q * g->st1 - g->pad1 + s * g->dil1;
            if (h < 0 || h >= g->h || x < 0 || x >= g->w) continue;
            acc += pl->dy[ni * g->kpq + k * g->pq + pq] * pl->x[ni * g->chw + (c * g->h + h) * g->w + x];
          }
          dst[k * g->crs + (c * g->r + r) * g->s + s] = acc;
        }
}

static void dw_item(const dw_plan_t *pl, int64_t item, float *panel, float *gemm_scratch) {
  const conv_geom_t *g = &pl->g;
  const int64_t share = item / pl->blocks, b = item % pl->blocks;
  const int64_t c0 = g->c * b / pl->blocks, c1 = g->c * (b + 1) / pl->blocks;
  const int64_t total = g->n * g->pq;
  const int64_t j0 = total * share / pl->groups, j1 = total * (share + 1) / pl->groups;
  float *dst = share == 0 ? pl->dw : pl->partials + (share - 1) * g->k * g->crs;
  if (c1 <= c0) return;
  if (!panel) {
    dw_by_definition(pl, dst, c0, c1, j0, j1);
    return;
  }
  /* im2col of only these channels: the op seen with c1 - c0 channels. */
  kiln_op_t sub = *pl->op;
  sub.u.conv2d.c = c1 - c0;
  bool first = true;
  for (int64_t j = j0; j < j1;) {
    const int64_t ni = j / g->pq, pq0 = j % g->pq;
    const int64_t cols = min_i64(min_i64(pl->cols, g->pq - pq0), j1 - j);
    kiln_cpu_conv2d_im2col_ld(&sub, pl->x + ni * g->chw + c0 * g->hw, pq0, cols, panel, cols);
    const kiln_cpu_gemm_t gemm = {
        .trans_a = false, .trans_b = true, .accumulate = !first,
        .m = g->k, .n = (c1 - c0) * g->rs, .k = cols,
        .a = pl->dy + ni * g->kpq + pq0, .lda = g->pq,
        .b = panel, .ldb = cols,
        .c = dst + c0 * g->rs, .ldc = g->crs,
    };
    pl->gemm->fn(pl->gemm->ctx, pl->gemm_par, &gemm, gemm_scratch);
    first = false;
    j += cols;
  }
  if (first) /* an empty share: its sum is zero */
    for (int64_t k = 0; k < g->k; k++) memset(dst + k * g->crs + c0 * g->rs, 0, sizeof(float) * (size_t)((c1 - c0) * g->rs));
}

static void dw_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const dw_plan_t *pl = ctx;
  float *scratch = alloc_floats(pl->panel_floats + pl->gemm_floats);
  float *panel = scratch, *gemm_scratch = scratch ? scratch + pl->panel_floats : NULL;
  for (int64_t i = begin; i < end; i++) dw_item(pl, i, panel, pl->gemm_par ? NULL : gemm_scratch);
  free(scratch);
}

/* dw += the partial sums, share by share in order, split by element. */
static void dw_reduce_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const dw_plan_t *pl = ctx;
  const int64_t size = pl->g.k * pl->g.crs;
  float *restrict dw = pl->dw;
  for (int64_t share = 1; share < pl->groups; share++) {
    const float *restrict part = pl->partials + (share - 1) * size;
    for (int64_t i = begin; i < end; i++) dw[i] += part[i];
  }
}

/* ---- dW, direct --------------------------------------------------------------------
 * With few output channels the GEMM's operands are mostly im2col expansion:
 * each element of the im2col matrix, written once and packed once, takes part
 * in only K multiply-adds. The direct kernels (conv_bwd_simd.h) read x and dy
 * where they lie instead. Work items are tiles of dW (a block of output
 * channels, one input channel, one kernel row, a block of kernel columns),
 * each summed over every image by one thread: no partial sums, and the same
 * bits on any number of threads. Images go in blocks small enough that a
 * tile's rows of x and dy stay in the L1 cache while the tiles beside it use
 * them again (at N = 100 on LeNet's second layer: 5.1 us per image where
 * they fit, 6.6 where they come from L2). */

/* Direct dW up to this many output channels; above, the GEMM's reuse wins. */
#define KILN_CONV_BWD_DIRECT_MAX_K 32
#define KILN_CONV_BWD_DIRECT_BLOCK_BYTES ((int64_t)32 << 10)

typedef struct dw_direct_plan_t {
  conv_geom_t g;
  const float *x, *dy;
  float *dw;
  const kiln_cpu_conv_simd_t *simd;
  int64_t kb, kbn, sb, sbn; /* tile shape and counts */
  int64_t n0, n1;           /* the images */
  int64_t block;            /* images a tile takes at a time */
} dw_direct_plan_t;

static void dw_direct_task(void *ctx, int64_t begin, int64_t end, int thread) {
  const dw_direct_plan_t *pl = ctx;
  const conv_geom_t *g = &pl->g;
  /* The task's tiles take turns over each block of images, so that the rows
   * of x and dy a tile reads are still in L1 for the next tile; each tile
   * adds its blocks in order, whichever task runs it. Tiles in the order
   * (k block, c, r, s block): neighbours share rows of x (same c) and of dy
   * (same k block). */
  for (int64_t n0 = pl->n0; n0 < pl->n1; n0 += pl->block) {
    const int64_t n1 = min_i64(pl->n1, n0 + pl->block);
    for (int64_t i = begin; i < end; i++) {
      const int64_t sbi = i % pl->sbn, r = i / pl->sbn % g->r, c = i / (pl->sbn * g->r) % g->c;
      const int64_t kbi = i / (pl->sbn * g->r * g->c);
      const int64_t k0 = kbi * pl->kb, kb = min_i64(pl->kb, g->k - k0);
      pl->simd->dw_tile(g, pl->x, pl->dy, n0, n1, k0, kb, c, r, sbi * pl->sb, pl->sb, pl->dw, n0 > pl->n0);
    }
  }
}

/* The tile shape: kernel columns in even blocks of at most 8, then as many
 * output channels as the registers hold, in even blocks too. */
static void dw_tile_shape(const conv_geom_t *g, const kiln_cpu_conv_simd_t *simd, dw_direct_plan_t *pl) {
  pl->sbn = ceil_div(g->s, 8);
  pl->sb = ceil_div(g->s, pl->sbn);
  pl->kbn = ceil_div(g->k, simd->dw_max_kb((int)pl->sb));
  pl->kb = ceil_div(g->k, pl->kbn);
}

/* The direct dW of `g` into dw, the tiles shared over `par`. */
static void dw_direct(const kiln_cpu_par_t *par, const conv_geom_t *g, const kiln_cpu_conv_simd_t *simd, float *dw,
                      const float *x, const float *dy) {
  dw_direct_plan_t pl = {.g = *g, .x = x, .dy = dy, .dw = dw, .simd = simd, .n0 = 0, .n1 = g->n};
  dw_tile_shape(g, simd, &pl);
  /* Blocks of images whose rows of dy (kb channels) and x (one channel) fit
   * in the L1 cache beside each other. */
  const int64_t per_image = max_i64(1, (pl.kb * g->pq + g->hw) * (int64_t)sizeof(float));
  pl.block = max_i64(1, KILN_CONV_BWD_DIRECT_BLOCK_BYTES / per_image);
  const int64_t items = pl.kbn * g->c * g->r * pl.sbn;
  /* One item's multiply-adds, for the grain. */
  const int64_t item_work = max_i64(1, g->n * g->p * ceil_div(g->q, simd->lanes) * simd->lanes * pl.kb * pl.sb);
  kiln_cpu_parallel_for(par, items, max_i64(1, KILN_CONV_BWD_MIN_WORK_PER_THREAD / item_work), dw_direct_task, &pl);
}


/* Whether the direct dW kernel takes `g` (a vector ISA, unit column stride,
 * few output channels). */
static bool dw_direct_fits(const conv_geom_t *g, const kiln_cpu_conv_simd_t *simd) {
  return simd && simd_fits(g) && g->k <= KILN_CONV_BWD_DIRECT_MAX_K && g->n * g->pq > 0;
}

bool kiln_cpu_conv2d_backward_weight_direct(const kiln_op_t *op) {
  const conv_geom_t g = geom_of(op);
  return dw_direct_fits(&g, simd_best());
}

void kiln_cpu_conv2d_backward_weight_run(const kiln_cpu_par_t *par, const kiln_op_t *op, float *dw, const float *x,
                                         const float *dy, const kiln_cpu_conv_gemm_t *gemm) {
  dw_plan_t pl = {.g = geom_of(op), .op = op, .x = x, .dy = dy, .dw = dw, .groups = 1, .blocks = 1, .gemm = gemm};
  const conv_geom_t *g = &pl.g;
  const int64_t size = g->k * g->crs;
  if (size <= 0) return;
  const kiln_cpu_conv_simd_t *simd = gemm->packs ? simd_best() : NULL;
  if (dw_direct_fits(g, simd)) {
    dw_direct(par, g, simd, dw, x, dy);
    return;
  }
  const int64_t total = g->n * g->pq;
  /* Panels cut by the geometry alone: near the target size, in whole
   * 256-deep blocks of the GEMM where that fits, else in multiples of 64 (at
   * least 64, so that a huge C*R*S still gets a useful depth). */
  const int64_t fit = gemm->panel_floats / max_i64(1, g->crs);
  pl.cols = fit >= 256 ? fit / 256 * 256 : max_i64(64, fit / 64 * 64);
  pl.cols = min_i64(pl.cols, g->pq);
  const int threads = kiln_cpu_par_threads(par);
  const int64_t work = size * total;
  if (threads > 1 && work >= 2 * KILN_CONV_BWD_MIN_WORK_PER_THREAD) {
    /* Share the reduction first (no work is repeated), as far as the
     * partial sums' memory allows; then channel blocks for the rest. */
    int64_t groups = min_i64(threads, max_i64(1, total / 64));
    groups = min_i64(groups, 1 + KILN_CONV_BWD_PARTIAL_BYTES / ((int64_t)sizeof(float) * size));
    pl.groups = groups;
    pl.blocks = choose_split(groups, g->c, threads);
    if (pl.blocks == 0) {
      pl.blocks = g->c;
      if (groups * g->c < threads) pl.gemm_par = par;
    }
  } else {
    par = NULL;
  }
  if (pl.groups > 1) {
    pl.partials = alloc_floats((pl.groups - 1) * size);
    if (!pl.partials) pl.groups = 1; /* no memory for them: one share, perhaps split by channel */
  }
  const int64_t m_max = g->k, n_max = ceil_div(g->c, pl.blocks) * g->rs;
  pl.panel_floats = round_floats(n_max * pl.cols);
  pl.gemm_floats = pl.gemm_par || !gemm->packs ? 0 : kiln_cpu_sgemm_scratch_floats(m_max, n_max, pl.cols);
  const int64_t items = pl.groups * pl.blocks;
  if (!par || pl.gemm_par || items <= 1)
    dw_task(&pl, 0, items, 0);
  else
    kiln_cpu_parallel_for(par, items, 1, dw_task, &pl);
  if (pl.groups > 1) {
    kiln_cpu_parallel_for(par, size, KILN_CPU_GRAIN_ELEMENTWISE, dw_reduce_task, &pl);
    free(pl.partials);
  }
}

/* ---- the native rows: kiln's SGEMM ---------------------------------------------------- */

static void native_gemm(void *ctx, const kiln_cpu_par_t *par, const kiln_cpu_gemm_t *g, float *scratch) {
  kiln_cpu_sgemm_run(par, KILN_CPU_GEMM_ISA_AUTO, g, scratch);
}

static const kiln_cpu_conv_gemm_t native = {native_gemm, NULL, true, KILN_CONV_BWD_PANEL_FLOATS};

static void backward_input_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  kiln_cpu_conv2d_backward_input_run(par, op, out, in[0], in[1], &native);
}

static void backward_weight_f32(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  kiln_cpu_conv2d_backward_weight_run(par, op, out, in[0], in[1], &native);
}

/* ---- bf16 on the CPU's bf16 unit ------------------------------------------------
 * The same lowerings with 16-bit operands and f32 sums: the products run on
 * AMX or vdpbf16ps (kiln_cpu_bgemm_f32_avx512, C in f32), the panels and
 * images accumulate in f32, and each gradient element is rounded once at
 * the end, as the f32 path's result would be. dx: per image, W^T @ dY in
 * panels of output rows, added into an f32 image by col2im_add, rounded
 * into dx. dW: the images split into a fixed number of shares (not the
 * thread count, so the sums are the same on any number of threads), each
 * summing dY @ cols^T into an f32 partial; the partials added in share
 * order and rounded. */
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
/* f32 panel elements per product (a few MiB, as the forward's panels). */
#define KILN_BCONV_BWD_PANEL ((int64_t)1 << 20)
/* The shares of dW's sum over images. */
#define KILN_BCONV_BWD_SHARES 8

typedef struct bgrad_plan_t {
  conv_geom_t g;
  const kiln_op_t *op;
  const uint16_t *x, *dy, *w; /* x for dW, w for dx */
  uint16_t *dx;
  float *parts;               /* dW: a K x CRS partial per share */
  kiln_cpu_col2im_fn col2im;  /* dx: the SIMD gather, or NULL for col2im_add */
  int64_t rows, cols, shares;
  int failed;                 /* a task had no memory */
} bgrad_plan_t;

static void bdx_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  bgrad_plan_t *pl = ctx;
  const conv_geom_t *g = &pl->g;
  float *panel = alloc_floats(g->crs * pl->rows * g->q), *image = alloc_floats(g->chw);
  bool ok = panel && image;
  for (int64_t ni = begin; ni < end && ok; ni++) {
    memset(image, 0, sizeof(float) * (size_t)g->chw);
    for (int64_t p0 = 0; p0 < g->p && ok; p0 += pl->rows) {
      const int64_t p1 = min_i64(g->p, p0 + pl->rows), cols = (p1 - p0) * g->q;
      ok = kiln_cpu_bgemm_f32_avx512(true, false, g->crs, cols, g->k, pl->w, g->crs, pl->dy + ni * g->kpq + p0 * g->q,
                                     g->pq, panel, cols, false);
      if (!ok) break;
      if (pl->col2im)
        pl->col2im(g, panel, cols, image, 0, g->c, p0, p1, false);
      else
        col2im_add(g, panel, cols, image, 0, g->c, p0, p1);
    }
    if (ok) kiln_cpu_f32_to_bf16_n(image, pl->dx + ni * g->chw, g->chw);
  }
  if (!ok) __atomic_store_n(&pl->failed, 1, __ATOMIC_RELAXED);
  free(panel);
  free(image);
}

static void bdw_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  bgrad_plan_t *pl = ctx;
  const conv_geom_t *g = &pl->g;
  uint16_t *col = malloc(sizeof(uint16_t) * (size_t)(g->crs * pl->cols));
  bool ok = col != NULL;
  for (int64_t share = begin; share < end && ok; share++) {
    float *dst = pl->parts + share * g->k * g->crs;
    bool first = true;
    for (int64_t ni = g->n * share / pl->shares; ni < g->n * (share + 1) / pl->shares && ok; ni++)
      for (int64_t j = 0; j < g->pq && ok; j += pl->cols) {
        const int64_t cols = min_i64(pl->cols, g->pq - j);
        kiln_cpu_conv2d_im2col_u16(pl->op, pl->x + ni * g->chw, j, cols, col, cols);
        ok = kiln_cpu_bgemm_f32_avx512(false, true, g->k, g->crs, cols, pl->dy + ni * g->kpq + j, g->pq, col, cols,
                                       dst, g->crs, !first);
        first = false;
      }
    if (first) memset(dst, 0, sizeof(float) * (size_t)(g->k * g->crs));
  }
  if (!ok) __atomic_store_n(&pl->failed, 1, __ATOMIC_RELAXED);
  free(col);
}

/* False when memory ran short: the caller runs the f32 path instead. */
static bool backward_input_bf16(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  bgrad_plan_t pl = {.g = geom_of(op), .op = op, .dy = in[0], .w = in[1], .dx = out};
  const conv_geom_t *g = &pl.g;
  if (g->n <= 0 || g->chw <= 0) return true;
  pl.rows = max_i64(1, min_i64(g->p, KILN_BCONV_BWD_PANEL / max_i64(1, g->crs * g->q)));
  const kiln_cpu_conv_simd_t *simd = simd_best();
  if (simd && simd_fits(g)) pl.col2im = simd->col2im;
  kiln_cpu_parallel_for(par, g->n, 1, bdx_task, &pl);
  return !pl.failed;
}

static bool backward_weight_bf16(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out, const void *const *in) {
  bgrad_plan_t pl = {.g = geom_of(op), .op = op, .x = in[0], .dy = in[1]};
  const conv_geom_t *g = &pl.g;
  const int64_t kcrs = g->k * g->crs;
  if (kcrs <= 0) return true;
  pl.shares = max_i64(1, min_i64(g->n, KILN_BCONV_BWD_SHARES));
  pl.cols = max_i64(1, min_i64(g->pq, KILN_BCONV_BWD_PANEL / max_i64(1, g->crs)));
  pl.parts = alloc_floats(pl.shares * kcrs);
  if (!pl.parts) return false;
  kiln_cpu_parallel_for(par, pl.shares, 1, bdw_task, &pl);
  if (!pl.failed) {
    for (int64_t s = 1; s < pl.shares; s++)
      for (int64_t i = 0; i < kcrs; i++) pl.parts[i] += pl.parts[s * kcrs + i];
    kiln_cpu_f32_to_bf16_n(pl.parts, out, kcrs);
  }
  free(pl.parts);
  return !pl.failed;
}

/* Output channels below which dx's products (k = K) are too short for the
 * unit's tiles to pay (LeNet's second layer, K = 16: 20,500 against 23,900
 * training images/s through f32). */
#define KILN_BCONV_BWD_MIN_K 32

/* Whether the bf16 unit takes a gradient of `op`: conv.c's rule for the
 * forward, and for dx enough output channels, for dW none of the few that
 * the direct f32 kernels serve faster. */
static bool bf16_unit_takes(const kiln_op_t *op, bool dw) {
  if (op->out.dtype != KILN_BF16 || !kiln_cpu_bf16_gemm_available() ||
      op->u.conv2d.k * op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s < KILN_BCONV_MIN_WEIGHTS)
    return false;
  return dw ? !kiln_cpu_conv2d_backward_weight_direct(op) : op->u.conv2d.k >= KILN_BCONV_BWD_MIN_K;
}
#endif

/* f32; bf16 on the CPU's bf16 unit where it has one and the weights are not
 * tiny; f16 (and other bf16) through f32 (the core refuses f64 here). */
void kiln_cpu_conv2d_backward_input_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out,
                                           const void *const *in) {
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
  if (bf16_unit_takes(op, false) && backward_input_bf16(par, op, out, in)) return;
#endif
  if (op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16)
    kiln_cpu_run_via_f32(par, op, out, in, backward_input_f32);
  else
    backward_input_f32(par, op, out, in);
}

void kiln_cpu_conv2d_backward_weight_native(const kiln_cpu_par_t *par, const kiln_op_t *op, void *out,
                                            const void *const *in) {
#if defined(KILN_HAVE_AVX512BF16_KERNEL)
  if (bf16_unit_takes(op, true) && backward_weight_bf16(par, op, out, in)) return;
#endif
  if (op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16)
    kiln_cpu_run_via_f32(par, op, out, in, backward_weight_f32);
  else
    backward_weight_f32(par, op, out, in);
}
