/* tests/test_grad.c: gradients against finite differences and PyTorch on every device; update loops that allocate nothing after their first iteration. */
/*
 * Three kinds of check, each on every device under test:
 *
 * Finite differences. For each backward operation, a scalar function of the
 * forward's inputs, L = sum(w * f(inputs)) with fixed random weights w, whose
 * gradient kiln computes by calling the backward operation with dy = w. It
 * is compared, element by element, with central differences
 * (L(x + h e_k) - L(x - h e_k)) / 2h computed two ways:
 *   - "host": f written again in this file in double precision and
 *     evaluated at kiln's float inputs, with h = 1e-3. Truncation costs
 *     h^2/6 |f'''|, about 2e-7 relative for these functions and inputs, and
 *     rounding 1e-16 |L| / h, nothing: the difference is the exact gradient
 *     to ~1e-6, and the tolerance measures kiln's float32 alone. A backward
 *     element is a float sum of at most a few dozen products here, good to a
 *     few 1e-7 relative (of the largest term), so kiln must be within
 *     1e-4 |fd| + 1e-5 max|fd| (+ 1e-7 where the gradient is 0): ten to a
 *     hundred times the float32 error, while a wrong index, stride, padding
 *     or tie rule is off by a whole term, >= 1e-2 of max|fd| here.
 *   - "device": kiln's own forward in float32 on the device, the steps
 *     h = 2^-6 (2^-5 for the cross-entropy's mean) added to inputs that are
 *     multiples of 2^-10 below 8, so x +- h are exact floats; L summed in
 *     double. Rounding of the forward's float results (a few ulps of the
 *     outputs one input reaches) divided by 2h is ~1e-4 of the gradient, and
 *     truncation h^2/6 |f'''| ~1e-5: kiln must be within 2e-3 |fd| + 2e-3
 *     max|fd|. Looser, but it ties each device's backward to the same
 *     device's forward (the same strides, padding and dilation).
 * Inputs of the non-smooth functions keep away from their kinks by far more
 * than 2h: relu and abs inputs have |x| >= 0.25, max-pooling windows hold
 * distinct values 1/16 apart. (Ties are the PyTorch files' job.)
 *
 * PyTorch. The files in tests/grad/, written by tests/grad/make_references.py with
 * Debian's python3-torch (its header describes the format): fixed inputs,
 * the upstream gradient, and the forward's result and gradients torch
 * computed in float64. kiln's, on each device, must be within
 * 1e-4 |expected| + 1e-5 max|expected| (+ 1e-6 absolute for updates) of
 * them. The directory is KG_REFERENCE_DIR (set by meson), or
 * KILN_GRAD_REFERENCES when set.
 *
 * Memory. kiln_device_memory_stats reports in-use, pooled and peak bytes;
 * a training loop (a gradient computed and released each iteration,
 * accumulated, then SGD with momentum and Adam) keeps its allocation count
 * and bytes in use constant after its first iteration, and updates alone
 * allocate nothing at all.
 *
 * Environment: KILN_GRAD_BACKEND=<name> tests only that backend's devices
 * (exit 77 when it has none); KILN_GRAD_SMALL=1 leaves out the device's
 * own differences, two forward calls per input element, for simulators such
 * as Oclgrind (every backward kernel still runs, on every case).
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>

#include "common.h"

#ifndef KG_REFERENCE_DIR
#define KG_REFERENCE_DIR "tests/grad"
#endif

#define KG_MAX_DEVICES 64

static kiln_device_t *kg_devs[KG_MAX_DEVICES];
static size_t kg_ndev;
static unsigned long kg_checked; /* gradient elements compared, for the summary */
static bool kg_small;            /* KILN_GRAD_SMALL: no device differences (simulators) */

/* ---- host tensors ------------------------------------------------------------------------ */

/* Values on the host, as doubles (f32 inputs hold floats exactly; i32 labels
 * hold integers). */
typedef struct kg_host_t {
  kiln_dtype_t dtype;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t n;
  double *v;
} kg_host_t;

static void kg_host_init(kg_host_t *h, kiln_dtype_t dtype, int ndim, const int64_t *shape) {
  memset(h, 0, sizeof *h);
  h->dtype = dtype;
  h->ndim = ndim;
  h->n = 1;
  for (int i = 0; i < ndim; i++) {
    h->shape[i] = shape[i];
    h->n *= shape[i];
  }
  h->v = calloc((size_t)(h->n > 0 ? h->n : 1), sizeof *h->v);
  ck_assert_ptr_nonnull(h->v);
}

static void kg_host_free(kg_host_t *h) {
  free(h->v);
  h->v = NULL;
}

static kiln_status_t kg_upload(kiln_device_t *dev, const kg_host_t *h, kiln_tensor_t **out) {
  void *data = malloc((size_t)(h->n > 0 ? h->n : 1) * 4);
  if (!data) return KILN_OUT_OF_MEMORY;
  for (int64_t i = 0; i < h->n; i++) {
    if (h->dtype == KILN_I32)
      ((int32_t *)data)[i] = (int32_t)h->v[i];
    else
      ((float *)data)[i] = (float)h->v[i];
  }
  kiln_status_t status = kiln_tensor_from_host(dev, h->dtype, h->ndim, h->shape, data, out);
  free(data);
  return status;
}

