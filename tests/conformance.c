/* tests/conformance.c: every operation on every visible device and provider, against the CPU backend's native kernels. */
/*
 * The suite is a table of rows, one per operation of include/kiln/tensor.h
 * (kt_rows, at the end): its name, the KILN_PROVIDER op name whose providers
 * are tried, a function that builds its cases (the inputs, as deterministic
 * host data, and the parameters, from the shape and case lists), a function
 * that makes the public API call, and its tolerance rule. Adding an operation
 * adds rows; everything else is the machinery below, written once.
 *
 * Each case is run once on cpu:0 with kiln's own kernels (policy portable, no
 * overrides): the reference. Then, on every device under test, once per
 * provider the device lists for the row's op (kiln_device_providers), with
 * that provider forced through kiln_set_providers. Results must match the
 * reference within the row's tolerance; where the reference call fails (a
 * dtype the op does not take, an empty axis for max), the device must fail
 * with the same status. A row that documents its exact values (cast) also
 * checks the reference against them, computed on the host.
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
 * means exact. `bits`: exact to the bit, so -0.0 differs from 0.0 (any NaN
 * still matches any NaN). i32 results are always compared exactly. */
typedef struct kt_tol_t {
  double rtol, atol;
  int ulps;
  bool bits;
} kt_tol_t;

static const kt_tol_t kt_exact = {0, 0, 0, false};

/* Elementwise transcendental f32 ops: a few ulps (OpenCL allows 3-5 for exp,
 * log, tanh; CUDA 1-2), plus a tiny absolute slack for results near zero. */
static kt_tol_t kt_ulps(int ulps) {
  kt_tol_t t = {0, 1e-7, ulps, false};
  return t;
}

/* Sums of `k` products or terms of magnitude about `scale`: relative 1e-4,
 * absolute growing with sqrt(k) (the rounding of a long sum in another order). */
static kt_tol_t kt_sum_tol(int64_t k, double scale) {
  kt_tol_t t = {1e-4, 1e-5 * sqrt((double)(k > 1 ? k : 1)) * scale, 4, false};
  return t;
}

static int64_t kt_ordered(float f) {
  int32_t i;
  memcpy(&i, &f, sizeof i);
  return i < 0 ? (int64_t)INT32_MIN - (int64_t)i : (int64_t)i;
}

static bool kt_close(float got, float want, kt_tol_t tol) {
  if (isnan(got) || isnan(want)) return isnan(got) && isnan(want);
  if (tol.bits) return memcmp(&got, &want, sizeof got) == 0;
  if (got == want) return true;
  if (isinf(got) || isinf(want)) return false;
  if (fabs((double)got - (double)want) <= tol.atol + tol.rtol * fabs((double)want)) return true;
  int64_t d = kt_ordered(got) - kt_ordered(want);
  return tol.ulps > 0 && (d < 0 ? -d : d) <= tol.ulps;
}

static void kt_tol_text(kiln_dtype_t dtype, kt_tol_t tol, char *out, size_t size) {
  if (dtype != KILN_I32 && tol.bits)
    snprintf(out, size, "exact to the bit");
  else if (dtype == KILN_I32 || (tol.rtol == 0 && tol.atol == 0 && tol.ulps == 0))
    snprintf(out, size, "exact");
  else
    snprintf(out, size, "rtol %g, atol %g, %d ulps", tol.rtol, tol.atol, tol.ulps);
}

/* ---- inputs ----------------------------------------------------------------------- */

