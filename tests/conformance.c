/* tests/conformance.c: every operation on every visible device and provider, against the CPU backend's native kernels. */
/*
 * Each case builds its inputs from deterministic host data on a device, runs
 * one operation of include/kiln/tensor.h and reads the result back. It runs
 * once on cpu:0 with kiln's own kernels (policy portable, no overrides): the
 * reference. Then, on every device under test, once per provider the device
 * lists for the operation (kiln_device_providers), with that provider forced
 * through kiln_set_providers. Results must match the reference within the
 * operation's tolerance; where the reference call fails (a dtype the op does
 * not take, an empty axis for max), the device must fail with the same status.
 *
 * Environment:
 *   KILN_CONFORMANCE_BACKEND=<name>  test only that backend's devices; exit 77
 *                                    with the backend's reason when it has none
 *   KILN_CONFORMANCE_SMALL=1         only small shapes (simulators such as
 *                                    Oclgrind), still every op and edge kind
 * Other backends join by being present: KILN_BACKEND picks what loads.
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>

#include "common.h"

/* ---- devices ----------------------------------------------------------------- */

#define KT_MAX_DEVICES 64

static kiln_device_t *kt_ref;                  /* cpu:0, native kernels */
static kiln_device_t *kt_devs[KT_MAX_DEVICES]; /* under test */
static size_t kt_ndev;
static bool kt_small;
static unsigned long kt_checks;                /* comparisons made, for the summary */
/* Comparisons per device and provider name, for the summary. */
static struct {
  char provider[40];
  unsigned long count;
} kt_tally[KT_MAX_DEVICES][16];

static void kt_count(size_t device, const char *provider) {
  if (strcmp(provider, "unsupported") != 0) kt_checks++;
  for (int i = 0; i < 16; i++) {
    if (!kt_tally[device][i].provider[0])
      snprintf(kt_tally[device][i].provider, sizeof kt_tally[device][i].provider, "%s", provider);
    if (!strcmp(kt_tally[device][i].provider, provider)) {
      kt_tally[device][i].count++;
      return;
    }
  }
}

/* ---- tolerances -------------------------------------------------------------------
 * A value passes when it equals the reference (NaN matches NaN), or lies within
 * atol + rtol * |expected|, or within `ulps` units in the last place. All zero
 * means exact. i32 results are always compared exactly. */
typedef struct kt_tol_t {
  double rtol, atol;
  int ulps;
} kt_tol_t;

static const kt_tol_t kt_exact = {0, 0, 0};

/* Elementwise transcendental f32 ops: a few ulps (OpenCL allows 3-5 for exp,
 * log, tanh; CUDA 1-2), plus a tiny absolute slack for results near zero. */
static kt_tol_t kt_ulps(int ulps) {
  kt_tol_t t = {0, 1e-7, ulps};
  return t;
}

/* Sums of `k` products or terms of magnitude about `scale`: relative 1e-4,
 * absolute growing with sqrt(k) (the rounding of a long sum in another order). */
static kt_tol_t kt_sum_tol(int64_t k, double scale) {
  kt_tol_t t = {1e-4, 1e-5 * sqrt((double)(k > 1 ? k : 1)) * scale, 4};
  return t;
}

static int64_t kt_ordered(float f) {
  int32_t i;
  memcpy(&i, &f, sizeof i);
  return i < 0 ? (int64_t)INT32_MIN - (int64_t)i : (int64_t)i;
}

static bool kt_close(float got, float want, kt_tol_t tol) {
  if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
  if (got == want) return true;
  if (isinf(got) || isinf(want)) return false;
  if (fabs((double)got - (double)want) <= tol.atol + tol.rtol * fabs((double)want)) return true;
  int64_t d = kt_ordered(got) - kt_ordered(want);
  return tol.ulps > 0 && (d < 0 ? -d : d) <= tol.ulps;
}

static void kt_tol_text(kiln_dtype_t dtype, kt_tol_t tol, char *out, size_t size) {
  if (dtype == KILN_I32 || (tol.rtol == 0 && tol.atol == 0 && tol.ulps == 0))
    snprintf(out, size, "exact");
  else
    snprintf(out, size, "rtol %g, atol %g, %d ulps", tol.rtol, tol.atol, tol.ulps);
}

/* ---- inputs ----------------------------------------------------------------------- */

/* How input values are drawn (deterministic in the seed and the index). */
typedef enum kt_gen_t {
  KT_SIGNED,   /* f32 in [-1, 1), multiples of 2^-12 */
  KT_WIDE,     /* f32 in [-4, 4) */
  KT_POSITIVE, /* f32 in [1/64, 4] */
  KT_BIG,      /* f32 in [-100, 100]: softmax must subtract the max */
  KT_STEPS,    /* f32 small integers in [-3, 3]: many ties for max/argmax */
  KT_INT,      /* i32 in [-50, 50] */
  KT_INT_EDGE, /* i32 over the whole range, with INT_MIN, INT_MAX, -1, 0 planted */
  KT_INT_DIV,  /* i32 in [-5, 5], zeros included, INT_MIN / -1 planted */
  KT_LABELS,   /* i32 in [0, hi) */
} kt_gen_t;

typedef struct kt_in_t {
  kiln_dtype_t dtype;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  kt_gen_t gen;
  int64_t hi;    /* KT_LABELS */
  uint32_t seed;
  bool view;     /* a non-contiguous view: reversed storage, then permuted back */
} kt_in_t;

static uint32_t kt_hash(uint32_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 32 | seed);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 32;
  return (uint32_t)x;
}

static int64_t kt_numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

static void kt_fill(const kt_in_t *in, void *data, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t h = kt_hash(in->seed, (uint64_t)i);
    float *f = (float *)data + i;
    int32_t *v = (int32_t *)data + i;
    switch (in->gen) {
      case KT_SIGNED: *f = (float)((int32_t)(h % 8192) - 4096) / 4096.0f; break;
      case KT_WIDE: *f = (float)((int32_t)(h % 8192) - 4096) / 1024.0f; break;
      case KT_POSITIVE: *f = (float)(1 + h % 256) / 64.0f; break;
      case KT_BIG: *f = (float)((int32_t)(h % 20001) - 10000) / 100.0f; break;
      case KT_STEPS: *f = (float)((int32_t)(h % 7) - 3); break;
      case KT_INT: *v = (int32_t)(h % 101) - 50; break;
      case KT_INT_EDGE: {
        static const int32_t planted[] = {INT32_MIN, INT32_MAX, -1, 0, 1, INT32_MIN + 1};
        *v = i < 6 ? planted[i] : (int32_t)h;
        break;
      }
      case KT_INT_DIV: {
        static const int32_t planted[] = {INT32_MIN, -1, 7, 0, -7, 2};
        *v = i < 6 ? planted[i] : (int32_t)(h % 11) - 5;
        break;
      }
      case KT_LABELS: *v = (int32_t)(h % (uint32_t)(in->hi > 0 ? in->hi : 1)); break;
    }
  }
}

