/* backends/cuda/cublas.c: the cublas provider for MATMUL: cuBLAS loaded at run time through a function-pointer table. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_api.h>

#include "backends/cuda/cuda_backend.h"

/* Only the header's types are used at build time; every function comes from
 * dlsym, so a machine without cuBLAS still loads the plugin. */
struct kiln_cuda_cublas_t {
  void *dl; /* the dlopen handle of libcublas */
  cublasStatus_t (*create)(cublasHandle_t *);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*get_property)(libraryPropertyType, int *);
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float *,
                          const float *, int, const float *, int, const float *, float *, int);
  cublasStatus_t (*sgemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                          const float *, const float *, int, long long, const float *, int, long long,
                                          const float *, float *, int, long long, int);
};

static kiln_cuda_cublas_t cublas;
static char cublas_version[64];

/* KILN_CUDA_VENDOR_LIBS: which vendor libraries may load (bit 0 cuBLAS, bit 1
 * cuDNN); both unless the variable says otherwise. */
static unsigned vendor_libs_allowed = 3u;

kiln_status_t kiln_cuda_read_vendor_libs_setting(void) {
  static const char *const known[2] = {"cublas", "cudnn"};
  const char *value = getenv("KILN_CUDA_VENDOR_LIBS");
  vendor_libs_allowed = 3u;
  if (!value || !*value) return KILN_OK;
  if (!strcmp(value, "none")) {
    vendor_libs_allowed = 0u;
    return KILN_OK;
  }
  unsigned allowed = 0u;
  for (const char *item = value;;) {
    const size_t n = strcspn(item, ",");
    unsigned bit = 0u;
    for (unsigned k = 0; k < 2; k++)
      if (n == strlen(known[k]) && !strncmp(item, known[k], n)) bit = 1u << k;
    if (!bit)
      return kiln_cuda_error(KILN_INVALID_ARGUMENT,
                             "KILN_CUDA_VENDOR_LIBS='%s' is not valid: use a comma-separated list of cublas and "
                             "cudnn (the vendor libraries the CUDA backend may load), or none",
                             value);
    allowed |= bit;
    if (!item[n]) break;
    item += n + 1;
  }
  vendor_libs_allowed = allowed;
  return KILN_OK;
}

bool kiln_cuda_vendor_library_wanted(const char *which, char *out_reason, size_t reason_size) {
  const unsigned bit = !strcmp(which, "cudnn") ? 2u : 1u;
  if (vendor_libs_allowed & bit) return true;
  snprintf(out_reason, reason_size, "not loaded: KILN_CUDA_VENDOR_LIBS='%s' leaves %s out",
           getenv("KILN_CUDA_VENDOR_LIBS") ? getenv("KILN_CUDA_VENDOR_LIBS") : "", which);
  return false;
}

/* Where vendor libraries are looked for: the loader's own search first (the
 * usual install), then the toolkit named by CUDA_PATH / CUDA_HOME, then the
 * toolkit kiln was built against. */
void *kiln_cuda_open_vendor_library(const char *const *names, size_t name_count, char *out_reason, size_t reason_size) {
  const char *dirs[3] = {getenv("CUDA_PATH"), getenv("CUDA_HOME"), KILN_CUDA_TOOLKIT_LIBDIR};
  char first_error[256] = "";
  for (size_t i = 0; i < name_count; i++) {
    void *library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (library) return library;
    if (!first_error[0]) snprintf(first_error, sizeof first_error, "%s", dlerror());
  }
  for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
    if (!dirs[d] || !*dirs[d]) continue;
    for (size_t i = 0; i < name_count; i++) {
      char path[1024];
      /* CUDA_PATH and CUDA_HOME name the toolkit root; the build's is lib64 already. */
      snprintf(path, sizeof path, d < 2 ? "%s/lib64/%s" : "%s/%s", dirs[d], names[i]);
      void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (library) return library;
    }
  }
  snprintf(out_reason, reason_size, "%s", first_error[0] ? first_error : "not found");
  return NULL;
}

