/* tests/conformance/updates.c: conformance rows of the training updates in place (accumulate, sgd, adam, and their mixed-precision forms) and of a loss scaler's unscale. */
#include "harness.h"

#include "kernels/dtype_convert.h"

/* ---- training: updates in place -------------------------------------------------------------
 * Several calls in a row on fresh tensors, then one of the updated tensors
 * compared (the row's sub: 0 the parameter, 1 SGD's buffer or Adam's m, 2
 * Adam's v), against cpu:0 and against the documented formula in double on
 * the host. Each run also checks what "in place" promises: the update lands
 * in the tensor's own memory (a view of it taken before sees it), the
 * operands it only reads are unchanged to the bit, and the device's pool
 * counts no allocation and no byte more. */

static kt_run_fn kt_run_accumulate, kt_run_sgd, kt_run_adam, kt_run_sgd_mixed, kt_run_adam_mixed, kt_run_unscale;

/* Element i of a host result of f32, f16 or bf16 (a gradient), in double. */
static double kt_at(const kt_result_t *r, int64_t i) {
  if (r->dtype == KILN_F32) return ((const float *)r->data)[i];
  const uint16_t bits = ((const uint16_t *)r->data)[i];
  return r->dtype == KILN_F16 ? kiln_dc_f16_to_f32(bits) : kiln_dc_bf16_to_f32(bits);
}

static const kt_shape_t kt_update_shapes[] = {
    {0, {0}, false, false},  {1, {0}, false, false},      {1, {1}, false, false},
    {1, {7}, false, false},  {2, {3, 5}, false, false},   {3, {2, 3, 4}, false, false},
    {1, {257}, false, true}, {2, {13, 257}, false, true}, {1, {262147}, false, true},
    {-1, {0}, false, false},
};

/* What the update must leave alone: input i still holds the values it was
 * made with. */
static void kt_check_untouched(const kt_case_t *c, kiln_device_t *dev, int i, const kiln_tensor_t *t,
                               const char *name) {
  const int64_t n = kt_numel(c->in[i].ndim, c->in[i].shape);
  float *made = malloc((size_t)(n > 0 ? n : 1) * 4), *now = malloc((size_t)(n > 0 ? n : 1) * 4);
  ck_assert(made && now);
  kt_fill(&c->in[i], made, n);
  kiln_status_t status = kiln_tensor_read(t, now, (size_t)n * 4);
  if (status != KILN_OK) {
    kt_fail("%s on %s: reading %s back failed with %s: %s", c->label, kiln_device_name(dev), name,
            kiln_status_name(status), kiln_last_error());
  } else {
    for (int64_t k = 0; k < n; k++) {
      if (memcmp(&made[k], &now[k], 4) != 0) {
        kt_fail("%s on %s: the update wrote into %s, which it only reads (element %lld: %.9g, was %.9g)", c->label,
                kiln_device_name(dev), name, (long long)k, (double)now[k], (double)made[k]);
        break;
      }
    }
  }
  free(made);
  free(now);
}

/* Before the calls: a flat view of the updated tensor (sharing its memory)
 * and the pool's counters. */
typedef struct kt_inplace_t {
  kiln_tensor_t *view;
  kiln_buffer_t *buffer;
  size_t offset;
  kiln_memory_stats_t before;
} kt_inplace_t;

static kiln_status_t kt_inplace_begin(kiln_device_t *dev, kiln_tensor_t *t, kt_inplace_t *state) {
  memset(state, 0, sizeof *state);
  const int64_t n = kiln_tensor_numel(t);
  state->buffer = kiln_tensor_buffer(t);
  state->offset = kiln_tensor_offset_bytes(t);
  kiln_status_t status = kiln_tensor_reshape(t, 1, &n, &state->view);
  if (status == KILN_OK) status = kiln_device_memory_stats(dev, &state->before);
  return status;
}

/* After the calls: nothing allocated, the tensor still in its memory, and
 * the view taken before reads what the tensor reads. */
