/* tests/nn/test_nn_tape.c: the tape's gradients against central differences for every recorded op, and its rules (what is recorded, when, and what a backward pass leaves). */
#include <math.h>

#include "nn_test.h"

/* ---- the cases ------------------------------------------------------------------------ */

/* How a parameter's values are drawn: uniform in [lo, hi), or with |x| in
 * [0.1, 1) and a random sign (away from kinks at 0), or distinct steps of
 * 0.05 in a shuffled order (no ties, for max pooling), or `near` the first
 * parameter plus +-[0.1, 0.5) (maximum and minimum without ties). */
typedef enum kt_draw_t { KT_UNIFORM, KT_AWAY, KT_DISTINCT, KT_NEAR } kt_draw_t;

typedef struct kt_spec_t {
  int ndim;
  int64_t shape[4];
  kt_draw_t draw;
  float lo, hi;
} kt_spec_t;

typedef kiln_status_t (*kt_build_fn)(kiln_nn_tape_t *tape, kiln_tensor_t **v, kiln_tensor_t **out);

typedef struct kt_case_t {
  const char *name;
  kt_build_fn build;
  int nparams;
  kt_spec_t p[3];
} kt_case_t;

#define KT_U(...) {sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}, KT_UNIFORM, -1, 1}
#define KT_R(lo_, hi_, ...) {sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}, KT_UNIFORM, lo_, hi_}
#define KT_A(...) {sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}, KT_AWAY, 0, 0}
#define KT_D(...) {sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}, KT_DISTINCT, 0, 0}
#define KT_N(...) {sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}, KT_NEAR, 0, 0}

static kiln_device_t *kt_dev(void) { return kt_nn_cpu(); }

#define UNARY_BUILD(NAME, OP)                                                                   \
  static kiln_status_t NAME(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) { \
    return kiln_nn_tape_unary(t, OP, v[0], out);                                              \
  }
UNARY_BUILD(b_neg, KILN_UNARY_NEG)
UNARY_BUILD(b_abs, KILN_UNARY_ABS)
UNARY_BUILD(b_exp, KILN_UNARY_EXP)
UNARY_BUILD(b_log, KILN_UNARY_LOG)
UNARY_BUILD(b_sqrt, KILN_UNARY_SQRT)
UNARY_BUILD(b_relu, KILN_UNARY_RELU)
UNARY_BUILD(b_sigmoid, KILN_UNARY_SIGMOID)
UNARY_BUILD(b_tanh, KILN_UNARY_TANH)

#define BINARY_BUILD(NAME, OP)                                                                  \
  static kiln_status_t NAME(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) { \
    return kiln_nn_tape_binary(t, OP, v[0], v[1], out);                                       \
  }
BINARY_BUILD(b_add, KILN_BINARY_ADD)
BINARY_BUILD(b_sub, KILN_BINARY_SUB)
BINARY_BUILD(b_mul, KILN_BINARY_MUL)
BINARY_BUILD(b_div, KILN_BINARY_DIV)
BINARY_BUILD(b_maximum, KILN_BINARY_MAXIMUM)
BINARY_BUILD(b_minimum, KILN_BINARY_MINIMUM)

#define SCALAR_BUILD(NAME, OP, S)                                                               \
  static kiln_status_t NAME(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) { \
    return kiln_nn_tape_binary_scalar(t, OP, v[0], S, out);                                   \
  }
SCALAR_BUILD(b_add_s, KILN_BINARY_ADD, 1.5)
SCALAR_BUILD(b_sub_s, KILN_BINARY_SUB, 0.5)
SCALAR_BUILD(b_mul_s, KILN_BINARY_MUL, -2.5)
SCALAR_BUILD(b_div_s, KILN_BINARY_DIV, 4.0)
SCALAR_BUILD(b_max_s, KILN_BINARY_MAXIMUM, 0.0)
SCALAR_BUILD(b_min_s, KILN_BINARY_MINIMUM, 0.0)

#define MATMUL_BUILD(NAME, TA, TB)                                                              \
  static kiln_status_t NAME(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) { \
    return kiln_nn_tape_matmul(t, v[0], v[1], TA, TB, out);                                   \
  }