static void kg_shape_text(int ndim, const int64_t *shape, char *out, size_t size) {
  size_t used = (size_t)snprintf(out, size, "[");
  for (int i = 0; i < ndim && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (used < size) snprintf(out + used, size - used, "]");
}

/* Read an f32 tensor into `values` (numel doubles), checking its shape. */
static void kg_download(const char *label, kiln_device_t *dev, kiln_tensor_t *t, int ndim, const int64_t *shape,
                        double *values) {
  ck_assert_msg(kiln_tensor_dtype(t) == KILN_F32, "%s on %s: the result is %s, expected f32", label,
                kiln_device_name(dev), kiln_dtype_name(kiln_tensor_dtype(t)));
  ck_assert_msg(kiln_tensor_device(t) == dev, "%s on %s: the result lives on %s", label, kiln_device_name(dev),
                kiln_device_name(kiln_tensor_device(t)));
  bool same = kiln_tensor_ndim(t) == ndim;
  for (int i = 0; same && i < ndim; i++) same = kiln_tensor_shape(t)[i] == shape[i];
  if (!same) {
    char have[160], want[160];
    kg_shape_text(kiln_tensor_ndim(t), kiln_tensor_shape(t), have, sizeof have);
    kg_shape_text(ndim, shape, want, sizeof want);
    ck_abort_msg("%s on %s: the result is %s, expected %s", label, kiln_device_name(dev), have, want);
  }
  int64_t n = kiln_tensor_numel(t);
  float *f = malloc((size_t)(n > 0 ? n : 1) * 4);
  ck_assert_ptr_nonnull(f);
  KT_OK(kiln_tensor_read(t, f, (size_t)n * 4));
  for (int64_t i = 0; i < n; i++) values[i] = f[i];
  free(f);
}

/* Deterministic values: splitmix64 from a seed. */
static uint64_t kg_next(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Multiples of 2^-10 in [lo, hi). */
static void kg_fill(kg_host_t *h, uint64_t seed, double lo, double hi) {
  uint64_t s = seed;
  const int64_t steps = (int64_t)((hi - lo) * 1024.0);
  for (int64_t i = 0; i < h->n; i++) h->v[i] = lo + (double)(int64_t)(kg_next(&s) % (uint64_t)steps) / 1024.0;
}

/* Multiples of 2^-10 with 0.25 <= |x| < hi: away from the kinks of relu, abs. */
static void kg_fill_away(kg_host_t *h, uint64_t seed, double hi) {
  kg_fill(h, seed, 0.25, hi);
  uint64_t s = seed ^ 0x5555;
  for (int64_t i = 0; i < h->n; i++)
    if (kg_next(&s) & 1) h->v[i] = -h->v[i];
}

/* A permutation of (k - n/2) / 16: distinct values 1/16 apart. */
static void kg_fill_distinct(kg_host_t *h, uint64_t seed) {
  uint64_t s = seed;
  for (int64_t i = 0; i < h->n; i++) h->v[i] = (double)(i - h->n / 2) / 16.0;
  for (int64_t i = h->n - 1; i > 0; i--) {
    int64_t j = (int64_t)(kg_next(&s) % (uint64_t)(i + 1));
    double t = h->v[i];
    h->v[i] = h->v[j];
    h->v[j] = t;
  }
}

/* ---- cases ------------------------------------------------------------------------------ */

typedef struct kg_case_t kg_case_t;
/* f on the host in double: in[] as the case's inputs (one perturbed), out
 * the result (of the shape of c->w). */
typedef void kg_forward_fn(const kg_case_t *c, double *const *in, double *out);
/* f on the device. */
typedef kiln_status_t kg_device_fn(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out);
/* The gradient of sum(dy * f) with respect to in[wrt], by kiln. */
typedef kiln_status_t kg_grad_fn(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                 kiln_tensor_t **out);

struct kg_case_t {
  char label[256];
  int n_in;
  kg_host_t in[3];
  int wrt;       /* the input differentiated */
  kg_host_t w;   /* the weights: dy, of the shape of f's result */
  kg_forward_fn *forward;
  kg_device_fn *device_forward;
  kg_grad_fn *grad;
  double h_device; /* the device differences' step */
  /* parameters of f */
  int op;
  bool log;
  bool dloss;    /* cross-entropy: pass w as dloss (else NULL, and w is 1) */
  kiln_conv2d_params_t conv;
  kiln_pool2d_params_t pool;
  int to_ndim;   /* sum_to, broadcast_to: the shape f goes to */
  int64_t to_shape[KILN_MAX_DIMS];
};

static double kg_weighted(const kg_host_t *w, const double *out) {
  double sum = 0;
  for (int64_t j = 0; j < w->n; j++) sum += w->v[j] * out[j];
  return sum;
}

static bool kg_close(double got, double want, double rtol, double atol) {
  return fabs(got - want) <= rtol * fabs(want) + atol;
}

/* Compare `got` with `want`, element by element; assert on the first miss. */
static void kg_compare(const char *label, const char *what, kiln_device_t *dev, const double *got, const double *want,
                       int64_t n, double rtol, double atol_of_max, double atol) {
  double max = 0;
  for (int64_t i = 0; i < n; i++) max = fmax(max, fabs(want[i]));
  const double slack = atol_of_max * max + atol;
  for (int64_t i = 0; i < n; i++) {
    kg_checked++;
    ck_assert_msg(kg_close(got[i], want[i], rtol, slack),
                  "%s on %s: element %lld is %.9g, %s says %.9g (difference %.3g; tolerance %g |expected| + %.3g, "
                  "largest |expected| %.6g)",
                  label, kiln_device_name(dev), (long long)i, got[i], what, want[i], fabs(got[i] - want[i]), rtol,
                  slack, max);
  }
}

/* The gradient kiln computes on `dev` for case c, as doubles (numel of in[wrt]). */
static double *kg_kiln_gradient(const kg_case_t *c, kiln_device_t *dev) {
  kiln_tensor_t *in[3] = {NULL, NULL, NULL}, *dy = NULL, *g = NULL;
  for (int i = 0; i < c->n_in; i++) KT_OK(kg_upload(dev, &c->in[i], &in[i]));
  KT_OK(kg_upload(dev, &c->w, &dy));
  kiln_clear_error();
  kiln_status_t status = c->grad(c, in, dy, &g);
  ck_assert_msg(status == KILN_OK, "%s on %s: the gradient failed with %s: %s", c->label, kiln_device_name(dev),
                kiln_status_name(status), kiln_last_error());
  const kg_host_t *x = &c->in[c->wrt];
  double *got = malloc((size_t)(x->n > 0 ? x->n : 1) * sizeof *got);
  ck_assert_ptr_nonnull(got);
  kg_download(c->label, dev, g, x->ndim, x->shape, got);
  kiln_tensor_release(g);
  kiln_tensor_release(dy);
  for (int i = 0; i < 3; i++) kiln_tensor_release(in[i]);
  return got;
}

/* Central differences of the host forward in double. */
static double *kg_host_differences(const kg_case_t *c) {
  const double h = 1e-3;
  double *in[3] = {NULL, NULL, NULL};
  for (int i = 0; i < c->n_in; i++) {
    in[i] = malloc((size_t)(c->in[i].n > 0 ? c->in[i].n : 1) * sizeof(double));
    ck_assert_ptr_nonnull(in[i]);
    memcpy(in[i], c->in[i].v, (size_t)c->in[i].n * sizeof(double));
  }
  double *out = calloc((size_t)(c->w.n > 0 ? c->w.n : 1), sizeof *out);
  double *fd = malloc((size_t)(c->in[c->wrt].n > 0 ? c->in[c->wrt].n : 1) * sizeof *fd);
  ck_assert(out && fd);
  double *x = in[c->wrt];
  for (int64_t k = 0; k < c->in[c->wrt].n; k++) {
    const double saved = x[k];
    x[k] = saved + h;
    c->forward(c, in, out);
    const double plus = kg_weighted(&c->w, out);
    x[k] = saved - h;
    c->forward(c, in, out);
    const double minus = kg_weighted(&c->w, out);
    x[k] = saved;
    fd[k] = (plus - minus) / (2 * h);
  }
  free(out);
  for (int i = 0; i < 3; i++) free(in[i]);
  return fd;
}

/* L on the device from the inputs in host form (in[wrt] perturbed). */
static double kg_device_loss(const kg_case_t *c, kiln_device_t *dev, kiln_tensor_t *const *fixed, const kg_host_t *x) {
  kiln_tensor_t *in[3] = {fixed[0], fixed[1], fixed[2]}, *moved = NULL, *y = NULL;
  KT_OK(kg_upload(dev, x, &moved));
  in[c->wrt] = moved;
  kiln_clear_error();
  kiln_status_t status = c->device_forward(c, in, &y);
  ck_assert_msg(status == KILN_OK, "%s on %s: the forward failed with %s: %s", c->label, kiln_device_name(dev),
                kiln_status_name(status), kiln_last_error());
  double *out = malloc((size_t)(c->w.n > 0 ? c->w.n : 1) * sizeof *out);
  ck_assert_ptr_nonnull(out);
  kg_download(c->label, dev, y, c->w.ndim, c->w.shape, out);
  const double loss = kg_weighted(&c->w, out);
  free(out);
  kiln_tensor_release(y);
  kiln_tensor_release(moved);
  return loss;
}

/* Central differences of kiln's float forward on `dev`. */
static double *kg_device_differences(const kg_case_t *c, kiln_device_t *dev) {
  kiln_tensor_t *fixed[3] = {NULL, NULL, NULL};
  for (int i = 0; i < c->n_in; i++)
    if (i != c->wrt) KT_OK(kg_upload(dev, &c->in[i], &fixed[i]));
  kg_host_t x = c->in[c->wrt];
  x.v = malloc((size_t)(x.n > 0 ? x.n : 1) * sizeof *x.v);
  double *fd = malloc((size_t)(x.n > 0 ? x.n : 1) * sizeof *fd);
  ck_assert(x.v && fd);
  memcpy(x.v, c->in[c->wrt].v, (size_t)x.n * sizeof *x.v);
  for (int64_t k = 0; k < x.n; k++) {
    const double saved = x.v[k];
    const float up = (float)(saved + c->h_device), down = (float)(saved - c->h_device);
    x.v[k] = up;
    const double plus = kg_device_loss(c, dev, fixed, &x);
    x.v[k] = down;
    const double minus = kg_device_loss(c, dev, fixed, &x);
    x.v[k] = saved;
    fd[k] = (plus - minus) / ((double)up - (double)down);
  }
  free(x.v);
  for (int i = 0; i < 3; i++) kiln_tensor_release(fixed[i]);
  return fd;
}

/* Run case c on every device under test, then free it. */
static void kg_run_case(kg_case_t *c) {
  double *host = kg_host_differences(c);
  for (size_t d = 0; d < kg_ndev; d++) {
    double *got = kg_kiln_gradient(c, kg_devs[d]);
    const int64_t n = c->in[c->wrt].n;
    kg_compare(c->label, "host finite differences in double", kg_devs[d], got, host, n, 1e-4, 1e-5, 1e-7);
    if (c->device_forward && c->h_device > 0 && !kg_small) {
      double *dev_fd = kg_device_differences(c, kg_devs[d]);
      kg_compare(c->label, "finite differences of the device's own forward", kg_devs[d], got, dev_fd, n, 2e-3, 2e-3,
                 1e-5);
      free(dev_fd);
    }
    free(got);
  }
  free(host);
  for (int i = 0; i < c->n_in; i++) kg_host_free(&c->in[i]);
  kg_host_free(&c->w);
}

static void kg_case_init(kg_case_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kg_case_init(kg_case_t *c, const char *fmt, ...) {
  memset(c, 0, sizeof *c);
  va_list args;
  va_start(args, fmt);
  vsnprintf(c->label, sizeof c->label, fmt, args);
  va_end(args);
  c->h_device = 1.0 / 64;
}

/* The weights: random in [-1, 1), of the forward's result shape. */
static void kg_weights(kg_case_t *c, int ndim, const int64_t *shape, uint64_t seed) {
  kg_host_init(&c->w, KILN_F32, ndim, shape);
  kg_fill(&c->w, seed, -1, 1);
}

/* ---- unary ---------------------------------------------------------------------------------- */

static double kg_unary(int op, double x) {
  switch ((kiln_unary_op_t)op) {
    case KILN_UNARY_NEG: return -x;
    case KILN_UNARY_ABS: return fabs(x);
    case KILN_UNARY_EXP: return exp(x);
    case KILN_UNARY_LOG: return log(x);
    case KILN_UNARY_SQRT: return sqrt(x);
    case KILN_UNARY_RELU: return x < 0 ? 0 : x;
    case KILN_UNARY_SIGMOID: return 1 / (1 + exp(-x));
    case KILN_UNARY_TANH: return tanh(x);
    default: return NAN;
  }
}

static void kg_forward_unary(const kg_case_t *c, double *const *in, double *out) {
  for (int64_t i = 0; i < c->in[0].n; i++) out[i] = kg_unary(c->op, in[0][i]);
}

static kiln_status_t kg_device_unary(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  return kiln_tensor_unary((kiln_unary_op_t)c->op, in[0], out);
}

static kiln_status_t kg_grad_unary(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                   kiln_tensor_t **out) {
  return kiln_tensor_unary_backward((kiln_unary_op_t)c->op, in[0], dy, out);
}

static const char *const kg_unary_names[] = {
#define KG_NAME_(NAME, name) #name,
    KILN_UNARY_OPS(KG_NAME_)
#undef KG_NAME_
};

START_TEST(test_unary_backward) {
  const int64_t shapes[][3] = {{1, 1, 0}, {3, 7, 0}, {2, 3, 5}};
  const int ndims[] = {1, 2, 3};
  for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
    for (int s = 0; s < 3; s++) {
      kg_case_t c;
      kg_case_init(&c, "unary_backward(%s), x of %d dims [%lld, ...]", kg_unary_names[op], ndims[s],
                   (long long)shapes[s][0]);
      c.n_in = 1;
      c.op = op;
      kg_host_init(&c.in[0], KILN_F32, ndims[s], shapes[s]);
      if (op == KILN_UNARY_LOG || op == KILN_UNARY_SQRT)
        kg_fill(&c.in[0], 11 + (uint64_t)op, 0.25, 3);
      else
        kg_fill_away(&c.in[0], 11 + (uint64_t)op, 2);
      kg_weights(&c, ndims[s], shapes[s], 12);
      c.forward = kg_forward_unary;
      c.device_forward = kg_device_unary;
      c.grad = kg_grad_unary;
      kg_run_case(&c);
    }
  }
}
END_TEST

/* ---- softmax, cross-entropy ------------------------------------------------------------------ */

static void kg_softmax_rows(const double *x, double *y, int64_t rows, int64_t cols, bool log_form) {
  for (int64_t r = 0; r < rows; r++) {
    double m = -INFINITY, sum = 0;
    for (int64_t i = 0; i < cols; i++) m = fmax(m, x[r * cols + i]);
    for (int64_t i = 0; i < cols; i++) sum += exp(x[r * cols + i] - m);
    for (int64_t i = 0; i < cols; i++)
      y[r * cols + i] = log_form ? x[r * cols + i] - m - log(sum) : exp(x[r * cols + i] - m) / sum;
  }
}

static void kg_forward_softmax(const kg_case_t *c, double *const *in, double *out) {
  const int64_t cols = c->in[0].shape[c->in[0].ndim - 1];
  kg_softmax_rows(in[0], out, c->in[0].n / cols, cols, c->log);
}

static kiln_status_t kg_device_softmax(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  return c->log ? kiln_tensor_log_softmax(in[0], out) : kiln_tensor_softmax(in[0], out);
}

/* The backward takes the forward's result: y made on the device first. */
static kiln_status_t kg_grad_softmax(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                     kiln_tensor_t **out) {
  kiln_tensor_t *y = NULL;
  kiln_status_t status = kg_device_softmax(c, in, &y);
  if (status == KILN_OK) status = kiln_tensor_softmax_backward(y, dy, c->log, out);
  kiln_tensor_release(y);
  return status;
}

START_TEST(test_softmax_backward) {
  const int64_t shapes[][3] = {{4, 6, 0}, {3, 1, 0}, {2, 3, 5}, {1, 13, 0}};
  const int ndims[] = {2, 2, 3, 2};
  for (int log_form = 0; log_form < 2; log_form++) {
    for (int s = 0; s < 4; s++) {
      kg_case_t c;
      kg_case_init(&c, "softmax_backward%s, x of %d dims [%lld, %lld, ...]", log_form ? " (log)" : "", ndims[s],
                   (long long)shapes[s][0], (long long)shapes[s][1]);
      c.n_in = 1;
      c.log = log_form;
      kg_host_init(&c.in[0], KILN_F32, ndims[s], shapes[s]);
      kg_fill(&c.in[0], 21 + (uint64_t)s, -3, 3);
      kg_weights(&c, ndims[s], shapes[s], 22 + (uint64_t)s);
      c.forward = kg_forward_softmax;
      c.device_forward = kg_device_softmax;
      c.grad = kg_grad_softmax;
      kg_run_case(&c);
    }
  }
}
END_TEST

/* in[0] logits [N, C], in[1] labels [N]: the mean of -log_softmax at the labels. */
static void kg_forward_cross_entropy(const kg_case_t *c, double *const *in, double *out) {
  const int64_t n = c->in[0].shape[0], classes = c->in[0].shape[1];
  double *ls = malloc((size_t)(n * classes > 0 ? n * classes : 1) * sizeof *ls);
  ck_assert_ptr_nonnull(ls);
  kg_softmax_rows(in[0], ls, n, classes, true);
  double sum = 0;
  for (int64_t r = 0; r < n; r++) sum -= ls[r * classes + (int64_t)in[1][r]];
  out[0] = sum / (double)n;
  free(ls);
}

static kiln_status_t kg_device_cross_entropy(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  (void)c;
  return kiln_tensor_cross_entropy(in[0], in[1], out);
}

static kiln_status_t kg_grad_cross_entropy(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                           kiln_tensor_t **out) {
  return kiln_tensor_cross_entropy_backward(in[0], in[1], c->dloss ? dy : NULL, out);
}

START_TEST(test_cross_entropy_backward) {
  const int64_t sizes[][2] = {{5, 7}, {1, 2}, {3, 1}, {8, 3}};
  for (int s = 0; s < 4; s++) {
    for (int with_dloss = 0; with_dloss < 2; with_dloss++) {
      kg_case_t c;
      kg_case_init(&c, "cross_entropy_backward logits [%lld, %lld]%s", (long long)sizes[s][0],
                   (long long)sizes[s][1], with_dloss ? ", dloss" : "");
      c.n_in = 2;
      c.dloss = with_dloss;
      kg_host_init(&c.in[0], KILN_F32, 2, sizes[s]);
      kg_fill(&c.in[0], 31 + (uint64_t)s, -3, 3);
      kg_host_init(&c.in[1], KILN_I32, 1, sizes[s]);
      uint64_t state = 32 + (uint64_t)s;
      for (int64_t r = 0; r < sizes[s][0]; r++) c.in[1].v[r] = (double)(kg_next(&state) % (uint64_t)sizes[s][1]);
      kg_host_init(&c.w, KILN_F32, 0, NULL);
      c.w.v[0] = with_dloss ? -1.375 : 1.0;
      c.forward = kg_forward_cross_entropy;
      c.device_forward = kg_device_cross_entropy;
      c.grad = kg_grad_cross_entropy;
      c.h_device = 1.0 / 32;
      kg_run_case(&c);
    }
  }
}
END_TEST

/* ---- convolution and pooling ------------------------------------------------------------------- */

static int64_t kg_window_out(int64_t size, int pad, int dil, int64_t k, int stride) {
  return (size + 2 * pad - dil * (k - 1) - 1) / stride + 1;
}

/* in[0] x [N,C,H,W], in[1] w [K,C,R,S], in[2] bias [K]. */
static void kg_forward_conv2d(const kg_case_t *c, double *const *in, double *out) {
  const int64_t *xs = c->in[0].shape, *ws = c->in[1].shape;
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], K = ws[0], R = ws[2], S = ws[3];
  const kiln_conv2d_params_t *p = &c->conv;
  const int64_t P = kg_window_out(H, p->padding[0], p->dilation[0], R, p->stride[0]);
  const int64_t Q = kg_window_out(W, p->padding[1], p->dilation[1], S, p->stride[1]);
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++)
      for (int64_t oy = 0; oy < P; oy++)
        for (int64_t ox = 0; ox < Q; ox++) {
          double sum = in[2][k];
          for (int64_t ch = 0; ch < C; ch++)
            for (int64_t r = 0; r < R; r++)
              for (int64_t s = 0; s < S; s++) {
                const int64_t iy = oy * p->stride[0] - p->padding[0] + r * p->dilation[0];
                const int64_t ix = ox * p->stride[1] - p->padding[1] + s * p->dilation[1];
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                sum += in[0][((n * C + ch) * H + iy) * W + ix] * in[1][((k * C + ch) * R + r) * S + s];
              }
          out[((n * K + k) * P + oy) * Q + ox] = sum;
        }
}