static void kt_inplace_end(const kt_case_t *c, kiln_device_t *dev, kiln_tensor_t *t, kt_inplace_t *state,
                           const char *name) {
  kiln_memory_stats_t after;
  KT_OK(kiln_device_memory_stats(dev, &after));
  if (after.allocations != state->before.allocations || after.in_use_bytes != state->before.in_use_bytes)
    kt_fail("%s on %s: %d update call(s) allocated: %llu allocations and %llu bytes in use before, %llu and %llu "
            "after",
            c->label, kiln_device_name(dev), c->steps, (unsigned long long)state->before.allocations,
            (unsigned long long)state->before.in_use_bytes, (unsigned long long)after.allocations,
            (unsigned long long)after.in_use_bytes);
  if (kiln_tensor_buffer(t) != state->buffer || kiln_tensor_offset_bytes(t) != state->offset)
    kt_fail("%s on %s: %s moved to other memory", c->label, kiln_device_name(dev), name);
  const int64_t n = kiln_tensor_numel(t);
  float *a = malloc((size_t)(n > 0 ? n : 1) * 4), *b = malloc((size_t)(n > 0 ? n : 1) * 4);
  ck_assert(a && b);
  KT_OK(kiln_tensor_read(t, a, (size_t)n * 4));
  KT_OK(kiln_tensor_read(state->view, b, (size_t)n * 4));
  if (memcmp(a, b, (size_t)n * 4) != 0)
    kt_fail("%s on %s: a view of %s taken before the update does not see it", c->label, kiln_device_name(dev), name);
  free(a);
  free(b);
  kiln_tensor_release(state->view);
  state->view = NULL;
}

/* The tensor the row compares, retained into *out: by the row's sub, the
 * first input (a, param) or the state the update keeps (SGD's buffer in[2],
 * Adam's m and v in[2] and in[3]). */
static kiln_status_t kt_update_result(const kt_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  kiln_tensor_t *t = c->row->sub == 0 ? in[0] : in[c->row->sub + 1];
  *out = kiln_tensor_retain(t);
  return KILN_OK;
}

static void kt_update_case_label(kt_case_t *c, const char *what) {
  char a[160];
  kt_in_text(&c->in[0], a, sizeof a);
  static const char *const accumulate[] = {"a"}, *const sgd[] = {"param", "momentum_buf"},
                           *const adam[] = {"param", "m", "v"};
  const char *of = c->row->run == kt_run_accumulate                           ? accumulate[0]
                   : c->row->run == kt_run_sgd || c->row->run == kt_run_sgd_mixed ? sgd[c->row->sub]
                                                                                  : adam[c->row->sub];
  snprintf(c->label, sizeof c->label, "%s %s, %s, %d call(s) (%s compared)", c->row->name, a, what, c->steps, of);
}

/* accumulate: a += alpha * b, three times, over the update shapes. */
static void kt_build_accumulate(const kt_row_t *row) {
  static const double alphas[] = {1.0, -0.5, 0.0, 3.25};
  for (size_t k = 0; k < sizeof alphas / sizeof alphas[0]; k++) {
    for (const kt_shape_t *s = kt_update_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s) || (k > 1 && s->large)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      c.in[0] = kt_in(KILN_F32, KT_WIDE, 181, s->ndim, s->s, false);
      c.in[1] = kt_in(KILN_F32, KT_WIDE, 182, s->ndim, s->s, false);
      c.scalar = alphas[k];
      c.steps = 3;
      char what[64];
      snprintf(what, sizeof what, "alpha %g", c.scalar);
      kt_update_case_label(&c, what);
      kt_check(&c);
    }
  }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.steps = 1;
  c.scalar = 1;
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 1, 1, (const int64_t[]){4}, false);
  c.in[1] = kt_in(KILN_F32, KT_WIDE, 2, 1, (const int64_t[]){5}, false);
  snprintf(c.label, sizeof c.label, "accumulate a [4], b [5] (shapes differ)");
  kt_check(&c);
}

KT_RUN(kt_run_accumulate) {
  kt_inplace_t state;
  kiln_status_t status = kt_inplace_begin(dev, in[0], &state);
  for (int s = 0; s < c->steps && status == KILN_OK; s++) status = kiln_tensor_accumulate(in[0], c->scalar, in[1]);
  if (status != KILN_OK) {
    kiln_tensor_release(state.view);
    return status;
  }
  kt_inplace_end(c, dev, in[0], &state, "a");
  kt_check_untouched(c, dev, 1, in[1], "b");
  return kt_update_result(c, in, out);
}

