/* tests/conformance/nn.c: conformance rows: softmax, log_softmax, cross_entropy, conv2d, max_pool2d. */
#include "harness.h"

/* softmax, log_softmax: values in [-4, 4) and up to 100 over the softmax
 * shapes; then i32, for the status. */
static void kt_build_softmax(const kt_row_t *row) {
  for (int big = 0; big < 2; big++) {
    for (const kt_shape_t *s = kt_softmax_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(KILN_F32, big ? KT_BIG : KT_WIDE, 61, s->ndim, s->s, s->view);
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "%s %s%s", row->name, in, big ? " (values up to 100)" : "");
      kt_check(&c);
    }
  }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 1;
  c.in[0] = kt_in(KILN_I32, KT_INT, 1, 1, (const int64_t[]){5}, false);
  snprintf(c.label, sizeof c.label, "%s i32 [5] (dtype)", row->name);
  kt_check(&c);
}

KT_RUN(kt_run_softmax) { return kiln_tensor_softmax(in[0], out); }

KT_RUN(kt_run_log_softmax) { return kiln_tensor_log_softmax(in[0], out); }

/* A row's sum of exponentials: absolute slack growing with sqrt(columns),
 * scaled by `big` where the values reach 100 (log_softmax returns them). */
static kt_tol_t kt_tol_softmax_scaled(const kt_case_t *c, double big) {
  const kt_in_t *a = &c->in[0];
  int64_t cols = a->ndim ? a->shape[a->ndim - 1] : 1;
  kt_tol_t t = {1e-5, 1e-6 * sqrt((double)(cols > 1 ? cols : 1)) * (a->gen == KT_BIG ? big : 1.0), 8, false};
  return t;
}
static kt_tol_t kt_tol_softmax(const kt_case_t *c) { return kt_tol_softmax_scaled(c, 1.0); }
static kt_tol_t kt_tol_log_softmax(const kt_case_t *c) { return kt_tol_softmax_scaled(c, 100.0); }

/* log_softmax of large logits close together: (x - max) - log(sum), not
 * x - (max + log(sum)), whose rounding cost the largest entry 1.4e-3 of its
 * value at a maximum of 103.46. Checked against double precision on the
 * host, relative error only. */
static const kt_shape_t kt_large_logits_shapes[] = {
    {2, {3, 7}, false, false}, {2, {4, 10}, false, false}, {2, {7, 1000}, false, true}, {-1, {0}, false, false},
};

static void kt_build_log_softmax_large(const kt_row_t *row) {
  for (const kt_shape_t *s = kt_large_logits_shapes; s->ndim >= 0; s++) {
    if (kt_skip(s)) continue;
    kt_case_t c = kt_case(row);
    c.n_in = 1;
    c.in[0] = kt_in(KILN_F32, KT_NEAR_100, 83, s->ndim, s->s, false);
    char in[160];
    kt_in_text(&c.in[0], in, sizeof in);
    snprintf(c.label, sizeof c.label, "%s %s (logits in [100, 103.5))", row->name, in);
    kt_check(&c);
  }
}

static void kt_expect_log_softmax(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  out->status = KILN_OK;
  out->dtype = KILN_F32;
  out->ndim = in[0].ndim;
  memcpy(out->shape, in[0].shape, sizeof out->shape);
  out->numel = in[0].numel;
  out->data = malloc((size_t)(out->numel > 0 ? out->numel : 1) * 4);
  ck_assert_ptr_nonnull(out->data);
  const int64_t cols = in[0].ndim ? in[0].shape[in[0].ndim - 1] : 1;
  const float *x = in[0].data;
  float *y = out->data;
  for (int64_t r = 0; cols > 0 && r < out->numel / cols; r++) {
    double m = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < cols; i++) m = fmax(m, (double)x[r * cols + i]);
    for (int64_t i = 0; i < cols; i++) sum += exp((double)x[r * cols + i] - m);
    for (int64_t i = 0; i < cols; i++) y[r * cols + i] = (float)((double)x[r * cols + i] - m - log(sum));
  }
}

static kt_tol_t kt_tol_relative(const kt_case_t *c) {
  kt_tol_t t = {1e-6, 0, 0, false};
  return t;
}

static const struct { int64_t n, c; bool view, large; } kt_cross_entropy_cases[] = {
    {1, 1, false, false}, {1, 7, false, false}, {7, 13, false, false}, {5, 3, true, false},
    {0, 5, false, false}, {5, 0, false, false}, {257, 13, false, true}, {13, 257, true, true},
    {64, 1000, false, true},
};

