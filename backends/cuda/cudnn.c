/* backends/cuda/cudnn.c: the cudnn provider for CONV2D and MAX_POOL2D: cuDNN loaded at run time, one algorithm choice per shape kept in memory. */
/*
 * The deprecation decision. cuDNN 9 marks its legacy descriptor API
 * (cudnnConvolutionForward, filter/convolution/pooling descriptors)
 * deprecated in favour of the graph ("backend") API, but ships it complete
 * in every 9.x release. kiln uses the legacy API, deliberately:
 * - it is the API every framework's cuDNN path was written against and whose
 *   behaviour (padding, NaN propagation, math types) is documented op by op;
 * - it needs a few dozen lines per op, against several hundred of graph
 *   descriptors, engine configurations and execution plans, code this
 *   plugin could not yet run on a GPU to prove correct;
 * - nothing is lost while it exists: the same engines serve both APIs.
 * The deprecation warnings (errors under -Werror) are silenced here only,
 * around the cuDNN header and this file's uses of its deprecated types, with
 * -Wdeprecated-declarations and nothing broader. When a cuDNN release drops
 * the legacy API, dlsym fails at load, the provider reports itself absent
 * with that reason, and the native kernels run: a port to the graph API then
 * replaces this file alone.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include <cudnn.h>

#include "backends/cuda/cuda_backend.h"

typedef struct kiln_cuda_cudnn_fns_t {
  size_t (*get_version)(void);
  const char *(*get_error_string)(cudnnStatus_t);
  cudnnStatus_t (*create)(cudnnHandle_t *);
  cudnnStatus_t (*destroy)(cudnnHandle_t);
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*create_tensor)(cudnnTensorDescriptor_t *);
  cudnnStatus_t (*set_tensor_4d)(cudnnTensorDescriptor_t, cudnnTensorFormat_t, cudnnDataType_t, int, int, int, int);
  cudnnStatus_t (*destroy_tensor)(cudnnTensorDescriptor_t);
  cudnnStatus_t (*create_filter)(cudnnFilterDescriptor_t *);
  cudnnStatus_t (*set_filter_4d)(cudnnFilterDescriptor_t, cudnnDataType_t, cudnnTensorFormat_t, int, int, int, int);
  cudnnStatus_t (*destroy_filter)(cudnnFilterDescriptor_t);
  cudnnStatus_t (*create_conv)(cudnnConvolutionDescriptor_t *);
  cudnnStatus_t (*set_conv_2d)(cudnnConvolutionDescriptor_t, int, int, int, int, int, int, cudnnConvolutionMode_t,
                               cudnnDataType_t);
  cudnnStatus_t (*set_conv_math)(cudnnConvolutionDescriptor_t, cudnnMathType_t);
  cudnnStatus_t (*destroy_conv)(cudnnConvolutionDescriptor_t);
  cudnnStatus_t (*conv_output_dim)(const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t,
                                   const cudnnFilterDescriptor_t, int *, int *, int *, int *);
  cudnnStatus_t (*conv_algorithm)(cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnFilterDescriptor_t,
                                  const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t, const int, int *,
                                  cudnnConvolutionFwdAlgoPerf_t *);
  cudnnStatus_t (*conv_workspace)(cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnFilterDescriptor_t,
                                  const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t,
                                  cudnnConvolutionFwdAlgo_t, size_t *);
  cudnnStatus_t (*conv_forward)(cudnnHandle_t, const void *, const cudnnTensorDescriptor_t, const void *,
                                const cudnnFilterDescriptor_t, const void *, const cudnnConvolutionDescriptor_t,
                                cudnnConvolutionFwdAlgo_t, void *, size_t, const void *, const cudnnTensorDescriptor_t,
                                void *);
  cudnnStatus_t (*create_pool)(cudnnPoolingDescriptor_t *);
  cudnnStatus_t (*set_pool_2d)(cudnnPoolingDescriptor_t, cudnnPoolingMode_t, cudnnNanPropagation_t, int, int, int, int,
                               int, int);
  cudnnStatus_t (*pool_output_dim)(const cudnnPoolingDescriptor_t, const cudnnTensorDescriptor_t, int *, int *, int *,
                                   int *);
  cudnnStatus_t (*pool_forward)(cudnnHandle_t, const cudnnPoolingDescriptor_t, const void *,
                                const cudnnTensorDescriptor_t, const void *, const void *,
                                const cudnnTensorDescriptor_t, void *);
  cudnnStatus_t (*destroy_pool)(cudnnPoolingDescriptor_t);
} kiln_cuda_cudnn_fns_t;

static void *cudnn_library;
static kiln_cuda_cudnn_fns_t dnn;
static char cudnn_version[64];

/* One convolution shape with its descriptors and chosen algorithm. Entries
 * are never evicted (descriptors may be in use by another thread); past
 * KILN_CUDNN_CACHE_MAX shapes, calls build their descriptors each time. */