MATMUL_BUILD(b_mm, false, false)
MATMUL_BUILD(b_mm_ta, true, false)
MATMUL_BUILD(b_mm_tb, false, true)
MATMUL_BUILD(b_mm_tab, true, true)

static kiln_status_t b_linear(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  return kiln_nn_tape_linear(t, v[0], v[1], v[2], out);
}

/* x a constant: dx is not computed, dW and db are. */
static kiln_status_t b_linear_const_x(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  kiln_tensor_t *x = NULL;
  kiln_status_t s = kiln_tensor_uniform(kt_dev(), 2, (int64_t[]){5, 4}, 77, -1, 1, &x);
  if (s == KILN_OK) s = kiln_nn_tape_linear(t, x, v[0], v[1], out);
  kiln_tensor_release(x);
  return s;
}

#define REDUCE_BUILD(NAME, FN, AXIS, KEEP)                                                      \
  static kiln_status_t NAME(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) { \
    return FN(t, v[0], AXIS, KEEP, out);                                                      \
  }
REDUCE_BUILD(b_sum0, kiln_nn_tape_sum, 0, false)
REDUCE_BUILD(b_sum_last_keep, kiln_nn_tape_sum, -1, true)
REDUCE_BUILD(b_sum_all, kiln_nn_tape_sum, KILN_ALL_AXES, false)
REDUCE_BUILD(b_mean1, kiln_nn_tape_mean, 1, false)
REDUCE_BUILD(b_mean_all_keep, kiln_nn_tape_mean, KILN_ALL_AXES, true)

static kiln_status_t b_softmax(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  return kiln_nn_tape_softmax(t, v[0], out);
}
static kiln_status_t b_log_softmax(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  return kiln_nn_tape_log_softmax(t, v[0], out);
}

static kiln_tensor_t *kt_labels(const int32_t *values, int64_t n) {
  kiln_tensor_t *labels = NULL;
  KT_OK(kiln_tensor_from_host(kt_dev(), KILN_I32, 1, &n, values, &labels));
  return labels;
}

static kiln_status_t b_cross_entropy(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  kiln_tensor_t *labels = kt_labels((const int32_t[]){0, 3, 1, 4}, 4);
  kiln_status_t s = kiln_nn_tape_cross_entropy(t, v[0], labels, out);
  kiln_tensor_release(labels);
  return s;
}

static kiln_status_t b_conv_pad_stride(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  kiln_conv2d_params_t c = kiln_conv2d_params_default();
  c.padding[0] = c.padding[1] = 1;
  c.stride[0] = c.stride[1] = 2;
  return kiln_nn_tape_conv2d(t, v[0], v[1], v[2], &c, out);
}

static kiln_status_t b_conv_plain(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  return kiln_nn_tape_conv2d(t, v[0], v[1], NULL, NULL, out);
}

static kiln_status_t b_pool2(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  const kiln_pool2d_params_t p = {{2, 2}, {0, 0}, {0, 0}};
  return kiln_nn_tape_max_pool2d(t, v[0], &p, out);
}

/* Windows overlap: a winner of two windows gets both gradients. */
static kiln_status_t b_pool3_overlap(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  const kiln_pool2d_params_t p = {{3, 3}, {2, 2}, {1, 1}};
  return kiln_nn_tape_max_pool2d(t, v[0], &p, out);
}

static kiln_status_t b_reshape(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  return kiln_nn_tape_reshape(t, v[0], 2, (int64_t[]){3, 4}, out);
}

/* index_select with a repeated and a negative index: the gradient adds
 * both repeats' slices into one row (kiln_tensor_index_add). */
static kiln_status_t b_index_select(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out, int axis) {
  const int64_t entries[5] = {2, 0, -1, 2, 1}, n = 5;
  kiln_tensor_t *index = NULL;
  kiln_status_t s = kiln_tensor_from_host(kt_dev(), KILN_I64, 1, &n, entries, &index);
  if (s == KILN_OK) s = kiln_nn_tape_index_select(t, v[0], axis, index, out);
  kiln_tensor_release(index);
  return s;
}
static kiln_status_t b_index_select0(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  return b_index_select(t, v, out, 0);
}
static kiln_status_t b_index_select1(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  return b_index_select(t, v, out, 1);
}