/* How input values are drawn (deterministic in the seed and the index). */
typedef enum kt_gen_t {
  KT_UNSET,    /* in a row: the build function's own choice */
  KT_SIGNED,   /* f32 in [-1, 1), multiples of 2^-12 */
  KT_WIDE,     /* f32 in [-4, 4) */
  KT_POSITIVE, /* f32 in [1/64, 4] */
  KT_BIG,      /* f32 in [-100, 100]: softmax must subtract the max */
  KT_NEAR_100, /* f32 in [100, 103.5): large logits close together (log_softmax's precision) */
  KT_STEPS,    /* f32 small integers in [-3, 3]: many ties for max/argmax */
  KT_INT,      /* i32 in [-50, 50] */
  KT_INT_EDGE, /* i32 over the whole range, with INT_MIN, INT_MAX, -1, 0 planted */
  KT_INT_DIV,  /* i32 in [-5, 5], zeros included, INT_MIN / -1 planted */
  KT_LABELS,   /* i32 in [0, hi) */
  KT_CAST_F32, /* f32 for conversions: NaN, +-inf, beyond the i32 range, -0.0,
                  halves, denormals planted; then fractions, large values and
                  arbitrary bit patterns */
  KT_CAST_I32, /* i32 for conversions: INT_MIN, INT_MAX and values that round
                  as f32 (16777217 -> 16777216, ties to even) planted */
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

#define KT_COUNT(array) ((int64_t)(sizeof(array) / sizeof((array)[0])))

static void kt_fill(const kt_in_t *in, void *data, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t h = kt_hash(in->seed, (uint64_t)i);
    float *f = (float *)data + i;
    int32_t *v = (int32_t *)data + i;
    switch (in->gen) {
      case KT_UNSET:
      case KT_SIGNED: *f = (float)((int32_t)(h % 8192) - 4096) / 4096.0f; break;
      case KT_WIDE: *f = (float)((int32_t)(h % 8192) - 4096) / 1024.0f; break;
      case KT_POSITIVE: *f = (float)(1 + h % 256) / 64.0f; break;
      case KT_BIG: *f = (float)((int32_t)(h % 20001) - 10000) / 100.0f; break;
      case KT_NEAR_100: *f = 100.0f + (float)(h % 3500) / 1000.0f; break;
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
      case KT_CAST_F32: {
        /* The most telling first, for the small shapes. 2^31 is the first
         * value past INT_MAX, -2^31 is INT_MIN itself and -2147483904 the next
         * float below it; 2147483520 is the largest float below 2^31;
         * 16777217.0f is stored as 16777216. */
        static const float planted[] = {
            NAN, -0.0f, 2.5f, -2.5f, 3e9f, -INFINITY, 2147483648.0f, INFINITY, -3e9f, -2147483648.0f,
            -2147483904.0f, 2147483520.0f, 0.5f, -0.5f, 1.5f, -1.5f, 0.99999994f, -0.99999994f, 1e-40f,
            -1e-40f, FLT_MAX, -FLT_MAX, 16777217.0f, 1e20f, -1e20f, -7.75f,
        };
        if (i < KT_COUNT(planted)) {
          *f = planted[i];
        } else if (h % 3 == 0) {
          *f = (float)((int32_t)(h % 8192) - 4096) / 16.0f;
        } else if (h % 3 == 1) {
          *f = (float)(int32_t)kt_hash(in->seed + 1, (uint64_t)i) * 1.75f;
        } else {
          uint32_t bits = kt_hash(in->seed + 2, (uint64_t)i);
          memcpy(f, &bits, sizeof *f);
        }
        break;
      }
      case KT_CAST_I32: {
        /* 2^24 + 1 and 2^24 + 3 round to even (16777216, 16777220); INT_MAX
         * and 2^31 - 64 (a tie) round up to 2^31; 2^25 + 3 rounds to 2^25 + 4. */
        static const int32_t planted[] = {
            INT32_MIN, INT32_MAX, 16777217, -16777217, 16777216, 16777215, 16777219, -16777219,
            33554435, 2147483584, 2147483520, -2147483584, -1, 0, 1, INT32_MIN + 1,
        };
        if (i < KT_COUNT(planted))
          *v = planted[i];
        else
          *v = h % 2 ? (int32_t)kt_hash(in->seed + 1, (uint64_t)i) : (int32_t)(h % 2001) - 1000;
        break;
      }
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

static void kt_in_text(const kt_in_t *in, char *out, size_t size) {
  char s[128];
  kt_shape_text(in->ndim, in->shape, s, sizeof s);
  snprintf(out, size, "%s %s%s", kiln_dtype_name(in->dtype), s, in->view ? " (permuted view)" : "");
}

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

/* ---- rows and cases ------------------------------------------------------------------ */

typedef struct kt_row_t kt_row_t;
typedef struct kt_case_t kt_case_t;

/* Inputs of a case at most (Adam: param, grad, m, v). */
#define KT_MAX_IN 4
typedef struct kt_result_t kt_result_t;

/* One case of a row: its inputs (made on a device by the machinery) and the
 * arguments of the call. The build function fills it and hands it to
 * kt_check. */
struct kt_case_t {
  const kt_row_t *row;
  int n_in;
  kt_in_t in[KT_MAX_IN];
  /* The result's dtype (creation, cast) and shape (creation). */
  kiln_dtype_t dtype;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  double scalar;    /* binary_scalar; fill value; arange start */
  double stop, step; /* arange */
  uint64_t seed;    /* uniform, normal */
  int axis;
  bool keepdim, trans_a, trans_b;
  bool must_fail;   /* invalid arguments: the reference must return an error */
  kiln_conv2d_params_t conv;
  kiln_pool2d_params_t pool;
  /* The updates: hyperparameters, how many calls (Adam's step counting
   * from step0), and whether SGD gets its momentum buffer (in[2]). */
  kiln_sgd_params_t sgd;
  kiln_adam_params_t adam;
  int steps;
  int64_t step0;
  bool with_buffer;
  char label[640];
};

/* Where a row's inputs are made, and where its result must live. */
typedef enum kt_place_t {
  KT_ON_DEVICE, /* the device under test */
  KT_ON_REF,    /* cpu:0 */
} kt_place_t;

/* Fill values of a creation row. */
typedef struct kt_values_t {
  int n;
  double v[4];
} kt_values_t;

/* A row's run function: the public API call. in[] are the case's inputs,
 * made on the device the row's `inputs` names; dev is the device under test
 * (creation and copies use it). Not every run reads every argument. */
typedef kiln_status_t kt_run_fn(const kt_case_t *c, kiln_device_t *dev, kiln_tensor_t *const *in,
                                kiln_tensor_t **out);
#define KT_RUN(fn)                                                                                        \
  static kiln_status_t fn(const kt_case_t *c __attribute__((unused)), kiln_device_t *dev __attribute__((unused)), \
                          kiln_tensor_t *const *in __attribute__((unused)), kiln_tensor_t **out)

/* One operation. */
struct kt_row_t {
  const char *group;  /* the Check test case its test runs in */
  const char *name;   /* as the labels say it: "add", "copy to cpu:0" */
  const char *op;     /* the KILN_PROVIDER op name whose providers are tried */
  /* Builds every case of the row from the shape and case lists (inputs and
   * arguments) and hands each to kt_check. */
  void (*build)(const kt_row_t *row);
  kt_run_fn *run;      /* the public API call */
  /* The tolerance of a case (a rule: it may depend on the shapes). */
  kt_tol_t (*tol)(const kt_case_t *c);
  /* Optional: the documented result, computed on the host from the inputs
   * read back; when present the reference is checked against it too. */
  void (*expect)(const kt_case_t *c, const kt_result_t *in, kt_result_t *out);
  kt_place_t inputs, result;
  /* Arguments the functions above read. */
  int sub;               /* kiln_unary_op_t / kiln_binary_op_t; softmax_backward: 1
                          * for the log form; updates: the tensor compared (0 the
                          * one updated, 1 SGD's buffer or Adam's m, 2 Adam's v) */
  kt_gen_t gen;          /* f32 input values, where the row picks them */
  kt_gen_t gen_i32_rhs;  /* i32 right operand values (binary) */
  bool i32_status_only;  /* unary ops with no i32 formula: i32 once, for the status */
  int ulps;              /* kt_tol_row_ulps: 0 is exact */
  double atol;           /* kt_tol_row_grad: absolute slack besides the ulps */
  kt_values_t values;    /* fill values */
  float a, b;            /* uniform's low and high, normal's mean and stddev */
};

/* ---- the machinery: run, read back, compare, tally ---------------------------------- */

/* A result read back to the host. */
struct kt_result_t {
  kiln_status_t status;
  char message[512];
  kiln_dtype_t dtype;
  int ndim;
  int64_t shape[KILN_MAX_DIMS];
  int64_t numel;
  void *data;
  kiln_device_t *device;
  char ran[16]; /* the provider that ran the op, kiln_last_provider() */
};

static kiln_status_t kt_run(kiln_device_t *dev, const kt_case_t *c, kiln_tensor_t **out) {
  kiln_tensor_t *in[KT_MAX_IN] = {NULL};
  kiln_status_t status = KILN_OK;
  kiln_device_t *where = c->row->inputs == KT_ON_REF ? kt_ref : dev;
  for (int i = 0; i < c->n_in && status == KILN_OK; i++) status = kt_make(where, &c->in[i], &in[i]);
  if (status == KILN_OK) status = c->row->run(c, dev, in, out);
  for (int i = 0; i < KT_MAX_IN; i++) kiln_tensor_release(in[i]);
  return status;
}

/* Read `t` back into `r` (r->status set by the caller on entry). */
static void kt_result_read(kiln_tensor_t *t, kt_result_t *r) {
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
}

static void kt_result_get(kiln_device_t *dev, const kt_case_t *c, kt_result_t *r) {
  memset(r, 0, sizeof *r);
  kiln_clear_error();
  kiln_tensor_t *t = NULL;
  r->status = kt_run(dev, c, &t);
  snprintf(r->ran, sizeof r->ran, "%s", kiln_last_provider());
  kt_result_read(t, r);
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

/* Compare one device/provider result with what is expected (the reference's,
 * or for the reference itself the documented values: `against` says which). */
static void kt_compare(const kt_case_t *c, kiln_device_t *dev, const char *provider, const char *against,
                       const kt_result_t *want, const kt_result_t *got) {
  const char *where = kiln_device_name(dev);
  if (want->status != KILN_OK) {
    if (got->status != want->status)
      kt_fail("%s on %s, provider %s: got %s (%s), but %s says %s (%s)", c->label, where, provider,
              kiln_status_name(got->status), got->message, against, kiln_status_name(want->status), want->message);
    return;
  }
  if (got->status != KILN_OK) {
    kt_fail("%s on %s, provider %s: failed with %s: %s", c->label, where, provider, kiln_status_name(got->status),
            got->message);
    return;
  }
  kiln_device_t *expected_device = c->row->result == KT_ON_REF ? kt_ref : dev;
  if (got->device != expected_device) {
    kt_fail("%s on %s, provider %s: the result lives on %s, expected %s", c->label, where, provider,
            kiln_device_name(got->device), kiln_device_name(expected_device));
    return;
  }
  char ws[160], gs[160];
  kt_shape_text(want->ndim, want->shape, ws, sizeof ws);
  kt_shape_text(got->ndim, got->shape, gs, sizeof gs);
  if (got->dtype != want->dtype || strcmp(ws, gs) != 0) {
    kt_fail("%s on %s, provider %s: result is %s %s, expected %s %s (%s)", c->label, where, provider,
            kiln_dtype_name(got->dtype), gs, kiln_dtype_name(want->dtype), ws, against);
    return;
  }
  kt_tol_t tolerance = c->row->tol(c);
  char tol[96];
  kt_tol_text(want->dtype, tolerance, tol, sizeof tol);
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
      ok = kt_close(g, w, tolerance);
      snprintf(gv, sizeof gv, "%.9g", (double)g);
      snprintf(wv, sizeof wv, "%.9g", (double)w);
    }
    if (!ok) {
      char at[160];
      kt_index_text(want, i, at, sizeof at);
      kt_fail("%s on %s, provider %s (ran %s), shape %s: first mismatch at element %lld %s: got %s, expected %s "
              "(%s; tolerance %s)",
              c->label, where, provider, got->ran, ws, (long long)i, at, gv, wv, against, tol);
      return;
    }
  }
}

/* A row with documented values: check the reference itself against them. */
static void kt_check_expected(const kt_case_t *c, const kt_result_t *ref) {
  if (ref->status != KILN_OK) {
    kt_fail("%s on %s, provider native: the reference failed with %s: %s", c->label, kiln_device_name(kt_ref),
            kiln_status_name(ref->status), ref->message);
    return;
  }
  kt_result_t in[KT_MAX_IN], expected;
  memset(in, 0, sizeof in);
  memset(&expected, 0, sizeof expected);
  bool made = true;
  for (int i = 0; i < c->n_in && made; i++) {
    kiln_tensor_t *t = NULL;
    in[i].status = kt_make(kt_ref, &c->in[i], &t);
    kt_result_read(t, &in[i]);
    kiln_tensor_release(t);
    made = in[i].status == KILN_OK;
    if (!made)
      kt_fail("%s: making input %d on %s failed with %s: %s", c->label, i, kiln_device_name(kt_ref),
              kiln_status_name(in[i].status), in[i].message);
  }
  if (made) {
    c->row->expect(c, in, &expected);
    expected.device = kt_ref;
    kt_compare(c, kt_ref, "native", "the documented values", &expected, ref);
  }
  for (int i = 0; i < KT_MAX_IN; i++) kt_result_free(&in[i]);
  kt_result_free(&expected);
}

/* Run a case on the reference, then on every device with every provider. */
static void kt_check(const kt_case_t *c) {
  kt_result_t want;
  KT_OK(kiln_set_providers(""));
  kt_result_get(kt_ref, c, &want);
  /* Every kind has a native kernel on every backend: the reference cannot
   * lack one (it would make the comparisons below vacuous). */
  if (want.status == KILN_UNSUPPORTED)
    kt_fail("%s on %s, provider native: the reference has no kernel: %s", c->label, kiln_device_name(kt_ref),
            want.message);
  if (c->must_fail && want.status == KILN_OK)
    kt_fail("%s on %s, provider native: succeeded, but its arguments are invalid and it must fail", c->label,
            kiln_device_name(kt_ref));
  if (c->row->expect && !c->must_fail) kt_check_expected(c, &want);
  for (size_t d = 0; d < kt_ndev; d++) {
    const char *list = kiln_device_providers(kt_devs[d], c->row->op);
    ck_assert_msg(list != NULL, "kiln_device_providers does not know the op \"%s\"", c->row->op);
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
      snprintf(override, sizeof override, "%s=%s", c->row->op, p);
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
      kt_compare(c, kt_devs[d], p, "cpu:0 native", &want, &got);
      kt_result_free(&got);
    }
  }
  KT_OK(kiln_set_providers(""));
  kt_result_free(&want);
}

/* A case of `row` with nothing set yet. */
static kt_case_t kt_case(const kt_row_t *row) {
  kt_case_t c;
  memset(&c, 0, sizeof c);
  c.row = row;
  return c;
}

/* ---- shape lists ------------------------------------------------------------------------- */

/* A shape list entry: ndim then sizes (ndim -1 ends a list). */
typedef struct kt_shape_t {
  int ndim;
  int64_t s[KILN_MAX_DIMS];
  bool view;
  bool large; /* left out under KILN_CONFORMANCE_SMALL */
} kt_shape_t;

static bool kt_skip(const kt_shape_t *s) { return kt_small && s->large; }

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

static const kt_shape_t kt_creation_shapes[] = {
    {0, {0}, false, false}, {1, {0}, false, false}, {1, {1}, false, false},
    {2, {3, 7}, false, false}, {2, {13, 257}, false, true}, {-1, {0}, false, false},
};

static const kt_shape_t kt_random_shapes[] = {
    {0, {0}, false, false}, {1, {0}, false, false}, {1, {1}, false, false}, {2, {3, 7}, false, false},
    {1, {1237}, false, true}, {3, {4, 5, 67}, false, true}, {-1, {0}, false, false},
};

static const kt_shape_t kt_reduce_shapes[] = {
    {0, {0}, false, false},          {1, {0}, false, false},        {1, {1}, false, false},
    {1, {7}, false, false},          {2, {3, 0}, false, false},     {3, {3, 0, 5}, false, false},
    {2, {4, 5}, true, false},        {3, {2, 3, 4}, true, false},   {1, {1237}, false, true},
    {2, {13, 257}, false, true},     {2, {13, 257}, true, true},    {4, {2, 3, 5, 7}, true, true},
    {2, {1031, 3}, false, true},     {1, {70001}, false, true},     {2, {3, 40009}, false, true},
    {2, {40009, 3}, true, true},     {-1, {0}, false, false},
};

static const kt_shape_t kt_softmax_shapes[] = {
    {0, {0}, false, false},     {1, {1}, false, false},      {1, {7}, false, false},
    {2, {3, 0}, false, false},  {2, {0, 5}, false, false},   {2, {4, 5}, true, false},
    {3, {2, 3, 4}, false, false}, {2, {13, 257}, false, true}, {2, {4, 1237}, false, true},
    {2, {257, 13}, true, true}, {2, {3, 9973}, false, true}, {-1, {0}, false, false},
};

/* ---- tolerance rules shared by rows ------------------------------------------------------ */

static kt_tol_t kt_tol_exact(const kt_case_t *c) {
  (void)c;
  return kt_exact;
}

static kt_tol_t kt_tol_bits(const kt_case_t *c) {
  (void)c;
  kt_tol_t t = kt_exact;
  t.bits = true;
  return t;
}

/* The row's ulps, or exact when it names none. */
static kt_tol_t kt_tol_row_ulps(const kt_case_t *c) { return c->row->ulps ? kt_ulps(c->row->ulps) : kt_exact; }

/* ---- creation ----------------------------------------------------------------------------- */

static void kt_case_shape(kt_case_t *c, const kt_shape_t *s) {
  c->ndim = s->ndim;
  for (int i = 0; i < s->ndim; i++) c->shape[i] = s->s[i];
}

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

/* uniform, normal: each seed over the random shapes, with the row's a and b. */
static void kt_build_random(const kt_row_t *row) {
  static const uint64_t seeds[] = {0, 42, (1ull << 40) + 7};
  for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++) {
    for (const kt_shape_t *s = kt_random_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      kt_case_shape(&c, s);
      c.seed = seeds[k];
      char shape[128];
      kt_shape_text(s->ndim, s->s, shape, sizeof shape);
      snprintf(c.label, sizeof c.label, "%s(seed %llu, %g, %g) %s", row->name, (unsigned long long)c.seed,
               (double)row->a, (double)row->b, shape);
      kt_check(&c);
    }
  }
}