static void kt_expect_accumulate(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, KILN_F32, in[0].ndim, in[0].shape);
  for (int64_t i = 0; i < out->numel; i++) {
    double a = ((const float *)in[0].data)[i];
    for (int s = 0; s < c->steps; s++) a += c->scalar * ((const float *)in[1].data)[i];
    ((float *)out->data)[i] = (float)a;
  }
}

/* A few roundings per call, of values up to 4 (and of differences of such
 * values, near zero: the absolute slack), over a few calls. */
static kt_tol_t kt_tol_update(const kt_case_t *c) {
  (void)c;
  kt_tol_t t = {1e-5, 2e-6, 8, false};
  return t;
}

static const struct {
  kiln_sgd_params_t p;
  bool with_buffer;
} kt_sgd_cases[] = {
    {{0.1, 0, 0, 0, false, false}, false},
    {{0.1, 0, 0, 0, false, false}, true}, /* momentum 0: the buffer given is left alone */
    {{0.05, 0.9, 0, 0, false, false}, true},
    {{0.05, 0.9, 0, 0.01, true, false}, true},
    {{0.01, 0.5, 0.25, 0.1, false, false}, true},
    {{0.5, 0, 1, 0.5, false, false}, false},
};

/* SGD: param in [-4, 4), grad in [-4, 4), the buffer in [-1, 1) (any state a
 * previous step may have left), three calls, over the update shapes. */
static void kt_build_sgd(const kt_row_t *row) {
  for (size_t k = 0; k < sizeof kt_sgd_cases / sizeof kt_sgd_cases[0]; k++) {
    if (row->sub == 1 && !kt_sgd_cases[k].with_buffer) continue;
    for (const kt_shape_t *s = kt_update_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s) || (k > 2 && s->large)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 3;
      c.in[0] = kt_in(KILN_F32, KT_WIDE, 191, s->ndim, s->s, false);
      c.in[1] = kt_in(KILN_F32, KT_WIDE, 192, s->ndim, s->s, false);
      c.in[2] = kt_in(KILN_F32, KT_SIGNED, 193, s->ndim, s->s, false);
      c.sgd = kt_sgd_cases[k].p;
      c.with_buffer = kt_sgd_cases[k].with_buffer;
      c.steps = 3;
      char what[160];
      snprintf(what, sizeof what, "lr %g, momentum %g, dampening %g, weight_decay %g%s%s", c.sgd.lr, c.sgd.momentum,
               c.sgd.dampening, c.sgd.weight_decay, c.sgd.nesterov ? ", nesterov" : "",
               c.with_buffer ? "" : ", no buffer");
      kt_update_case_label(&c, what);
      kt_check(&c);
    }
  }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 3;
  c.steps = 1;
  c.with_buffer = true;
  c.sgd = kt_sgd_cases[2].p;
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 1, 1, (const int64_t[]){4}, false);
  c.in[1] = kt_in(KILN_F32, KT_WIDE, 2, 1, (const int64_t[]){4}, false);
  c.in[2] = kt_in(KILN_F32, KT_WIDE, 3, 1, (const int64_t[]){5}, false);
  snprintf(c.label, sizeof c.label, "sgd_update param [4], grad [4], momentum_buf [5] (shapes differ)");
  kt_check(&c);
}

KT_RUN(kt_run_sgd) {
  kiln_tensor_t *buf = c->with_buffer ? in[2] : NULL;
  kt_inplace_t state, buf_state;
  kiln_status_t status = kt_inplace_begin(dev, in[0], &state);
  memset(&buf_state, 0, sizeof buf_state);
  if (status == KILN_OK && buf) status = kt_inplace_begin(dev, buf, &buf_state);
  for (int s = 0; s < c->steps && status == KILN_OK; s++) status = kiln_tensor_sgd_update(in[0], in[1], buf, &c->sgd);
  if (status != KILN_OK) {
    kiln_tensor_release(state.view);
    kiln_tensor_release(buf_state.view);
    return status;
  }
  /* The counters were read after both views were made. */
  if (buf) state.before = buf_state.before;
  kt_inplace_end(c, dev, in[0], &state, "param");
  if (buf) kt_inplace_end(c, dev, buf, &buf_state, "momentum_buf");
  kt_check_untouched(c, dev, 1, in[1], "grad");
  if (buf && c->sgd.momentum == 0) kt_check_untouched(c, dev, 2, buf, "momentum_buf (momentum 0)");
  return kt_update_result(c, in, out);
}