/* Make the input on `dev`; *out is the tensor the op receives. */
static kiln_status_t kt_make(kiln_device_t *dev, const kt_in_t *in, kiln_tensor_t **out) {
  int64_t n = kt_numel(in->ndim, in->shape);
  void *data = malloc((size_t)(n > 0 ? n : 1) * 4);
  if (!data) return KILN_OUT_OF_MEMORY;
  kt_fill(in, data, n);
  kiln_status_t status;
  if (!in->view || in->ndim < 2) {
    status = kiln_tensor_from_host(dev, in->dtype, in->ndim, in->shape, data, out);
  } else {
    int64_t storage[KILN_MAX_DIMS];
    int perm[KILN_MAX_DIMS];
    for (int i = 0; i < in->ndim; i++) {
      storage[i] = in->shape[in->ndim - 1 - i];
      perm[i] = in->ndim - 1 - i;
    }
    kiln_tensor_t *base = NULL;
    status = kiln_tensor_from_host(dev, in->dtype, in->ndim, storage, data, &base);
    if (status == KILN_OK) status = kiln_tensor_permute(base, perm, out);
    kiln_tensor_release(base);
  }
  free(data);
  return status;
}

static void kt_shape_text(int ndim, const int64_t *shape, char *out, size_t size) {
  size_t used = 0;
  out[0] = '\0';
  used += (size_t)snprintf(out, size, "[");
  for (int i = 0; i < ndim && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%lld", i ? "x" : "", (long long)shape[i]);
  if (used < size) snprintf(out + used, size - used, "]");
}

/* ---- cases -------------------------------------------------------------------------- */

typedef enum kt_family_t {
  KT_UNARY, KT_BINARY, KT_SCALAR, KT_MATMUL, KT_SUM, KT_MEAN, KT_MAX, KT_ARGMAX, KT_NORM, KT_SOFTMAX,
  KT_LOG_SOFTMAX, KT_CROSS_ENTROPY, KT_CONV2D, KT_MAX_POOL2D,
  KT_ZEROS, KT_ONES, KT_FULL, KT_ARANGE, KT_UNIFORM, KT_NORMAL, KT_FROM_HOST,
  KT_COPY_SAME, KT_COPY_FROM_REF, KT_COPY_TO_REF, KT_TO_FROM_REF, KT_CONTIGUOUS, KT_RESHAPE,
} kt_family_t;

typedef struct kt_case_t {
  kt_family_t family;
  const char *op;   /* the KILN_PROVIDER op name whose providers are tried */
  int sub;          /* kiln_unary_op_t / kiln_binary_op_t */
  int n_in;
  kt_in_t in[3];
  double scalar;    /* binary_scalar; fill value; arange start */
  double stop, step;
  uint64_t seed;
  float a, b;       /* random */
  kiln_dtype_t dtype; /* creation */
  int axis;
  bool keepdim, trans_a, trans_b;
  kiln_conv2d_params_t conv;
  kiln_pool2d_params_t pool;
  kt_tol_t tol;
  char label[640];
} kt_case_t;

static kiln_status_t kt_run(kiln_device_t *dev, const kt_case_t *c, kiln_tensor_t **out) {
  kiln_tensor_t *in[3] = {NULL, NULL, NULL};
  kiln_status_t status = KILN_OK;
  /* Creation and copies from cpu:0 make their own inputs. */
  bool inputs_on_ref = c->family == KT_COPY_FROM_REF || c->family == KT_TO_FROM_REF;
  for (int i = 0; i < c->n_in && status == KILN_OK; i++) status = kt_make(inputs_on_ref ? kt_ref : dev, &c->in[i], &in[i]);
  if (status == KILN_OK) {
    const int64_t *shape = c->in[0].shape;
    int ndim = c->in[0].ndim;
    switch (c->family) {
      case KT_UNARY: status = kiln_tensor_unary((kiln_unary_op_t)c->sub, in[0], out); break;
      case KT_BINARY: status = kiln_tensor_binary((kiln_binary_op_t)c->sub, in[0], in[1], out); break;
      case KT_SCALAR: status = kiln_tensor_binary_scalar((kiln_binary_op_t)c->sub, in[0], c->scalar, out); break;
      case KT_MATMUL: status = kiln_tensor_matmul(in[0], in[1], c->trans_a, c->trans_b, out); break;
      case KT_SUM: status = kiln_tensor_sum(in[0], c->axis, c->keepdim, out); break;
      case KT_MEAN: status = kiln_tensor_mean(in[0], c->axis, c->keepdim, out); break;
      case KT_MAX: status = kiln_tensor_max(in[0], c->axis, c->keepdim, out); break;
      case KT_ARGMAX: status = kiln_tensor_argmax(in[0], c->axis, c->keepdim, out); break;
      case KT_NORM: status = kiln_tensor_norm(in[0], out); break;
      case KT_SOFTMAX: status = kiln_tensor_softmax(in[0], out); break;
      case KT_LOG_SOFTMAX: status = kiln_tensor_log_softmax(in[0], out); break;
      case KT_CROSS_ENTROPY: status = kiln_tensor_cross_entropy(in[0], in[1], out); break;
      case KT_CONV2D: status = kiln_tensor_conv2d(in[0], in[1], c->n_in > 2 ? in[2] : NULL, &c->conv, out); break;
      case KT_MAX_POOL2D: status = kiln_tensor_max_pool2d(in[0], &c->pool, out); break;
      case KT_ZEROS: status = kiln_tensor_zeros(dev, c->dtype, ndim, shape, out); break;
      case KT_ONES: status = kiln_tensor_ones(dev, c->dtype, ndim, shape, out); break;
      case KT_FULL: status = kiln_tensor_full(dev, c->dtype, ndim, shape, c->scalar, out); break;
      case KT_ARANGE: status = kiln_tensor_arange(dev, c->dtype, c->scalar, c->stop, c->step, out); break;
      case KT_UNIFORM: status = kiln_tensor_uniform(dev, ndim, shape, c->seed, c->a, c->b, out); break;
      case KT_NORMAL: status = kiln_tensor_normal(dev, ndim, shape, c->seed, c->a, c->b, out); break;
      case KT_FROM_HOST: *out = kiln_tensor_retain(in[0]); break;
      case KT_COPY_SAME: status = kiln_tensor_copy(in[0], dev, out); break;
      case KT_COPY_FROM_REF: status = kiln_tensor_copy(in[0], dev, out); break;
      case KT_COPY_TO_REF: status = kiln_tensor_copy(in[0], kt_ref, out); break;
      case KT_TO_FROM_REF: status = kiln_tensor_to(in[0], dev, out); break;
      case KT_CONTIGUOUS: status = kiln_tensor_contiguous(in[0], out); break;
      case KT_RESHAPE: {
        int64_t flat = kt_numel(ndim, shape);
        status = kiln_tensor_reshape(in[0], 1, &flat, out);
        break;
      }
    }
  }
  for (int i = 0; i < 3; i++) kiln_tensor_release(in[i]);
  return status;
}

/* A result read back to the host. */
typedef struct kt_result_t {
  kiln_status_t status;
  char message[512];
  kiln_dtype_t dtype;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t numel;
  void *data;
  kiln_device_t *device;
  char ran[16]; /* the provider that ran the op, kiln_last_provider() */
} kt_result_t;

static void kt_result_get(kiln_device_t *dev, const kt_case_t *c, kt_result_t *r) {
  memset(r, 0, sizeof *r);
  kiln_clear_error();
  kiln_tensor_t *t = NULL;
  r->status = kt_run(dev, c, &t);
  snprintf(r->ran, sizeof r->ran, "%s", kiln_last_provider());
  if (r->status == KILN_OK) {
    r->dtype = kiln_tensor_dtype(t);
    r->ndim = kiln_tensor_ndim(t);
    memcpy(r->shape, kiln_tensor_shape(t), sizeof(int64_t) * (size_t)r->ndim);
    r->numel = kiln_tensor_numel(t);
    r->device = kiln_tensor_device(t);
    size_t bytes = (size_t)r->numel * kiln_dtype_size(r->dtype);
    r->data = malloc(bytes ? bytes : 1);
    r->status = r->data ? kiln_tensor_read(t, r->data, bytes) : KILN_OUT_OF_MEMORY;
  }
  if (r->status != KILN_OK) snprintf(r->message, sizeof r->message, "%s", kiln_last_error());
  kiln_tensor_release(t);
}

static void kt_result_free(kt_result_t *r) {
  free(r->data);
  r->data = NULL;
}

/* Failures of the current test: all are printed, the first is asserted. */
static int kt_failures;
static char kt_first_failure[2048];

static void kt_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void kt_fail(const char *fmt, ...) {
  char text[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(text, sizeof text, fmt, args);
  va_end(args);
  fprintf(stderr, "FAIL: %s\n", text);
  if (kt_failures++ == 0) snprintf(kt_first_failure, sizeof kt_first_failure, "%s", text);
}

static void kt_index_text(const kt_result_t *r, int64_t flat, char *out, size_t size) {
  int64_t idx[KILN_MAX_DIMS];
  for (int i = r->ndim - 1; i >= 0; i--) {
    idx[i] = r->shape[i] ? flat % r->shape[i] : 0;
    flat = r->shape[i] ? flat / r->shape[i] : 0;
  }
  size_t used = (size_t)snprintf(out, size, "(");
  for (int i = 0; i < r->ndim && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%lld", i ? ", " : "", (long long)idx[i]);
  if (used < size) snprintf(out + used, size - used, ")");
}

/* Compare one device/provider result with the reference. */
static void kt_compare(const kt_case_t *c, kiln_device_t *dev, const char *provider, const kt_result_t *want,
                       const kt_result_t *got) {
  const char *where = kiln_device_name(dev);
  if (want->status != KILN_OK) {
    if (got->status != want->status)
      kt_fail("%s on %s, provider %s: got %s (%s), but cpu:0 native says %s (%s)", c->label, where, provider,
              kiln_status_name(got->status), got->message, kiln_status_name(want->status), want->message);
    return;
  }
  if (got->status != KILN_OK) {
    kt_fail("%s on %s, provider %s: failed with %s: %s", c->label, where, provider, kiln_status_name(got->status),
            got->message);
    return;
  }
  kiln_device_t *expected_device = c->family == KT_COPY_TO_REF ? kt_ref : dev;
  if (got->device != expected_device) {
    kt_fail("%s on %s, provider %s: the result lives on %s, expected %s", c->label, where, provider,
            kiln_device_name(got->device), kiln_device_name(expected_device));
    return;
  }
  char ws[160], gs[160];
  kt_shape_text(want->ndim, want->shape, ws, sizeof ws);
  kt_shape_text(got->ndim, got->shape, gs, sizeof gs);
  if (got->dtype != want->dtype || strcmp(ws, gs) != 0) {
    kt_fail("%s on %s, provider %s: result is %s %s, expected %s %s", c->label, where, provider,
            kiln_dtype_name(got->dtype), gs, kiln_dtype_name(want->dtype), ws);
    return;
  }
  char tol[96];
  kt_tol_text(want->dtype, c->tol, tol, sizeof tol);
  for (int64_t i = 0; i < want->numel; i++) {
    bool ok;
    char gv[48], wv[48];
    if (want->dtype == KILN_I32) {
      int32_t g = ((const int32_t *)got->data)[i], w = ((const int32_t *)want->data)[i];
      ok = g == w;
      snprintf(gv, sizeof gv, "%d", (int)g);
      snprintf(wv, sizeof wv, "%d", (int)w);
    } else {
      float g = ((const float *)got->data)[i], w = ((const float *)want->data)[i];
      ok = kt_close(g, w, c->tol);
      snprintf(gv, sizeof gv, "%.9g", (double)g);
      snprintf(wv, sizeof wv, "%.9g", (double)w);
    }
    if (!ok) {
      char at[160];
      kt_index_text(want, i, at, sizeof at);
      kt_fail("%s on %s, provider %s (ran %s), shape %s: first mismatch at element %lld %s: got %s, expected %s "
              "(tolerance %s)",
              c->label, where, provider, got->ran, ws, (long long)i, at, gv, wv, tol);
      return;
    }
  }
}

/* Run a case on the reference, then on every device with every provider. */
static void kt_check(const kt_case_t *c) {
  kt_result_t want;
  KT_OK(kiln_set_providers(""));
  kt_result_get(kt_ref, c, &want);
  for (size_t d = 0; d < kt_ndev; d++) {
    const char *list = kiln_device_providers(kt_devs[d], c->op);
    ck_assert_msg(list != NULL, "kiln_device_providers does not know the op \"%s\"", c->op);
    if (!list[0]) {
      /* The device has no kernel for this op in any dtype: skipped, as
       * ggml's test-backend-ops does, and listed in the summary. */
      kt_count(d, "unsupported");
      continue;
    }
    char providers[128];
    snprintf(providers, sizeof providers, "%s", list);
    char *save = NULL;
    for (char *p = strtok_r(providers, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
      char override[96];
      snprintf(override, sizeof override, "%s=%s", c->op, p);
      KT_OK(kiln_set_providers(override));
      kt_result_t got;
      kt_result_get(kt_devs[d], c, &got);
      /* A provider may decline particular arguments (the core then runs
       * native): the summary shows how often, as "provider>native". An
       * empty result enqueues nothing, so says nothing about it. */
      char tally[40];
      bool other = got.status == KILN_OK && got.numel > 0 && got.ran[0] && strcmp(got.ran, p) != 0;
      snprintf(tally, sizeof tally, "%s%s%s", p, other ? ">" : "", other ? got.ran : "");
      kt_count(d, tally);
      kt_compare(c, kt_devs[d], p, &want, &got);
      kt_result_free(&got);
    }
  }
  KT_OK(kiln_set_providers(""));
  kt_result_free(&want);
}

/* Start and end of every test: failures are collected, then asserted once. */
static void kt_begin(void) {
  kt_failures = 0;
  kt_first_failure[0] = '\0';
}
static void kt_end(void) {
  ck_assert_msg(kt_failures == 0, "%d mismatch(es); the first: %s", kt_failures, kt_first_failure);
}

/* ---- builders of inputs and labels ------------------------------------------------------- */

static kt_in_t kt_in(kiln_dtype_t dtype, kt_gen_t gen, uint32_t seed, int ndim, const int64_t *shape, bool view) {
  kt_in_t in;
  memset(&in, 0, sizeof in);
  in.dtype = dtype;
  in.gen = gen;
  in.seed = seed;
  in.ndim = ndim;
  for (int i = 0; i < ndim; i++) in.shape[i] = shape[i];
  in.view = view && ndim >= 2;
  return in;
}

static void kt_in_text(const kt_in_t *in, char *out, size_t size) {
  char s[128];
  kt_shape_text(in->ndim, in->shape, s, sizeof s);
  snprintf(out, size, "%s %s%s", kiln_dtype_name(in->dtype), s, in->view ? " (permuted view)" : "");
}

static kt_case_t kt_case(kt_family_t family, const char *op) {
  kt_case_t c;
  memset(&c, 0, sizeof c);
  c.family = family;
  c.op = op;
  c.tol = kt_exact;
  return c;
}

/* A shape list entry: ndim then sizes (ndim -1 ends a list). */
typedef struct kt_shape_t {
  int ndim;
  int64_t s[KILN_MAX_DIMS];
  bool view;
  bool large; /* left out under KILN_CONFORMANCE_SMALL */
} kt_shape_t;

/* Shapes for elementwise ops: 0-d, empty, one element, primes, larger than a
 * work-group, and permuted views. */
static const kt_shape_t kt_elementwise_shapes[] = {
    {0, {0}, false, false},         {1, {0}, false, false},         {1, {1}, false, false},
    {1, {7}, false, false},         {2, {3, 0}, false, false},      {2, {3, 5}, true, false},
    {3, {2, 3, 4}, true, false},    {1, {257}, false, true},        {2, {13, 257}, false, true},
    {2, {13, 257}, true, true},     {4, {2, 3, 5, 7}, true, true},  {1, {262147}, false, true},
    {-1, {0}, false, false},
};

/* Broadcasting pairs. */
static const kt_shape_t kt_broadcast_pairs[][2] = {
    {{2, {3, 1}, false, false}, {2, {1, 4}, false, false}},
    {{3, {2, 1, 3}, false, false}, {1, {3}, false, false}},
    {{0, {0}, false, false}, {2, {2, 3}, false, false}},
    {{2, {0, 3}, false, false}, {1, {3}, false, false}},
    {{2, {3, 4}, true, false}, {2, {3, 1}, false, false}},
    {{1, {1}, false, false}, {1, {5}, false, false}},
    {{2, {13, 1}, false, true}, {2, {1, 257}, false, true}},
    {{3, {2, 1, 7}, false, true}, {2, {13, 1}, false, true}},
    {{2, {13, 257}, true, true}, {1, {257}, false, true}},
};

static bool kt_skip(const kt_shape_t *s) { return kt_small && s->large; }

/* ---- tests: creation ---------------------------------------------------------------- */

static const kt_shape_t kt_creation_shapes[] = {
    {0, {0}, false, false}, {1, {0}, false, false}, {1, {1}, false, false},
    {2, {3, 7}, false, false}, {2, {13, 257}, false, true}, {-1, {0}, false, false},
};

START_TEST(test_fill) {
  kt_begin();
  static const struct { kt_family_t f; const char *name; double value; } fills[] = {
      {KT_ZEROS, "zeros", 0}, {KT_ONES, "ones", 1}, {KT_FULL, "full", 2.5}, {KT_FULL, "full", -7}};
  for (size_t f = 0; f < sizeof fills / sizeof fills[0]; f++) {
    for (int dt = 0; dt < 2; dt++) {
      for (const kt_shape_t *s = kt_creation_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        kt_case_t c = kt_case(fills[f].f, "fill");
        c.dtype = dt ? KILN_I32 : KILN_F32;
        c.scalar = fills[f].value;
        c.in[0] = kt_in(c.dtype, KT_SIGNED, 0, s->ndim, s->s, false);
        char shape[128];
        kt_shape_text(s->ndim, s->s, shape, sizeof shape);
        snprintf(c.label, sizeof c.label, "%s(%g) %s %s", fills[f].name, fills[f].value, kiln_dtype_name(c.dtype),
                 shape);
        kt_check(&c);
      }
    }
  }
  kt_end();
}
END_TEST

START_TEST(test_arange) {
  kt_begin();
  static const struct { kiln_dtype_t dtype; double start, stop, step; } ranges[] = {
      {KILN_F32, 0, 10, 1},     {KILN_F32, 5, -3, -0.5},  {KILN_F32, 0, 1, 0.1},   {KILN_F32, 3, 3, 1},
      {KILN_F32, 0, 1, 2},      {KILN_F32, -1000, 1000, 0.75}, {KILN_I32, -7, 20, 3}, {KILN_I32, 0, 0, 1},
      {KILN_I32, 10, -10, -1},  {KILN_I32, 0, 1, 1},
  };
  for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
    kt_case_t c = kt_case(KT_ARANGE, "arange");
    c.dtype = ranges[i].dtype;
    c.scalar = ranges[i].start;
    c.stop = ranges[i].stop;
    c.step = ranges[i].step;
    /* start + i*step in f32 on a device without fp64: one rounding more. */
    c.tol = kt_ulps(2);
    snprintf(c.label, sizeof c.label, "arange(%g, %g, %g) %s", c.scalar, c.stop, c.step, kiln_dtype_name(c.dtype));
    kt_check(&c);
  }
  kt_end();
}
END_TEST

START_TEST(test_random) {
  kt_begin();
  static const uint64_t seeds[] = {0, 42, (1ull << 40) + 7};
  static const kt_shape_t shapes[] = {
      {0, {0}, false, false}, {1, {0}, false, false}, {1, {1}, false, false}, {2, {3, 7}, false, false},
      {1, {1237}, false, true}, {3, {4, 5, 67}, false, true}, {-1, {0}, false, false},
  };
  for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
    for (const kt_shape_t *s = shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      for (int normal = 0; normal < 2; normal++) {
        kt_case_t c = kt_case(normal ? KT_NORMAL : KT_UNIFORM, "random");
        c.in[0] = kt_in(KILN_F32, KT_SIGNED, 0, s->ndim, s->s, false);
        c.seed = seeds[k];
        c.a = normal ? 1.0f : -2.0f;
        c.b = normal ? 0.5f : 3.0f;
        /* The same Philox stream on every device: within 1e-6 relative (and
         * 1e-6 of the spread near zero, where normal's log and cos dominate). */
        c.tol.rtol = 1e-6;
        c.tol.atol = 1e-6 * (normal ? c.b : c.b - c.a);
        c.tol.ulps = 2;
        char shape[128];
        kt_shape_text(s->ndim, s->s, shape, sizeof shape);
        snprintf(c.label, sizeof c.label, "%s(seed %llu, %g, %g) %s", normal ? "normal" : "uniform",
                 (unsigned long long)c.seed, (double)c.a, (double)c.b, shape);
        kt_check(&c);
      }
    }
  }
  kt_end();
}
END_TEST

/* ---- tests: movement ---------------------------------------------------------------- */

START_TEST(test_movement) {
  kt_begin();
  static const struct { kt_family_t f; const char *name; } moves[] = {
      {KT_FROM_HOST, "from_host + read"}, {KT_COPY_SAME, "copy to the same device"},
      {KT_COPY_FROM_REF, "copy from cpu:0"}, {KT_COPY_TO_REF, "copy to cpu:0"},
      {KT_TO_FROM_REF, "to from cpu:0"},  {KT_CONTIGUOUS, "contiguous"},
      {KT_RESHAPE, "reshape to 1-D"},
  };
  for (size_t m = 0; m < sizeof moves / sizeof moves[0]; m++) {
    for (int dt = 0; dt < 2; dt++) {
      for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        kiln_dtype_t dtype = dt ? KILN_I32 : KILN_F32;
        kt_case_t c = kt_case(moves[m].f, "copy");
        c.n_in = 1;
        c.in[0] = kt_in(dtype, dt ? KT_INT_EDGE : KT_WIDE, 7, s->ndim, s->s, s->view);
        char in[160];
        kt_in_text(&c.in[0], in, sizeof in);
        snprintf(c.label, sizeof c.label, "%s of %s", moves[m].name, in);
        kt_check(&c);
      }
    }
  }
  kt_end();
}
END_TEST

/* kiln_tensor_to returns the tensor itself on its own device, and a copy of
 * the values on another; a copy is always new. */
START_TEST(test_to_identity) {
  for (size_t d = 0; d < kt_ndev; d++) {
    const int64_t shape[2] = {3, 5};
    kt_in_t in = kt_in(KILN_F32, KT_WIDE, 3, 2, shape, false);
    kiln_tensor_t *t = NULL, *same = NULL, *copy = NULL;
    KT_OK(kt_make(kt_devs[d], &in, &t));
    KT_OK(kiln_tensor_to(t, kt_devs[d], &same));
    ck_assert_ptr_eq(same, t);
    KT_OK(kiln_tensor_copy(t, kt_devs[d], &copy));
    ck_assert_ptr_ne(copy, t);
    ck_assert_ptr_ne(kiln_tensor_buffer(copy), kiln_tensor_buffer(t));
    float a[15], b[15];
    KT_OK(kiln_tensor_read(t, a, sizeof a));
    KT_OK(kiln_tensor_read(copy, b, sizeof b));
    ck_assert_mem_eq(a, b, sizeof a);
    kiln_tensor_release(same);
    kiln_tensor_release(copy);
    kiln_tensor_release(t);
  }
}
END_TEST

/* ---- tests: elementwise -------------------------------------------------------------- */

static const char *const kt_unary_names[] = {
#define KT_NAME_(NAME, name) #name,
    KILN_UNARY_OPS(KT_NAME_)
#undef KT_NAME_
};
static const char *const kt_binary_names[] = {
#define KT_NAME_(NAME, name) #name,
    KILN_BINARY_OPS(KT_NAME_)
#undef KT_NAME_
};

START_TEST(test_unary) {
  kt_begin();
  for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
    bool domain = op == KILN_UNARY_LOG || op == KILN_UNARY_SQRT;
    bool transcendental = op == KILN_UNARY_EXP || op == KILN_UNARY_LOG || op == KILN_UNARY_SQRT ||
                          op == KILN_UNARY_SIGMOID || op == KILN_UNARY_TANH;
    for (int dt = 0; dt < 2; dt++) {
      for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        /* i32 for the ops without an integer formula: once, for the status. */
        if (dt && transcendental && s != kt_elementwise_shapes + 3) continue;
        kt_case_t c = kt_case(KT_UNARY, kt_unary_names[op]);
        c.sub = op;
        c.n_in = 1;
        c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT_EDGE : domain ? KT_POSITIVE : KT_WIDE, 11 + (uint32_t)op,
                        s->ndim, s->s, s->view);
        /* sqrt is correctly rounded in IEEE, but OpenCL allows 3 ulps. */
        c.tol = transcendental ? kt_ulps(op == KILN_UNARY_SIGMOID || op == KILN_UNARY_TANH ? 8 : 4) : kt_exact;
        char in[160];
        kt_in_text(&c.in[0], in, sizeof in);
        snprintf(c.label, sizeof c.label, "%s %s", kt_unary_names[op], in);
        kt_check(&c);
      }
    }
  }
  kt_end();
}
END_TEST

