/* tests/conformance/gradients.c: conformance rows of the training gradients, the backward ops. */
#include "harness.h"

/* ---- training: gradients ------------------------------------------------------------------
 * Each backward op over awkward shapes, against cpu:0; where the result has
 * a simple documented form (a derivative formula, a sum or a broadcast, the
 * routing of max pooling) the reference is checked against it too, computed
 * in double on the host. tests/test_grad.c checks the gradients themselves
 * against finite differences and PyTorch. */

static kt_run_fn kt_run_conv2d_backward_input, kt_run_conv2d_backward_weight;

/* The flat index in `small` (which broadcasts to `big`, NumPy's rule) of the
 * element that big's flat index `flat` reads. */
static int64_t kt_broadcast_index(int big_ndim, const int64_t *big, int64_t flat, int small_ndim,
                                  const int64_t *small) {
  int64_t index = 0, stride = 1;
  for (int i = big_ndim - 1; i >= 0; i--) {
    int64_t at = big[i] ? flat % big[i] : 0;
    flat = big[i] ? flat / big[i] : 0;
    int j = i - (big_ndim - small_ndim);
    if (j < 0) continue;
    if (small[j] != 1) index += at * stride;
    stride *= small[j];
  }
  return index;
}

/* Unary derivatives: each op's own values, small integers (zero among them:
 * relu'(0) = abs'(0) = 0) where the op takes every x, and the special values
 * of the conversions (NaN, infinities, -0.0, denormals, huge, arbitrary
 * bits); dy in [-1, 1); over the elementwise shapes (x a permuted view where
 * the list says, dy too from three dims); then i32 and shapes that differ,
 * for the status. */
static void kt_build_unary_backward(const kt_row_t *row) {
  static const char *const what[] = {"", " (small integers)", " (special values)"};
  for (int variant = 0; variant < 3; variant++) {
    if (variant == 1 && row->gen == KT_POSITIVE) continue;
    const kt_gen_t gen = variant == 0 ? row->gen : variant == 1 ? KT_STEPS : KT_CAST_F32;
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      c.in[0] = kt_in(KILN_F32, gen, 111 + (uint32_t)row->sub, s->ndim, s->s, s->view);
      c.in[1] = kt_in(KILN_F32, KT_SIGNED, 112, s->ndim, s->s, s->view && s->ndim >= 3);
      char x[160], dy[160];
      kt_in_text(&c.in[0], x, sizeof x);
      kt_in_text(&c.in[1], dy, sizeof dy);
      snprintf(c.label, sizeof c.label, "%s x %s, dy %s%s", row->name, x, dy, what[variant]);
      kt_check(&c);
    }
  }
  const int64_t four[1] = {4}, three[1] = {3};
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.in[0] = kt_in(KILN_I32, KT_INT, 1, 1, four, false);
  c.in[1] = kt_in(KILN_F32, KT_SIGNED, 2, 1, four, false);
  snprintf(c.label, sizeof c.label, "%s x i32 [4], dy f32 [4] (dtype)", row->name);
  kt_check(&c);
  c.in[0] = kt_in(KILN_F32, KT_SIGNED, 1, 1, three, false);
  snprintf(c.label, sizeof c.label, "%s x [3], dy [4] (shapes differ)", row->name);
  kt_check(&c);
}

KT_RUN_SHARED(kt_run_unary_backward) {
  return kiln_tensor_unary_backward((kiln_unary_op_t)c->row->sub, in[0], in[1], out);
}

/* dy * f'(x) as kernels/ops.def documents it, in double. */
static void kt_expect_unary_backward(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, KILN_F32, in[0].ndim, in[0].shape);
  const float *xs = in[0].data, *dys = in[1].data;
  float *dx = out->data;
  for (int64_t i = 0; i < out->numel; i++) {
    const double x = xs[i], dy = dys[i];
    double v = 0;
    switch ((kiln_unary_op_t)c->row->sub) {
      case KILN_UNARY_NEG: v = -dy; break;
      case KILN_UNARY_ABS: v = x > 0 ? dy : x < 0 ? -dy : x == 0 ? 0.0 : x; break;
      /* exp(x) is a float first: past FLT_MAX it is inf (as in PyTorch,
       * whose exp backward multiplies dy by the forward's result). */
      case KILN_UNARY_EXP: v = dy * (double)(float)exp(x); break;
      case KILN_UNARY_LOG: v = dy / x; break;
      case KILN_UNARY_SQRT: v = dy * 0.5 / sqrt(x); break;
      case KILN_UNARY_RELU: v = x > 0 ? dy : isnan(x) ? x : 0.0; break;
      case KILN_UNARY_SIGMOID: {
        const double s = 1.0 / (1.0 + exp(-x));
        v = dy * s * (1.0 - s);
        break;
      }
      case KILN_UNARY_TANH: v = dy * (1.0 - tanh(x) * tanh(x)); break;
      default: v = NAN; break;
    }
    dx[i] = (float)v;
  }
}

