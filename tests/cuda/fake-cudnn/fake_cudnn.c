/* tests/cuda/fake_cudnn.c: a libcudnn.so.9 for tests: the legacy API kiln calls, on the host, failing where KILN_FAKE_CUDNN_FAIL says (a half-installed cuDNN, a handle that cannot be made, a refused shape). */
/*
 * It exports every symbol the plugin looks up, so dlsym succeeds as it does
 * with NVIDIA's shim, whose sub-libraries load only at their first call.
 * KILN_FAKE_CUDNN_FAIL (read at each call) picks the failure:
 *   graph, ops, cnn  the matching cudnn*VersionCheck returns
 *                    CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED (1008)
 *   create           cudnnCreate returns CUDNN_STATUS_NOT_INITIALIZED (1001)
 *   algorithm        the algorithm query returns 1008 (a sub-library that
 *                    fails at run time)
 *   refuse           the algorithm query returns CUDNN_STATUS_NOT_SUPPORTED
 *   shape            the output-shape queries answer one more row
 *   unset / none     everything succeeds (nothing runs on a device: the
 *                    computing calls check their descriptors against each
 *                    other, as cuDNN does, and count themselves)
 * KILN_FAKE_CUDNN_VERSION overrides cudnnGetVersion (91999, 9.19.99: no release's). While
 * kiln_fake_cudnn_hold(1) is in force, the algorithm query waits (up to
 * 5 s) until kiln_fake_cudnn_hold(0): a test uses it to see whether other
 * threads are held up meanwhile. Descriptors are host records of their
 * parameters.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

typedef int status_t;

static bool fails(const char *what) {
  const char *mode = getenv("KILN_FAKE_CUDNN_FAIL");
  return mode && !strcmp(mode, what);
}

static atomic_int calls_forward, calls_backward;
static atomic_int held;
static atomic_int waiting;

FAKE_EXPORT void kiln_fake_cudnn_hold(int on) { atomic_store(&held, on); }
FAKE_EXPORT int kiln_fake_cudnn_waiting(void) { return atomic_load(&waiting); }
/* cudnnConvolutionForward calls whose arguments were consistent. */
FAKE_EXPORT int kiln_fake_cudnn_forward_calls(void) { return atomic_load(&calls_forward); }
/* The last consistent forward's data type (cudnnDataType_t), algorithm and
 * beta (read as the data type's scaling type: double for double data,
 * float otherwise). */
static int last_data = -1, last_algo = -1;
static double last_beta = -1.0;
FAKE_EXPORT void kiln_fake_cudnn_last_forward(int *data_type, int *algo, double *beta) {
  *data_type = last_data;
  *algo = last_algo;
  *beta = last_beta;
}
/* cudnnConvolutionBackwardData, cudnnConvolutionBackwardFilter and
 * cudnnSoftmaxBackward calls whose arguments were consistent. */
FAKE_EXPORT int kiln_fake_cudnn_backward_calls(void) { return atomic_load(&calls_backward); }

FAKE_EXPORT size_t cudnnGetVersion(void) {
  const char *v = getenv("KILN_FAKE_CUDNN_VERSION");
  return v && *v ? (size_t)strtoul(v, NULL, 10) : 91999u;
}

FAKE_EXPORT const char *cudnnGetErrorString(status_t status) {
  switch (status) {
  case 0: return "CUDNN_STATUS_SUCCESS";
  case 1001: return "CUDNN_STATUS_NOT_INITIALIZED";
  case 1008: return "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED";
  case 2000: return "CUDNN_STATUS_BAD_PARAM";
  case 3000: return "CUDNN_STATUS_NOT_SUPPORTED";
  default: return "CUDNN_STATUS_UNKNOWN (fake)";
  }
}

FAKE_EXPORT status_t cudnnGraphVersionCheck(void) { return fails("graph") ? 1008 : 0; }
FAKE_EXPORT status_t cudnnOpsVersionCheck(void) { return fails("ops") ? 1008 : 0; }
FAKE_EXPORT status_t cudnnCnnVersionCheck(void) { return fails("cnn") ? 1008 : 0; }