static void kt_build_cross_entropy(const kt_row_t *row) {
  for (size_t i = 0; i < sizeof kt_cross_entropy_cases / sizeof kt_cross_entropy_cases[0]; i++) {
    if (kt_small && kt_cross_entropy_cases[i].large) continue;
    for (int big = 0; big < 2; big++) {
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      const int64_t ls[2] = {kt_cross_entropy_cases[i].n, kt_cross_entropy_cases[i].c};
      const int64_t bs[1] = {kt_cross_entropy_cases[i].n};
      c.in[0] = kt_in(KILN_F32, big ? KT_BIG : KT_WIDE, 71, 2, ls, kt_cross_entropy_cases[i].view);
      c.in[1] = kt_in(KILN_I32, KT_LABELS, 72, 1, bs, false);
      c.in[1].hi = kt_cross_entropy_cases[i].c;
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "cross_entropy logits %s, labels i32 [%lld]%s", in, (long long)ls[0],
               big ? " (values up to 100)" : "");
      kt_check(&c);
    }
  }
}

KT_RUN(kt_run_cross_entropy) { return kiln_tensor_cross_entropy(in[0], in[1], out); }

/* A log-sum-exp over C classes, scaled where the logits reach 100. */
static kt_tol_t kt_tol_cross_entropy(const kt_case_t *c) {
  int64_t classes = c->in[0].shape[1];
  kt_tol_t t = {1e-5, 1e-5 * sqrt((double)(classes + 1)) * (c->in[0].gen == KT_BIG ? 100.0 : 1.0), 8, false};
  return t;
}

static const kt_conv_t kt_conv2d_cases[] = {
    {1, 1, 1, 1, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}, false, false, false},
    {1, 1, 1, 1, 1, 1, 1, {1, 1}, {0, 0}, {1, 1}, true, false, false},
    {2, 3, 7, 5, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false},
    {1, 2, 7, 6, 3, 3, 2, {2, 1}, {1, 0}, {2, 1}, false, false, false},   /* non-square everything */
    {1, 2, 5, 7, 3, 2, 3, {1, 2}, {0, 2}, {1, 2}, true, true, false},     /* x a permuted view */
    {0, 3, 5, 5, 2, 3, 3, {1, 1}, {0, 0}, {1, 1}, true, false, false},    /* N = 0 */
    {1, 3, 5, 5, 0, 3, 3, {1, 1}, {0, 0}, {1, 1}, false, false, false},   /* K = 0 */
    {1, 1, 3, 3, 1, 3, 3, {5, 5}, {0, 0}, {1, 1}, false, false, false},   /* stride past the input */
    {2, 3, 13, 7, 5, 3, 3, {2, 2}, {1, 1}, {1, 1}, true, false, true},
    {2, 4, 17, 19, 8, 5, 5, {2, 2}, {2, 2}, {1, 1}, true, false, true},
    {1, 16, 33, 33, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, true},
    {1, 3, 29, 31, 7, 3, 5, {3, 2}, {2, 1}, {2, 3}, false, true, true},
};

/* The case list; then channels that differ, for the status. */
static void kt_build_conv2d(const kt_row_t *row) {
  /* f32 over every case; then the other float dtypes over the small ones
   * (f16 and bf16 summed in f32 and rounded once, f64 in f64; a device that
   * does not serve one must refuse it with KILN_UNSUPPORTED). */
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_F64, KILN_F16, KILN_BF16};
  for (size_t dt = 0; dt < sizeof dtypes / sizeof dtypes[0]; dt++) {
    for (size_t i = 0; i < sizeof kt_conv2d_cases / sizeof kt_conv2d_cases[0]; i++) {
      const kt_conv_t *v = &kt_conv2d_cases[i];
      if ((kt_small || dt > 0) && v->large) continue;
      kt_case_t c = kt_case(row);
      c.n_in = v->bias ? 3 : 2;
      c.in[0] = kt_in(dtypes[dt], KT_SIGNED, 81, 4, (const int64_t[]){v->n, v->c, v->h, v->w}, v->view);
      c.in[1] = kt_in(dtypes[dt], KT_SIGNED, 82, 4, (const int64_t[]){v->k, v->c, v->r, v->s}, false);
      c.in[2] = kt_in(dtypes[dt], KT_SIGNED, 83, 1, (const int64_t[]){v->k}, false);
      for (int d = 0; d < 2; d++) {
        c.conv.stride[d] = v->stride[d];
        c.conv.padding[d] = v->pad[d];
        c.conv.dilation[d] = v->dil[d];
      }
      char x[160], w[160];
      kt_in_text(&c.in[0], x, sizeof x);
      kt_in_text(&c.in[1], w, sizeof w);
      snprintf(c.label, sizeof c.label, "conv2d x %s, w %s%s, stride %dx%d, padding %dx%d, dilation %dx%d", x, w,
               v->bias ? ", bias" : "", v->stride[0], v->stride[1], v->pad[0], v->pad[1], v->dil[0], v->dil[1]);
      kt_check(&c);
    }
  }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_SIGNED, 1, 4, (const int64_t[]){1, 3, 5, 5}, false);
  c.in[1] = kt_in(KILN_F32, KT_SIGNED, 2, 4, (const int64_t[]){2, 4, 3, 3}, false);
  c.conv = kiln_conv2d_params_default();
  snprintf(c.label, sizeof c.label, "conv2d x [1x3x5x5], w [2x4x3x3] (channels differ)");
  kt_check(&c);
}