/* exp(x * x + x): one result used twice by one op, and again by another. */
static kiln_status_t b_reuse(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  kiln_tensor_t *sq = NULL, *sum = NULL;
  kiln_status_t s = kiln_nn_tape_binary(t, KILN_BINARY_MUL, v[0], v[0], &sq);
  if (s == KILN_OK) s = kiln_nn_tape_binary(t, KILN_BINARY_ADD, sq, v[0], &sum);
  if (s == KILN_OK) s = kiln_nn_tape_unary(t, KILN_UNARY_EXP, sum, out);
  kiln_tensor_release(sq);
  kiln_tensor_release(sum);
  return s;
}

/* (a w) w: a parameter used by two ops; (h + h): a gradient handed to both operands. */
static kiln_status_t b_param_twice(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  kiln_tensor_t *h = NULL, *hh = NULL;
  kiln_status_t s = kiln_nn_tape_matmul(t, v[0], v[1], false, false, &h);
  if (s == KILN_OK) s = kiln_nn_tape_binary(t, KILN_BINARY_ADD, h, h, &hh);
  if (s == KILN_OK) s = kiln_nn_tape_matmul(t, hh, v[1], false, true, out);
  kiln_tensor_release(h);
  kiln_tensor_release(hh);
  return s;
}

/* linear, tanh, linear, cross-entropy: a small classifier end to end. */
static kiln_status_t b_mlp(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  kiln_tensor_t *x = NULL, *h = NULL, *a = NULL, *logits = NULL;
  kiln_tensor_t *labels = kt_labels((const int32_t[]){2, 0, 1, 2, 1}, 5);
  kiln_status_t s = kiln_tensor_uniform(kt_dev(), 2, (int64_t[]){5, 6}, 5, -1, 1, &x);
  if (s == KILN_OK) s = kiln_nn_tape_linear(t, x, v[0], v[1], &h);
  if (s == KILN_OK) s = kiln_nn_tape_unary(t, KILN_UNARY_TANH, h, &a);
  if (s == KILN_OK) s = kiln_nn_tape_linear(t, a, v[2], NULL, &logits);
  if (s == KILN_OK) s = kiln_nn_tape_cross_entropy(t, logits, labels, out);
  kiln_tensor_release(x);
  kiln_tensor_release(h);
  kiln_tensor_release(a);
  kiln_tensor_release(logits);
  kiln_tensor_release(labels);
  return s;
}

/* conv, sigmoid, pool, flatten, linear, log_softmax: the CNN path. */
static kiln_status_t b_cnn(kiln_nn_tape_t *t, kiln_tensor_t **v, kiln_tensor_t **out) {
  const kiln_pool2d_params_t p = {{2, 2}, {0, 0}, {0, 0}};
  kiln_tensor_t *c = NULL, *a = NULL, *m = NULL, *f = NULL;
  kiln_status_t s = kiln_nn_tape_conv2d(t, v[0], v[1], v[2], NULL, &c);
  if (s == KILN_OK) s = kiln_nn_tape_unary(t, KILN_UNARY_SIGMOID, c, &a);
  if (s == KILN_OK) s = kiln_nn_tape_max_pool2d(t, a, &p, &m);
  if (s == KILN_OK) s = kiln_nn_tape_reshape(t, m, 2, (int64_t[]){2, -1}, &f);
  if (s == KILN_OK) s = kiln_nn_tape_log_softmax(t, f, out);
  kiln_tensor_release(c);
  kiln_tensor_release(a);
  kiln_tensor_release(m);
  kiln_tensor_release(f);
  return s;
}