static int handle_storage;
FAKE_EXPORT status_t cudnnCreate(void **handle) {
  if (fails("create")) return 1001;
  *handle = &handle_storage;
  return 0;
}
FAKE_EXPORT status_t cudnnDestroy(void *handle) { return handle == &handle_storage ? 0 : 2000; }
FAKE_EXPORT status_t cudnnSetStream(void *handle, void *stream) { return 0; }

/* One record type for every descriptor: its kind and integer parameters. */
typedef struct desc_t {
  int kind; /* 1 tensor, 2 filter, 3 convolution, 4 pooling */
  int v[10];
} desc_t;

/* cudnnDataType_t values of the data kiln passes: FLOAT, DOUBLE, HALF, BFLOAT16. */
static bool data_type_known(int type) { return type == 0 || type == 1 || type == 2 || type == 9; }

static status_t desc_create(void **out, int kind) {
  desc_t *d = calloc(1, sizeof *d);
  if (!d) return 4003;
  d->kind = kind;
  *out = d;
  return 0;
}
static status_t desc_destroy(void *d, int kind) {
  if (!d || ((desc_t *)d)->kind != kind) return 2000;
  free(d);
  return 0;
}

FAKE_EXPORT status_t cudnnCreateTensorDescriptor(void **d) { return desc_create(d, 1); }
FAKE_EXPORT status_t cudnnDestroyTensorDescriptor(void *d) { return desc_destroy(d, 1); }
FAKE_EXPORT status_t cudnnCreateFilterDescriptor(void **d) { return desc_create(d, 2); }
FAKE_EXPORT status_t cudnnDestroyFilterDescriptor(void *d) { return desc_destroy(d, 2); }
FAKE_EXPORT status_t cudnnCreateConvolutionDescriptor(void **d) { return desc_create(d, 3); }
FAKE_EXPORT status_t cudnnDestroyConvolutionDescriptor(void *d) { return desc_destroy(d, 3); }
FAKE_EXPORT status_t cudnnCreatePoolingDescriptor(void **d) { return desc_create(d, 4); }
FAKE_EXPORT status_t cudnnDestroyPoolingDescriptor(void *d) { return desc_destroy(d, 4); }

FAKE_EXPORT status_t cudnnSetTensor4dDescriptor(void *dp, int format, int type, int n, int c, int h, int w) {
  desc_t *d = dp;
  if (!d || d->kind != 1 || format != 0 || !data_type_known(type)) return 2000;
  d->v[0] = n, d->v[1] = c, d->v[2] = h, d->v[3] = w, d->v[4] = type;
  return 0;
}
FAKE_EXPORT status_t cudnnSetFilter4dDescriptor(void *dp, int type, int format, int k, int c, int r, int s) {
  desc_t *d = dp;
  if (!d || d->kind != 2 || format != 0 || !data_type_known(type)) return 2000;
  d->v[0] = k, d->v[1] = c, d->v[2] = r, d->v[3] = s, d->v[4] = type;
  return 0;
}
FAKE_EXPORT status_t cudnnSetConvolution2dDescriptor(void *dp, int pad_h, int pad_w, int u, int v, int dil_h,
                                                     int dil_w, int mode, int type) {
  desc_t *d = dp;
  /* The compute type: FLOAT or DOUBLE. */
  if (!d || d->kind != 3 || mode != 1 || (type != 0 && type != 1) || u < 1 || v < 1 || dil_h < 1 || dil_w < 1)
    return 2000;
  d->v[0] = pad_h, d->v[1] = pad_w, d->v[2] = u, d->v[3] = v, d->v[4] = dil_h, d->v[5] = dil_w, d->v[7] = type;
  return 0;
}
FAKE_EXPORT status_t cudnnSetConvolutionMathType(void *dp, int math) {
  desc_t *d = dp;
  if (!d || d->kind != 3) return 2000;
  d->v[6] = math;
  return 0;
}
FAKE_EXPORT status_t cudnnGetConvolution2dForwardOutputDim(void *cp, void *xp, void *wp, int *n, int *c, int *h,
                                                           int *w) {
  const desc_t *conv = cp, *x = xp, *f = wp;
  if (!conv || !x || !f) return 2000;
  *n = x->v[0];
  *c = f->v[0];
  *h = (x->v[2] + 2 * conv->v[0] - conv->v[4] * (f->v[2] - 1) - 1) / conv->v[2] + 1 + (fails("shape") ? 1 : 0);
  *w = (x->v[3] + 2 * conv->v[1] - conv->v[5] * (f->v[3] - 1) - 1) / conv->v[3] + 1;
  return 0;
}