KT_RUN(kt_run_uniform) { return kiln_tensor_uniform(dev, c->ndim, c->shape, c->seed, c->row->a, c->row->b, out); }

KT_RUN(kt_run_normal) { return kiln_tensor_normal(dev, c->ndim, c->shape, c->seed, c->row->a, c->row->b, out); }

/* The same Philox stream on every device. Uniform numbers are bit-identical
 * to the CPU's on every device (kernels/philox.h keeps every compiler from
 * fusing low + (high - low) * u into one FMA, which changes the last bit of
 * about a third of them). Normal numbers go through the dialect's own log,
 * sqrt and cos: within 1e-6 relative (and 1e-6 of the spread near zero). */
static kt_tol_t kt_tol_normal(const kt_case_t *c) {
  kt_tol_t t = {1e-6, 1e-6 * (double)c->row->b, 2, false};
  return t;
}

/* ---- movement ----------------------------------------------------------------------------- */

/* Both dtypes over the elementwise shapes. */
static void kt_build_movement(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kiln_dtype_t dtype = dt ? KILN_I32 : KILN_F32;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(dtype, dt ? KT_INT_EDGE : KT_WIDE, 7, s->ndim, s->s, s->view);
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "%s of %s", row->name, in);
      kt_check(&c);
    }
  }
}