static const kt_case_t kt_cases[] = {
    {"neg", b_neg, 1, {KT_U(3, 4)}},
    {"abs", b_abs, 1, {KT_A(3, 4)}},
    {"exp", b_exp, 1, {KT_U(3, 4)}},
    {"log", b_log, 1, {KT_R(0.5f, 2.0f, 3, 4)}},
    {"sqrt", b_sqrt, 1, {KT_R(0.5f, 2.0f, 3, 4)}},
    {"relu", b_relu, 1, {KT_A(3, 4)}},
    {"sigmoid", b_sigmoid, 1, {KT_R(-2, 2, 3, 4)}},
    {"tanh", b_tanh, 1, {KT_R(-2, 2, 3, 4)}},
    {"add, b broadcast over rows", b_add, 2, {KT_U(3, 4), KT_U(4)}},
    {"sub, b broadcast over columns", b_sub, 2, {KT_U(3, 4), KT_U(3, 1)}},
    {"mul, b [1, 4]", b_mul, 2, {KT_U(3, 4), KT_U(1, 4)}},
    {"div", b_div, 2, {KT_U(3, 4), KT_R(0.5f, 2.0f, 3, 4)}},
    {"maximum", b_maximum, 2, {KT_U(3, 4), KT_N(3, 4)}},
    {"minimum", b_minimum, 2, {KT_U(3, 4), KT_N(3, 4)}},
    {"add scalar", b_add_s, 1, {KT_U(3, 4)}},
    {"sub scalar", b_sub_s, 1, {KT_U(3, 4)}},
    {"mul scalar", b_mul_s, 1, {KT_U(3, 4)}},
    {"div scalar", b_div_s, 1, {KT_U(3, 4)}},
    {"maximum scalar", b_max_s, 1, {KT_A(3, 4)}},
    {"minimum scalar", b_min_s, 1, {KT_A(3, 4)}},
    {"matmul", b_mm, 2, {KT_U(3, 4), KT_U(4, 5)}},
    {"matmul trans_a", b_mm_ta, 2, {KT_U(4, 3), KT_U(4, 5)}},
    {"matmul trans_b", b_mm_tb, 2, {KT_U(3, 4), KT_U(5, 4)}},
    {"matmul trans_a trans_b", b_mm_tab, 2, {KT_U(4, 3), KT_U(5, 4)}},
    {"matmul batched, b 2-D", b_mm, 2, {KT_U(2, 3, 4), KT_U(4, 5)}},
    {"matmul batched, a 2-D", b_mm, 2, {KT_U(3, 4), KT_U(2, 4, 5)}},
    {"matmul batched both, trans_b", b_mm_tb, 2, {KT_U(2, 3, 4), KT_U(2, 5, 4)}},
    {"linear", b_linear, 3, {KT_U(5, 4), KT_U(3, 4), KT_U(3)}},
    {"linear, x constant", b_linear_const_x, 2, {KT_U(3, 4), KT_U(3)}},
    {"sum axis 0", b_sum0, 1, {KT_U(3, 4)}},
    {"sum axis -1 keepdim", b_sum_last_keep, 1, {KT_U(2, 3, 4)}},
    {"sum all", b_sum_all, 1, {KT_U(3, 4)}},
    {"mean axis 1", b_mean1, 1, {KT_U(2, 3, 4)}},
    {"mean all keepdim", b_mean_all_keep, 1, {KT_U(3, 4)}},
    {"softmax", b_softmax, 1, {KT_R(-2, 2, 3, 5)}},
    {"log_softmax", b_log_softmax, 1, {KT_R(-2, 2, 3, 5)}},
    {"cross_entropy", b_cross_entropy, 1, {KT_R(-2, 2, 4, 5)}},
    {"conv2d pad 1 stride 2", b_conv_pad_stride, 3, {KT_U(2, 2, 5, 5), KT_U(3, 2, 3, 3), KT_U(3)}},
    {"conv2d without bias", b_conv_plain, 2, {KT_U(1, 2, 4, 5), KT_U(2, 2, 2, 3)}},
    {"max_pool2d 2x2", b_pool2, 1, {KT_D(1, 2, 4, 4)}},
    {"max_pool2d 3x3 stride 2 pad 1", b_pool3_overlap, 1, {KT_D(1, 1, 5, 5)}},
    {"reshape", b_reshape, 1, {KT_U(2, 6)}},
    {"index_select axis 0, repeats", b_index_select0, 1, {KT_U(4, 3)}},
    {"index_select axis 1, repeats", b_index_select1, 1, {KT_U(2, 3, 2)}},
    {"a result used twice", b_reuse, 1, {KT_R(-0.5f, 0.5f, 3, 4)}},
    {"a parameter used twice", b_param_twice, 2, {KT_R(-0.5f, 0.5f, 3, 3), KT_R(-0.5f, 0.5f, 3, 3)}},
    {"linear, tanh, linear, cross-entropy", b_mlp, 3, {KT_U(4, 6), KT_U(4), KT_U(3, 4)}},
    {"conv, sigmoid, pool, flatten, log_softmax", b_cnn, 3, {KT_U(2, 1, 4, 4), KT_U(2, 1, 3, 3), KT_U(2)}},
};
enum { KT_CASES = sizeof kt_cases / sizeof *kt_cases };