static kiln_status_t kg_device_conv2d(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  return kiln_tensor_conv2d(in[0], in[1], in[2], &c->conv, out);
}

static kiln_status_t kg_grad_conv2d(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                    kiln_tensor_t **out) {
  if (c->wrt == 0) return kiln_tensor_conv2d_backward_input(dy, in[1], c->in[0].shape, &c->conv, out);
  if (c->wrt == 1) return kiln_tensor_conv2d_backward_weight(in[0], dy, c->in[1].shape, &c->conv, out);
  return kiln_tensor_conv2d_backward_bias(dy, out);
}

/* Batch 1 and 2, prime sizes, strides that do not divide, padding past half
 * the kernel, dilation, 1x1. */
static const struct {
  int64_t x[4], w[4];
  kiln_conv2d_params_t p;
} kg_conv_cases[] = {
    {{1, 2, 7, 6}, {3, 2, 3, 2}, {{2, 1}, {2, 1}, {1, 2}}},
    {{2, 3, 5, 5}, {2, 3, 3, 3}, {{2, 2}, {1, 1}, {2, 2}}},
    {{1, 1, 5, 7}, {2, 1, 2, 2}, {{3, 3}, {0, 0}, {1, 1}}},
    {{2, 2, 3, 4}, {3, 2, 1, 1}, {{2, 1}, {0, 1}, {1, 1}}},
    {{1, 2, 3, 3}, {1, 2, 3, 3}, {{1, 1}, {3, 2}, {1, 1}}},
};

START_TEST(test_conv2d_backward) {
  static const char *const names[] = {"input", "weight", "bias"};
  for (size_t i = 0; i < sizeof kg_conv_cases / sizeof kg_conv_cases[0]; i++) {
    const int64_t *xs = kg_conv_cases[i].x, *ws = kg_conv_cases[i].w;
    const kiln_conv2d_params_t p = kg_conv_cases[i].p;
    const int64_t ys[4] = {xs[0], ws[0], kg_window_out(xs[2], p.padding[0], p.dilation[0], ws[2], p.stride[0]),
                           kg_window_out(xs[3], p.padding[1], p.dilation[1], ws[3], p.stride[1])};
    for (int wrt = 0; wrt < 3; wrt++) {
      kg_case_t c;
      kg_case_init(&c,
                   "conv2d_backward_%s x [%lld,%lld,%lld,%lld], w [%lld,%lld,%lld,%lld], stride %dx%d, padding %dx%d, "
                   "dilation %dx%d",
                   names[wrt], (long long)xs[0], (long long)xs[1], (long long)xs[2], (long long)xs[3],
                   (long long)ws[0], (long long)ws[1], (long long)ws[2], (long long)ws[3], p.stride[0], p.stride[1],
                   p.padding[0], p.padding[1], p.dilation[0], p.dilation[1]);
      c.n_in = 3;
      c.wrt = wrt;
      c.conv = p;
      kg_host_init(&c.in[0], KILN_F32, 4, xs);
      kg_fill(&c.in[0], 41 + i, -2, 2);
      kg_host_init(&c.in[1], KILN_F32, 4, ws);
      kg_fill(&c.in[1], 42 + i, -1, 1);
      kg_host_init(&c.in[2], KILN_F32, 1, ws);
      kg_fill(&c.in[2], 43 + i, -1, 1);
      kg_weights(&c, 4, ys, 44 + i);
      c.forward = kg_forward_conv2d;
      c.device_forward = kg_device_conv2d;
      c.grad = kg_grad_conv2d;
      kg_run_case(&c);
    }
  }
}
END_TEST