/* The row's ulps, and its absolute slack: sigmoid' and tanh' subtract from 1
 * a value that rounds near 1 (s(1 - s), 1 - tanh^2), so their error is
 * absolute, about ulp(1) * |dy|. */
static kt_tol_t kt_tol_row_grad(const kt_case_t *c) {
  kt_tol_t t = {0, c->row->atol, c->row->ulps, false};
  return t;
}

/* sum_to: pairs (a, shape a sums to): every kind of reduced run (leading
 * dims, size-1 dims, several runs apart), nothing to reduce, empty operands
 * and empty reduced axes, 0-d, views; then shapes that do not broadcast. */
static const kt_shape_t kt_sum_to_pairs[][2] = {
    {{2, {3, 5}, false, false}, {1, {5}, false, false}},
    {{2, {3, 5}, true, false}, {2, {3, 1}, false, false}},
    {{2, {3, 5}, false, false}, {2, {1, 5}, false, false}},
    {{2, {3, 5}, false, false}, {2, {1, 1}, false, false}},
    {{2, {3, 5}, true, false}, {0, {0}, false, false}},
    {{2, {3, 5}, false, false}, {2, {3, 5}, false, false}},
    {{2, {3, 5}, true, false}, {2, {3, 5}, false, false}},
    {{2, {3, 5}, false, false}, {1, {1}, false, false}},
    {{3, {2, 3, 4}, true, false}, {2, {3, 1}, false, false}},
    {{3, {2, 3, 4}, false, false}, {3, {2, 1, 4}, false, false}},
    {{3, {2, 3, 4}, false, false}, {3, {1, 3, 1}, false, false}},
    {{3, {2, 1, 7}, false, false}, {2, {1, 7}, false, false}},
    {{3, {1, 1, 7}, false, false}, {1, {7}, false, false}},
    {{0, {0}, false, false}, {0, {0}, false, false}},
    {{1, {1}, false, false}, {0, {0}, false, false}},
    {{1, {7}, false, false}, {1, {1}, false, false}},
    {{2, {0, 3}, false, false}, {1, {3}, false, false}},
    {{2, {3, 0}, false, false}, {2, {3, 1}, false, false}},
    {{2, {0, 3}, false, false}, {2, {0, 1}, false, false}},
    {{2, {13, 257}, false, true}, {1, {257}, false, false}},
    {{2, {13, 257}, true, true}, {2, {13, 1}, false, false}},
    {{4, {2, 3, 5, 7}, true, true}, {3, {3, 1, 7}, false, false}},
    {{4, {2, 3, 5, 7}, false, true}, {4, {2, 1, 5, 1}, false, false}},
    {{3, {4, 5, 67}, false, true}, {2, {5, 1}, false, false}},
    {{2, {1031, 3}, false, true}, {1, {3}, false, false}},
    {{2, {3, 40009}, false, true}, {2, {3, 1}, false, false}},
    {{1, {262147}, false, true}, {0, {0}, false, false}},
};

static void kt_build_sum_to(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (size_t i = 0; i < sizeof kt_sum_to_pairs / sizeof kt_sum_to_pairs[0]; i++) {
      const kt_shape_t *a = &kt_sum_to_pairs[i][0], *to = &kt_sum_to_pairs[i][1];
      if (kt_skip(a)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT_EDGE : KT_SIGNED, 121, a->ndim, a->s, a->view);
      kt_case_shape(&c, to);
      char in[160], shape[128];
      kt_in_text(&c.in[0], in, sizeof in);
      kt_shape_text(to->ndim, to->s, shape, sizeof shape);
      snprintf(c.label, sizeof c.label, "sum_to %s to %s", in, shape);
      kt_check(&c);
    }
  }
  static const kt_shape_t bad[][2] = {
      {{2, {3, 5}, false, false}, {1, {4}, false, false}},
      {{2, {3, 5}, false, false}, {3, {2, 3, 5}, false, false}},
  };
  for (size_t i = 0; i < 2; i++) {
    kt_case_t c = kt_case(row);
    c.must_fail = true;
    c.n_in = 1;
    c.in[0] = kt_in(KILN_F32, KT_SIGNED, 1, bad[i][0].ndim, bad[i][0].s, false);
    kt_case_shape(&c, &bad[i][1]);
    char in[160], shape[128];
    kt_in_text(&c.in[0], in, sizeof in);
    kt_shape_text(bad[i][1].ndim, bad[i][1].s, shape, sizeof shape);
    snprintf(c.label, sizeof c.label, "sum_to %s to %s (does not broadcast)", in, shape);
    kt_check(&c);
  }
}

KT_RUN(kt_run_sum_to) { return kiln_tensor_sum_to(in[0], c->ndim, c->shape, out); }

/* Each element of a added into the element of the shape it broadcasts from
 * (in double; i32 wraps as the kernels' sums do). */
