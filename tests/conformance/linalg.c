/* tests/conformance/linalg.c: conformance rows: matmul and the reductions (sum, mean, max, argmax, norm). */
#include "harness.h"

/* ---- linear algebra ----------------------------------------------------------------------- */

typedef struct kt_mm_t {
  int na;
  int64_t a[3];
  int nb;
  int64_t b[3];
  bool ta, tb, va, vb, large;
} kt_mm_t;

static const kt_mm_t kt_matmul_cases[] = {
    {2, {1, 1}, 2, {1, 1}, false, false, false, false, false},
    {2, {0, 3}, 2, {3, 2}, false, false, false, false, false},   /* M = 0 */
    {2, {2, 0}, 2, {0, 3}, false, false, false, false, false},   /* K = 0: zeros */
    {2, {3, 5}, 2, {5, 0}, false, false, false, false, false},   /* N = 0 */
    {2, {3, 5}, 2, {5, 2}, false, false, false, false, false},
    {2, {5, 3}, 2, {5, 2}, true, false, false, false, false},
    {2, {3, 5}, 2, {2, 5}, false, true, false, false, false},
    {2, {5, 3}, 2, {2, 5}, true, true, false, false, false},
    {2, {3, 5}, 2, {5, 2}, false, false, true, true, false},     /* column-major views */
    {3, {2, 3, 4}, 3, {2, 4, 2}, false, false, false, false, false},
    {3, {2, 3, 4}, 2, {4, 5}, false, false, false, false, false}, /* 2-D b over a batch */
    {2, {3, 4}, 3, {2, 4, 5}, false, false, false, false, false}, /* 2-D a over a batch */
    {3, {1, 3, 4}, 3, {3, 4, 2}, false, false, false, false, false}, /* batch 1 broadcasts */
    {3, {2, 4, 3}, 3, {2, 2, 4}, true, true, true, false, false},  /* a permuted: a copy */
    {3, {0, 3, 4}, 3, {0, 4, 2}, false, false, false, false, false}, /* empty batch */
    {2, {7, 13}, 2, {13, 257}, false, false, false, false, true},
    {2, {129, 67}, 2, {67, 131}, false, false, false, false, true},
    {2, {67, 129}, 2, {131, 67}, true, true, false, false, true},
    {2, {129, 67}, 2, {67, 131}, false, false, true, true, true},
    {3, {3, 65, 33}, 3, {3, 33, 17}, false, false, false, false, true},
    {3, {3, 33, 65}, 2, {17, 33}, true, true, false, false, true},
    {2, {257, 1}, 2, {1, 129}, false, false, false, false, true},  /* outer product */
};

/* The case list; then inner dimensions that differ, for the status. */
static void kt_build_matmul(const kt_row_t *row) {
  for (size_t i = 0; i < sizeof kt_matmul_cases / sizeof kt_matmul_cases[0]; i++) {
    const kt_mm_t *m = &kt_matmul_cases[i];
    if (kt_small && m->large) continue;
    kt_case_t c = kt_case(row);
    c.n_in = 2;
    c.in[0] = kt_in(KILN_F32, KT_SIGNED, 41, m->na, m->a, m->va);
    c.in[1] = kt_in(KILN_F32, KT_SIGNED, 42, m->nb, m->b, m->vb);
    c.trans_a = m->ta;
    c.trans_b = m->tb;
    char a[160], b[160];
    kt_in_text(&c.in[0], a, sizeof a);
    kt_in_text(&c.in[1], b, sizeof b);
    snprintf(c.label, sizeof c.label, "matmul %s%s @ %s%s", a, m->ta ? "^T" : "", b, m->tb ? "^T" : "");
    kt_check(&c);
  }
  /* The other float dtypes over the small cases (f16 and bf16 summed in f32
   * and rounded once; f64 in f64); a device that does not serve one must
   * refuse it with KILN_UNSUPPORTED. */
  static const kiln_dtype_t more[] = {KILN_F64, KILN_F16, KILN_BF16};
  for (size_t d = 0; d < sizeof more / sizeof more[0]; d++)
    for (size_t i = 0; i < sizeof kt_matmul_cases / sizeof kt_matmul_cases[0]; i++) {
      const kt_mm_t *m = &kt_matmul_cases[i];
      if (m->large) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      c.in[0] = kt_in(more[d], KT_SIGNED, 43, m->na, m->a, m->va);
      c.in[1] = kt_in(more[d], KT_SIGNED, 44, m->nb, m->b, m->vb);
      c.trans_a = m->ta;
      c.trans_b = m->tb;
      char a[160], b[160];
      kt_in_text(&c.in[0], a, sizeof a);
      kt_in_text(&c.in[1], b, sizeof b);
      snprintf(c.label, sizeof c.label, "matmul %s%s @ %s%s", a, m->ta ? "^T" : "", b, m->tb ? "^T" : "");
      kt_check(&c);
    }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_SIGNED, 1, 2, (const int64_t[]){3, 4}, false);
  c.in[1] = kt_in(KILN_F32, KT_SIGNED, 2, 2, (const int64_t[]){5, 2}, false);
  snprintf(c.label, sizeof c.label, "matmul [3x4] @ [5x2] (inner dims differ)");
  kt_check(&c);
}