bool kiln_cuda_cublas_load(char *out_reason, size_t reason_size) {
  static const char *const names[] = {"libcublas.so.13", "libcublas.so"};
  memset(&cublas, 0, sizeof cublas);
  if (!kiln_cuda_vendor_library_wanted("cublas", out_reason, reason_size)) return false;
  void *library = kiln_cuda_open_vendor_library(names, 2, out_reason, reason_size);
  if (!library) return false;
  /* dlsym returns void *; copying the bytes avoids an object-to-function
   * pointer cast, which ISO C leaves undefined. */
#define KILN_CUBLAS_SYM_(field, symbol)                                                        \
  do {                                                                                         \
    void *p_ = dlsym(library, symbol);                                                         \
    if (!p_) {                                                                                 \
      snprintf(out_reason, reason_size, "%s lacks %s (a cuBLAS older than 12?)", names[0], symbol); \
      dlclose(library);                                                                        \
      memset(&cublas, 0, sizeof cublas);                                                       \
      return false;                                                                            \
    }                                                                                          \
    memcpy(&cublas.field, &p_, sizeof p_);                                                     \
  } while (0)
  KILN_CUBLAS_SYM_(create, "cublasCreate_v2");
  KILN_CUBLAS_SYM_(destroy, "cublasDestroy_v2");
  KILN_CUBLAS_SYM_(set_stream, "cublasSetStream_v2");
  KILN_CUBLAS_SYM_(set_math_mode, "cublasSetMathMode");
  KILN_CUBLAS_SYM_(get_property, "cublasGetProperty");
  KILN_CUBLAS_SYM_(sgemm, "cublasSgemm_v2");
  KILN_CUBLAS_SYM_(sgemm_strided_batched, "cublasSgemmStridedBatched");
#undef KILN_CUBLAS_SYM_
  cublas.dl = library;
  int major = 0, minor = 0, patch = 0;
  (void)cublas.get_property(MAJOR_VERSION, &major);
  (void)cublas.get_property(MINOR_VERSION, &minor);
  (void)cublas.get_property(PATCH_LEVEL, &patch);
  snprintf(cublas_version, sizeof cublas_version, "cuBLAS %d.%d.%d", major, minor, patch);
  return true;
}

bool kiln_cuda_cublas_available(void) { return cublas.dl != NULL; }
const char *kiln_cuda_cublas_version(void) { return cublas_version; }

void kiln_cuda_cublas_unload(void) {
  /* The library stays mapped: cuBLAS keeps per-thread state and exit
   * handlers that must not outlive its code. */
  memset(&cublas, 0, sizeof cublas);
}

void kiln_cuda_cublas_queue_release(kiln_backend_queue_t *queue) {
  if (queue->cublas && cublas.destroy) (void)cublas.destroy((cublasHandle_t)queue->cublas);
  queue->cublas = NULL;
}

/* The queue's handle, bound to its stream; created on first use with the
 * device's context current. Called with queue->lock held. */