static void kt_expect_sum_to(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, in[0].dtype, c->ndim, c->shape);
  double *sums = calloc((size_t)(out->numel > 0 ? out->numel : 1), sizeof *sums);
  uint32_t *wrapped = calloc((size_t)(out->numel > 0 ? out->numel : 1), sizeof *wrapped);
  ck_assert(sums && wrapped);
  for (int64_t i = 0; i < in[0].numel; i++) {
    int64_t j = kt_broadcast_index(in[0].ndim, in[0].shape, i, c->ndim, c->shape);
    if (in[0].dtype == KILN_F32)
      sums[j] += ((const float *)in[0].data)[i];
    else
      wrapped[j] += (uint32_t)((const int32_t *)in[0].data)[i];
  }
  for (int64_t j = 0; j < out->numel; j++) {
    if (in[0].dtype == KILN_F32)
      ((float *)out->data)[j] = (float)sums[j];
    else
      ((int32_t *)out->data)[j] = (int32_t)wrapped[j];
  }
  free(sums);
  free(wrapped);
}

/* A sum of as many terms as go into one result element. */
static kt_tol_t kt_tol_sum_to(const kt_case_t *c) {
  int64_t from = kt_numel(c->in[0].ndim, c->in[0].shape), to = kt_numel(c->ndim, c->shape);
  return kt_sum_tol(to > 0 ? from / to : 1, 1.0);
}

/* broadcast_to: pairs (a, shape); then shapes a does not broadcast to. */
static const kt_shape_t kt_broadcast_to_pairs[][2] = {
    {{1, {5}, false, false}, {2, {3, 5}, false, false}},
    {{2, {3, 1}, false, false}, {2, {3, 5}, false, false}},
    {{2, {1, 5}, false, false}, {3, {2, 3, 5}, false, false}},
    {{0, {0}, false, false}, {2, {2, 3}, false, false}},
    {{0, {0}, false, false}, {0, {0}, false, false}},
    {{1, {1}, false, false}, {1, {7}, false, false}},
    {{1, {1}, false, false}, {1, {0}, false, false}},
    {{1, {3}, false, false}, {2, {0, 3}, false, false}},
    {{2, {3, 4}, true, false}, {3, {2, 3, 4}, false, false}},
    {{3, {2, 1, 4}, false, false}, {3, {2, 3, 4}, false, false}},
    {{2, {3, 5}, false, false}, {2, {3, 5}, false, false}},
    {{3, {4, 3, 1}, true, false}, {4, {2, 4, 3, 5}, false, false}},
    {{1, {257}, false, true}, {2, {13, 257}, false, true}},
    {{2, {13, 1}, false, true}, {2, {13, 257}, false, true}},
    {{3, {1, 13, 1}, false, true}, {4, {3, 5, 13, 7}, false, true}},
    {{2, {7, 13}, true, true}, {3, {11, 7, 13}, false, true}},
    {{1, {1}, false, true}, {1, {262147}, false, true}},
};

static void kt_build_broadcast_to(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (size_t i = 0; i < sizeof kt_broadcast_to_pairs / sizeof kt_broadcast_to_pairs[0]; i++) {
      const kt_shape_t *a = &kt_broadcast_to_pairs[i][0], *to = &kt_broadcast_to_pairs[i][1];
      if (kt_skip(a) || kt_skip(to)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT_EDGE : KT_WIDE, 131, a->ndim, a->s, a->view);
      kt_case_shape(&c, to);
      char in[160], shape[128];
      kt_in_text(&c.in[0], in, sizeof in);
      kt_shape_text(to->ndim, to->s, shape, sizeof shape);
      snprintf(c.label, sizeof c.label, "broadcast_to %s to %s", in, shape);
      kt_check(&c);
    }
  }
  static const kt_shape_t bad[][2] = {
      {{1, {3}, false, false}, {1, {4}, false, false}},
      {{2, {2, 3}, false, false}, {1, {3}, false, false}},
  };
  for (size_t i = 0; i < 2; i++) {
    kt_case_t c = kt_case(row);
    c.must_fail = true;
    c.n_in = 1;
    c.in[0] = kt_in(KILN_F32, KT_SIGNED, 1, bad[i][0].ndim, bad[i][0].s, false);
    kt_case_shape(&c, &bad[i][1]);
    char in[160], shape[128];
    kt_in_text(&c.in[0], in, sizeof in);
    kt_shape_text(bad[i][1].ndim, bad[i][1].s, shape, sizeof shape);
    snprintf(c.label, sizeof c.label, "broadcast_to %s to %s (does not broadcast)", in, shape);
    kt_check(&c);
  }
}

KT_RUN(kt_run_broadcast_to) { return kiln_tensor_broadcast_to(in[0], c->ndim, c->shape, out); }

static void kt_expect_broadcast_to(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, in[0].dtype, c->ndim, c->shape);
  for (int64_t i = 0; i < out->numel; i++) {
    int64_t j = kt_broadcast_index(c->ndim, c->shape, i, in[0].ndim, in[0].shape);
    memcpy((char *)out->data + 4 * i, (const char *)in[0].data + 4 * j, 4);
  }
}

/* softmax_backward (sub 0) and its log form (sub 1), from the forward's
 * result on the device: y = softmax(x) or log_softmax(x), x in [-4, 4) and
 * up to 100, dy in [-1, 1), over the softmax shapes; then i32, for the status. */