KT_RUN(kt_run_matmul) { return kiln_tensor_matmul(in[0], in[1], c->trans_a, c->trans_b, out); }

/* Sums of K products. */
static kt_tol_t kt_tol_matmul(const kt_case_t *c) {
  const kt_in_t *a = &c->in[0];
  return kt_sum_tol(c->trans_a ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1], 1.0);
}


static const kt_shape_t kt_reduce_shapes[] = {
    {0, {0}, false, false},          {1, {0}, false, false},        {1, {1}, false, false},
    {1, {7}, false, false},          {2, {3, 0}, false, false},     {3, {3, 0, 5}, false, false},
    {2, {4, 5}, true, false},        {3, {2, 3, 4}, true, false},   {1, {1237}, false, true},
    {2, {13, 257}, false, true},     {2, {13, 257}, true, true},    {4, {2, 3, 5, 7}, true, true},
    {2, {1031, 3}, false, true},     {1, {70001}, false, true},     {2, {3, 40009}, false, true},
    {2, {40009, 3}, true, true},     {-1, {0}, false, false},
};

/* ---- reductions --------------------------------------------------------------------------- */

/* sum, mean, max, argmax: both dtypes over the reduce shapes, along every
 * axis, the last counted from the end, all axes and one out of range (the
 * same status everywhere); keepdim along axis 0 and all axes. The sum of
 * i32 is i64, compared exactly where the device serves i64. */
static void kt_build_reduce(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_reduce_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      int axes[KILN_MAX_DIMS + 3], n_axes = 0;
      for (int a = 0; a < s->ndim; a++) axes[n_axes++] = a;
      if (s->ndim > 0) axes[n_axes++] = -1;
      axes[n_axes++] = KILN_ALL_AXES;
      axes[n_axes++] = s->ndim + 1;
      for (int ai = 0; ai < n_axes; ai++) {
        int axis = axes[ai];
        for (int keep = 0; keep < 2; keep++) {
          if (keep && axis != KILN_ALL_AXES && axis != 0) continue;
          kt_case_t c = kt_case(row);
          c.n_in = 1;
          c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT : row->gen, 51, s->ndim, s->s, s->view);
          c.axis = axis;
          c.keepdim = keep;
          char in[160], ax_text[32];
          kt_in_text(&c.in[0], in, sizeof in);
          if (axis == KILN_ALL_AXES) snprintf(ax_text, sizeof ax_text, "all axes");
          else snprintf(ax_text, sizeof ax_text, "axis %d", axis);
          snprintf(c.label, sizeof c.label, "%s %s over %s%s", row->name, in, ax_text, keep ? ", keepdim" : "");
          kt_check(&c);
        }
      }
    }
  }
  /* The other dtypes: the small shapes, over all axes, the first and the
   * last. f16 and bf16 accumulate in f32, f64 in f64, integers and bool in
   * i64 (the sum of an integer or bool is i64); mean of an integer fails
   * the same way everywhere. */
  static const kiln_dtype_t more[] = {KILN_F64, KILN_F16, KILN_BF16, KILN_I64, KILN_I8, KILN_U8, KILN_I16, KILN_BOOL};
  for (size_t d = 0; d < sizeof more / sizeof more[0]; d++) {
    const bool is_float = more[d] == KILN_F64 || more[d] == KILN_F16 || more[d] == KILN_BF16;
    for (const kt_shape_t *s = kt_reduce_shapes; s->ndim >= 0; s++) {
      if (s->large || kt_skip(s)) continue;
      const int axes[3] = {KILN_ALL_AXES, 0, -1};
      for (int ai = 0; ai < (s->ndim > 0 ? 3 : 1); ai++) {
        kt_case_t c = kt_case(row);
        c.n_in = 1;
        c.in[0] = kt_in(more[d], is_float ? row->gen : KT_INT, 52, s->ndim, s->s, s->view);
        c.axis = axes[ai];
        char in[160];
        kt_in_text(&c.in[0], in, sizeof in);
        snprintf(c.label, sizeof c.label, "%s %s over %s", row->name, in,
                 c.axis == KILN_ALL_AXES ? "all axes" : c.axis == 0 ? "axis 0" : "axis -1");
        kt_check(&c);
      }
    }
  }
}