typedef struct perf_t {
  int algo;
  status_t status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
} perf_t;

/* The algorithm queries of all three directions: held while the test says
 * (kiln_fake_cudnn_hold), failing as KILN_FAKE_CUDNN_FAIL says, else a
 * ranking kiln must read past. Forward: a tensor-core algorithm first
 * (kiln skips it without TF32), then algorithm 0 in FMA math. Backward: the
 * same, then a nondeterministic algorithm 0 in FMA math (kiln skips it for
 * a gradient), then algorithm 1, deterministic. */
static status_t algorithm_query(int requested, int *returned, perf_t *results, bool backward) {
  if (atomic_load(&held)) {
    atomic_fetch_add(&waiting, 1);
    const struct timespec tick = {0, 1000000};
    for (int i = 0; i < 5000 && atomic_load(&held); i++) nanosleep(&tick, NULL);
    atomic_fetch_sub(&waiting, 1);
    if (atomic_load(&held)) return 4000; /* never released: the caller sees an internal error */
  }
  if (fails("algorithm")) return 1008;
  if (fails("refuse")) return 3000;
  const int count = backward ? 3 : 2;
  if (requested < count) return 2000;
  memset(results, 0, (size_t)count * sizeof *results);
  results[0].algo = 1;
  results[0].math_type = 1;
  results[0].determinism = 1;
  results[1].algo = 0;
  results[1].math_type = 3;
  results[1].memory = 4096;
  results[1].determinism = backward ? 0 : 1;
  if (backward) {
    results[2].algo = 1;
    results[2].math_type = 3;
    results[2].memory = 8192;
    results[2].determinism = 1;
  }
  *returned = count;
  return 0;
}

FAKE_EXPORT status_t cudnnGetConvolutionForwardAlgorithm_v7(void *handle, void *x, void *w, void *conv, void *y,
                                                            int requested, int *returned, perf_t *results) {
  return algorithm_query(requested, returned, results, false);
}
FAKE_EXPORT status_t cudnnGetConvolutionForwardWorkspaceSize(void *handle, void *x, void *w, void *conv, void *y,
                                                             int algo, size_t *bytes) {
  *bytes = algo == 0 ? 4096 : 0;
  return 0;
}
/* Whether dy's descriptor is the convolution's output for x and w, as cuDNN
 * checks its arguments (the "shape" failure aside). */
static bool conv_consistent(const desc_t *x, const desc_t *w, const desc_t *conv, const desc_t *dy) {
  if (!x || !w || !conv || !dy || x->kind != 1 || w->kind != 2 || conv->kind != 3 || dy->kind != 1) return false;
  int n, k, p, q;
  if (cudnnGetConvolution2dForwardOutputDim((void *)conv, (void *)x, (void *)w, &n, &k, &p, &q)) return false;
  return x->v[1] == w->v[1] && dy->v[0] == n && dy->v[1] == k && dy->v[2] == p && dy->v[3] == q;
}

/* The forward checks what cuDNN checks of the dtypes too: x, w and y of one
 * data type, computed in double for DOUBLE and in float otherwise (FLOAT,
 * PSEUDO_HALF and PSEUDO_BFLOAT16 configurations); and the workspace its
 * algorithm asked for. */
FAKE_EXPORT status_t cudnnConvolutionForward(void *handle, const void *alpha, void *x, const void *xd, void *w,
                                             const void *wd, void *conv, int algo, void *ws, size_t ws_size,
                                             const void *beta, void *y, void *yd) {
  const desc_t *xs = x, *fs = w, *cs = conv, *ys = y;
  if (!conv_consistent(xs, fs, cs, ys) || !xd || !wd || !yd || !alpha || !beta) return 2000;
  const int data = xs->v[4];
  if (fs->v[4] != data || ys->v[4] != data || cs->v[7] != (data == 1 ? 1 : 0)) return 3000;
  if (algo != 0 && algo != 1) return 2000;
  if (algo == 0 && (ws_size < 4096 || !ws)) return 2000;
  last_data = data;
  last_algo = algo;
  last_beta = data == 1 ? *(const double *)beta : (double)*(const float *)beta;
  atomic_fetch_add(&calls_forward, 1);
  return 0;
}

