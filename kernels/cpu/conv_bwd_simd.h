/* kernels/cpu/conv_bwd_simd.h: the SIMD kernels of the convolution gradients, written once over vectors of VL floats and instantiated per ISA. */
/*
 * Included by conv_bwd_avx512.c and conv_bwd_avx2.c after they define:
 *
 *   VL                   floats per vector
 *   vf, vmask            the vector and lane-mask types
 *   V_ZERO()             all lanes 0
 *   V_LOADM(p, m)        lanes of m from p, the others 0; masked-off lanes
 *                        are never read (the address may lie outside the row)
 *   V_STOREM(p, m, v)    lanes of m to p
 *   V_ADD(a, b), V_FMA(a, b, c)   a + b, a * b + c
 *   V_HSUM(v)            the sum of the lanes, as a float
 *   V_MASK(lo, hi)       lanes [lo, hi) with 0 <= lo <= hi <= VL
 *   V_NAME(x)            x with the ISA's suffix
 *   V_DW_MAX_TILE        accumulators a dW tile may use (registers less the
 *                        operands)
 */
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/conv_internal.h"

static inline int64_t V_NAME(max)(int64_t a, int64_t b) { return a > b ? a : b; }

/* p + off floats, for an address only masked lanes will touch: integer
 * arithmetic, so that an address before the row is not undefined. */
static inline const float *V_NAME(at)(const float *p, int64_t off) {
  return (const float *)((uintptr_t)p + (uintptr_t)off * sizeof(float));
}

/* Lanes l of a vector starting at row offset `off` with lo <= off + l < hi. */
static inline vmask V_NAME(range)(int64_t off, int64_t lo, int64_t hi) {
  int64_t a = lo - off, b = hi - off;
  if (a < 0) a = 0;
  if (b > VL) b = VL;
  if (b < a) b = a;
  if (a > VL) a = b = VL;
  return V_MASK((int)a, (int)b);
}

/* ---- col2im as a gather ------------------------------------------------------ */

/* The rows of `nc` (1 to 4) channels at once: their windows reach the same
 * panel rows, and four independent sums hide the latency of the adds, each
 * still summed in the scalar order. */
static inline __attribute__((always_inline)) void V_NAME(col2im_rows)(
    const kiln_cpu_conv_geom_t *g, const float *pc, int64_t pstride, int64_t cols, float *dxc, int64_t hw,
    const int nc, int64_t w0, vmask mw, const vmask *ms, int64_t h_lo, int64_t h_hi, int64_t p0, int64_t p1,
    bool first) {
  const int64_t R = g->r, S = g->s, Q = g->q, W = g->w, st0 = g->st0, pad0 = g->pad0, dil0 = g->dil0;
  const int64_t dil1 = g->dil1, shift = w0 + g->pad1;
  for (int64_t h = h_lo; h < h_hi; h++) {
    float *row = dxc + h * W + w0;
    vf a0 = first ? V_ZERO() : V_LOADM(row, mw);
    vf a1 = nc > 1 ? (first ? V_ZERO() : V_LOADM(row + hw, mw)) : V_ZERO();
    vf a2 = nc > 2 ? (first ? V_ZERO() : V_LOADM(row + 2 * hw, mw)) : V_ZERO();
    vf a3 = nc > 3 ? (first ? V_ZERO() : V_LOADM(row + 3 * hw, mw)) : V_ZERO();
    for (int64_t r = 0; r < R; r++) {
      int64_t p = h + pad0 - r * dil0;
      if (st0 != 1) { /* a division only where the stride needs one */
        if (p < 0 || p % st0) continue;
        p /= st0;
      }
      if (p < p0 || p >= p1) continue;
      const float *base = pc + r * S * cols + (p - p0) * Q + shift;
      for (int64_t s = 0; s < S; s++) {
        const float *at = V_NAME(at)(base, s * cols - s * dil1);
        const vmask m = ms[s];
        a0 = V_ADD(a0, V_LOADM(at, m));
        if (nc > 1) a1 = V_ADD(a1, V_LOADM(V_NAME(at)(at, pstride), m));
        if (nc > 2) a2 = V_ADD(a2, V_LOADM(V_NAME(at)(at, 2 * pstride), m));
        if (nc > 3) a3 = V_ADD(a3, V_LOADM(V_NAME(at)(at, 3 * pstride), m));
      }
    }
    V_STOREM(row, mw, a0);
    if (nc > 1) V_STOREM(row + hw, mw, a1);
    if (nc > 2) V_STOREM(row + 2 * hw, mw, a2);
    if (nc > 3) V_STOREM(row + 3 * hw, mw, a3);
  }
}