/* The input itself: kiln_tensor_from_host, then the machinery's read. */
KT_RUN(kt_run_from_host) {
  *out = kiln_tensor_retain(in[0]);
  return KILN_OK;
}

KT_RUN(kt_run_copy) { return kiln_tensor_copy(in[0], dev, out); }

KT_RUN(kt_run_copy_to_ref) { return kiln_tensor_copy(in[0], kt_ref, out); }

KT_RUN(kt_run_to) { return kiln_tensor_to(in[0], dev, out); }

KT_RUN(kt_run_contiguous) { return kiln_tensor_contiguous(in[0], out); }

KT_RUN(kt_run_reshape_flat) {
  int64_t flat = kt_numel(c->in[0].ndim, c->in[0].shape);
  return kiln_tensor_reshape(in[0], 1, &flat, out);
}

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

/* ---- elementwise -------------------------------------------------------------------------- */

/* f32 with the row's values and i32 over the whole range, over the
 * elementwise shapes; i32 once only, for the status, where the op has no i32
 * formula. */
static void kt_build_unary(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      if (dt && row->i32_status_only && s != kt_elementwise_shapes + 3) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT_EDGE : row->gen, 11 + (uint32_t)row->sub, s->ndim, s->s,
                      s->view);
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "%s %s", row->name, in);
      kt_check(&c);
    }
  }
}

KT_RUN(kt_run_unary) { return kiln_tensor_unary((kiln_unary_op_t)c->row->sub, in[0], out); }

/* Both dtypes, same shapes and broadcasts (both orders); then operands of two
 * dtypes, for the status. */
static void kt_build_binary(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    kiln_dtype_t dtype = dt ? KILN_I32 : KILN_F32;
    kt_gen_t gen_f32 = row->gen != KT_UNSET ? row->gen : KT_WIDE;
    kt_gen_t gen_a = dt ? KT_INT_EDGE : gen_f32;
    kt_gen_t gen_b = !dt ? gen_f32 : row->gen_i32_rhs != KT_UNSET ? row->gen_i32_rhs : KT_INT_EDGE;
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      c.in[0] = kt_in(dtype, gen_a, 21, s->ndim, s->s, s->view);
      c.in[1] = kt_in(dtype, gen_b, 22, s->ndim, s->s, false);
      char a[160], b[160];
      kt_in_text(&c.in[0], a, sizeof a);
      kt_in_text(&c.in[1], b, sizeof b);
      snprintf(c.label, sizeof c.label, "%s %s, %s", row->name, a, b);
      kt_check(&c);
    }
    for (size_t i = 0; i < sizeof kt_broadcast_pairs / sizeof kt_broadcast_pairs[0]; i++) {
      const kt_shape_t *sa = &kt_broadcast_pairs[i][0], *sb = &kt_broadcast_pairs[i][1];
      if (kt_skip(sa) || kt_skip(sb)) continue;
      for (int swap = 0; swap < 2; swap++) {
        const kt_shape_t *x = swap ? sb : sa, *y = swap ? sa : sb;
        kt_case_t c = kt_case(row);
        c.n_in = 2;
        c.in[0] = kt_in(dtype, gen_a, 23, x->ndim, x->s, x->view);
        c.in[1] = kt_in(dtype, gen_b, 24, y->ndim, y->s, y->view);
        char a[160], b[160];
        kt_in_text(&c.in[0], a, sizeof a);
        kt_in_text(&c.in[1], b, sizeof b);
        snprintf(c.label, sizeof c.label, "%s %s, %s (broadcast)", row->name, a, b);
        kt_check(&c);
      }
    }
  }
  const int64_t shape[1] = {4};
  kt_case_t c = kt_case(row);
  c.must_fail = true;
  c.n_in = 2;
  c.in[0] = kt_in(KILN_F32, KT_WIDE, 1, 1, shape, false);
  c.in[1] = kt_in(KILN_I32, KT_INT, 2, 1, shape, false);
  snprintf(c.label, sizeof c.label, "%s f32 [4], i32 [4] (dtype mismatch)", row->name);
  kt_check(&c);
}