static kt_gen_t kt_binary_gen(int op, bool i32, bool rhs) {
  if (!i32) return KT_WIDE;
  if (op == KILN_BINARY_DIV) return rhs ? KT_INT_DIV : KT_INT_EDGE;
  return KT_INT_EDGE;
}

/* f32 add, sub, mul, maximum and minimum are exact in IEEE arithmetic; OpenCL
 * allows division 2.5 ulps. */
static kt_tol_t kt_binary_tol(int op) { return op == KILN_BINARY_DIV ? kt_ulps(3) : kt_exact; }

START_TEST(test_binary) {
  kt_begin();
  for (int op = 0; op < KILN_BINARY_COUNT_; op++) {
    for (int dt = 0; dt < 2; dt++) {
      kiln_dtype_t dtype = dt ? KILN_I32 : KILN_F32;
      /* Same shapes. */
      for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        kt_case_t c = kt_case(KT_BINARY, kt_binary_names[op]);
        c.sub = op;
        c.n_in = 2;
        c.in[0] = kt_in(dtype, kt_binary_gen(op, dt, false), 21, s->ndim, s->s, s->view);
        c.in[1] = kt_in(dtype, kt_binary_gen(op, dt, true), 22, s->ndim, s->s, false);
        c.tol = kt_binary_tol(op);
        char a[160], b[160];
        kt_in_text(&c.in[0], a, sizeof a);
        kt_in_text(&c.in[1], b, sizeof b);
        snprintf(c.label, sizeof c.label, "%s %s, %s", kt_binary_names[op], a, b);
        kt_check(&c);
      }
      /* Broadcasts. */
      for (size_t i = 0; i < sizeof kt_broadcast_pairs / sizeof kt_broadcast_pairs[0]; i++) {
        const kt_shape_t *sa = &kt_broadcast_pairs[i][0], *sb = &kt_broadcast_pairs[i][1];
        if (kt_skip(sa) || kt_skip(sb)) continue;
        for (int swap = 0; swap < 2; swap++) {
          const kt_shape_t *x = swap ? sb : sa, *y = swap ? sa : sb;
          kt_case_t c = kt_case(KT_BINARY, kt_binary_names[op]);
          c.sub = op;
          c.n_in = 2;
          c.in[0] = kt_in(dtype, kt_binary_gen(op, dt, false), 23, x->ndim, x->s, x->view);
          c.in[1] = kt_in(dtype, kt_binary_gen(op, dt, true), 24, y->ndim, y->s, y->view);
          c.tol = kt_binary_tol(op);
          char a[160], b[160];
          kt_in_text(&c.in[0], a, sizeof a);
          kt_in_text(&c.in[1], b, sizeof b);
          snprintf(c.label, sizeof c.label, "%s %s, %s (broadcast)", kt_binary_names[op], a, b);
          kt_check(&c);
        }
      }
    }
  }
  /* Operands of two dtypes: the same status everywhere. */
  const int64_t shape[1] = {4};
  kt_case_t c = kt_case(KT_BINARY, "add");
  c.sub = KILN_BINARY_ADD;
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 1, 1, shape, false);
  c.in[1] = kt_in(KILN_I32, KT_INT, 2, 1, shape, false);
  snprintf(c.label, sizeof c.label, "add f32 [4], i32 [4] (dtype mismatch)");
  kt_check(&c);
  kt_end();
}
END_TEST