/* ---- the harness ------------------------------------------------------------------------ */

static int64_t kt_numel(const kt_spec_t *s) {
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
  return n;
}

static void kt_draw(const kt_case_t *c, float **values, uint64_t seed) {
  uint64_t state = seed * 2654435761u + 1;
  for (int i = 0; i < c->nparams; i++) {
    const kt_spec_t *s = &c->p[i];
    int64_t n = kt_numel(s);
    for (int64_t j = 0; j < n; j++) {
      double u = (double)(kt_nn_rand(&state) >> 11) / 9007199254740992.0;
      double sign = (kt_nn_rand(&state) & 1) ? 1 : -1;
      switch (s->draw) {
      case KT_UNIFORM: values[i][j] = (float)(s->lo + (s->hi - s->lo) * u); break;
      case KT_AWAY: values[i][j] = (float)(sign * (0.1 + 0.9 * u)); break;
      case KT_NEAR: values[i][j] = values[0][j] + (float)(sign * (0.1 + 0.4 * u)); break;
      case KT_DISTINCT: values[i][j] = (float)(0.05 * (double)j - 0.5); break;
      }
    }
    if (s->draw == KT_DISTINCT) /* shuffled, still distinct */
      for (int64_t j = n - 1; j > 0; j--) {
        int64_t k = (int64_t)(kt_nn_rand(&state) % (uint64_t)(j + 1));
        float t = values[i][j];
        values[i][j] = values[i][k];
        values[i][k] = t;
      }
  }
}

/* loss = sum(build(params) * r) for a fixed random r; with a tape, the
 * parameters' gradients land in grads (host). */
static double kt_loss(const kt_case_t *c, float **values, float **grads) {
  kiln_nn_param_t *params[3] = {NULL, NULL, NULL};
  kiln_tensor_t *v[3] = {NULL, NULL, NULL};
  kiln_nn_tape_t *tape = NULL;
  if (grads) KT_OK(kiln_nn_tape_create(&tape));
  for (int i = 0; i < c->nparams; i++) {
    kiln_tensor_t *t = NULL;
    KT_OK(kiln_tensor_from_host(kt_dev(), KILN_F32, c->p[i].ndim, c->p[i].shape, values[i], &t));
    KT_OK(kiln_nn_param_create("p", t, &params[i]));
    kiln_tensor_release(t);
    KT_OK(kiln_nn_tape_watch(tape, params[i], &v[i]));
  }
  kiln_tensor_t *y = NULL, *r = NULL, *yr = NULL, *loss = NULL;
  KT_OK(c->build(tape, v, &y));
  KT_OK(kiln_tensor_uniform(kt_dev(), kiln_tensor_ndim(y), kiln_tensor_shape(y), 99, -1, 1, &r));
  KT_OK(kiln_nn_tape_binary(tape, KILN_BINARY_MUL, y, r, &yr));
  KT_OK(kiln_nn_tape_sum(tape, yr, KILN_ALL_AXES, false, &loss));
  if (tape) {
    KT_OK(kiln_nn_tape_backward(tape, loss, NULL));
    ck_assert_uint_eq(kiln_nn_tape_size(tape), 0);
    for (int i = 0; i < c->nparams; i++) {
      kiln_tensor_t *g = kiln_nn_param_grad(params[i]);
      ck_assert_msg(g != NULL, "%s: parameter %d got no gradient", c->name, i);
      ck_assert_int_eq(kiln_tensor_numel(g), kt_numel(&c->p[i]));
      KT_OK(kiln_tensor_read(g, grads[i], (size_t)kt_numel(&c->p[i]) * sizeof(float)));
    }
  }
  double value = 0;
  KT_OK(kiln_tensor_item(loss, &value));
  kiln_tensor_release(y);
  kiln_tensor_release(r);
  kiln_tensor_release(yr);
  kiln_tensor_release(loss);
  kiln_nn_tape_free(tape);
  for (int i = 0; i < c->nparams; i++) kiln_nn_param_free(params[i]);
  return value;
}