#define KILN_CUDNN_CACHE_MAX 256
typedef struct conv_plan_t {
  struct conv_plan_t *next;
  int64_t key[15];
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnConvolutionFwdAlgo_t algo;
  size_t workspace;
} conv_plan_t;

typedef struct conv_cache_t {
  conv_plan_t *head;
  size_t count;
} conv_cache_t;

static const char *status_name(cudnnStatus_t status) {
  return dnn.get_error_string ? dnn.get_error_string(status) : NULL;
}

static kiln_status_t check(cudnnStatus_t status, const char *call_fmt, const char *detail) {
  if (status == CUDNN_STATUS_SUCCESS) return KILN_OK;
  return kiln_cuda_cudnn_check((int)status, status_name(status), call_fmt, detail);
}

bool kiln_cuda_cudnn_load(char *out_reason, size_t reason_size) {
  static const char *const names[] = {"libcudnn.so.9", "libcudnn.so"};
  memset(&dnn, 0, sizeof dnn);
  if (!kiln_cuda_vendor_library_wanted("cudnn", out_reason, reason_size)) return false;
  void *library = kiln_cuda_open_vendor_library(names, 2, out_reason, reason_size);
  if (!library) return false;
#define KILN_CUDNN_SYM_(field, symbol)                                                              \
  do {                                                                                              \
    void *p_ = dlsym(library, symbol);                                                              \
    if (!p_) {                                                                                      \
      snprintf(out_reason, reason_size, "%s lacks %s (its legacy API, which kiln uses, is gone)",   \
               names[0], symbol);                                                                   \
      memset(&dnn, 0, sizeof dnn);                                                                  \
      dlclose(library);                                                                             \
      return false;                                                                                 \
    }                                                                                               \
    memcpy(&dnn.field, &p_, sizeof p_);                                                             \
  } while (0)
  KILN_CUDNN_SYM_(get_version, "cudnnGetVersion");
  KILN_CUDNN_SYM_(get_error_string, "cudnnGetErrorString");
  KILN_CUDNN_SYM_(create, "cudnnCreate");
  KILN_CUDNN_SYM_(destroy, "cudnnDestroy");
  KILN_CUDNN_SYM_(set_stream, "cudnnSetStream");
  KILN_CUDNN_SYM_(create_tensor, "cudnnCreateTensorDescriptor");
  KILN_CUDNN_SYM_(set_tensor_4d, "cudnnSetTensor4dDescriptor");
  KILN_CUDNN_SYM_(destroy_tensor, "cudnnDestroyTensorDescriptor");
  KILN_CUDNN_SYM_(create_filter, "cudnnCreateFilterDescriptor");
  KILN_CUDNN_SYM_(set_filter_4d, "cudnnSetFilter4dDescriptor");
  KILN_CUDNN_SYM_(destroy_filter, "cudnnDestroyFilterDescriptor");
  KILN_CUDNN_SYM_(create_conv, "cudnnCreateConvolutionDescriptor");
  KILN_CUDNN_SYM_(set_conv_2d, "cudnnSetConvolution2dDescriptor");
  KILN_CUDNN_SYM_(set_conv_math, "cudnnSetConvolutionMathType");
  KILN_CUDNN_SYM_(destroy_conv, "cudnnDestroyConvolutionDescriptor");
  KILN_CUDNN_SYM_(conv_output_dim, "cudnnGetConvolution2dForwardOutputDim");
  KILN_CUDNN_SYM_(conv_algorithm, "cudnnGetConvolutionForwardAlgorithm_v7");
  KILN_CUDNN_SYM_(conv_workspace, "cudnnGetConvolutionForwardWorkspaceSize");
  KILN_CUDNN_SYM_(conv_forward, "cudnnConvolutionForward");
  KILN_CUDNN_SYM_(create_pool, "cudnnCreatePoolingDescriptor");
  KILN_CUDNN_SYM_(set_pool_2d, "cudnnSetPooling2dDescriptor");
  KILN_CUDNN_SYM_(pool_output_dim, "cudnnGetPooling2dForwardOutputDim");
  KILN_CUDNN_SYM_(pool_forward, "cudnnPoolingForward");
  KILN_CUDNN_SYM_(destroy_pool, "cudnnDestroyPoolingDescriptor");
#undef KILN_CUDNN_SYM_
  cudnn_library = library;
  const size_t v = dnn.get_version();
  /* cuDNN 9 encodes major*10000 + minor*100 + patch. */
  snprintf(cudnn_version, sizeof cudnn_version, "cuDNN %zu.%zu.%zu", v / 10000, (v % 10000) / 100, v % 100);
  return true;
}