KT_RUN(kt_run_conv2d) { return kiln_tensor_conv2d(in[0], in[1], c->n_in > 2 ? in[2] : NULL, &c->conv, out); }

/* Sums of C*R*S products and the bias (weight [K,C,R,S]). */
static kt_tol_t kt_tol_conv2d(const kt_case_t *c) {
  const int64_t *w = c->in[1].shape;
  return kt_sum_tol(w[1] * w[2] * w[3] + 1, 1.0);
}

/* Sums of C*R*S products and the bias (weight [K,C,R,S]). */

static const kt_pool_t kt_max_pool2d_cases[] = {
    {1, 1, 1, 1, {1, 1}, {0, 0}, {0, 0}, false, false},
    {2, 3, 7, 5, {2, 2}, {0, 0}, {0, 0}, false, false},
    {1, 2, 7, 6, {3, 2}, {2, 1}, {1, 1}, false, false},
    {2, 3, 5, 5, {3, 3}, {1, 1}, {1, 1}, true, false},
    {0, 3, 5, 5, {2, 2}, {0, 0}, {0, 0}, false, false},
    {1, 1, 3, 3, {3, 3}, {5, 5}, {1, 1}, false, false},
    {2, 3, 13, 7, {3, 3}, {2, 2}, {1, 1}, false, true},
    {2, 16, 33, 31, {2, 3}, {2, 3}, {1, 1}, true, true},
    /* 2x2 at stride 2 on even planes, contiguous and a view: the CPU's
     * tiling path, which the odd planes above reach with a leftover row. */
    {2, 4, 8, 6, {2, 2}, {0, 0}, {0, 0}, false, false},
    {1, 3, 10, 12, {2, 2}, {2, 2}, {0, 0}, true, false},
};

/* The case list, with values in [-4, 4) and with small integers (ties). */
static void kt_build_max_pool2d(const kt_row_t *row) {
  for (size_t i = 0; i < sizeof kt_max_pool2d_cases / sizeof kt_max_pool2d_cases[0]; i++) {
    const kt_pool_t *v = &kt_max_pool2d_cases[i];
    if (kt_small && v->large) continue;
    for (int steps = 0; steps < 2; steps++) {
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(KILN_F32, steps ? KT_STEPS : KT_WIDE, 91, 4, (const int64_t[]){v->n, v->c, v->h, v->w}, v->view);
      for (int d = 0; d < 2; d++) {
        c.pool.kernel[d] = v->kernel[d];
        c.pool.stride[d] = v->stride[d];
        c.pool.padding[d] = v->pad[d];
      }
      char x[160];
      kt_in_text(&c.in[0], x, sizeof x);
      snprintf(c.label, sizeof c.label, "max_pool2d x %s, kernel %dx%d, stride %dx%d, padding %dx%d%s", x,
               v->kernel[0], v->kernel[1], v->stride[0], v->stride[1], v->pad[0], v->pad[1], steps ? " (ties)" : "");
      kt_check(&c);
    }
  }
}

KT_RUN(kt_run_max_pool2d) { return kiln_tensor_max_pool2d(in[0], &c->pool, out); }