START_TEST(test_gradients_match_central_differences) {
  const kt_case_t *c = &kt_cases[_i];
  float *values[3] = {NULL, NULL, NULL}, *grads[3] = {NULL, NULL, NULL};
  for (int i = 0; i < c->nparams; i++) {
    values[i] = calloc((size_t)kt_numel(&c->p[i]), sizeof(float));
    grads[i] = calloc((size_t)kt_numel(&c->p[i]), sizeof(float));
  }
  kt_draw(c, values, (uint64_t)_i + 1);
  kt_loss(c, values, grads);
  /* f32 losses: a step of 1e-2 keeps the rounding of the difference near
   * 1e-4, and the cases' second derivatives small enough. */
  const float eps = 1e-2f;
  for (int i = 0; i < c->nparams; i++)
    for (int64_t j = 0; j < kt_numel(&c->p[i]); j++) {
      const float keep = values[i][j];
      values[i][j] = keep + eps;
      double up = kt_loss(c, values, NULL);
      values[i][j] = keep - eps;
      double down = kt_loss(c, values, NULL);
      values[i][j] = keep;
      double numeric = (up - down) / (2.0 * eps);
      double tol = 3e-3 + 1e-2 * fabs(numeric);
      ck_assert_msg(fabs(grads[i][j] - numeric) <= tol,
                    "%s: d loss / d param %d [%lld]: tape %.6g, central difference %.6g", c->name, i, (long long)j,
                    (double)grads[i][j], numeric);
    }
  for (int i = 0; i < c->nparams; i++) {
    free(values[i]);
    free(grads[i]);
  }
}
END_TEST

/* ---- the tape's rules -------------------------------------------------------------------- */

static kiln_nn_param_t *kt_param(const char *name, int ndim, const int64_t *shape, uint64_t seed) {
  kiln_tensor_t *t = NULL;
  kiln_nn_param_t *p = NULL;
  KT_OK(kiln_tensor_uniform(kt_dev(), ndim, shape, seed, -1, 1, &t));
  KT_OK(kiln_nn_param_create(name, t, &p));
  kiln_tensor_release(t);
  return p;
}

static void kt_read(const kiln_tensor_t *t, float *out, size_t n) { KT_OK(kiln_tensor_read(t, out, n * sizeof(float))); }