FAKE_EXPORT status_t cudnnGetConvolutionBackwardDataAlgorithm_v7(void *handle, void *w, void *dy, void *conv,
                                                                 void *dx, int requested, int *returned,
                                                                 perf_t *results) {
  return algorithm_query(requested, returned, results, true);
}
FAKE_EXPORT status_t cudnnGetConvolutionBackwardDataWorkspaceSize(void *handle, void *w, void *dy, void *conv,
                                                                  void *dx, int algo, size_t *bytes) {
  *bytes = algo == 1 ? 8192 : 4096;
  return 0;
}
FAKE_EXPORT status_t cudnnConvolutionBackwardData(void *handle, const void *alpha, void *w, const void *wd, void *dy,
                                                  const void *dyd, void *conv, int algo, void *ws, size_t ws_size,
                                                  const void *beta, void *dx, void *dxd) {
  if (!conv_consistent(dx, w, conv, dy) || !wd || !dyd || !dxd || algo != 1 || ws_size < 8192 || !ws) return 2000;
  atomic_fetch_add(&calls_backward, 1);
  return 0;
}

FAKE_EXPORT status_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(void *handle, void *x, void *dy, void *conv,
                                                                   void *dw, int requested, int *returned,
                                                                   perf_t *results) {
  return algorithm_query(requested, returned, results, true);
}
FAKE_EXPORT status_t cudnnGetConvolutionBackwardFilterWorkspaceSize(void *handle, void *x, void *dy, void *conv,
                                                                    void *dw, int algo, size_t *bytes) {
  *bytes = algo == 1 ? 8192 : 4096;
  return 0;
}
FAKE_EXPORT status_t cudnnConvolutionBackwardFilter(void *handle, const void *alpha, void *x, const void *xd,
                                                    void *dy, const void *dyd, void *conv, int algo, void *ws,
                                                    size_t ws_size, const void *beta, void *dw, void *dwd) {
  if (!conv_consistent(x, dw, conv, dy) || !xd || !dyd || !dwd || algo != 1 || ws_size < 8192 || !ws) return 2000;
  atomic_fetch_add(&calls_backward, 1);
  return 0;
}

/* ACCURATE (1) or LOG (2), per instance (0), three descriptors of one shape. */
FAKE_EXPORT status_t cudnnSoftmaxBackward(void *handle, int algorithm, int mode, const void *alpha, void *yp,
                                          const void *y, void *dyp, const void *dy, const void *beta, void *dxp,
                                          void *dx) {
  const desc_t *yd = yp, *dyd = dyp, *dxd = dxp;
  if (algorithm < 1 || algorithm > 2 || mode != 0 || !yd || !dyd || !dxd || !y || !dy || !dx) return 2000;
  if (yd->kind != 1 || memcmp(yd, dyd, sizeof *yd) || memcmp(yd, dxd, sizeof *yd)) return 2000;
  atomic_fetch_add(&calls_backward, 1);
  return 0;
}

FAKE_EXPORT status_t cudnnSetPooling2dDescriptor(void *dp, int mode, int nan, int wh, int ww, int ph, int pw, int sh,
                                                 int sw) {
  desc_t *d = dp;
  if (!d || d->kind != 4 || mode != 0 || sh < 1 || sw < 1) return 2000;
  d->v[0] = wh, d->v[1] = ww, d->v[2] = ph, d->v[3] = pw, d->v[4] = sh, d->v[5] = sw;
  return 0;
}
FAKE_EXPORT status_t cudnnGetPooling2dForwardOutputDim(void *pp, void *xp, int *n, int *c, int *h, int *w) {
  const desc_t *pool = pp, *x = xp;
  if (!pool || !x) return 2000;
  *n = x->v[0];
  *c = x->v[1];
  *h = (x->v[2] + 2 * pool->v[2] - pool->v[0]) / pool->v[4] + 1 + (fails("shape") ? 1 : 0);
  *w = (x->v[3] + 2 * pool->v[3] - pool->v[1]) / pool->v[5] + 1;
  return 0;
}
FAKE_EXPORT status_t cudnnPoolingForward(void *handle, void *pool, const void *alpha, void *x, const void *xd,
                                         const void *beta, void *y, void *yd) {
  atomic_fetch_add(&calls_forward, 1);
  return 0;
}