static kiln_status_t queue_handle(kiln_backend_queue_t *queue, cublasHandle_t *out_handle) {
  if (!queue->cublas) {
    cublasHandle_t handle = NULL;
    kiln_status_t status = kiln_cuda_cublas_check(cublas.create(&handle), "cublasCreate on cuda:%d",
                                                  queue->device->ordinal);
    if (status != KILN_OK) return status;
    status = kiln_cuda_cublas_check(cublas.set_stream(handle, (cudaStream_t)queue->stream), "cublasSetStream");
    /* CUBLAS_DEFAULT_MATH keeps f32 products in f32: TF32 only when the
     * user asked for it (KILN_CUDA_TF32=1). */
    if (status == KILN_OK)
      status = kiln_cuda_cublas_check(
          cublas.set_math_mode(handle, kiln_cuda_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
          "cublasSetMathMode");
    if (status != KILN_OK) {
      (void)cublas.destroy(handle);
      return status;
    }
    queue->cublas = handle;
  }
  *out_handle = (cublasHandle_t)queue->cublas;
  return KILN_OK;
}

static bool fits_int(int64_t v) { return v >= 1 && v <= INT_MAX; }

kiln_status_t kiln_cuda_cublas_matmul(kiln_backend_queue_t *queue, const kiln_op_t *op) {
  if (!cublas.dl)
    return kiln_cuda_error(KILN_UNSUPPORTED, "provider 'cublas' is absent (cuBLAS could not be loaded); use 'native'");
  const int64_t m = op->u.matmul.m, n = op->u.matmul.n, k = op->u.matmul.k, batch = op->u.matmul.batch;
  const CUdeviceptr a = kiln_cuda_view_ptr(&op->in[0]), b = kiln_cuda_view_ptr(&op->in[1]);
  const CUdeviceptr c = kiln_cuda_view_ptr(&op->out);
  if (m == 0 || n == 0 || batch == 0) return KILN_OK;
  if (k == 0)
    /* An empty sum: zeros, without asking cuBLAS about leading dimensions of
     * empty matrices. */
    return kiln_cuda_check(cuMemsetD32Async(c, 0u, (size_t)(batch * m * n), queue->stream),
                           "cuMemsetD32Async (matmul with k=0) on cuda:%d", queue->device->ordinal);
  if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(op->u.matmul.lda) || !fits_int(op->u.matmul.ldb) ||
      !fits_int(op->u.matmul.ldc) || !fits_int(batch))
    return kiln_cuda_error(KILN_UNSUPPORTED,
                           "provider 'cublas' takes int sizes; matmul batch=%lld m=%lld n=%lld k=%lld lda=%lld "
                           "ldb=%lld is outside them (the native provider runs it)",
                           (long long)batch, (long long)m, (long long)n, (long long)k, (long long)op->u.matmul.lda,
                           (long long)op->u.matmul.ldb);
  /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the
   * same memory, so swap the operands and keep each one's transposition. */
  const cublasOperation_t op_a = op->u.matmul.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = op->u.matmul.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const float alpha = 1.0f, beta = 0.0f;
  pthread_mutex_lock(&queue->lock);
  cublasHandle_t handle;
  kiln_status_t status = queue_handle(queue, &handle);
  if (status == KILN_OK) {
    if (batch == 1) {
      status = kiln_cuda_cublas_check(
          cublas.sgemm(handle, op_b, op_a, (int)n, (int)m, (int)k, &alpha, (const float *)(uintptr_t)b,
                       (int)op->u.matmul.ldb, (const float *)(uintptr_t)a, (int)op->u.matmul.lda, &beta,
                       (float *)(uintptr_t)c, (int)op->u.matmul.ldc),
          "cublasSgemm(m=%lld n=%lld k=%lld) on cuda:%d", (long long)m, (long long)n, (long long)k,
          queue->device->ordinal);
    } else {
      status = kiln_cuda_cublas_check(
          cublas.sgemm_strided_batched(handle, op_b, op_a, (int)n, (int)m, (int)k, &alpha, (const float *)(uintptr_t)b,
                                       (int)op->u.matmul.ldb, op->u.matmul.stride_b, (const float *)(uintptr_t)a,
                                       (int)op->u.matmul.lda, op->u.matmul.stride_a, &beta, (float *)(uintptr_t)c,
                                       (int)op->u.matmul.ldc, op->u.matmul.stride_c, (int)batch),
          "cublasSgemmStridedBatched(batch=%lld m=%lld n=%lld k=%lld) on cuda:%d", (long long)batch, (long long)m,
          (long long)n, (long long)k, queue->device->ordinal);
    }
  }
  pthread_mutex_unlock(&queue->lock);
  return status;
}