bool kiln_cuda_cudnn_available(void) { return cudnn_library != NULL; }
const char *kiln_cuda_cudnn_version(void) { return cudnn_version; }

void kiln_cuda_cudnn_unload(void) {
  /* Stays mapped, like cuBLAS: its sub-libraries keep state past unload. */
  cudnn_library = NULL;
}

void kiln_cuda_cudnn_queue_release(kiln_backend_queue_t *queue) {
  if (queue->cudnn && dnn.destroy) (void)dnn.destroy((cudnnHandle_t)queue->cudnn);
  queue->cudnn = NULL;
}

static void plan_destroy(conv_plan_t *plan) {
  if (plan->x) (void)dnn.destroy_tensor(plan->x);
  if (plan->y) (void)dnn.destroy_tensor(plan->y);
  if (plan->w) (void)dnn.destroy_filter(plan->w);
  if (plan->conv) (void)dnn.destroy_conv(plan->conv);
  free(plan);
}

void kiln_cuda_cudnn_device_release(kiln_backend_device_t *device) {
  conv_cache_t *cache = device->cudnn_cache;
  if (!cache) return;
  for (conv_plan_t *plan = cache->head, *next; plan; plan = next) {
    next = plan->next;
    plan_destroy(plan);
  }
  free(cache);
  device->cudnn_cache = NULL;
}

/* The queue's handle, bound to its stream. Called with queue->lock held and
 * the device's context current. */
