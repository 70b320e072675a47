/* bench/bench.h: kiln-bench's shared types: options, timing statistics, result rows, sections and peers. */
#ifndef KILN_BENCH_H
#define KILN_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kiln/kiln.h>

/* ---- options ------------------------------------------------------------ */

typedef struct bench_options_t {
  bool quick;          /* small sizes, few repetitions: the whole run under a minute */
  bool keep_env;       /* do not re-exec with OPENBLAS_CORETYPE removed */
  int reps;            /* timed samples per figure */
  int warmup;          /* untimed runs before the samples */
  double min_sample_s; /* a sample repeats the operation until it lasts this long */
  const char *out_dir;
  uint32_t sections;   /* bit i: section i + 1 selected */
  const char *command; /* the command line, for the report */
  const char *self;    /* the path that re-executes this program */
  char coretype_was[128]; /* OPENBLAS_CORETYPE removed at start-up ("" if it was not set) */
  bool coretype_kept;  /* --keep-env given while OPENBLAS_CORETYPE was set */
} bench_options_t;

enum {
  BENCH_SECTION_MATMUL = 0,
  BENCH_SECTION_NN,
  BENCH_SECTION_OVERHEAD,
  BENCH_SECTION_CHAPTER,
  BENCH_SECTION_TRANSFER,
  BENCH_SECTION_CACHE,
  BENCH_SECTION_CUDA,
  BENCH_SECTION_TRAIN,
  BENCH_SECTION_PYTHON,
  BENCH_SECTION_HALF,
  BENCH_SECTION_COUNT
};

/* ---- timing ------------------------------------------------------------- */

/* Host monotonic clock in seconds. */
double bench_now(void);

/* Order statistics of per-iteration times (seconds) or of any values. */
typedef struct bench_stats_t {
  double median, min, max, q1, q3;
  int samples;    /* timed samples */
  long iters;     /* operations per sample */
} bench_stats_t;

/* Runs `iters` operations and synchronises (the clock stops when it returns).
 * Returns 0, or -1 with a message in bench_error(). */
typedef int (*bench_fn)(void *ctx, long iters);

/* Warm up, size samples to opts->min_sample_s, then take opts->reps samples;
 * *out holds seconds per operation. Returns 0 or -1 (bench_error()). */
int bench_measure(const bench_options_t *opts, bench_fn fn, void *ctx, bench_stats_t *out);
/* The same with an explicit number of repetitions and minimum sample time. */
int bench_measure_n(bench_fn fn, void *ctx, int warmup, int reps, double min_sample_s, bench_stats_t *out);
/* Statistics of n values (sorted in place). */
void bench_stats_of(double *values, int n, bench_stats_t *out);
/* Scale every figure of *st by factor (seconds to µs, or work / seconds; a
 * negative power flips the order: rates from times). */
bench_stats_t bench_stats_rate(const bench_stats_t *seconds, double work);
bench_stats_t bench_stats_scale(const bench_stats_t *st, double factor);

/* The last failure of the bench itself (what failed and why), per thread. */
const char *bench_error(void);
void bench_set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* bench_set_error with kiln's own status and message appended. */
int bench_kiln_error(const char *what, kiln_status_t status);

/* ---- results ------------------------------------------------------------ */

#define BENCH_MAX_CMP 3

/* One comparison of a kiln figure with a peer's. ratio is kiln's speed over
 * the peer's: > 1 means kiln was faster (value ratio for rates, inverse for
 * times). */
typedef struct bench_cmp_t {
  char peer[64];
  double peer_value; /* in the row's unit; NaN when the peer could not run */
  double ratio;      /* NaN when unknown */
} bench_cmp_t;

typedef struct bench_row_t {
  int section;          /* BENCH_SECTION_* */
  char name[64];        /* "matmul", "add 16 floats: enqueue only" */
  char device[48];      /* selector ("cpu:0", "opencl:0") or "host" for peers */
  char provider[48];    /* kiln's provider, or the peer's name */
  char params[64];      /* "2048^3", "N32 C64 K64 56x56 3x3" */
  char unit[16];        /* "GFLOPS", "GB/s", "us", "ms", "x" */
  bool higher_better;
  bool is_peer;         /* a peer's row (no kiln in it) */
  bool chosen;          /* the provider policy `fastest` chose */
  bool valid;           /* false: nothing measured; note says why */
  bench_stats_t st;     /* in `unit` */
  int ncmp;
  bench_cmp_t cmp[BENCH_MAX_CMP];
  char target[80];      /* "" when none; ">= 0.95x OpenBLAS" */
  int met;              /* -1 no target, 0 missed, 1 met */
  char note[200];
} bench_row_t;

