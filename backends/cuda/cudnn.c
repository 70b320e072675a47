/* backends/cuda/cudnn.c: the cudnn provider for CONV2D (f32, f64, f16, bf16), MAX_POOL2D and the gradients cuDNN computes as kiln defines them: cuDNN loaded at run time, checked at load, one plan (or refusal) per shape kept in memory. */
/*
 * The API. cuDNN 9 marks its legacy descriptor API (cudnnConvolutionForward,
 * filter/convolution/pooling descriptors) deprecated in favour of the graph
 * ("backend") API, but ships it complete in every 9.x release. kiln uses the
 * legacy API, deliberately:
 * - it is the API every framework's cuDNN path was written against and whose
 *   behaviour (padding, NaN propagation, math types) is documented op by op;
 * - it needs a few dozen lines per op, against several hundred of graph
 *   descriptors, engine configurations and execution plans, code this
 *   plugin could not yet run on a GPU to prove correct;
 * - nothing is lost while it exists: the same engines serve both APIs.
 * The plugin declares what it calls itself (vendor_api.h), so it needs no
 * cuDNN header to build (and meets no deprecation warning). When a cuDNN
 * release drops the legacy API, dlsym fails at load, the provider reports
 * itself absent with that reason, and the native kernels run: a port to the
 * graph API then replaces this file alone.
 *
 * Half-installed cuDNN. libcudnn.so.9 is a shim that loads its
 * sub-libraries (libcudnn_graph, _ops, _cnn, ...) at their first call, so
 * every dlsym succeeds even when they are missing or of another version;
 * the failure would come at the first convolution. So the load also calls
 * cudnnGraphVersionCheck, cudnnOpsVersionCheck and cudnnCnnVersionCheck
 * (they need no GPU), and a failure makes the provider absent, with the
 * reason in devinfo -v. At run time, a handle that cannot be made or a
 * sub-library that fails all the same returns KILN_UNAVAILABLE from the row:
 * the core runs native and offers cudnn no more on that device, and the
 * device remembers it (supports() says false from then on).
 *
 * Gradients. cudnnConvolutionBackwardData and cudnnConvolutionBackwardFilter
 * serve CONV2D_BACKWARD_INPUT and _WEIGHT, with an algorithm that cuDNN
 * marks deterministic (its others add with atomics, so a result would change
 * from run to run), and cudnnSoftmaxBackward SOFTMAX_BACKWARD (ACCURATE for
 * softmax, LOG for log-softmax: the formulas of backend.h). MAX_POOL2D_BACKWARD
 * has no cudnn row: cudnnPoolingBackward gives a window's gradient to one of
 * its tied maxima, not necessarily the first in row-major order that kiln
 * (like PyTorch) specifies and the conformance suite checks to the bit, and
 * finds the maximum by comparing x with the forward's y, which no NaN equals.
 *
 * Dtypes. CONV2D runs in each dtype the native convolution computes: f32;
 * f64 (CUDNN_DATA_DOUBLE, computed in double); f16 and bf16 (CUDNN_DATA_HALF
 * and CUDNN_DATA_BFLOAT16, computed in float, CUDNN_TENSOR_OP_MATH: tensor
 * cores are what 16-bit is for). A 16-bit convolution's bias is written
 * into y first and cuDNN adds its float result to it (beta = 1) before the
 * one rounding, as the native path (through f32) rounds the biased sum
 * once; f32 and f64 add the bias afterwards, as the native path does. The
 * gradients, pooling and softmax rows are f32, like their native kernels.
 *
 * Plans. Each shape's descriptors and algorithm (or the reason cuDNN
 * refused it) are kept per device in a hash table; a refused shape is not
 * offered again (supports() looks it up), so the core goes to native
 * without asking cuDNN each time. The table's lock is held only to look up
 * and to insert: cuDNN's heuristics run outside it, so one slow query does
 * not hold up the device's other queues.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/vendor_api.h"

/* The library's functions, from dlsym. */
struct kiln_cuda_cudnn_t {
  void *dl; /* the dlopen handle of libcudnn */
  kiln_cudnn_get_version_fn get_version;
  kiln_cudnn_error_string_fn get_error_string;
  kiln_cudnn_version_check_fn graph_check, ops_check, cnn_check;
  kiln_cudnn_create_fn create;
  kiln_cudnn_destroy_fn destroy;
  kiln_cudnn_set_stream_fn set_stream;
  kiln_cudnn_create_desc_fn create_tensor, create_filter, create_conv, create_pooling;
  kiln_cudnn_destroy_desc_fn destroy_tensor, destroy_filter, destroy_conv, destroy_pooling;
  kiln_cudnn_set_tensor_4d_fn set_tensor_4d;
  kiln_cudnn_set_filter_4d_fn set_filter_4d;
  kiln_cudnn_set_conv_2d_fn set_conv_2d;
  kiln_cudnn_set_conv_math_fn set_conv_math;
  kiln_cudnn_conv_output_dim_fn conv_output_dim;
  kiln_cudnn_conv_algorithm_fn conv_algorithm;
  kiln_cudnn_conv_workspace_fn conv_workspace;
  kiln_cudnn_conv_forward_fn conv_forward;
  kiln_cudnn_bwd_data_algorithm_fn bwd_data_algorithm;
  kiln_cudnn_bwd_data_workspace_fn bwd_data_workspace;
  kiln_cudnn_bwd_data_fn bwd_data;
  kiln_cudnn_bwd_filter_algorithm_fn bwd_filter_algorithm;
  kiln_cudnn_bwd_filter_workspace_fn bwd_filter_workspace;
  kiln_cudnn_bwd_filter_fn bwd_filter;
  kiln_cudnn_softmax_backward_fn softmax_backward;
  kiln_cudnn_set_pooling_2d_fn set_pooling_2d;
  kiln_cudnn_pooling_output_dim_fn pooling_output_dim;
  kiln_cudnn_pooling_forward_fn pooling_forward;
};