/* tensor.h's formula: g = grad + wd * param; buf = momentum * buf +
 * (1 - dampening) * g; param -= lr * (nesterov ? g + momentum * buf : buf),
 * buf = g without momentum. */
static void kt_expect_sgd(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, KILN_F32, in[0].ndim, in[0].shape);
  const kiln_sgd_params_t p = c->sgd;
  for (int64_t i = 0; i < out->numel; i++) {
    double param = ((const float *)in[0].data)[i], grad = kt_at(&in[1], i);
    double buf = ((const float *)in[2].data)[i];
    for (int s = 0; s < c->steps; s++) {
      double g = grad + p.weight_decay * param, step;
      if (p.momentum > 0) {
        buf = p.momentum * buf + (1 - p.dampening) * g;
        step = p.nesterov ? g + p.momentum * buf : buf;
      } else {
        step = g;
      }
      param -= p.lr * step;
    }
    ((float *)out->data)[i] = (float)(c->row->sub == 1 ? buf : param);
  }
}

static const struct {
  kiln_adam_params_t p;
  int64_t step0;
} kt_adam_cases[] = {
    {{1e-3, 0.9, 0.999, 1e-8, 0}, 1},
    {{0.01, 0.5, 0.75, 1e-3, 0.1}, 1},
    {{0.1, 0, 0, 1e-6, 0}, 1},           /* betas 0: no averaging, no correction */
    {{0.01, 0.9, 0.999, 1e-8, 0.01}, 1000}, /* late steps: corrections near 1 */
};

/* Adam: param and grad in [-4, 4), m in [-1, 1), v in [1/64, 4] (a state
 * earlier steps may have left), three calls from the case's step, over the
 * update shapes. */
static void kt_build_adam(const kt_row_t *row) {
  for (size_t k = 0; k < sizeof kt_adam_cases / sizeof kt_adam_cases[0]; k++) {
    for (const kt_shape_t *s = kt_update_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s) || (k > 1 && s->large)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 4;
      c.in[0] = kt_in(KILN_F32, KT_WIDE, 201, s->ndim, s->s, false);
      c.in[1] = kt_in(KILN_F32, KT_WIDE, 202, s->ndim, s->s, false);
      c.in[2] = kt_in(KILN_F32, KT_SIGNED, 203, s->ndim, s->s, false);
      c.in[3] = kt_in(KILN_F32, KT_POSITIVE, 204, s->ndim, s->s, false);
      c.adam = kt_adam_cases[k].p;
      c.step0 = kt_adam_cases[k].step0;
      c.steps = 3;
      char what[160];
      snprintf(what, sizeof what, "lr %g, betas %g %g, eps %g, weight_decay %g, from step %lld", c.adam.lr,
               c.adam.beta1, c.adam.beta2, c.adam.eps, c.adam.weight_decay, (long long)c.step0);
      kt_update_case_label(&c, what);
      kt_check(&c);
    }
  }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 4;
  c.steps = 1;
  c.step0 = 1;
  c.adam = kt_adam_cases[0].p;
  for (int i = 0; i < 4; i++) c.in[i] = kt_in(KILN_F32, KT_POSITIVE, 1 + (uint32_t)i, 1, (const int64_t[]){4}, false);
  c.in[3].shape[0] = 3;
  snprintf(c.label, sizeof c.label, "adam_update param [4], grad [4], m [4], v [3] (shapes differ)");
  kt_check(&c);
}

KT_RUN(kt_run_adam) {
  kt_inplace_t state[3];
  memset(state, 0, sizeof state);
  kiln_status_t status = KILN_OK;
  const int updated[3] = {0, 2, 3};
  for (int i = 0; i < 3 && status == KILN_OK; i++) status = kt_inplace_begin(dev, in[updated[i]], &state[i]);
  for (int s = 0; s < c->steps && status == KILN_OK; s++)
    status = kiln_tensor_adam_update(in[0], in[1], in[2], in[3], c->step0 + s, &c->adam);
  if (status != KILN_OK) {
    for (int i = 0; i < 3; i++) kiln_tensor_release(state[i].view);
    return status;
  }
  static const char *const names[3] = {"param", "m", "v"};
  for (int i = 0; i < 3; i++) {
    state[i].before = state[2].before;
    kt_inplace_end(c, dev, in[updated[i]], &state[i], names[i]);
  }
  kt_check_untouched(c, dev, 1, in[1], "grad");
  return kt_update_result(c, in, out);
}