KT_RUN(kt_run_sum) { return kiln_tensor_sum(in[0], c->axis, c->keepdim, out); }

KT_RUN(kt_run_mean) { return kiln_tensor_mean(in[0], c->axis, c->keepdim, out); }

KT_RUN(kt_run_max) { return kiln_tensor_max(in[0], c->axis, c->keepdim, out); }

KT_RUN(kt_run_argmax) { return kiln_tensor_argmax(in[0], c->axis, c->keepdim, out); }

/* A sum of as many terms as the reduced axis holds. */
static kt_tol_t kt_tol_reduce_axis(const kt_case_t *c) {
  const kt_in_t *a = &c->in[0];
  int64_t len = c->axis == KILN_ALL_AXES                ? kt_numel(a->ndim, a->shape)
                : (c->axis >= 0 && c->axis < a->ndim)   ? a->shape[c->axis]
                : (c->axis == -1 && a->ndim > 0)        ? a->shape[a->ndim - 1]
                                                        : 1;
  return kt_sum_tol(len, 1.0);
}

/* norm over everything: both dtypes over the reduce shapes. */
static void kt_build_norm(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_reduce_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT : KT_WIDE, 52, s->ndim, s->s, s->view);
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "%s %s", row->name, in);
      kt_check(&c);
    }
  }
}

KT_RUN(kt_run_norm) { return kiln_tensor_norm(in[0], out); }

/* A sum of every element. */
static kt_tol_t kt_tol_reduce_all(const kt_case_t *c) {
  return kt_sum_tol(kt_numel(c->in[0].ndim, c->in[0].shape), 1.0);
}

/* ---- the rows -------------------------------------------------------------------------- */

static const kt_row_t kt_rows[] = {
    {.name = "matmul", .op = "matmul", .build = kt_build_matmul,
     .run = kt_run_matmul, .tol = kt_tol_matmul},
    {.name = "sum", .op = "reduce", .build = kt_build_reduce,
     .run = kt_run_sum, .tol = kt_tol_reduce_axis, .gen = KT_SIGNED},
    /* mean of i32: the status. */
    {.name = "mean", .op = "reduce", .build = kt_build_reduce,
     .run = kt_run_mean, .tol = kt_tol_reduce_axis, .gen = KT_SIGNED},
    /* Small integers: ties everywhere, compared exactly. */
    {.name = "max", .op = "reduce", .build = kt_build_reduce,
     .run = kt_run_max, .tol = kt_tol_exact, .gen = KT_STEPS},
    {.name = "argmax", .op = "reduce", .build = kt_build_reduce,
     .run = kt_run_argmax, .tol = kt_tol_exact, .gen = KT_STEPS},
    {.name = "norm", .op = "reduce", .build = kt_build_norm,
     .run = kt_run_norm, .tol = kt_tol_reduce_all},
};

const kt_group_t kt_group_linalg = {
    .name = "linear algebra and reductions",
    .rows = kt_rows,
    .n_rows = sizeof kt_rows / sizeof kt_rows[0],
};