START_TEST(test_binary_scalar) {
  kt_begin();
  static const double f32_scalars[] = {0.5, -3.25, 0.1, 0};
  static const double i32_scalars[] = {3, -2, 0, -1};
  for (int op = 0; op < KILN_BINARY_COUNT_; op++) {
    for (int dt = 0; dt < 2; dt++) {
      for (size_t k = 0; k < 4; k++) {
        for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
          if (kt_skip(s) || (s->ndim >= 2 && !s->view && k > 0)) continue;
          kt_case_t c = kt_case(KT_SCALAR, kt_binary_names[op]);
          c.sub = op;
          c.n_in = 1;
          c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT_EDGE : KT_WIDE, 31, s->ndim, s->s, s->view);
          c.scalar = dt ? i32_scalars[k] : f32_scalars[k];
          c.tol = kt_binary_tol(op);
          char a[160];
          kt_in_text(&c.in[0], a, sizeof a);
          snprintf(c.label, sizeof c.label, "%s_scalar %s, %g", kt_binary_names[op], a, c.scalar);
          kt_check(&c);
        }
      }
    }
  }
  kt_end();
}
END_TEST

/* ---- tests: matmul ---------------------------------------------------------------------- */

typedef struct kt_mm_t {
  int na;
  int64_t a[3];
  int nb;
  int64_t b[3];
  bool ta, tb, va, vb, large;
} kt_mm_t;