/* tensor.h's formula, torch.optim.Adam's: g = grad + wd * param; m = b1 m +
 * (1 - b1) g; v = b2 v + (1 - b2) g^2; param -= lr * (m / c1) / (sqrt(v / c2)
 * + eps), c = 1 - beta^step. */
static void kt_expect_adam(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, KILN_F32, in[0].ndim, in[0].shape);
  const kiln_adam_params_t p = c->adam;
  for (int64_t i = 0; i < out->numel; i++) {
    double param = ((const float *)in[0].data)[i], grad = kt_at(&in[1], i);
    double m = ((const float *)in[2].data)[i], v = ((const float *)in[3].data)[i];
    for (int s = 0; s < c->steps; s++) {
      const double step = (double)(c->step0 + s);
      const double c1 = 1 - pow(p.beta1, step), c2 = 1 - pow(p.beta2, step);
      const double g = grad + p.weight_decay * param;
      m = p.beta1 * m + (1 - p.beta1) * g;
      v = p.beta2 * v + (1 - p.beta2) * g * g;
      param -= p.lr * (m / c1) / (sqrt(v / c2) + p.eps);
    }
    ((float *)out->data)[i] = (float)(c->row->sub == 0 ? param : c->row->sub == 1 ? m : v);
  }
}

/* ---- mixed precision: 16-bit gradients, and the 16-bit copy --------------------------
 * The SGD and Adam cases again with the gradient in f16 or bf16 and a copy
 * of that dtype (the last input): the parameter is compared with the
 * formula (of the gradient widened exactly), and the copy must hold the bits
 * of kiln_tensor_cast of the updated parameter. */

static const kiln_dtype_t kt_half_dtypes[] = {KILN_BF16, KILN_F16};

/* The copy is the parameter rounded once: every bit of it. */
static void kt_check_copy(const kt_case_t *c, kiln_device_t *dev, kiln_tensor_t *param, kiln_tensor_t *copy) {
  kiln_tensor_t *want = NULL;
  KT_OK(kiln_tensor_cast(param, kiln_tensor_dtype(copy), &want));
  const int64_t n = kiln_tensor_numel(param);
  uint16_t *a = malloc((size_t)(n > 0 ? n : 1) * 2), *b = malloc((size_t)(n > 0 ? n : 1) * 2);
  ck_assert(a && b);
  KT_OK(kiln_tensor_read(copy, a, (size_t)n * 2));
  KT_OK(kiln_tensor_read(want, b, (size_t)n * 2));
  for (int64_t k = 0; k < n; k++) {
    if (a[k] != b[k]) {
      kt_fail("%s on %s: the %s copy's element %lld is 0x%04x; the updated parameter rounded is 0x%04x", c->label,
              kiln_device_name(dev), kiln_dtype_name(kiln_tensor_dtype(copy)), (long long)k, a[k], b[k]);
      break;
    }
  }
  free(a);
  free(b);
  kiln_tensor_release(want);
}