static void kt_build_softmax_backward(const kt_row_t *row) {
  for (int big = 0; big < 2; big++) {
    for (const kt_shape_t *s = kt_softmax_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      c.in[0] = kt_in(KILN_F32, big ? KT_BIG : KT_WIDE, 141, s->ndim, s->s, false);
      c.in[1] = kt_in(KILN_F32, KT_SIGNED, 142, s->ndim, s->s, s->view);
      char x[160], dy[160];
      kt_in_text(&c.in[0], x, sizeof x);
      kt_in_text(&c.in[1], dy, sizeof dy);
      snprintf(c.label, sizeof c.label, "%s y = %s(x %s), dy %s%s", row->name, row->sub ? "log_softmax" : "softmax",
               x, dy, big ? " (x up to 100)" : "");
      kt_check(&c);
    }
  }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.in[0] = kt_in(KILN_I32, KT_INT, 1, 2, (const int64_t[]){2, 5}, false);
  c.in[1] = kt_in(KILN_F32, KT_SIGNED, 2, 2, (const int64_t[]){2, 5}, false);
  snprintf(c.label, sizeof c.label, "%s y i32 [2x5] (dtype)", row->name);
  kt_check(&c);
}

/* in[0] is x: the forward runs first, on the same device; an i32 x goes to
 * the backward as it is (for the status). */
KT_RUN(kt_run_softmax_backward) {
  kiln_tensor_t *y = NULL;
  kiln_status_t status = KILN_OK;
  if (kiln_tensor_dtype(in[0]) != KILN_F32)
    y = kiln_tensor_retain(in[0]);
  else
    status = c->row->sub ? kiln_tensor_log_softmax(in[0], &y) : kiln_tensor_softmax(in[0], &y);
  if (status == KILN_OK) status = kiln_tensor_softmax_backward(y, in[1], c->row->sub != 0, out);
  kiln_tensor_release(y);
  return status;
}

/* A sum over the row (dy * y, or dy): relative 1e-4 and absolute growing
 * with sqrt(columns). */
static kt_tol_t kt_tol_softmax_backward(const kt_case_t *c) {
  const kt_in_t *a = &c->in[0];
  return kt_sum_tol(a->ndim ? a->shape[a->ndim - 1] : 1, 1.0);
}

/* cross_entropy_backward: logits [N, C] (values in [-4, 4) and up to 100),
 * labels in [0, C), without dloss and with a 0-d or one-element dloss; then
 * labels outside [0, C) (rows of NaN) and mismatched operands. */
static const struct { int64_t n, c; bool view, large; } kt_ce_backward_cases[] = {
    {1, 1, false, false}, {1, 7, false, false}, {7, 13, false, false}, {5, 3, true, false},
    {0, 5, false, false}, {3, 0, false, false}, {257, 13, false, true}, {13, 257, true, true},
    {64, 1000, false, true},
};

static void kt_build_cross_entropy_backward(const kt_row_t *row) {
  for (size_t i = 0; i < sizeof kt_ce_backward_cases / sizeof kt_ce_backward_cases[0]; i++) {
    if (kt_small && kt_ce_backward_cases[i].large) continue;
    for (int variant = 0; variant < 4; variant++) {
      /* 0: no dloss; 1: 0-d dloss; 2: [1] dloss; 3: logits up to 100, no dloss. */
      kt_case_t c = kt_case(row);
      const int64_t ls[2] = {kt_ce_backward_cases[i].n, kt_ce_backward_cases[i].c};
      const int64_t bs[1] = {kt_ce_backward_cases[i].n}, one[1] = {1};
      c.n_in = variant == 1 || variant == 2 ? 3 : 2;
      c.in[0] = kt_in(KILN_F32, variant == 3 ? KT_BIG : KT_WIDE, 151, 2, ls, kt_ce_backward_cases[i].view);
      c.in[1] = kt_in(KILN_I32, KT_LABELS, 152, 1, bs, false);
      c.in[1].hi = kt_ce_backward_cases[i].c;
      c.in[2] = kt_in(KILN_F32, KT_WIDE, 153 + (uint32_t)variant, variant == 2 ? 1 : 0, one, false);
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      static const char *const what[] = {"", ", dloss 0-d", ", dloss [1]", " (values up to 100)"};
      snprintf(c.label, sizeof c.label, "cross_entropy_backward logits %s, labels i32 [%lld]%s", in,
               (long long)ls[0], what[variant]);
      kt_check(&c);
    }
  }
  /* Labels in [-50, 50] for 7 classes: most rows NaN, the same everywhere. */
  kt_case_t c = kt_case(row);
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 154, 2, (const int64_t[]){11, 7}, false);
  c.in[1] = kt_in(KILN_I32, KT_INT, 155, 1, (const int64_t[]){11}, false);
  snprintf(c.label, sizeof c.label, "cross_entropy_backward logits f32 [11x7], labels outside [0, 7)");
  kt_check(&c);
  c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 1, 2, (const int64_t[]){3, 4}, false);
  c.in[1] = kt_in(KILN_F32, KT_SIGNED, 2, 1, (const int64_t[]){3}, false);
  snprintf(c.label, sizeof c.label, "cross_entropy_backward labels f32 (dtype)");
  kt_check(&c);
  c.in[1] = kt_in(KILN_I32, KT_LABELS, 2, 1, (const int64_t[]){4}, false);
  c.in[1].hi = 4;
  snprintf(c.label, sizeof c.label, "cross_entropy_backward logits [3x4], labels [4] (shapes)");
  kt_check(&c);
}