static void V_NAME(col2im)(const kiln_cpu_conv_geom_t *g, const float *panel, int64_t cols, float *dx_image,
                           int64_t c0, int64_t c1, int64_t p0, int64_t p1, bool first) {
  const int64_t wv_count = (g->w + VL - 1) / VL;
  /* Output rows the panel reaches. */
  int64_t h_lo = p0 * g->st0 - g->pad0, h_hi = (p1 - 1) * g->st0 - g->pad0 + (g->r - 1) * g->dil0 + 1;
  if (h_lo < 0) h_lo = 0;
  if (h_hi > g->h) h_hi = g->h;
  const int64_t pstride = g->rs * cols; /* one channel's rows of the panel */
  vmask ms[KILN_CPU_CONV_SIMD_MAX_S];
  for (int64_t wv = 0; wv < wv_count; wv++) {
    const int64_t w0 = wv * VL;
    /* Lane l is dx column w0 + l and reads panel column q = w0 + l + pad1 -
     * s*dil1, valid while 0 <= q < Q and the column exists. */
    const vmask mw = V_NAME(range)(w0, 0, g->w);
    for (int64_t s = 0; s < g->s; s++) {
      const int64_t off = w0 + g->pad1 - s * g->dil1;
      ms[s] = V_NAME(range)(off, 0, g->q < g->w - w0 + off ? g->q : g->w - w0 + off);
    }
    int64_t c = c0;
    for (; c + 4 <= c1; c += 4)
      V_NAME(col2im_rows)(g, panel + (c - c0) * pstride, pstride, cols, dx_image + c * g->hw, g->hw, 4, w0, mw, ms,
                          h_lo, h_hi, p0, p1, first);
    const float *pc = panel + (c - c0) * pstride;
    float *dxc = dx_image + c * g->hw;
    switch (c1 - c) {
    case 3: V_NAME(col2im_rows)(g, pc, pstride, cols, dxc, g->hw, 3, w0, mw, ms, h_lo, h_hi, p0, p1, first); break;
    case 2: V_NAME(col2im_rows)(g, pc, pstride, cols, dxc, g->hw, 2, w0, mw, ms, h_lo, h_hi, p0, p1, first); break;
    case 1: V_NAME(col2im_rows)(g, pc, pstride, cols, dxc, g->hw, 1, w0, mw, ms, h_lo, h_hi, p0, p1, first); break;
    default: break;
    }
  }
}

/* ---- direct dW ----------------------------------------------------------------
 * dW[k][c][r][s] = sum over n, p, q of dy[n][k][p][q] * x[n][c][h][q + s*dil1
 * - pad1], h = p*st0 - pad0 + r*dil0: no im2col. The vectors run along q;
 * a tile of KB rows by SB kernel columns keeps KB*SB accumulators, and each
 * step loads KB rows of dy and SB shifted rows of x for KB*SB FMAs. The lanes
 * are summed once, at the end.
 *
 * The tiles are spelled out by repetition macros, one named variable per
 * accumulator, so that they live in registers whatever the compiler thinks
 * of arrays of vectors. */