START_TEST(test_matmul) {
  kt_begin();
  static const kt_mm_t cases[] = {
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
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const kt_mm_t *m = &cases[i];
    if (kt_small && m->large) continue;
    kt_case_t c = kt_case(KT_MATMUL, "matmul");
    c.n_in = 2;
    c.in[0] = kt_in(KILN_F32, KT_SIGNED, 41, m->na, m->a, m->va);
    c.in[1] = kt_in(KILN_F32, KT_SIGNED, 42, m->nb, m->b, m->vb);
    c.trans_a = m->ta;
    c.trans_b = m->tb;
    int64_t k = m->ta ? m->a[m->na - 2] : m->a[m->na - 1];
    c.tol = kt_sum_tol(k, 1.0);
    char a[160], b[160];
    kt_in_text(&c.in[0], a, sizeof a);
    kt_in_text(&c.in[1], b, sizeof b);
    snprintf(c.label, sizeof c.label, "matmul %s%s @ %s%s", a, m->ta ? "^T" : "", b, m->tb ? "^T" : "");
    kt_check(&c);
  }
  /* Inner dimensions that differ: the same status everywhere. */
  kt_case_t c = kt_case(KT_MATMUL, "matmul");
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_SIGNED, 1, 2, (const int64_t[]){3, 4}, false);
  c.in[1] = kt_in(KILN_F32, KT_SIGNED, 2, 2, (const int64_t[]){5, 2}, false);
  snprintf(c.label, sizeof c.label, "matmul [3x4] @ [5x2] (inner dims differ)");
  kt_check(&c);
  kt_end();
}
END_TEST