static void kg_forward_max_pool2d(const kg_case_t *c, double *const *in, double *out) {
  const int64_t *xs = c->in[0].shape;
  const int64_t H = xs[2], W = xs[3], P = c->w.shape[2], Q = c->w.shape[3];
  const kiln_pool2d_params_t *p = &c->pool;
  for (int64_t nc = 0; nc < xs[0] * xs[1]; nc++)
    for (int64_t oy = 0; oy < P; oy++)
      for (int64_t ox = 0; ox < Q; ox++) {
        double m = -INFINITY;
        for (int64_t r = 0; r < p->kernel[0]; r++)
          for (int64_t s = 0; s < p->kernel[1]; s++) {
            const int64_t iy = oy * p->stride[0] - p->padding[0] + r, ix = ox * p->stride[1] - p->padding[1] + s;
            if (iy >= 0 && iy < H && ix >= 0 && ix < W) m = fmax(m, in[0][(nc * H + iy) * W + ix]);
          }
        out[(nc * P + oy) * Q + ox] = m;
      }
}

static kiln_status_t kg_device_max_pool2d(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  return kiln_tensor_max_pool2d(in[0], &c->pool, out);
}

static kiln_status_t kg_grad_max_pool2d(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                        kiln_tensor_t **out) {
  return kiln_tensor_max_pool2d_backward(in[0], dy, &c->pool, out);
}

/* Overlapping windows (kernel 3 stride 2, stride 1), padding, batch 1. */
static const struct {
  int64_t x[4];
  kiln_pool2d_params_t p;
} kg_pool_cases[] = {
    {{1, 2, 7, 7}, {{3, 3}, {2, 2}, {1, 1}}},
    {{2, 1, 5, 6}, {{2, 3}, {1, 2}, {1, 1}}},
    {{1, 1, 6, 5}, {{3, 3}, {1, 1}, {0, 0}}},
    {{1, 3, 4, 4}, {{2, 2}, {2, 2}, {0, 0}}},
};

START_TEST(test_max_pool2d_backward) {
  for (size_t i = 0; i < sizeof kg_pool_cases / sizeof kg_pool_cases[0]; i++) {
    const int64_t *xs = kg_pool_cases[i].x;
    const kiln_pool2d_params_t p = kg_pool_cases[i].p;
    const int64_t ys[4] = {xs[0], xs[1], kg_window_out(xs[2], p.padding[0], 1, p.kernel[0], p.stride[0]),
                           kg_window_out(xs[3], p.padding[1], 1, p.kernel[1], p.stride[1])};
    kg_case_t c;
    kg_case_init(&c, "max_pool2d_backward x [%lld,%lld,%lld,%lld], kernel %dx%d, stride %dx%d, padding %dx%d",
                 (long long)xs[0], (long long)xs[1], (long long)xs[2], (long long)xs[3], p.kernel[0], p.kernel[1],
                 p.stride[0], p.stride[1], p.padding[0], p.padding[1]);
    c.n_in = 1;
    c.pool = p;
    kg_host_init(&c.in[0], KILN_F32, 4, xs);
    kg_fill_distinct(&c.in[0], 51 + i);
    kg_weights(&c, 4, ys, 52 + i);
    c.forward = kg_forward_max_pool2d;
    c.device_forward = kg_device_max_pool2d;
    c.grad = kg_grad_max_pool2d;
    kg_run_case(&c);
  }
}
END_TEST

/* ---- broadcasting: sum_to and broadcast_to, each the other's gradient --------------------------- */

/* The flat index in `small` (broadcasting to `big`) that big's `flat` reads. */
static int64_t kg_broadcast_index(int big_ndim, const int64_t *big, int64_t flat, int small_ndim,
                                  const int64_t *small) {
  int64_t index = 0, stride = 1;
  for (int i = big_ndim - 1; i >= 0; i--) {
    int64_t at = flat % big[i];
    flat /= big[i];
    int j = i - (big_ndim - small_ndim);
    if (j < 0) continue;
    if (small[j] != 1) index += at * stride;
    stride *= small[j];
  }
  return index;
}

/* f = sum_to(a, shape): its gradient is broadcast_to(dy, a's shape). */
static void kg_forward_sum_to(const kg_case_t *c, double *const *in, double *out) {
  for (int64_t j = 0; j < c->w.n; j++) out[j] = 0;
  for (int64_t i = 0; i < c->in[0].n; i++)
    out[kg_broadcast_index(c->in[0].ndim, c->in[0].shape, i, c->to_ndim, c->to_shape)] += in[0][i];
}

static kiln_status_t kg_device_sum_to(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  return kiln_tensor_sum_to(in[0], c->to_ndim, c->to_shape, out);
}

static kiln_status_t kg_grad_sum_to(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                    kiln_tensor_t **out) {
  (void)in;
  return kiln_tensor_broadcast_to(dy, c->in[0].ndim, c->in[0].shape, out);
}

/* f = broadcast_to(a, shape): its gradient is sum_to(dy, a's shape). */
static void kg_forward_broadcast_to(const kg_case_t *c, double *const *in, double *out) {
  for (int64_t j = 0; j < c->w.n; j++)
    out[j] = in[0][kg_broadcast_index(c->to_ndim, c->to_shape, j, c->in[0].ndim, c->in[0].shape)];
}

static kiln_status_t kg_device_broadcast_to(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  return kiln_tensor_broadcast_to(in[0], c->to_ndim, c->to_shape, out);
}

static kiln_status_t kg_grad_broadcast_to(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                          kiln_tensor_t **out) {
  (void)in;
  return kiln_tensor_sum_to(dy, c->in[0].ndim, c->in[0].shape, out);
}

static const struct {
  int big_ndim;
  int64_t big[4];
  int small_ndim;
  int64_t small[4];
} kg_broadcast_cases[] = {
    {3, {3, 4, 5}, 2, {4, 1}},
    {3, {3, 4, 5}, 3, {3, 1, 5}},
    {2, {2, 3}, 0, {0}},
    {4, {2, 3, 2, 5}, 3, {3, 1, 5}},
    {2, {7, 3}, 2, {7, 3}},
};

START_TEST(test_sum_to_and_broadcast_to) {
  for (size_t i = 0; i < sizeof kg_broadcast_cases / sizeof kg_broadcast_cases[0]; i++) {
    const int bn = kg_broadcast_cases[i].big_ndim, sn = kg_broadcast_cases[i].small_ndim;
    const int64_t *big = kg_broadcast_cases[i].big, *small = kg_broadcast_cases[i].small;
    for (int which = 0; which < 2; which++) {
      kg_case_t c;
      kg_case_init(&c, "%s, case %zu (%d dims to %d): the gradient of %s", which ? "sum_to" : "broadcast_to", i,
                   which ? bn : sn, which ? sn : bn, which ? "broadcast_to" : "sum_to");
      c.n_in = 1;
      if (which == 0) {
        /* f = sum_to(a [big], small); kiln's gradient: broadcast_to. */
        kg_host_init(&c.in[0], KILN_F32, bn, big);
        c.to_ndim = sn;
        memcpy(c.to_shape, small, sizeof(int64_t) * (size_t)sn);
        kg_weights(&c, sn, small, 61 + i);
        c.forward = kg_forward_sum_to;
        c.device_forward = kg_device_sum_to;
        c.grad = kg_grad_sum_to;
      } else {
        kg_host_init(&c.in[0], KILN_F32, sn, small);
        c.to_ndim = bn;
        memcpy(c.to_shape, big, sizeof(int64_t) * (size_t)bn);
        kg_weights(&c, bn, big, 62 + i);
        c.forward = kg_forward_broadcast_to;
        c.device_forward = kg_device_broadcast_to;
        c.grad = kg_grad_broadcast_to;
      }
      kg_fill(&c.in[0], 63 + i, -2, 2);
      kg_run_case(&c);
    }
  }
}
END_TEST

/* Binary ops with broadcasting, differentiated as a tape does: the local
 * derivative times dy in the broadcast shape, then sum_to the operand's
 * shape. in[0] a, in[1] b. */
static double kg_binary(int op, double a, double b) {
  switch ((kiln_binary_op_t)op) {
    case KILN_BINARY_ADD: return a + b;
    case KILN_BINARY_SUB: return a - b;
    case KILN_BINARY_MUL: return a * b;
    case KILN_BINARY_DIV: return a / b;
    default: return NAN;
  }
}

static void kg_forward_binary(const kg_case_t *c, double *const *in, double *out) {
  for (int64_t j = 0; j < c->w.n; j++) {
    const int64_t ia = kg_broadcast_index(c->w.ndim, c->w.shape, j, c->in[0].ndim, c->in[0].shape);
    const int64_t ib = kg_broadcast_index(c->w.ndim, c->w.shape, j, c->in[1].ndim, c->in[1].shape);
    out[j] = kg_binary(c->op, in[0][ia], in[1][ib]);
  }
}

static kiln_status_t kg_device_binary(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t **out) {
  return kiln_tensor_binary((kiln_binary_op_t)c->op, in[0], in[1], out);
}