KT_RUN(kt_run_cross_entropy_backward) {
  return kiln_tensor_cross_entropy_backward(in[0], in[1], c->n_in > 2 ? in[2] : NULL, out);
}

/* (softmax(logits) - onehot(labels)) / N * dloss in double; a row of NaN
 * where the label is outside [0, C). */
static void kt_expect_cross_entropy_backward(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, KILN_F32, 2, in[0].shape);
  const int64_t n = in[0].shape[0], classes = in[0].shape[1];
  const double dloss = c->n_in > 2 ? (double)((const float *)in[2].data)[0] : 1.0;
  const float *x = in[0].data;
  const int32_t *labels = in[1].data;
  float *dx = out->data;
  for (int64_t r = 0; r < n; r++) {
    double m = -INFINITY, sum = 0;
    for (int64_t i = 0; i < classes; i++) m = fmax(m, (double)x[r * classes + i]);
    for (int64_t i = 0; i < classes; i++) sum += exp((double)x[r * classes + i] - m);
    const bool valid = labels[r] >= 0 && labels[r] < classes;
    for (int64_t i = 0; i < classes; i++) {
      const double p = exp((double)x[r * classes + i] - m) / sum - (i == labels[r] ? 1.0 : 0.0);
      dx[r * classes + i] = valid ? (float)(p / (double)n * dloss) : NAN;
    }
  }
}

/* softmax entries (within 1e-6 of 1) minus 0 or 1, over N, times dloss. */
static kt_tol_t kt_tol_cross_entropy_backward(const kt_case_t *c) {
  kt_tol_t t = {1e-5, c->n_in > 2 ? 4e-6 : 1e-6, 8, false};
  return t;
}

/* The convolutions of the backward rows: prime sizes, strides that do not
 * divide (rows of x no window reaches: their gradient is 0), dilation,
 * padding past half the kernel and as large as it (windows wholly in the
 * padding), batch 1, an empty batch (dw all zeros), no output channels. */
static const kt_conv_t kt_conv2d_backward_cases[] = {
    {1, 1, 1, 1, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}, false, false, false},
    {2, 3, 7, 5, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, false, false, false},
    {1, 2, 7, 6, 3, 3, 2, {2, 1}, {1, 0}, {2, 1}, false, false, false},
    {1, 2, 5, 7, 3, 2, 3, {1, 2}, {0, 2}, {1, 2}, false, true, false},   /* permuted views */
    {1, 2, 7, 7, 3, 3, 3, {2, 2}, {1, 1}, {2, 2}, false, false, false},  /* stride 2, padding 1, dilation 2 */
    {1, 3, 11, 13, 2, 3, 3, {2, 2}, {2, 2}, {1, 1}, false, false, false}, /* padding 2 > 3/2 */
    {1, 1, 3, 3, 1, 3, 3, {1, 1}, {3, 3}, {1, 1}, false, false, false},  /* windows wholly in the padding */
    {3, 1, 5, 5, 2, 2, 2, {3, 3}, {0, 0}, {1, 1}, false, false, false},  /* row and column 2 unreached */
    {1, 1, 3, 3, 1, 3, 3, {5, 5}, {0, 0}, {1, 1}, false, false, false},  /* stride past the input */
    {2, 5, 3, 2, 7, 1, 1, {1, 1}, {0, 0}, {1, 1}, false, true, false},   /* 1x1 */
    {0, 3, 5, 5, 2, 3, 3, {1, 1}, {0, 0}, {1, 1}, false, false, false},  /* N = 0: dw zeros */
    {1, 3, 5, 5, 0, 3, 3, {1, 1}, {0, 0}, {1, 1}, false, false, false},  /* K = 0: dx zeros */
    {2, 3, 13, 7, 5, 3, 3, {2, 2}, {1, 1}, {1, 1}, false, false, true},
    {2, 4, 17, 19, 8, 5, 5, {2, 2}, {3, 3}, {1, 1}, false, false, true},
    {1, 16, 33, 33, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, false, false, true},
    {1, 3, 29, 31, 7, 3, 5, {3, 2}, {2, 1}, {2, 3}, false, true, true},
    {4, 8, 23, 23, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, false, false, true},
};