#define KILN_CUDNN_SYM_(field, name) {name, offsetof(kiln_cuda_cudnn_t, field)}
static const struct { const char *symbol; size_t offset; } cudnn_symbols[] = {
    KILN_CUDNN_SYM_(get_version, "cudnnGetVersion"),
    KILN_CUDNN_SYM_(get_error_string, "cudnnGetErrorString"),
    KILN_CUDNN_SYM_(graph_check, "cudnnGraphVersionCheck"),
    KILN_CUDNN_SYM_(ops_check, "cudnnOpsVersionCheck"),
    KILN_CUDNN_SYM_(cnn_check, "cudnnCnnVersionCheck"),
    KILN_CUDNN_SYM_(create, "cudnnCreate"),
    KILN_CUDNN_SYM_(destroy, "cudnnDestroy"),
    KILN_CUDNN_SYM_(set_stream, "cudnnSetStream"),
    KILN_CUDNN_SYM_(create_tensor, "cudnnCreateTensorDescriptor"),
    KILN_CUDNN_SYM_(set_tensor_4d, "cudnnSetTensor4dDescriptor"),
    KILN_CUDNN_SYM_(destroy_tensor, "cudnnDestroyTensorDescriptor"),
    KILN_CUDNN_SYM_(create_filter, "cudnnCreateFilterDescriptor"),
    KILN_CUDNN_SYM_(set_filter_4d, "cudnnSetFilter4dDescriptor"),
    KILN_CUDNN_SYM_(destroy_filter, "cudnnDestroyFilterDescriptor"),
    KILN_CUDNN_SYM_(create_conv, "cudnnCreateConvolutionDescriptor"),
    KILN_CUDNN_SYM_(set_conv_2d, "cudnnSetConvolution2dDescriptor"),
    KILN_CUDNN_SYM_(set_conv_math, "cudnnSetConvolutionMathType"),
    KILN_CUDNN_SYM_(destroy_conv, "cudnnDestroyConvolutionDescriptor"),
    KILN_CUDNN_SYM_(conv_output_dim, "cudnnGetConvolution2dForwardOutputDim"),
    KILN_CUDNN_SYM_(conv_algorithm, "cudnnGetConvolutionForwardAlgorithm_v7"),
    KILN_CUDNN_SYM_(conv_workspace, "cudnnGetConvolutionForwardWorkspaceSize"),
    KILN_CUDNN_SYM_(conv_forward, "cudnnConvolutionForward"),
    KILN_CUDNN_SYM_(bwd_data_algorithm, "cudnnGetConvolutionBackwardDataAlgorithm_v7"),
    KILN_CUDNN_SYM_(bwd_data_workspace, "cudnnGetConvolutionBackwardDataWorkspaceSize"),
    KILN_CUDNN_SYM_(bwd_data, "cudnnConvolutionBackwardData"),
    KILN_CUDNN_SYM_(bwd_filter_algorithm, "cudnnGetConvolutionBackwardFilterAlgorithm_v7"),
    KILN_CUDNN_SYM_(bwd_filter_workspace, "cudnnGetConvolutionBackwardFilterWorkspaceSize"),
    KILN_CUDNN_SYM_(bwd_filter, "cudnnConvolutionBackwardFilter"),
    KILN_CUDNN_SYM_(softmax_backward, "cudnnSoftmaxBackward"),
    KILN_CUDNN_SYM_(create_pooling, "cudnnCreatePoolingDescriptor"),
    KILN_CUDNN_SYM_(set_pooling_2d, "cudnnSetPooling2dDescriptor"),
    KILN_CUDNN_SYM_(pooling_output_dim, "cudnnGetPooling2dForwardOutputDim"),
    KILN_CUDNN_SYM_(pooling_forward, "cudnnPoolingForward"),
    KILN_CUDNN_SYM_(destroy_pooling, "cudnnDestroyPoolingDescriptor"),
};
#undef KILN_CUDNN_SYM_

/* "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED", or the number's group. */
static const char *status_name(const kiln_cuda_cudnn_t *dnn, kiln_cudnn_status_t status) {
  const char *name = dnn && dnn->get_error_string ? dnn->get_error_string(status) : NULL;
  return name && *name ? name : "unknown cudnnStatus_t";
}

static kiln_status_t check(kiln_backend_context_t *ctx, kiln_cudnn_status_t status, const char *call_fmt,
                           const char *detail) {
  if (status == KILN_CUDNN_STATUS_SUCCESS) return KILN_OK;
  return kiln_cuda_cudnn_check(ctx, (int)status, status_name(ctx->cudnn, status), call_fmt, detail);
}