KT_RUN(kt_run_binary) { return kiln_tensor_binary((kiln_binary_op_t)c->row->sub, in[0], in[1], out); }

/* Four scalars per dtype; the contiguous 2-D and larger shapes with the first only. */
static void kt_build_binary_scalar(const kt_row_t *row) {
  static const double f32_scalars[] = {0.5, -3.25, 0.1, 0};
  static const double i32_scalars[] = {3, -2, 0, -1};
  for (int dt = 0; dt < 2; dt++) {
    for (size_t k = 0; k < 4; k++) {
      for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
        if (kt_skip(s) || (s->ndim >= 2 && !s->view && k > 0)) continue;
        kt_case_t c = kt_case(row);
        c.n_in = 1;
        c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, dt ? KT_INT_EDGE : row->gen != KT_UNSET ? row->gen : KT_WIDE, 31,
                        s->ndim, s->s, s->view);
        c.scalar = dt ? i32_scalars[k] : f32_scalars[k];
        char a[160];
        kt_in_text(&c.in[0], a, sizeof a);
        snprintf(c.label, sizeof c.label, "%s %s, %g", row->name, a, c.scalar);
        kt_check(&c);
      }
    }
  }
}

KT_RUN(kt_run_binary_scalar) {
  return kiln_tensor_binary_scalar((kiln_binary_op_t)c->row->sub, in[0], c->scalar, out);
}

/* f32 -> i32, i32 -> f32 and each dtype to itself, over the elementwise shapes. */
static void kt_build_cast(const kt_row_t *row) {
  static const kiln_dtype_t pairs[][2] = {
      {KILN_F32, KILN_I32}, {KILN_I32, KILN_F32}, {KILN_F32, KILN_F32}, {KILN_I32, KILN_I32}};
  for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 1;
      c.in[0] = kt_in(pairs[p][0], pairs[p][0] == KILN_I32 ? KT_CAST_I32 : KT_CAST_F32, 101, s->ndim, s->s, s->view);
      c.dtype = pairs[p][1];
      char in[160];
      kt_in_text(&c.in[0], in, sizeof in);
      snprintf(c.label, sizeof c.label, "%s %s to %s", row->name, in, kiln_dtype_name(c.dtype));
      kt_check(&c);
    }
  }
}

KT_RUN(kt_run_cast) { return kiln_tensor_cast(in[0], c->dtype, out); }

/* What tensor.h documents: f32 -> i32 truncates toward zero, NaN is 0 and
 * values beyond the range the nearest limit; i32 -> f32 rounds to nearest,
 * ties to even (C's conversion in the default rounding mode); to the same
 * dtype the values, bit for bit. */
static void kt_expect_cast(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  out->status = KILN_OK;
  out->dtype = c->dtype;
  out->ndim = in[0].ndim;
  memcpy(out->shape, in[0].shape, sizeof out->shape);
  out->numel = in[0].numel;
  out->data = malloc((size_t)(out->numel > 0 ? out->numel : 1) * 4);
  ck_assert_ptr_nonnull(out->data);
  for (int64_t i = 0; i < out->numel; i++) {
    if (in[0].dtype == KILN_F32 && c->dtype == KILN_I32) {
      float f = ((const float *)in[0].data)[i];
      int32_t v = isnan(f) ? 0 : f >= 2147483648.0f ? INT32_MAX : f < -2147483648.0f ? INT32_MIN : (int32_t)f;
      ((int32_t *)out->data)[i] = v;
    } else if (in[0].dtype == KILN_I32 && c->dtype == KILN_F32) {
      ((float *)out->data)[i] = (float)((const int32_t *)in[0].data)[i];
    } else {
      memcpy((char *)out->data + 4 * i, (const char *)in[0].data + 4 * i, 4);
    }
  }
}

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

/* ---- reductions --------------------------------------------------------------------------- */

/* sum, mean, max, argmax: both dtypes over the reduce shapes, along every
 * axis, the last counted from the end, all axes and one out of range (the
 * same status everywhere); keepdim along axis 0 and all axes. */
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

/* ---- neural-network operations ------------------------------------------------------------ */

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