static int64_t kt_window_out(int64_t size, int32_t pad, int32_t dil, int64_t k, int32_t stride) {
  int64_t span = size + 2 * (int64_t)pad - (int64_t)dil * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

/* The case `v` of a backward conv row: x_shape or w_shape in c->shape. */
static void kt_conv_backward_case(const kt_row_t *row, const kt_conv_t *v, kt_case_t *c) {
  *c = kt_case(row);
  const int64_t P = kt_window_out(v->h, v->pad[0], v->dil[0], v->r, v->stride[0]);
  const int64_t Q = kt_window_out(v->w, v->pad[1], v->dil[1], v->s, v->stride[1]);
  const int64_t xs[4] = {v->n, v->c, v->h, v->w}, ws[4] = {v->k, v->c, v->r, v->s}, ys[4] = {v->n, v->k, P, Q};
  for (int d = 0; d < 2; d++) {
    c->conv.stride[d] = v->stride[d];
    c->conv.padding[d] = v->pad[d];
    c->conv.dilation[d] = v->dil[d];
  }
  c->n_in = 2;
  c->ndim = 4;
  if (row->run == kt_run_conv2d_backward_input) {
    c->in[0] = kt_in(KILN_F32, KT_SIGNED, 161, 4, ys, v->view);
    c->in[1] = kt_in(KILN_F32, KT_SIGNED, 162, 4, ws, v->view);
    memcpy(c->shape, xs, sizeof xs);
  } else if (row->run == kt_run_conv2d_backward_weight) {
    c->in[0] = kt_in(KILN_F32, KT_SIGNED, 163, 4, xs, v->view);
    c->in[1] = kt_in(KILN_F32, KT_SIGNED, 164, 4, ys, v->view);
    memcpy(c->shape, ws, sizeof ws);
  } else {
    c->n_in = 1;
    c->in[0] = kt_in(KILN_F32, KT_SIGNED, 165, 4, ys, v->view);
  }
  char a[160], b[160] = "";
  kt_in_text(&c->in[0], a, sizeof a);
  if (c->n_in > 1) kt_in_text(&c->in[1], b, sizeof b);
  snprintf(c->label, sizeof c->label,
           "%s %s%s%s for x [%lldx%lldx%lldx%lld], w [%lldx%lldx%lldx%lld], stride %dx%d, padding %dx%d, "
           "dilation %dx%d",
           row->name, a, c->n_in > 1 ? ", " : "", b, (long long)v->n, (long long)v->c, (long long)v->h,
           (long long)v->w, (long long)v->k, (long long)v->c, (long long)v->r, (long long)v->s, v->stride[0],
           v->stride[1], v->pad[0], v->pad[1], v->dil[0], v->dil[1]);
}

/* The case list; then shapes that belong to no one convolution. */
static void kt_build_conv2d_backward(const kt_row_t *row) {
  for (size_t i = 0; i < sizeof kt_conv2d_backward_cases / sizeof kt_conv2d_backward_cases[0]; i++) {
    const kt_conv_t *v = &kt_conv2d_backward_cases[i];
    if (kt_small && v->large) continue;
    kt_case_t c;
    kt_conv_backward_case(row, v, &c);
    kt_check(&c);
  }
  /* dy one row too many; x with 3 channels for a weight of 4; dy of 3 dims. */
  static const kt_conv_t bad = {1, 3, 5, 5, 2, 3, 3, {1, 1}, {0, 0}, {1, 1}, false, false, false};
  kt_case_t c;
  kt_conv_backward_case(row, &bad, &c);
  c.must_fail = true;
  if (row->run == kt_run_conv2d_backward_input) {
    c.in[0].shape[2] = 4;
    snprintf(c.label, sizeof c.label, "%s dy [1x2x4x3] for x [1x3x5x5], w [2x3x3x3] (dy's shape)", row->name);
  } else if (row->run == kt_run_conv2d_backward_weight) {
    c.shape[1] = 4;
    snprintf(c.label, sizeof c.label, "%s x [1x3x5x5], w_shape [2x4x3x3] (channels differ)", row->name);
  } else {
    c.in[0].ndim = 3;
    snprintf(c.label, sizeof c.label, "%s dy [1x2x3] (not 4-D)", row->name);
  }
  kt_check(&c);
}

KT_RUN(kt_run_conv2d_backward_input) {
  return kiln_tensor_conv2d_backward_input(in[0], in[1], c->shape, &c->conv, out);
}

KT_RUN(kt_run_conv2d_backward_weight) {
  return kiln_tensor_conv2d_backward_weight(in[0], in[1], c->shape, &c->conv, out);
}

KT_RUN(kt_run_conv2d_backward_bias) { return kiln_tensor_conv2d_backward_bias(in[0], out); }

/* dx: at most K*R*S products per element; dw: N*P*Q; db: N*P*Q terms. */
static kt_tol_t kt_tol_conv2d_backward(const kt_case_t *c) {
  const int64_t *a = c->in[0].shape;
  if (c->row->run == kt_run_conv2d_backward_input) {
    const int64_t *w = c->in[1].shape;
    return kt_sum_tol(w[0] * w[2] * w[3], 1.0);
  }
  return kt_sum_tol(c->row->run == kt_run_conv2d_backward_weight ? a[0] * c->in[1].shape[2] * c->in[1].shape[3]
                                                                  : a[0] * a[2] * a[3],
                    1.0);
}

/* max_pool2d_backward: overlapping windows (kernel 3 stride 2, stride 1),
 * padding up to half the kernel, strides that do not divide, batch 1, an
 * empty batch, views; x with distinct-ish values, with small integers (ties:
 * the first maximum in row-major order wins) and with NaN (the first NaN
 * wins), infinities and other special values; dy multiples of 2^-12 (sums of
 * a few are exact in any order: compared exactly). */
static const kt_pool_t kt_max_pool2d_backward_cases[] = {
    {1, 1, 1, 1, {1, 1}, {0, 0}, {0, 0}, false, false},
    {2, 3, 7, 5, {2, 2}, {0, 0}, {0, 0}, false, false},
    {1, 2, 7, 6, {3, 2}, {2, 1}, {1, 1}, false, false},
    {2, 3, 5, 5, {3, 3}, {1, 1}, {1, 1}, true, false},
    {0, 3, 5, 5, {2, 2}, {0, 0}, {0, 0}, false, false},
    {1, 1, 3, 3, {3, 3}, {5, 5}, {1, 1}, false, false},
    {1, 2, 11, 13, {3, 3}, {2, 2}, {0, 0}, false, false},
    {1, 3, 9, 9, {3, 3}, {2, 2}, {1, 1}, true, false},
    {1, 1, 7, 7, {5, 5}, {1, 1}, {2, 2}, false, false},
    {2, 2, 8, 9, {3, 2}, {1, 2}, {1, 1}, false, false},
    {2, 3, 13, 7, {3, 3}, {2, 2}, {1, 1}, false, true},
    {2, 16, 33, 31, {2, 3}, {2, 3}, {1, 1}, true, true},
    {1, 8, 31, 29, {3, 3}, {2, 2}, {1, 1}, false, true},
    {2, 4, 8, 6, {2, 2}, {0, 0}, {0, 0}, false, false},
    {1, 3, 10, 12, {2, 2}, {2, 2}, {0, 0}, true, false},
};

static void kt_build_max_pool2d_backward(const kt_row_t *row) {
  for (size_t i = 0; i < sizeof kt_max_pool2d_backward_cases / sizeof kt_max_pool2d_backward_cases[0]; i++) {
    const kt_pool_t *v = &kt_max_pool2d_backward_cases[i];
    if (kt_small && v->large) continue;
    for (int steps = 0; steps < 3; steps++) {
      if (steps == 2 && v->large) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      int32_t stride[2];
      for (int d = 0; d < 2; d++) {
        c.pool.kernel[d] = v->kernel[d];
        c.pool.stride[d] = v->stride[d];
        c.pool.padding[d] = v->pad[d];
        stride[d] = v->stride[d] ? v->stride[d] : v->kernel[d];
      }
      const int64_t P = kt_window_out(v->h, v->pad[0], 1, v->kernel[0], stride[0]);
      const int64_t Q = kt_window_out(v->w, v->pad[1], 1, v->kernel[1], stride[1]);
      const kt_gen_t gen = steps == 0 ? KT_WIDE : steps == 1 ? KT_STEPS : KT_CAST_F32;
      c.in[0] = kt_in(KILN_F32, gen, 171, 4, (const int64_t[]){v->n, v->c, v->h, v->w}, v->view);
      c.in[1] = kt_in(KILN_F32, KT_SIGNED, 172, 4, (const int64_t[]){v->n, v->c, P, Q}, v->view);
      char x[160];
      kt_in_text(&c.in[0], x, sizeof x);
      snprintf(c.label, sizeof c.label, "max_pool2d_backward x %s, kernel %dx%d, stride %dx%d, padding %dx%d%s", x,
               v->kernel[0], v->kernel[1], v->stride[0], v->stride[1], v->pad[0], v->pad[1],
               steps == 0 ? "" : steps == 1 ? " (ties)" : " (NaN, infinities, special values)");
      kt_check(&c);
    }
  }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.pool = (kiln_pool2d_params_t){{2, 2}, {2, 2}, {0, 0}};
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 1, 4, (const int64_t[]){1, 1, 4, 4}, false);
  c.in[1] = kt_in(KILN_F32, KT_SIGNED, 2, 4, (const int64_t[]){1, 1, 3, 2}, false);
  snprintf(c.label, sizeof c.label, "max_pool2d_backward x [1x1x4x4], dy [1x1x3x2] (dy's shape)");
  kt_check(&c);
}