static void kt_build_sgd_mixed(const kt_row_t *row) {
  for (size_t d = 0; d < sizeof kt_half_dtypes / sizeof kt_half_dtypes[0]; d++) {
    for (size_t k = 0; k < sizeof kt_sgd_cases / sizeof kt_sgd_cases[0]; k++) {
      if (row->sub == 1 && !kt_sgd_cases[k].with_buffer) continue;
      for (const kt_shape_t *s = kt_update_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s) || (k > 2 && s->large) || (k == 1 || k == 4)) continue;
        kt_case_t c = kt_case(row);
        c.n_in = 4;
        c.in[0] = kt_in(KILN_F32, KT_WIDE, 191, s->ndim, s->s, false);
        c.in[1] = kt_in(kt_half_dtypes[d], KT_WIDE, 192, s->ndim, s->s, false);
        c.in[2] = kt_in(KILN_F32, KT_SIGNED, 193, s->ndim, s->s, false);
        c.in[3] = kt_in(kt_half_dtypes[d], KT_WIDE, 194, s->ndim, s->s, false);
        c.sgd = kt_sgd_cases[k].p;
        c.with_buffer = kt_sgd_cases[k].with_buffer;
        c.steps = 3;
        char what[160];
        snprintf(what, sizeof what, "%s gradient and copy, lr %g, momentum %g, weight_decay %g%s%s",
                 kiln_dtype_name(kt_half_dtypes[d]), c.sgd.lr, c.sgd.momentum, c.sgd.weight_decay,
                 c.sgd.nesterov ? ", nesterov" : "", c.with_buffer ? "" : ", no buffer");
        kt_update_case_label(&c, what);
        kt_check(&c);
      }
    }
  }
  /* A copy of f32 is no low-precision copy. */
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 4;
  c.steps = 1;
  c.with_buffer = true;
  c.sgd = kt_sgd_cases[2].p;
  for (int i = 0; i < 4; i++) c.in[i] = kt_in(KILN_F32, KT_WIDE, 1 + (uint32_t)i, 1, (const int64_t[]){4}, false);
  snprintf(c.label, sizeof c.label, "sgd_update_mixed param [4], grad [4], momentum_buf [4], copy [4] f32");
  kt_check(&c);
}

/* The bytes of t, to check after the calls that they are unchanged. */
static void *kt_snapshot(const kiln_tensor_t *t, size_t *bytes) {
  *bytes = (size_t)kiln_tensor_numel(t) * kiln_dtype_size(kiln_tensor_dtype(t));
  void *host = malloc(*bytes ? *bytes : 1);
  ck_assert(host);
  KT_OK(kiln_tensor_read(t, host, *bytes));
  return host;
}

static void kt_check_snapshot(const kt_case_t *c, kiln_device_t *dev, const kiln_tensor_t *t, void *before,
                              size_t bytes, const char *name) {
  void *now = kt_snapshot(t, &bytes);
  if (memcmp(before, now, bytes) != 0)
    kt_fail("%s on %s: the update wrote into %s, which it only reads", c->label, kiln_device_name(dev), name);
  free(now);
  free(before);
}

KT_RUN(kt_run_sgd_mixed) {
  kiln_tensor_t *buf = c->with_buffer ? in[2] : NULL;
  kiln_status_t status = KILN_OK;
  size_t bytes = 0;
  void *grad = kt_snapshot(in[1], &bytes);
  for (int s = 0; s < c->steps && status == KILN_OK; s++)
    status = kiln_tensor_sgd_update_mixed(in[0], in[1], buf, in[3], &c->sgd);
  if (status != KILN_OK) {
    free(grad);
    return status;
  }
  kt_check_copy(c, dev, in[0], in[3]);
  kt_check_snapshot(c, dev, in[1], grad, bytes, "grad");
  return kt_update_result(c, in, out);
}

static void kt_build_adam_mixed(const kt_row_t *row) {
  for (size_t d = 0; d < sizeof kt_half_dtypes / sizeof kt_half_dtypes[0]; d++) {
    for (size_t k = 0; k < sizeof kt_adam_cases / sizeof kt_adam_cases[0]; k++) {
      for (const kt_shape_t *s = kt_update_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s) || (k > 1 && s->large)) continue;
        kt_case_t c = kt_case(row);
        c.n_in = 5;
        c.in[0] = kt_in(KILN_F32, KT_WIDE, 201, s->ndim, s->s, false);
        c.in[1] = kt_in(kt_half_dtypes[d], KT_WIDE, 202, s->ndim, s->s, false);
        c.in[2] = kt_in(KILN_F32, KT_SIGNED, 203, s->ndim, s->s, false);
        c.in[3] = kt_in(KILN_F32, KT_POSITIVE, 204, s->ndim, s->s, false);
        c.in[4] = kt_in(kt_half_dtypes[d], KT_WIDE, 205, s->ndim, s->s, false);
        c.adam = kt_adam_cases[k].p;
        c.step0 = kt_adam_cases[k].step0;
        c.steps = 3;
        char what[160];
        snprintf(what, sizeof what, "%s gradient and copy, lr %g, betas %g %g, weight_decay %g, from step %lld",
                 kiln_dtype_name(kt_half_dtypes[d]), c.adam.lr, c.adam.beta1, c.adam.beta2, c.adam.weight_decay,
                 (long long)c.step0);
        kt_update_case_label(&c, what);
        kt_check(&c);
      }
    }
  }
  /* The copy of another shape. */
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 5;
  c.steps = 1;
  c.step0 = 1;
  c.adam = kt_adam_cases[0].p;
  for (int i = 0; i < 4; i++) c.in[i] = kt_in(KILN_F32, KT_POSITIVE, 1 + (uint32_t)i, 1, (const int64_t[]){4}, false);
  c.in[4] = kt_in(KILN_BF16, KT_POSITIVE, 5, 1, (const int64_t[]){3}, false);
  snprintf(c.label, sizeof c.label, "adam_update_mixed param [4], grad [4], m [4], v [4], copy [3] bf16");
  kt_check(&c);
}