static kiln_status_t kg_grad_binary(const kg_case_t *c, kiln_tensor_t *const *in, kiln_tensor_t *dy,
                                    kiln_tensor_t **out) {
  kiln_tensor_t *local = NULL, *t = NULL, *bb = NULL;
  kiln_status_t status = KILN_OK;
  const kiln_binary_op_t op = (kiln_binary_op_t)c->op;
  if (op == KILN_BINARY_ADD || (op == KILN_BINARY_SUB && c->wrt == 0)) {
    local = kiln_tensor_retain(dy);
  } else if (op == KILN_BINARY_SUB) {
    status = kiln_tensor_neg(dy, &local);
  } else if (op == KILN_BINARY_MUL) {
    status = kiln_tensor_mul(dy, in[1 - c->wrt], &local);
  } else if (c->wrt == 0) { /* d(a/b)/da = 1/b */
    status = kiln_tensor_div(dy, in[1], &local);
  } else { /* d(a/b)/db = -a/b^2 */
    status = kiln_tensor_mul(dy, in[0], &t);
    if (status == KILN_OK) status = kiln_tensor_mul(in[1], in[1], &bb);
    kiln_tensor_t *q = NULL;
    if (status == KILN_OK) status = kiln_tensor_div(t, bb, &q);
    if (status == KILN_OK) status = kiln_tensor_neg(q, &local);
    kiln_tensor_release(q);
  }
  if (status == KILN_OK) status = kiln_tensor_sum_to(local, c->in[c->wrt].ndim, c->in[c->wrt].shape, out);
  kiln_tensor_release(local);
  kiln_tensor_release(t);
  kiln_tensor_release(bb);
  return status;
}

START_TEST(test_broadcast_binary_backward) {
  static const kiln_binary_op_t ops[] = {KILN_BINARY_ADD, KILN_BINARY_SUB, KILN_BINARY_MUL, KILN_BINARY_DIV};
  static const char *const names[] = {"add", "sub", "mul", "div"};
  const int64_t a_shape[3] = {3, 1, 5}, b_shape[2] = {4, 1}, y_shape[3] = {3, 4, 5};
  for (int o = 0; o < 4; o++) {
    for (int wrt = 0; wrt < 2; wrt++) {
      kg_case_t c;
      kg_case_init(&c, "%s of a [3,1,5] and b [4,1]: d/d%s through sum_to", names[o], wrt ? "b" : "a");
      c.n_in = 2;
      c.wrt = wrt;
      c.op = ops[o];
      kg_host_init(&c.in[0], KILN_F32, 3, a_shape);
      kg_fill(&c.in[0], 71, -2, 2);
      kg_host_init(&c.in[1], KILN_F32, 2, b_shape);
      if (ops[o] == KILN_BINARY_DIV)
        kg_fill(&c.in[1], 72, 0.5, 2); /* away from b = 0 */
      else
        kg_fill(&c.in[1], 72, -2, 2);
      kg_weights(&c, 3, y_shape, 73);
      c.forward = kg_forward_binary;
      c.device_forward = kg_device_binary;
      c.grad = kg_grad_binary;
      kg_run_case(&c);
    }
  }
}
END_TEST

/* ---- PyTorch's references ------------------------------------------------------------------------
 * The format is described in tests/grad/make_references.py. */

#define KG_REF_MAX 40

typedef struct kg_ref_tensor_t {
  char key[48];
  char dtype[8];
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t n;
  double *v;
} kg_ref_tensor_t;

typedef struct kg_ref_t {
  char path[4200];
  char name[128], kind[64];
  int n_ints, n_reals, n_tensors;
  struct { char key[48]; int n; int64_t v[8]; } ints[KG_REF_MAX];
  struct { char key[48]; double v; } reals[KG_REF_MAX];
  kg_ref_tensor_t tensors[KG_REF_MAX];
} kg_ref_t;

static const char *kg_reference_dir(void) {
  const char *dir = getenv("KILN_GRAD_REFERENCES");
  return dir && *dir ? dir : KG_REFERENCE_DIR;
}

/* Load one reference file; asserts (with the file and line) on anything malformed. */
static void kg_ref_load(const char *name, kg_ref_t *ref) {
  memset(ref, 0, sizeof *ref);
  snprintf(ref->path, sizeof ref->path, "%s/%s.txt", kg_reference_dir(), name);
  FILE *f = fopen(ref->path, "r");
  ck_assert_msg(f != NULL, "cannot open the reference %s (run tests/grad/make_references.py, or set "
                "KILN_GRAD_REFERENCES to the folder holding it)", ref->path);
  char word[128];
  int version = 0;
  bool ended = false;
  while (!ended && fscanf(f, "%127s", word) == 1) {
    if (word[0] == '#') {
      int ch;
      while ((ch = fgetc(f)) != EOF && ch != '\n') continue;
    } else if (!strcmp(word, "kiln-grad-reference")) {
      ck_assert_msg(fscanf(f, "%d", &version) == 1 && version == 1, "%s: version %d, this test reads 1", ref->path,
                    version);
    } else if (!strcmp(word, "case")) {
      ck_assert(fscanf(f, "%127s", ref->name) == 1);
    } else if (!strcmp(word, "kind")) {
      ck_assert(fscanf(f, "%63s", ref->kind) == 1);
    } else if (!strcmp(word, "torch")) {
      ck_assert(fscanf(f, "%127s", word) == 1);
    } else if (!strcmp(word, "int")) {
      ck_assert(ref->n_ints < KG_REF_MAX);
      ck_assert(fscanf(f, "%47s", ref->ints[ref->n_ints].key) == 1);
      long long v;
      int n = 0;
      int ch;
      /* The values up to the end of the line. */
      while ((ch = fgetc(f)) != EOF && ch != '\n') {
        if (isspace(ch)) continue;
        ungetc(ch, f);
        ck_assert_msg(n < 8 && fscanf(f, "%lld", &v) == 1, "%s: a malformed int line", ref->path);
        ref->ints[ref->n_ints].v[n++] = v;
      }
      ref->ints[ref->n_ints++].n = n;
    } else if (!strcmp(word, "real")) {
      ck_assert(ref->n_reals < KG_REF_MAX);
      ck_assert_msg(fscanf(f, "%47s %lf", ref->reals[ref->n_reals].key, &ref->reals[ref->n_reals].v) == 2,
                    "%s: a malformed real line", ref->path);
      ref->n_reals++;
    } else if (!strcmp(word, "tensor")) {
      ck_assert(ref->n_tensors < KG_REF_MAX);
      kg_ref_tensor_t *t = &ref->tensors[ref->n_tensors++];
      ck_assert_msg(fscanf(f, "%47s %7s %d", t->key, t->dtype, &t->ndim) == 3 && t->ndim >= 0 &&
                        t->ndim <= KILN_MAX_DIMS,
                    "%s: a malformed tensor line", ref->path);
      t->n = 1;
      for (int i = 0; i < t->ndim; i++) {
        long long s;
        ck_assert_msg(fscanf(f, "%lld", &s) == 1 && s >= 0, "%s: tensor %s: a malformed size", ref->path, t->key);
        t->shape[i] = s;
        t->n *= s;
      }
      t->v = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *t->v);
      ck_assert_ptr_nonnull(t->v);
      for (int64_t i = 0; i < t->n; i++)
        ck_assert_msg(fscanf(f, "%lf", &t->v[i]) == 1, "%s: tensor %s: value %lld of %lld is missing or malformed",
                      ref->path, t->key, (long long)i, (long long)t->n);
    } else if (!strcmp(word, "end")) {
      ended = true;
    } else {
      ck_abort_msg("%s: unknown word \"%s\"", ref->path, word);
    }
  }
  fclose(f);
  ck_assert_msg(version == 1 && ended && ref->kind[0], "%s: not a complete kiln-grad-reference 1 file", ref->path);
}

static void kg_ref_free(kg_ref_t *ref) {
  for (int i = 0; i < ref->n_tensors; i++) free(ref->tensors[i].v);
}

static const kg_ref_tensor_t *kg_ref_tensor(const kg_ref_t *ref, const char *key) {
  for (int i = 0; i < ref->n_tensors; i++)
    if (!strcmp(ref->tensors[i].key, key)) return &ref->tensors[i];
  ck_abort_msg("%s: no tensor \"%s\"", ref->path, key);
  return NULL;
}

static bool kg_ref_has_tensor(const kg_ref_t *ref, const char *key) {
  for (int i = 0; i < ref->n_tensors; i++)
    if (!strcmp(ref->tensors[i].key, key)) return true;
  return false;
}

static int64_t kg_ref_int(const kg_ref_t *ref, const char *key, int index) {
  for (int i = 0; i < ref->n_ints; i++)
    if (!strcmp(ref->ints[i].key, key) && index < ref->ints[i].n) return ref->ints[i].v[index];
  ck_abort_msg("%s: no int \"%s\" with a value %d", ref->path, key, index);
  return 0;
}

static bool kg_ref_real(const kg_ref_t *ref, const char *key, double *out) {
  for (int i = 0; i < ref->n_reals; i++)
    if (!strcmp(ref->reals[i].key, key)) {
      *out = ref->reals[i].v;
      return true;
    }
  return false;
}

static double kg_ref_real_need(const kg_ref_t *ref, const char *key) {
  double v = 0;
  ck_assert_msg(kg_ref_real(ref, key, &v), "%s: no real \"%s\"", ref->path, key);
  return v;
}

static kiln_tensor_t *kg_ref_upload(kiln_device_t *dev, const kg_ref_t *ref, const char *key) {
  const kg_ref_tensor_t *t = kg_ref_tensor(ref, key);
  kg_host_t h;
  h.dtype = !strcmp(t->dtype, "i32") ? KILN_I32 : KILN_F32;
  h.ndim = t->ndim;
  memcpy(h.shape, t->shape, sizeof h.shape);
  h.n = t->n;
  h.v = t->v;
  kiln_tensor_t *out = NULL;
  KT_OK(kg_upload(dev, &h, &out));
  return out;
}