KT_RUN(kt_run_max_pool2d_backward) { return kiln_tensor_max_pool2d_backward(in[0], in[1], &c->pool, out); }

/* Each window's dy added to its first maximum in row-major order (NaN wins,
 * padded cells never do), in double. */
static void kt_expect_max_pool2d_backward(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, KILN_F32, 4, in[0].shape);
  const int64_t N = in[0].shape[0], C = in[0].shape[1], H = in[0].shape[2], W = in[0].shape[3];
  const int64_t P = in[1].shape[2], Q = in[1].shape[3];
  const float *x = in[0].data, *dy = in[1].data;
  double *dx = calloc((size_t)(out->numel > 0 ? out->numel : 1), sizeof *dx);
  ck_assert_ptr_nonnull(dx);
  int32_t kernel[2], stride[2], pad[2];
  for (int d = 0; d < 2; d++) {
    kernel[d] = c->pool.kernel[d];
    stride[d] = c->pool.stride[d] ? c->pool.stride[d] : c->pool.kernel[d];
    pad[d] = c->pool.padding[d];
  }
  for (int64_t nc = 0; nc < N * C; nc++) {
    for (int64_t p = 0; p < P; p++) {
      for (int64_t q = 0; q < Q; q++) {
        int64_t best = -1;
        float m = 0;
        for (int64_t i = 0; i < kernel[0]; i++) {
          for (int64_t j = 0; j < kernel[1]; j++) {
            int64_t h = p * stride[0] - pad[0] + i, w = q * stride[1] - pad[1] + j;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            float v = x[(nc * H + h) * W + w];
            if (best < 0 || (!isnan(m) && (v > m || isnan(v)))) {
              best = (nc * H + h) * W + w;
              m = v;
            }
          }
        }
        if (best >= 0) dx[best] += dy[(nc * P + p) * Q + q];
      }
    }
  }
  for (int64_t i = 0; i < out->numel; i++) ((float *)out->data)[i] = (float)dx[i];
  free(dx);
}