START_TEST(test_only_what_carries_a_gradient_is_recorded) {
  kiln_nn_tape_t *tape = NULL;
  KT_OK(kiln_nn_tape_create(&tape));
  kiln_tensor_t *x = NULL, *y = NULL, *z = NULL, *w = NULL, *u = NULL;
  KT_OK(kiln_tensor_uniform(kt_dev(), 2, (int64_t[]){2, 3}, 1, -1, 1, &x));
  /* Constants only: computed, not recorded, and no gradient to ask for. */
  KT_OK(kiln_nn_tape_unary(tape, KILN_UNARY_EXP, x, &y));
  ck_assert_uint_eq(kiln_nn_tape_size(tape), 0);
  KT_FAILS(kiln_nn_tape_backward(tape, y, NULL), KILN_INVALID_ARGUMENT, "not a result recorded on this tape");
  kiln_nn_param_t *p = kt_param("w", 2, (int64_t[]){2, 3}, 2);
  KT_OK(kiln_nn_tape_watch(tape, p, &w));
  KT_OK(kiln_nn_tape_watch(tape, p, &w)); /* twice is harmless */
  ck_assert_ptr_eq(w, kiln_nn_param_value(p));
  KT_OK(kiln_nn_tape_binary(tape, KILN_BINARY_MUL, x, w, &z));
  ck_assert_uint_eq(kiln_nn_tape_size(tape), 1);
  /* eq is a constant whatever its inputs. */
  KT_OK(kiln_nn_tape_binary(tape, KILN_BINARY_EQ, z, x, &u));
  ck_assert_uint_eq(kiln_nn_tape_size(tape), 1);
  /* More than one element needs dy. */
  KT_FAILS(kiln_nn_tape_backward(tape, z, NULL), KILN_INVALID_ARGUMENT, "pass dy of y's shape");
  /* dy of y's shape but another dtype: refused before anything runs. */
  kiln_tensor_t *dy_int = NULL;
  KT_OK(kiln_tensor_ones(kt_dev(), KILN_I32, 2, (int64_t[]){2, 3}, &dy_int));
  KT_FAILS(kiln_nn_tape_backward(tape, z, dy_int), KILN_DTYPE_MISMATCH, "dy is i32 and y f32; pass dy of y's dtype");
  kiln_tensor_release(dy_int);
  ck_assert_uint_eq(kiln_nn_tape_size(tape), 1);
  /* dz = exp(x) given as dy: dw = exp(x) * x. */
  KT_OK(kiln_nn_tape_backward(tape, z, y));
  ck_assert_uint_eq(kiln_nn_tape_size(tape), 0);
  float xs[6], ys[6], gs[6];
  kt_read(x, xs, 6);
  kt_read(y, ys, 6);
  kt_read(kiln_nn_param_grad(p), gs, 6);
  for (int i = 0; i < 6; i++) ck_assert_float_eq_tol(gs[i], xs[i] * ys[i], 1e-6f);
  kiln_tensor_release(x);
  kiln_tensor_release(y);
  kiln_tensor_release(z);
  kiln_tensor_release(u);
  kiln_nn_param_free(p);
  kiln_nn_tape_free(tape);
}
END_TEST

START_TEST(test_gradients_add_up_until_zeroed) {
  kiln_nn_param_t *p = kt_param("w", 1, (int64_t[]){5}, 3);
  kiln_nn_tape_t *tape = NULL;
  KT_OK(kiln_nn_tape_create(&tape));
  float first[5], twice[5], thrice[5];
  for (int round = 0; round < 3; round++) {
    kiln_tensor_t *w = NULL, *sq = NULL, *s = NULL;
    KT_OK(kiln_nn_tape_watch(tape, p, &w));
    KT_OK(kiln_nn_tape_binary(tape, KILN_BINARY_MUL, w, w, &sq));
    KT_OK(kiln_nn_tape_sum(tape, sq, KILN_ALL_AXES, false, &s));
    KT_OK(kiln_nn_tape_backward(tape, s, NULL));
    kt_read(kiln_nn_param_grad(p), round == 0 ? first : round == 1 ? twice : thrice, 5);
    kiln_tensor_release(sq);
    kiln_tensor_release(s);
  }
  float w[5];
  kt_read(kiln_nn_param_value(p), w, 5);
  for (int i = 0; i < 5; i++) {
    ck_assert_float_eq_tol(first[i], 2 * w[i], 1e-6f);
    ck_assert_float_eq_tol(twice[i], 4 * w[i], 1e-6f);
    ck_assert_float_eq_tol(thrice[i], 6 * w[i], 1e-6f);
  }
  kiln_nn_param_zero_grad(p);
  ck_assert_ptr_null(kiln_nn_param_grad(p));
  kiln_nn_param_free(p);
  kiln_nn_tape_free(tape);
}
END_TEST