static kiln_status_t queue_handle(kiln_backend_queue_t *queue, cudnnHandle_t *out_handle) {
  if (!queue->cudnn) {
    cudnnHandle_t handle = NULL;
    kiln_status_t status = check(dnn.create(&handle), "%s", "cudnnCreate");
    if (status != KILN_OK) return status;
    status = check(dnn.set_stream(handle, (cudaStream_t)queue->stream), "%s", "cudnnSetStream");
    if (status != KILN_OK) {
      (void)dnn.destroy(handle);
      return status;
    }
    queue->cudnn = handle;
  }
  *out_handle = (cudnnHandle_t)queue->cudnn;
  return KILN_OK;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

static kiln_status_t unsupported(const char *what, const kiln_op_t *op) {
  return kiln_cuda_error(KILN_UNSUPPORTED, "provider 'cudnn' cannot run this %s (%s); the native provider runs it",
                         op->kind == KILN_OP_CONV2D ? "conv2d" : "max_pool2d", what);
}

/* Build the descriptors of one shape and choose its algorithm: the first of
 * cuDNN's heuristic ranking that needs no TF32 (unless KILN_CUDA_TF32=1)
 * and at most 1 GiB of workspace. */
static kiln_status_t plan_create(cudnnHandle_t handle, const kiln_op_t *op, conv_plan_t **out_plan) {
  conv_plan_t *plan = calloc(1, sizeof *plan);
  if (!plan) return kiln_cuda_error(KILN_OUT_OF_MEMORY, "out of host memory for a cuDNN plan");
  const int n = (int)op->u.conv2d.n, c = (int)op->u.conv2d.c, h = (int)op->u.conv2d.h, w = (int)op->u.conv2d.w;
  const int k = (int)op->u.conv2d.k, r = (int)op->u.conv2d.r, s = (int)op->u.conv2d.s;
  const int p = (int)op->u.conv2d.p, q = (int)op->u.conv2d.q;
  kiln_status_t status = KILN_OK;
  if (status == KILN_OK) status = check(dnn.create_tensor(&plan->x), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK) status = check(dnn.create_tensor(&plan->y), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK) status = check(dnn.create_filter(&plan->w), "%s", "cudnnCreateFilterDescriptor");
  if (status == KILN_OK) status = check(dnn.create_conv(&plan->conv), "%s", "cudnnCreateConvolutionDescriptor");
  if (status == KILN_OK)
    status = check(dnn.set_tensor_4d(plan->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w), "%s",
                   "cudnnSetTensor4dDescriptor (input)");
  if (status == KILN_OK)
    status = check(dnn.set_tensor_4d(plan->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k, p, q), "%s",
                   "cudnnSetTensor4dDescriptor (output)");
  if (status == KILN_OK)
    status = check(dnn.set_filter_4d(plan->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, r, s), "%s",
                   "cudnnSetFilter4dDescriptor");
  /* Cross-correlation, as every framework's conv2d (and kiln's) computes. */
  if (status == KILN_OK)
    status = check(dnn.set_conv_2d(plan->conv, op->u.conv2d.pad[0], op->u.conv2d.pad[1], op->u.conv2d.stride[0],
                                   op->u.conv2d.stride[1], op->u.conv2d.dil[0], op->u.conv2d.dil[1],
                                   CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                   "%s", "cudnnSetConvolution2dDescriptor");
  /* FMA math excludes TF32 tensor cores, which CUDNN_DEFAULT_MATH allows
   * for f32 on Ampere and newer. */
  if (status == KILN_OK)
    status = check(dnn.set_conv_math(plan->conv, kiln_cuda_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH), "%s",
                   "cudnnSetConvolutionMathType");
  if (status == KILN_OK) {
    int on = 0, ok = 0, op_ = 0, oq = 0;
    status = check(dnn.conv_output_dim(plan->conv, plan->x, plan->w, &on, &ok, &op_, &oq), "%s",
                   "cudnnGetConvolution2dForwardOutputDim");
    if (status == KILN_OK && (on != n || ok != k || op_ != p || oq != q)) status = unsupported("output shape differs", op);
  }
  if (status == KILN_OK) {
    cudnnConvolutionFwdAlgoPerf_t results[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    status = check(dnn.conv_algorithm(handle, plan->x, plan->w, plan->conv, plan->y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                      &returned, results),
                   "%s", "cudnnGetConvolutionForwardAlgorithm_v7");
    int chosen = -1;
    for (int i = 0; status == KILN_OK && i < returned && chosen < 0; i++) {
      if (results[i].status != CUDNN_STATUS_SUCCESS) continue;
      if (results[i].memory > ((size_t)1 << 30)) continue;
      if (!kiln_cuda_tf32 && (results[i].mathType == CUDNN_TENSOR_OP_MATH ||
                              results[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
        continue;
      chosen = i;
    }
    if (status == KILN_OK && chosen < 0) status = unsupported("no algorithm fits without TF32 and 1 GiB of workspace", op);
    if (status == KILN_OK) {
      plan->algo = results[chosen].algo;
      status = check(dnn.conv_workspace(handle, plan->x, plan->w, plan->conv, plan->y, plan->algo, &plan->workspace),
                     "%s", "cudnnGetConvolutionForwardWorkspaceSize");
    }
  }
  if (status != KILN_OK) {
    plan_destroy(plan);
    return status;
  }
  *out_plan = plan;
  return KILN_OK;
}

static void plan_key(const kiln_op_t *op, int64_t key[15]) {
  const int64_t values[15] = {op->u.conv2d.n, op->u.conv2d.c, op->u.conv2d.h, op->u.conv2d.w, op->u.conv2d.k,
                              op->u.conv2d.r, op->u.conv2d.s, op->u.conv2d.p, op->u.conv2d.q,
                              op->u.conv2d.stride[0], op->u.conv2d.stride[1], op->u.conv2d.pad[0],
                              op->u.conv2d.pad[1], op->u.conv2d.dil[0], op->u.conv2d.dil[1]};
  memcpy(key, values, sizeof values);
}

kiln_status_t kiln_cuda_cudnn_conv2d(kiln_backend_queue_t *queue, const kiln_op_t *op) {
  if (!cudnn_library)
    return kiln_cuda_error(KILN_UNSUPPORTED, "provider 'cudnn' is absent (cuDNN could not be loaded); use 'native'");
  const int64_t dims[] = {op->u.conv2d.n, op->u.conv2d.c, op->u.conv2d.h, op->u.conv2d.w, op->u.conv2d.k,
                          op->u.conv2d.r, op->u.conv2d.s, op->u.conv2d.p, op->u.conv2d.q,
                          op->u.conv2d.n * op->u.conv2d.c * op->u.conv2d.h * op->u.conv2d.w,
                          op->u.conv2d.n * op->u.conv2d.k * op->u.conv2d.p * op->u.conv2d.q,
                          op->u.conv2d.k * op->u.conv2d.c * op->u.conv2d.r * op->u.conv2d.s};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    if (!fits_int(dims[i])) return unsupported("a size or element count beyond int", op);
  for (size_t i = 0; i < 9; i++)
    if (dims[i] == 0) return unsupported("an empty dimension", op);

  kiln_backend_device_t *device = queue->device;
  int64_t key[15];
  plan_key(op, key);
  pthread_mutex_lock(&queue->lock);
  cudnnHandle_t handle;
  kiln_status_t status = queue_handle(queue, &handle);
  conv_plan_t *plan = NULL;
  bool cached = false;
  if (status == KILN_OK) {
    pthread_mutex_lock(&device->cudnn_lock);
    conv_cache_t *cache = device->cudnn_cache;
    if (!cache) cache = device->cudnn_cache = calloc(1, sizeof *cache);
    for (conv_plan_t *it = cache ? cache->head : NULL; it; it = it->next)
      if (!memcmp(it->key, key, sizeof key)) {
        plan = it;
        cached = true;
        break;
      }
    if (!plan) {
      status = plan_create(handle, op, &plan);
      if (status == KILN_OK && cache && cache->count < KILN_CUDNN_CACHE_MAX) {
        memcpy(plan->key, key, sizeof key);
        plan->next = cache->head;
        cache->head = plan;
        cache->count++;
        cached = true;
      }
    }
    pthread_mutex_unlock(&device->cudnn_lock);
  }
  CUdeviceptr workspace = 0;
  if (status == KILN_OK && plan->workspace) status = kiln_cuda_scratch_alloc(queue, plan->workspace, &workspace);
  if (status == KILN_OK) {
    const float alpha = 1.0f, beta = 0.0f;
    char detail[160];
    snprintf(detail, sizeof detail, "n=%lld c=%lld h=%lld w=%lld k=%lld r=%lld s=%lld, algorithm %d",
             (long long)op->u.conv2d.n, (long long)op->u.conv2d.c, (long long)op->u.conv2d.h,
             (long long)op->u.conv2d.w, (long long)op->u.conv2d.k, (long long)op->u.conv2d.r,
             (long long)op->u.conv2d.s, (int)plan->algo);
    status = check(dnn.conv_forward(handle, &alpha, plan->x, (const void *)(uintptr_t)kiln_cuda_view_ptr(&op->in[0]),
                                    plan->w, (const void *)(uintptr_t)kiln_cuda_view_ptr(&op->in[1]), plan->conv,
                                    plan->algo, (void *)(uintptr_t)workspace, plan->workspace, &beta, plan->y,
                                    (void *)(uintptr_t)kiln_cuda_view_ptr(&op->out)),
                   "cudnnConvolutionForward (%s)", detail);
  }
  kiln_cuda_scratch_free(queue, workspace);
  pthread_mutex_unlock(&queue->lock);
  if (plan && !cached) plan_destroy(plan); /* host-side parameters: done with once the call returned */
  if (status == KILN_OK) status = kiln_cuda_conv_bias(queue, op);
  return status;
}

kiln_status_t kiln_cuda_cudnn_max_pool2d(kiln_backend_queue_t *queue, const kiln_op_t *op) {
  if (!cudnn_library)
    return kiln_cuda_error(KILN_UNSUPPORTED, "provider 'cudnn' is absent (cuDNN could not be loaded); use 'native'");
  const int64_t n = op->u.pool2d.n, c = op->u.pool2d.c, h = op->u.pool2d.h, w = op->u.pool2d.w;
  const int64_t p = op->u.pool2d.p, q = op->u.pool2d.q;
  if (!fits_int(n * c * h * w) || !fits_int(n * c * p * q)) return unsupported("an element count beyond int", op);
  if (n * c * p * q == 0 || h == 0 || w == 0) return unsupported("an empty tensor", op);
  /* With pad < kernel every window holds a real cell; otherwise kiln's
   * answer for an all-padding window (-inf) is not cuDNN's to give. */
  for (int i = 0; i < 2; i++)
    if (op->u.pool2d.pad[i] >= op->u.pool2d.kernel[i]) return unsupported("padding as wide as the window", op);

  pthread_mutex_lock(&queue->lock);
  cudnnHandle_t handle;
  kiln_status_t status = queue_handle(queue, &handle);
  cudnnTensorDescriptor_t xd = NULL, yd = NULL;
  cudnnPoolingDescriptor_t pd = NULL;
  if (status == KILN_OK) status = check(dnn.create_tensor(&xd), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK) status = check(dnn.create_tensor(&yd), "%s", "cudnnCreateTensorDescriptor");
  if (status == KILN_OK) status = check(dnn.create_pool(&pd), "%s", "cudnnCreatePoolingDescriptor");
  if (status == KILN_OK)
    status = check(dnn.set_tensor_4d(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)n, (int)c, (int)h, (int)w), "%s",
                   "cudnnSetTensor4dDescriptor (input)");
  if (status == KILN_OK)
    status = check(dnn.set_tensor_4d(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)n, (int)c, (int)p, (int)q), "%s",
                   "cudnnSetTensor4dDescriptor (output)");
  /* NaN propagates, as in kiln's own kernels. */
  if (status == KILN_OK)
    status = check(dnn.set_pool_2d(pd, CUDNN_POOLING_MAX, CUDNN_PROPAGATE_NAN, op->u.pool2d.kernel[0],
                                   op->u.pool2d.kernel[1], op->u.pool2d.pad[0], op->u.pool2d.pad[1],
                                   op->u.pool2d.stride[0], op->u.pool2d.stride[1]),
                   "%s", "cudnnSetPooling2dDescriptor");
  if (status == KILN_OK) {
    int on = 0, oc = 0, op_ = 0, oq = 0;
    status = check(dnn.pool_output_dim(pd, xd, &on, &oc, &op_, &oq), "%s", "cudnnGetPooling2dForwardOutputDim");
    if (status == KILN_OK && (on != n || oc != c || op_ != p || oq != q)) status = unsupported("output shape differs", op);
  }
  if (status == KILN_OK) {
    const float alpha = 1.0f, beta = 0.0f;
    status = check(dnn.pool_forward(handle, pd, &alpha, xd, (const void *)(uintptr_t)kiln_cuda_view_ptr(&op->in[0]),
                                    &beta, yd, (void *)(uintptr_t)kiln_cuda_view_ptr(&op->out)),
                   "%s", "cudnnPoolingForward");
  }
  pthread_mutex_unlock(&queue->lock);
  if (pd) (void)dnn.destroy_pool(pd);
  if (xd) (void)dnn.destroy_tensor(xd);
  if (yd) (void)dnn.destroy_tensor(yd);
  return status;
}

#pragma GCC diagnostic pop