/* ---- the rows -------------------------------------------------------------------------- */

#define KT_GRAD_ROW(OP, op_, gen_, ulps_, atol_)                                                        \
  {.name = #op_ "_backward", .op = "unary_backward",                                                    \
   .build = kt_build_unary_backward, .run = kt_run_unary_backward, .tol = kt_tol_row_grad,              \
   .expect = kt_expect_unary_backward, .sub = KILN_UNARY_##OP, .gen = gen_, .ulps = ulps_, .atol = atol_}

static const kt_row_t kt_rows[] = {
    /* training: gradients. Derivatives: exact where they only move dy; a
     * few ulps over the forward's own where they evaluate it. */
    KT_GRAD_ROW(NEG, neg, KT_WIDE, 0, 0),
    KT_GRAD_ROW(ABS, abs, KT_WIDE, 0, 0),
    KT_GRAD_ROW(EXP, exp, KT_WIDE, 6, 1e-7),
    KT_GRAD_ROW(LOG, log, KT_POSITIVE, 4, 1e-7),
    KT_GRAD_ROW(SQRT, sqrt, KT_POSITIVE, 8, 1e-7),
    KT_GRAD_ROW(RELU, relu, KT_WIDE, 0, 0),
    KT_GRAD_ROW(SIGMOID, sigmoid, KT_WIDE, 16, 1e-6),
    KT_GRAD_ROW(TANH, tanh, KT_WIDE, 16, 1e-6),
    {.name = "sum_to", .op = "reduce", .build = kt_build_sum_to,
     .run = kt_run_sum_to, .tol = kt_tol_sum_to, .expect = kt_expect_sum_to},
    {.name = "broadcast_to", .op = "copy", .build = kt_build_broadcast_to,
     .run = kt_run_broadcast_to, .tol = kt_tol_bits, .expect = kt_expect_broadcast_to},
    {.name = "softmax_backward", .op = "softmax_backward",
     .build = kt_build_softmax_backward, .run = kt_run_softmax_backward, .tol = kt_tol_softmax_backward, .sub = 0},
    {.name = "softmax_backward (log)", .op = "softmax_backward",
     .build = kt_build_softmax_backward, .run = kt_run_softmax_backward, .tol = kt_tol_softmax_backward, .sub = 1},
    {.name = "cross_entropy_backward", .op = "cross_entropy_backward",
     .build = kt_build_cross_entropy_backward, .run = kt_run_cross_entropy_backward,
     .tol = kt_tol_cross_entropy_backward, .expect = kt_expect_cross_entropy_backward},
    {.name = "conv2d_backward_input", .op = "conv2d_backward_input",
     .build = kt_build_conv2d_backward, .run = kt_run_conv2d_backward_input, .tol = kt_tol_conv2d_backward},
    {.name = "conv2d_backward_weight", .op = "conv2d_backward_weight",
     .build = kt_build_conv2d_backward, .run = kt_run_conv2d_backward_weight, .tol = kt_tol_conv2d_backward},
    {.name = "conv2d_backward_bias", .op = "reduce",
     .build = kt_build_conv2d_backward, .run = kt_run_conv2d_backward_bias, .tol = kt_tol_conv2d_backward},
    /* dy values whose sums are exact in any order: routing compared exactly. */
    {.name = "max_pool2d_backward", .op = "max_pool2d_backward",
     .build = kt_build_max_pool2d_backward, .run = kt_run_max_pool2d_backward, .tol = kt_tol_exact,
     .expect = kt_expect_max_pool2d_backward},
};
#undef KT_GRAD_ROW

const kt_group_t kt_group_gradients = {
    .name = "training: gradients",
    .rows = kt_rows,
    .n_rows = sizeof kt_rows / sizeof kt_rows[0],
};