START_TEST(test_without_a_tape_the_same_values) {
  kiln_device_t *dev = kt_dev();
  kiln_nn_layer_t *layer = NULL;
  KT_OK(kiln_nn_linear_create(dev, 4, 3, true, 9, &layer));
  kiln_tensor_t *x = NULL, *a = NULL, *b = NULL;
  KT_OK(kiln_tensor_uniform(dev, 2, (int64_t[]){2, 4}, 4, -1, 1, &x));
  kiln_nn_tape_t *tape = NULL;
  KT_OK(kiln_nn_tape_create(&tape));
  KT_OK(kiln_nn_layer_forward(layer, tape, x, &a));
  ck_assert_uint_eq(kiln_nn_tape_size(tape), 1);
  KT_OK(kiln_nn_layer_forward(layer, NULL, x, &b));
  float va[6], vb[6];
  kt_read(a, va, 6);
  kt_read(b, vb, 6);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(va[i], vb[i]);
  /* Dropped without a backward pass: no gradient appears. */
  kiln_nn_tape_clear(tape);
  ck_assert_uint_eq(kiln_nn_tape_size(tape), 0);
  ck_assert_ptr_null(kiln_nn_param_grad(kiln_nn_layer_param(layer, 0)));
  kiln_tensor_release(x);
  kiln_tensor_release(a);
  kiln_tensor_release(b);
  kiln_nn_tape_free(tape);
  kiln_nn_layer_free(layer);
}
END_TEST

START_TEST(test_operands_on_two_devices_fail_and_record_nothing) {
  kiln_config_t config;
  kiln_config_initialize(&config);
  config.backend = "cpu";
  config.cpu_devices = 2;
  KT_OK(kiln_initialize(&config));
  kiln_device_t *d0 = NULL, *d1 = NULL;
  KT_OK(kiln_device_get(0, &d0));
  KT_OK(kiln_device_get(1, &d1));
  kiln_nn_layer_t *layer = NULL;
  KT_OK(kiln_nn_linear_create(d0, 4, 3, true, 1, &layer));
  kiln_tensor_t *x = NULL, *y = NULL;
  KT_OK(kiln_tensor_uniform(d1, 2, (int64_t[]){2, 4}, 4, -1, 1, &x));
  kiln_nn_tape_t *tape = NULL;
  KT_OK(kiln_nn_tape_create(&tape));
  KT_FAILS(kiln_nn_layer_forward(layer, tape, x, &y), KILN_DEVICE_MISMATCH, "kiln_nn_tape_linear");
  ck_assert_ptr_null(y);
  ck_assert_uint_eq(kiln_nn_tape_size(tape), 0);
  /* A model refuses a layer on another device. */
  kiln_nn_model_t *model = NULL;
  kiln_nn_layer_t *other = NULL;
  KT_OK(kiln_nn_model_create(&model));
  KT_OK(kiln_nn_model_add(model, layer));
  KT_OK(kiln_nn_linear_create(d1, 3, 2, true, 1, &other));
  KT_FAILS(kiln_nn_model_add(model, other), KILN_DEVICE_MISMATCH, "create it on cpu:0");
  kiln_tensor_release(x);
  kiln_nn_tape_free(tape);
  kiln_nn_model_free(model);
}
END_TEST

int main(void) {
  kt_private_cache_dir();
  Suite *s = suite_create("nn_tape");
  TCase *tc = tcase_create("gradients");
  tcase_set_timeout(tc, 600);
  tcase_add_loop_test(tc, test_gradients_match_central_differences, 0, KT_CASES);
  suite_add_tcase(s, tc);
  TCase *rules = tcase_create("rules");
  tcase_add_test(rules, test_only_what_carries_a_gradient_is_recorded);
  tcase_add_test(rules, test_gradients_add_up_until_zeroed);
  tcase_add_test(rules, test_without_a_tape_the_same_values);
  tcase_add_test(rules, test_operands_on_two_devices_fail_and_record_nothing);
  suite_add_tcase(s, rules);
  int failed = kt_run_suite(s);
  kiln_deinitialize();
  return failed;
}