/* ---- tests: reductions --------------------------------------------------------------------- */

static const kt_shape_t kt_reduce_shapes[] = {
    {0, {0}, false, false},          {1, {0}, false, false},        {1, {1}, false, false},
    {1, {7}, false, false},          {2, {3, 0}, false, false},     {3, {3, 0, 5}, false, false},
    {2, {4, 5}, true, false},        {3, {2, 3, 4}, true, false},   {1, {1237}, false, true},
    {2, {13, 257}, false, true},     {2, {13, 257}, true, true},    {4, {2, 3, 5, 7}, true, true},
    {2, {1031, 3}, false, true},     {1, {70001}, false, true},     {2, {3, 40009}, false, true},
    {2, {40009, 3}, true, true},     {-1, {0}, false, false},
};

START_TEST(test_reductions) {
  kt_begin();
  static const struct { kt_family_t f; const char *name; bool i32; } reds[] = {
      {KT_SUM, "sum", true}, {KT_MEAN, "mean", true /* i32: the status */}, {KT_MAX, "max", true},
      {KT_ARGMAX, "argmax", true},
  };
  for (size_t r = 0; r < sizeof reds / sizeof reds[0]; r++) {
    for (int dt = 0; dt < 2; dt++) {
      for (const kt_shape_t *s = kt_reduce_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        /* Every axis, the last one counted from the end, everything, and one
         * out of range (the same status everywhere). */
        int axes[KILN_MAX_DIMS + 3], n_axes = 0;
        for (int a = 0; a < s->ndim; a++) axes[n_axes++] = a;
        if (s->ndim > 0) axes[n_axes++] = -1;
        axes[n_axes++] = KILN_ALL_AXES;
        axes[n_axes++] = s->ndim + 1;
        for (int ai = 0; ai < n_axes; ai++) {
          int axis = axes[ai];
          for (int keep = 0; keep < 2; keep++) {
            if (keep && axis != KILN_ALL_AXES && axis != 0) continue;
            kt_case_t c = kt_case(reds[r].f, "reduce");
            c.n_in = 1;
            bool ties = reds[r].f == KT_MAX || reds[r].f == KT_ARGMAX;
            c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT : ties ? KT_STEPS : KT_SIGNED, 51, s->ndim, s->s,
                            s->view);
            c.axis = axis;
            c.keepdim = keep;
            int64_t len = axis == KILN_ALL_AXES ? kt_numel(s->ndim, s->s)
                          : (axis >= 0 && axis < s->ndim) ? s->s[axis]
                          : axis == -1 ? s->s[s->ndim - 1] : 1;
            c.tol = ties ? kt_exact : kt_sum_tol(len, 1.0);
            char in[160], ax_text[32];
            kt_in_text(&c.in[0], in, sizeof in);
            if (axis == KILN_ALL_AXES) snprintf(ax_text, sizeof ax_text, "all axes");
            else snprintf(ax_text, sizeof ax_text, "axis %d", axis);
            snprintf(c.label, sizeof c.label, "%s %s over %s%s", reds[r].name, in, ax_text, keep ? ", keepdim" : "");
            kt_check(&c);
          }
        }
      }
    }
  }
  /* norm over everything. */
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_reduce_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(KT_NORM, "reduce");
      c.n_in = 1;
      c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT : KT_WIDE, 52, s->ndim, s->s, s->view);
      c.tol = kt_sum_tol(kt_numel(s->ndim, s->s), 1.0);
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "norm %s", in);
      kt_check(&c);
    }
  }
  kt_end();
}
END_TEST