#define V_REPK_1(M, a) M(0, a)
#define V_REPK_2(M, a) V_REPK_1(M, a) M(1, a)
#define V_REPK_3(M, a) V_REPK_2(M, a) M(2, a)
#define V_REPK_4(M, a) V_REPK_3(M, a) M(3, a)
#define V_REPK_5(M, a) V_REPK_4(M, a) M(4, a)
#define V_REPK_6(M, a) V_REPK_5(M, a) M(5, a)
#define V_REPK_7(M, a) V_REPK_6(M, a) M(6, a)
#define V_REPK_8(M, a) V_REPK_7(M, a) M(7, a)
#define V_REPK(N, M, a) V_REPK_##N(M, a)
#define V_REPS_1(M, a) M(0, a)
#define V_REPS_2(M, a) V_REPS_1(M, a) M(1, a)
#define V_REPS_3(M, a) V_REPS_2(M, a) M(2, a)
#define V_REPS_4(M, a) V_REPS_3(M, a) M(3, a)
#define V_REPS_5(M, a) V_REPS_4(M, a) M(4, a)
#define V_REPS_6(M, a) V_REPS_5(M, a) M(5, a)
#define V_REPS_7(M, a) V_REPS_6(M, a) M(6, a)
#define V_REPS_8(M, a) V_REPS_7(M, a) M(7, a)
#define V_REPS(N, M, a) V_REPS_##N(M, a)

#define V_DW_ACC_DECL(S_, K_) vf acc_##K_##_##S_ = V_ZERO();
#define V_DW_ACC_ROW(K_, SB) V_REPS(SB, V_DW_ACC_DECL, K_)
/* Kernel column s0 + S_: lane l reads x column q0 + l + (s0 + S_)*dil1 - pad1,
 * within [0, W) and for a q < Q; past S it reads nothing. */
#define V_DW_MASK(S_, unused)                                                                                   \
  const int64_t xoff_##S_ = q0 + (s0 + (S_)) * g->dil1 - g->pad1;                                               \
  const vmask mx_##S_ = s0 + (S_) < g->s ? V_NAME(range)(xoff_##S_, 0, g->w < g->q - q0 + xoff_##S_             \
                                                                          ? g->w : g->q - q0 + xoff_##S_)      \
                                         : V_MASK(0, 0);
#define V_DW_LOAD_D(K_, unused) const vf d_##K_ = V_LOADM(dyp + (K_) * g->pq, mq);
#define V_DW_FMA(K_, S_) acc_##K_##_##S_ = V_FMA(d_##K_, xv_##S_, acc_##K_##_##S_);
#define V_DW_STEP(S_, KB)                                                                                       \
  {                                                                                                            \
    const vf xv_##S_ = V_LOADM(V_NAME(at)(xr, xoff_##S_), mx_##S_);                                            \
    V_REPK(KB, V_DW_FMA, S_)                                                                                   \
  }
