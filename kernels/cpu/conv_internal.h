/* kernels/cpu/conv_internal.h: what the convolution gradients share with their ISA-specific kernels (private to kernels/cpu). */
#ifndef KILN_CPU_CONV_INTERNAL_H
#define KILN_CPU_CONV_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cpu/cpu_kernels.h"

/* The sizes of one convolution, with the products every step uses. */
typedef struct kiln_cpu_conv_geom_t {
  int64_t n, c, h, w, k, r, s, p, q;
  int64_t st0, st1, pad0, pad1, dil0, dil1;
  int64_t rs, crs, pq, hw, chw, kpq;
} kiln_cpu_conv_geom_t;

/* The SIMD kernels (conv_bwd_simd.h, instantiated per ISA). Both need a unit
 * stride along the width (st1 == 1) and at most KILN_CPU_CONV_SIMD_MAX_S
 * kernel columns. */
#define KILN_CPU_CONV_SIMD_MAX_S 64

/* col2im as a gather: dx rows of channels [c0, c1) of one image (dx_image,
 * [C, H, W]) receive the entries of `panel` (rows (c - c0, r, s), `cols`
 * columns: the output positions of rows [p0, p1)) that came from them, each
 * row summed in registers over r then s and stored once; `first`: the rows
 * start from zero, else from what dx holds (earlier panels). Summed in the
 * order of the scalar col2im, so the bits do not depend on the ISA. */
typedef void (*kiln_cpu_col2im_fn)(const kiln_cpu_conv_geom_t *g, const float *panel, int64_t cols,
                                   float *dx_image, int64_t c0, int64_t c1, int64_t p0, int64_t p1, bool first);

/* The direct dW of one tile: rows [k0, k0 + kb), channel c, kernel row r,
 * kernel columns [s0, s0 + sb) (those past S are computed and dropped),
 * summed over images [n0, n1) and every output position, stored into dw
 * [K, C, R, S] (added when `add`). 1 <= sb <= 8, 1 <= kb <= dw_max_kb(sb). */
typedef void (*kiln_cpu_dw_tile_fn)(const kiln_cpu_conv_geom_t *g, const float *x, const float *dy, int64_t n0,
                                    int64_t n1, int64_t k0, int64_t kb, int64_t c, int64_t r, int64_t s0, int64_t sb,
                                    float *dw, bool add);

typedef struct kiln_cpu_conv_simd_t {
  const char *name;
  int lanes;
  kiln_cpu_col2im_fn col2im;
  kiln_cpu_dw_tile_fn dw_tile;
  /* The largest kb the ISA's registers hold for a tile sb columns wide
   * (1 <= sb <= 8). */
  int (*dw_max_kb)(int sb);
} kiln_cpu_conv_simd_t;

#if defined(KILN_HAVE_AVX512_KERNEL)
extern const kiln_cpu_conv_simd_t kiln_cpu_conv_simd_avx512;
#endif
#if defined(KILN_HAVE_AVX2_KERNEL)
extern const kiln_cpu_conv_simd_t kiln_cpu_conv_simd_avx2;
#endif

#endif /* KILN_CPU_CONV_INTERNAL_H */