/* ---- tests: neural-network operations -------------------------------------------------------- */

START_TEST(test_softmax) {
  kt_begin();
  static const kt_shape_t shapes[] = {
      {0, {0}, false, false},     {1, {1}, false, false},      {1, {7}, false, false},
      {2, {3, 0}, false, false},  {2, {0, 5}, false, false},   {2, {4, 5}, true, false},
      {3, {2, 3, 4}, false, false}, {2, {13, 257}, false, true}, {2, {4, 1237}, false, true},
      {2, {257, 13}, true, true}, {2, {3, 9973}, false, true}, {-1, {0}, false, false},
  };
  for (int log = 0; log < 2; log++) {
    for (int big = 0; big < 2; big++) {
      for (const kt_shape_t *s = shapes; s->ndim >= 0; s++) {
        if (kt_skip(s)) continue;
        kt_case_t c = kt_case(log ? KT_LOG_SOFTMAX : KT_SOFTMAX, "softmax");
        c.n_in = 1;
        c.in[0] = kt_in(KILN_F32, big ? KT_BIG : KT_WIDE, 61, s->ndim, s->s, s->view);
        int64_t cols = s->ndim ? s->s[s->ndim - 1] : 1;
        c.tol.rtol = 1e-5;
        c.tol.atol = 1e-6 * sqrt((double)(cols > 1 ? cols : 1)) * (log && big ? 100.0 : 1.0);
        c.tol.ulps = 8;
        char in[160];
        kt_in_text(&c.in[0], in, sizeof in);
        snprintf(c.label, sizeof c.label, "%s %s%s", log ? "log_softmax" : "softmax", in,
                 big ? " (values up to 100)" : "");
        kt_check(&c);
      }
    }
  }
  /* i32: the status. */
  kt_case_t c = kt_case(KT_SOFTMAX, "softmax");
  c.n_in = 1;
  c.in[0] = kt_in(KILN_I32, KT_INT, 1, 1, (const int64_t[]){5}, false);
  snprintf(c.label, sizeof c.label, "softmax i32 [5] (dtype)");
  kt_check(&c);
  kt_end();
}
END_TEST

START_TEST(test_cross_entropy) {
  kt_begin();
  static const struct { int64_t n, c; bool view, large; } cases[] = {
      {1, 1, false, false}, {1, 7, false, false}, {7, 13, false, false}, {5, 3, true, false},
      {0, 5, false, false}, {5, 0, false, false}, {257, 13, false, true}, {13, 257, true, true},
      {64, 1000, false, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (kt_small && cases[i].large) continue;
    for (int big = 0; big < 2; big++) {
      kt_case_t c = kt_case(KT_CROSS_ENTROPY, "cross_entropy");
      c.n_in = 2;
      const int64_t ls[2] = {cases[i].n, cases[i].c}, bs[1] = {cases[i].n};
      c.in[0] = kt_in(KILN_F32, big ? KT_BIG : KT_WIDE, 71, 2, ls, cases[i].view);
      c.in[1] = kt_in(KILN_I32, KT_LABELS, 72, 1, bs, false);
      c.in[1].hi = cases[i].c;
      c.tol.rtol = 1e-5;
      c.tol.atol = 1e-5 * sqrt((double)(cases[i].c + 1)) * (big ? 100.0 : 1.0);
      c.tol.ulps = 8;
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "cross_entropy logits %s, labels i32 [%lld]%s", in, (long long)cases[i].n,
               big ? " (values up to 100)" : "");
      kt_check(&c);
    }
  }
  kt_end();
}
END_TEST

typedef struct kt_conv_t {
  int64_t n, c, h, w, k, r, s;
  int32_t stride[2], pad[2], dil[2];
  bool bias, view, large;
} kt_conv_t;

START_TEST(test_conv2d) {
  kt_begin();
  static const kt_conv_t cases[] = {
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
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const kt_conv_t *v = &cases[i];
    if (kt_small && v->large) continue;
    kt_case_t c = kt_case(KT_CONV2D, "conv2d");
    c.n_in = v->bias ? 3 : 2;
    c.in[0] = kt_in(KILN_F32, KT_SIGNED, 81, 4, (const int64_t[]){v->n, v->c, v->h, v->w}, v->view);
    c.in[1] = kt_in(KILN_F32, KT_SIGNED, 82, 4, (const int64_t[]){v->k, v->c, v->r, v->s}, false);
    c.in[2] = kt_in(KILN_F32, KT_SIGNED, 83, 1, (const int64_t[]){v->k}, false);
    for (int d = 0; d < 2; d++) {
      c.conv.stride[d] = v->stride[d];
      c.conv.padding[d] = v->pad[d];
      c.conv.dilation[d] = v->dil[d];
    }
    c.tol = kt_sum_tol(v->c * v->r * v->s + 1, 1.0);
    char x[160], w[160];
    kt_in_text(&c.in[0], x, sizeof x);
    kt_in_text(&c.in[1], w, sizeof w);
    snprintf(c.label, sizeof c.label, "conv2d x %s, w %s%s, stride %dx%d, padding %dx%d, dilation %dx%d", x, w,
             v->bias ? ", bias" : "", v->stride[0], v->stride[1], v->pad[0], v->pad[1], v->dil[0], v->dil[1]);
    kt_check(&c);
  }
  /* Channels that differ: the same status everywhere. */
  kt_case_t c = kt_case(KT_CONV2D, "conv2d");
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_SIGNED, 1, 4, (const int64_t[]){1, 3, 5, 5}, false);
  c.in[1] = kt_in(KILN_F32, KT_SIGNED, 2, 4, (const int64_t[]){2, 4, 3, 3}, false);
  c.conv = kiln_conv2d_params_default();
  snprintf(c.label, sizeof c.label, "conv2d x [1x3x5x5], w [2x4x3x3] (channels differ)");
  kt_check(&c);
  kt_end();
}
END_TEST