#define V_DW_STORE(S_, K_)                                                                                      \
  if (s0 + (S_) < g->s) {                                                                                      \
    float *o = dw + (k0 + (K_)) * g->crs + (c * g->r + r) * g->s + s0 + (S_);                                  \
    const float v = V_HSUM(acc_##K_##_##S_);                                                                   \
    *o = add ? *o + v : v;                                                                                     \
  }
#define V_DW_STORE_ROW(K_, SB) V_REPS(SB, V_DW_STORE, K_)

#define V_DW_TILE_DEF(SB, KB)                                                                                    \
  static void V_NAME(dw_##SB##x##KB)(const kiln_cpu_conv_geom_t *g, const float *x, const float *dy, int64_t n0, \
                                     int64_t n1, int64_t k0, int64_t c, int64_t r, int64_t s0, float *dw,       \
                                     bool add) {                                                                \
    V_REPK(KB, V_DW_ACC_ROW, SB)                                                                               \
    const int64_t qv_count = (g->q + VL - 1) / VL;                                                             \
    /* Images in chunks whose rows of x and dy (about 64 KiB) stay in the                                      \
     * cache while the columns of vectors take turns over them. */                                            \
    const int64_t chunk = V_NAME(max)(1, 16384 / (g->h * g->w + KB * g->pq + 1));                             \
    for (int64_t nc = n0; nc < n1; nc += chunk)                                                                \
    for (int64_t qv = 0; qv < qv_count; qv++) {                                                                \
      const int64_t q0 = qv * VL;                                                                              \
      const vmask mq = V_NAME(range)(q0, 0, g->q);                                                             \
      V_REPS(SB, V_DW_MASK, 0)                                                                                 \
      for (int64_t n = nc; n < n1 && n < nc + chunk; n++) {                                                   \
        const float *xc = x + (n * g->c + c) * g->hw;                                                          \
        const float *dyn = dy + n * g->kpq + k0 * g->pq + q0;                                                  \
        for (int64_t p = 0; p < g->p; p++) {                                                                   \
          const int64_t h = p * g->st0 - g->pad0 + r * g->dil0;                                                \
          if (h < 0 || h >= g->h) continue;                                                                    \
          const float *xr = xc + h * g->w;                                                                     \
          const float *dyp = dyn + p * g->q;                                                                   \
          V_REPK(KB, V_DW_LOAD_D, 0)                                                                           \
          V_REPS(SB, V_DW_STEP, KB)                                                                            \
        }                                                                                                      \
      }                                                                                                        \
    }                                                                                                          \
    V_REPK(KB, V_DW_STORE_ROW, SB)                                                                             \
  }

/* The tiles: for each sb, every kb the AVX-512 budget of 24 accumulators
 * allows (a narrower ISA dispatches only to the smaller ones). */
#define V_DW_KB3(SB) V_DW_TILE_DEF(SB, 1) V_DW_TILE_DEF(SB, 2) V_DW_TILE_DEF(SB, 3)
#define V_DW_KB4(SB) V_DW_KB3(SB) V_DW_TILE_DEF(SB, 4)
#define V_DW_KB6(SB) V_DW_KB4(SB) V_DW_TILE_DEF(SB, 5) V_DW_TILE_DEF(SB, 6)
#define V_DW_KB8(SB) V_DW_KB6(SB) V_DW_TILE_DEF(SB, 7) V_DW_TILE_DEF(SB, 8)
V_DW_KB8(1)
V_DW_KB8(2)
V_DW_KB8(3)
V_DW_KB6(4)
V_DW_KB4(5)
V_DW_KB4(6)
V_DW_KB3(7)
V_DW_KB3(8)

typedef void (*V_NAME(dw_fn))(const kiln_cpu_conv_geom_t *, const float *, const float *, int64_t, int64_t, int64_t,
                              int64_t, int64_t, int64_t, float *, bool);
#define V_DW_P3(SB) V_NAME(dw_##SB##x1), V_NAME(dw_##SB##x2), V_NAME(dw_##SB##x3)
#define V_DW_P4(SB) V_DW_P3(SB), V_NAME(dw_##SB##x4)
#define V_DW_P6(SB) V_DW_P4(SB), V_NAME(dw_##SB##x5), V_NAME(dw_##SB##x6)
#define V_DW_P8(SB) V_DW_P6(SB), V_NAME(dw_##SB##x7), V_NAME(dw_##SB##x8)
static const V_NAME(dw_fn) V_NAME(dw_tiles)[8][8] = {
    {V_DW_P8(1)}, {V_DW_P8(2)}, {V_DW_P8(3)}, {V_DW_P6(4)}, {V_DW_P4(5)}, {V_DW_P4(6)}, {V_DW_P3(7)}, {V_DW_P3(8)},
};
static const int V_NAME(dw_defined_kb)[8] = {8, 8, 8, 6, 4, 4, 3, 3};

static int V_NAME(dw_max_kb)(int sb) {
  if (sb < 1) sb = 1;
  if (sb > 8) sb = 8;
  int kb = V_DW_MAX_TILE / sb;
  if (kb > V_NAME(dw_defined_kb)[sb - 1]) kb = V_NAME(dw_defined_kb)[sb - 1];
  return kb < 1 ? 1 : kb;
}

static void V_NAME(dw_tile)(const kiln_cpu_conv_geom_t *g, const float *x, const float *dy, int64_t n0, int64_t n1,
                            int64_t k0, int64_t kb, int64_t c, int64_t r, int64_t s0, int64_t sb, float *dw, bool add) {
  V_NAME(dw_tiles)[sb - 1][kb - 1](g, x, dy, n0, n1, k0, c, r, s0, dw, add);
}