KT_RUN(kt_run_adam_mixed) {
  kiln_status_t status = KILN_OK;
  size_t bytes = 0;
  void *grad = kt_snapshot(in[1], &bytes);
  for (int s = 0; s < c->steps && status == KILN_OK; s++)
    status = kiln_tensor_adam_update_mixed(in[0], in[1], in[2], in[3], in[4], c->step0 + s, &c->adam);
  if (status != KILN_OK) {
    free(grad);
    return status;
  }
  kt_check_copy(c, dev, in[0], in[4]);
  kt_check_snapshot(c, dev, in[1], grad, bytes, "grad");
  return kt_update_result(c, in, out);
}

/* ---- unscale ------------------------------------------------------------------------------
 * out = grad * scale in f32, compared; and the flag, checked in the run: a
 * finite gradient leaves it as it was (0.25 here), and the same gradient
 * with one infinity or NaN planted sets it to 1. */

static void kt_build_unscale(const kt_row_t *row) {
  static const kiln_dtype_t dtypes[] = {KILN_F32, KILN_BF16, KILN_F16};
  static const double scales[] = {1.0 / 65536, 0.5, 3.0};
  for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
    for (size_t k = 0; k < sizeof scales / sizeof scales[0]; k++) {
      for (const kt_shape_t *s = kt_update_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s) || kt_numel(s->ndim, s->s) == 0 || (k > 0 && s->large)) continue;
        kt_case_t c = kt_case(row);
        c.n_in = 1;
        c.in[0] = kt_in(dtypes[d], KT_WIDE, 211, s->ndim, s->s, false);
        c.scalar = scales[k];
        c.steps = (int)k; /* where the poison goes: first, middle, last */
        char a[160];
        kt_in_text(&c.in[0], a, sizeof a);
        snprintf(c.label, sizeof c.label, "unscale %s, scale %g", a, c.scalar);
        kt_check(&c);
      }
    }
  }
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 1;
  c.scalar = 1;
  c.in[0] = kt_in(KILN_I32, KT_WIDE, 1, 1, (const int64_t[]){4}, false);
  snprintf(c.label, sizeof c.label, "unscale of an i32 gradient");
  kt_check(&c);
}

/* grad's values with element `at` made inf (even case) or NaN (odd), as a
 * tensor of grad's dtype on dev. */
static kiln_status_t kt_poisoned(kiln_device_t *dev, const kiln_tensor_t *grad, int64_t at, bool nan,
                                 kiln_tensor_t **out) {
  const int64_t n = kiln_tensor_numel(grad);
  kiln_tensor_t *wide = NULL, *host = NULL;
  float *v = malloc((size_t)n * 4);
  if (!v) return KILN_OUT_OF_MEMORY;
  kiln_status_t status = kiln_tensor_cast(grad, KILN_F32, &wide);
  if (status == KILN_OK) status = kiln_tensor_read(wide, v, (size_t)n * 4);
  if (status == KILN_OK) {
    v[at] = nan ? NAN : -INFINITY;
    status = kiln_tensor_from_host(dev, KILN_F32, kiln_tensor_ndim(grad), kiln_tensor_shape(grad), v, &host);
  }
  if (status == KILN_OK) status = kiln_tensor_cast(host, kiln_tensor_dtype(grad), out);
  kiln_tensor_release(wide);
  kiln_tensor_release(host);
  free(v);
  return status;
}

