/* tests/conformance/creation.c: conformance rows: zeros, ones, full, arange, uniform, normal. */
#include "harness.h"

static const kt_shape_t kt_creation_shapes[] = {
    {0, {0}, false, false}, {1, {0}, false, false}, {1, {1}, false, false},
    {2, {3, 7}, false, false}, {2, {13, 257}, false, true}, {-1, {0}, false, false},
};

static const kt_shape_t kt_random_shapes[] = {
    {0, {0}, false, false}, {1, {0}, false, false}, {1, {1}, false, false}, {2, {3, 7}, false, false},
    {1, {1237}, false, true}, {3, {4, 5, 67}, false, true}, {-1, {0}, false, false},
};

/* zeros, ones, full: each fill value of the row, in both dtypes, over the creation shapes. */
static void kt_build_fill(const kt_row_t *row) {
  for (int f = 0; f < row->values.n; f++) {
    for (int dt = 0; dt < 2; dt++) {
      for (const kt_shape_t *s = kt_creation_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        kt_case_t c = kt_case(row);
        c.dtype = dt ? KILN_I32 : KILN_F32;
        c.scalar = row->values.v[f];
        kt_case_shape(&c, s);
        char shape[128];
        kt_shape_text(s->ndim, s->s, shape, sizeof shape);
        snprintf(c.label, sizeof c.label, "%s(%g) %s %s", row->name, c.scalar, kiln_dtype_name(c.dtype), shape);
        kt_check(&c);
      }
    }
  }
}

KT_RUN(kt_run_zeros) { return kiln_tensor_zeros(dev, c->dtype, c->ndim, c->shape, out); }

KT_RUN(kt_run_ones) { return kiln_tensor_ones(dev, c->dtype, c->ndim, c->shape, out); }

KT_RUN(kt_run_full) { return kiln_tensor_full(dev, c->dtype, c->ndim, c->shape, c->scalar, out); }

static void kt_build_arange(const kt_row_t *row) {
  static const struct { kiln_dtype_t dtype; double start, stop, step; } ranges[] = {
      {KILN_F32, 0, 10, 1},     {KILN_F32, 5, -3, -0.5},  {KILN_F32, 0, 1, 0.1},   {KILN_F32, 3, 3, 1},
      {KILN_F32, 0, 1, 2},      {KILN_F32, -1000, 1000, 0.75}, {KILN_I32, -7, 20, 3}, {KILN_I32, 0, 0, 1},
      {KILN_I32, 10, -10, -1},  {KILN_I32, 0, 1, 1},
  };
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    kt_case_t c = kt_case(row);
    c.dtype = ranges[i].dtype;
    c.scalar = ranges[i].start;
    c.stop = ranges[i].stop;
    c.step = ranges[i].step;
    snprintf(c.label, sizeof c.label, "arange(%g, %g, %g) %s", c.scalar, c.stop, c.step, kiln_dtype_name(c.dtype));
    kt_check(&c);
  }
}

KT_RUN(kt_run_arange) { return kiln_tensor_arange(dev, c->dtype, c->scalar, c->stop, c->step, out); }

/* uniform, normal: each float dtype, each seed over the random shapes, with
 * the row's a and b. f16 and bf16 are the f32 sample rounded to nearest
 * even; f64 has its own stream of the same Philox words (kernels/philox.h). */
static void kt_build_random(const kt_row_t *row) {
  static const uint64_t seeds[] = {0, 42, (1ull << 40) + 7};
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
      for (const kt_shape_t *s = kt_random_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        /* The other dtypes: the shapes with elements, one seed besides 0. */
        if (d > 0 && (k == 2 || s->ndim == 0 || (s->ndim == 1 && s->s[0] == 0))) continue;
        kt_case_t c = kt_case(row);
        kt_case_shape(&c, s);
        c.dtype = dtypes[d];
        c.seed = seeds[k];
        char shape[128];
        kt_shape_text(s->ndim, s->s, shape, sizeof shape);
        snprintf(c.label, sizeof c.label, "%s(seed %llu, %g, %g) %s %s", row->name, (unsigned long long)c.seed,
                 (double)row->a, (double)row->b, kiln_dtype_name(c.dtype), shape);
        kt_check(&c);
      }
    }
  }
}

KT_RUN(kt_run_uniform) {
  return kiln_tensor_uniform_dtype(dev, c->dtype, c->ndim, c->shape, c->seed, c->row->a, c->row->b, out);
}

KT_RUN(kt_run_normal) {
  return kiln_tensor_normal_dtype(dev, c->dtype, c->ndim, c->shape, c->seed, c->row->a, c->row->b, out);
}

/* The same Philox stream on every device. Uniform and normal numbers are
 * bit-identical to the CPU's on every device and in every dtype
 * (kernels/philox.h keeps every compiler from fusing low + (high - low) * u
 * into one FMA, which changes the last bit of about a third of them, and
 * computes the normal's log, sqrt and cos itself from rounded adds and
 * multiplies, not with the dialect's math library). */

/* ---- the rows -------------------------------------------------------------------------- */

static const kt_row_t kt_rows[] = {
    {.name = "zeros", .op = "fill", .build = kt_build_fill, .run = kt_run_zeros,
     .tol = kt_tol_exact, .values = {1, {0}}},
    {.name = "ones", .op = "fill", .build = kt_build_fill, .run = kt_run_ones,
     .tol = kt_tol_exact, .values = {1, {1}}},
    {.name = "full", .op = "fill", .build = kt_build_fill, .run = kt_run_full,
     .tol = kt_tol_exact, .values = {2, {2.5, -7}}},
    /* start + i*step in f32 on a device without fp64: one rounding more. */
    {.name = "arange", .op = "arange", .build = kt_build_arange, .run = kt_run_arange,
     .tol = kt_tol_row_ulps, .ulps = 2},
    {.name = "uniform", .op = "random", .build = kt_build_random, .run = kt_run_uniform,
     .tol = kt_tol_bits, .a = -2.0f, .b = 3.0f},
    /* A spread that is no power of two: (high - low) * u rounds in nearly
     * half the elements, where a fused multiply-add would differ. */
    {.name = "uniform (odd range)", .op = "random", .build = kt_build_random,
     .run = kt_run_uniform, .tol = kt_tol_bits, .a = -0.3f, .b = 1.9f},
    {.name = "normal", .op = "random", .build = kt_build_random, .run = kt_run_normal,
     .tol = kt_tol_bits, .a = 1.0f, .b = 0.5f},
};

const kt_group_t kt_group_creation = {
    .name = "creation",
    .rows = kt_rows,
    .n_rows = sizeof kt_rows / sizeof kt_rows[0],
};