bool kiln_cuda_cudnn_load(kiln_backend_context_t *ctx, char *out_reason, size_t reason_size) {
  static const char *const names[] = {"libcudnn.so.9", "libcudnn.so"};
  ctx->cudnn = NULL;
  if (!kiln_cuda_vendor_wanted(ctx, KILN_CUDA_VENDOR_CUDNN, out_reason, reason_size)) return false;
  kiln_cuda_cudnn_t *dnn = calloc(1, sizeof *dnn);
  if (!dnn) {
    snprintf(out_reason, reason_size, "out of host memory");
    return false;
  }
  void *library = kiln_cuda_vendor_open(KILN_CUDA_VENDOR_CUDNN, names, 2, ctx->cudnn_path, sizeof ctx->cudnn_path,
                                        out_reason, reason_size);
  if (!library) {
    free(dnn);
    return false;
  }
  bool ok = true;
  for (size_t i = 0; ok && i < sizeof cudnn_symbols / sizeof cudnn_symbols[0]; i++) {
    if (!kiln_cuda_vendor_sym(library, cudnn_symbols[i].symbol, (char *)dnn + cudnn_symbols[i].offset,
                              sizeof(void (*)(void)))) {
      snprintf(out_reason, reason_size, "%s lacks %s (not a cuDNN 9 with its legacy API, which kiln uses)",
               ctx->cudnn_path, cudnn_symbols[i].symbol);
      ok = false;
    }
  }
  /* cuDNN 9 encodes major*10000 + minor*100 + patch. */
  const size_t v = ok ? dnn->get_version() : 0;
  if (ok && v / 10000 != 9) {
    snprintf(out_reason, reason_size, "%s is cuDNN %zu.%zu.%zu; kiln speaks cuDNN 9's API (install cuDNN 9)",
             ctx->cudnn_path, v / 10000, (v % 10000) / 100, v % 100);
    ok = false;
  }
  /* The sub-libraries: each check loads its own and compares versions. */
  const struct { kiln_cudnn_version_check_fn fn; const char *call, *sublib; } checks[] = {
      {dnn->graph_check, "cudnnGraphVersionCheck", "libcudnn_graph.so.9"},
      {dnn->ops_check, "cudnnOpsVersionCheck", "libcudnn_ops.so.9"},
      {dnn->cnn_check, "cudnnCnnVersionCheck", "libcudnn_cnn.so.9"},
  };
  for (size_t i = 0; ok && i < sizeof checks / sizeof checks[0]; i++) {
    const kiln_cudnn_status_t status = checks[i].fn();
    if (status != KILN_CUDNN_STATUS_SUCCESS) {
      snprintf(out_reason, reason_size,
               "cuDNN %zu.%zu.%zu at %s is incomplete: %s returned %s (%d): %s is missing or of another version "
               "(reinstall cuDNN, or point CUDNN_PATH at a complete one)",
               v / 10000, (v % 10000) / 100, v % 100, ctx->cudnn_path, checks[i].call, status_name(dnn, status),
               (int)status, checks[i].sublib);
      ok = false;
    }
  }
  if (!ok) {
    /* Not dlclose'd: a shim that started loading sub-libraries may have
     * registered state that must not outlive its code. */
    free(dnn);
    return false;
  }
  dnn->dl = library;
  snprintf(ctx->cudnn_version, sizeof ctx->cudnn_version, "cuDNN %zu.%zu.%zu", v / 10000, (v % 10000) / 100,
           v % 100);
  ctx->cudnn = dnn;
  return true;
}

void kiln_cuda_cudnn_unload(kiln_backend_context_t *ctx) {
  /* Stays mapped, like cuBLAS: its sub-libraries keep state past unload. */
  free(ctx->cudnn);
  ctx->cudnn = NULL;
}

void kiln_cuda_cudnn_queue_release(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue) {
  if (queue->cudnn && ctx->cudnn) (void)ctx->cudnn->destroy((kiln_cudnn_handle_t)queue->cudnn);
  queue->cudnn = NULL;
}

/* ---- plans: one per shape, or the reason cuDNN refused it ---------------------- */

#define KILN_CUDNN_KEY_LEN 16
#define KILN_CUDNN_BUCKETS 256
/* Past this many shapes, new ones build their descriptors each call. */
#define KILN_CUDNN_CACHE_MAX 4096

typedef struct plan_t {
  struct plan_t *next;
  int64_t key[KILN_CUDNN_KEY_LEN]; /* kind and dtype, then the shape */
  bool refused;                    /* cuDNN cannot run this shape: native runs it */
  char why[192];                   /* the refusal, for the log */
  kiln_cudnn_tensor_t x, y;
  kiln_cudnn_filter_t w;           /* conv2d */
  kiln_cudnn_conv_t conv;          /* conv2d */
  kiln_cudnn_pooling_t pooling;      /* max_pool2d */
  int algo;
  size_t workspace;
} plan_t;

typedef struct plan_cache_t {
  pthread_mutex_t lock;
  plan_t *buckets[KILN_CUDNN_BUCKETS];
  size_t count;
} plan_cache_t;

kiln_status_t kiln_cuda_cudnn_device_init(kiln_backend_device_t *device) {
  plan_cache_t *cache = calloc(1, sizeof *cache);
  if (!cache) return kiln_cuda_error(device->ctx, KILN_OUT_OF_MEMORY, "out of host memory for cuDNN's plans");
  pthread_mutex_init(&cache->lock, NULL);
  device->cudnn_cache = cache;
  return KILN_OK;
}

static void plan_destroy(const kiln_cuda_cudnn_t *dnn, plan_t *plan) {
  if (!plan) return;
  if (dnn) {
    if (plan->x) (void)dnn->destroy_tensor(plan->x);
    if (plan->y) (void)dnn->destroy_tensor(plan->y);
    if (plan->w) (void)dnn->destroy_filter(plan->w);
    if (plan->conv) (void)dnn->destroy_conv(plan->conv);
    if (plan->pooling) (void)dnn->destroy_pooling(plan->pooling);
  }
  free(plan);
}

void kiln_cuda_cudnn_device_release(kiln_backend_device_t *device) {
  plan_cache_t *cache = device->cudnn_cache;
  if (!cache) return;
  for (size_t b = 0; b < KILN_CUDNN_BUCKETS; b++)
    for (plan_t *plan = cache->buckets[b], *next; plan; plan = next) {
      next = plan->next;
      plan_destroy(device->ctx->cudnn, plan);
    }
  pthread_mutex_destroy(&cache->lock);
  free(cache);
  device->cudnn_cache = NULL;
}

/* The kinds that are a convolution's (op->u.conv2d). */
static bool is_conv(kiln_op_kind_t kind) {
  return kind == KILN_OP_CONV2D || kind == KILN_OP_CONV2D_BACKWARD_INPUT || kind == KILN_OP_CONV2D_BACKWARD_WEIGHT;
}

static void plan_key(const kiln_op_t *op, int64_t key[KILN_CUDNN_KEY_LEN]) {
  memset(key, 0, KILN_CUDNN_KEY_LEN * sizeof key[0]);
  key[0] = (int64_t)op->kind | (int64_t)op->out.dtype << 16; /* kind and dtype */
  if (is_conv(op->kind)) {
    const int64_t values[15] = {op->u.conv2d.n, op->u.conv2d.c, op->u.conv2d.h, op->u.conv2d.w, op->u.conv2d.k,
                                op->u.conv2d.r, op->u.conv2d.s, op->u.conv2d.p, op->u.conv2d.q,
                                op->u.conv2d.stride[0], op->u.conv2d.stride[1], op->u.conv2d.pad[0],
                                op->u.conv2d.pad[1], op->u.conv2d.dil[0], op->u.conv2d.dil[1]};
    memcpy(key + 1, values, sizeof values);
  } else if (op->kind == KILN_OP_SOFTMAX_BACKWARD) {
    key[1] = op->u.softmax.rows;
    key[2] = op->u.softmax.cols;
    key[3] = op->u.softmax.log;
  } else {
    const int64_t values[12] = {op->u.pooling.n, op->u.pooling.c, op->u.pooling.h, op->u.pooling.w,
                                op->u.pooling.p, op->u.pooling.q, op->u.pooling.window[0], op->u.pooling.window[1],
                                op->u.pooling.stride[0], op->u.pooling.stride[1], op->u.pooling.pad[0],
                                op->u.pooling.pad[1]};
    memcpy(key + 1, values, sizeof values);
  }
}