/* Compare kiln's `got` (status of the call that made it) with the tensor `key`. */
static void kg_ref_check(const kg_ref_t *ref, const char *key, kiln_device_t *dev, kiln_status_t status,
                         kiln_tensor_t *got, double atol) {
  char label[512];
  snprintf(label, sizeof label, "%s: %s", ref->name, key);
  ck_assert_msg(status == KILN_OK, "%s on %s: kiln failed with %s: %s", label, kiln_device_name(dev),
                kiln_status_name(status), kiln_last_error());
  const kg_ref_tensor_t *want = kg_ref_tensor(ref, key);
  double *values = malloc((size_t)(want->n > 0 ? want->n : 1) * sizeof *values);
  ck_assert_ptr_nonnull(values);
  kg_download(label, dev, got, want->ndim, want->shape, values);
  kg_compare(label, "PyTorch", dev, values, want->v, want->n, 1e-4, 1e-5, atol);
  free(values);
}

static void kg_ref_conv2d(const kg_ref_t *ref, kiln_device_t *dev) {
  kiln_conv2d_params_t p;
  for (int i = 0; i < 2; i++) {
    p.stride[i] = (int32_t)kg_ref_int(ref, "stride", i);
    p.padding[i] = (int32_t)kg_ref_int(ref, "padding", i);
    p.dilation[i] = (int32_t)kg_ref_int(ref, "dilation", i);
  }
  kiln_tensor_t *x = kg_ref_upload(dev, ref, "x"), *w = kg_ref_upload(dev, ref, "weight");
  kiln_tensor_t *b = kg_ref_upload(dev, ref, "bias"), *dy = kg_ref_upload(dev, ref, "dy");
  kiln_tensor_t *y = NULL, *dx = NULL, *dw = NULL, *db = NULL;
  kiln_status_t st_y = kiln_tensor_conv2d(x, w, b, &p, &y);
  kg_ref_check(ref, "y", dev, st_y, y, 1e-7);
  kiln_status_t st_dx = kiln_tensor_conv2d_backward_input(dy, w, kiln_tensor_shape(x), &p, &dx);
  kg_ref_check(ref, "dx", dev, st_dx, dx, 1e-7);
  kiln_status_t st_dw = kiln_tensor_conv2d_backward_weight(x, dy, kiln_tensor_shape(w), &p, &dw);
  kg_ref_check(ref, "dw", dev, st_dw, dw, 1e-7);
  kiln_status_t st_db = kiln_tensor_conv2d_backward_bias(dy, &db);
  kg_ref_check(ref, "db", dev, st_db, db, 1e-7);
  kiln_tensor_t *all[] = {x, w, b, dy, y, dx, dw, db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
}

static void kg_ref_max_pool2d(const kg_ref_t *ref, kiln_device_t *dev) {
  kiln_pool2d_params_t p;
  for (int i = 0; i < 2; i++) {
    p.kernel[i] = (int32_t)kg_ref_int(ref, "kernel", i);
    p.stride[i] = (int32_t)kg_ref_int(ref, "stride", i);
    p.padding[i] = (int32_t)kg_ref_int(ref, "padding", i);
  }
  kiln_tensor_t *x = kg_ref_upload(dev, ref, "x"), *dy = kg_ref_upload(dev, ref, "dy"), *y = NULL, *dx = NULL;
  kiln_status_t st_y = kiln_tensor_max_pool2d(x, &p, &y);
  kg_ref_check(ref, "y", dev, st_y, y, 0);
  kiln_status_t st_dx = kiln_tensor_max_pool2d_backward(x, dy, &p, &dx);
  kg_ref_check(ref, "dx", dev, st_dx, dx, 1e-7);
  kiln_tensor_t *all[] = {x, dy, y, dx};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
}

static void kg_ref_cross_entropy(const kg_ref_t *ref, kiln_device_t *dev) {
  kiln_tensor_t *logits = kg_ref_upload(dev, ref, "logits"), *labels = kg_ref_upload(dev, ref, "labels");
  kiln_tensor_t *dloss = NULL, *loss = NULL, *dl = NULL;
  double d = 0;
  if (kg_ref_real(ref, "dloss", &d)) {
    const float v = (float)d;
    KT_OK(kiln_tensor_from_host(dev, KILN_F32, 0, NULL, &v, &dloss));
  }
  kiln_status_t st_loss = kiln_tensor_cross_entropy(logits, labels, &loss);
  kg_ref_check(ref, "loss", dev, st_loss, loss, 1e-7);
  kiln_status_t st_dl = kiln_tensor_cross_entropy_backward(logits, labels, dloss, &dl);
  kg_ref_check(ref, "dlogits", dev, st_dl, dl, 1e-7);
  kiln_tensor_t *all[] = {logits, labels, dloss, loss, dl};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
}

/* y = a * b broadcast; da = sum_to(dy * b, a's shape), db = sum_to(dy * a, b's shape). */
static void kg_ref_broadcast_mul(const kg_ref_t *ref, kiln_device_t *dev) {
  kiln_tensor_t *a = kg_ref_upload(dev, ref, "a"), *b = kg_ref_upload(dev, ref, "b");
  kiln_tensor_t *dy = kg_ref_upload(dev, ref, "dy");
  kiln_tensor_t *y = NULL, *tb = NULL, *ta = NULL, *da = NULL, *db = NULL;
  kiln_status_t st_y = kiln_tensor_mul(a, b, &y);
  kg_ref_check(ref, "y", dev, st_y, y, 0);
  kiln_status_t status = kiln_tensor_mul(dy, b, &tb);
  if (status == KILN_OK) status = kiln_tensor_sum_to(tb, kiln_tensor_ndim(a), kiln_tensor_shape(a), &da);
  kg_ref_check(ref, "da", dev, status, da, 1e-7);
  status = kiln_tensor_mul(dy, a, &ta);
  if (status == KILN_OK) status = kiln_tensor_sum_to(ta, kiln_tensor_ndim(b), kiln_tensor_shape(b), &db);
  kg_ref_check(ref, "db", dev, status, db, 1e-7);
  kiln_tensor_t *all[] = {a, b, dy, y, tb, ta, da, db};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
}

static void kg_ref_softmax(const kg_ref_t *ref, kiln_device_t *dev) {
  kiln_tensor_t *x = kg_ref_upload(dev, ref, "x"), *dy = kg_ref_upload(dev, ref, "dy");
  for (int log_form = 0; log_form < 2; log_form++) {
    kiln_tensor_t *y = NULL, *dx = NULL;
    kiln_status_t status = log_form ? kiln_tensor_log_softmax(x, &y) : kiln_tensor_softmax(x, &y);
    if (status == KILN_OK) status = kiln_tensor_softmax_backward(y, dy, log_form, &dx);
    kg_ref_check(ref, log_form ? "dx_log_softmax" : "dx_softmax", dev, status, dx, 1e-7);
    kiln_tensor_release(y);
    kiln_tensor_release(dx);
  }
  kiln_tensor_release(x);
  kiln_tensor_release(dy);
}

static void kg_ref_unary(const kg_ref_t *ref, kiln_device_t *dev) {
  for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
    char xk[48], dyk[48], dxk[48];
    snprintf(xk, sizeof xk, "x_%s", kg_unary_names[op]);
    snprintf(dyk, sizeof dyk, "dy_%s", kg_unary_names[op]);
    snprintf(dxk, sizeof dxk, "dx_%s", kg_unary_names[op]);
    kiln_tensor_t *x = kg_ref_upload(dev, ref, xk), *dy = kg_ref_upload(dev, ref, dyk), *dx = NULL;
    kiln_status_t st_dx = kiln_tensor_unary_backward((kiln_unary_op_t)op, x, dy, &dx);
  kg_ref_check(ref, dxk, dev, st_dx, dx, 1e-7);
    kiln_tensor_release(x);
    kiln_tensor_release(dy);
    kiln_tensor_release(dx);
  }
}

/* torch.optim.SGD's steps from a zero buffer (the reference's dampening is 0). */
static void kg_ref_sgd(const kg_ref_t *ref, kiln_device_t *dev) {
  kiln_sgd_params_t p;
  p.lr = kg_ref_real_need(ref, "lr");
  p.momentum = kg_ref_real_need(ref, "momentum");
  p.dampening = kg_ref_real_need(ref, "dampening");
  p.weight_decay = kg_ref_real_need(ref, "weight_decay");
  p.nesterov = kg_ref_int(ref, "nesterov", 0) != 0;
  p.first_step = false; /* a zero buffer and the reference's dampening 0: the same steps */
  kiln_tensor_t *param = kg_ref_upload(dev, ref, "param"), *buf = NULL;
  KT_OK(kiln_tensor_zeros(dev, KILN_F32, kiln_tensor_ndim(param), kiln_tensor_shape(param), &buf));
  const int64_t steps = kg_ref_int(ref, "steps", 0);
  for (int64_t s = 1; s <= steps; s++) {
    char gk[32], pk[32];
    snprintf(gk, sizeof gk, "grad%lld", (long long)s);
    snprintf(pk, sizeof pk, "param%lld", (long long)s);
    kiln_tensor_t *g = kg_ref_upload(dev, ref, gk);
    kiln_status_t st_param = kiln_tensor_sgd_update(param, g, p.momentum > 0 ? buf : NULL, &p);
  kg_ref_check(ref, pk, dev, st_param, param, 1e-6);
    kiln_tensor_release(g);
  }
  if (kg_ref_has_tensor(ref, "momentum_buf")) kg_ref_check(ref, "momentum_buf", dev, KILN_OK, buf, 1e-6);
  kiln_tensor_release(param);
  kiln_tensor_release(buf);
}