START_TEST(test_max_pool2d) {
  kt_begin();
  static const struct { int64_t n, c, h, w; int32_t kernel[2], stride[2], pad[2]; bool view, large; } cases[] = {
      {1, 1, 1, 1, {1, 1}, {0, 0}, {0, 0}, false, false},
      {2, 3, 7, 5, {2, 2}, {0, 0}, {0, 0}, false, false},
      {1, 2, 7, 6, {3, 2}, {2, 1}, {1, 1}, false, false},
      {2, 3, 5, 5, {3, 3}, {1, 1}, {1, 1}, true, false},
      {0, 3, 5, 5, {2, 2}, {0, 0}, {0, 0}, false, false},
      {1, 1, 3, 3, {3, 3}, {5, 5}, {1, 1}, false, false},
      {2, 3, 13, 7, {3, 3}, {2, 2}, {1, 1}, false, true},
      {2, 16, 33, 31, {2, 3}, {2, 3}, {1, 1}, true, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (kt_small && cases[i].large) continue;
    for (int steps = 0; steps < 2; steps++) {
      kt_case_t c = kt_case(KT_MAX_POOL2D, "max_pool2d");
      c.n_in = 1;
      c.in[0] = kt_in(KILN_F32, steps ? KT_STEPS : KT_WIDE, 91, 4,
                      (const int64_t[]){cases[i].n, cases[i].c, cases[i].h, cases[i].w}, cases[i].view);
      for (int d = 0; d < 2; d++) {
        c.pool.kernel[d] = cases[i].kernel[d];
        c.pool.stride[d] = cases[i].stride[d];
        c.pool.padding[d] = cases[i].pad[d];
      }
      char x[160];
      kt_in_text(&c.in[0], x, sizeof x);
      snprintf(c.label, sizeof c.label, "max_pool2d x %s, kernel %dx%d, stride %dx%d, padding %dx%d%s", x,
               cases[i].kernel[0], cases[i].kernel[1], cases[i].stride[0], cases[i].stride[1], cases[i].pad[0],
               cases[i].pad[1], steps ? " (ties)" : "");
      kt_check(&c);
    }
  }
  kt_end();
}
END_TEST

/* ---- main ---------------------------------------------------------------------------------- */

static Suite *kt_conformance_suite(void) {
  Suite *s = suite_create("conformance");
  TCase *creation = tcase_create("creation");
  tcase_add_test(creation, test_fill);
  tcase_add_test(creation, test_arange);
  tcase_add_test(creation, test_random);
  suite_add_tcase(s, creation);
  TCase *movement = tcase_create("movement");
  tcase_add_test(movement, test_movement);
  tcase_add_test(movement, test_to_identity);
  suite_add_tcase(s, movement);
  TCase *elementwise = tcase_create("elementwise");
  tcase_add_test(elementwise, test_unary);
  tcase_add_test(elementwise, test_binary);
  tcase_add_test(elementwise, test_binary_scalar);
  suite_add_tcase(s, elementwise);
  TCase *linalg = tcase_create("linear algebra and reductions");
  tcase_add_test(linalg, test_matmul);
  tcase_add_test(linalg, test_reductions);
  suite_add_tcase(s, linalg);
  TCase *nn = tcase_create("neural-network operations");
  tcase_add_test(nn, test_softmax);
  tcase_add_test(nn, test_cross_entropy);
  tcase_add_test(nn, test_conv2d);
  tcase_add_test(nn, test_max_pool2d);
  suite_add_tcase(s, nn);
  return s;
}

/* Why a backend has no device under test, in its own words. */
static void kt_backend_reason(const char *name, char *out, size_t size) {
  size_t count = 0;
  if (kiln_backend_count(&count) != KILN_OK) {
    snprintf(out, size, "%s", kiln_last_error());
    return;
  }
  for (size_t i = 0; i < count; i++) {
    kiln_backend_info_t b;
    if (kiln_backend_info(i, &b) != KILN_OK || strcmp(b.name, name) != 0) continue;
    if (b.state == KILN_BACKEND_LOADED)
      snprintf(out, size, "loaded, but KILN_DEVICE hides its devices");
    else if (b.state == KILN_BACKEND_NO_DEVICE && b.device_count > 0 && !b.reason[0])
      snprintf(out, size, "its %zu device(s) are hidden by KILN_DEVICE", b.device_count);
    else
      snprintf(out, size, "%s: %s", kiln_backend_state_name(b.state), b.reason[0] ? b.reason : "no reason given");
    return;
  }
  const char *list = getenv("KILN_BACKEND");
  snprintf(out, size, "the backend was not loaded (KILN_BACKEND=%s; add %s to it)", list && *list ? list : "(unset)",
           name);
}

int main(void) {
  kt_private_cache_dir();
  const char *small = getenv("KILN_CONFORMANCE_SMALL");
  kt_small = small && *small && strcmp(small, "0") != 0;
  const char *only = getenv("KILN_CONFORMANCE_BACKEND");
  if (only && !*only) only = NULL;

  kiln_status_t status = kiln_ensure_initialized();
  if (status != KILN_OK) {
    /* A backend named in KILN_BACKEND that cannot load fails the start. */
    if (only) {
      printf("no %s device: kiln did not start: %s\n", only, kiln_last_error());
      return 77;
    }
    fprintf(stderr, "kiln did not start (%s): %s\n", kiln_status_name(status), kiln_last_error());
    return 1;
  }
  if (kiln_device_find("cpu:0", &kt_ref) != KILN_OK) {
    printf("no reference: the conformance suite compares with cpu:0, which is not visible (%s); "
           "add cpu to KILN_BACKEND and let KILN_DEVICE keep cpu:0\n",
           kiln_last_error());
    kiln_deinitialize();
    return 77;
  }
  /* Outside a test Check's asserts cannot report: plain checks here. */
  size_t count = 0;
  status = kiln_device_count(&count);
  for (size_t i = 0; i < count && kt_ndev < KT_MAX_DEVICES && status == KILN_OK; i++) {
    kiln_device_t *d = NULL;
    kiln_device_info_t info;
    status = kiln_device_get(i, &d);
    if (status == KILN_OK) status = kiln_device_info(d, &info);
    if (status == KILN_OK && (!only || !strcmp(info.backend, only))) kt_devs[kt_ndev++] = d;
  }
  if (status == KILN_OK) status = kiln_set_policy(KILN_POLICY_PORTABLE);
  if (status != KILN_OK) {
    fprintf(stderr, "listing the devices failed (%s): %s\n", kiln_status_name(status), kiln_last_error());
    kiln_deinitialize();
    return 1;
  }
  if (kt_ndev == 0) {
    char reason[1200];
    kt_backend_reason(only ? only : "cpu", reason, sizeof reason);
    printf("no %s device: %s\n", only ? only : "visible", reason);
    kiln_deinitialize();
    return 77;
  }

  /* The reference runs kiln's own kernels (policy portable, set above); each
   * device's providers are then forced one at a time with kiln_set_providers. */
  printf("conformance%s: reference %s; under test:", kt_small ? " (small shapes)" : "", kiln_device_name(kt_ref));
  for (size_t d = 0; d < kt_ndev; d++) printf(" %s", kiln_device_name(kt_devs[d]));
  printf("\n");
  fflush(stdout);

  SRunner *runner = srunner_create(kt_conformance_suite());
  /* One process: kiln started above, and its worker threads do not survive
   * a fork. */
  srunner_set_fork_status(runner, CK_NOFORK);
  srunner_run_all(runner, CK_NORMAL);
  int failed = srunner_ntests_failed(runner);
  srunner_free(runner);
  printf("conformance: %lu comparisons against %s\n", kt_checks, kiln_device_name(kt_ref));
  for (size_t d = 0; d < kt_ndev; d++) {
    printf("  %s:", kiln_device_name(kt_devs[d]));
    for (int i = 0; i < 16 && kt_tally[d][i].provider[0]; i++)
      printf(" %s %lu", kt_tally[d][i].provider, kt_tally[d][i].count);
    printf("\n");
  }
  kiln_deinitialize();
  return failed == 0 ? 0 : 1;
}