static size_t plan_bucket(const int64_t key[KILN_CUDNN_KEY_LEN]) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the key's words */
  for (int i = 0; i < KILN_CUDNN_KEY_LEN; i++) {
    h ^= (uint64_t)key[i];
    h *= 1099511628211ull;
  }
  return (size_t)(h ^ (h >> 32)) % KILN_CUDNN_BUCKETS;
}

/* The plan of `key`, or NULL. Lock held. */
static plan_t *plan_find_locked(plan_cache_t *cache, const int64_t key[KILN_CUDNN_KEY_LEN]) {
  for (plan_t *plan = cache->buckets[plan_bucket(key)]; plan; plan = plan->next)
    if (!memcmp(plan->key, key, KILN_CUDNN_KEY_LEN * sizeof key[0])) return plan;
  return NULL;
}

/* Keep `plan` for its key; when another thread kept one first, that one is
 * returned and `plan` destroyed. Past the cap nothing is kept, and the
 * caller owns `plan` (*out_kept false). */
static plan_t *plan_keep(kiln_backend_context_t *ctx, plan_cache_t *cache, plan_t *plan, bool *out_kept) {
  pthread_mutex_lock(&cache->lock);
  plan_t *found = plan_find_locked(cache, plan->key);
  if (!found && cache->count < KILN_CUDNN_CACHE_MAX) {
    const size_t b = plan_bucket(plan->key);
    plan->next = cache->buckets[b];
    cache->buckets[b] = plan;
    cache->count++;
    found = plan;
  }
  pthread_mutex_unlock(&cache->lock);
  *out_kept = found != NULL;
  if (found && found != plan) plan_destroy(ctx->cudnn, plan);
  return found ? found : plan;
}

/* ---- handles and support ---------------------------------------------------------- */

/* The queue's handle, bound to its stream. Called with queue->lock held and
 * the device's context current. A handle cuDNN cannot make (other than for
 * want of memory) means cuDNN cannot start on this device: KILN_UNAVAILABLE,
 * remembered by the device, and the core stops offering its rows here. */
static kiln_status_t queue_handle(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                  kiln_cudnn_handle_t *out_handle) {
  const kiln_cuda_cudnn_t *dnn = ctx->cudnn;
  if (!queue->cudnn) {
    kiln_cudnn_handle_t handle = NULL;
    kiln_status_t status = check(ctx, dnn->create(&handle), "%s", "cudnnCreate");
    if (status == KILN_OK) {
      status = check(ctx, dnn->set_stream(handle, queue->stream), "%s", "cudnnSetStream");
      if (status != KILN_OK) (void)dnn->destroy(handle);
    }
    if (status == KILN_OUT_OF_MEMORY) return status;
    if (status != KILN_OK) {
      atomic_store_explicit(&queue->device->cudnn_failed, true, memory_order_relaxed);
      return kiln_cuda_error(ctx, KILN_UNAVAILABLE,
                             "cuDNN cannot start on cuda:%d (%s); the native provider runs its operations there",
                             queue->device->ordinal, ctx->host.last_error());
    }
    queue->cudnn = handle;
  }
  *out_handle = (kiln_cudnn_handle_t)queue->cudnn;
  return KILN_OK;
}

/* A status that says cuDNN cannot work here at all (a sub-library that does
 * not load, an incompatible driver): remembered like a failed handle. */