/* A label outside [0, C) makes cross_entropy's loss NaN on the device; the
 * core reports the first one (position and value) at the queue's next
 * synchronisation, once, as KILN_INDEX_OUT_OF_RANGE; the next op is clean. */
START_TEST(test_cross_entropy_label_report) {
  for (size_t d = 0; d < kt_ndev; d++) {
    kiln_device_t *dev = kt_devs[d];
    const int64_t ls[2] = {300, 10}, bs[1] = {300};
    float logits[3000];
    int32_t labels[300];
    for (int i = 0; i < 3000; i++) logits[i] = (float)(i % 13) * 0.25f;
    for (int i = 0; i < 300; i++) labels[i] = i % 10;
    labels[3] = 12; /* the first bad label: reported */
    labels[5] = -1;
    labels[290] = 10;
    kiln_tensor_t *x = NULL, *y = NULL, *loss = NULL, *good = NULL;
    KT_OK(kiln_tensor_from_host(dev, KILN_F32, 2, ls, logits, &x));
    KT_OK(kiln_tensor_from_host(dev, KILN_I32, 1, bs, labels, &y));
    KT_OK(kiln_tensor_cross_entropy(x, y, &loss));
    float value = 0.0f;
    KT_FAILS(kiln_tensor_read(loss, &value, sizeof value), KILN_INDEX_OUT_OF_RANGE,
             "kiln_tensor_cross_entropy: label 12 at position 3 is outside [0, 10)");
    /* Reported once: the value itself reads back (NaN, as documented). */
    KT_OK(kiln_tensor_read(loss, &value, sizeof value));
    ck_assert_msg(isnan(value), "%s: loss %g, expected NaN", kiln_device_name(dev), value);
    /* Through kiln_queue_finish too, and a negative label. */
    kiln_tensor_release(y);
    kiln_tensor_release(loss);
    labels[3] = 3;
    KT_OK(kiln_tensor_from_host(dev, KILN_I32, 1, bs, labels, &y));
    KT_OK(kiln_tensor_cross_entropy(x, y, &loss));
    KT_FAILS(kiln_queue_finish(kiln_device_current_queue(dev)), KILN_INDEX_OUT_OF_RANGE,
             "label -1 at position 5 is outside [0, 10)");
    KT_OK(kiln_queue_finish(kiln_device_current_queue(dev)));
    /* Every label in range: no report. */
    kiln_tensor_release(y);
    labels[5] = 5;
    labels[290] = 0;
    KT_OK(kiln_tensor_from_host(dev, KILN_I32, 1, bs, labels, &y));
    KT_OK(kiln_tensor_cross_entropy(x, y, &good));
    KT_OK(kiln_tensor_read(good, &value, sizeof value));
    ck_assert_msg(isfinite(value), "%s: loss %g, expected a number", kiln_device_name(dev), value);
    kiln_tensor_release(good);
    kiln_tensor_release(loss);
    kiln_tensor_release(y);
    kiln_tensor_release(x);
  }
}
END_TEST

/* ---- the rows -------------------------------------------------------------------------- */

static const kt_row_t kt_rows[] = {
    {.name = "softmax", .op = "softmax", .build = kt_build_softmax,
     .run = kt_run_softmax, .tol = kt_tol_softmax},
    {.name = "log_softmax", .op = "softmax", .build = kt_build_softmax,
     .run = kt_run_log_softmax, .tol = kt_tol_log_softmax},
    {.name = "log_softmax of large logits", .op = "softmax",
     .build = kt_build_log_softmax_large, .run = kt_run_log_softmax, .tol = kt_tol_relative,
     .expect = kt_expect_log_softmax},
    {.name = "cross_entropy", .op = "cross_entropy",
     .build = kt_build_cross_entropy, .run = kt_run_cross_entropy, .tol = kt_tol_cross_entropy},
    {.name = "conv2d", .op = "conv2d", .build = kt_build_conv2d,
     .run = kt_run_conv2d, .tol = kt_tol_conv2d},
    {.name = "max_pool2d", .op = "max_pool2d", .build = kt_build_max_pool2d,
     .run = kt_run_max_pool2d, .tol = kt_tol_exact},
};

static void kt_add_tests(TCase *tc) { tcase_add_test(tc, test_cross_entropy_label_report); }

const kt_group_t kt_group_nn = {
    .name = "neural-network operations",
    .rows = kt_rows,
    .n_rows = sizeof kt_rows / sizeof kt_rows[0],
    .add_tests = kt_add_tests,
};