static void kg_ref_adam(const kg_ref_t *ref, kiln_device_t *dev) {
  kiln_adam_params_t p;
  p.lr = kg_ref_real_need(ref, "lr");
  p.beta1 = kg_ref_real_need(ref, "beta1");
  p.beta2 = kg_ref_real_need(ref, "beta2");
  p.eps = kg_ref_real_need(ref, "eps");
  p.weight_decay = kg_ref_real_need(ref, "weight_decay");
  kiln_tensor_t *param = kg_ref_upload(dev, ref, "param"), *m = NULL, *v = NULL;
  KT_OK(kiln_tensor_zeros(dev, KILN_F32, kiln_tensor_ndim(param), kiln_tensor_shape(param), &m));
  KT_OK(kiln_tensor_zeros(dev, KILN_F32, kiln_tensor_ndim(param), kiln_tensor_shape(param), &v));
  const int64_t steps = kg_ref_int(ref, "steps", 0);
  for (int64_t s = 1; s <= steps; s++) {
    char gk[32], pk[32];
    snprintf(gk, sizeof gk, "grad%lld", (long long)s);
    snprintf(pk, sizeof pk, "param%lld", (long long)s);
    kiln_tensor_t *g = kg_ref_upload(dev, ref, gk);
    kiln_status_t st_param = kiln_tensor_adam_update(param, g, m, v, s, &p);
  kg_ref_check(ref, pk, dev, st_param, param, 1e-6);
    kiln_tensor_release(g);
  }
  kg_ref_check(ref, "m", dev, KILN_OK, m, 1e-7);
  kg_ref_check(ref, "v", dev, KILN_OK, v, 1e-9);
  kiln_tensor_release(param);
  kiln_tensor_release(m);
  kiln_tensor_release(v);
}

/* One Adam step against torch.optim.Adam's formula in float64 from the
 * caller's double hyperparameters, on the update itself (param - param'), at
 * 1e-6 relative: param starts near 0, so param' holds the update to float's
 * precision. 1 - beta of the float beta (beta2 = 0.999 rounds to
 * 0.99900001) made every update about 6.5e-6 too large. */
START_TEST(test_adam_step_against_float64) {
  static const struct {
    kiln_adam_params_t p;
    int64_t step;
    bool state; /* m and v left by earlier steps, else zeros */
  } cases[] = {
      {{1e-3, 0.9, 0.999, 1e-8, 0}, 1, false},  {{1e-3, 0.9, 0.999, 1e-8, 0}, 10, true},
      {{0.01, 0.99, 0.9999, 1e-8, 0}, 1, false}, {{0.1, 0.5, 0.75, 1e-6, 0.1}, 3, true},
      {{0.01, 0.9, 0.999, 1e-8, 0.01}, 1000, true},
  };
  enum { N = 64 };
  float param[N], grad[N], m0[N], v0[N];
  for (int i = 0; i < N; i++) {
    /* |grad| in [0.25, 2] of both signs, param within 1e-3 of 0, and a state
     * of grad's sign so that m never cancels. */
    const float mag = 0.25f + 1.75f * (float)((i * 37) % N) / N;
    grad[i] = (i % 3 == 0) ? -mag : mag;
    param[i] = 1e-3f * (float)((i * 11) % 21 - 10) / 10.0f;
    m0[i] = 0.1f * grad[i];
    v0[i] = 0.5f * grad[i] * grad[i];
  }
  const int64_t shape[1] = {N};
  for (size_t d = 0; d < kg_ndev; d++) {
    kiln_device_t *dev = kg_devs[d];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
      const kiln_adam_params_t p = cases[k].p;
      const float zero[N] = {0};
      kiln_tensor_t *tp = NULL, *tg = NULL, *tm = NULL, *tv = NULL;
      KT_OK(kiln_tensor_from_host(dev, KILN_F32, 1, shape, param, &tp));
      KT_OK(kiln_tensor_from_host(dev, KILN_F32, 1, shape, grad, &tg));
      KT_OK(kiln_tensor_from_host(dev, KILN_F32, 1, shape, cases[k].state ? m0 : zero, &tm));
      KT_OK(kiln_tensor_from_host(dev, KILN_F32, 1, shape, cases[k].state ? v0 : zero, &tv));
      KT_OK(kiln_tensor_adam_update(tp, tg, tm, tv, cases[k].step, &p));
      float got[N];
      KT_OK(kiln_tensor_read(tp, got, sizeof got));
      const double s = (double)cases[k].step, c1 = 1 - pow(p.beta1, s), c2 = 1 - pow(p.beta2, s);
      double worst = 0;
      int at = 0;
      for (int i = 0; i < N; i++) {
        const double m = cases[k].state ? m0[i] : 0, v = cases[k].state ? v0[i] : 0;
        const double g = grad[i] + p.weight_decay * param[i];
        const double mi = p.beta1 * m + (1 - p.beta1) * g, vi = p.beta2 * v + (1 - p.beta2) * g * g;
        const double want = (p.lr / c1) * mi / (sqrt(vi) / sqrt(c2) + p.eps);
        const double update = (double)param[i] - (double)got[i];
        const double rel = fabs(update - want) / fabs(want);
        if (rel > worst) worst = rel, at = i;
      }
      ck_assert_msg(worst <= 1e-6,
                    "%s: adam step %lld (lr %g, betas %g %g, eps %g, weight_decay %g): update %d is %.3g relative "
                    "from the float64 reference (at most 1e-6)",
                    kiln_device_name(dev), (long long)cases[k].step, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay,
                    at, worst);
      kiln_tensor_release(tp);
      kiln_tensor_release(tg);
      kiln_tensor_release(tm);
      kiln_tensor_release(tv);
    }
  }
}
END_TEST

static const char *const kg_reference_names[] = {
    "conv2d_stride2_pad1_dil2", "conv2d_asymmetric", "max_pool2d_k3_s2_ties", "max_pool2d_k3_s2_pad1_ties",
    "cross_entropy", "cross_entropy_dloss", "cross_entropy_large", "broadcast_mul", "softmax", "unary",
    "sgd_momentum", "sgd_nesterov", "sgd_plain", "adam", "adam_weight_decay",
};

START_TEST(test_pytorch_reference) {
  kg_ref_t *ref = malloc(sizeof *ref);
  ck_assert_ptr_nonnull(ref);
  kg_ref_load(kg_reference_names[_i], ref);
  static const struct {
    const char *kind;
    void (*run)(const kg_ref_t *ref, kiln_device_t *dev);
  } kinds[] = {
      {"conv2d", kg_ref_conv2d}, {"max_pool2d", kg_ref_max_pool2d}, {"cross_entropy", kg_ref_cross_entropy},
      {"broadcast_mul", kg_ref_broadcast_mul}, {"softmax", kg_ref_softmax}, {"unary", kg_ref_unary},
      {"sgd", kg_ref_sgd}, {"adam", kg_ref_adam},
  };
  bool known = false;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    if (strcmp(kinds[k].kind, ref->kind) != 0) continue;
    known = true;
    for (size_t d = 0; d < kg_ndev; d++) kinds[k].run(ref, kg_devs[d]);
  }
  ck_assert_msg(known, "%s: unknown kind \"%s\"", ref->path, ref->kind);
  kg_ref_free(ref);
  free(ref);
}
END_TEST

/* ---- memory ------------------------------------------------------------------------------------- */

static kiln_memory_stats_t kg_stats(kiln_device_t *dev) {
  kiln_memory_stats_t s;
  KT_OK(kiln_device_memory_stats(dev, &s));
  return s;
}

/* In use, pooled and peak follow allocations and releases; the pool serves
 * a size it holds without a new allocation; reset_peak starts afresh. */
START_TEST(test_memory_stats) {
  for (size_t d = 0; d < kg_ndev; d++) {
    kiln_device_t *dev = kg_devs[d];
    const char *name = kiln_device_name(dev);
    KT_OK(kiln_queue_finish(kiln_device_current_queue(dev)));
    const kiln_memory_stats_t s0 = kg_stats(dev);
    ck_assert_msg(s0.peak_bytes >= s0.in_use_bytes, "%s: peak %llu < in use %llu", name,
                  (unsigned long long)s0.peak_bytes, (unsigned long long)s0.in_use_bytes);
    const int64_t n = 100003; /* 400012 bytes: a size no earlier test left in the pool */
    kiln_tensor_t *t = NULL;
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 1, &n, &t));
    const kiln_memory_stats_t s1 = kg_stats(dev);
    ck_assert_msg(s1.in_use_bytes >= s0.in_use_bytes + (uint64_t)n * 4,
                  "%s: in use %llu -> %llu for a tensor of %lld bytes", name, (unsigned long long)s0.in_use_bytes,
                  (unsigned long long)s1.in_use_bytes, (long long)n * 4);
    ck_assert_msg(s1.in_use_bytes - s0.in_use_bytes < (uint64_t)n * 4 * 2, "%s: %lld bytes took %llu", name,
                  (long long)n * 4, (unsigned long long)(s1.in_use_bytes - s0.in_use_bytes));
    ck_assert_msg(s1.peak_bytes >= s1.in_use_bytes, "%s: peak below in use", name);
    const uint64_t block = s1.in_use_bytes - s0.in_use_bytes;
    kiln_tensor_release(t);
    KT_OK(kiln_queue_finish(kiln_device_current_queue(dev)));
    const kiln_memory_stats_t s2 = kg_stats(dev);
    ck_assert_msg(s2.in_use_bytes == s0.in_use_bytes, "%s: in use %llu after the release, %llu before the tensor",
                  name, (unsigned long long)s2.in_use_bytes, (unsigned long long)s0.in_use_bytes);
    ck_assert_msg(s2.pooled_bytes == s1.pooled_bytes + block, "%s: pooled %llu -> %llu after releasing %llu bytes",
                  name, (unsigned long long)s1.pooled_bytes, (unsigned long long)s2.pooled_bytes,
                  (unsigned long long)block);
    ck_assert_msg(s2.peak_bytes >= s1.in_use_bytes, "%s: the peak forgot the tensor", name);
    /* The same size again: served by the pool. */
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 1, &n, &t));
    const kiln_memory_stats_t s3 = kg_stats(dev);
    ck_assert_msg(s3.allocations == s2.allocations, "%s: %llu allocations -> %llu for a size the pool holds", name,
                  (unsigned long long)s2.allocations, (unsigned long long)s3.allocations);
    ck_assert_msg(s3.in_use_bytes == s1.in_use_bytes && s3.pooled_bytes == s1.pooled_bytes,
                  "%s: in use %llu, pooled %llu; expected %llu and %llu", name, (unsigned long long)s3.in_use_bytes,
                  (unsigned long long)s3.pooled_bytes, (unsigned long long)s1.in_use_bytes,
                  (unsigned long long)s1.pooled_bytes);
    kiln_tensor_release(t);
    KT_OK(kiln_device_memory_reset_peak(dev));
    const kiln_memory_stats_t s4 = kg_stats(dev);
    ck_assert_msg(s4.peak_bytes == s4.in_use_bytes, "%s: after reset_peak, peak %llu but in use %llu", name,
                  (unsigned long long)s4.peak_bytes, (unsigned long long)s4.in_use_bytes);
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 1, &n, &t));
    kiln_tensor_release(t);
    const kiln_memory_stats_t s5 = kg_stats(dev);
    ck_assert_msg(s5.peak_bytes == s4.in_use_bytes + block && s5.in_use_bytes == s4.in_use_bytes,
                  "%s: peak %llu after a tensor of %llu bytes came and went over %llu in use", name,
                  (unsigned long long)s5.peak_bytes, (unsigned long long)block, (unsigned long long)s4.in_use_bytes);
  }
}
END_TEST