/* A fresh row of a section. */
bench_row_t bench_row_make(int section, const char *name, const char *device, const char *provider,
                           const char *params, const char *unit, bool higher_better);
/* Compare a row with a peer's figure (same unit). Returns the ratio (NaN if unknown). */
double bench_row_compare(bench_row_t *row, const char *peer, double peer_value);
/* Target on the last comparison's ratio: met when ratio >= min_ratio. */
void bench_row_target_ratio(bench_row_t *row, double min_ratio);
/* Target on the row's own median: met when <= max_value (lower is better). */
void bench_row_target_max(bench_row_t *row, double max_value, const char *text);
/* Target on the difference to the last comparison: met when median - peer <= max_diff. */
void bench_row_target_diff(bench_row_t *row, double max_diff);
void bench_row_note(bench_row_t *row, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Record a row: kept for the table, the JSON and the report; printed on
 * stderr as progress. */
void bench_add(const bench_row_t *row);
/* A note attached to a section (skips, reasons, what a figure means). */
void bench_section_note(int section, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A section failed with a real error: noted, and kiln-bench exits 1. */
void bench_section_error(int section, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool bench_had_error(void);

/* Progress on stderr. */
void bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Rows travel from child processes as one line each. */
void bench_row_serialize(const bench_row_t *row, char *out, size_t size);
bool bench_row_parse(const char *line, bench_row_t *out);

/* Output: the table on stdout, results.json, plots through report.py, report.md. */
int bench_write_outputs(const bench_options_t *opts, double wall_s);

const char *bench_section_id(int section);
const char *bench_section_title(int section);

/* ---- devices -------------------------------------------------------------- */

typedef struct bench_device_t {
  kiln_device_t *device;
  kiln_device_info_t info;
  bool simulator; /* Oclgrind: correct, very slow; only tiny work */
  int cl_occurrence; /* OpenCL: how many earlier kiln devices share this platform and name */
} bench_device_t;

/* The visible devices (KILN_DEVICE applies). Returns the count; *out is static. */
size_t bench_devices(const bench_device_t **out);
/* Restore the policy in force at start and clear overrides (after forcing providers). */
void bench_reset_providers(void);

/* ---- sections ------------------------------------------------------------- */

void bench_section_matmul(const bench_options_t *opts);
void bench_section_nn(const bench_options_t *opts);
void bench_section_overhead(const bench_options_t *opts);
void bench_section_chapter(const bench_options_t *opts);
void bench_section_transfer(const bench_options_t *opts);
void bench_section_cache(const bench_options_t *opts);
void bench_section_cuda(const bench_options_t *opts);
void bench_section_train(const bench_options_t *opts);
void bench_section_python(const bench_options_t *opts);
void bench_section_half(const bench_options_t *opts);

/* Hidden modes run as child processes of kiln-bench itself. */
int bench_child_two_devices(const bench_options_t *opts);
int bench_child_first_matmul(const char *selector);

/* Run a program (argv[0] is its path) with extra environment (NULL-terminated
 * "NAME=value" list; a "NAME" alone removes it); stdout goes to *out_text
 * (malloc'd; may be NULL) and stderr passes through. Returns the exit status,
 * 128 + signal when killed, or -1 when it could not run (bench_error()). */
int bench_spawn(const char *const *argv, const char *const *env, char **out_text, double *out_wall_s);

/* Run kiln-bench itself as a child with extra environment (NULL-terminated
 * "NAME=value" list; a "NAME" alone removes it) and arguments; its stdout
 * goes to *out_text (malloc'd). Returns the exit status, -1 when it could not
 * run (bench_error()). */
int bench_run_self(const bench_options_t *opts, const char *const *env, const char *const *args, char **out_text,
                   double *out_wall_s);

/* ---- kiln helpers ---------------------------------------------------------- */

/* A 2-D f32 tensor of uniform numbers in [-1, 1) on a device. */
kiln_status_t bench_uniform(kiln_device_t *device, int64_t rows, int64_t cols, uint64_t seed, kiln_tensor_t **out);
/* Finish the device's current queue. */
kiln_status_t bench_finish(kiln_device_t *device);

/* One kiln operation timed in a loop: `iters` enqueues, then a finish of the
 * device's current queue. The provider that ran lands in `provider`. */
typedef enum bench_op_kind_t {
  BENCH_OP_MATMUL,
  BENCH_OP_CONV2D,
  BENCH_OP_ADD,
  BENCH_OP_SOFTMAX,
  BENCH_OP_CONV2D_BWD_INPUT,  /* a = dy, b = weight, shape = x's */
  BENCH_OP_CONV2D_BWD_WEIGHT, /* a = x, b = dy, shape = weight's */
  BENCH_OP_SGD,               /* a = param, b = grad, c = momentum buffer */
  BENCH_OP_ADAM,              /* a = param, b = grad, c = m, d = v; step counts up */
} bench_op_kind_t;
typedef struct bench_op_t {
  bench_op_kind_t kind;
  kiln_device_t *device;
  kiln_tensor_t *a, *b, *c, *d, *bias;
  kiln_conv2d_params_t conv;
  int64_t shape[4];
  int64_t step;
  char provider[32];
} bench_op_t;
int bench_op_run(void *ctx, long iters);
void bench_op_release(bench_op_t *op);
/* Providers of an op on a device, split ("native", "blas"); returns the count. */
int bench_providers(const bench_device_t *d, const char *op, char names[][32], int cap);
/* Whether heavy work runs on a device; notes the skip in the section when not. */
bool bench_heavy_ok(int section, const bench_device_t *d);

/* One kiln n^3 matmul measurement on a device with the current policy and
 * overrides: GFLOPS, and the provider that ran (32 bytes). */
int bench_kiln_matmul(const bench_options_t *opts, const bench_device_t *d, int n, bench_stats_t *out_gflops,
                      char *out_provider);

/* kiln's add of 16 floats on a device: enqueue-only and sustained cost per op
 * (n enqueues, then a finish), and enqueue + finish per op. Seconds. */
int bench_kiln_tiny(const bench_options_t *opts, kiln_device_t *device, long n, bench_stats_t *out_enqueue,
                    bench_stats_t *out_sustained, bench_stats_t *out_wait, char *out_provider);

/* ---- peers ----------------------------------------------------------------- */

/* OpenBLAS cblas_sgemm, n x n x n, seconds per call. */
int bench_openblas_sgemm(const bench_options_t *opts, int n, bench_stats_t *out);
/* The same with cblas_dgemm on f64 matrices. */
int bench_openblas_dgemm(const bench_options_t *opts, int n, bench_stats_t *out);
/* "OpenBLAS 0.3.21 (Haswell, 2 threads)". */
const char *bench_openblas_describe(void);
/* c = a + b over n floats by a plain C loop on all usable cores (pthreads). */
int bench_host_add(const bench_options_t *opts, size_t n, bench_stats_t *out);
/* memcpy of `bytes` on the host. */
int bench_host_memcpy(const bench_options_t *opts, size_t bytes, bench_stats_t *out);
/* Usable cores (sched_getaffinity). */
int bench_host_cores(void);

/* PyTorch through bench/torch_peer.py: each task ("matmul:100", "add16",
 * "add:N", "softmax:R,C", "conv2d:N,C,K,H,W,R,pad") gives seconds per op, or
 * valid = false and the reason in why. */
typedef struct bench_torch_result_t {
  bool valid;
  bench_stats_t st; /* seconds */
  char why[200];
  char info[96];    /* "torch 1.13.0, 2 threads" */
} bench_torch_result_t;
void bench_torch_run(const bench_options_t *opts, const char *const *tasks, int ntasks, bench_torch_result_t *out);
/* Where the helper scripts live (torch_peer.py, report.py), or NULL. */
const char *bench_script_path(const char *name);
/* The Python that runs them. */
const char *bench_python(void);

/* Raw OpenCL and CLBlast on the same OpenCL device as kiln's `device` (the
 * occurrence-th device with that platform and name), in their own context. Built only with OpenCL;
 * otherwise every call fails saying so. */
typedef struct bench_cl_t bench_cl_t;
int bench_cl_open(const bench_device_t *device, bench_cl_t **out);
/* Handles stay open for the run (bench_cl_close keeps them); close_all ends them. */
void bench_cl_close(bench_cl_t *cl);
void bench_cl_close_all(void);
int bench_cl_clblast_sgemm(const bench_options_t *opts, bench_cl_t *cl, int n, bench_stats_t *out);
/* A tiny add kernel (16 floats): enqueue-only cost per launch (n launches then
 * finish, clock stopped before the finish), the same with the finish, and
 * enqueue + finish per launch. Seconds. */
int bench_cl_tiny(const bench_options_t *opts, bench_cl_t *cl, long n, bench_stats_t *out_enqueue,
                  bench_stats_t *out_sustained, bench_stats_t *out_wait);
/* Blocking clEnqueueWriteBuffer / clEnqueueReadBuffer of `bytes`. */
int bench_cl_transfer(const bench_options_t *opts, bench_cl_t *cl, size_t bytes, bool to_device, bench_stats_t *out);

/* ---- formatting ------------------------------------------------------------ */

/* "2048^3" style helpers and human bytes ("256 MiB"). */
void bench_format_bytes(double bytes, char *out, size_t size);

#endif /* KILN_BENCH_H */
