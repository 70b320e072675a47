/* tests/conformance/harness.h: what the conformance files share: rows, cases, inputs, tolerances, the runner. */
/*
 * The conformance suite is a table of rows, one per operation of
 * include/kiln/tensor.h, each with a function that builds its cases, one that
 * makes the public API call, and a tolerance rule. The rows live in one file
 * per group (creation.c, movement.c, elementwise.c, linalg.c, nn.c,
 * gradients.c, updates.c), each exporting a kt_group_t that main.c assembles;
 * the machinery they share (inputs, the runner, comparisons, the tally) is
 * harness.c, written once. gaps.c declares the cases a vendor provider
 * declines on purpose (see kt_gap_t below).
 */
#ifndef KILN_TESTS_CONFORMANCE_HARNESS_H
#define KILN_TESTS_CONFORMANCE_HARNESS_H

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "../common.h"

/* ---- devices ----------------------------------------------------------------- */

#define KT_MAX_DEVICES 64

extern kiln_device_t *kt_ref;                  /* cpu:0, native kernels */
extern kiln_device_t *kt_devs[KT_MAX_DEVICES]; /* under test */
extern size_t kt_ndev;
extern bool kt_small;                          /* KILN_CONFORMANCE_SMALL */

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

#define KT_COUNT(array) ((int64_t)(sizeof(array) / sizeof((array)[0])))

/* ---- rows and cases ------------------------------------------------------------------ */

typedef struct kt_row_t kt_row_t;
typedef struct kt_case_t kt_case_t;

/* Inputs of a case at most (mixed-precision Adam: param, grad, m, v, copy). */
#define KT_MAX_IN 5
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
  kiln_dtype_t index_dtype; /* index_select, index_add: the index's (i32 or i64) */
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
/* The same, for the run functions main.c's coverage test looks for (declared below). */
#define KT_RUN_SHARED(fn)                                                                                 \
  kiln_status_t fn(const kt_case_t *c __attribute__((unused)), kiln_device_t *dev __attribute__((unused)),        \
                   kiln_tensor_t *const *in __attribute__((unused)), kiln_tensor_t **out)

/* One operation. */
struct kt_row_t {
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

/* ---- shape lists ------------------------------------------------------------------------- */

/* A shape list entry: ndim then sizes (ndim -1 ends a list). */
typedef struct kt_shape_t {
  int ndim;
  int64_t s[KILN_MAX_DIMS];
  bool view;
  bool large; /* left out under KILN_CONFORMANCE_SMALL */
} kt_shape_t;

/* A convolution case: sizes, stride, padding, dilation (conv2d and its gradients). */
typedef struct kt_conv_t {
  int64_t n, c, h, w, k, r, s;
  int32_t stride[2], pad[2], dil[2];
  bool bias, view, large;
} kt_conv_t;

/* A max-pooling case (max_pool2d and its gradient). */
typedef struct kt_pool_t {
  int64_t n, c, h, w;
  int32_t kernel[2], stride[2], pad[2];
  bool view, large;
} kt_pool_t;

/* ---- groups ------------------------------------------------------------------------------ */

/* A group of rows: one Check test case, one file. */
typedef struct kt_group_t {
  const char *name;               /* the Check test case its rows run in */
  const kt_row_t *rows;
  size_t n_rows;
  void (*add_tests)(TCase *tc);   /* optional: the group's tests besides its rows */
} kt_group_t;

extern const kt_group_t kt_group_creation, kt_group_movement, kt_group_elementwise, kt_group_linalg, kt_group_nn,
    kt_group_gradients, kt_group_updates, kt_group_indexing;

/* The runs main.c's coverage test looks for (a row per unary and binary op). */
kt_run_fn kt_run_unary, kt_run_binary, kt_run_binary_scalar, kt_run_unary_backward;

/* ---- declared gaps (gaps.c) ---------------------------------------------------------------
 * A case a device's vendor provider declines on purpose (its supports() says
 * false, so the core runs `native`): the backend, the provider, the row's
 * name, which of its cases (a substring of the case label and/or a predicate
 * on the case; neither: every case), and why. A forced provider that declines
 * a case no gap covers fails the test. */
typedef struct kt_gap_t {
  const char *backend;                /* kiln_device_info's backend: "cpu", "opencl", "cuda"; NULL: any */
  const char *provider;               /* the provider forced: "blas", "clblast", "cublas", "cudnn"; NULL: any */
  const char *row;                    /* the row's name */
  const char *label;                  /* optional: a substring of the declined cases' labels */
  bool (*covers)(const kt_case_t *c); /* optional: whether the case is one the provider declines */
  const char *reason;                 /* why the provider declines (its supports()) */
} kt_gap_t;

/* The gap that covers `c` declined by `provider` on a device of `backend`, or NULL. */
const kt_gap_t *kt_gap_find(const char *backend, const char *provider, const kt_case_t *c);
/* The i-th gap of the table, or NULL past its end. */
const kt_gap_t *kt_gap_at(size_t i);

/* ---- the machinery (harness.c) ------------------------------------------------------------ */

extern const kt_tol_t kt_exact;
kt_tol_t kt_ulps(int ulps);
kt_tol_t kt_sum_tol(int64_t k, double scale);

int64_t kt_numel(int ndim, const int64_t *shape);
void kt_fill(const kt_in_t *in, void *data, int64_t n);
kiln_status_t kt_make(kiln_device_t *dev, const kt_in_t *in, kiln_tensor_t **out);
void kt_shape_text(int ndim, const int64_t *shape, char *out, size_t size);
void kt_in_text(const kt_in_t *in, char *out, size_t size);
kt_in_t kt_in(kiln_dtype_t dtype, kt_gen_t gen, uint32_t seed, int ndim, const int64_t *shape, bool view);

/* Failures of the current test: all are printed, the first is asserted. */
extern int kt_failures;
extern char kt_first_failure[2048];
void kt_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Run a case on the reference, then on every device with every provider. */
void kt_check(const kt_case_t *c);
/* A case of `row` with nothing set yet. */
kt_case_t kt_case(const kt_row_t *row);
void kt_case_shape(kt_case_t *c, const kt_shape_t *s);
void kt_result_alloc(kt_result_t *out, kiln_dtype_t dtype, int ndim, const int64_t *shape);

/* Whether KILN_CONFORMANCE_SMALL leaves the shape out. */
bool kt_skip(const kt_shape_t *s);
extern const kt_shape_t kt_elementwise_shapes[];
extern const kt_shape_t kt_softmax_shapes[];

/* Tolerance rules shared by rows. */
kt_tol_t kt_tol_exact(const kt_case_t *c);
kt_tol_t kt_tol_bits(const kt_case_t *c);
kt_tol_t kt_tol_row_ulps(const kt_case_t *c);

/* The summary: comparisons per device and provider, declared declines. */
unsigned long kt_comparisons(void);
void kt_summary_print(void);

#endif /* KILN_TESTS_CONFORMANCE_HARNESS_H */