static kiln_status_t provider_status(kiln_backend_queue_t *queue, kiln_status_t status) {
  if (status == KILN_UNAVAILABLE) atomic_store_explicit(&queue->device->cudnn_failed, true, memory_order_relaxed);
  return status;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* The dtypes of cudnn's rows: CONV2D in one float dtype throughout (x, w,
 * the bias, y), the others in f32 (and max_pool2d's i32 indices); false
 * and *out_bad, the first dtype that is not, otherwise. */
bool kiln_cuda_cudnn_takes(const kiln_op_t *op, kiln_dtype_t *out_bad) {
  if (op->kind == KILN_OP_CONV2D) return kiln_cuda_one_float_dtype(op, out_bad);
  return kiln_backend_op_dtypes_in(op, 1u << KILN_F32 | 1u << KILN_I32, 1u << KILN_F32, out_bad);
}

/* Sizes beyond int, empty dimensions (a weight gradient of no image: zeros),
 * pooling windows that may lie wholly in the padding, and shapes cuDNN
 * refused before are the native provider's. */
bool kiln_cuda_cudnn_supports(kiln_backend_context_t *ctx, kiln_backend_device_t *device,
                              const kiln_op_entry_t *entry, const kiln_op_t *op) {
  if (!ctx->cudnn || atomic_load_explicit(&device->cudnn_failed, memory_order_relaxed)) return false;
  if (!op) return true;
  if (!kiln_cuda_cudnn_takes(op, NULL)) return false;
  if (is_conv(op->kind)) {
    const int64_t dims[] = {op->u.conv2d.n, op->u.conv2d.c, op->u.conv2d.h, op->u.conv2d.w, op->u.conv2d.k,
                            op->u.conv2d.r, op->u.conv2d.s, op->u.conv2d.p, op->u.conv2d.q,
                            op->u.conv2d.n * op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w,
                            op->u.conv2d.n * op->u.conv2d.k * op->u.conv2d.p * op->u.conv2d.q,
                            op->u.conv2d.k * op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
      if (!fits_int(dims[i])) return false;
    for (size_t i = 0; i < 9; i++)
      if (dims[i] == 0) return false;
  } else if (op->kind == KILN_OP_SOFTMAX_BACKWARD) {
    const int64_t rows = op->u.softmax.rows, cols = op->u.softmax.cols;
    if (rows < 1 || cols < 1 || !fits_int(rows) || !fits_int(cols) || !fits_int(rows * cols)) return false;
  } else { /* MAX_POOL2D */
    const int64_t n = op->u.pooling.n, c = op->u.pooling.c, h = op->u.pooling.h, w = op->u.pooling.w;
    const int64_t p = op->u.pooling.p, q = op->u.pooling.q;
    if (!fits_int(n * c * h * w) || !fits_int(n * c * p * q)) return false;
    if (n * c * p * q == 0 || h == 0 || w == 0) return false;
    /* With pad < kernel every window holds a real cell; otherwise kiln's
     * answer for an all-padding window (-inf) is not cuDNN's to give. */
    for (int i = 0; i < 2; i++)
      if (op->u.pooling.pad[i] >= op->u.pooling.window[i]) return false;
  }
  plan_cache_t *cache = device->cudnn_cache;
  if (!cache) return true;
  int64_t key[KILN_CUDNN_KEY_LEN];
  plan_key(op, key);
  pthread_mutex_lock(&cache->lock);
  const plan_t *plan = plan_find_locked(cache, key);
  const bool refused = plan && plan->refused;
  pthread_mutex_unlock(&cache->lock);
  return !refused;
}

/* ---- building plans (outside the cache's lock) ---------------------------------------- */

/* Record why cuDNN cannot run this shape; the plan keeps the reason and
 * the caller returns KILN_UNSUPPORTED with it. */
static kiln_status_t refuse(kiln_backend_context_t *ctx, plan_t *plan, const char *what, const kiln_op_t *op) {
  snprintf(plan->why, sizeof plan->why, "%s", what);
  plan->refused = true;
  return kiln_cuda_error(ctx, KILN_UNSUPPORTED, "provider 'cudnn' cannot run this %s (%s); the native provider runs it",
                         kiln_backend_op_kind_name(op->kind), what);
}

/* The first of `returned` heuristic results (cuDNN ranks them) that
 * succeeded, needs at most 1 GiB of workspace and, in f32, no TF32 (unless
 * KILN_CUDA_TF32=1; tensor-op math in f64 is exact FMA, and in f16 and bf16
 * it is wanted), and, for a gradient, is deterministic; -1 when none. */
static int choose_algorithm(const kiln_backend_context_t *ctx, const kiln_cudnn_fwd_perf_t *results, int returned,
                            bool deterministic, kiln_dtype_t dtype) {
  for (int i = 0; i < returned; i++) {
    if (results[i].status != KILN_CUDNN_STATUS_SUCCESS) continue;
    if (results[i].memory > ((size_t)1 << 30)) continue;
    if (dtype == KILN_F32 && !ctx->tf32 && (results[i].math_type == KILN_CUDNN_TENSOR_OP_MATH ||
                       results[i].math_type == KILN_CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    if (deterministic && results[i].determinism != KILN_CUDNN_DETERMINISTIC) continue;
    return i;
  }
  return -1;
}

/* cudnnDataType_t of a dtype cudnn's convolution takes (kiln_cuda_cudnn_takes). */
static int data_type(kiln_dtype_t dtype) {
  switch (dtype) {
  case KILN_F64: return KILN_CUDNN_DATA_DOUBLE;
  case KILN_F16: return KILN_CUDNN_DATA_HALF;
  case KILN_BF16: return KILN_CUDNN_DATA_BFLOAT16;
  default: return KILN_CUDNN_DATA_FLOAT;
  }
}

/* The descriptors of one convolution (x, or dx; y, or dy; w, or dw) and the
 * algorithm of op's kind: forward, backward data or backward filter (see
 * choose_algorithm). A shape cuDNN cannot run leaves plan->refused set. */
static kiln_status_t plan_conv(kiln_backend_context_t *ctx, kiln_cudnn_handle_t handle, const kiln_op_t *op,
                               plan_t *plan) {
  const kiln_cuda_cudnn_t *dnn = ctx->cudnn;
  const int n = (int)op->u.conv2d.n, c = (int)op->u.conv2d.c, h = (int)op->u.conv2d.h, w = (int)op->u.conv2d.w;
  const int k = (int)op->u.conv2d.k, r = (int)op->u.conv2d.r, s = (int)op->u.conv2d.s;
  const int p = (int)op->u.conv2d.p, q = (int)op->u.conv2d.q;
  const int data = data_type(op->out.dtype);
  /* f64 computes in double; f16 and bf16 in float (cuDNN's PSEUDO_HALF and
   * PSEUDO_BFLOAT16 configurations), the one rounding at the store. */
  const int compute = op->out.dtype == KILN_F64 ? KILN_CUDNN_DATA_DOUBLE : KILN_CUDNN_DATA_FLOAT;
  /* f32: FMA math excludes TF32 tensor cores, which CUDNN_DEFAULT_MATH
   * allows on Ampere and newer, unless KILN_CUDA_TF32=1. f16 and bf16:
   * tensor cores. f64: cuDNN's default. */
  const int math = op->out.dtype == KILN_F32   ? (ctx->tf32 ? KILN_CUDNN_DEFAULT_MATH : KILN_CUDNN_FMA_MATH)
                   : op->out.dtype == KILN_F64 ? KILN_CUDNN_DEFAULT_MATH
                                               : KILN_CUDNN_TENSOR_OP_MATH;
  kiln_status_t status = check(ctx, dnn->create_tensor(&plan->x), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK) status = check(ctx, dnn->create_tensor(&plan->y), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK) status = check(ctx, dnn->create_filter(&plan->w), "%s", "cudnnCreateFilterDescriptor");
  if (status == KILN_OK) status = check(ctx, dnn->create_conv(&plan->conv), "%s", "cudnnCreateConvolutionDescriptor");
  if (status == KILN_OK)
    status = check(ctx, dnn->set_tensor_4d(plan->x, KILN_CUDNN_TENSOR_NCHW, data, n, c, h, w), "%s",
                   "cudnnSetTensor4dDescriptor (input)");
  if (status == KILN_OK)
    status = check(ctx, dnn->set_tensor_4d(plan->y, KILN_CUDNN_TENSOR_NCHW, data, n, k, p, q), "%s",
                   "cudnnSetTensor4dDescriptor (output)");
  if (status == KILN_OK)
    status = check(ctx, dnn->set_filter_4d(plan->w, data, KILN_CUDNN_TENSOR_NCHW, k, c, r, s), "%s",
                   "cudnnSetFilter4dDescriptor");
  /* Cross-correlation, as every framework's conv2d (and kiln's) computes. */
  if (status == KILN_OK)
    status = check(ctx,
                   dnn->set_conv_2d(plan->conv, op->u.conv2d.pad[0], op->u.conv2d.pad[1], op->u.conv2d.stride[0],
                                    op->u.conv2d.stride[1], op->u.conv2d.dil[0], op->u.conv2d.dil[1],
                                    KILN_CUDNN_CROSS_CORRELATION, compute),
                   "%s", "cudnnSetConvolution2dDescriptor");
  if (status == KILN_OK)
    status = check(ctx, dnn->set_conv_math(plan->conv, math), "%s", "cudnnSetConvolutionMathType");
  if (status == KILN_OK) {
    int on = 0, ok = 0, op_ = 0, oq = 0;
    status = check(ctx, dnn->conv_output_dim(plan->conv, plan->x, plan->w, &on, &ok, &op_, &oq), "%s",
                   "cudnnGetConvolution2dForwardOutputDim");
    if (status == KILN_OK && (on != n || ok != k || op_ != p || oq != q))
      return refuse(ctx, plan, "cuDNN computes another output shape", op);
  }
  if (status != KILN_OK) return status;
  /* Room for every kind's algorithms (8 forward, 6 data, 7 filter). */
  kiln_cudnn_fwd_perf_t results[KILN_CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  const char *query;
  switch (op->kind) {
  case KILN_OP_CONV2D_BACKWARD_INPUT:
    query = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
    status = check(ctx,
                   dnn->bwd_data_algorithm(handle, plan->w, plan->y, plan->conv, plan->x,
                                           KILN_CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, results),
                   "%s", query);
    break;
  case KILN_OP_CONV2D_BACKWARD_WEIGHT:
    query = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
    status = check(ctx,
                   dnn->bwd_filter_algorithm(handle, plan->x, plan->y, plan->conv, plan->w,
                                             KILN_CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, results),
                   "%s", query);
    break;
  default: /* CONV2D */
    query = "cudnnGetConvolutionForwardAlgorithm_v7";
    status = check(ctx,
                   dnn->conv_algorithm(handle, plan->x, plan->w, plan->conv, plan->y,
                                       KILN_CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, results),
                   "%s", query);
    break;
  }
  if (status != KILN_OK) return status;
  const bool gradient = op->kind != KILN_OP_CONV2D;
  const int chosen = choose_algorithm(ctx, results, returned, gradient, op->out.dtype);
  if (chosen < 0)
    return refuse(ctx, plan,
                  gradient ? "no deterministic algorithm fits without TF32 and 1 GiB of workspace"
                  : op->out.dtype == KILN_F32 ? "no algorithm fits without TF32 and 1 GiB of workspace"
                                              : "no algorithm fits 1 GiB of workspace",
                  op);
  plan->algo = results[chosen].algo;
  switch (op->kind) {
  case KILN_OP_CONV2D_BACKWARD_INPUT:
    return check(ctx,
                 dnn->bwd_data_workspace(handle, plan->w, plan->y, plan->conv, plan->x, plan->algo, &plan->workspace),
                 "%s", "cudnnGetConvolutionBackwardDataWorkspaceSize");
  case KILN_OP_CONV2D_BACKWARD_WEIGHT:
    return check(ctx,
                 dnn->bwd_filter_workspace(handle, plan->x, plan->y, plan->conv, plan->w, plan->algo,
                                           &plan->workspace),
                 "%s", "cudnnGetConvolutionBackwardFilterWorkspaceSize");
  default:
    return check(ctx,
                 dnn->conv_workspace(handle, plan->x, plan->w, plan->conv, plan->y, plan->algo, &plan->workspace),
                 "%s", "cudnnGetConvolutionForwardWorkspaceSize");
  }
}

static kiln_status_t plan_pooling(kiln_backend_context_t *ctx, const kiln_op_t *op, plan_t *plan) {
  const kiln_cuda_cudnn_t *dnn = ctx->cudnn;
  const int n = (int)op->u.pooling.n, c = (int)op->u.pooling.c, h = (int)op->u.pooling.h, w = (int)op->u.pooling.w;
  const int p = (int)op->u.pooling.p, q = (int)op->u.pooling.q;
  kiln_status_t status = check(ctx, dnn->create_tensor(&plan->x), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK) status = check(ctx, dnn->create_tensor(&plan->y), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK) status = check(ctx, dnn->create_pooling(&plan->pooling), "%s", "cudnnCreatePoolingDescriptor");
  if (status == KILN_OK)
    status = check(ctx, dnn->set_tensor_4d(plan->x, KILN_CUDNN_TENSOR_NCHW, KILN_CUDNN_DATA_FLOAT, n, c, h, w), "%s",
                   "cudnnSetTensor4dDescriptor (input)");
  if (status == KILN_OK)
    status = check(ctx, dnn->set_tensor_4d(plan->y, KILN_CUDNN_TENSOR_NCHW, KILN_CUDNN_DATA_FLOAT, n, c, p, q), "%s",
                   "cudnnSetTensor4dDescriptor (output)");
  /* NaN propagates, as in kiln's own kernels. */
  if (status == KILN_OK)
    status = check(ctx,
                   dnn->set_pooling_2d(plan->pooling, KILN_CUDNN_POOLING_MAX, KILN_CUDNN_PROPAGATE_NAN,
                                    op->u.pooling.window[0], op->u.pooling.window[1], op->u.pooling.pad[0],
                                    op->u.pooling.pad[1], op->u.pooling.stride[0], op->u.pooling.stride[1]),
                   "%s", "cudnnSetPooling2dDescriptor");
  if (status != KILN_OK) return status;
  int on = 0, oc = 0, op_ = 0, oq = 0;
  status = check(ctx, dnn->pooling_output_dim(plan->pooling, plan->x, &on, &oc, &op_, &oq), "%s",
                 "cudnnGetPooling2dForwardOutputDim");
  if (status == KILN_OK && (on != n || oc != c || op_ != p || oq != q))
    return refuse(ctx, plan, "cuDNN computes another output shape", op);
  return status;
}

/* SOFTMAX_BACKWARD: y, dy and dx are all [rows, cols] as NCHW [rows, cols,
 * 1, 1], the softmax over each row's C (H = W = 1), one descriptor for the
 * three. */
static kiln_status_t plan_softmax(kiln_backend_context_t *ctx, const kiln_op_t *op, plan_t *plan) {
  const kiln_cuda_cudnn_t *dnn = ctx->cudnn;
  kiln_status_t status = check(ctx, dnn->create_tensor(&plan->x), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK)
    status = check(ctx,
                   dnn->set_tensor_4d(plan->x, KILN_CUDNN_TENSOR_NCHW, KILN_CUDNN_DATA_FLOAT, (int)op->u.softmax.rows,
                                      (int)op->u.softmax.cols, 1, 1),
                   "%s", "cudnnSetTensor4dDescriptor (rows)");
  return status;
}

/* The plan for `op`: the cached one, or one built now (and kept when the
 * cache has room; *out_owned says the caller must destroy it). A refused
 * shape returns KILN_UNSUPPORTED. Queue lock held, context current. */
static kiln_status_t plan_get(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, kiln_cudnn_handle_t handle,
                              const kiln_op_t *op, plan_t **out_plan, bool *out_owned) {
  plan_cache_t *cache = queue->device->cudnn_cache;
  int64_t key[KILN_CUDNN_KEY_LEN];
  plan_key(op, key);
  *out_owned = false;
  char why[sizeof ((plan_t *)0)->why] = "";
  pthread_mutex_lock(&cache->lock);
  plan_t *plan = plan_find_locked(cache, key);
  const bool refused = plan && plan->refused;
  if (refused) memcpy(why, plan->why, sizeof why);
  pthread_mutex_unlock(&cache->lock);
  if (refused)
    return kiln_cuda_error(ctx, KILN_UNSUPPORTED,
                           "provider 'cudnn' cannot run this %s (%s, found earlier); the native provider runs it",
                           kiln_backend_op_kind_name(op->kind), why);
  if (!plan) {
    plan_t *made = calloc(1, sizeof *made);
    if (!made) return kiln_cuda_error(ctx, KILN_OUT_OF_MEMORY, "out of host memory for a cuDNN plan");
    memcpy(made->key, key, sizeof key);
    kiln_status_t status = is_conv(op->kind)                     ? plan_conv(ctx, handle, op, made)
                           : op->kind == KILN_OP_SOFTMAX_BACKWARD ? plan_softmax(ctx, op, made)
                                                                  : plan_pooling(ctx, op, made);
    if (status == KILN_UNSUPPORTED && !made->refused) {
      /* A status cuDNN gave for these arguments (2xxx, 3xxx): a refusal
       * of this shape as well. */
      snprintf(made->why, sizeof made->why, "%s", ctx->host.last_error());
      made->refused = true;
    }
    if (status != KILN_OK && !made->refused) {
      plan_destroy(ctx->cudnn, made);
      return provider_status(queue, status);
    }
    if (made->refused) {
      /* Only the reason is kept: the descriptors are of no further use. */
      const kiln_cuda_cudnn_t *dnn = ctx->cudnn;
      plan_t *bare = calloc(1, sizeof *bare);
      if (bare) {
        memcpy(bare->key, made->key, sizeof made->key);
        bare->refused = true;
        memcpy(bare->why, made->why, sizeof made->why);
      }
      plan_destroy(dnn, made);
      if (bare) {
        bool kept = false;
        plan_t *k = plan_keep(ctx, cache, bare, &kept);
        if (!kept) plan_destroy(dnn, k);
      }
      return KILN_UNSUPPORTED; /* the message was set by refuse() */
    }
    bool kept = false;
    plan = plan_keep(ctx, cache, made, &kept);
    *out_owned = !kept;
    /* Another thread's plan for the shape may be a refusal. */
    pthread_mutex_lock(&cache->lock);
    const bool later = plan->refused;
    if (later) memcpy(why, plan->why, sizeof why);
    pthread_mutex_unlock(&cache->lock);
    if (later)
      return kiln_cuda_error(ctx, KILN_UNSUPPORTED, "provider 'cudnn' cannot run this %s (%s); the native provider "
                             "runs it", kiln_backend_op_kind_name(op->kind), why);
  }
  *out_plan = plan;
  return KILN_OK;
}

/* cuDNN refused a planned shape when asked to run it: remember that too. */
static void refuse_later(kiln_backend_queue_t *queue, plan_t *plan, const char *why) {
  plan_cache_t *cache = queue->device->cudnn_cache;
  pthread_mutex_lock(&cache->lock);
  if (!plan->refused) {
    snprintf(plan->why, sizeof plan->why, "%s", why);
    plan->refused = true;
  }
  pthread_mutex_unlock(&cache->lock);
}

/* ---- the routines ------------------------------------------------------------------ */

static const void *in_ptr(const kiln_op_t *op, int i) {
  return (const void *)(uintptr_t)kiln_cuda_view_ptr(&op->in[i]);
}

/* The call of op's kind with its plan, workspace and operands. */
static kiln_status_t call(kiln_backend_context_t *ctx, kiln_cudnn_handle_t handle, const kiln_op_t *op,
                          const plan_t *plan, CUdeviceptr workspace) {
  const kiln_cuda_cudnn_t *dnn = ctx->cudnn;
  /* Scaling factors are double for double data, float otherwise. A 16-bit
   * convolution with a bias adds to y, which holds the bias (see the top). */
  const bool onto_bias = op->kind == KILN_OP_CONV2D && op->u.conv2d.has_bias &&
                         (op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16);
  const float alpha32 = 1.0f, beta32 = onto_bias ? 1.0f : 0.0f;
  const double alpha64 = 1.0, beta64 = 0.0;
  const void *alpha = op->out.dtype == KILN_F64 ? (const void *)&alpha64 : (const void *)&alpha32;
  const void *beta = op->out.dtype == KILN_F64 ? (const void *)&beta64 : (const void *)&beta32;
  void *out = (void *)(uintptr_t)kiln_cuda_view_ptr(&op->out);
  void *ws = (void *)(uintptr_t)workspace;
  char detail[160] = "";
  if (is_conv(op->kind))
    snprintf(detail, sizeof detail, "%s, n=%lld c=%lld h=%lld w=%lld k=%lld r=%lld s=%lld, algorithm %d",
             kiln_backend_dtype_name(op->out.dtype), (long long)op->u.conv2d.n, (long long)op->u.conv2d.c, (long long)op->u.conv2d.h, (long long)op->u.conv2d.w,
             (long long)op->u.conv2d.k, (long long)op->u.conv2d.r, (long long)op->u.conv2d.s, plan->algo);
  switch (op->kind) {
  case KILN_OP_CONV2D: /* in: x, w */
    return check(ctx,
                 dnn->conv_forward(handle, alpha, plan->x, in_ptr(op, 0), plan->w, in_ptr(op, 1), plan->conv,
                                   plan->algo, ws, plan->workspace, beta, plan->y, out),
                 "cudnnConvolutionForward (%s)", detail);
  case KILN_OP_CONV2D_BACKWARD_INPUT: /* in: dy, w; out: dx */
    return check(ctx,
                 dnn->bwd_data(handle, alpha, plan->w, in_ptr(op, 1), plan->y, in_ptr(op, 0), plan->conv,
                               plan->algo, ws, plan->workspace, beta, plan->x, out),
                 "cudnnConvolutionBackwardData (%s)", detail);
  case KILN_OP_CONV2D_BACKWARD_WEIGHT: /* in: x, dy; out: dw */
    return check(ctx,
                 dnn->bwd_filter(handle, alpha, plan->x, in_ptr(op, 0), plan->y, in_ptr(op, 1), plan->conv,
                                 plan->algo, ws, plan->workspace, beta, plan->w, out),
                 "cudnnConvolutionBackwardFilter (%s)", detail);
  case KILN_OP_SOFTMAX_BACKWARD: /* in: y, dy; out: dx */
    return check(ctx,
                 dnn->softmax_backward(handle, op->u.softmax.log ? KILN_CUDNN_SOFTMAX_LOG : KILN_CUDNN_SOFTMAX_ACCURATE,
                                       KILN_CUDNN_SOFTMAX_MODE_INSTANCE, alpha, plan->x, in_ptr(op, 0), plan->x,
                                       in_ptr(op, 1), beta, plan->x, out),
                 "%s", "cudnnSoftmaxBackward");
  default: /* MAX_POOL2D; in: x */
    return check(ctx,
                 dnn->pooling_forward(handle, plan->pooling, alpha, plan->x, in_ptr(op, 0), beta, plan->y, out), "%s",
                 "cudnnPoolingForward");
  }
}

/* Every cudnn row: the queue's handle, the shape's plan, the workspace on
 * the queue's stream, the call. A refusal at the call is remembered like one
 * at planning. */
static kiln_status_t run(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  const kiln_cuda_cudnn_t *dnn = ctx->cudnn;
  if (!dnn)
    return kiln_cuda_error(ctx, KILN_UNAVAILABLE, "provider 'cudnn' is absent (%s); use 'native'", ctx->cudnn_state);
  pthread_mutex_lock(&queue->lock);
  kiln_cudnn_handle_t handle = NULL;
  plan_t *plan = NULL;
  bool owned = false;
  kiln_status_t status = queue_handle(ctx, queue, &handle);
  if (status == KILN_OK) status = plan_get(ctx, queue, handle, op, &plan, &owned);
  CUdeviceptr workspace = 0;
  if (status == KILN_OK && plan->workspace) status = kiln_cuda_scratch_alloc(queue, plan->workspace, &workspace);
  if (status == KILN_OK) {
    status = call(ctx, handle, op, plan, workspace);
    if (status == KILN_UNSUPPORTED) refuse_later(queue, plan, ctx->host.last_error());
    status = provider_status(queue, status);
  }
  kiln_cuda_scratch_free(queue, workspace);
  pthread_mutex_unlock(&queue->lock);
  if (owned) plan_destroy(dnn, plan); /* host-side parameters: done with once the call returned */
  return status;
}

/* The bias as the native path adds it: f32 and f64 after the convolution,
 * in the dtype; f16 and bf16 before, cuDNN adding its float sum to it and
 * rounding once (a refused shape leaves y to the native row, which writes
 * all of it). */
kiln_status_t kiln_cuda_cudnn_conv2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue, const kiln_op_t *op) {
  if (op->out.dtype == KILN_F16 || op->out.dtype == KILN_BF16) {
    kiln_status_t status = ctx->cudnn ? kiln_cuda_conv_bias_fill(queue, op) : KILN_OK;
    return status == KILN_OK ? run(ctx, queue, op) : status;
  }
  kiln_status_t status = run(ctx, queue, op);
  if (status == KILN_OK) status = kiln_cuda_conv_bias(queue, op);
  return status;
}

kiln_status_t kiln_cuda_cudnn_max_pool2d(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                         const kiln_op_t *op) {
  return run(ctx, queue, op);
}

kiln_status_t kiln_cuda_cudnn_conv2d_backward_input(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                    const kiln_op_t *op) {
  return run(ctx, queue, op);
}

kiln_status_t kiln_cuda_cudnn_conv2d_backward_weight(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                                     const kiln_op_t *op) {
  return run(ctx, queue, op);
}

kiln_status_t kiln_cuda_cudnn_softmax_backward(kiln_backend_context_t *ctx, kiln_backend_queue_t *queue,
                                               const kiln_op_t *op) {
  return run(ctx, queue, op);
}