static void kt_check_flag(const kt_case_t *c, kiln_device_t *dev, kiln_tensor_t *flag, float want, const char *what) {
  float got = 0;
  KT_OK(kiln_tensor_read(flag, &got, sizeof got));
  if (memcmp(&got, &want, sizeof got) != 0)
    kt_fail("%s on %s: found_inf is %g after %s; it should be %g", c->label, kiln_device_name(dev), (double)got, what,
            (double)want);
}

KT_RUN(kt_run_unscale) {
  kiln_tensor_t *flag = NULL, *poisoned = NULL, *ignored = NULL;
  kiln_status_t status = kiln_tensor_full(dev, KILN_F32, 0, NULL, 0.25, &flag);
  if (status == KILN_OK) status = kiln_tensor_unscale(in[0], c->scalar, flag, out);
  if (status == KILN_OK) {
    kt_check_flag(c, dev, flag, 0.25f, "a finite gradient (it must stay as it was)");
    const int64_t n = kiln_tensor_numel(in[0]);
    const int64_t at = c->steps == 0 ? 0 : c->steps == 1 ? n / 2 : n - 1;
    KT_OK(kt_poisoned(dev, in[0], at, (n & 1) != 0, &poisoned));
    kiln_tensor_release(flag);
    flag = NULL;
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 0, NULL, &flag));
    KT_OK(kiln_tensor_unscale(poisoned, c->scalar, flag, &ignored));
    char what[96];
    snprintf(what, sizeof what, "a gradient with %s at element %lld", (n & 1) ? "NaN" : "-inf", (long long)at);
    kt_check_flag(c, dev, flag, 1.0f, what);
  }
  kiln_tensor_release(flag);
  kiln_tensor_release(poisoned);
  kiln_tensor_release(ignored);
  return status;
}

static void kt_expect_unscale(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  kt_result_alloc(out, KILN_F32, in[0].ndim, in[0].shape);
  const float scale = (float)c->scalar;
  for (int64_t i = 0; i < out->numel; i++) ((float *)out->data)[i] = (float)(kt_at(&in[0], i) * (double)scale);
}

/* ---- the rows -------------------------------------------------------------------------- */

static const kt_row_t kt_rows[] = {
    /* training: updates in place, each tensor they write compared */
    {.name = "accumulate", .op = "accumulate", .build = kt_build_accumulate,
     .run = kt_run_accumulate, .tol = kt_tol_update, .expect = kt_expect_accumulate},
    {.name = "sgd_update", .op = "sgd_update", .build = kt_build_sgd,
     .run = kt_run_sgd, .tol = kt_tol_update, .expect = kt_expect_sgd, .sub = 0},
    {.name = "sgd_update", .op = "sgd_update", .build = kt_build_sgd,
     .run = kt_run_sgd, .tol = kt_tol_update, .expect = kt_expect_sgd, .sub = 1},
    {.name = "adam_update", .op = "adam_update", .build = kt_build_adam,
     .run = kt_run_adam, .tol = kt_tol_update, .expect = kt_expect_adam, .sub = 0},
    {.name = "adam_update", .op = "adam_update", .build = kt_build_adam,
     .run = kt_run_adam, .tol = kt_tol_update, .expect = kt_expect_adam, .sub = 1},
    {.name = "adam_update", .op = "adam_update", .build = kt_build_adam,
     .run = kt_run_adam, .tol = kt_tol_update, .expect = kt_expect_adam, .sub = 2},
    /* mixed precision: the parameter compared, the copy checked in the run */
    {.name = "sgd_update_mixed", .op = "sgd_update", .build = kt_build_sgd_mixed,
     .run = kt_run_sgd_mixed, .tol = kt_tol_update, .expect = kt_expect_sgd, .sub = 0},
    {.name = "adam_update_mixed", .op = "adam_update", .build = kt_build_adam_mixed,
     .run = kt_run_adam_mixed, .tol = kt_tol_update, .expect = kt_expect_adam, .sub = 0},
    /* a loss scaler's check and unscale */
    {.name = "unscale", .op = "unscale", .build = kt_build_unscale,
     .run = kt_run_unscale, .tol = kt_tol_exact, .expect = kt_expect_unscale},
};

const kt_group_t kt_group_updates = {
    .name = "training: updates",
    .rows = kt_rows,
    .n_rows = sizeof kt_rows / sizeof kt_rows[0],
};