/* A training loop: each iteration computes a gradient (a new tensor from the
 * pool, released at the end), accumulates it, and updates two parameters
 * with SGD (momentum, Nesterov, weight decay) and Adam. After the first
 * iteration the pool serves every allocation: the allocation count, bytes in
 * use and the peak stay where the first iteration left them. Updates alone
 * allocate nothing from the start. */
START_TEST(test_update_loop_allocates_nothing) {
  const int64_t shape[2] = {37, 53};
  const kiln_sgd_params_t sgd = {0.05, 0.9, 0, 1e-4, true, false};
  const kiln_adam_params_t adam = {1e-3, 0.9, 0.999, 1e-8, 0.01};
  for (size_t d = 0; d < kg_ndev; d++) {
    kiln_device_t *dev = kg_devs[d];
    const char *name = kiln_device_name(dev);
    kiln_tensor_t *x = NULL, *dy = NULL, *acc = NULL, *p1 = NULL, *buf = NULL, *p2 = NULL, *m = NULL, *v = NULL;
    KT_OK(kiln_tensor_uniform(dev, 2, shape, 1, -2, 2, &x));
    KT_OK(kiln_tensor_uniform(dev, 2, shape, 2, -1, 1, &dy));
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 2, shape, &acc));
    KT_OK(kiln_tensor_uniform(dev, 2, shape, 3, -1, 1, &p1));
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 2, shape, &buf));
    KT_OK(kiln_tensor_uniform(dev, 2, shape, 4, -1, 1, &p2));
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 2, shape, &m));
    KT_OK(kiln_tensor_zeros(dev, KILN_F32, 2, shape, &v));
    kiln_memory_stats_t first = {0, 0, 0, 0};
    for (int it = 1; it <= 10; it++) {
      kiln_tensor_t *g = NULL;
      KT_OK(kiln_tensor_unary_backward(KILN_UNARY_TANH, x, dy, &g));
      KT_OK(kiln_tensor_accumulate(acc, 1.0, g));
      KT_OK(kiln_tensor_sgd_update(p1, acc, buf, &sgd));
      KT_OK(kiln_tensor_adam_update(p2, acc, m, v, it, &adam));
      kiln_tensor_release(g);
      const kiln_memory_stats_t now = kg_stats(dev);
      if (it == 1) {
        first = now;
        continue;
      }
      ck_assert_msg(now.allocations == first.allocations && now.in_use_bytes == first.in_use_bytes &&
                        now.peak_bytes == first.peak_bytes,
                    "%s: iteration %d: %llu allocations, %llu bytes in use, peak %llu; after the first iteration "
                    "%llu, %llu, %llu",
                    name, it, (unsigned long long)now.allocations, (unsigned long long)now.in_use_bytes,
                    (unsigned long long)now.peak_bytes, (unsigned long long)first.allocations,
                    (unsigned long long)first.in_use_bytes, (unsigned long long)first.peak_bytes);
    }
    /* Updates alone: nothing from the first call on. */
    const kiln_memory_stats_t before = kg_stats(dev);
    for (int it = 11; it <= 20; it++) {
      KT_OK(kiln_tensor_accumulate(acc, -0.5, dy));
      KT_OK(kiln_tensor_sgd_update(p1, acc, buf, &sgd));
      KT_OK(kiln_tensor_adam_update(p2, acc, m, v, it, &adam));
      const kiln_memory_stats_t now = kg_stats(dev);
      ck_assert_msg(now.allocations == before.allocations && now.in_use_bytes == before.in_use_bytes,
                    "%s: update iteration %d: %llu allocations and %llu bytes in use, %llu and %llu before", name,
                    it, (unsigned long long)now.allocations, (unsigned long long)now.in_use_bytes,
                    (unsigned long long)before.allocations, (unsigned long long)before.in_use_bytes);
    }
    /* The loop did run: the parameters moved and stayed finite. */
    static float a[37 * 53], b[37 * 53];
    KT_OK(kiln_tensor_read(p1, a, sizeof a));
    kiln_tensor_t *p1_start = NULL;
    KT_OK(kiln_tensor_uniform(dev, 2, shape, 3, -1, 1, &p1_start));
    KT_OK(kiln_tensor_read(p1_start, b, sizeof b));
    ck_assert_msg(isfinite(a[0]) && a[0] != b[0], "%s: SGD left param at %g (started at %g)", name, (double)a[0],
                  (double)b[0]);
    KT_OK(kiln_tensor_read(p2, a, sizeof a));
    ck_assert_msg(isfinite(a[0]), "%s: Adam made param %g", name, (double)a[0]);
    kiln_tensor_t *all[] = {x, dy, acc, p1, buf, p2, m, v, p1_start};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) kiln_tensor_release(all[i]);
  }
}
END_TEST

/* ---- main --------------------------------------------------------------------------------------- */

static Suite *kg_suite(void) {
  Suite *s = suite_create("grad");
  TCase *fd = tcase_create("finite differences");
  tcase_add_test(fd, test_unary_backward);
  tcase_add_test(fd, test_softmax_backward);
  tcase_add_test(fd, test_cross_entropy_backward);
  tcase_add_test(fd, test_conv2d_backward);
  tcase_add_test(fd, test_max_pool2d_backward);
  tcase_add_test(fd, test_sum_to_and_broadcast_to);
  tcase_add_test(fd, test_broadcast_binary_backward);
  suite_add_tcase(s, fd);
  TCase *torch = tcase_create("pytorch");
  tcase_add_loop_test(torch, test_pytorch_reference, 0,
                      (int)(sizeof kg_reference_names / sizeof kg_reference_names[0]));
  tcase_add_test(torch, test_adam_step_against_float64);
  suite_add_tcase(s, torch);
  TCase *memory = tcase_create("memory");
  tcase_add_test(memory, test_memory_stats);
  tcase_add_test(memory, test_update_loop_allocates_nothing);
  suite_add_tcase(s, memory);
  return s;
}

int main(void) {
  kt_private_cache_dir();
  const char *only = getenv("KILN_GRAD_BACKEND");
  if (only && !*only) only = NULL;
  const char *small = getenv("KILN_GRAD_SMALL");
  kg_small = small && *small && strcmp(small, "0") != 0;
  kiln_status_t status = kiln_ensure_initialized();
  if (status != KILN_OK) {
    if (only) {
      printf("no %s device: kiln did not start: %s\n", only, kiln_last_error());
      return 77;
    }
    fprintf(stderr, "kiln did not start (%s): %s\n", kiln_status_name(status), kiln_last_error());
    return 1;
  }
  size_t count = 0;
  status = kiln_device_count(&count);
  for (size_t i = 0; i < count && kg_ndev < KG_MAX_DEVICES && status == KILN_OK; i++) {
    kiln_device_t *d = NULL;
    kiln_device_info_t info;
    status = kiln_device_get(i, &d);
    if (status == KILN_OK) status = kiln_device_info(d, &info);
    if (status == KILN_OK && (!only || !strcmp(info.backend, only))) kg_devs[kg_ndev++] = d;
  }
  if (status != KILN_OK) {
    fprintf(stderr, "listing the devices failed (%s): %s\n", kiln_status_name(status), kiln_last_error());
    kiln_deinitialize();
    return 1;
  }
  if (kg_ndev == 0) {
    const char *backend = getenv("KILN_BACKEND"), *device = getenv("KILN_DEVICE");
    printf("no %s device visible (KILN_BACKEND=%s, KILN_DEVICE=%s)\n", only ? only : "", backend ? backend : "(unset)",
           device ? device : "(unset)");
    kiln_deinitialize();
    return 77;
  }
  printf("grad%s: references in %s; devices:", kg_small ? " (no device differences)" : "", kg_reference_dir());
  for (size_t d = 0; d < kg_ndev; d++) printf(" %s", kiln_device_name(kg_devs[d]));
  printf("\n");
  fflush(stdout);
  SRunner *runner = srunner_create(kg_suite());
  /* One process: kiln started above, and its worker threads do not survive a fork. */
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  printf("grad: %lu gradient elements compared\n", kg_checked);
  kiln_deinitialize();
  return failed == 0 ? 0 : 1;
}