typedef struct kt_conv_t {
  int64_t n, c, h, w, k, r, s;
  int32_t stride[2], pad[2], dil[2];
  bool bias, view, large;
} kt_conv_t;

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
  for (size_t i = 0; i < sizeof kt_conv2d_cases / sizeof kt_conv2d_cases[0]; i++) {
    const kt_conv_t *v = &kt_conv2d_cases[i];
    if (kt_small && v->large) continue;
    kt_case_t c = kt_case(row);
    c.n_in = v->bias ? 3 : 2;
    c.in[0] = kt_in(KILN_F32, KT_SIGNED, 81, 4, (const int64_t[]){v->n, v->c, v->h, v->w}, v->view);
    c.in[1] = kt_in(KILN_F32, KT_SIGNED, 82, 4, (const int64_t[]){v->k, v->c, v->r, v->s}, false);
    c.in[2] = kt_in(KILN_F32, KT_SIGNED, 83, 1, (const int64_t[]){v->k}, false);
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

typedef struct kt_pool_t {
  int64_t n, c, h, w;
  int32_t kernel[2], stride[2], pad[2];
  bool view, large;
} kt_pool_t;

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

/* ---- training: gradients ------------------------------------------------------------------
 * Each backward op over awkward shapes, against cpu:0; where the result has
 * a simple documented form (a derivative formula, a sum or a broadcast, the
 * routing of max pooling) the reference is checked against it too, computed
 * in double on the host. tests/test_grad.c checks the gradients themselves
 * against finite differences and PyTorch. */

static kt_run_fn kt_run_conv2d_backward_input, kt_run_conv2d_backward_weight, kt_run_accumulate, kt_run_sgd,
    kt_run_adam;

/* An f32 or i32 result of `ndim` dims of `shape`, values to be written. */
static void kt_result_alloc(kt_result_t *out, kiln_dtype_t dtype, int ndim, const int64_t *shape) {
  out->status = KILN_OK;
  out->dtype = dtype;
  out->ndim = ndim;
  for (int i = 0; i < ndim; i++) out->shape[i] = shape[i];
  out->numel = kt_numel(ndim, shape);
  out->data = calloc((size_t)(out->numel > 0 ? out->numel : 1), 4);
  ck_assert_ptr_nonnull(out->data);
}

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

KT_RUN(kt_run_unary_backward) {
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

/* ---- training: updates in place -------------------------------------------------------------
 * Several calls in a row on fresh tensors, then one of the updated tensors
 * compared (the row's sub: 0 the parameter, 1 SGD's buffer or Adam's m, 2
 * Adam's v), against cpu:0 and against the documented formula in double on
 * the host. Each run also checks what "in place" promises: the update lands
 * in the tensor's own memory (a view of it taken before sees it), the
 * operands it only reads are unchanged to the bit, and the device's pool
 * counts no allocation and no byte more. */

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
  const char *of = c->row->run == kt_run_accumulate ? accumulate[0]
                   : c->row->run == kt_run_sgd      ? sgd[c->row->sub]
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
    double param = ((const float *)in[0].data)[i], grad = ((const float *)in[1].data)[i];
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
    double param = ((const float *)in[0].data)[i], grad = ((const float *)in[1].data)[i];
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

/* eq of the values conversions plant (NaN, -0.0, infinities, denormals) in
 * both operands at once: 1 where they are equal except for NaN, against
 * tensor.h's words on the host. */
static void kt_build_eq_special(const kt_row_t *row) {
  for (int dt = 0; dt < 2; dt++) {
    for (const kt_shape_t *s = kt_elementwise_shapes; s->ndim >= 0; s++) {
      if (kt_skip(s)) continue;
      kt_case_t c = kt_case(row);
      c.n_in = 2;
      kt_gen_t gen = dt ? KT_CAST_I32 : KT_CAST_F32;
      c.in[0] = kt_in(dt ? KILN_I32 : KILN_F32, gen, 211, s->ndim, s->s, false);
      c.in[1] = kt_in(dt ? KILN_I32 : KILN_F32, gen, 212, s->ndim, s->s, false);
      char a[160];
      kt_in_text(&c.in[0], a, sizeof a);
      snprintf(c.label, sizeof c.label, "eq %s, %s (special values)", a, a);
      kt_check(&c);
    }
  }
}

static void kt_expect_eq(const kt_case_t *c, const kt_result_t *in, kt_result_t *out) {
  (void)c;
  kt_result_alloc(out, in[0].dtype, in[0].ndim, in[0].shape);
  for (int64_t i = 0; i < out->numel; i++) {
    if (in[0].dtype == KILN_F32)
      ((float *)out->data)[i] = ((const float *)in[0].data)[i] == ((const float *)in[1].data)[i] ? 1.0f : 0.0f;
    else
      ((int32_t *)out->data)[i] = ((const int32_t *)in[0].data)[i] == ((const int32_t *)in[1].data)[i];
  }
}

/* ---- the rows ------------------------------------------------------------------------------
 * One per operation; a test per row, in the Check test case its group names. */

#define KT_UNARY_ROW(OP, op_, gen_, ulps_, i32_status_only_)                                           \
  {.group = "elementwise", .name = #op_, .op = #op_, .build = kt_build_unary, .run = kt_run_unary,    \
   .tol = kt_tol_row_ulps, .sub = KILN_UNARY_##OP, .gen = gen_, .ulps = ulps_,                         \
   .i32_status_only = i32_status_only_}
#define KT_BINARY_ROW(OP, op_, ulps_, gen_i32_rhs_)                                                     \
  {.group = "elementwise", .name = #op_, .op = #op_, .build = kt_build_binary, .run = kt_run_binary,  \
   .tol = kt_tol_row_ulps, .sub = KILN_BINARY_##OP, .ulps = ulps_, .gen_i32_rhs = gen_i32_rhs_}
#define KT_GRAD_ROW(OP, op_, gen_, ulps_, atol_)                                                        \
  {.group = "training: gradients", .name = #op_ "_backward", .op = "unary_backward",                   \
   .build = kt_build_unary_backward, .run = kt_run_unary_backward, .tol = kt_tol_row_grad,             \
   .expect = kt_expect_unary_backward, .sub = KILN_UNARY_##OP, .gen = gen_, .ulps = ulps_, .atol = atol_}
#define KT_SCALAR_ROW(OP, op_, ulps_)                                                                   \
  {.group = "elementwise", .name = #op_ "_scalar", .op = #op_, .build = kt_build_binary_scalar,       \
   .run = kt_run_binary_scalar, .tol = kt_tol_row_ulps, .sub = KILN_BINARY_##OP, .ulps = ulps_}

static const kt_row_t kt_rows[] = {
    /* creation */
    {.group = "creation", .name = "zeros", .op = "fill", .build = kt_build_fill, .run = kt_run_zeros,
     .tol = kt_tol_exact, .values = {1, {0}}},
    {.group = "creation", .name = "ones", .op = "fill", .build = kt_build_fill, .run = kt_run_ones,
     .tol = kt_tol_exact, .values = {1, {1}}},
    {.group = "creation", .name = "full", .op = "fill", .build = kt_build_fill, .run = kt_run_full,
     .tol = kt_tol_exact, .values = {2, {2.5, -7}}},
    /* start + i*step in f32 on a device without fp64: one rounding more. */
    {.group = "creation", .name = "arange", .op = "arange", .build = kt_build_arange, .run = kt_run_arange,
     .tol = kt_tol_row_ulps, .ulps = 2},
    {.group = "creation", .name = "uniform", .op = "random", .build = kt_build_random, .run = kt_run_uniform,
     .tol = kt_tol_bits, .a = -2.0f, .b = 3.0f},
    /* A spread that is no power of two: (high - low) * u rounds in nearly
     * half the elements, where a fused multiply-add would differ. */
    {.group = "creation", .name = "uniform (odd range)", .op = "random", .build = kt_build_random,
     .run = kt_run_uniform, .tol = kt_tol_bits, .a = -0.3f, .b = 1.9f},
    {.group = "creation", .name = "normal", .op = "random", .build = kt_build_random, .run = kt_run_normal,
     .tol = kt_tol_normal, .a = 1.0f, .b = 0.5f},

    /* movement */
    {.group = "movement", .name = "from_host + read", .op = "copy", .build = kt_build_movement,
     .run = kt_run_from_host, .tol = kt_tol_exact},
    {.group = "movement", .name = "copy to the same device", .op = "copy", .build = kt_build_movement,
     .run = kt_run_copy, .tol = kt_tol_exact},
    {.group = "movement", .name = "copy from cpu:0", .op = "copy", .build = kt_build_movement, .run = kt_run_copy,
     .tol = kt_tol_exact, .inputs = KT_ON_REF},
    {.group = "movement", .name = "copy to cpu:0", .op = "copy", .build = kt_build_movement,
     .run = kt_run_copy_to_ref, .tol = kt_tol_exact, .result = KT_ON_REF},
    {.group = "movement", .name = "to from cpu:0", .op = "copy", .build = kt_build_movement, .run = kt_run_to,
     .tol = kt_tol_exact, .inputs = KT_ON_REF},
    {.group = "movement", .name = "contiguous", .op = "copy", .build = kt_build_movement, .run = kt_run_contiguous,
     .tol = kt_tol_exact},
    {.group = "movement", .name = "reshape to 1-D", .op = "copy", .build = kt_build_movement,
     .run = kt_run_reshape_flat, .tol = kt_tol_exact},

    /* elementwise: exact in IEEE arithmetic, or a few ulps where OpenCL and
     * CUDA allow them (exp, log, tanh 3-5; sqrt 3 in OpenCL; division 2.5). */
    KT_UNARY_ROW(NEG, neg, KT_WIDE, 0, false),
    KT_UNARY_ROW(ABS, abs, KT_WIDE, 0, false),
    KT_UNARY_ROW(EXP, exp, KT_WIDE, 4, true),
    KT_UNARY_ROW(LOG, log, KT_POSITIVE, 4, true),
    KT_UNARY_ROW(SQRT, sqrt, KT_POSITIVE, 4, true),
    KT_UNARY_ROW(RELU, relu, KT_WIDE, 0, false),
    KT_UNARY_ROW(SIGMOID, sigmoid, KT_WIDE, 8, true),
    KT_UNARY_ROW(TANH, tanh, KT_WIDE, 8, true),
    KT_BINARY_ROW(ADD, add, 0, KT_UNSET),
    KT_BINARY_ROW(SUB, sub, 0, KT_UNSET),
    KT_BINARY_ROW(MUL, mul, 0, KT_UNSET),
    KT_BINARY_ROW(DIV, div, 3, KT_INT_DIV),
    KT_BINARY_ROW(MAXIMUM, maximum, 0, KT_UNSET),
    KT_BINARY_ROW(MINIMUM, minimum, 0, KT_UNSET),
    KT_SCALAR_ROW(ADD, add, 0),
    KT_SCALAR_ROW(SUB, sub, 0),
    KT_SCALAR_ROW(MUL, mul, 0),
    KT_SCALAR_ROW(DIV, div, 3),
    KT_SCALAR_ROW(MAXIMUM, maximum, 0),
    KT_SCALAR_ROW(MINIMUM, minimum, 0),
    /* eq: small integers, so that equal pairs are common; 0 and 1 exactly. */
    {.group = "elementwise", .name = "eq", .op = "eq", .build = kt_build_binary, .run = kt_run_binary,
     .tol = kt_tol_bits, .sub = KILN_BINARY_EQ, .gen = KT_STEPS},
    {.group = "elementwise", .name = "eq_scalar", .op = "eq", .build = kt_build_binary_scalar,
     .run = kt_run_binary_scalar, .tol = kt_tol_bits, .sub = KILN_BINARY_EQ, .gen = KT_STEPS},
    {.group = "elementwise", .name = "eq", .op = "eq", .build = kt_build_eq_special, .run = kt_run_binary,
     .tol = kt_tol_bits, .expect = kt_expect_eq, .sub = KILN_BINARY_EQ},
    {.group = "elementwise", .name = "cast", .op = "cast", .build = kt_build_cast, .run = kt_run_cast,
     .tol = kt_tol_bits, .expect = kt_expect_cast},

    /* linear algebra and reductions */
    {.group = "linear algebra and reductions", .name = "matmul", .op = "matmul", .build = kt_build_matmul,
     .run = kt_run_matmul, .tol = kt_tol_matmul},
    {.group = "linear algebra and reductions", .name = "sum", .op = "reduce", .build = kt_build_reduce,
     .run = kt_run_sum, .tol = kt_tol_reduce_axis, .gen = KT_SIGNED},
    /* mean of i32: the status. */
    {.group = "linear algebra and reductions", .name = "mean", .op = "reduce", .build = kt_build_reduce,
     .run = kt_run_mean, .tol = kt_tol_reduce_axis, .gen = KT_SIGNED},
    /* Small integers: ties everywhere, compared exactly. */
    {.group = "linear algebra and reductions", .name = "max", .op = "reduce", .build = kt_build_reduce,
     .run = kt_run_max, .tol = kt_tol_exact, .gen = KT_STEPS},
    {.group = "linear algebra and reductions", .name = "argmax", .op = "reduce", .build = kt_build_reduce,
     .run = kt_run_argmax, .tol = kt_tol_exact, .gen = KT_STEPS},
    {.group = "linear algebra and reductions", .name = "norm", .op = "reduce", .build = kt_build_norm,
     .run = kt_run_norm, .tol = kt_tol_reduce_all},

    /* neural-network operations */
    {.group = "neural-network operations", .name = "softmax", .op = "softmax", .build = kt_build_softmax,
     .run = kt_run_softmax, .tol = kt_tol_softmax},
    {.group = "neural-network operations", .name = "log_softmax", .op = "softmax", .build = kt_build_softmax,
     .run = kt_run_log_softmax, .tol = kt_tol_log_softmax},
    {.group = "neural-network operations", .name = "log_softmax of large logits", .op = "softmax",
     .build = kt_build_log_softmax_large, .run = kt_run_log_softmax, .tol = kt_tol_relative,
     .expect = kt_expect_log_softmax},
    {.group = "neural-network operations", .name = "cross_entropy", .op = "cross_entropy",
     .build = kt_build_cross_entropy, .run = kt_run_cross_entropy, .tol = kt_tol_cross_entropy},
    {.group = "neural-network operations", .name = "conv2d", .op = "conv2d", .build = kt_build_conv2d,
     .run = kt_run_conv2d, .tol = kt_tol_conv2d},
    {.group = "neural-network operations", .name = "max_pool2d", .op = "max_pool2d", .build = kt_build_max_pool2d,
     .run = kt_run_max_pool2d, .tol = kt_tol_exact},

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
    {.group = "training: gradients", .name = "sum_to", .op = "reduce", .build = kt_build_sum_to,
     .run = kt_run_sum_to, .tol = kt_tol_sum_to, .expect = kt_expect_sum_to},
    {.group = "training: gradients", .name = "broadcast_to", .op = "copy", .build = kt_build_broadcast_to,
     .run = kt_run_broadcast_to, .tol = kt_tol_bits, .expect = kt_expect_broadcast_to},
    {.group = "training: gradients", .name = "softmax_backward", .op = "softmax_backward",
     .build = kt_build_softmax_backward, .run = kt_run_softmax_backward, .tol = kt_tol_softmax_backward, .sub = 0},
    {.group = "training: gradients", .name = "softmax_backward (log)", .op = "softmax_backward",
     .build = kt_build_softmax_backward, .run = kt_run_softmax_backward, .tol = kt_tol_softmax_backward, .sub = 1},
    {.group = "training: gradients", .name = "cross_entropy_backward", .op = "cross_entropy_backward",
     .build = kt_build_cross_entropy_backward, .run = kt_run_cross_entropy_backward,
     .tol = kt_tol_cross_entropy_backward, .expect = kt_expect_cross_entropy_backward},
    {.group = "training: gradients", .name = "conv2d_backward_input", .op = "conv2d_backward_input",
     .build = kt_build_conv2d_backward, .run = kt_run_conv2d_backward_input, .tol = kt_tol_conv2d_backward},
    {.group = "training: gradients", .name = "conv2d_backward_weight", .op = "conv2d_backward_weight",
     .build = kt_build_conv2d_backward, .run = kt_run_conv2d_backward_weight, .tol = kt_tol_conv2d_backward},
    {.group = "training: gradients", .name = "conv2d_backward_bias", .op = "reduce",
     .build = kt_build_conv2d_backward, .run = kt_run_conv2d_backward_bias, .tol = kt_tol_conv2d_backward},
    /* dy values whose sums are exact in any order: routing compared exactly. */
    {.group = "training: gradients", .name = "max_pool2d_backward", .op = "max_pool2d_backward",
     .build = kt_build_max_pool2d_backward, .run = kt_run_max_pool2d_backward, .tol = kt_tol_exact,
     .expect = kt_expect_max_pool2d_backward},

    /* training: updates in place, each tensor they write compared */
    {.group = "training: updates", .name = "accumulate", .op = "accumulate", .build = kt_build_accumulate,
     .run = kt_run_accumulate, .tol = kt_tol_update, .expect = kt_expect_accumulate},
    {.group = "training: updates", .name = "sgd_update", .op = "sgd_update", .build = kt_build_sgd,
     .run = kt_run_sgd, .tol = kt_tol_update, .expect = kt_expect_sgd, .sub = 0},
    {.group = "training: updates", .name = "sgd_update", .op = "sgd_update", .build = kt_build_sgd,
     .run = kt_run_sgd, .tol = kt_tol_update, .expect = kt_expect_sgd, .sub = 1},
    {.group = "training: updates", .name = "adam_update", .op = "adam_update", .build = kt_build_adam,
     .run = kt_run_adam, .tol = kt_tol_update, .expect = kt_expect_adam, .sub = 0},
    {.group = "training: updates", .name = "adam_update", .op = "adam_update", .build = kt_build_adam,
     .run = kt_run_adam, .tol = kt_tol_update, .expect = kt_expect_adam, .sub = 1},
    {.group = "training: updates", .name = "adam_update", .op = "adam_update", .build = kt_build_adam,
     .run = kt_run_adam, .tol = kt_tol_update, .expect = kt_expect_adam, .sub = 2},
};

#undef KT_UNARY_ROW
#undef KT_BINARY_ROW
#undef KT_SCALAR_ROW
#undef KT_GRAD_ROW

/* Every case of one row; failures are collected, then asserted once. */
START_TEST(test_row) {
  const kt_row_t *row = &kt_rows[_i];
  kt_failures = 0;
  kt_first_failure[0] = '\0';
  row->build(row);
  ck_assert_msg(kt_failures == 0, "%s: %d mismatch(es); the first: %s", row->name, kt_failures, kt_first_failure);
}
END_TEST

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

static bool kt_has_row(kt_run_fn *run, int sub) {
  for (size_t i = 0; i < sizeof kt_rows / sizeof kt_rows[0]; i++)
    if (kt_rows[i].run == run && kt_rows[i].sub == sub) return true;
  return false;
}

/* An operation added without its rows would go untested: say which. Every
 * op name KILN_PROVIDER takes (kiln_op_name) needs a row of that op; the
 * kinds unary, binary and binary_scalar are covered by a row per op of
 * KILN_UNARY_OPS and KILN_BINARY_OPS. */
START_TEST(test_rows_cover_ops) {
  for (int op = 0; op < KILN_UNARY_COUNT_; op++) {
    ck_assert_msg(kt_has_row(kt_run_unary, op), "the unary op %s has no row in kt_rows", kt_unary_names[op]);
    ck_assert_msg(kt_has_row(kt_run_unary_backward, op), "the derivative of %s has no row in kt_rows",
                  kt_unary_names[op]);
  }
  for (int op = 0; op < KILN_BINARY_COUNT_; op++) {
    ck_assert_msg(kt_has_row(kt_run_binary, op), "the binary op %s has no row in kt_rows", kt_binary_names[op]);
    ck_assert_msg(kt_has_row(kt_run_binary_scalar, op), "the op %s_scalar has no row in kt_rows",
                  kt_binary_names[op]);
  }
  for (size_t i = 0; kiln_op_name(i); i++) {
    const char *name = kiln_op_name(i);
    bool covered = !strcmp(name, "unary") || !strcmp(name, "binary") || !strcmp(name, "binary_scalar");
    for (size_t r = 0; r < sizeof kt_rows / sizeof kt_rows[0] && !covered; r++) covered = !strcmp(kt_rows[r].op, name);
    ck_assert_msg(covered, "the op \"%s\" (kiln_op_name(%zu)) has no row in kt_rows", name, i);
  }
}
END_TEST

/* ---- main ---------------------------------------------------------------------------------- */

/* A Check test case per group, in the order the rows name them. */
static Suite *kt_conformance_suite(void) {
  Suite *s = suite_create("conformance");
  size_t n_rows = sizeof kt_rows / sizeof kt_rows[0];
  for (size_t i = 0; i < n_rows; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++) seen = !strcmp(kt_rows[j].group, kt_rows[i].group);
    if (seen) continue;
    TCase *tc = tcase_create(kt_rows[i].group);
    for (size_t j = i; j < n_rows; j++)
      if (!strcmp(kt_rows[j].group, kt_rows[i].group)) tcase_add_loop_test(tc, test_row, (int)j, (int)j + 1);
    if (!strcmp(kt_rows[i].group, "movement")) tcase_add_test(tc, test_to_identity);
    if (!strcmp(kt_rows[i].group, "elementwise")) tcase_add_test(tc, test_rows_cover_ops);
    if (!strcmp(kt_rows[i].group, "neural-network operations")) tcase_add_test(tc, test_cross_entropy_label_report);
    suite_add_tcase(s, tc);
  }
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
